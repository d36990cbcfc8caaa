// out = x · Wᵀ for float weights (F32, F16, BF16) with f32 activations.
// One workgroup per output feature; its 64 invocations stride over the row
// and dot it with up to 8 activation rows at once, so each weight is read
// once per 8 rows (the verify shape of speculative decoding).

#include "common.wgsl"

struct Params {
    rows: u32,       // output features in this weight part
    cols: u32,       // row length
    n: u32,          // activation rows
    row0: u32,       // first output feature of this part
    out_cols: u32,   // output row length (all features)
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

const WG: u32 = 64u;
const NR: u32 = 8u;
var<workgroup> partial: array<array<f32, WG>, NR>;

fn weight_f32(i: u32) -> f32 {
    return bitcast<f32>(w[i]);
}

fn weight_f16(i: u32) -> f32 {
    return f16_bits(w[i / 2u] >> (16u * (i % 2u)));
}

fn weight_bf16(i: u32) -> f32 {
    return bf16_bits(w[i / 2u] >> (16u * (i % 2u)));
}

// Sums each row's partials and writes the outputs of rows g..g+nr.
fn finish(lid: u32, o: u32, g: u32, nr: u32) {
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s /= 2u) {
        if lid < s {
            for (var r = 0u; r < NR; r++) {
                partial[r][lid] += partial[r][lid + s];
            }
        }
        workgroupBarrier();
    }
    if lid < nr {
        y[(g + lid) * p.out_cols + p.row0 + o] = partial[lid][0];
    }
    workgroupBarrier();
}

@compute @workgroup_size(64)
fn matmul_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let o = group_index(wid, nwg);
    if o >= p.rows {
        return;
    }
    for (var g = 0u; g < p.n; g += NR) {
        let nr = min(NR, p.n - g);
        var acc: array<f32, NR>;
        for (var c = lid; c < p.cols; c += WG) {
            let wv = weight_f32(o * p.cols + c);
            for (var r = 0u; r < nr; r++) {
                acc[r] += wv * x[(g + r) * p.cols + c];
            }
        }
        for (var r = 0u; r < NR; r++) {
            partial[r][lid] = acc[r];
        }
        finish(lid, o, g, nr);
    }
}

@compute @workgroup_size(64)
fn matmul_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let o = group_index(wid, nwg);
    if o >= p.rows {
        return;
    }
    for (var g = 0u; g < p.n; g += NR) {
        let nr = min(NR, p.n - g);
        var acc: array<f32, NR>;
        for (var c = lid; c < p.cols; c += WG) {
            let wv = weight_f16(o * p.cols + c);
            for (var r = 0u; r < nr; r++) {
                acc[r] += wv * x[(g + r) * p.cols + c];
            }
        }
        for (var r = 0u; r < NR; r++) {
            partial[r][lid] = acc[r];
        }
        finish(lid, o, g, nr);
    }
}

@compute @workgroup_size(64)
fn matmul_bf16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let o = group_index(wid, nwg);
    if o >= p.rows {
        return;
    }
    for (var g = 0u; g < p.n; g += NR) {
        let nr = min(NR, p.n - g);
        var acc: array<f32, NR>;
        for (var c = lid; c < p.cols; c += WG) {
            let wv = weight_bf16(o * p.cols + c);
            for (var r = 0u; r < nr; r++) {
                acc[r] += wv * x[(g + r) * p.cols + c];
            }
        }
        for (var r = 0u; r < NR; r++) {
            partial[r][lid] = acc[r];
        }
        finish(lid, o, g, nr);
    }
}
