// Gated attention (Qwen3.5, see HybridOps): `attn_q` yields each head's
// queries then its gate; split_heads separates them, sigmoid_mul gates the
// attention output.

#include "common.wgsl"

struct Params {
    // Elements of the outputs (rows × heads × d).
    n: u32,
    // Width of a head's half.
    d: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> first: array<f32>;
@group(0) @binding(3) var<storage, read_write> second: array<f32>;

@compute @workgroup_size(256)
fn split_heads(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let e = group_index(wid, nwg) * 256u + lid;
    if e >= p.n {
        return;
    }
    let at = (e / p.d) * 2u * p.d + e % p.d;
    first[e] = src[at];
    second[e] = src[at + p.d];
}

// first *= sigmoid(src).
@compute @workgroup_size(256)
fn sigmoid_mul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let e = group_index(wid, nwg) * 256u + lid;
    if e >= p.n {
        return;
    }
    first[e] = first[e] / (1.0 + exp(-src[e]));
}
