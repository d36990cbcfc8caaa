// Embedding gather: out[r] = table[ids[r]], dequantized. A table larger than
// one storage binding is split into parts of whole rows; each dispatch
// covers one part and skips ids outside it. The ids are u32 from the host,
// or f32 values in a column of a tensor (drafts that never left the GPU).

#include "common.wgsl"
#include "quant_blocks.wgsl"

struct Params {
    n_ids: u32,
    cols: u32,
    row0: u32,        // first table row in this part
    rows: u32,        // rows in this part
    row_bytes: u32,   // bytes of one row (quantized tables)
    zero: u32,        // always 0; see `exact`
    ids_f32: u32,     // 1: ids are f32 values
    ids_stride: u32,  // words between consecutive ids
    ids_row0: u32,    // first id's row in `ids`
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

// The table row of output element `e` within this part, or none.
fn part_row(e: u32) -> i32 {
    if e >= p.n_ids * p.cols {
        return -1;
    }
    var id = ids[(p.ids_row0 + e / p.cols) * p.ids_stride];
    if p.ids_f32 == 1u {
        id = u32(bitcast<f32>(id));
    }
    if id < p.row0 || id >= p.row0 + p.rows {
        return -1;
    }
    return i32(id - p.row0);
}

@compute @workgroup_size(256)
fn embed_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let e = group_index(wid, nwg) * 256u + lid;
    let row = part_row(e);
    if row >= 0 {
        out[e] = bitcast<f32>(w[u32(row) * p.cols + e % p.cols]);
    }
}

@compute @workgroup_size(256)
fn embed_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let e = group_index(wid, nwg) * 256u + lid;
    let row = part_row(e);
    if row >= 0 {
        let i = u32(row) * p.cols + e % p.cols;
        out[e] = f16_bits(w[i / 2u] >> (16u * (i % 2u)));
    }
}

@compute @workgroup_size(256)
fn embed_bf16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let e = group_index(wid, nwg) * 256u + lid;
    let row = part_row(e);
    if row >= 0 {
        let i = u32(row) * p.cols + e % p.cols;
        out[e] = bf16_bits(w[i / 2u] >> (16u * (i % 2u)));
    }
}

// `v`, opaque to the compiler: a product passed through it cannot be fused
// with the following add into an fma (which drivers may do and which
// rounds once instead of twice), so the dequantized values are bit-exact
// with the CPU's `d * q + m`.
fn exact(v: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(v) ^ p.zero);
}

// One invocation per 32-value unit of an output row: decode it once and
// write its 32 values, as `blockdraft_gguf::quants` dequantizes them.
fn embed_quant(ty: u32, wid: vec3<u32>, nwg: vec3<u32>, lid: u32) {
    let units = p.cols / 32u;
    let t = group_index(wid, nwg) * 64u + lid;
    if t >= p.n_ids * units {
        return;
    }
    let e = t * 32u; // first output element
    let row = part_row(e);
    if row < 0 {
        return;
    }
    let u = decode_unit(ty, u32(row) * p.row_bytes, t % units, grid_at(p.rows * p.row_bytes));
    for (var k = 0u; k < 32u; k++) {
        var ks = u.ka;
        var ms = u.ma;
        var wd = u.wd;
        if k >= 16u {
            ks = u.kb;
            ms = u.mb;
            if has_split_scale(ty) {
                wd = u.wdb;
            }
        }
        var v = exact((wd * f32(ks)) * f32(lane(u.q[k / 4u], k % 4u)));
        if has_min(ty) {
            v -= exact(u.wmin * f32(ms));
        }
        if has_offset(ty) {
            v += u.wm;
        }
        out[e + k] = v;
    }
}

@compute @workgroup_size(64)
fn embed_q4_0(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    embed_quant(Q4_0, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn embed_q4_1(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    embed_quant(Q4_1, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn embed_q5_0(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    embed_quant(Q5_0, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn embed_q5_1(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    embed_quant(Q5_1, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn embed_q8_0(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    embed_quant(Q8_0, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn embed_q8_1(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    embed_quant(Q8_1, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn embed_q2_k(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    embed_quant(Q2_K, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn embed_q3_k(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    embed_quant(Q3_K, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn embed_q4_k(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    embed_quant(Q4_K, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn embed_q5_k(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    embed_quant(Q5_K, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn embed_q6_k(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    embed_quant(Q6_K, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn embed_q8_k(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    embed_quant(Q8_K, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn embed_iq4_nl(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    embed_quant(IQ4_NL, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn embed_iq4_xs(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    embed_quant(IQ4_XS, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn embed_iq2_xxs(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    embed_quant(IQ2_XXS, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn embed_iq2_xs(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    embed_quant(IQ2_XS, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn embed_iq2_s(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    embed_quant(IQ2_S, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn embed_iq3_xxs(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    embed_quant(IQ3_XXS, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn embed_iq3_s(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    embed_quant(IQ3_S, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn embed_iq1_s(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    embed_quant(IQ1_S, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn embed_iq1_m(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    embed_quant(IQ1_M, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn embed_tq1_0(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    embed_quant(TQ1_0, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn embed_tq2_0(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    embed_quant(TQ2_0, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn embed_mxfp4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    embed_quant(MXFP4, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn embed_nvfp4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    embed_quant(NVFP4, wid, nwg, lid);
}
