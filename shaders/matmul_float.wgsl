// out = x · Wᵀ for float weights (F32, F16, BF16) with f32 activations,
// up to 8 activation rows per pass, so each weight is read once per 8 rows
// (the verify shape of speculative decoding). Work split and sums:
// matmul_rows.wgsl. With shader-f16, f16 weights are read as f16.

#include "common.wgsl"
#include "matmul_rows.wgsl"

struct Params {
    rows: u32,       // output features in this weight part
    cols: u32,       // row length
    n: u32,          // activation rows
    row0: u32,       // first output feature of this part
    out_cols: u32,   // output row length (all features)
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
    epilogue: u32,   // EPILOGUE_* flags (matmul_rows.wgsl)
    _pad3: u32,
    _pad4: u32,
    _pad5: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;

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

fn matmul_float(ty: u32, inv: Invocation) {
    let at = place(inv);
    for (var g = 0u; g < p.n; g += NR) {
        let nr = min(NR, p.n - g);
        var acc = array<f32, NR>();
        if at.o < p.rows {
            for (var c = at.lane; c < p.cols; c += LANES) {
                let wv = weight(ty, at.o * p.cols + c);
                for (var r = 0u; r < nr; r++) {
                    acc[r] += wv * x[(g + r) * p.cols + c];
                }
            }
        }
        store_rows(inv, at, acc, g, nr);
    }
}

#if F16
// With `shader-f16`, f16 weights are read as the device's f16 type and
// converted by it. Only `matmul_f16` uses this view of binding 1.
@group(0) @binding(1) var<storage, read> w_f16: array<f16>;

fn matmul_f16_native(inv: Invocation) {
    let at = place(inv);
    for (var g = 0u; g < p.n; g += NR) {
        let nr = min(NR, p.n - g);
        var acc = array<f32, NR>();
        if at.o < p.rows {
            for (var c = at.lane; c < p.cols; c += LANES) {
                let wv = f32(w_f16[at.o * p.cols + c]);
                for (var r = 0u; r < nr; r++) {
                    acc[r] += wv * x[(g + r) * p.cols + c];
                }
            }
        }
        store_rows(inv, at, acc, g, nr);
    }
}
#endif

@compute @workgroup_size(64)
fn matmul_f32(inv: Invocation) {
    matmul_float(F32, inv);
}

@compute @workgroup_size(64)
fn matmul_f16(inv: Invocation) {
#if F16
    matmul_f16_native(inv);
#else
    matmul_float(F16, inv);
#endif
}

@compute @workgroup_size(64)
fn matmul_bf16(inv: Invocation) {
    matmul_float(BF16, inv);
}
