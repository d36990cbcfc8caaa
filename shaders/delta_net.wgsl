// A hybrid model's gated-DeltaNet block (see HybridOps): the causal depthwise
// convolution over rows with its rolling state, then SiLU; and the gated delta
// rule, in two forms.
//
// Recurrent (`gated_delta_rule`, decode and verify passes): the rows in
// order, a workgroup per value head and block of its state's value columns,
// one column per invocation, the head's query and key in workgroup memory.
//
// Chunked (prefill): the rows in chunks of CHUNK, each chunk one step from
// its starting state S₀ in the WY form. With γ_t the decays' sum over the
// chunk's rows up to t, k̂ and q̂ the normalised keys and queries:
//   A[t][s] = β_t·e^{γ_t−γ_s}·k̂_t·k̂_s (s < t), T = (I + A)⁻¹,
//   D = T·diag(β)·(V − diag(e^γ)·K̂·S₀)          (the rows' deltas),
//   O_t = e^{γ_t}·S₀ᵀq̂_t + Σ_{s≤t} e^{γ_t−γ_s}·(q̂_t·k̂_s)·D_s,
//   S  = e^{γ_last}·S₀ + Σ_s e^{γ_last−γ_s}·k̂_s·D_sᵀ.
// `delta_rule_prepare` computes what depends on the rows only (T·diag(β),
// the masked decayed q̂·k̂, the decay and norm factors), for every chunk at
// once; `delta_rule_chunked` then walks the chunks in order, a workgroup per
// value head and block of value columns splitting each chunk's rows as well
// as its columns. Decays are always exponentials of sums over the rows
// between (never e^{−γ_s} alone, which overflows, nor a difference of two
// long sums, which loses the short one's precision).

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

// Rows per chunk of the chunked form.
const CHUNK: u32 = 32u;
// Key columns per step of the preparation's Gram products, and the rows
// each of its invocations pairs with its own (row lid / SPAN with rows
// lid % SPAN + SPAN·m).
const TILE: u32 = 16u;
const SPAN: u32 = 256u / CHUNK;
// Per chunk and value head: T·diag(β), then the masked decayed q̂·k̂, each
// CHUNK x CHUNK, row-major.
const MATS: u32 = 2u * CHUNK * CHUNK;
// Per chunk and value head, CHUNK of each: e^{γ_t}; e^{γ_t}/‖k_t‖;
// e^{γ_t}·q_scale/‖q_t‖; e^{γ_last−γ_t}/‖k_t‖.
const FACTORS: u32 = 4u * CHUNK;
const F_DECAY: u32 = 0u;
const F_KEY: u32 = CHUNK;
const F_QUERY: u32 = 2u * CHUNK;
const F_UPDATE: u32 = 3u * CHUNK;

// The preparation's outputs (in the state's and output's places) ...
@group(0) @binding(3) var<storage, read_write> mats_out: array<f32>;
@group(0) @binding(4) var<storage, read_write> factors_out: array<f32>;
// ... as the walk reads them (in alpha's and beta's places).
@group(0) @binding(2) var<storage, read> mats: array<f32>;
@group(0) @binding(5) var<storage, read> factors: array<f32>;

// The chunk's keys and queries, TILE columns at a time; its rows' log
// decays, β and 1/‖k‖; A.
var<workgroup> k_tile: array<f32, CHUNK * TILE>;
var<workgroup> q_tile: array<f32, CHUNK * TILE>;
var<workgroup> g_c: array<f32, CHUNK>;
var<workgroup> b_c: array<f32, CHUNK>;
var<workgroup> ik_c: array<f32, CHUNK>;
var<workgroup> a_c: array<f32, CHUNK * CHUNK>;

// The decays' sum over rows `first..end` of the chunk.
fn log_decay(first: u32, end: u32) -> f32 {
    var sum = 0.0;
    for (var u = first; u < end; u++) {
        sum += g_c[u];
    }
    return sum;
}

// Workgroup (h, c): value head h, rows c·CHUNK.. of the pass.
@compute @workgroup_size(256)
fn delta_rule_prepare(@builtin(workgroup_id) wid: vec3<u32>,
                      @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let row0 = wid.y * CHUNK;
    let n = min(CHUNK, p.n_rows - row0);
    let kh = h % p.n_k_heads;
    let width = 2u * p.n_k_heads * p.k_dim + p.n_v_heads * p.v_dim;
    // Published by the Gram loop's barriers. Rows past the pass: no decay,
    // no update.
    if lid < CHUNK {
        var g = 0.0;
        var b = 0.0;
        if lid < n {
            let at = (row0 + lid) * p.n_v_heads + h;
            g = softplus(aux[at] + dt_bias[h]) * decay[h];
            b = 1.0 / (1.0 + exp(-beta[at]));
        }
        g_c[lid] = g;
        b_c[lid] = b;
    }
    let t = lid / SPAN;
    var kk: array<f32, CHUNK / SPAN>;
    var qk: array<f32, CHUNK / SPAN>;
    var qq = 0.0;
    for (var i0 = 0u; i0 < p.k_dim; i0 += TILE) {
        for (var e = lid; e < CHUNK * TILE; e += 256u) {
            let r = e / TILE;
            let i = i0 + e % TILE;
            var qv = 0.0;
            var kv = 0.0;
            if r < n && i < p.k_dim {
                let row = (row0 + r) * width;
                qv = src[row + kh * p.k_dim + i];
                kv = src[row + (p.n_k_heads + kh) * p.k_dim + i];
            }
            q_tile[e] = qv;
            k_tile[e] = kv;
        }
        workgroupBarrier();
        for (var ii = 0u; ii < TILE; ii++) {
            let qt = q_tile[t * TILE + ii];
            let kt = k_tile[t * TILE + ii];
            qq += qt * qt;
            for (var m = 0u; m < CHUNK / SPAN; m++) {
                let ks = k_tile[(lid % SPAN + SPAN * m) * TILE + ii];
                kk[m] += kt * ks;
                qk[m] += qt * ks;
            }
        }
        workgroupBarrier();
    }
    // The Gram diagonal holds the keys' squared norms.
    if lid % SPAN == t % SPAN {
        ik_c[t] = 1.0 / max(sqrt(kk[t / SPAN]), p.eps);
    }
    workgroupBarrier();
    let iq = 1.0 / (sqrt(f32(p.k_dim)) * max(sqrt(qq), p.eps));
    let base = (wid.y * p.n_v_heads + h) * MATS;
    for (var m = 0u; m < CHUNK / SPAN; m++) {
        let s = lid % SPAN + SPAN * m;
        var a = 0.0;
        var o = 0.0;
        if s <= t {
            let decayed = exp(log_decay(s + 1u, t + 1u)) * ik_c[s];
            o = decayed * qk[m] * iq;
            if s < t {
                a = b_c[t] * decayed * kk[m] * ik_c[t];
            }
        }
        a_c[t * CHUNK + s] = a;
        mats_out[base + CHUNK * CHUNK + t * CHUNK + s] = o;
    }
    if lid % SPAN == 0u {
        let at = (wid.y * p.n_v_heads + h) * FACTORS + t;
        let e = exp(log_decay(0u, t + 1u));
        factors_out[at + F_DECAY] = e;
        factors_out[at + F_KEY] = e * ik_c[t];
        factors_out[at + F_QUERY] = e * iq;
        factors_out[at + F_UPDATE] = exp(log_decay(t + 1u, n)) * ik_c[t];
    }
    workgroupBarrier();
    // Column c of T by forward substitution (T's columns are independent).
    if lid < CHUNK {
        let c = lid;
        var col: array<f32, CHUNK>;
        for (var r = 0u; r < CHUNK; r++) {
            var x = select(0.0, 1.0, r == c);
            for (var s = c; s < r; s++) {
                x -= a_c[r * CHUNK + s] * col[s];
            }
            col[r] = x;
            mats_out[base + r * CHUNK + c] = x * b_c[c];
        }
    }
}

// Value columns per workgroup of the walk, and the groups of rows its
// invocations form (a chunk's rows grp, grp + GROUPS, ... per invocation).
const CW: u32 = 32u;
const GROUPS: u32 = 256u / CW;
const PER: u32 = CHUNK / GROUPS;

// R, then D, then D scaled by F_UPDATE: CHUNK rows of the block's columns.
var<workgroup> r_c: array<f32, CHUNK * CW>;
var<workgroup> d_c: array<f32, CHUNK * CW>;
var<workgroup> du_c: array<f32, CHUNK * CW>;

// Workgroup (h, block): value head h, columns block·CW.. of its state,
// which stays in `state` between chunks (too large for workgroup memory).
@compute @workgroup_size(256)
fn delta_rule_chunked(@builtin(workgroup_id) wid: vec3<u32>,
                      @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let jl = lid % CW;
    let j = wid.y * CW + jl;
    let grp = lid / CW;
    let owns_column = j < p.v_dim;
    let kh = h % p.n_k_heads;
    let width = 2u * p.n_k_heads * p.k_dim + p.n_v_heads * p.v_dim;
    let q_at = kh * p.k_dim;
    let k_at = (p.n_k_heads + kh) * p.k_dim;
    let v_at = 2u * p.n_k_heads * p.k_dim + h * p.v_dim + j;
    let s0 = h * p.k_dim * p.v_dim + j;
    let n_chunks = (p.n_rows + CHUNK - 1u) / CHUNK;
    for (var c = 0u; c < n_chunks; c++) {
        let row0 = c * CHUNK;
        let n = min(CHUNK, p.n_rows - row0);
        let mb = (c * p.n_v_heads + h) * MATS;
        let fb = (c * p.n_v_heads + h) * FACTORS;
        // K·S₀ and Q·S₀ for this invocation's rows (past the pass: the last
        // row again, unused), then R without its β.
        var rows: array<u32, PER>;
        for (var m = 0u; m < PER; m++) {
            rows[m] = (row0 + min(grp + m * GROUPS, n - 1u)) * width;
        }
        // Zeroed explicitly: Chrome's compiler (on SwiftShader) does not zero
        // a bare `var` again on each pass of a loop.
        var ks = array<f32, PER>();
        var qs = array<f32, PER>();
        if owns_column {
            for (var i = 0u; i < p.k_dim; i++) {
                let sv = state[s0 + i * p.v_dim];
                for (var m = 0u; m < PER; m++) {
                    ks[m] += src[rows[m] + k_at + i] * sv;
                    qs[m] += src[rows[m] + q_at + i] * sv;
                }
            }
            for (var m = 0u; m < PER; m++) {
                let t = grp + m * GROUPS;
                if t < n {
                    r_c[t * CW + jl] = src[rows[m] + v_at] - factors[fb + F_KEY + t] * ks[m];
                }
            }
        }
        workgroupBarrier();
        // D = T·diag(β)·R (lower triangular).
        if owns_column {
            for (var m = 0u; m < PER; m++) {
                let t = grp + m * GROUPS;
                if t < n {
                    var d = 0.0;
                    for (var s = 0u; s <= t; s++) {
                        d += mats[mb + t * CHUNK + s] * r_c[s * CW + jl];
                    }
                    d_c[t * CW + jl] = d;
                    du_c[t * CW + jl] = d * factors[fb + F_UPDATE + t];
                }
            }
        }
        workgroupBarrier();
        if owns_column {
            for (var m = 0u; m < PER; m++) {
                let t = grp + m * GROUPS;
                if t < n {
                    var o = factors[fb + F_QUERY + t] * qs[m];
                    for (var s = 0u; s <= t; s++) {
                        o += mats[mb + CHUNK * CHUNK + t * CHUNK + s] * d_c[s * CW + jl];
                    }
                    dst[((row0 + t) * p.n_v_heads + h) * p.v_dim + j] = o;
                }
            }
            // This invocation's state rows grp, grp + GROUPS, ...
            let e = factors[fb + F_DECAY + n - 1u];
            var acc: array<f32, MAX_K / GROUPS>;
            for (var u = 0u; u < MAX_K / GROUPS; u++) {
                let i = grp + u * GROUPS;
                if i < p.k_dim {
                    acc[u] = state[s0 + i * p.v_dim] * e;
                }
            }
            for (var s = 0u; s < n; s++) {
                let d = du_c[s * CW + jl];
                let row = (row0 + s) * width + k_at + grp;
                for (var u = 0u; u < MAX_K / GROUPS; u++) {
                    if grp + u * GROUPS < p.k_dim {
                        acc[u] += src[row + u * GROUPS] * d;
                    }
                }
            }
            for (var u = 0u; u < MAX_K / GROUPS; u++) {
                let i = grp + u * GROUPS;
                if i < p.k_dim {
                    state[s0 + i * p.v_dim] = acc[u];
                }
            }
        }
        // The next chunk reads the state other invocations wrote.
        storageBarrier();
    }
}
