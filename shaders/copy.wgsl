// Row copies between tensors of different widths: KV appends, tap capture,
// row selection.

#include "common.wgsl"

struct Params {
    n_rows: u32,
    src_cols: u32,
    src_row: u32,
    dst_cols: u32,
    dst_row: u32,
    dst_col: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(256)
fn copy_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * 256u + lid;
    if i >= p.n_rows * p.src_cols {
        return;
    }
    let r = i / p.src_cols;
    let c = i % p.src_cols;
    dst[(p.dst_row + r) * p.dst_cols + p.dst_col + c] = src[(p.src_row + r) * p.src_cols + c];
}

// A layer's key and value rows (`src`, `src_v`: `n_rows x src_cols`, the
// same shape) appended to its caches (`dst`, `dst_v`) at `dst_row`.
@group(0) @binding(3) var<storage, read> src_v: array<f32>;
@group(0) @binding(4) var<storage, read_write> dst_v: array<f32>;

@compute @workgroup_size(256)
fn append_kv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * 256u + lid;
    if i >= p.n_rows * p.src_cols {
        return;
    }
    let r = i / p.src_cols;
    let c = i % p.src_cols;
    let d = (p.dst_row + r) * p.dst_cols + p.dst_col + c;
    let s = (p.src_row + r) * p.src_cols + c;
    dst[d] = src[s];
    dst_v[d] = src_v[s];
}
