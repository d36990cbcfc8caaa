//! llama.cpp's flash attention over an f16 KV cache, its default
//! configuration (`ggml_compute_forward_flash_attn_ext_f16`, AVX2 build):
//! - the query is rounded to f16; each score is `ggml_vec_dot_f16(k, q)`
//!   (f32 products summed as `dot_f32` sums its first `n - n % 32`
//!   elements, the rest added in f64), then `* scale`;
//! - keys are visited in order with an online softmax: a new maximum
//!   rescales the value accumulator by `ms = expf(M_old - M)`, otherwise a
//!   key weighs `vs = expf(s - M)` (libm's `expf`); the accumulator is f16,
//!   rounded to nearest-even after every rescale and every
//!   `fma(v, vs, acc)`; the weight sum is `S = fma(S, ms, vs)` in f32;
//! - a row whose cache view (its visible keys padded to 256, as llama.cpp
//!   pads `n_kv`) holds 512 cells or more is split into one chunk of keys
//!   per thread, as llama.cpp splits a decode row: each chunk keeps its own
//!   `(M, S, acc)`, and the chunks are merged in order
//!   (`M' = max(M, M_c)`, `acc = fma(acc, expf(M - M'), acc_c * expf(M_c - M'))`,
//!   the same for `S`: GCC's contraction of llama.cpp's expression);
//! - the output is the accumulator times `1 / S`.
//!
//! Every row follows the rule a decode row at its position follows, whatever
//! the batch, so speculative verify rows (and prompt rows) equal plain
//! decoding's bit for bit. Not followed: the tiled f32 path llama.cpp takes
//! for prompt batches of 64 rows or more, and its unsplit verify rows.
//!
//! Speed: a task carries several query heads of one KV head through one pass
//! over the keys, so each key and value row is widened once for all of them,
//! and the heads' accumulators (each a chain of dependent f16 roundings)
//! advance side by side instead of one latency-bound chain at a time; the
//! exponentials are taken eight keys at a time per head (see
//! `online_softmax`). The arithmetic of every head stays the sequence above.

use super::{visible_keys, SharedOut};
use crate::kernels::{dot_f32, with_fma};
use crate::libm::expf;
use crate::pool::ThreadPool;
use blockdraft_core::backend::{AttentionMask, AttentionParams};
use half::{f16, slice::HalfFloatSliceExt};

/// llama.cpp pads the cache view (`n_kv`) to a multiple of this.
const KV_PAD: usize = 256;
/// A row whose padded view is this long or longer is split across threads.
const SPLIT_MIN_CELLS: usize = 512;
/// Most query heads one task carries (its per-head state is fixed-size).
const MAX_TASK_HEADS: usize = 8;

/// How a row's keys are chunked: `chunks` ranges of `size` cells.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Split {
    pub(super) chunks: usize,
    pub(super) size: usize,
}

impl Split {
    /// llama.cpp's decode rule for a row that sees keys below `hi`.
    pub(super) fn for_row(hi: usize, threads: usize) -> Split {
        let n_kv = hi.next_multiple_of(KV_PAD).max(KV_PAD);
        if n_kv >= SPLIT_MIN_CELLS && threads > 1 {
            Split {
                chunks: threads,
                size: n_kv.div_ceil(threads),
            }
        } else {
            Split {
                chunks: 1,
                size: n_kv,
            }
        }
    }
}

/// One pool task: heads `head0..head0 + n_heads` (all of KV head
/// `head0 / group`) of query row `row`, over chunk `chunk` of its keys.
#[derive(Clone, Copy)]
struct Task {
    row: usize,
    head0: usize,
    n_heads: usize,
    chunk: usize,
}

/// Where one head's keys and values lie in the cache: rows `lo..hi` of
/// `stride` elements, the head's `offset` into each.
#[derive(Clone, Copy)]
struct KeyRange {
    stride: usize,
    offset: usize,
    lo: usize,
    hi: usize,
}

/// What one task's pass over the keys reads: its heads' queries (rounded
/// to f16), the cache, which keys, and the score scale.
#[derive(Clone, Copy)]
struct KeyPass<'a> {
    q16: &'a [f32],
    k: &'a [f16],
    v: &'a [f16],
    keys: KeyRange,
    scale: f32,
}

/// One head's online-softmax state: the running maximum `M` and weight sum `S`.
#[derive(Clone, Copy)]
struct Running {
    m: f32,
    s: f32,
}

impl Running {
    const EMPTY: Running = Running {
        m: f32::NEG_INFINITY,
        s: 0.0,
    };
}

/// A split row's chunk result for one head: `M`, `S`, then the accumulator.
pub(super) const fn partial_len(d: usize) -> usize {
    2 + d
}

/// See the module docs. `q` holds rows of `n_head * head_dim` queries, `k`
/// and `v` rows of `n_head_kv * head_dim` cells.
pub fn flash_attention_f16(
    pool: &ThreadPool,
    q: &[f32],
    k: &[f16],
    v: &[f16],
    mask: AttentionMask,
    p: AttentionParams,
    out: &mut [f32],
) {
    let PassPlan {
        d,
        q_cols,
        kv_cols,
        group,
        threads,
        splits,
        ..
    } = PassPlan::new(pool, (q, k, v, out), mask, p);
    let visible = |r: usize| visible_keys(mask, r);
    let (partial_at, mut partials) = split_partials(&splits, p.n_head, d);

    // Enough tasks to keep every thread busy; otherwise as many heads per
    // task as fit, so each key is widened once for as many heads as can be.
    let chunk_tasks: usize = splits.iter().map(|s| s.chunks * p.n_head_kv).sum();
    let per_group = (2 * threads)
        .div_ceil(chunk_tasks.max(1))
        .max(group.div_ceil(MAX_TASK_HEADS))
        .min(group);
    let heads_per_task = group.div_ceil(per_group);
    let mut tasks = Vec::with_capacity(chunk_tasks * per_group);
    for (row, s) in splits.iter().enumerate() {
        for chunk in 0..s.chunks {
            for kv_head in 0..p.n_head_kv {
                for first in (0..group).step_by(heads_per_task) {
                    tasks.push(Task {
                        row,
                        head0: kv_head * group + first,
                        n_heads: heads_per_task.min(group - first),
                        chunk,
                    });
                }
            }
        }
    }

    let shared_out = SharedOut(out.as_mut_ptr());
    let shared_partials = SharedOut(partials.as_mut_ptr());
    let run = |t: usize| {
        with_fma(
            #[inline(always)]
            || {
                let Task {
                    row,
                    head0,
                    n_heads,
                    chunk,
                } = tasks[t];
                let split = splits[row];
                let (lo, hi) = visible(row);
                let keys = KeyRange {
                    stride: kv_cols,
                    offset: (head0 / group) * d,
                    lo: lo.max(chunk * split.size),
                    hi: hi.min((chunk + 1) * split.size),
                };
                let mut q16 = vec![0f32; n_heads * d];
                let mut half = vec![f16::ZERO; n_heads * d];
                half.convert_from_f32_slice(&q[row * q_cols + head0 * d..][..n_heads * d]);
                half.convert_to_f32_slice(&mut q16);
                let mut acc = vec![0f32; n_heads * d];
                let mut state = [Running::EMPTY; MAX_TASK_HEADS];
                let state = &mut state[..n_heads];
                if keys.lo < keys.hi {
                    let pass = KeyPass {
                        q16: &q16,
                        k,
                        v,
                        keys,
                        scale: p.scale,
                    };
                    flash_group(pass, &mut acc, state);
                }
                for (h, (acc, st)) in acc.chunks_exact(d).zip(state.iter()).enumerate() {
                    let head = head0 + h;
                    if split.chunks == 1 {
                        // SAFETY: this task alone writes out[row, head].
                        let o = unsafe {
                            std::slice::from_raw_parts_mut(
                                shared_out.at(row * q_cols + head * d),
                                d,
                            )
                        };
                        let inv = if st.s == 0.0 { 0.0 } else { 1.0 / st.s };
                        for (o, a) in o.iter_mut().zip(acc) {
                            *o = a * inv;
                        }
                    } else {
                        let at = partial_at[row] + (head * split.chunks + chunk) * partial_len(d);
                        // SAFETY: this task alone writes partial (row, head, chunk).
                        let pa = unsafe {
                            std::slice::from_raw_parts_mut(shared_partials.at(at), partial_len(d))
                        };
                        pa[0] = st.m;
                        pa[1] = st.s;
                        pa[2..].copy_from_slice(acc);
                    }
                }
            },
        )
    };
    pool.run(tasks.len(), &run);

    merge_split_rows(pool, &splits, &partial_at, &partials, p, &shared_out);
}

/// The checked shapes of an attention pass over an f16 cache (`q`, `k`,
/// `v`, `out` as the kernels take them) and each row's split of its
/// visible keys across the pool's threads: what both kernels start from.
pub(super) struct PassPlan {
    pub d: usize,
    pub q_cols: usize,
    pub kv_cols: usize,
    pub n_rows: usize,
    /// Query heads per KV head.
    pub group: usize,
    pub threads: usize,
    pub splits: Vec<Split>,
}

impl PassPlan {
    pub(super) fn new(
        pool: &ThreadPool,
        (q, k, v, out): (&[f32], &[f16], &[f16], &[f32]),
        mask: AttentionMask,
        p: AttentionParams,
    ) -> Self {
        let d = p.head_dim;
        let q_cols = p.n_head * d;
        let kv_cols = p.n_head_kv * d;
        let n_rows = q.len() / q_cols;
        assert!(
            out.len() >= n_rows * q_cols
                && k.len() >= mask.kv_len * kv_cols
                && v.len() >= mask.kv_len * kv_cols
        );
        let threads = pool.n_threads();
        let splits = (0..n_rows)
            .map(|r| Split::for_row(visible_keys(mask, r).1, threads))
            .collect();
        PassPlan {
            d,
            q_cols,
            kv_cols,
            n_rows,
            group: p.n_head / p.n_head_kv,
            threads,
            splits,
        }
    }
}

/// Where each split row's per-(head, chunk) partials lie in one buffer
/// (`usize::MAX` for rows not split), and that buffer.
pub(super) fn split_partials(splits: &[Split], n_head: usize, d: usize) -> (Vec<usize>, Vec<f32>) {
    let mut partial_at = vec![usize::MAX; splits.len()];
    let mut total = 0;
    for (r, s) in splits.iter().enumerate() {
        if s.chunks > 1 {
            partial_at[r] = total;
            total += n_head * s.chunks * partial_len(d);
        }
    }
    (partial_at, vec![0f32; total])
}

/// Merges every split row's chunk partials ([`split_partials`]) into its
/// output heads (rows of `n_head * head_dim` at `out`), one pool task per
/// (row, head).
pub(super) fn merge_split_rows(
    pool: &ThreadPool,
    splits: &[Split],
    partial_at: &[usize],
    partials: &[f32],
    p: AttentionParams,
    out: &SharedOut,
) {
    let d = p.head_dim;
    let split_rows: Vec<usize> = (0..splits.len())
        .filter(|&r| splits[r].chunks > 1)
        .collect();
    if split_rows.is_empty() {
        return;
    }
    let merge = |t: usize| {
        with_fma(
            #[inline(always)]
            || {
                let (row, head) = (split_rows[t / p.n_head], t % p.n_head);
                let chunks = splits[row].chunks;
                let at = partial_at[row] + head * chunks * partial_len(d);
                // SAFETY: this task alone writes out[row, head].
                let o = unsafe {
                    std::slice::from_raw_parts_mut(out.at((row * p.n_head + head) * d), d)
                };
                merge_chunks(&partials[at..][..chunks * partial_len(d)], d, o);
            },
        )
    };
    pool.run(split_rows.len() * p.n_head, &merge);
}

/// llama.cpp's merge of one head's chunk partials (`[M, S, acc]` each, in
/// order) into its output: chunks that saw no key are skipped; a zero sum
/// gives zeros.
#[inline(always)]
pub(super) fn merge_chunks(partials: &[f32], d: usize, out: &mut [f32]) {
    let (mut m, mut s) = (f32::NEG_INFINITY, 0f32);
    out.fill(0.0);
    for pa in partials.chunks_exact(partial_len(d)) {
        let (m_c, s_c, acc_c) = (pa[0], pa[1], &pa[2..]);
        if s_c == 0.0 {
            continue;
        }
        let m_new = m.max(m_c);
        let (scale_old, scale_new) = (expf(m - m_new), expf(m_c - m_new));
        for (o, a) in out.iter_mut().zip(acc_c) {
            *o = o.mul_add(scale_old, a * scale_new);
        }
        s = s.mul_add(scale_old, s_c * scale_new);
        m = m_new;
    }
    if s != 0.0 {
        let inv = 1.0 / s;
        out.iter_mut().for_each(|o| *o *= inv);
    }
}

/// The heads of one task over `pass.keys`: each head's unnormalised value
/// sum into its `d` elements of `acc` (each an f16 value), its `M` and `S`
/// into `state`.
fn flash_group(pass: KeyPass, acc: &mut [f32], state: &mut [Running]) {
    #[cfg(target_arch = "x86_64")]
    let d = pass.q16.len() / state.len();
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::x86::has_avx512f() && d.is_multiple_of(16) {
        // SAFETY: AVX-512 F (with AVX2, FMA and F16C) checked at run time;
        // the rows lie within k and v, whole groups of 16.
        return unsafe { x86::flash_group_avx512(pass, acc, state) };
    }
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::x86::has_avx2() && d.is_multiple_of(8) {
        // SAFETY: AVX2, FMA and F16C checked at run time; the rows lie
        // within k and v (checked by `flash_attention_f16`), whole groups of 8.
        return unsafe { x86::flash_group(pass, acc, state) };
    }
    flash_group_portable(pass, acc, state)
}

/// The per-key steps of a task, which each kernel provides in its own
/// instructions; [`online_softmax`] orders them.
trait GroupSteps {
    /// Widens the key at cache offset `at` for every head's score.
    fn load_key(&mut self, at: usize);
    /// `ggml_vec_dot_f16(k, q)` of the loaded key with head `h`'s query.
    fn score(&self, h: usize) -> f64;
    /// Every head's score times `scale`, as an f32 (a kernel may reduce
    /// the heads' dot products together, in each head's order).
    fn scores(&self, n_heads: usize, scale: f32, out: &mut [f32; MAX_TASK_HEADS]) {
        for (h, o) in out.iter_mut().enumerate().take(n_heads) {
            *o = self.score(h) as f32 * scale;
        }
    }
    /// Head `h`: `acc = f16(acc * ms)`.
    fn rescale(&mut self, h: usize, ms: f32);
    /// Widens the value at cache offset `at` for every head.
    fn load_value(&mut self, at: usize);
    /// Head `h`: `acc = f16(fma(v, vs, acc))` with the loaded value.
    fn add_value(&mut self, h: usize, vs: f32);
    /// `expf` of every element, as [`expf`] computes it.
    fn expf_each(&self, x: &mut [f32; KEY_CHUNK]) {
        x.iter_mut().for_each(|x| *x = expf(*x));
    }
}

/// Keys whose exponentials one [`GroupSteps::expf_each`] computes per head.
const KEY_CHUNK: usize = 8;

/// llama.cpp's online softmax over `keys`, for every head of a task side by
/// side: a new maximum rescales a head's accumulator, otherwise the key
/// weighs `expf(s - M)`.
///
/// Keys go [`KEY_CHUNK`] at a time: first every key's scores; then, per
/// head, the maximum each key meets (a running maximum, exact) and so the
/// exponent it needs, `M - s` at a new maximum (its `ms`), otherwise
/// `s - M` (its `vs`), whose exponentials are one vector per head; then the
/// values in key order. Each head's arithmetic is the key-by-key sequence;
/// only the exponentials are batched, along keys rather than across heads,
/// so a vector is full whatever the heads per KV head (SmolLM2 has 3).
#[inline(always)]
fn online_softmax(steps: &mut impl GroupSteps, pass: KeyPass, state: &mut [Running]) {
    let (keys, scale) = (pass.keys, pass.scale);
    let mut scores = [0f32; MAX_TASK_HEADS];
    // Per head, per key of the chunk: the exponent, then its exponential.
    let mut exps = [[0f32; KEY_CHUNK]; MAX_TASK_HEADS];
    let mut new_max = [[false; KEY_CHUNK]; MAX_TASK_HEADS];
    let mut start = keys.lo;
    while start < keys.hi {
        let n = KEY_CHUNK.min(keys.hi - start);
        let at = |j: usize| (start + j) * keys.stride + keys.offset;
        for j in 0..n {
            steps.load_key(at(j));
            steps.scores(state.len(), scale, &mut scores);
            for (e, &s) in exps.iter_mut().zip(&scores).take(state.len()) {
                e[j] = s;
            }
        }
        for (h, st) in state.iter_mut().enumerate() {
            let (e, up) = (&mut exps[h], &mut new_max[h]);
            for j in 0..n {
                let s = e[j];
                up[j] = s > st.m;
                e[j] = if up[j] { st.m - s } else { s - st.m };
                if up[j] {
                    st.m = s;
                }
            }
            e[n..].fill(0.0);
            steps.expf_each(e);
        }
        for j in 0..n {
            steps.load_value(at(j));
            for (h, st) in state.iter_mut().enumerate() {
                let e = exps[h][j];
                let (ms, vs) = if new_max[h][j] {
                    steps.rescale(h, e);
                    (e, 1.0)
                } else {
                    (1.0, e)
                };
                steps.add_value(h, vs);
                st.s = st.s.mul_add(ms, vs);
            }
        }
        start += n;
    }
}

/// [`GroupSteps`] on slices, with the half crate's conversions.
struct Portable<'a> {
    q16: &'a [f32],
    k: &'a [f16],
    v: &'a [f16],
    acc: &'a mut [f32],
    d: usize,
    /// The widened key or value row.
    row: Vec<f32>,
    /// An accumulator rounded to f16.
    half: Vec<f16>,
}

impl Portable<'_> {
    fn round_acc(&mut self, h: usize) {
        let acc = &mut self.acc[h * self.d..][..self.d];
        self.half.convert_from_f32_slice(acc);
        self.half.convert_to_f32_slice(acc);
    }
}

impl GroupSteps for Portable<'_> {
    fn load_key(&mut self, at: usize) {
        self.k[at..][..self.d].convert_to_f32_slice(&mut self.row);
    }

    fn score(&self, h: usize) -> f64 {
        let d = self.d;
        let simd_len = d - d % 32;
        let (q, k) = (&self.q16[h * d..][..d], &self.row);
        let mut dot = dot_f32(&q[..simd_len], &k[..simd_len]) as f64;
        for (a, b) in q[simd_len..].iter().zip(&k[simd_len..]) {
            dot += (a * b) as f64;
        }
        dot
    }

    fn rescale(&mut self, h: usize, ms: f32) {
        self.acc[h * self.d..][..self.d]
            .iter_mut()
            .for_each(|a| *a *= ms);
        self.round_acc(h);
    }

    fn load_value(&mut self, at: usize) {
        self.v[at..][..self.d].convert_to_f32_slice(&mut self.row);
    }

    fn add_value(&mut self, h: usize, vs: f32) {
        for (a, x) in self.acc[h * self.d..][..self.d].iter_mut().zip(&self.row) {
            *a = x.mul_add(vs, *a);
        }
        self.round_acc(h);
    }
}

fn flash_group_portable(pass: KeyPass, acc: &mut [f32], state: &mut [Running]) {
    let d = pass.q16.len() / state.len();
    let mut steps = Portable {
        q16: pass.q16,
        k: pass.k,
        v: pass.v,
        acc,
        d,
        row: vec![0f32; d],
        half: vec![f16::ZERO; d],
    };
    online_softmax(&mut steps, pass, state)
}

#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(test)]
mod tests {
    use super::*;

    fn halves(x: &[f32]) -> Vec<f16> {
        x.iter().map(|&x| f16::from_f32(x)).collect()
    }

    /// Uniform in [-1, 1), deterministic.
    fn uniform(seed: u64) -> impl FnMut() -> f32 {
        let mut state = seed;
        move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
    }

    fn params(n_head: usize, n_head_kv: usize, head_dim: usize) -> AttentionParams {
        AttentionParams {
            n_head,
            n_head_kv,
            head_dim,
            scale: 0.3,
        }
    }

    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn rows_split_as_llama_cpp_splits_a_decode_row() {
        let one = |size| Split { chunks: 1, size };
        assert_eq!(Split::for_row(1, 2), one(256));
        assert_eq!(Split::for_row(256, 2), one(256));
        // 257 keys: a view of 512 cells, halved.
        assert_eq!(
            Split::for_row(257, 2),
            Split {
                chunks: 2,
                size: 256
            }
        );
        assert_eq!(
            Split::for_row(3600, 3),
            Split {
                chunks: 3,
                size: 1280
            }
        );
        assert_eq!(Split::for_row(3600, 1), one(3840));
    }

    /// Against softmax in f64 over the same f16 values: within what f16
    /// accumulation costs, for head sizes with and without a tail past the
    /// 32-lane dot product, a new maximum arriving late (a rescale), and
    /// caches long enough to be split across 2 and 3 threads.
    #[test]
    fn flash_attention_matches_exact_softmax_within_f16_rounding() {
        let mut rnd = uniform(7);
        for (d, n_keys, threads) in [(40, 23, 2), (64, 23, 1), (64, 700, 2), (40, 1100, 3)] {
            let pool = ThreadPool::new(threads);
            let p = params(4, 2, d);
            let kv_cols = 2 * d;
            let k16 = halves(
                &(0..n_keys * kv_cols)
                    .map(|_| rnd() * 2.0)
                    .collect::<Vec<_>>(),
            );
            let v16 = halves(&(0..n_keys * kv_cols).map(|_| rnd()).collect::<Vec<_>>());
            let q: Vec<f32> = (0..4 * d).map(|_| rnd() * 2.0).collect();
            let mask = AttentionMask {
                q_pos0: n_keys - 1,
                kv_len: n_keys,
                causal: true,
                window: None,
            };
            let mut out = vec![0.0; 4 * d];
            flash_attention_f16(&pool, &q, &k16, &v16, mask, p, &mut out);
            for h in 0..4 {
                let off = (h / 2) * d;
                let qh: Vec<f64> = q[h * d..][..d]
                    .iter()
                    .map(|&x| f16::from_f32(x).to_f64())
                    .collect();
                let scores: Vec<f64> = (0..n_keys)
                    .map(|j| {
                        let kj = &k16[j * kv_cols + off..][..d];
                        qh.iter().zip(kj).map(|(a, b)| a * b.to_f64()).sum::<f64>() * 0.3
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::MIN, f64::max);
                let w: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let z: f64 = w.iter().sum();
                for i in 0..d {
                    let want: f64 = (0..n_keys)
                        .map(|j| w[j] * v16[j * kv_cols + off + i].to_f64())
                        .sum::<f64>()
                        / z;
                    let got = out[h * d + i] as f64;
                    assert!(
                        (got - want).abs() < 4e-3,
                        "d {d}, {n_keys} keys, head {h}, dim {i}: {got} vs {want}"
                    );
                }
            }
        }
    }

    /// A row gives the same bits in a batch of rows as alone at its
    /// position (a verify row equals the decode step it replaces), on both
    /// sides of the split threshold (257 visible keys), with 1 to 3 threads,
    /// a sliding window, and heads grouped 3 to a KV head.
    #[test]
    fn rows_in_a_batch_equal_rows_alone() {
        let mut rnd = uniform(3);
        let (d, n_head, n_head_kv) = (64, 6, 2);
        let p = params(n_head, n_head_kv, d);
        let (q_cols, kv_cols) = (n_head * d, n_head_kv * d);
        for (threads, pos0, n_rows, window) in [
            (2, 250, 12, None),
            (3, 1020, 9, None),
            (1, 600, 4, None),
            (2, 500, 6, Some(300)),
        ] {
            let pool = ThreadPool::new(threads);
            let kv_len = pos0 + n_rows;
            let k = halves(
                &(0..kv_len * kv_cols)
                    .map(|_| rnd() * 3.0)
                    .collect::<Vec<_>>(),
            );
            let v = halves(&(0..kv_len * kv_cols).map(|_| rnd()).collect::<Vec<_>>());
            let q: Vec<f32> = (0..n_rows * q_cols).map(|_| rnd() * 2.0).collect();
            let mut batch = vec![0.0; n_rows * q_cols];
            let mask = AttentionMask {
                q_pos0: pos0,
                kv_len,
                causal: true,
                window,
            };
            flash_attention_f16(&pool, &q, &k, &v, mask, p, &mut batch);
            for r in 0..n_rows {
                let mut alone = vec![0.0; q_cols];
                let mask = AttentionMask {
                    q_pos0: pos0 + r,
                    kv_len: pos0 + r + 1,
                    ..mask
                };
                flash_attention_f16(
                    &pool,
                    &q[r * q_cols..][..q_cols],
                    &k,
                    &v,
                    mask,
                    p,
                    &mut alone,
                );
                assert_eq!(
                    bits(&batch[r * q_cols..][..q_cols]),
                    bits(&alone),
                    "{threads} threads, row at {}",
                    pos0 + r
                );
            }
        }
    }

    /// The heads of one task advance side by side with the bits each gets
    /// alone, and the AVX2/F16C kernel gives the portable one's bits, for
    /// head sizes with and without a tail past the 32-lane dot product and
    /// scores that set a new maximum often (rescales).
    /// A group kernel over the task's queries, accumulators and states.
    type Kernel<'a> = &'a dyn Fn(&[f32], &mut [f32], &mut [Running]);

    #[test]
    fn group_kernels_agree_bit_for_bit() {
        let mut rnd = uniform(11);
        for d in [8, 40, 64, 128, 256] {
            let (n_keys, stride, n_heads) = (37, 2 * d, 3);
            let k = halves(
                &(0..n_keys * stride)
                    .map(|i| rnd() * (1.0 + (i % 7) as f32))
                    .collect::<Vec<_>>(),
            );
            let v = halves(
                &(0..n_keys * stride)
                    .map(|_| rnd() * 3.0)
                    .collect::<Vec<_>>(),
            );
            let q16: Vec<f32> = (0..n_heads * d)
                .map(|_| f16::from_f32(rnd() * 2.0).to_f32())
                .collect();
            // Each kernel call gives its own heads' queries.
            let base = KeyPass {
                q16: &[],
                k: &k,
                v: &v,
                keys: KeyRange {
                    stride,
                    offset: d,
                    lo: 3,
                    hi: n_keys,
                },
                scale: 0.7,
            };
            let run = |kernel: Kernel, heads: usize| {
                let (mut acc, mut state) = (vec![0f32; n_heads * d], vec![Running::EMPTY; n_heads]);
                for h in (0..n_heads).step_by(heads) {
                    let hs = h..(h + heads).min(n_heads);
                    kernel(
                        &q16[hs.start * d..hs.end * d],
                        &mut acc[hs.start * d..hs.end * d],
                        &mut state[hs],
                    );
                }
                let sums: Vec<f32> = state.iter().map(|s| s.s).collect();
                (bits(&acc), bits(&sums))
            };
            let portable = |q: &[f32], acc: &mut [f32], st: &mut [Running]| {
                flash_group_portable(KeyPass { q16: q, ..base }, acc, st)
            };
            let together = run(&portable, n_heads);
            assert_eq!(together, run(&portable, 1), "d {d}: grouped vs alone");
            #[cfg(target_arch = "x86_64")]
            {
                if crate::kernels::x86::has_avx2() {
                    let avx2 = |q: &[f32], acc: &mut [f32], st: &mut [Running]| {
                        // SAFETY: checked above; rows 3..37 of stride 2d hold offset d + d.
                        unsafe { x86::flash_group(KeyPass { q16: q, ..base }, acc, st) }
                    };
                    assert_eq!(together, run(&avx2, n_heads), "d {d}: AVX2 vs portable");
                    assert_eq!(together, run(&avx2, 1), "d {d}: AVX2 alone");
                } else {
                    eprintln!("SKIPPED (AVX2 kernel): the CPU lacks AVX2/FMA/F16C");
                }
                if d.is_multiple_of(16) && crate::kernels::x86::has_avx512f() {
                    let avx512 = |q: &[f32], acc: &mut [f32], st: &mut [Running]| {
                        // SAFETY: checked above; rows 3..37 of stride 2d hold offset d + d.
                        unsafe { x86::flash_group_avx512(KeyPass { q16: q, ..base }, acc, st) }
                    };
                    assert_eq!(
                        together,
                        run(&avx512, n_heads),
                        "d {d}: AVX-512 vs portable"
                    );
                    assert_eq!(together, run(&avx512, 1), "d {d}: AVX-512 alone");
                } else if !crate::kernels::x86::has_avx512f() {
                    eprintln!("SKIPPED (AVX-512 kernel): the CPU lacks AVX-512 F");
                }
            }
        }
    }
}
