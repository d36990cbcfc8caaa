// out = x · Wᵀ for quantized weights, with x already quantized by
// quantize.wgsl (8-bit blocks of 32 for Q4_0..Q8_1, super-blocks of 256
// with per-16 sums for the K-quants). Each 32-value unit of a weight row
// is decoded once and dotted in integers with up to 8 activation rows (the
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
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> act: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;

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
    for (var g = 0u; g < p.n; g += NR) {
        let nr = min(NR, p.n - g);
        var acc = array<f32, NR>();
        if at.o < p.rows {
            for (var i = at.lane; i < units; i += LANES) {
                let u = decode_unit(ty, at.o * p.row_bytes, i);
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
