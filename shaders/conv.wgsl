// DFlash2's grouped dynamic depthwise convolution over the rows of one block
// (see Backend::grouped_conv): out[i][c] = Σ_t (base[s·T + t][c] +
// dynamic[i][(s·T + t)·G' + c/group]) · x[i − t][c], rows before 0 are zero.

#include "common.wgsl"

struct Params {
    n_rows: u32,
    cols: u32,
    taps: u32,
    group: u32,
    side: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> base: array<f32>;
@group(0) @binding(3) var<storage, read> dynamic: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn grouped_conv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let e = group_index(wid, nwg) * 256u + lid;
    if e >= p.n_rows * p.cols {
        return;
    }
    let i = e / p.cols;
    let c = e % p.cols;
    let groups = p.cols / p.group;
    let dyn_cols = 2u * p.taps * groups;
    var acc = 0.0;
    for (var t = 0u; t < min(p.taps, i + 1u); t++) {
        let k = p.side * p.taps + t;
        let w = base[k * p.cols + c] + dynamic[i * dyn_cols + k * groups + c / p.group];
        acc += w * x[(i - t) * p.cols + c];
    }
    out[e] = acc;
}
