// Index of the largest value of each row (the first on ties, as the CPU
// backend; NaN counts as -inf), written as u32 to an ids buffer, or as f32 down a column of a
// tensor (drafts and verify choices that stay on the GPU). One workgroup
// per row.

#include "common.wgsl"
#include "best.wgsl"

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

@compute @workgroup_size(256)
fn argmax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if row >= p.n_rows {
        return;
    }
    var bv = 0.0;
    var bi = NONE;
    for (var c = lid; c < p.cols; c += WG) {
        let v = key(x[row * p.cols + c]);
        if before(v, c, bv, bi) {
            bv = v;
            bi = c;
        }
    }
    let best = workgroup_best(lid, bv, bi);
    if lid == 0u {
        let id = select(best.i, 0u, best.i == NONE);
        ids[(p.out_row + row) * p.out_cols + p.out_col] = select(id, bitcast<u32>(f32(id)), p.as_f32 == 1u);
    }
}
