// Embedding gather: out[r] = table[ids[r]], dequantized. A table larger than
// one storage binding is split into parts of whole rows; each dispatch
// covers one part and skips ids outside it. The ids are u32 from the host,
// or f32 values in a column of a tensor (drafts that never left the GPU).

#include "common.wgsl"

struct Params {
    n_ids: u32,
    cols: u32,
    row0: u32,        // first table row in this part
    rows: u32,        // rows in this part
    ids_f32: u32,     // 1: ids are f32 values
    ids_stride: u32,  // words between consecutive ids
    ids_row0: u32,    // first id's row in `ids`
    _pad: u32,
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
