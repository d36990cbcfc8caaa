// Helpers shared by every kernel (pulled in with `#include "common.wgsl"`).

// Large 1-D grids are laid out as 2-D (at most 65535 workgroups per
// dimension); this is the linear workgroup index.
fn group_index(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.y * nwg.x + wid.x;
}

// The f32 value of the f16 in the low 16 bits of `h`, decoded bit by bit:
// exact for subnormals too, and needs no f16 support from the device.
fn f16_bits(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if e == 0u {
        // Subnormal (or zero): m · 2^-24.
        return bitcast<f32>(sign | bitcast<u32>(f32(m) * 5.9604645e-8));
    }
    if e == 31u {
        return bitcast<f32>(sign | 0x7f800000u | (m << 13u));
    }
    return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}

// The f32 value of the bf16 in the low 16 bits of `h`.
fn bf16_bits(h: u32) -> f32 {
    return bitcast<f32>(h << 16u);
}
