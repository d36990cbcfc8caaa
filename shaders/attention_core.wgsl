// The body of the attention kernels (`attention.wgsl` for an f32 KV cache,
// `attention_f16.wgsl` for an f16 one): they bind `k` and `v` and define
// `key_pair(i)` (elements i, i + 1 of the keys; i even) and `value(i)`.

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
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

const WG: u32 = 64u;
const MAX_HEAD_DIM: u32 = 256u;
const DIMS_PER_THREAD: u32 = MAX_HEAD_DIM / WG;
const NEG_MAX: f32 = -3.40282346638528859812e38;

var<workgroup> qh: array<f32, MAX_HEAD_DIM>;
var<workgroup> probs: array<f32, WG>;
var<workgroup> red: array<f32, WG>;

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

    for (var i = lid; i < d; i += WG) {
        qh[i] = q[r * q_cols + h * d + i];
    }
    workgroupBarrier();

    var m = NEG_MAX;
    var l = 0.0;
    var acc: array<f32, DIMS_PER_THREAD>;
    for (var k0 = lo; k0 < hi; k0 += WG) {
        let j = k0 + lid;
        var s = NEG_MAX;
        if j < hi {
            var dot = 0.0;
            let kb = j * kv_cols + kv_off;
            for (var i = 0u; i < d; i += 2u) {
                let kk = key_pair(kb + i);
                dot += qh[i] * kk.x;
                dot += qh[i + 1u] * kk.y;
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
                    sum += probs[jj] * value((k0 + jj) * kv_cols + kv_off + i);
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
