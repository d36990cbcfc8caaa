// Quantizes activation rows to 8 bits for the quantized matmuls: one
// workgroup per 256 consecutive values of a row (the layout and the
// arithmetic: quantize_rows.wgsl).

#include "common.wgsl"

struct Params {
    n: u32,          // rows
    cols: u32,       // row length (a multiple of 32, or of 256 for q8_k)
    chunks: u32,     // workgroups per row: ceil(cols / 256)
    d_off: u32,
    s_off: u32,
    q8_1_sums: u32,  // q8_0: the sum as llama.cpp's block_q8_1 has it
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> act: array<u32>;

#include "quantize_rows.wgsl"

fn dest() -> Dest {
    return Dest(p.cols, p.d_off, p.s_off, p.q8_1_sums);
}

@compute @workgroup_size(256)
fn quantize_q8_0(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let g = group_index(wid, nwg);
    let row = g / p.chunks;
    let c = (g % p.chunks) * WG + lid;
    var v = 0.0;
    if row < p.n && c < p.cols {
        v = x[row * p.cols + c];
    }
    quantize_chunk_q8_0(lid, row, c, v, row < p.n, dest());
}

@compute @workgroup_size(256)
fn quantize_q8_k(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let g = group_index(wid, nwg);
    let row = g / p.chunks;
    let c = (g % p.chunks) * WG + lid;
    var v = 0.0;
    if row < p.n {
        v = x[row * p.cols + c];
    }
    quantize_chunk_q8_k(lid, row, c, v, row < p.n, dest());
}
