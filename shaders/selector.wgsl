// DFlash2's greedy candidate-selector walk over one block (see
// Backend::selector_walk): row r scores its K candidates after the
// predecessor picked at row r - 1 and writes its best candidate's id down a
// column of `out`. The rows are sequential, so one workgroup walks them all;
// its invocations share the candidates of a row.

#include "common.wgsl"

struct Params {
    n_rows: u32,
    rank: u32,
    k: u32,
    out_col: u32,
    out_cols: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> gates: array<f32>;
@group(0) @binding(2) var<storage, read> pred: array<f32>;
@group(0) @binding(3) var<storage, read> succ: array<f32>;
@group(0) @binding(4) var<storage, read> unary: array<f32>;
@group(0) @binding(5) var<storage, read> cand: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;

const WG: u32 = 256u;
var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_c: array<u32, WG>;

fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

// Whether score (v, c) beats (bv, bc) as in the host's first-wins argmax
// scan: larger, or equal with the smaller candidate; a NaN loses, except at
// candidate 0, where the scan starts and nothing beats it. bc = k: none yet.
fn beats(v: f32, c: u32, bv: f32, bc: u32) -> bool {
    if c >= p.k {
        return false;
    }
    if is_nan(v) {
        return c == 0u;
    }
    if bc >= p.k {
        return true;
    }
    if is_nan(bv) {
        return false;
    }
    return v > bv || (v == bv && c < bc);
}

@compute @workgroup_size(256)
fn selector_walk(@builtin(local_invocation_index) lid: u32) {
    var prev = 0u; // row of `pred`: the anchor's for row 1
    for (var r = 1u; r < p.n_rows; r++) {
        var bv = 0.0;
        var bc = p.k;
        for (var c = lid; c < p.k; c += WG) {
            // In the host's order: (pred ⊙ gate) · succ, then + unary.
            var dot = 0.0;
            for (var j = 0u; j < p.rank; j++) {
                let a = pred[prev * p.rank + j] * gates[r * p.rank + j];
                dot += a * succ[(r * p.k + c) * p.rank + j];
            }
            let s = unary[r * p.k + c] + dot;
            if beats(s, c, bv, bc) {
                bv = s;
                bc = c;
            }
        }
        best_v[lid] = bv;
        best_c[lid] = bc;
        workgroupBarrier();
        for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
            if lid < stride && beats(best_v[lid + stride], best_c[lid + stride], best_v[lid], best_c[lid]) {
                best_v[lid] = best_v[lid + stride];
                best_c[lid] = best_c[lid + stride];
            }
            workgroupBarrier();
        }
        let best = best_c[0];
        prev = r * p.k + best;
        if lid == 0u {
            out[r * p.out_cols + p.out_col] = cand[r * p.k + best];
        }
        workgroupBarrier();
    }
}
