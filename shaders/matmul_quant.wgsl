// out = x · Wᵀ for quantized weights, with x already quantized by
// quantize.wgsl (8-bit blocks of 32 for Q4_0..Q8_1, super-blocks of 256
// with per-16 sums for the K-quants). Each 32-value unit of a weight row
// is decoded once and dotted in integers with up to 8 activation rows (the
// speculative verify shape), then scaled once per unit, as the CPU backend
// does per block.
//
// A workgroup of 64 invocations computes 64 / LANES output features; LANES
// invocations per feature stride over its units and their partial sums are
// tree-reduced. LANES is set per adapter when the pipeline is built: 16
// suits GPUs (neighbouring invocations read neighbouring blocks), 1 suits
// CPU-emulated adapters (lavapipe, SwiftShader), where barriers and tiny
// workgroups cost far more than the arithmetic (3x faster there).

#include "common.wgsl"
#include "quant_blocks.wgsl"

struct Params {
    rows: u32,       // output features in this weight part
    cols: u32,       // row length
    n: u32,          // activation rows
    row0: u32,       // first output feature of this part
    out_cols: u32,   // output row length (all features)
    row_bytes: u32,  // bytes of one weight row
    d_off: u32,      // activation scales (words into `act`)
    s_off: u32,      // activation sums: f32 per 32 (legacy), i32 per 16 (K)
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> act: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

const WG: u32 = 64u;
override LANES: u32 = 16u;          // invocations per output feature (divides WG)
override FEATURES: u32 = WG / LANES; // output features per workgroup
const NR: u32 = 8u;              // activation rows per pass
var<workgroup> partial: array<array<f32, WG>, NR>;

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

fn matmul_quant(ty: u32, wid: vec3<u32>, nwg: vec3<u32>, lid: u32) {
    let f = lid / LANES;
    let lane = lid % LANES;
    let o = group_index(wid, nwg) * FEATURES + f;
    let live = o < p.rows;
    let units = p.cols / 32u;
    for (var g = 0u; g < p.n; g += NR) {
        let nr = min(NR, p.n - g);
        var acc = array<f32, NR>();
        if live {
            for (var i = lane; i < units; i += LANES) {
                let u = decode_unit(ty, o * p.row_bytes, i);
                for (var r = 0u; r < nr; r++) {
                    acc[r] += unit_dot(ty, u, g + r, i);
                }
            }
        }
        for (var r = 0u; r < NR; r++) {
            partial[r][lid] = acc[r];
        }
        workgroupBarrier();
        for (var s = LANES / 2u; s > 0u; s /= 2u) {
            if lane < s {
                for (var r = 0u; r < NR; r++) {
                    partial[r][lid] += partial[r][lid + s];
                }
            }
            workgroupBarrier();
        }
        if live {
            for (var r = lane; r < nr; r += LANES) {
                y[(g + r) * p.out_cols + p.row0 + o] = partial[r][f * LANES];
            }
        }
        workgroupBarrier();
    }
}

@compute @workgroup_size(64)
fn matmul_q4_0(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    matmul_quant(Q4_0, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn matmul_q4_1(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    matmul_quant(Q4_1, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn matmul_q5_0(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    matmul_quant(Q5_0, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn matmul_q5_1(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    matmul_quant(Q5_1, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn matmul_q8_0(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    matmul_quant(Q8_0, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn matmul_q8_1(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    matmul_quant(Q8_1, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn matmul_q2_k(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    matmul_quant(Q2_K, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn matmul_q3_k(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    matmul_quant(Q3_K, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn matmul_q4_k(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    matmul_quant(Q4_K, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn matmul_q5_k(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    matmul_quant(Q5_K, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn matmul_q6_k(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    matmul_quant(Q6_K, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn matmul_q8_k(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    matmul_quant(Q8_K, wid, nwg, lid);
}
