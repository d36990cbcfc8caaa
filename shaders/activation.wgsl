// Gated feed-forward activations: out = act(gate) * up.

#include "common.wgsl"

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
        let g = gate[i];
        out[i] = g / (1.0 + exp(-g)) * up[i];
    }
}

// GELU, tanh approximation, as ggml's table has it (and the CPU backend):
// of the input rounded to f16, the result rounded to f16, identity beyond
// ±10. The tanh argument is clamped: some implementations return NaN for
// huge arguments.
fn gelu(g: f32) -> f32 {
    if g <= -10.0 {
        return 0.0;
    }
    if g >= 10.0 {
        return g;
    }
    let x = round_f16(g);
    let t = tanh(clamp(0.7978846 * x * (0.044715 * x * x + 1.0), -10.0, 10.0));
    return round_f16(0.5 * x * (1.0 + t));
}

@compute @workgroup_size(256)
fn geglu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * 256u + lid;
    if i < p.n {
        out[i] = gelu(gate[i]) * up[i];
    }
}
