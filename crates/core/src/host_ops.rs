//! The reference semantics of the trait ops that are not plain arithmetic
//! kernels (top-k, seeded sampling, DFly's slice fusion, DFlash2's selector
//! walk, softcapping, the hybrid blocks' convolution, delta rule and
//! gates), on host slices: what a backend whose tensors live in
//! host memory (the CPU backend) runs, and what device kernels are tested
//! against through the conformance suite.

use crate::backend::DeltaNetParams;
use crate::sampling::{sample_index, seeded_uniform, SamplingParams};

/// `x = cap · tanh(x / cap)`.
pub fn softcap(x: &mut [f32], cap: f32) {
    for l in x {
        *l = cap * (*l / cap).tanh();
    }
}

/// The `k` largest values of each `cols`-wide row of `x`, best first, the
/// smaller index first on ties, NaN counting as −∞: `(values, ids as f32)`,
/// `k` per row.
pub fn top_k(x: &[f32], cols: usize, k: usize) -> (Vec<f32>, Vec<f32>) {
    assert!(k <= cols, "top_k: k {k} > cols {cols}");
    let n = x.len().checked_div(cols).unwrap_or(0);
    let (mut vals, mut idx) = (Vec::with_capacity(n * k), Vec::with_capacity(n * k));
    for row in x.chunks_exact(cols.max(1)) {
        let key = |i: usize| {
            if row[i].is_nan() {
                f32::NEG_INFINITY
            } else {
                row[i]
            }
        };
        let mut order: Vec<usize> = (0..cols).collect();
        // `partial_cmp` as a GPU compares: −0 equals 0 (no NaN is left).
        let by_value = |a: &usize, b: &usize| {
            let order = key(*b).partial_cmp(&key(*a));
            order.unwrap_or(std::cmp::Ordering::Equal).then(a.cmp(b))
        };
        if k > 0 && k < cols {
            order.select_nth_unstable_by(k - 1, by_value);
            order.truncate(k);
        }
        order.sort_by(by_value);
        vals.extend(order.iter().map(|&i| row[i]));
        idx.extend(order.iter().map(|&i| i as f32));
    }
    (vals, idx)
}

/// The repetition penalty on `cols`-wide rows of logits `x` (see
/// `SamplingOps::penalize`): row `r` for the last `last_n` tokens of
/// `history ++ batch[1..=r]`.
pub fn penalize_rows(
    x: &mut [f32],
    cols: usize,
    history: &[u32],
    batch: &[u32],
    penalty: f32,
    last_n: usize,
) {
    let mut seq = history.to_vec();
    for (r, row) in x.chunks_exact_mut(cols.max(1)).enumerate() {
        if r > 0 {
            seq.push(batch[r]);
        }
        crate::sampling::penalize(row, &seq[seq.len().saturating_sub(last_n)..], penalty);
    }
}

/// One seeded draw per `cols`-wide row of logits `x` (see
/// `SamplingOps::sample_to`): the picked ids as f32.
pub fn sample_rows(x: &[f32], cols: usize, p: &SamplingParams, counter: u64) -> Vec<f32> {
    if cols == 0 {
        return Vec::new();
    }
    let k = p.top_k.min(cols);
    let (values, ids) = if k > 0 {
        let (v, i) = top_k(x, cols, k);
        (v, Some(i))
    } else {
        (x.to_vec(), None)
    };
    let m = if k > 0 { k } else { cols };
    values
        .chunks_exact(m)
        .enumerate()
        .map(|(r, row)| {
            let u = seeded_uniform(p.seed, counter.wrapping_add(r as u64));
            let i = sample_index(row, k > 0, p, u);
            ids.as_ref().map_or(i as f32, |ids| ids[r * m + i])
        })
        .collect()
}

/// `out[r][c] += Σ_j w[j] · x[r][j·d + c]` in order of `j`, `d` being
/// `out`'s row width and `x`'s rows `w.len()·d` wide.
pub fn add_slices(x: &[f32], w: &[f32], out: &mut [f32], d: usize) {
    let width = w.len() * d;
    for (orow, xrow) in out
        .chunks_exact_mut(d.max(1))
        .zip(x.chunks_exact(width.max(1)))
    {
        for (&wj, slice) in w.iter().zip(xrow.chunks_exact(d)) {
            for (o, v) in orow.iter_mut().zip(slice) {
                *o += wj * v;
            }
        }
    }
}

/// DFlash2's selector walk (see `DrafterOps::selector_walk`) over `n` rows of
/// `k` candidates with rank `r`: the picked candidate ids of rows 1..n.
#[allow(clippy::too_many_arguments)]
pub fn selector_walk(
    gates: &[f32],
    pred: &[f32],
    succ: &[f32],
    unary: &[f32],
    cand: &[f32],
    n: usize,
    k: usize,
    r: usize,
) -> Vec<f32> {
    let mut p = 0;
    let mut walk = Vec::with_capacity(n.saturating_sub(1));
    for row in 1..n {
        let ap: Vec<f32> = (0..r)
            .map(|j| pred[p * r + j] * gates[row * r + j])
            .collect();
        let mut best = (f32::NEG_INFINITY, 0);
        for c in 0..k {
            let bs = &succ[(row * k + c) * r..][..r];
            let dot: f32 = ap.iter().zip(bs).map(|(x, y)| x * y).sum();
            let s = unary[row * k + c] + dot;
            if s > best.0 || c == 0 {
                best = (s, c);
            }
        }
        walk.push(cand[row * k + best.1]);
        p = row * k + best.1;
    }
    walk
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// ggml's softplus: `ln(1 + eˣ)`, `x` itself beyond 20.
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (1.0 + x.exp()).ln()
    }
}

/// [`crate::backend::HybridOps::causal_conv_silu`] on `c`-wide rows with
/// `k` taps: `state` holds `(k − 1)·c` values.
pub fn causal_conv_silu(
    x: &[f32],
    c: usize,
    weight: &[f32],
    k: usize,
    state: &mut [f32],
    out: &mut [f32],
) {
    let history = k - 1;
    assert!(
        weight.len() == c * k && state.len() == history * c && out.len() == x.len(),
        "causal_conv_silu shapes"
    );
    // Row r of the window: the state's rows, then the new ones.
    let n = x.len() / c.max(1);
    let window = |r: usize, ch: usize| {
        if r < history {
            state[r * c + ch]
        } else {
            x[(r - history) * c + ch]
        }
    };
    for t in 0..n {
        for ch in 0..c {
            let mut sum = 0.0f32;
            for tap in 0..k {
                sum += window(t + tap, ch) * weight[ch * k + tap];
            }
            out[t * c + ch] = silu(sum);
        }
    }
    // Row j of the new state is window row n + j, at or after row j: in
    // place, in increasing j.
    for j in 0..history {
        for ch in 0..c {
            let v = if n + j < history {
                state[(n + j) * c + ch]
            } else {
                x[(n + j - history) * c + ch]
            };
            state[j * c + ch] = v;
        }
    }
}

/// What the gated delta rule takes from each row of a pass, before any
/// state is touched: the L2-normalised queries (times `1/√k_dim`) and keys
/// of every row and key head (`n·n_k_heads·k_dim` each, row-major), and
/// `(e^g, β)` of every row and value head. The reference and the CPU
/// backend's kernel both start from it.
pub struct DeltaRuleRows {
    /// Rows of the pass.
    pub n: usize,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub gates: Vec<(f32, f32)>,
}

impl DeltaRuleRows {
    /// Panics where the inputs' lengths do not fit `p` (as the CPU
    /// backend's ops do on shapes its callers checked).
    pub fn new(
        x: &[f32],
        alpha: &[f32],
        beta: &[f32],
        dt_bias: &[f32],
        a: &[f32],
        p: DeltaNetParams,
    ) -> Self {
        let (hk, hv, dk) = (p.n_k_heads, p.n_v_heads, p.k_dim);
        let width = p.input_dim();
        let n = x.len() / width.max(1);
        assert!(
            x.len() == n * width
                && alpha.len() == n * hv
                && beta.len() == n * hv
                && dt_bias.len() == hv
                && a.len() == hv,
            "gated_delta_rule shapes"
        );
        let q_scale = 1.0 / (dk as f32).sqrt();
        let (mut q, mut k) = (vec![0.0f32; n * hk * dk], vec![0.0f32; n * hk * dk]);
        for t in 0..n {
            let row = &x[t * width..];
            for (src, dst, scale) in [(0, &mut q, q_scale), (hk * dk, &mut k, 1.0)] {
                for h in 0..hk {
                    let v = &row[src + h * dk..][..dk];
                    let sum: f32 = v.iter().map(|e| e * e).sum();
                    let s = scale / sum.sqrt().max(p.eps);
                    let o = &mut dst[(t * hk + h) * dk..][..dk];
                    o.iter_mut().zip(v).for_each(|(o, e)| *o = e * s);
                }
            }
        }
        let gates = (0..n * hv)
            .map(|i| {
                let h = i % hv;
                let decay = (softplus(alpha[i] + dt_bias[h]) * a[h]).exp();
                (decay, sigmoid(beta[i]))
            })
            .collect();
        DeltaRuleRows { n, q, k, gates }
    }
}

/// [`crate::backend::HybridOps::gated_delta_rule`] on host slices.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_rule(
    x: &[f32],
    alpha: &[f32],
    beta: &[f32],
    dt_bias: &[f32],
    a: &[f32],
    state: &mut [f32],
    out: &mut [f32],
    p: DeltaNetParams,
) {
    let rows = DeltaRuleRows::new(x, alpha, beta, dt_bias, a, p);
    let (n, hk, hv, dk, dv) = (rows.n, p.n_k_heads, p.n_v_heads, p.k_dim, p.v_dim);
    assert!(
        state.len() == hv * dk * dv && out.len() == n * hv * dv,
        "gated_delta_rule shapes"
    );
    let width = p.input_dim();
    for t in 0..n {
        let v_in = &x[t * width + 2 * hk * dk..(t + 1) * width];
        for h in 0..hv {
            let at = (t * hk + h % hk) * dk;
            let (qh, kh) = (&rows.q[at..at + dk], &rows.k[at..at + dk]);
            let (decay, b) = rows.gates[t * hv + h];
            // Head h's state: k_dim rows of v_dim, S[i][j] at i·v_dim + j.
            let s = &mut state[h * dk * dv..(h + 1) * dk * dv];
            for j in 0..dv {
                let mut sk = 0.0f32;
                for (i, ki) in kh.iter().enumerate() {
                    let e = &mut s[i * dv + j];
                    *e *= decay;
                    sk += *e * ki;
                }
                let d = (v_in[h * dv + j] - sk) * b;
                let mut o = 0.0f32;
                for (i, (ki, qi)) in kh.iter().zip(qh).enumerate() {
                    let e = &mut s[i * dv + j];
                    *e += ki * d;
                    o += *e * qi;
                }
                out[(t * hv + h) * dv + j] = o;
            }
        }
    }
}

/// [`crate::backend::HybridOps::split_heads`] of `cols`-wide rows.
pub fn split_heads(x: &[f32], cols: usize, d: usize, first: &mut [f32], second: &mut [f32]) {
    let half = cols / 2;
    for (r, row) in x.chunks_exact(cols).enumerate() {
        for (h, head) in row.chunks_exact(2 * d).enumerate() {
            let at = r * half + h * d;
            first[at..at + d].copy_from_slice(&head[..d]);
            second[at..at + d].copy_from_slice(&head[d..]);
        }
    }
}

/// [`crate::backend::HybridOps::sigmoid_mul`].
pub fn sigmoid_mul(x: &mut [f32], gate: &[f32]) {
    for (v, g) in x.iter_mut().zip(gate) {
        *v *= sigmoid(*g);
    }
}
