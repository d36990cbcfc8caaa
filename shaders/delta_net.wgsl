// A hybrid model's gated-DeltaNet block (see HybridOps): the causal depthwise
// convolution over rows with its rolling state, then SiLU; and the gated delta
// rule over rows in order, a workgroup per value head and block of its state's
// value columns, one column per invocation, the head's query and key in
// workgroup memory.

#include "common.wgsl"

struct Params {
    n_rows: u32,
    channels: u32,
    taps: u32,
    n_k_heads: u32,
    n_v_heads: u32,
    k_dim: u32,
    v_dim: u32,
    eps: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
// Convolution: the new rows; delta rule: rows of queries, keys, values.
@group(0) @binding(1) var<storage, read> src: array<f32>;
// Convolution: the taps, `taps` per channel; delta rule: alpha per row and head.
@group(0) @binding(2) var<storage, read> aux: array<f32>;
// Convolution: the last `taps − 1` inputs; delta rule: `k_dim x v_dim` per head
// (row i: key index i over the value columns).
@group(0) @binding(3) var<storage, read_write> state: array<f32>;
@group(0) @binding(4) var<storage, read_write> dst: array<f32>;
@group(0) @binding(5) var<storage, read> beta: array<f32>;
@group(0) @binding(6) var<storage, read> dt_bias: array<f32>;
@group(0) @binding(7) var<storage, read> decay: array<f32>;

fn silu(x: f32) -> f32 {
    return x / (1.0 + exp(-x));
}

// Row `r` of the convolution's window: the state's rows, then the new ones.
fn window(r: u32, c: u32) -> f32 {
    let history = p.taps - 1u;
    if r < history {
        return state[r * p.channels + c];
    }
    return src[(r - history) * p.channels + c];
}

// One invocation per channel: the rows in order, then the state becomes the
// window's last `taps − 1` rows (row j reads a row at or after j, so in place).
@compute @workgroup_size(256)
fn causal_conv_silu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
    let c = group_index(wid, nwg) * 256u + lid;
    if c >= p.channels {
        return;
    }
    for (var t = 0u; t < p.n_rows; t++) {
        var sum = 0.0;
        for (var tap = 0u; tap < p.taps; tap++) {
            sum += window(t + tap, c) * aux[c * p.taps + tap];
        }
        dst[t * p.channels + c] = silu(sum);
    }
    for (var j = 0u; j + 1u < p.taps; j++) {
        state[j * p.channels + c] = window(p.n_rows + j, c);
    }
}

const WG: u32 = 128u;
// Widest key head (Qwen3.5's are 128).
const MAX_K: u32 = 256u;

var<workgroup> q_s: array<f32, MAX_K>;
var<workgroup> k_s: array<f32, MAX_K>;
var<workgroup> red: array<f32, WG>;

// ggml's softplus.
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        return x;
    }
    return log(1.0 + exp(x));
}

// `v` summed over the workgroup, returned to every invocation.
fn workgroup_sum(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if lid < s {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    let total = red[0];
    workgroupBarrier();
    return total;
}

// Workgroup (h, block): value head h, columns block·WG.. of its state, one
// per invocation, held in a private array through every row of the pass
// (read once, written once, however many rows).
@compute @workgroup_size(128)
fn gated_delta_rule(@builtin(workgroup_id) wid: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let j = wid.y * WG + lid;
    let owns_column = j < p.v_dim;
    let kh = h % p.n_k_heads;
    let width = 2u * p.n_k_heads * p.k_dim + p.n_v_heads * p.v_dim;
    let q_scale = 1.0 / sqrt(f32(p.k_dim));
    let s0 = h * p.k_dim * p.v_dim + j;
    var col: array<f32, MAX_K>;
    if owns_column {
        for (var i = 0u; i < p.k_dim; i++) {
            col[i] = state[s0 + i * p.v_dim];
        }
    }
    for (var t = 0u; t < p.n_rows; t++) {
        let row = t * width;
        var qq = 0.0;
        var kk = 0.0;
        for (var i = lid; i < p.k_dim; i += WG) {
            let qv = src[row + kh * p.k_dim + i];
            let kv = src[row + (p.n_k_heads + kh) * p.k_dim + i];
            q_s[i] = qv;
            k_s[i] = kv;
            qq += qv * qv;
            kk += kv * kv;
        }
        // L2 norms with a floor; the sums' barriers publish q_s and k_s.
        let qs = q_scale / max(sqrt(workgroup_sum(lid, qq)), p.eps);
        let ks = 1.0 / max(sqrt(workgroup_sum(lid, kk)), p.eps);
        if owns_column {
            let g = exp(softplus(aux[t * p.n_v_heads + h] + dt_bias[h]) * decay[h]);
            let b = 1.0 / (1.0 + exp(-beta[t * p.n_v_heads + h]));
            var sk = 0.0;
            for (var i = 0u; i < p.k_dim; i++) {
                let e = col[i] * g;
                col[i] = e;
                sk += e * (k_s[i] * ks);
            }
            let d = (src[row + 2u * p.n_k_heads * p.k_dim + h * p.v_dim + j] - sk) * b;
            var o = 0.0;
            for (var i = 0u; i < p.k_dim; i++) {
                let e = col[i] + (k_s[i] * ks) * d;
                col[i] = e;
                o += e * (q_s[i] * qs);
            }
            dst[(t * p.n_v_heads + h) * p.v_dim + j] = o;
        }
        // q_s and k_s are rewritten for the next row.
        workgroupBarrier();
    }
    if owns_column {
        for (var i = 0u; i < p.k_dim; i++) {
            state[s0 + i * p.v_dim] = col[i];
        }
    }
}
