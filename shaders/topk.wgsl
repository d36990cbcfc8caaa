// The k largest values of each row, best first and the smaller index first
// on ties (NaN counting as -inf), with their indices as f32 (see
// Backend::top_k). One workgroup per row picks them one at a time: each
// pick is the best element ranked after the previous pick, so a row is
// read k times; k is small (selector candidates, sampling's top-k).

#include "common.wgsl"
#include "best.wgsl"

struct Params {
    n_rows: u32,
    cols: u32,
    k: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> values: array<f32>;
@group(0) @binding(3) var<storage, read_write> ids: array<f32>;

@compute @workgroup_size(256)
fn top_k(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if row >= p.n_rows {
        return;
    }
    var prev_v = 0.0;
    var prev_i = NONE;
    for (var j = 0u; j < p.k; j++) {
        var bv = 0.0;
        var bi = NONE;
        for (var c = lid; c < p.cols; c += WG) {
            let v = key(x[row * p.cols + c]);
            let after_prev = prev_i == NONE || before(prev_v, prev_i, v, c);
            if after_prev && before(v, c, bv, bi) {
                bv = v;
                bi = c;
            }
        }
        let best = workgroup_best(lid, bv, bi);
        prev_v = best.v;
        prev_i = best.i;
        if lid == 0u {
            values[row * p.k + j] = x[row * p.cols + prev_i];
            ids[row * p.k + j] = f32(prev_i);
        }
    }
}
