// Row copies into an f16 KV cache (two f16 to a u32, the lower column in the
// low bits): `copy.wgsl`'s `copy_rows` with the values rounded to f16 as
// `half` rounds them. Source widths and destination columns are even, so
// each invocation owns one whole u32.

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
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;

@compute @workgroup_size(256)
fn copy_rows_to_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
    let half_cols = p.src_cols / 2u;
    let i = group_index(wid, nwg) * 256u + lid;
    if i >= p.n_rows * half_cols {
        return;
    }
    let r = i / half_cols;
    let c = (i % half_cols) * 2u;
    let s = (p.src_row + r) * p.src_cols + c;
    let lo = f16_bits_of(src[s]);
    let hi = f16_bits_of(src[s + 1u]);
    dst[((p.dst_row + r) * p.dst_cols + p.dst_col + c) / 2u] = lo | (hi << 16u);
}

// `copy.wgsl`'s `append_kv` into f16 caches.
@group(0) @binding(3) var<storage, read> src_v: array<f32>;
@group(0) @binding(4) var<storage, read_write> dst_v: array<u32>;

@compute @workgroup_size(256)
fn append_kv_to_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
    let half_cols = p.src_cols / 2u;
    let i = group_index(wid, nwg) * 256u + lid;
    if i >= p.n_rows * half_cols {
        return;
    }
    let r = i / half_cols;
    let c = (i % half_cols) * 2u;
    let s = (p.src_row + r) * p.src_cols + c;
    let d = ((p.dst_row + r) * p.dst_cols + p.dst_col + c) / 2u;
    dst[d] = f16_bits_of(src[s]) | (f16_bits_of(src[s + 1u]) << 16u);
    dst_v[d] = f16_bits_of(src_v[s]) | (f16_bits_of(src_v[s + 1u]) << 16u);
}
