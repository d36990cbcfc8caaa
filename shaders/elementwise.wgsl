// Element-wise ops on row-major f32 tensors: x += y, x *= s, x += bias
// (per row), logit softcapping, and the NaN/infinity sanitiser applied to
// hidden-state taps.

#include "common.wgsl"

struct Params {
    n: u32,      // elements
    cols: u32,   // row length (add_bias)
    s: f32,      // scale factor, or clamp limit
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> y: array<f32>;

@compute @workgroup_size(256)
fn add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * 256u + lid;
    if i < p.n {
        x[i] = x[i] + y[i];
    }
}

@compute @workgroup_size(256)
fn add_bias(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * 256u + lid;
    if i < p.n {
        x[i] = x[i] + y[i % p.cols];
    }
}

// Unary entry points use only `p` and `x`: their (automatic) layouts have
// no binding 2.
@compute @workgroup_size(256)
fn scale(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * 256u + lid;
    if i < p.n {
        x[i] = x[i] * p.s;
    }
}

// NaN becomes 0, magnitudes beyond the limit (infinities included) are
// clamped to it. Tested on the bits: shader compilers may assume floats are
// never NaN and fold `v != v` away.
@compute @workgroup_size(256)
fn clamp_finite(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * 256u + lid;
    if i < p.n {
        let bits = bitcast<u32>(x[i]);
        let mag = bits & 0x7fffffffu;
        if mag > 0x7f800000u {
            x[i] = 0.0;
        } else if mag >= bitcast<u32>(p.s) {
            x[i] = select(p.s, -p.s, (bits & 0x80000000u) != 0u);
        }
    }
}

// Final logit softcapping: x = s · tanh(x / s).
@compute @workgroup_size(256)
fn softcap(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * 256u + lid;
    if i < p.n {
        x[i] = p.s * tanh(x[i] / p.s);
    }
}
