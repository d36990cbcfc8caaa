// The best (value, index) of a workgroup's candidates, shared by argmax
// and top-k: the larger value ranks first, then the smaller index; NONE (no
// candidate) ranks after everything, and NaN counts as -inf (`key`).

const WG: u32 = 256u;
const NONE: u32 = 0xffffffffu;
var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;

struct Best {
    v: f32,
    i: u32,
}

// The ranking key: NaN (tested on the bits, which compilers cannot fold
// away) counts as -inf. The -inf is built from the runtime bits, since
// Chrome's Tint rejects a constant bitcast that yields an infinity.
fn key(v: f32) -> f32 {
    let bits = bitcast<u32>(v);
    if (bits & 0x7fffffffu) > 0x7f800000u {
        return bitcast<f32>((bits & 0u) | 0xff800000u);
    }
    return v;
}

// Whether (v, i) ranks before (bv, bi).
fn before(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    if i == NONE {
        return false;
    }
    return bi == NONE || v > bv || (v == bv && i < bi);
}

// The best of every invocation's candidate (v, i), in every invocation.
// Call from workgroup-uniform control flow (it has barriers).
fn workgroup_best(lid: u32, v: f32, i: u32) -> Best {
    best_v[lid] = v;
    best_i[lid] = i;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if lid < stride && before(best_v[lid + stride], best_i[lid + stride], best_v[lid], best_i[lid]) {
            best_v[lid] = best_v[lid + stride];
            best_i[lid] = best_i[lid + stride];
        }
        workgroupBarrier();
    }
    let b = Best(best_v[0], best_i[0]);
    // Nobody overwrites the arrays before everyone has read the result.
    workgroupBarrier();
    return b;
}
