// Index of the largest value of each row (the first on ties, as the CPU
// backend), written as u32 to an ids buffer, or as f32 down a column of a
// tensor (drafts and verify choices that stay on the GPU). One workgroup
// per row.

#include "common.wgsl"

struct Params {
    n_rows: u32,
    cols: u32,
    as_f32: u32,     // 1: write f32 values
    out_row: u32,    // first output row
    out_col: u32,    // output column
    out_cols: u32,   // output row length
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> ids: array<u32>;

const WG: u32 = 256u;
var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;

// Whether (v, i) beats (bv, bi): larger value, or equal value and smaller
// index. NaN never wins.
fn beats(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    return v > bv || (v == bv && i < bi);
}

@compute @workgroup_size(256)
fn argmax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if row >= p.n_rows {
        return;
    }
    var bv = -3.40282346638528859812e38;
    var bi = 0xffffffffu;
    for (var c = lid; c < p.cols; c += WG) {
        let v = x[row * p.cols + c];
        if beats(v, c, bv, bi) {
            bv = v;
            bi = c;
        }
    }
    best_v[lid] = bv;
    best_i[lid] = bi;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if lid < stride && beats(best_v[lid + stride], best_i[lid + stride], best_v[lid], best_i[lid]) {
            best_v[lid] = best_v[lid + stride];
            best_i[lid] = best_i[lid + stride];
        }
        workgroupBarrier();
    }
    if lid == 0u {
        let id = select(best_i[0], 0u, best_i[0] == 0xffffffffu);
        ids[(p.out_row + row) * p.out_cols + p.out_col] = select(id, bitcast<u32>(f32(id)), p.as_f32 == 1u);
    }
}
