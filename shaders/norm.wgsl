// RMS norm of every `group`-wide slice of each row, times a weight vector.
// One workgroup per slice; the sum of squares is a tree reduction. The
// fused entries also quantize each normalized row for the matmuls that
// read it (quantize_rows.wgsl), so the projections after a norm need no
// pass of their own to prepare their input; `add_rms_norm_quantize_*`
// first add a residual branch through its post-norm to the rows they
// normalize (Gemma 3), so that the branch needs no pass of its own either.

#include "common.wgsl"

struct Params {
    group: u32,      // slice width
    n_slices: u32,
    eps: f32,
    q8_1_sums: u32,  // fused, q8_0: the sums as block_q8_1 has them
    d_off: u32,      // fused: where the scales and sums go in `act`
    s_off: u32,
    post_eps: f32,   // add_rms_norm_quantize: the branch's post-norm epsilon
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read_write> act: array<u32>;
// add_rms_norm_quantize only: the residual stream (in `x`'s place, updated
// in place), the branch output and its post-norm weight.
@group(0) @binding(1) var<storage, read_write> stream: array<f32>;
@group(0) @binding(5) var<storage, read> branch: array<f32>;
@group(0) @binding(6) var<storage, read> post_weight: array<f32>;

#include "quantize_rows.wgsl"

var<workgroup> partial: array<f32, WG>;

// The workgroup's sum of each invocation's `s` (every invocation gets it).
fn workgroup_sum(lid: u32, s: f32) -> f32 {
    partial[lid] = s;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if lid < stride {
            partial[lid] += partial[lid + stride];
        }
        workgroupBarrier();
    }
    let total = partial[0];
    // Before any later sum overwrites it.
    workgroupBarrier();
    return total;
}

// 1 / rms of a slice whose squares sum to `sum_sq` over the invocations.
fn inverse_rms_of(lid: u32, sum_sq: f32, eps: f32) -> f32 {
    return 1.0 / sqrt(workgroup_sum(lid, sum_sq) / f32(p.group) + eps);
}

// 1 / rms of slice `base..base + group` of `x` (every invocation gets it).
fn inverse_rms(lid: u32, base: u32) -> f32 {
    var s = 0.0;
    for (var i = lid; i < p.group; i += WG) {
        let v = x[base + i];
        s += v * v;
    }
    return inverse_rms_of(lid, s, p.eps);
}

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
    let scale = inverse_rms(lid, base);
    for (var i = lid; i < p.group; i += WG) {
        out[base + i] = (x[base + i] * scale) * weight[i];
    }
}

// `out += rms_norm(x) · weight` over whole rows (`group` is the row
// length): a residual branch added through its post-norm, the same f32
// operations as `rms_norm` then `add`.
@compute @workgroup_size(256)
fn add_rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if row >= p.n_slices {
        return;
    }
    let base = row * p.group;
    let scale = inverse_rms(lid, base);
    for (var i = lid; i < p.group; i += WG) {
        out[base + i] = out[base + i] + (x[base + i] * scale) * weight[i];
    }
}

// Normalized value `v` of column `c` of `row` (0 beyond the row) into
// `out`, and quantized with the workgroup's other 255 for the matmuls.
fn store_quantized(lid: u32, row: u32, c: u32, v: f32, k_quant: bool) {
    if c < p.group {
        out[row * p.group + c] = v;
    }
    let dst = Dest(p.group, p.d_off, p.s_off, p.q8_1_sums);
    if k_quant {
        quantize_chunk_q8_k(lid, row, c, v, true, dst);
    } else {
        quantize_chunk_q8_0(lid, row, c, v, true, dst);
    }
}

// Whole rows (`group` is the row length), normalized as `rms_norm` does,
// each value also quantized as `quantize.wgsl` would, 256 at a time.
fn rms_norm_quantize(wid: vec3<u32>, nwg: vec3<u32>, lid: u32, k_quant: bool) {
    let row = group_index(wid, nwg);
    if row >= p.n_slices {
        return;
    }
    let base = row * p.group;
    let scale = inverse_rms(lid, base);
    for (var c0 = 0u; c0 < p.group; c0 += WG) {
        let c = c0 + lid;
        var v = 0.0;
        if c < p.group {
            v = (x[base + c] * scale) * weight[c];
        }
        store_quantized(lid, row, c, v, k_quant);
    }
}

@compute @workgroup_size(256)
fn rms_norm_quantize_q8_0(@builtin(workgroup_id) wid: vec3<u32>,
                          @builtin(num_workgroups) nwg: vec3<u32>,
                          @builtin(local_invocation_index) lid: u32) {
    rms_norm_quantize(wid, nwg, lid, false);
}

@compute @workgroup_size(256)
fn rms_norm_quantize_q8_k(@builtin(workgroup_id) wid: vec3<u32>,
                          @builtin(num_workgroups) nwg: vec3<u32>,
                          @builtin(local_invocation_index) lid: u32) {
    rms_norm_quantize(wid, nwg, lid, true);
}

// `rms_norm_quantize` of the rows of `stream` after `stream += rms_norm(branch)
// · post_weight` (the same f32 operations as `add_rms_norm`, whose result is
// written back): each invocation reads back only the values it wrote.
fn add_rms_norm_quantize(wid: vec3<u32>, nwg: vec3<u32>, lid: u32, k_quant: bool) {
    let row = group_index(wid, nwg);
    if row >= p.n_slices {
        return;
    }
    let base = row * p.group;
    var s = 0.0;
    for (var i = lid; i < p.group; i += WG) {
        let v = branch[base + i];
        s += v * v;
    }
    let branch_scale = inverse_rms_of(lid, s, p.post_eps);
    s = 0.0;
    for (var i = lid; i < p.group; i += WG) {
        let v = stream[base + i] + (branch[base + i] * branch_scale) * post_weight[i];
        stream[base + i] = v;
        s += v * v;
    }
    let scale = inverse_rms_of(lid, s, p.eps);
    for (var c0 = 0u; c0 < p.group; c0 += WG) {
        let c = c0 + lid;
        var v = 0.0;
        if c < p.group {
            v = (stream[base + c] * scale) * weight[c];
        }
        store_quantized(lid, row, c, v, k_quant);
    }
}

@compute @workgroup_size(256)
fn add_rms_norm_quantize_q8_0(@builtin(workgroup_id) wid: vec3<u32>,
                              @builtin(num_workgroups) nwg: vec3<u32>,
                              @builtin(local_invocation_index) lid: u32) {
    add_rms_norm_quantize(wid, nwg, lid, false);
}

@compute @workgroup_size(256)
fn add_rms_norm_quantize_q8_k(@builtin(workgroup_id) wid: vec3<u32>,
                              @builtin(num_workgroups) nwg: vec3<u32>,
                              @builtin(local_invocation_index) lid: u32) {
    add_rms_norm_quantize(wid, nwg, lid, true);
}
