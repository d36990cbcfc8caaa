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

// `v` rounded to the nearest f16 (ties to even), as f32: `half`'s
// conversion, without needing f16 support.
fn round_f16(v: f32) -> f32 {
    let b = bitcast<u32>(v);
    let sign = b & 0x80000000u;
    let a = b & 0x7fffffffu;
    if a >= 0x7f800000u {
        return v;
    }
    if a >= 0x477ff000u {
        // 65520 and up round to infinity.
        return bitcast<f32>(sign | 0x7f800000u);
    }
    if a >= 0x38800000u {
        // f16 normal range: drop 13 mantissa bits, half to even.
        let r = (a + 0xfffu + ((a >> 13u) & 1u)) & ~0x1fffu;
        return bitcast<f32>(sign | r);
    }
    // f16 subnormals are multiples of 2^-24; scaling by 2^24 is exact and
    // `round` is half to even.
    return bitcast<f32>(sign | bitcast<u32>(round(bitcast<f32>(a) * 16777216.0) * 5.9604645e-8));
}

// The f16 bits (low 16) of `v` rounded to the nearest f16 (ties to even),
// as `half` converts; NaN stays a (quiet) NaN.
fn f16_bits_of(v: f32) -> u32 {
    let r = round_f16(v);
    let b = bitcast<u32>(r);
    let sign = (b >> 16u) & 0x8000u;
    let a = b & 0x7fffffffu;
    if a > 0x7f800000u {
        return sign | 0x7e00u;
    }
    if a == 0x7f800000u {
        return sign | 0x7c00u;
    }
    if a >= 0x38800000u {
        return sign | ((((a >> 23u) - 112u) << 10u) | ((a >> 13u) & 0x3ffu));
    }
    // Subnormal: an exact multiple of 2^-24.
    return sign | u32(bitcast<f32>(a) * 16777216.0);
}
