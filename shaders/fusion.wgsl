// DFly's per-layer fusion of the raw taps (see Backend::add_slices):
// out[r][c] += Σ_j w[j] · x[r][j·d + c], in order of j. The weights travel
// in the parameters, up to 56 per dispatch; more take further dispatches,
// which keeps the order of the sum.

#include "common.wgsl"

struct Params {
    n: u32,        // elements of out
    d: u32,        // out's row length = slice width
    width: u32,    // x's row length
    slice0: u32,   // slice of w[0] in this dispatch
    n_w: u32,      // weights in this dispatch
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
    w: array<vec4<f32>, 14>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn add_slices(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let e = group_index(wid, nwg) * 256u + lid;
    if e >= p.n {
        return;
    }
    let r = e / p.d;
    let c = e % p.d;
    var acc = out[e];
    for (var j = 0u; j < p.n_w; j++) {
        acc += p.w[j / 4u][j % 4u] * x[r * p.width + (p.slice0 + j) * p.d + c];
    }
    out[e] = acc;
}
