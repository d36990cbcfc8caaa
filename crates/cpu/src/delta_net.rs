//! The gated delta rule on the CPU (`HybridOps::gated_delta_rule`): the
//! arithmetic of `host_ops::gated_delta_rule`, its reference, ordered for
//! speed. The vectors run along the state's value columns, so no dot needs
//! a horizontal sum, and each row costs one pass over the state, which
//! updates it and sums the next row's `Sᵀk` and `Sᵀq` in independent FMA
//! chains. A pass's tasks take one of two shapes, with the same operations
//! in the same order, so a row's bits do not depend on which ran it:
//!
//! - short passes (decode, verify: up to 32 rows) of 128-wide heads, with
//!   AVX-512: a head per task, on the state itself. Its rows are
//!   contiguous, so the 1 MB or so of a layer's state, which a decode step
//!   finds out of cache, streams through in order, and the row's sums stay
//!   in registers;
//! - longer passes (prefill, rollback replays), other widths, AVX2: a block
//!   of 64 value columns per task (32 KB of Qwen3.5's state, which stays in
//!   L1) through every row, on a contiguous copy; a narrower block runs
//!   zero-padded.
//!
//! This recurrent form serves prefill too: the chunked (WY) form that GPUs
//! use for long passes costs about 1.3–1.5× its multiply-adds, and a CPU
//! has no idle lanes for it to fill (16 heads × 2 blocks already exceed
//! its threads).

use crate::kernels::with_fma;
use crate::ops::expf_ggml;
use crate::pool::ThreadPool;
use blockdraft_core::backend::DeltaNetParams;
use blockdraft_core::host_ops::DeltaRuleRows;

/// Value columns of one pool task.
const BLOCK: usize = 64;

/// Raw pointers shared by pool tasks that each write disjoint state rows
/// and output elements.
struct Shared(*mut f32);
// SAFETY: tasks touch disjoint elements; the pool joins before the slices
// are used again.
unsafe impl Sync for Shared {}

impl Shared {
    /// A method, so closures capture the whole `Sync` wrapper.
    fn at(&self, offset: usize) -> *mut f32 {
        self.0.wrapping_add(offset)
    }
}

#[allow(clippy::too_many_arguments)]
pub fn gated_delta_rule(
    pool: &ThreadPool,
    x: &[f32],
    alpha: &[f32],
    beta: &[f32],
    dt_bias: &[f32],
    a: &[f32],
    from: Option<&[f32]>,
    state: &mut [f32],
    out: &mut [f32],
    p: DeltaNetParams,
) {
    let rows = DeltaRuleRows::new(x, alpha, beta, dt_bias, a, p);
    let (n, hv, dk, dv) = (rows.n, p.n_v_heads, p.k_dim, p.v_dim);
    assert!(
        state.len() == hv * dk * dv
            && from.is_none_or(|f| f.len() == state.len())
            && out.len() == n * hv * dv,
        "gated_delta_rule shapes"
    );
    let blocks = dv.div_ceil(BLOCK);
    let (state_at, out_at) = (Shared(state.as_mut_ptr()), Shared(out.as_mut_ptr()));
    // k·q per row and key head, for every value head's output.
    let kq: Vec<f32> = rows
        .k
        .chunks_exact(dk)
        .zip(rows.q.chunks_exact(dk))
        .map(|(k, q)| k.iter().zip(q).map(|(k, q)| k * q).sum())
        .collect();
    let pass = Pass {
        x,
        q: &rows.q,
        k: &rows.k,
        kq: &kq,
        gates: &rows.gates,
        from,
        p,
        n,
    };
    if n <= HEAD_ROWS_MAX && dv == HEAD_WIDTH && holds_a_head_row() {
        pool.run(hv, &|h| run_task(&pass, Job::Head(h), &state_at, &out_at));
        return;
    }
    pool.run(hv * blocks, &|task| {
        let (h, block) = (task / blocks, task % blocks);
        let cols = block * BLOCK..((block + 1) * BLOCK).min(dv);
        run_task(&pass, Job::Block(h, cols), &state_at, &out_at);
    });
}

/// A pool task's share of a pass.
enum Job {
    /// Value columns of head `h` through every row of the pass.
    Block(usize, std::ops::Range<usize>),
    /// All of head `h` through every row of a short pass.
    Head(usize),
}

/// What every task of one call reads.
struct Pass<'a> {
    x: &'a [f32],
    q: &'a [f32],
    k: &'a [f32],
    /// `k·q` per row and key head.
    kq: &'a [f32],
    /// `(e^g, β)` per row and value head.
    gates: &'a [(f32, f32)],
    /// The state before the pass, where it is not the one written.
    from: Option<&'a [f32]>,
    p: DeltaNetParams,
    n: usize,
}

/// `job`, in the widest vectors the CPU has.
fn run_task(pass: &Pass, job: Job, state: &Shared, out: &Shared) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::kernels::x86::has_avx512f() {
            // SAFETY: AVX-512 F (with AVX2 and FMA) checked at run time.
            return unsafe { task_avx512(pass, job, state, out) };
        }
        if crate::kernels::x86::has_avx2() {
            // SAFETY: AVX2 and FMA checked at run time.
            return unsafe { task_avx2(pass, job, state, out) };
        }
    }
    task(pass, job, state, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn task_avx512(pass: &Pass, job: Job, state: &Shared, out: &Shared) {
    task(pass, job, state, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn task_avx2(pass: &Pass, job: Job, state: &Shared, out: &Shared) {
    task(pass, job, state, out)
}

#[inline(always)]
fn task(pass: &Pass, job: Job, state: &Shared, out: &Shared) {
    match job {
        Job::Block(h, cols) => block_task(pass, h, cols, state, out),
        Job::Head(h) => head_rows(pass, h, state, out),
    }
}

/// Most rows of a pass that takes [`head_rows`]: beyond about 32, the
/// block copy's L1 residence pays for itself (measured on Zen 4).
const HEAD_ROWS_MAX: usize = 32;

/// Whether the vector registers hold a head row's `Sᵀk`, `Sᵀq` and `d`
/// (AVX-512's 32 × 16 lanes); with AVX2's 16 × 8 they would spill, and
/// [`head_rows`] is slower than [`block_task`] there.
fn holds_a_head_row() -> bool {
    #[cfg(target_arch = "x86_64")]
    return crate::kernels::x86::has_avx512f();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Width of the heads (Qwen3.5's, every size) whose short passes take
/// [`head_rows`].
const HEAD_WIDTH: usize = 128;

/// Head `h` through every row of a short pass (a decode step, a verify)
/// on the state itself: the head's rows are contiguous, so it streams
/// through in order, and a short pass reuses each state row too few times
/// to pay for a block copy.
#[inline(always)]
fn head_rows(pass: &Pass, h: usize, state: &Shared, out: &Shared) {
    columns_task::<HEAD_WIDTH>(pass, h, 0, None, state, out);
}

/// Value columns `cols` of head `h` through every row of the pass, on a
/// contiguous copy (its extra columns zero, and staying 0): the state's
/// own rows are `dv` apart, a stride at which a block's rows share too few
/// L1 sets to stay there between passes.
#[inline(always)]
fn block_task(pass: &Pass, h: usize, cols: std::ops::Range<usize>, state: &Shared, out: &Shared) {
    // Taken out of its thread-local cell, not worked on in a closure: a
    // closure would not inherit the caller's target features.
    let mut block = BLOCK_SCRATCH.take();
    block.clear();
    block.resize(pass.p.k_dim, [0f32; BLOCK]);
    columns_task::<BLOCK>(pass, h, cols.start, Some(&mut block), state, out);
    BLOCK_SCRATCH.set(block);
}

/// Value columns `c0..c0 + W` of head `h` (fewer where the head ends, run
/// zero-padded) through every row of the pass: on `copy`, which the first
/// pass fills and the last writes back, or without one on the state
/// itself (whose rows must then be `W` wide). Both task shapes run this,
/// so a row's bits do not depend on which ran it.
#[inline(always)]
fn columns_task<const W: usize>(
    pass: &Pass,
    h: usize,
    c0: usize,
    mut copy: Option<&mut [[f32; W]]>,
    state: &Shared,
    out: &Shared,
) {
    let p = pass.p;
    let (hk, hv, dk, dv) = (p.n_k_heads, p.n_v_heads, p.k_dim, p.v_dim);
    let width = p.input_dim();
    let (kh, w) = (h % hk, W.min(dv - c0));
    assert!(
        copy.is_some() || w == W,
        "an in-place task takes whole rows"
    );
    let at = |i: usize| (h * dk + i) * dv + c0;
    // SAFETY (for every use): row i's columns `c0..c0 + w` of head h are
    // this task's alone; each is read by value before it is written.
    let state_row = |i: usize| -> [f32; W] {
        padded(unsafe { std::slice::from_raw_parts(state.at(at(i)), w) })
    };
    // Row i of the state before the pass.
    let source = |i: usize| -> [f32; W] {
        match pass.from {
            Some(from) => padded(&from[at(i)..at(i) + w]),
            None => state_row(i),
        }
    };
    let key = |t: usize| {
        let at = (t * hk + kh) * dk;
        (&pass.q[at..at + dk], &pass.k[at..at + dk])
    };
    // Sᵀk and Sᵀq of the state before row t: for row 0 from a pass of
    // their own (which fills the copy), then from the pass that updates
    // the state for row t − 1, in the same order, so that a row's values
    // do not depend on where a pass starts (a verify gives a plain step's
    // values). With (e^g·S)ᵀk = e^g·(Sᵀk), the output is
    // (e^g·S + k·dᵀ)ᵀq = e^g·(Sᵀq) + (k·q)·d, so the update pass need not
    // sum it: one pass over the state per row.
    let (mut sk, mut sq) = ([0f32; W], [0f32; W]);
    let (q0, k0) = key(0);
    for (i, (&ki, &qi)) in k0.iter().zip(q0).enumerate() {
        let r = source(i);
        if let Some(copy) = copy.as_deref_mut() {
            copy[i] = r;
        }
        for c in 0..W {
            sk[c] = r[c].mul_add(ki, sk[c]);
            sq[c] = r[c].mul_add(qi, sq[c]);
        }
    }
    for t in 0..pass.n {
        let (decay, b) = pass.gates[t * hv + h];
        let k = key(t).1;
        let kq = pass.kq[t * hk + kh];
        let v = &pass.x[t * width + 2 * hk * dk + h * dv + c0..][..w];
        let mut d = [0f32; W];
        for c in 0..w {
            d[c] = (v[c] - decay * sk[c]) * b;
            // SAFETY: output (t, h, c0 + c) belongs to this task alone.
            unsafe { *out.at((t * hv + h) * dv + c0 + c) = decay.mul_add(sq[c], kq * d[c]) };
        }
        // S ← e^g·S + k·dᵀ, summing the next row's Sᵀk and Sᵀq on the way;
        // after the last row, into the state itself.
        let last = t + 1 == pass.n;
        let (next_q, next_k) = key((t + 1).min(pass.n - 1));
        (sk, sq) = ([0f32; W], [0f32; W]);
        for (i, &ki) in k.iter().enumerate() {
            let r = match copy.as_deref() {
                Some(copy) => copy[i],
                None if t == 0 => source(i),
                None => state_row(i),
            };
            // SAFETY: as for `state_row`.
            let row = unsafe { std::slice::from_raw_parts_mut(state.at(at(i)), w) };
            if last {
                match <&mut [f32; W]>::try_from(&mut *row) {
                    Ok(dst) => {
                        for c in 0..W {
                            dst[c] = r[c].mul_add(decay, ki * d[c]);
                        }
                    }
                    Err(_) => {
                        for (c, o) in row.iter_mut().enumerate() {
                            *o = r[c].mul_add(decay, ki * d[c]);
                        }
                    }
                }
                continue;
            }
            let dst: &mut [f32; W] = match copy.as_deref_mut() {
                Some(copy) => &mut copy[i],
                None => row.try_into().expect("checked: whole rows"),
            };
            let (nk, nq) = (next_k[i], next_q[i]);
            for c in 0..W {
                let e = r[c].mul_add(decay, ki * d[c]);
                dst[c] = e;
                sk[c] = e.mul_add(nk, sk[c]);
                sq[c] = e.mul_add(nq, sq[c]);
            }
        }
    }
}

thread_local! {
    /// Each pool thread's block copy, kept between tasks.
    static BLOCK_SCRATCH: std::cell::RefCell<Vec<[f32; BLOCK]>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// A state row's columns as a task's row: a full one as it is (loaded in
/// vectors, not copied by a call), a narrower one zero-padded.
#[inline(always)]
fn padded<const W: usize>(src: &[f32]) -> [f32; W] {
    match <&[f32; W]>::try_from(src) {
        Ok(full) => *full,
        Err(_) => std::array::from_fn(|c| src.get(c).copied().unwrap_or(0.0)),
    }
}

/// Channels of one convolution task.
const CONV_CHANNELS: usize = 512;

/// `HybridOps::causal_conv_silu` (reference: `host_ops::causal_conv_silu`,
/// whose sums it keeps; SiLU's exponential is ggml's, as llama.cpp's SiLU
/// computes it): channels split across the pool, each task's taps
/// transposed so that its rows run along its channels in vectors.
pub fn causal_conv_silu(
    pool: &ThreadPool,
    x: &[f32],
    c: usize,
    weight: &[f32],
    taps: usize,
    state: &mut [f32],
    out: &mut [f32],
) {
    let history = taps - 1;
    let n = x.len() / c.max(1);
    assert!(
        x.len() == n * c
            && weight.len() == c * taps
            && state.len() == history * c
            && out.len() == x.len(),
        "causal_conv_silu shapes"
    );
    let (state_at, out_at) = (Shared(state.as_mut_ptr()), Shared(out.as_mut_ptr()));
    pool.run(c.div_ceil(CONV_CHANNELS), &|task| {
        let chans = task * CONV_CHANNELS..((task + 1) * CONV_CHANNELS).min(c);
        let (c0, w) = (chans.start, chans.len());
        // SAFETY: state columns `chans` of every row are this task's alone,
        // as are output columns `chans`; reads come before writes below.
        let state_row =
            |r: usize| unsafe { std::slice::from_raw_parts_mut(state_at.at(r * c + c0), w) };
        let window = |r: usize| -> &[f32] {
            if r < history {
                state_row(r)
            } else {
                &x[(r - history) * c + c0..][..w]
            }
        };
        let mut by_tap = vec![0f32; taps * w];
        for (j, tw) in weight[c0 * taps..(c0 + w) * taps]
            .chunks_exact(taps)
            .enumerate()
        {
            for (tap, &v) in tw.iter().enumerate() {
                by_tap[tap * w + j] = v;
            }
        }
        with_fma(
            #[inline(always)]
            || {
                let mut sum = vec![0f32; w];
                for t in 0..n {
                    sum.fill(0.0);
                    for (tap, wt) in by_tap.chunks_exact(w).enumerate() {
                        for ((s, v), wv) in sum.iter_mut().zip(window(t + tap)).zip(wt) {
                            *s += v * wv;
                        }
                    }
                    // SAFETY: as above.
                    let dst = unsafe { std::slice::from_raw_parts_mut(out_at.at(t * c + c0), w) };
                    for (o, s) in dst.iter_mut().zip(&sum) {
                        *o = s / (1.0 + expf_ggml(-s));
                    }
                }
            },
        );
        // The window's last `history` rows, in increasing row order (row j
        // reads row n + j, at or after it).
        for j in 0..history {
            let src: Vec<f32> = window(n + j).to_vec();
            state_row(j).copy_from_slice(&src);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockdraft_core::host_ops;
    use blockdraft_core::sampling::Rng;

    #[test]
    fn the_convolution_matches_the_reference() {
        let mut rng = Rng::new(3);
        let mut uniform =
            |n: usize| -> Vec<f32> { (0..n).map(|_| rng.next_f64() as f32 * 2.0 - 1.0).collect() };
        for (c, taps, n) in [(1100, 4, 3), (96, 3, 1), (600, 4, 9)] {
            let (x, weight, state) = (uniform(n * c), uniform(c * taps), uniform((taps - 1) * c));
            let (mut want_s, mut want) = (state.clone(), vec![0.0; n * c]);
            host_ops::causal_conv_silu(&x, c, &weight, taps, &mut want_s, &mut want);
            for threads in [1, 2] {
                let pool = ThreadPool::new(threads);
                let (mut s, mut out) = (state.clone(), vec![0.0; n * c]);
                causal_conv_silu(&pool, &x, c, &weight, taps, &mut s, &mut out);
                // The same sums; SiLU's exponentials within an ulp or two.
                let close = out
                    .iter()
                    .zip(&want)
                    .all(|(g, w)| (g - w).abs() <= 1e-6 * (1.0 + w.abs()));
                assert!(close, "{c} channels, {n} rows, {threads} threads");
                assert_eq!(s, want_s, "{c} channels, {n} rows, {threads} threads");
            }
        }
    }

    /// The pool's split and the lanes' order give the reference's values
    /// to float rounding, for head widths with and without a 16-lane tail.
    #[test]
    fn matches_the_reference() {
        let mut rng = Rng::new(9);
        let mut uniform = |n: usize, scale: f32| -> Vec<f32> {
            (0..n)
                .map(|_| (rng.next_f64() as f32 * 2.0 - 1.0) * scale)
                .collect()
        };
        // `a` in `center ± half`: decays of either sign; then strong ones
        // (down to e^g = 0).
        let (mixed, strong) = ((0.0, 1.0), (-32.5, 27.5));
        let cases = [
            (2, 4, 32, 5, mixed),
            (1, 3, 20, 1, mixed),
            (2, 2, 128, 9, mixed),
            (1, 2, 128, 1, mixed),
            (2, 4, 64, 40, strong),
        ];
        for (hk, hv, dk, n, (center, half)) in cases {
            let p = DeltaNetParams {
                n_k_heads: hk,
                n_v_heads: hv,
                k_dim: dk,
                v_dim: dk,
                eps: 1e-6,
            };
            let x = uniform(n * p.input_dim(), 1.0);
            let (alpha, beta) = (uniform(n * hv, 2.0), uniform(n * hv, 2.0));
            let dt_bias = uniform(hv, 0.5);
            let a: Vec<f32> = uniform(hv, half).iter().map(|u| center + u).collect();
            let state = uniform(hv * dk * dk, 0.5);
            let (mut want_s, mut want) = (state.clone(), vec![0.0; n * hv * dk]);
            host_ops::gated_delta_rule(&x, &alpha, &beta, &dt_bias, &a, &mut want_s, &mut want, p);
            // In place, and from a state elsewhere (written over a stale one).
            for (threads, from_other) in [(1, false), (3, false), (2, true)] {
                let pool = ThreadPool::new(threads);
                let stale = vec![7.0; state.len()];
                let (from, mut s) = match from_other {
                    true => (Some(state.as_slice()), stale),
                    false => (None, state.clone()),
                };
                let mut out = vec![0.0; n * hv * dk];
                gated_delta_rule(
                    &pool, &x, &alpha, &beta, &dt_bias, &a, from, &mut s, &mut out, p,
                );
                // Within 1e-5 of the largest magnitude.
                let close = |g: &[f32], w: &[f32]| {
                    let scale = w.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
                    g.iter().zip(w).all(|(g, w)| (g - w).abs() <= 1e-5 * scale)
                };
                assert!(close(&out, &want), "output, dk {dk}, {threads} threads");
                assert!(close(&s, &want_s), "state, dk {dk}, {threads} threads");
            }
        }
    }

    /// A row's values do not depend on the pass it is in: `n` rows in one
    /// pass give the bits of two passes, and of one row at a time (what
    /// makes a verify's rows a plain step's). With heads of `HEAD_WIDTH`
    /// columns and AVX-512, the long pass takes `block_task` and the short
    /// ones `head_rows`.
    #[test]
    fn rows_give_the_same_bits_in_any_split() {
        let mut rng = Rng::new(11);
        let mut uniform =
            |n: usize| -> Vec<f32> { (0..n).map(|_| rng.next_f64() as f32 * 2.0 - 1.0).collect() };
        for (k_dim, v_dim, n) in [(48, 80, 9), (64, HEAD_WIDTH, HEAD_ROWS_MAX + 8)] {
            let p = DeltaNetParams {
                n_k_heads: 2,
                n_v_heads: 4,
                k_dim,
                v_dim,
                eps: 1e-6,
            };
            let (hv, width) = (4, p.input_dim());
            let (x, alpha, beta) = (uniform(n * width), uniform(n * hv), uniform(n * hv));
            let (dt_bias, a) = (uniform(hv), uniform(hv));
            let state = uniform(hv * p.k_dim * p.v_dim);
            let pool = ThreadPool::new(2);
            let run = |splits: &[usize]| {
                let (mut s, mut out, mut t0) = (state.clone(), Vec::new(), 0);
                for &rows in splits {
                    let mut o = vec![0.0; rows * hv * p.v_dim];
                    let (x, alpha, beta) = (
                        &x[t0 * width..(t0 + rows) * width],
                        &alpha[t0 * hv..(t0 + rows) * hv],
                        &beta[t0 * hv..(t0 + rows) * hv],
                    );
                    gated_delta_rule(&pool, x, alpha, beta, &dt_bias, &a, None, &mut s, &mut o, p);
                    out.extend(o);
                    t0 += rows;
                }
                (out, s)
            };
            let whole = run(&[n]);
            assert!(
                whole == run(&[n / 2, n - n / 2]),
                "two passes, v_dim {v_dim}"
            );
            assert!(
                whole == run(&vec![1; n]),
                "one row at a time, v_dim {v_dim}"
            );
        }
    }
}
