// out = x · Wᵀ for quantized weights, with x already quantized by
// quantize.wgsl (8-bit blocks of 32 for Q4_0..Q8_1, IQ4_NL, MXFP4 and
// NVFP4, super-blocks of 256 with per-16 sums for the K-quants, IQ4_XS, the
// lattice and the ternary types). Each 32-value unit of a weight row is
// decoded once and dotted in integers with up to 8 activation rows (the
// speculative verify shape), then scaled once per unit, as the CPU backend
// does per block. Work split and sums: matmul_rows.wgsl.

#include "common.wgsl"
#include "quant_blocks.wgsl"
#include "matmul_rows.wgsl"

struct Params {
    rows: u32,       // output features in this weight part
    cols: u32,       // row length
    n: u32,          // activation rows
    row0: u32,       // first output feature of this part
    out_cols: u32,   // output row length (all features)
    row_bytes: u32,  // bytes of one weight row
    d_off: u32,      // activation scales (words into `act`)
    s_off: u32,      // activation sums: f32 per 32 (legacy), i32 per 16 (K)
    epilogue: u32,   // EPILOGUE_* flags (matmul_rows.wgsl)
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
    // Stacked weights (`matmul_stacked*`): up to three weights side by side
    // in `w`, each a segment of `rows` output features, element i for
    // segment i.
    seg_rows: vec4<u32>,      // output features (its output's row length)
    seg_off: vec4<u32>,       // byte offset of its first row in `w`
    seg_row_bytes: vec4<u32>,
    seg_bias: vec4<u32>,      // index of its first bias in `bias`
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> act: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
// The outputs of segments 1 and 2 (`y` is segment 0's).
@group(0) @binding(5) var<storage, read_write> y1: array<f32>;
@group(0) @binding(6) var<storage, read_write> y2: array<f32>;

// Row r's contribution of weight unit `i`.
fn unit_dot(ty: u32, u: Unit, r: u32, i: u32) -> f32 {
    let xq = r * (p.cols / 4u) + 8u * i;
    var lo = 0;
    var hi = 0;
    for (var k = 0u; k < 4u; k++) {
        lo += dot4(u.q[k], act[xq + k]);
        hi += dot4(u.q[4u + k], act[xq + 4u + k]);
    }
    if !is_k_quant(ty) {
        let blk = r * (p.cols / 32u) + i;
        let dx = bitcast<f32>(act[p.d_off + blk]);
        if has_split_scale(ty) {
            return dx * (u.wd * f32(lo) + u.wdb * f32(hi));
        }
        var v = u.wd * dx * f32(lo + hi);
        if has_offset(ty) {
            v += u.wm * bitcast<f32>(act[p.s_off + blk]);
        }
        return v;
    }
    let dx = bitcast<f32>(act[p.d_off + r * (p.cols / 256u) + i / 8u]);
    let isum = u.ka * lo + u.kb * hi;
    if has_min(ty) {
        let bs = p.s_off + r * (p.cols / 16u) + 2u * i;
        let msum = u.ma * bitcast<i32>(act[bs]) + u.mb * bitcast<i32>(act[bs + 1u]);
        return dx * (u.wd * f32(isum) - u.wmin * f32(msum));
    }
    return dx * u.wd * f32(isum);
}

fn matmul_quant(ty: u32, inv: Invocation) {
    let at = place(inv);
    let units = p.cols / 32u;
    let grid = grid_at(p.rows * p.row_bytes);
    for (var g = 0u; g < p.n; g += NR) {
        let nr = min(NR, p.n - g);
        var acc = array<f32, NR>();
        if at.o < p.rows {
            for (var i = at.lane; i < units; i += LANES) {
                let u = decode_unit(ty, at.o * p.row_bytes, i, grid);
                for (var r = 0u; r < nr; r++) {
                    acc[r] += unit_dot(ty, u, g + r, i);
                }
            }
        }
        store_rows(inv, at, acc, g, nr);
    }
}

@compute @workgroup_size(64)
fn matmul_q4_0(inv: Invocation) {
    matmul_quant(Q4_0, inv);
}

@compute @workgroup_size(64)
fn matmul_q4_1(inv: Invocation) {
    matmul_quant(Q4_1, inv);
}

@compute @workgroup_size(64)
fn matmul_q5_0(inv: Invocation) {
    matmul_quant(Q5_0, inv);
}

@compute @workgroup_size(64)
fn matmul_q5_1(inv: Invocation) {
    matmul_quant(Q5_1, inv);
}

@compute @workgroup_size(64)
fn matmul_q8_0(inv: Invocation) {
    matmul_quant(Q8_0, inv);
}

@compute @workgroup_size(64)
fn matmul_q8_1(inv: Invocation) {
    matmul_quant(Q8_1, inv);
}

@compute @workgroup_size(64)
fn matmul_q2_k(inv: Invocation) {
    matmul_quant(Q2_K, inv);
}

@compute @workgroup_size(64)
fn matmul_q3_k(inv: Invocation) {
    matmul_quant(Q3_K, inv);
}

@compute @workgroup_size(64)
fn matmul_q4_k(inv: Invocation) {
    matmul_quant(Q4_K, inv);
}

@compute @workgroup_size(64)
fn matmul_q5_k(inv: Invocation) {
    matmul_quant(Q5_K, inv);
}

@compute @workgroup_size(64)
fn matmul_q6_k(inv: Invocation) {
    matmul_quant(Q6_K, inv);
}

@compute @workgroup_size(64)
fn matmul_q8_k(inv: Invocation) {
    matmul_quant(Q8_K, inv);
}

@compute @workgroup_size(64)
fn matmul_iq4_nl(inv: Invocation) {
    matmul_quant(IQ4_NL, inv);
}

@compute @workgroup_size(64)
fn matmul_iq4_xs(inv: Invocation) {
    matmul_quant(IQ4_XS, inv);
}

@compute @workgroup_size(64)
fn matmul_iq2_xxs(inv: Invocation) {
    matmul_quant(IQ2_XXS, inv);
}

@compute @workgroup_size(64)
fn matmul_iq2_xs(inv: Invocation) {
    matmul_quant(IQ2_XS, inv);
}

@compute @workgroup_size(64)
fn matmul_iq2_s(inv: Invocation) {
    matmul_quant(IQ2_S, inv);
}

@compute @workgroup_size(64)
fn matmul_iq3_xxs(inv: Invocation) {
    matmul_quant(IQ3_XXS, inv);
}

@compute @workgroup_size(64)
fn matmul_iq3_s(inv: Invocation) {
    matmul_quant(IQ3_S, inv);
}

@compute @workgroup_size(64)
fn matmul_iq1_s(inv: Invocation) {
    matmul_quant(IQ1_S, inv);
}

@compute @workgroup_size(64)
fn matmul_iq1_m(inv: Invocation) {
    matmul_quant(IQ1_M, inv);
}

@compute @workgroup_size(64)
fn matmul_tq1_0(inv: Invocation) {
    matmul_quant(TQ1_0, inv);
}

@compute @workgroup_size(64)
fn matmul_tq2_0(inv: Invocation) {
    matmul_quant(TQ2_0, inv);
}

@compute @workgroup_size(64)
fn matmul_mxfp4(inv: Invocation) {
    matmul_quant(MXFP4, inv);
}

@compute @workgroup_size(64)
fn matmul_nvfp4(inv: Invocation) {
    matmul_quant(NVFP4, inv);
}

// Projections of one input whose weights sit side by side in one buffer
// (a layer's q|k|v): one pass over all of their rows, each feature in its
// segment's type, stored (with its bias) into its segment's output. The
// same sums as `matmul_quant` per weight.

// The segments' weight types (quant_blocks.wgsl's codes), set per
// pipeline: constants, so that only their decoders are compiled in.
override TY0: u32 = 0u;
override TY1: u32 = 0u;
override TY2: u32 = 0u;

fn segment_type(s: u32) -> u32 {
    return select(select(TY2, TY1, s == 1u), TY0, s == 0u);
}

fn segment_of(o: u32) -> u32 {
    if o < p.seg_rows.x {
        return 0u;
    }
    if o < p.seg_rows.x + p.seg_rows.y {
        return 1u;
    }
    return 2u;
}

fn segment_start(s: u32) -> u32 {
    return select(0u, p.seg_rows.x, s >= 1u) + select(0u, p.seg_rows.y, s >= 2u);
}

// Where segment s's lattice grid starts: after its rows (`grid_at`).
fn segment_grid(s: u32) -> u32 {
    return grid_at(p.seg_off[s] + p.seg_rows[s] * p.seg_row_bytes[s]);
}

fn store_segment(s: u32, row: u32, o: u32, sum: f32) {
    var v = sum;
    if (p.epilogue & EPILOGUE_BIAS) != 0u {
        v += bias[p.seg_bias[s] + o];
    }
    let i = row * p.seg_rows[s] + o;
    if s == 0u {
        y[i] = v;
    } else if s == 1u {
        y1[i] = v;
    } else {
        y2[i] = v;
    }
}

@compute @workgroup_size(64)
fn matmul_stacked(inv: Invocation) {
    let at = place(inv);
    let live = at.o < p.rows;
    let s = segment_of(at.o);
    let o = at.o - segment_start(s);
    let ty = segment_type(s);
    let row = p.seg_off[s] + o * p.seg_row_bytes[s];
    let grid = segment_grid(s);
    let units = p.cols / 32u;
    for (var g = 0u; g < p.n; g += NR) {
        let nr = min(NR, p.n - g);
        var acc = array<f32, NR>();
        if live {
            for (var i = at.lane; i < units; i += LANES) {
                let u = decode_unit(ty, row, i, grid);
                for (var r = 0u; r < nr; r++) {
                    acc[r] += unit_dot(ty, u, g + r, i);
                }
            }
        }
        let sums = reduce_rows(inv, at, acc);
        if live {
            for (var r = at.lane; r < nr; r += LANES) {
                store_segment(s, g + r, o, sums[r]);
            }
        }
    }
}

// A gated feed-forward's gate (segment 0) and up (segment 1) projections
// side by side: each feature dots both rows with the same activation units
// and stores act(gate) * up into `y`, as the separate up projection's
// epilogue does.
@compute @workgroup_size(64)
fn matmul_stacked_gated(inv: Invocation) {
    let at = place(inv);
    let live = at.o < p.rows;
    let row_g = p.seg_off.x + at.o * p.seg_row_bytes.x;
    let row_u = p.seg_off.y + at.o * p.seg_row_bytes.y;
    let grid_g = segment_grid(0u);
    let grid_u = segment_grid(1u);
    let units = p.cols / 32u;
    for (var g = 0u; g < p.n; g += NR) {
        let nr = min(NR, p.n - g);
        var acc_g = array<f32, NR>();
        var acc_u = array<f32, NR>();
        if live {
            for (var i = at.lane; i < units; i += LANES) {
                let ug = decode_unit(TY0, row_g, i, grid_g);
                let uu = decode_unit(TY1, row_u, i, grid_u);
                for (var r = 0u; r < nr; r++) {
                    acc_g[r] += unit_dot(TY0, ug, g + r, i);
                    acc_u[r] += unit_dot(TY1, uu, g + r, i);
                }
            }
        }
        let gate = reduce_rows(inv, at, acc_g);
        let up = reduce_rows(inv, at, acc_u);
        if live {
            for (var r = at.lane; r < nr; r += LANES) {
                var v = up[r];
                if (p.epilogue & EPILOGUE_SWIGLU) != 0u {
                    v = swiglu_of(gate[r], v);
                } else {
                    v = geglu_of(gate[r], v);
                }
                y[(g + r) * p.rows + at.o] = v;
            }
        }
    }
}
