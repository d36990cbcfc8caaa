//! Attention over an f16 KV cache in the default backend's own float
//! sequence, for speed at depth and for verify rows. llama.cpp's (which
//! [`flash`](super::flash) follows for its exact results) walks the keys one
//! at a time for each row and head, with a libm `expf` and an f16 rounding
//! of the value accumulator at every key: about 10 ns per (head, key) here,
//! so attention is most of a decode step after a few thousand tokens and a
//! verify of k rows costs k times a decode row's attention.
//!
//! Here a task carries every query head of one KV head for up to
//! [`MAX_TASK_ROWS`] rows of the pass, and takes the keys [`TILE`] at a
//! time: each tile's keys and values are widened to f32 once for all of its
//! queries; each query then scores the tile (f32 dot products), takes one
//! online-softmax step for the whole tile (`m' = max(m, max_j s_j)`,
//! `p_j = exp(s_j - m')`, `l = fma(l, exp(m - m'), sum_j p_j)`, `acc =
//! acc * exp(m - m') + sum_j p_j v_j` by FMA in key order, f32 throughout)
//! with a branch-free vector exponential ([`exp_lanes`]).
//!
//! A query's arithmetic depends only on its own row: its visible keys, the
//! tiles (fixed by the key chunk, not by the rows beside it) and the split
//! of its keys across threads, which is llama.cpp's rule as in `flash`
//! (merged the same way). So verify and prompt rows equal decode rows bit
//! for bit, and greedy speculative decoding stays identical to plain.

use super::flash::{merge_split_rows, partial_len, split_partials, PassPlan};
use super::{visible_keys, SharedOut};
use crate::pool::ThreadPool;
use blockdraft_core::backend::{AttentionMask, AttentionParams};
use half::{f16, slice::HalfFloatSliceExt};
use std::ops::Range;

/// Keys per online-softmax step.
const TILE: usize = 16;
/// Most rows one task carries (their queries share each widened tile).
const MAX_TASK_ROWS: usize = 8;

/// One pool task: rows `rows` (all split alike), chunk `chunk` of their
/// keys, every query head of KV head `kv_head`.
struct Task {
    rows: Range<usize>,
    chunk: usize,
    kv_head: usize,
}

/// Whether [`tiled_attention_f16`] takes heads of this size (the dot
/// products and value sums go 16 lanes at a time).
pub fn supports_head_dim(head_dim: usize) -> bool {
    head_dim > 0 && head_dim.is_multiple_of(16)
}

/// See the module docs. `q` holds rows of `n_head * head_dim` queries, `k`
/// and `v` rows of `n_head_kv * head_dim` cells; `head_dim` must be
/// [supported](supports_head_dim).
pub fn tiled_attention_f16(
    pool: &ThreadPool,
    q: &[f32],
    k: &[f16],
    v: &[f16],
    mask: AttentionMask,
    p: AttentionParams,
    out: &mut [f32],
) {
    assert!(
        supports_head_dim(p.head_dim),
        "tiled attention: head size {}",
        p.head_dim
    );
    let PassPlan {
        d,
        q_cols,
        kv_cols,
        n_rows,
        group,
        splits,
        ..
    } = PassPlan::new(pool, (q, k, v, out), mask, p);
    let visible = |r: usize| visible_keys(mask, r);
    let (partial_at, mut partials) = split_partials(&splits, p.n_head, d);

    // Runs of consecutive rows split alike, each run's chunks and KV heads.
    let mut tasks = Vec::new();
    let mut first = 0;
    while first < n_rows {
        let split = splits[first];
        let mut end = first + 1;
        while end < n_rows && end - first < MAX_TASK_ROWS && splits[end] == split {
            end += 1;
        }
        for chunk in 0..split.chunks {
            for kv_head in 0..p.n_head_kv {
                tasks.push(Task {
                    rows: first..end,
                    chunk,
                    kv_head,
                });
            }
        }
        first = end;
    }

    let shared_out = SharedOut(out.as_mut_ptr());
    let shared_partials = SharedOut(partials.as_mut_ptr());
    let run = |t: usize| {
        let task = &tasks[t];
        let split = splits[task.rows.start];
        let chunk_keys = task.chunk * split.size..(task.chunk + 1) * split.size;
        // The task's queries, row by row, each with its keys in the chunk.
        let queries: Vec<(usize, usize, Range<usize>)> = task
            .rows
            .clone()
            .flat_map(|row| {
                let (lo, hi) = visible(row);
                let keys = lo.max(chunk_keys.start)..hi.min(chunk_keys.end);
                (0..group).map(move |h| (row, task.kv_head * group + h, keys.clone()))
            })
            .collect();
        let mut state = vec![Online::EMPTY; queries.len()];
        let mut acc = vec![0f32; queries.len() * d];
        let tile = TileSource {
            k,
            v,
            stride: kv_cols,
            offset: task.kv_head * d,
            d,
            first_key: chunk_keys.start,
        };
        let query = |i: usize| {
            let (row, head, _) = &queries[i];
            &q[row * q_cols + head * d..][..d]
        };
        let keys: Vec<Range<usize>> = queries.iter().map(|(_, _, keys)| keys.clone()).collect();
        run_task(&tile, &query, &keys, p.scale, &mut state, &mut acc);

        for (i, (row, head, _)) in queries.iter().enumerate() {
            let (st, acc) = (state[i], &acc[i * d..][..d]);
            if split.chunks == 1 {
                // SAFETY: this task alone writes out[row, head].
                let o = unsafe {
                    std::slice::from_raw_parts_mut(shared_out.at(row * q_cols + head * d), d)
                };
                let inv = if st.l == 0.0 { 0.0 } else { 1.0 / st.l };
                for (o, a) in o.iter_mut().zip(acc) {
                    *o = a * inv;
                }
            } else {
                let at = partial_at[*row] + (head * split.chunks + task.chunk) * partial_len(d);
                // SAFETY: this task alone writes partial (row, head, chunk).
                let pa = unsafe {
                    std::slice::from_raw_parts_mut(shared_partials.at(at), partial_len(d))
                };
                pa[0] = st.m;
                pa[1] = st.l;
                pa[2..].copy_from_slice(acc);
            }
        }
    };
    pool.run(tasks.len(), &run);

    merge_split_rows(pool, &splits, &partial_at, &partials, p, &shared_out);
}

/// One query's online-softmax state: the running maximum `m` and weight
/// sum `l` (the value sum is its `d` elements of the task's `acc`).
#[derive(Clone, Copy)]
struct Online {
    m: f32,
    l: f32,
}

impl Online {
    const EMPTY: Online = Online {
        m: f32::NEG_INFINITY,
        l: 0.0,
    };
}

/// Where a task's tiles come from: KV head rows at `offset` of cache rows
/// `stride` apart, tiles counted from key `first_key`.
struct TileSource<'a> {
    k: &'a [f16],
    v: &'a [f16],
    stride: usize,
    offset: usize,
    d: usize,
    first_key: usize,
}

/// Runs a task's queries (`query(i)`, seeing keys `keys[i]`) over their
/// tiles with the widest vectors this CPU has; the same results on any.
fn run_task<'q>(
    tile: &TileSource,
    query: &impl Fn(usize) -> &'q [f32],
    keys: &[Range<usize>],
    scale: f32,
    state: &mut [Online],
    acc: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::kernels::x86::has_avx512f() {
            // SAFETY: AVX-512 F (with AVX2, FMA and F16C) checked at run time.
            return unsafe { run_task_avx512(tile, query, keys, scale, state, acc) };
        }
        if crate::kernels::x86::has_avx2() {
            // SAFETY: AVX2, FMA and F16C checked at run time.
            return unsafe { run_task_avx2(tile, query, keys, scale, state, acc) };
        }
    }
    tiles::<Portable>(tile, query, keys, scale, state, acc)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
unsafe fn run_task_avx512<'q>(
    tile: &TileSource,
    query: &impl Fn(usize) -> &'q [f32],
    keys: &[Range<usize>],
    scale: f32,
    state: &mut [Online],
    acc: &mut [f32],
) {
    tiles::<x86::Avx512>(tile, query, keys, scale, state, acc)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_task_avx2<'q>(
    tile: &TileSource,
    query: &impl Fn(usize) -> &'q [f32],
    keys: &[Range<usize>],
    scale: f32,
    state: &mut [Online],
    acc: &mut [f32],
) {
    tiles::<Portable>(tile, query, keys, scale, state, acc)
}

/// What a build does its own way (the same values on any).
trait TileOps {
    /// `src` widened into `dst` (f16 to f32 is exact).
    fn widen(src: &[f16], dst: &mut [f32]);
    /// [`TILE`] dot products `q . k_j` (`kw` holds the keys, `q.len()`
    /// apart), each as [`dot16`] computes it, times `scale`. `D` is
    /// `q.len()` where known when compiled (0 where not).
    fn scores<const D: usize>(q: &[f32], kw: &[f32], scale: f32) -> [f32; TILE];
    /// [`sum16`].
    fn sum16(x: &[f32; 16]) -> f32 {
        sum16(x)
    }
}

/// [`TileOps`] one key at a time, for the compiler to vectorize.
struct Portable;

impl TileOps for Portable {
    #[inline(always)]
    fn widen(src: &[f16], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }

    #[inline(always)]
    fn scores<const D: usize>(q: &[f32], kw: &[f32], scale: f32) -> [f32; TILE] {
        let d = head_dim::<D>(q);
        std::array::from_fn(|j| dot16(&q[..d], &kw[j * d..][..d]) * scale)
    }
}

/// The task's tiles in order, each widened once, then every query's step
/// over the keys of it that query sees.
#[inline(always)]
fn tiles<'q, S: TileOps>(
    src: &TileSource,
    query: &impl Fn(usize) -> &'q [f32],
    keys: &[Range<usize>],
    scale: f32,
    state: &mut [Online],
    acc: &mut [f32],
) {
    // The common head sizes compiled with their size known.
    match src.d {
        64 => tiles_of::<S, 64>(src, query, keys, scale, state, acc),
        128 => tiles_of::<S, 128>(src, query, keys, scale, state, acc),
        256 => tiles_of::<S, 256>(src, query, keys, scale, state, acc),
        _ => tiles_of::<S, 0>(src, query, keys, scale, state, acc),
    }
}

/// `D` where it is known when compiled, otherwise `q.len()`.
#[inline(always)]
fn head_dim<const D: usize>(q: &[f32]) -> usize {
    if D > 0 {
        debug_assert_eq!(q.len(), D);
        D
    } else {
        q.len()
    }
}

/// [`tiles`] for heads of `D` values (0: of `src.d`).
#[inline(always)]
fn tiles_of<'q, S: TileOps, const D: usize>(
    src: &TileSource,
    query: &impl Fn(usize) -> &'q [f32],
    keys: &[Range<usize>],
    scale: f32,
    state: &mut [Online],
    acc: &mut [f32],
) {
    let d = if D > 0 { D } else { src.d };
    let Some(lo) = keys.iter().filter(|r| !r.is_empty()).map(|r| r.start).min() else {
        return;
    };
    let hi = keys.iter().map(|r| r.end).max().unwrap_or(0);
    let mut kw = vec![0f32; TILE * d];
    let mut vw = vec![0f32; TILE * d];
    let mut start = src.first_key + (lo - src.first_key) / TILE * TILE;
    while start < hi {
        let n = TILE.min(hi - start);
        for j in 0..n {
            let at = (start + j) * src.stride + src.offset;
            S::widen(&src.k[at..][..d], &mut kw[j * d..][..d]);
            S::widen(&src.v[at..][..d], &mut vw[j * d..][..d]);
        }
        kw[n * d..].fill(0.0);
        for (i, range) in keys.iter().enumerate() {
            let seen = range.start.max(start).saturating_sub(start)
                ..range.end.min(start + TILE).saturating_sub(start);
            if seen.is_empty() {
                continue;
            }
            let mut w = S::scores::<D>(query(i), &kw, scale);
            let corr = softmax_step::<S>(&mut w, seen.clone(), &mut state[i]);
            if state[i].m != f32::NEG_INFINITY {
                add_values::<D>(&mut acc[i * d..][..d], &w, &vw, seen, corr);
            }
        }
        start += TILE;
    }
}

/// One query's online-softmax step over keys `seen` of a tile: its scores
/// `w` become the keys' weights (0 outside `seen`), `state` moves to the
/// new maximum and sum; returns the factor `exp(m - m')` for the values.
#[inline(always)]
fn softmax_step<S: TileOps>(w: &mut [f32; TILE], seen: Range<usize>, st: &mut Online) -> f32 {
    let masked: [f32; TILE] = std::array::from_fn(|j| {
        if seen.contains(&j) {
            w[j]
        } else {
            f32::NEG_INFINITY
        }
    });
    let m = max_of(st.m, max16(&masked));
    if m == f32::NEG_INFINITY {
        return 1.0;
    }
    let mut p = exp_lanes(std::array::from_fn(|j| w[j] - m));
    for (j, p) in p.iter_mut().enumerate() {
        if !seen.contains(&j) {
            *p = 0.0;
        }
    }
    // exp(0) = 1 exactly, so a maximum that stays costs no exponential.
    let corr = if st.m == m {
        1.0
    } else if st.m == f32::NEG_INFINITY {
        0.0
    } else {
        exp_clamped(st.m - m)
    };
    st.l = st.l.mul_add(corr, S::sum16(&p));
    st.m = m;
    *w = p;
    corr
}

/// `acc = acc * corr` (skipped at 1), then `acc = fma(p_j, v_j, acc)` for
/// each key j of `seen` in order; a head of `D` values is held in
/// registers (`D` = 0: of `acc.len()`, 16 at a time).
#[inline(always)]
fn add_values<const D: usize>(
    acc: &mut [f32],
    p: &[f32; TILE],
    vw: &[f32],
    seen: Range<usize>,
    corr: f32,
) {
    if D > 0 {
        let mut lanes: [f32; D] = acc.try_into().unwrap();
        add_values_to(&mut lanes, p, vw, D, 0, seen, corr);
        acc.copy_from_slice(&lanes);
    } else {
        let d = acc.len();
        for (a, c) in acc.chunks_exact_mut(16).zip((0..d).step_by(16)) {
            let mut lanes: [f32; 16] = a.try_into().unwrap();
            add_values_to(&mut lanes, p, vw, d, c, seen.clone(), corr);
            a.copy_from_slice(&lanes);
        }
    }
}

/// [`add_values`] for elements `first..first + N` of heads of `d` values.
#[inline(always)]
fn add_values_to<const N: usize>(
    lanes: &mut [f32; N],
    p: &[f32; TILE],
    vw: &[f32],
    d: usize,
    first: usize,
    seen: Range<usize>,
    corr: f32,
) {
    if corr != 1.0 {
        lanes.iter_mut().for_each(|x| *x *= corr);
    }
    let rows = vw[seen.start * d..seen.end * d].chunks_exact(d);
    for (&pj, row) in p[seen].iter().zip(rows) {
        let v: &[f32; N] = row[first..first + N].try_into().unwrap();
        for (x, &w) in lanes.iter_mut().zip(v) {
            *x = pj.mul_add(w, *x);
        }
    }
}

/// `a > b ? a : b`, a vector max.
#[inline(always)]
fn max_of(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// The largest of sixteen values (a tree of [`max_of`]; any order gives
/// the same maximum).
#[inline(always)]
fn max16(x: &[f32; 16]) -> f32 {
    let t: [f32; 8] = std::array::from_fn(|i| max_of(x[i], x[i + 8]));
    let t: [f32; 4] = std::array::from_fn(|i| max_of(t[i], t[i + 4]));
    max_of(max_of(t[0], t[2]), max_of(t[1], t[3]))
}

/// `q . k` in 16 lanes (FMA along the vector), then the lanes summed as
/// [`sum16`] sums.
#[inline(always)]
fn dot16(q: &[f32], k: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    for (qc, kc) in q.chunks_exact(16).zip(k.chunks_exact(16)) {
        for i in 0..16 {
            lanes[i] = qc[i].mul_add(kc[i], lanes[i]);
        }
    }
    sum16(&lanes)
}

/// Sixteen values summed in a fixed tree: each four `(x0 + x2) + (x1 +
/// x3)`, then the fours the same way.
#[inline(always)]
fn sum16(x: &[f32; 16]) -> f32 {
    let g: [f32; 4] =
        std::array::from_fn(|c| (x[4 * c] + x[4 * c + 2]) + (x[4 * c + 1] + x[4 * c + 3]));
    (g[0] + g[2]) + (g[1] + g[3])
}

/// `exp(x)` of each lane, for `x <= 0` (softmax exponents; larger values
/// give unspecified results): ggml's polynomial (`expf_ggml`, within
/// 1.5 ulp) without its branches, the input clamped at -87 (whose exp,
/// 1.6e-38, is as good as 0 for a weight), so every lane takes the same
/// instructions and the loop is one vector.
#[inline(always)]
fn exp_lanes(x: [f32; TILE]) -> [f32; TILE] {
    let mut out = [0f32; TILE];
    for (o, &x) in out.iter_mut().zip(&x) {
        *o = exp_clamped(x);
    }
    out
}

/// One lane of [`exp_lanes`].
#[inline(always)]
fn exp_clamped(x: f32) -> f32 {
    crate::ops::expf_ggml_normal(x.max(-87.0))
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{TileOps, TILE};
    use half::f16;
    use std::arch::x86_64::*;

    /// [`TileOps`] with AVX-512 F: each key's 16 lanes of FMAs, then the
    /// 16 keys' lanes reduced together by one transpose-and-add tree that
    /// adds the same pairs in the same order as `sum16`.
    pub(super) struct Avx512;

    impl TileOps for Avx512 {
        #[inline(always)]
        fn widen(src: &[f16], dst: &mut [f32]) {
            assert!(src.len() == dst.len() && src.len().is_multiple_of(16));
            for (s, d) in src.chunks_exact(16).zip(dst.chunks_exact_mut(16)) {
                // SAFETY: AVX-512 F (see `scores`); 16 elements each.
                unsafe {
                    let h = _mm256_loadu_si256(s.as_ptr() as *const __m256i);
                    _mm512_storeu_ps(d.as_mut_ptr(), _mm512_cvtph_ps(h));
                }
            }
        }

        #[inline(always)]
        fn scores<const D: usize>(q: &[f32], kw: &[f32], scale: f32) -> [f32; TILE] {
            let d = super::head_dim::<D>(q);
            debug_assert!(d.is_multiple_of(16) && kw.len() >= TILE * d);
            // SAFETY: only inlined into `run_task_avx512` (AVX-512 F checked
            // at run time); every load lies within q or kw (asserted above).
            unsafe {
                let lanes: [__m512; TILE] = std::array::from_fn(|j| {
                    let k = kw.as_ptr().add(j * d);
                    let mut acc = _mm512_setzero_ps();
                    for c in (0..d).step_by(16) {
                        let qc = _mm512_loadu_ps(q.as_ptr().add(c));
                        acc = _mm512_fmadd_ps(qc, _mm512_loadu_ps(k.add(c)), acc);
                    }
                    acc
                });
                // Keys 2i, 2i + 1: per 128-bit group [x0+x2, y0+y2, x1+x3, y1+y3].
                let pair = |x: __m512, y: __m512| {
                    _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y))
                };
                let t: [__m512; 8] = std::array::from_fn(|i| pair(lanes[2 * i], lanes[2 * i + 1]));
                // Keys 4i..4i+4: per group, each key's (x0+x2) + (x1+x3).
                let quad = |a: __m512, b: __m512| {
                    let (a, b) = (_mm512_castps_pd(a), _mm512_castps_pd(b));
                    _mm512_add_ps(
                        _mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                        _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)),
                    )
                };
                let u: [__m512; 4] = std::array::from_fn(|i| quad(t[2 * i], t[2 * i + 1]));
                // Groups (g0 + g2) + (g1 + g3), keys 4m..4m+4 in group m.
                let halves = |a: __m512, b: __m512| {
                    _mm512_add_ps(
                        _mm512_shuffle_f32x4::<0x44>(a, b),
                        _mm512_shuffle_f32x4::<0xEE>(a, b),
                    )
                };
                let (ab, cd) = (halves(u[0], u[1]), halves(u[2], u[3]));
                let sums = _mm512_add_ps(
                    _mm512_shuffle_f32x4::<0x88>(ab, cd),
                    _mm512_shuffle_f32x4::<0xDD>(ab, cd),
                );
                let mut out = [0f32; TILE];
                _mm512_storeu_ps(out.as_mut_ptr(), _mm512_mul_ps(sums, _mm512_set1_ps(scale)));
                out
            }
        }

        /// `sum16` by swaps: lanes (0, 2), (1, 3) of each group, then
        /// (0, 1); then groups (0, 2), (1, 3), then (0, 1).
        #[inline(always)]
        fn sum16(x: &[f32; 16]) -> f32 {
            // SAFETY: AVX-512 F (see `scores`).
            unsafe {
                let v = _mm512_loadu_ps(x.as_ptr());
                let v = _mm512_add_ps(v, _mm512_permute_ps::<0b01_00_11_10>(v));
                let v = _mm512_add_ps(v, _mm512_permute_ps::<0b10_11_00_01>(v));
                let v = _mm512_add_ps(v, _mm512_shuffle_f32x4::<0b01_00_11_10>(v, v));
                let v = _mm512_add_ps(v, _mm512_shuffle_f32x4::<0b10_11_00_01>(v, v));
                _mm512_cvtss_f32(v)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::flash_attention_f16;

    fn halves(x: &[f32]) -> Vec<f16> {
        x.iter().map(|&x| f16::from_f32(x)).collect()
    }

    /// Uniform in [-1, 1), deterministic.
    fn uniform(seed: u64) -> impl FnMut() -> f32 {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        }
    }

    fn params(n_head: usize, n_head_kv: usize, head_dim: usize) -> AttentionParams {
        AttentionParams {
            n_head,
            n_head_kv,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
        }
    }

    /// Random queries and an f16 cache of `kv_len` cells, scores spread wide
    /// enough that the maximum moves between tiles.
    fn case(
        p: AttentionParams,
        rows: usize,
        kv_len: usize,
        seed: u64,
    ) -> (Vec<f32>, Vec<f16>, Vec<f16>) {
        let mut r = uniform(seed);
        let q: Vec<f32> = (0..rows * p.n_head * p.head_dim)
            .map(|_| 3.0 * r())
            .collect();
        let k: Vec<f32> = (0..kv_len * p.n_head_kv * p.head_dim)
            .map(|_| 3.0 * r())
            .collect();
        let v: Vec<f32> = (0..kv_len * p.n_head_kv * p.head_dim)
            .map(|_| r())
            .collect();
        (q, halves(&k), halves(&v))
    }

    /// Exact softmax attention in f64 over the same (f16) keys and values.
    fn exact(q: &[f32], k: &[f16], v: &[f16], mask: AttentionMask, p: AttentionParams) -> Vec<f64> {
        let d = p.head_dim;
        let (q_cols, kv_cols) = (p.n_head * d, p.n_head_kv * d);
        let rows = q.len() / q_cols;
        let mut out = vec![0f64; rows * q_cols];
        for r in 0..rows {
            let (lo, hi) = visible_keys(mask, r);
            for h in 0..p.n_head {
                let off = (h / (p.n_head / p.n_head_kv)) * d;
                let qh = &q[r * q_cols + h * d..][..d];
                let s: Vec<f64> = (lo..hi)
                    .map(|j| {
                        let kr = &k[j * kv_cols + off..][..d];
                        qh.iter()
                            .zip(kr)
                            .map(|(&a, b)| a as f64 * b.to_f64())
                            .sum::<f64>()
                            * p.scale as f64
                    })
                    .collect();
                let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
                let total: f64 = w.iter().sum();
                for (j, w) in (lo..hi).zip(&w) {
                    for e in 0..d {
                        out[r * q_cols + h * d + e] +=
                            w / total * v[j * kv_cols + off + e].to_f64();
                    }
                }
            }
        }
        out
    }

    #[test]
    fn tiled_attention_matches_exact_softmax() {
        // Lengths around the tile and the split threshold; causal rows
        // ending mid-tile; a sliding window; GQA groups of 1, 3 and 7.
        for (n_head, n_head_kv, d) in [(3, 1, 64), (14, 2, 64), (4, 4, 32), (2, 1, 256)] {
            let p = params(n_head, n_head_kv, d);
            for (kv_len, rows, window) in [
                (5, 5, None),
                (37, 3, None),
                (700, 4, None),
                (300, 9, Some(40)),
            ] {
                let (q, k, v) = case(p, rows, kv_len, kv_len as u64 + d as u64);
                let mask = AttentionMask {
                    q_pos0: kv_len - rows,
                    kv_len,
                    causal: true,
                    window,
                };
                let want = exact(&q, &k, &v, mask, p);
                for threads in [1, 2, 3] {
                    let pool = ThreadPool::new(threads);
                    let mut out = vec![0f32; q.len()];
                    tiled_attention_f16(&pool, &q, &k, &v, mask, p, &mut out);
                    let err = out
                        .iter()
                        .zip(&want)
                        .map(|(&a, &b)| (a as f64 - b).abs())
                        .fold(0f64, f64::max);
                    assert!(
                        err < 2e-5,
                        "{n_head}/{n_head_kv} d {d} kv {kv_len} rows {rows} t {threads}: {err}"
                    );
                }
            }
        }
    }

    /// Each row of a pass equals the same row computed alone (as a decode
    /// step at its position computes it), bit for bit: the property that
    /// keeps greedy speculation identical to plain decoding.
    #[test]
    fn rows_in_a_batch_equal_rows_alone() {
        let p = params(6, 2, 64);
        for kv_len in [30, 517, 1030] {
            let rows = 11;
            let (q, k, v) = case(p, rows, kv_len, 7 + kv_len as u64);
            let q_cols = p.n_head * p.head_dim;
            for threads in [1, 2] {
                let pool = ThreadPool::new(threads);
                let mask = AttentionMask {
                    q_pos0: kv_len - rows,
                    kv_len,
                    causal: true,
                    window: None,
                };
                let mut batch = vec![0f32; q.len()];
                tiled_attention_f16(&pool, &q, &k, &v, mask, p, &mut batch);
                for r in 0..rows {
                    let alone_mask = AttentionMask {
                        q_pos0: mask.q_pos0 + r,
                        kv_len: mask.q_pos0 + r + 1,
                        ..mask
                    };
                    let mut alone = vec![0f32; q_cols];
                    let qr = &q[r * q_cols..][..q_cols];
                    tiled_attention_f16(&pool, qr, &k, &v, alone_mask, p, &mut alone);
                    let got = &batch[r * q_cols..][..q_cols];
                    let same = got
                        .iter()
                        .zip(&alone)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "kv {kv_len} threads {threads} row {r}");
                }
            }
        }
    }

    /// The vector builds give the portable code's bits.
    #[test]
    fn simd_builds_agree_with_portable() {
        let p = params(7, 1, 64);
        let kv_len = 333;
        let (q, k, v) = case(p, 1, kv_len, 99);
        let tile = TileSource {
            k: &k,
            v: &v,
            stride: 64,
            offset: 0,
            d: 64,
            first_key: 0,
        };
        let query = |i: usize| &q[i * 64..][..64];
        let keys = vec![3..kv_len; 7];
        let mut want = (vec![Online::EMPTY; 7], vec![0f32; 7 * 64]);
        tiles::<Portable>(&tile, &query, &keys, p.scale, &mut want.0, &mut want.1);
        let mut got = (vec![Online::EMPTY; 7], vec![0f32; 7 * 64]);
        run_task(&tile, &query, &keys, p.scale, &mut got.0, &mut got.1);
        let bits = |x: &[f32]| x.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&want.1), bits(&got.1));
        for (a, b) in want.0.iter().zip(&got.0) {
            assert_eq!(
                (a.m.to_bits(), a.l.to_bits()),
                (b.m.to_bits(), b.l.to_bits())
            );
        }
        // And close to llama.cpp's sequence (`flash`), which rounds to f16.
        let mask = AttentionMask {
            q_pos0: kv_len - 1,
            kv_len,
            causal: true,
            window: None,
        };
        let pool = ThreadPool::new(1);
        let (mut a, mut b) = (vec![0f32; 7 * 64], vec![0f32; 7 * 64]);
        tiled_attention_f16(&pool, &q, &k, &v, mask, p, &mut a);
        flash_attention_f16(&pool, &q, &k, &v, mask, p, &mut b);
        let err = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(err < 2e-3, "{err}");
    }
}
