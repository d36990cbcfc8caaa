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

const F32: u32 = 0u;
const F16: u32 = 1u;
const BF16: u32 = 2u;

// Weight `i` of the row-major matrix, of type `ty` (a constant per entry).
fn weight(ty: u32, i: u32) -> f32 {
    if ty == F32 {
        return bitcast<f32>(w[i]);
    }
    let half = w[i / 2u] >> (16u * (i % 2u));
    if ty == F16 {
        return f16_bits(half);
    }
    return bf16_bits(half);
}

fn matmul_float(ty: u32, wid: vec3<u32>, nwg: vec3<u32>, lid: u32) {
    let o = group_index(wid, nwg);
    if o >= p.rows {
        return;
    }
    for (var g = 0u; g < p.n; g += NR) {
        let nr = min(NR, p.n - g);
        var acc = array<f32, NR>();
        for (var c = lid; c < p.cols; c += WG) {
            let wv = weight(ty, o * p.cols + c);
            for (var r = 0u; r < nr; r++) {
                acc[r] += wv * x[(g + r) * p.cols + c];
            }
        }
        // Sum each row's partials and write the outputs of rows g..g+nr.
        for (var r = 0u; r < NR; r++) {
            partial[r][lid] = acc[r];
        }
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
}

@compute @workgroup_size(64)
fn matmul_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    matmul_float(F32, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn matmul_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    matmul_float(F16, wid, nwg, lid);
}

@compute @workgroup_size(64)
fn matmul_bf16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    matmul_float(BF16, wid, nwg, lid);
}
