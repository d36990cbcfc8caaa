// The body of the attention kernels (`attention.wgsl` for an f32 KV cache,
// `attention_f16.wgsl` for an f16 one): they bind `k` and `v` and define
// `key_pair(i)` (elements i, i + 1 of the keys; i even), `value(i)`,
// `cached(x)` (what a value becomes once stored in the cache) and
// `store_kv(i, key pair, value pair)`.
//
// Fused (`p.fused`, a layer's whole attention step in one pass): the rows'
// own keys and values (positions q_pos0 ..) are not in the cache yet but
// in `k_new` and `v_new`, unrotated. Each workgroup rotates the queries it
// attends with and the new keys of its KV head (as rope.wgsl does, from the
// same cos/sin table), reads those keys and values from there, and the
// first query head of each KV head stores its row's key and value into
// the cache, where no other workgroup of the pass reads them. With
// `p.head_norm`, each head of the queries and the new keys is RMS-normed
// (Qwen3, Gemma 3) before its rotation, as rms_norm.wgsl would.

struct Params {
    n_rows: u32,
    n_head: u32,
    n_head_kv: u32,
    head_dim: u32,
    q_pos0: u32,
    kv_len: u32,
    causal: u32,
    window: u32,   // 0: none
    scale: f32,
    fused: u32,
    half_rot: u32,    // fused: rotated pairs per head
    neox: u32,        // fused: 1: pairs (i, i + half_rot); 0: (2i, 2i + 1)
    table_row0: u32,  // fused: the cos/sin table row of row 0's position
    q_scale: f32,     // fused: the queries' factor after rotation
    head_norm: u32,   // fused: 1: q and k heads RMS-normed first
    norm_eps: f32,
    k_norm_off: u32,  // the keys' norm weights in `head_norms`
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
// Fused only (any small buffer otherwise): the rows' own keys and values,
// and the rotation table (rope.wgsl's layout).
@group(0) @binding(5) var<storage, read> k_new: array<f32>;
@group(0) @binding(6) var<storage, read> v_new: array<f32>;
@group(0) @binding(7) var<storage, read> cos_sin: array<f32>;
// Fused with head norms only (any small buffer otherwise): the queries'
// norm weights, and the keys' at `p.k_norm_off`.
@group(0) @binding(8) var<storage, read> head_norms: array<f32>;

const WG: u32 = 64u;
const MAX_HEAD_DIM: u32 = 256u;
const DIMS_PER_THREAD: u32 = MAX_HEAD_DIM / WG;
const NEG_MAX: f32 = -3.40282346638528859812e38;
// Fused: new keys of one KV head held rotated (rows × head_dim at most).
const MAX_NEW_KEYS: u32 = 3072u;
// Fused with head norms: the rows whose keys' norms are held.
const MAX_NORMED_ROWS: u32 = 64u;

var<workgroup> qh: array<f32, MAX_HEAD_DIM>;
var<workgroup> probs: array<f32, WG>;
var<workgroup> red: array<f32, WG>;
var<workgroup> new_keys: array<f32, MAX_NEW_KEYS>;
var<workgroup> key_scales: array<f32, MAX_NORMED_ROWS>;

// The element rotated with element `i` of a head (itself beyond the
// rotated dimensions).
fn rope_partner(i: u32) -> u32 {
    if i >= 2u * p.half_rot {
        return i;
    }
    if p.neox == 1u {
        return select(i - p.half_rot, i + p.half_rot, i < p.half_rot);
    }
    return i ^ 1u;
}

// Element `i` of a head at row `r` after rotation, `xi` being its value
// and `xo` its partner's: rope.wgsl's (x0 c - x1 s, x0 s + x1 c).
fn rope_value(xi: f32, xo: f32, i: u32, r: u32) -> f32 {
    if i >= 2u * p.half_rot {
        return xi;
    }
    var first = (i & 1u) == 0u;
    var pair = i / 2u;
    if p.neox == 1u {
        first = i < p.half_rot;
        pair = select(i - p.half_rot, i, first);
    }
    let cs = 2u * ((p.table_row0 + r) * p.half_rot + pair);
    let c = cos_sin[cs];
    let s = cos_sin[cs + 1u];
    if first {
        return xi * c - xo * s;
    }
    return xo * s + xi * c;
}

fn reduce_max(lid: u32, x: f32) -> f32 {
    red[lid] = x;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s /= 2u) {
        if lid < s {
            red[lid] = max(red[lid], red[lid + s]);
        }
        workgroupBarrier();
    }
    let m = red[0];
    workgroupBarrier();
    return m;
}

fn reduce_sum(lid: u32, x: f32) -> f32 {
    red[lid] = x;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s /= 2u) {
        if lid < s {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    let m = red[0];
    workgroupBarrier();
    return m;
}

@compute @workgroup_size(64)
fn attention(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg);
    if t >= p.n_rows * p.n_head {
        return;
    }
    let r = t / p.n_head;
    let h = t % p.n_head;
    let d = p.head_dim;
    let q_cols = p.n_head * d;
    let kv_cols = p.n_head_kv * d;
    let kv_off = (h / (p.n_head / p.n_head_kv)) * d;
    let pos = p.q_pos0 + r;
    var hi = p.kv_len;
    if p.causal == 1u {
        hi = min(pos + 1u, p.kv_len);
    }
    var lo = 0u;
    if p.window > 0u && pos + 1u > p.window {
        lo = min(pos + 1u - p.window, hi);
    }

    let fused = p.fused == 1u;
    let normed = fused && p.head_norm == 1u;
    let q_base = r * q_cols + h * d;
    // Head norms: 1 / rms of this query head and of each new key's head,
    // and the values times them and their weights (identities otherwise).
    var q_inv = 1.0;
    if normed {
        var s = 0.0;
        for (var i = lid; i < d; i += WG) {
            s += q[q_base + i] * q[q_base + i];
        }
        q_inv = 1.0 / sqrt(reduce_sum(lid, s) / f32(d) + p.norm_eps);
        for (var j = 0u; j < p.n_rows; j++) {
            let base = j * kv_cols + kv_off;
            s = 0.0;
            for (var i = lid; i < d; i += WG) {
                s += k_new[base + i] * k_new[base + i];
            }
            let k_inv = 1.0 / sqrt(reduce_sum(lid, s) / f32(d) + p.norm_eps);
            if lid == 0u {
                key_scales[j] = k_inv;
            }
        }
        workgroupBarrier();
    }
    for (var i = lid; i < d; i += WG) {
        if fused {
            let o = rope_partner(i);
            var xi = q[q_base + i];
            var xo = q[q_base + o];
            if normed {
                xi = (xi * q_inv) * head_norms[i];
                xo = (xo * q_inv) * head_norms[o];
            }
            qh[i] = rope_value(xi, xo, i, r) * p.q_scale;
        } else {
            qh[i] = q[q_base + i];
        }
    }
    if fused {
        for (var e = lid; e < p.n_rows * d; e += WG) {
            let j = e / d;
            let i = e % d;
            let o = rope_partner(i);
            let base = j * kv_cols + kv_off;
            var xi = k_new[base + i];
            var xo = k_new[base + o];
            if normed {
                xi = (xi * key_scales[j]) * head_norms[p.k_norm_off + i];
                xo = (xo * key_scales[j]) * head_norms[p.k_norm_off + o];
            }
            new_keys[e] = cached(rope_value(xi, xo, i, j));
        }
    }
    workgroupBarrier();
    if fused && h % (p.n_head / p.n_head_kv) == 0u {
        let row = (p.q_pos0 + r) * kv_cols + kv_off;
        for (var i = 2u * lid; i < d; i += 2u * WG) {
            let key = vec2<f32>(new_keys[r * d + i], new_keys[r * d + i + 1u]);
            let vb = r * kv_cols + kv_off + i;
            store_kv(row + i, key, vec2<f32>(v_new[vb], v_new[vb + 1u]));
        }
    }

    var m = NEG_MAX;
    var l = 0.0;
    var acc: array<f32, DIMS_PER_THREAD>;
    for (var k0 = lo; k0 < hi; k0 += WG) {
        let j = k0 + lid;
        var s = NEG_MAX;
        if j < hi {
            var dot = 0.0;
            if fused && j >= p.q_pos0 {
                let kb = (j - p.q_pos0) * d;
                for (var i = 0u; i < d; i += 2u) {
                    dot += qh[i] * new_keys[kb + i];
                    dot += qh[i + 1u] * new_keys[kb + i + 1u];
                }
            } else {
                let kb = j * kv_cols + kv_off;
                for (var i = 0u; i < d; i += 2u) {
                    let kk = key_pair(kb + i);
                    dot += qh[i] * kk.x;
                    dot += qh[i + 1u] * kk.y;
                }
            }
            s = dot * p.scale;
        }
        let m_new = max(m, reduce_max(lid, s));
        var e = 0.0;
        if j < hi {
            e = exp(s - m_new);
        }
        probs[lid] = e;
        let corr = exp(m - m_new);
        l = l * corr + reduce_sum(lid, e);
        let n = min(WG, hi - k0);
        for (var a = 0u; a < DIMS_PER_THREAD; a++) {
            let i = lid + a * WG;
            if i < d {
                var sum = acc[a] * corr;
                for (var jj = 0u; jj < n; jj++) {
                    let j = k0 + jj;
                    var x: f32;
                    if fused && j >= p.q_pos0 {
                        x = cached(v_new[(j - p.q_pos0) * kv_cols + kv_off + i]);
                    } else {
                        x = value(j * kv_cols + kv_off + i);
                    }
                    sum += probs[jj] * x;
                }
                acc[a] = sum;
            }
        }
        m = m_new;
        workgroupBarrier();
    }
    for (var a = 0u; a < DIMS_PER_THREAD; a++) {
        let i = lid + a * WG;
        if i < d {
            out[r * q_cols + h * d + i] = select(acc[a] / l, 0.0, l == 0.0);
        }
    }
}
