// RMS norm of every `group`-wide slice of each row, times a weight vector.
// One workgroup per slice; the sum of squares is a tree reduction.

#include "common.wgsl"

struct Params {
    group: u32,   // slice width
    n_slices: u32,
    eps: f32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const WG: u32 = 256u;
var<workgroup> partial: array<f32, WG>;

@compute @workgroup_size(256)
fn rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let slice = group_index(wid, nwg);
    // `slice` is uniform across the workgroup, so every invocation reaches
    // the barriers below or none does.
    if slice >= p.n_slices {
        return;
    }
    let base = slice * p.group;
    var s = 0.0;
    for (var i = lid; i < p.group; i += WG) {
        let v = x[base + i];
        s += v * v;
    }
    partial[lid] = s;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if lid < stride {
            partial[lid] += partial[lid + stride];
        }
        workgroupBarrier();
    }
    let scale = 1.0 / sqrt(partial[0] / f32(p.group) + p.eps);
    for (var i = lid; i < p.group; i += WG) {
        out[base + i] = (x[base + i] * scale) * weight[i];
    }
}
