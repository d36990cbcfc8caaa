// Gated feed-forward activations: out = act(gate) * up.

#include "common.wgsl"
#include "gating.wgsl"

struct Params {
    n: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> gate: array<f32>;
@group(0) @binding(2) var<storage, read> up: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn swiglu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * 256u + lid;
    if i < p.n {
        out[i] = swiglu_of(gate[i], up[i]);
    }
}

@compute @workgroup_size(256)
fn geglu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * 256u + lid;
    if i < p.n {
        out[i] = geglu_of(gate[i], up[i]);
    }
}
