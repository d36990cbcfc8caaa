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
//! queries (and, for a task of many queries, the keys transposed, so that a
//! query scores all of a tile's keys as one vector of FMA chains without a
//! reduction tree per key). The queries of one row go in blocks of up to
//! four, which share each load of a key or value and keep several
//! independent FMA chains in flight. Each query scores the tile (f32 dot
//! products in [`dot16`]'s sequence, whichever way computed), takes one
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

    /// Moves to the maximum `m` (not -inf) with a tile whose weights sum to
    /// `tile_sum`; returns the factor `exp(old m - m)` for the value sums.
    #[inline(always)]
    fn advance(&mut self, m: f32, tile_sum: f32) -> f32 {
        // exp(0) = 1 exactly, so a maximum that stays costs no exponential.
        let corr = if self.m == m {
            1.0
        } else if self.m == f32::NEG_INFINITY {
            0.0
        } else {
            exp_clamped(self.m - m)
        };
        self.l = self.l.mul_add(corr, tile_sum);
        self.m = m;
        corr
    }
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
    tiles::<x86::Avx2>(tile, query, keys, scale, state, acc)
}

/// What a build does its own way (the same values on any). Every method
/// is inlined into a `run_task_*` and written without closures: code
/// compiled apart from those has no FMA instructions, and each `mul_add`
/// there becomes a call (30x slower).
trait TileOps: Sized {
    /// Queries from which a task transposes its tiles.
    const TRANSPOSE_FROM: usize = TRANSPOSE_FROM;
    /// `src` widened into `dst` (f16 to f32 is exact).
    fn widen(src: &[f16], dst: &mut [f32]);
    /// For each of `N` queries, [`TILE`] dot products `q . k_j` (`kw`
    /// holds the keys, `q.len()` apart), each as [`dot16`] computes it,
    /// times `scale`. `D` is `q.len()` where known when compiled (0 where
    /// not).
    fn scores<const D: usize, const N: usize>(
        qs: [&[f32]; N],
        kw: &[f32],
        scale: f32,
    ) -> [[f32; TILE]; N];
    /// [`sum16`].
    #[inline(always)]
    fn sum16(x: &[f32; 16]) -> f32 {
        sum16(x)
    }
    /// [`softmax_step`].
    #[inline(always)]
    fn softmax_step(w: &mut [f32; TILE], seen: Range<usize>, st: &mut Online) -> f32 {
        softmax_step::<Self>(w, seen, st)
    }
    /// The tile's keys `kw` (`D` > 0 elements each) transposed into `kt`:
    /// row `e` holds element `e` of the [`TILE`] keys.
    #[inline(always)]
    fn transpose<const D: usize>(kw: &[f32], kt: &mut [f32]) {
        assert!(D > 0 && kw.len() >= TILE * D && kt.len() >= TILE * D);
        for e in 0..D {
            for j in 0..TILE {
                kt[e * TILE + j] = kw[j * D + e];
            }
        }
    }
    /// [`scores`](TileOps::scores) from the [transposed](TileOps::transpose)
    /// keys, the same values: lane `l` of [`dot16`] (the FMA chain over
    /// elements `l`, `l + 16`, ...) runs for all the tile's keys at once,
    /// and the lanes are summed in [`sum16`]'s tree, key by key.
    #[inline(always)]
    fn scores_transposed<const D: usize, const N: usize>(
        qs: [&[f32]; N],
        kt: &[f32],
        scale: f32,
    ) -> [[f32; TILE]; N] {
        assert!(D > 0 && kt.len() >= TILE * D && qs.iter().all(|q| q.len() == D));
        let mut out = [[0f32; TILE]; N];
        for (out, q) in out.iter_mut().zip(qs) {
            let mut lanes = [[0f32; TILE]; 16];
            for (e, &qe) in q.iter().enumerate() {
                let row = &kt[e * TILE..][..TILE];
                for (x, &k) in lanes[e % 16].iter_mut().zip(row) {
                    *x = qe.mul_add(k, *x);
                }
            }
            for (j, o) in out.iter_mut().enumerate() {
                let key: [f32; 16] = std::array::from_fn(|l| lanes[l][j]);
                *o = sum16(&key) * scale;
            }
        }
        out
    }
    /// [`add_values`] for each of `N` queries, whose value sums lie one
    /// after another in `acc`.
    #[inline(always)]
    fn add_values<const D: usize, const N: usize>(
        acc: &mut [f32],
        p: &[[f32; TILE]; N],
        vw: &[f32],
        seen: Range<usize>,
        corr: [f32; N],
    ) {
        add_values_each::<D, N>(acc, p, vw, seen, corr)
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
    fn scores<const D: usize, const N: usize>(
        qs: [&[f32]; N],
        kw: &[f32],
        scale: f32,
    ) -> [[f32; TILE]; N] {
        dot_scores::<D, N>(qs, kw, scale)
    }
}

/// [`TileOps::scores`] key by key with [`dot16`].
#[inline(always)]
fn dot_scores<const D: usize, const N: usize>(
    qs: [&[f32]; N],
    kw: &[f32],
    scale: f32,
) -> [[f32; TILE]; N] {
    let mut out = [[0f32; TILE]; N];
    for (out, q) in out.iter_mut().zip(qs) {
        let d = head_dim::<D>(q);
        for (j, o) in out.iter_mut().enumerate() {
            *o = dot16(&q[..d], &kw[j * d..][..d]) * scale;
        }
    }
    out
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
    let transpose = D > 0 && block_queries(d) > 1 && keys.len() >= S::TRANSPOSE_FROM;
    let mut kt = vec![0f32; if transpose { TILE * d } else { 0 }];
    let mut start = src.first_key + (lo - src.first_key) / TILE * TILE;
    while start < hi {
        let n = TILE.min(hi - start);
        for j in 0..n {
            let at = (start + j) * src.stride + src.offset;
            S::widen(&src.k[at..][..d], &mut kw[j * d..][..d]);
            S::widen(&src.v[at..][..d], &mut vw[j * d..][..d]);
        }
        kw[n * d..].fill(0.0);
        if transpose {
            S::transpose::<D>(&kw, &mut kt);
        }
        let tile = Tile {
            kw: &kw,
            kt: transpose.then_some(&kt[..]),
            vw: &vw,
            scale,
        };
        // Blocks of queries that see the same keys (the heads of one row):
        // each block shares the tile's loads, and its value sums are
        // independent FMA chains.
        let mut i = 0;
        while i < keys.len() {
            let range = &keys[i];
            let mut n = 1;
            while n < block_queries(d) && i + n < keys.len() && keys[i + n] == *range {
                n += 1;
            }
            let seen = range.start.max(start).saturating_sub(start)
                ..range.end.min(start + TILE).saturating_sub(start);
            if !seen.is_empty() {
                let (st, ac) = (&mut state[i..i + n], &mut acc[i * d..(i + n) * d]);
                match n {
                    1 => block_step::<S, D, 1>(&tile, query, i, seen, st, ac),
                    2 => block_step::<S, D, 2>(&tile, query, i, seen, st, ac),
                    3 => block_step::<S, D, 3>(&tile, query, i, seen, st, ac),
                    _ => block_step::<S, D, 4>(&tile, query, i, seen, st, ac),
                }
            }
            i += n;
        }
        start += TILE;
    }
}

/// Most queries one block carries: their value sums (`head_dim / 16`
/// vectors each) stay within half of AVX-512's 32 registers.
fn block_queries(head_dim: usize) -> usize {
    (256 / head_dim).clamp(1, 4)
}

/// One tile, widened: [`TILE`] keys and values, `d` apart, and for tasks
/// of many queries the keys transposed too ([`TileOps::transpose`]).
struct Tile<'a> {
    kw: &'a [f32],
    kt: Option<&'a [f32]>,
    vw: &'a [f32],
    scale: f32,
}

/// Queries from which a task transposes its tiles: scoring from the
/// transposed keys saves the reduction tree of each query's dot products
/// (about a third of a verify row's attention), but transposing costs
/// about what that saves for the seven heads of one Qwen2.5-0.5B row.
const TRANSPOSE_FROM: usize = 12;

/// The tile's step for queries `first..first + N`, which all see keys
/// `seen` of it: each query's arithmetic is exactly its own step alone
/// (scores, [`softmax_step`], [`add_values`]), the block only shares loads.
#[inline(always)]
fn block_step<'q, S: TileOps, const D: usize, const N: usize>(
    tile: &Tile,
    query: &impl Fn(usize) -> &'q [f32],
    first: usize,
    seen: Range<usize>,
    state: &mut [Online],
    acc: &mut [f32],
) {
    // Loops rather than closures: a closure is compiled without the
    // caller's target features (its `mul_add` becomes a libm call).
    let mut qs: [&[f32]; N] = [&[]; N];
    for (i, q) in qs.iter_mut().enumerate() {
        *q = query(first + i);
    }
    let mut w = match tile.kt {
        // One query's transposed chains are too few to hide FMA latency.
        Some(kt) if N > 1 => S::scores_transposed::<D, N>(qs, kt, tile.scale),
        _ => S::scores::<D, N>(qs, tile.kw, tile.scale),
    };
    let mut corr = [1f32; N];
    for i in 0..N {
        corr[i] = S::softmax_step(&mut w[i], seen.clone(), &mut state[i]);
    }
    if state.iter().any(|st| st.m == f32::NEG_INFINITY) {
        // Not all saw a finite score: each alone, as `add_values` skips those.
        let d = acc.len() / N;
        for i in 0..N {
            if state[i].m != f32::NEG_INFINITY {
                add_values::<D>(
                    &mut acc[i * d..][..d],
                    &w[i],
                    tile.vw,
                    seen.clone(),
                    corr[i],
                );
            }
        }
    } else {
        S::add_values::<D, N>(acc, &w, tile.vw, seen, corr);
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
    *w = p;
    st.advance(m, S::sum16(w))
}

/// [`add_values`] for each of `N` queries, one after another, whose value
/// sums lie one after another in `acc`.
#[inline(always)]
fn add_values_each<const D: usize, const N: usize>(
    acc: &mut [f32],
    p: &[[f32; TILE]; N],
    vw: &[f32],
    seen: Range<usize>,
    corr: [f32; N],
) {
    let d = acc.len() / N;
    for (i, acc) in acc.chunks_exact_mut(d).enumerate() {
        add_values::<D>(acc, &p[i], vw, seen.clone(), corr[i]);
    }
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
    use std::ops::Range;

    /// [`TileOps`] with AVX2, FMA and F16C: the portable code, but keys
    /// and values widened by F16C in place (`half`'s slice conversion is a
    /// call per row, a fifth of a decode row's attention).
    pub(super) struct Avx2;

    // Index loops: see `Avx512`.
    #[allow(clippy::needless_range_loop)]
    impl TileOps for Avx2 {
        const TRANSPOSE_FROM: usize = 1;
        #[inline(always)]
        fn widen(src: &[f16], dst: &mut [f32]) {
            assert!(src.len() == dst.len() && src.len().is_multiple_of(8));
            for (s, d) in src.chunks_exact(8).zip(dst.chunks_exact_mut(8)) {
                // SAFETY: only inlined into `run_task_avx2` (F16C checked at
                // run time); 8 elements each.
                unsafe {
                    let h = _mm_loadu_si128(s.as_ptr() as *const __m128i);
                    _mm256_storeu_ps(d.as_mut_ptr(), _mm256_cvtph_ps(h));
                }
            }
        }

        #[inline(always)]
        fn scores<const D: usize, const N: usize>(
            qs: [&[f32]; N],
            kw: &[f32],
            scale: f32,
        ) -> [[f32; TILE]; N] {
            super::dot_scores::<D, N>(qs, kw, scale)
        }

        #[inline(always)]
        fn transpose<const D: usize>(kw: &[f32], kt: &mut [f32]) {
            assert!(D > 0 && D.is_multiple_of(8) && kw.len() >= TILE * D && kt.len() >= TILE * D);
            for keys in 0..TILE / 8 {
                for e in 0..D / 8 {
                    // SAFETY: only inlined into `run_task_avx2` (AVX checked
                    // at run time); the 8 x 8 block of keys 8 keys.. and
                    // elements 8e.. of kw, into rows 8e.. of kt (asserted).
                    unsafe {
                        transpose8(
                            kw.as_ptr().add(8 * keys * D + 8 * e),
                            D,
                            kt.as_mut_ptr().add(8 * e * TILE + 8 * keys),
                        )
                    }
                }
            }
        }

        /// [`Avx512`]'s transposed scores one query at a time in 8-lane
        /// halves (AVX2 has 16 registers: a group's four lanes of chains
        /// for 16 keys take eight).
        #[inline(always)]
        fn scores_transposed<const D: usize, const N: usize>(
            qs: [&[f32]; N],
            kt: &[f32],
            scale: f32,
        ) -> [[f32; TILE]; N] {
            assert!(D > 0 && D.is_multiple_of(16) && kt.len() >= TILE * D);
            assert!(qs.iter().all(|q| q.len() == D));
            let mut out = [[0f32; TILE]; N];
            for i in 0..N {
                // SAFETY: only inlined into `run_task_avx2` (AVX2 and FMA
                // checked at run time); loads within kt and the query.
                unsafe {
                    let q = qs[i].as_ptr();
                    let zero = _mm256_setzero_ps();
                    let (mut even, mut odd) = ([zero; 2], [zero; 2]);
                    for g in [0, 2, 1, 3] {
                        let mut lanes = [[zero; 2]; 4];
                        for c in 0..D / 16 {
                            for l in 0..4 {
                                let e = 16 * c + 4 * g + l;
                                let qe = _mm256_set1_ps(*q.add(e));
                                let k = kt.as_ptr().add(e * TILE);
                                for h in 0..2 {
                                    let kh = _mm256_loadu_ps(k.add(8 * h));
                                    lanes[l][h] = _mm256_fmadd_ps(qe, kh, lanes[l][h]);
                                }
                            }
                        }
                        for h in 0..2 {
                            let sum = _mm256_add_ps(
                                _mm256_add_ps(lanes[0][h], lanes[2][h]),
                                _mm256_add_ps(lanes[1][h], lanes[3][h]),
                            );
                            match g {
                                0 => even[h] = sum,
                                2 => even[h] = _mm256_add_ps(even[h], sum),
                                1 => odd[h] = sum,
                                _ => odd[h] = _mm256_add_ps(odd[h], sum),
                            }
                        }
                    }
                    for h in 0..2 {
                        let sum =
                            _mm256_mul_ps(_mm256_add_ps(even[h], odd[h]), _mm256_set1_ps(scale));
                        _mm256_storeu_ps(out[i].as_mut_ptr().add(8 * h), sum);
                    }
                }
            }
            out
        }

        /// `softmax_step` in two 8-lane vectors, as [`Avx512`]'s.
        #[inline(always)]
        fn softmax_step(w: &mut [f32; TILE], seen: Range<usize>, st: &mut super::Online) -> f32 {
            debug_assert!(seen.start < seen.end && seen.end <= TILE);
            // SAFETY: only inlined into `run_task_avx2` (AVX2 and FMA checked
            // at run time); 16 lanes of w.
            unsafe {
                let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                let (lo_end, hi_end) = (seen.end as i32, seen.end as i32 - 8);
                let (lo_start, hi_start) = (seen.start as i32, seen.start as i32 - 8);
                let (in_lo, in_hi) = (
                    inside8(lane, lo_start, lo_end),
                    inside8(lane, hi_start, hi_end),
                );
                let (x_lo, x_hi) = (
                    _mm256_loadu_ps(w.as_ptr()),
                    _mm256_loadu_ps(w.as_ptr().add(8)),
                );
                let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
                let m_lo = _mm256_blendv_ps(ninf, x_lo, in_lo);
                let m_hi = _mm256_blendv_ps(ninf, x_hi, in_hi);
                // max16's pairs: (i, i + 8), then (i, i + 4), then (0, 2) and
                // (1, 3), then those two; `vmaxps` is max_of (a > b ? a : b).
                let t = _mm256_max_ps(m_lo, m_hi);
                let t = _mm_max_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps::<1>(t));
                let t = _mm_max_ps(t, _mm_movehl_ps(t, t));
                let t = _mm_max_ss(t, _mm_shuffle_ps::<0b01>(t, t));
                let m = super::max_of(st.m, _mm_cvtss_f32(t));
                if m == f32::NEG_INFINITY {
                    return 1.0;
                }
                let mv = _mm256_set1_ps(m);
                let p_lo = _mm256_and_ps(exp8(_mm256_sub_ps(x_lo, mv)), in_lo);
                let p_hi = _mm256_and_ps(exp8(_mm256_sub_ps(x_hi, mv)), in_hi);
                _mm256_storeu_ps(w.as_mut_ptr(), p_lo);
                _mm256_storeu_ps(w.as_mut_ptr().add(8), p_hi);
                // sum16: per four lanes (x0 + x2) + (x1 + x3), then the
                // fours (g0 + g2) + (g1 + g3).
                let g = _mm256_add_ps(four(p_lo), four(p_hi));
                let sum = _mm_add_ss(_mm256_castps256_ps128(g), _mm256_extractf128_ps::<1>(g));
                st.advance(m, _mm_cvtss_f32(sum))
            }
        }
    }

    /// The 8 x 8 block of f32 at `src` (rows `stride` apart) transposed
    /// into rows [`TILE`] apart at `dst`: row l of it holds column l of the
    /// block.
    #[inline]
    #[target_feature(enable = "avx")]
    unsafe fn transpose8(src: *const f32, stride: usize, dst: *mut f32) {
        let mut r = [_mm256_setzero_ps(); 8];
        for (j, r) in r.iter_mut().enumerate() {
            *r = _mm256_loadu_ps(src.add(j * stride));
        }
        // Per 128-bit lane k: rows (2i, 2i + 1) interleaved, columns 4k, 4k + 1
        // (lo) and 4k + 2, 4k + 3 (hi).
        let mut t = [_mm256_setzero_ps(); 8];
        for i in 0..4 {
            t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        // u[4a + b], lane k: column 4k + b of rows 4a..4a + 4.
        let mut u = [_mm256_setzero_ps(); 8];
        for a in 0..2 {
            let (lo0, hi0, lo1, hi1) = (t[4 * a], t[4 * a + 1], t[4 * a + 2], t[4 * a + 3]);
            u[4 * a] = _mm256_shuffle_ps::<0x44>(lo0, lo1);
            u[4 * a + 1] = _mm256_shuffle_ps::<0xEE>(lo0, lo1);
            u[4 * a + 2] = _mm256_shuffle_ps::<0x44>(hi0, hi1);
            u[4 * a + 3] = _mm256_shuffle_ps::<0xEE>(hi0, hi1);
        }
        for b in 0..4 {
            let col_b = _mm256_permute2f128_ps::<0x20>(u[b], u[4 + b]);
            let col_4b = _mm256_permute2f128_ps::<0x31>(u[b], u[4 + b]);
            _mm256_storeu_ps(dst.add(b * TILE), col_b);
            _mm256_storeu_ps(dst.add((4 + b) * TILE), col_4b);
        }
    }

    /// All ones in the lanes `lane` of `start..end`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn inside8(lane: __m256i, start: i32, end: i32) -> __m256 {
        _mm256_castsi256_ps(_mm256_and_si256(
            _mm256_cmpgt_epi32(_mm256_set1_epi32(end), lane),
            _mm256_cmpgt_epi32(lane, _mm256_set1_epi32(start - 1)),
        ))
    }

    /// Per four lanes (128 bits), `(x0 + x2) + (x1 + x3)` in its lane 0.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn four(x: __m256) -> __m256 {
        let a = _mm256_add_ps(x, _mm256_permute_ps::<0b01_00_11_10>(x));
        _mm256_add_ps(a, _mm256_permute_ps::<0b10_11_00_01>(a))
    }

    /// `exp_clamped` of 8 lanes, the same operations in vectors.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn exp8(x: __m256) -> __m256 {
        macro_rules! c {
            ($bits:expr) => {
                _mm256_set1_ps(f32::from_bits($bits))
            };
        }
        let x = _mm256_max_ps(x, _mm256_set1_ps(-87.0));
        let r = c!(0x4b40_0000);
        let z = _mm256_fmadd_ps(x, c!(0x3fb8_aa3b), r);
        let n = _mm256_sub_ps(z, r);
        let minus_n = _mm256_xor_ps(n, _mm256_set1_ps(-0.0));
        let b = _mm256_fmadd_ps(
            minus_n,
            c!(0x35bf_be8e),
            _mm256_fmadd_ps(minus_n, c!(0x3f31_7200), x),
        );
        let k = _mm256_castsi256_ps(_mm256_add_epi32(
            _mm256_slli_epi32::<23>(_mm256_castps_si256(z)),
            _mm256_set1_epi32(1f32.to_bits() as i32),
        ));
        let u = _mm256_mul_ps(b, b);
        let j = _mm256_fmadd_ps(
            _mm256_fmadd_ps(c!(0x3c07_2010), b, c!(0x3d2b_9f17)),
            u,
            _mm256_fmadd_ps(c!(0x3e2a_af33), b, c!(0x3eff_fedb)),
        );
        let j = _mm256_fmadd_ps(j, u, _mm256_mul_ps(c!(0x3f7f_fff6), b));
        _mm256_fmadd_ps(k, j, k)
    }

    /// [`TileOps`] with AVX-512 F: each key's 16 lanes of FMAs, then the
    /// 16 keys' lanes reduced together by one transpose-and-add tree that
    /// adds the same pairs in the same order as `sum16`.
    pub(super) struct Avx512;

    // Index loops over ranges known when compiled unroll, and their vectors
    // stay in registers; iterator adaptors and closures here were compiled
    // out of line, without AVX-512 (7x slower).
    #[allow(clippy::needless_range_loop)]
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
        fn scores<const D: usize, const N: usize>(
            qs: [&[f32]; N],
            kw: &[f32],
            scale: f32,
        ) -> [[f32; TILE]; N] {
            let d = super::head_dim::<D>(qs[0]);
            debug_assert!(d.is_multiple_of(16) && kw.len() >= TILE * d);
            debug_assert!(qs.iter().all(|q| q.len() == d));
            // SAFETY: only inlined into `run_task_avx512` (AVX-512 F checked
            // at run time); every load lies within a query or kw (asserted
            // above).
            unsafe {
                // Four keys at a time: each key's 16 lanes of FMAs for every
                // query (one load of the key for all), folded at once into
                // the first two levels of the tree.
                let mut u = [[_mm512_setzero_ps(); 4]; N];
                for g in 0..TILE / 4 {
                    let mut lanes = [[_mm512_setzero_ps(); 4]; N];
                    for c in 0..d / 16 {
                        for j in 0..4 {
                            let kc = _mm512_loadu_ps(kw.as_ptr().add((4 * g + j) * d + 16 * c));
                            for i in 0..N {
                                let qc = _mm512_loadu_ps(qs[i].as_ptr().add(16 * c));
                                lanes[i][j] = _mm512_fmadd_ps(qc, kc, lanes[i][j]);
                            }
                        }
                    }
                    for i in 0..N {
                        let l = &lanes[i];
                        u[i][g] = quad(pair(l[0], l[1]), pair(l[2], l[3]));
                    }
                }
                let mut out = [[0f32; TILE]; N];
                for (out, u) in out.iter_mut().zip(&u) {
                    // Groups (g0 + g2) + (g1 + g3), keys 4m..4m+4 in group m.
                    let (ab, cd) = (halves(u[0], u[1]), halves(u[2], u[3]));
                    let sums = _mm512_add_ps(
                        _mm512_shuffle_f32x4::<0x88>(ab, cd),
                        _mm512_shuffle_f32x4::<0xDD>(ab, cd),
                    );
                    _mm512_storeu_ps(out.as_mut_ptr(), _mm512_mul_ps(sums, _mm512_set1_ps(scale)));
                }
                out
            }
        }

        #[inline(always)]
        fn transpose<const D: usize>(kw: &[f32], kt: &mut [f32]) {
            assert!(D > 0 && D.is_multiple_of(16) && kw.len() >= TILE * D && kt.len() >= TILE * D);
            for c in 0..D / 16 {
                // SAFETY: AVX-512 F (see `scores`); the 16 x 16 block at
                // column 16c of kw's 16 rows, and rows 16c.. of kt (asserted).
                unsafe {
                    transpose16(
                        kw.as_ptr().add(16 * c),
                        D,
                        kt.as_mut_ptr().add(16 * c * TILE),
                    )
                }
            }
        }

        #[inline(always)]
        fn scores_transposed<const D: usize, const N: usize>(
            qs: [&[f32]; N],
            kt: &[f32],
            scale: f32,
        ) -> [[f32; TILE]; N] {
            assert!(D > 0 && D.is_multiple_of(16) && kt.len() >= TILE * D);
            assert!(qs.iter().all(|q| q.len() == D));
            // SAFETY: AVX-512 F (see `scores`); loads within kt and the
            // queries (asserted above).
            unsafe {
                // Lanes l of a group of four (4g..4g + 4) for every query:
                // the chains over elements 16c + l, all keys at once; then
                // the group's sum (x0 + x2) + (x1 + x3), and the groups'
                // (g0 + g2) + (g1 + g3), as `sum16`.
                // Groups 0 and 2 first (their sum waits in `even`), then 1, 3.
                let mut even = [_mm512_setzero_ps(); N];
                let mut odd = [_mm512_setzero_ps(); N];
                for g in [0, 2, 1, 3] {
                    let mut lanes = [[_mm512_setzero_ps(); 4]; N];
                    for c in 0..D / 16 {
                        for l in 0..4 {
                            let e = 16 * c + 4 * g + l;
                            let k = _mm512_loadu_ps(kt.as_ptr().add(e * TILE));
                            for i in 0..N {
                                let q = _mm512_set1_ps(*qs[i].get_unchecked(e));
                                lanes[i][l] = _mm512_fmadd_ps(q, k, lanes[i][l]);
                            }
                        }
                    }
                    for i in 0..N {
                        let l = &lanes[i];
                        let sum =
                            _mm512_add_ps(_mm512_add_ps(l[0], l[2]), _mm512_add_ps(l[1], l[3]));
                        match g {
                            0 => even[i] = sum,
                            2 => even[i] = _mm512_add_ps(even[i], sum),
                            1 => odd[i] = sum,
                            _ => odd[i] = _mm512_add_ps(odd[i], sum),
                        }
                    }
                }
                let mut out = [[0f32; TILE]; N];
                for i in 0..N {
                    let sum = _mm512_add_ps(even[i], odd[i]);
                    _mm512_storeu_ps(
                        out[i].as_mut_ptr(),
                        _mm512_mul_ps(sum, _mm512_set1_ps(scale)),
                    );
                }
                out
            }
        }

        #[inline(always)]
        fn add_values<const D: usize, const N: usize>(
            acc: &mut [f32],
            p: &[[f32; TILE]; N],
            vw: &[f32],
            seen: Range<usize>,
            corr: [f32; N],
        ) {
            if D == 0 || D / 16 * N > 16 {
                // Sums that do not fit in registers: one query at a time.
                return super::add_values_each::<D, N>(acc, p, vw, seen, corr);
            }
            assert!(acc.len() == N * D && vw.len() >= seen.end * D && seen.end <= TILE);
            // SAFETY: AVX-512 F (see `scores`); loads and stores within acc
            // and vw (asserted above).
            unsafe {
                let mut sums = [[_mm512_setzero_ps(); 16]; N];
                for (i, s) in sums.iter_mut().enumerate() {
                    for (c, s) in s.iter_mut().take(D / 16).enumerate() {
                        *s = _mm512_loadu_ps(acc.as_ptr().add(i * D + 16 * c));
                        if corr[i] != 1.0 {
                            *s = _mm512_mul_ps(*s, _mm512_set1_ps(corr[i]));
                        }
                    }
                }
                for j in seen {
                    let v = vw.as_ptr().add(j * D);
                    for c in 0..D / 16 {
                        let vc = _mm512_loadu_ps(v.add(16 * c));
                        for (s, p) in sums.iter_mut().zip(p) {
                            s[c] = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), vc, s[c]);
                        }
                    }
                }
                for (i, s) in sums.iter().enumerate() {
                    for (c, s) in s.iter().take(D / 16).enumerate() {
                        _mm512_storeu_ps(acc.as_mut_ptr().add(i * D + 16 * c), *s);
                    }
                }
            }
        }

        /// `softmax_step` in vectors: `max16`'s tree of `max_of` is
        /// `vmaxps`'s (a > b ? a : b) in the same pairs, the exponentials
        /// [`exp16`], the weights outside `seen` zeroed by a mask.
        #[inline(always)]
        fn softmax_step(w: &mut [f32; TILE], seen: Range<usize>, st: &mut super::Online) -> f32 {
            debug_assert!(seen.start < seen.end && seen.end <= TILE);
            // SAFETY: AVX-512 F (see `scores`); 16 lanes of w.
            unsafe {
                let inside: __mmask16 = ((1u32 << seen.end) - (1u32 << seen.start)) as u16;
                let x = _mm512_loadu_ps(w.as_ptr());
                let v = _mm512_mask_blend_ps(inside, _mm512_set1_ps(f32::NEG_INFINITY), x);
                let v = _mm512_max_ps(v, _mm512_shuffle_f32x4::<0b11_10_11_10>(v, v));
                let v = _mm512_max_ps(v, _mm512_shuffle_f32x4::<0b01_01_01_01>(v, v));
                let v = _mm512_max_ps(v, _mm512_permute_ps::<0b00_00_11_10>(v));
                let v = _mm512_max_ps(v, _mm512_permute_ps::<0b00_00_00_01>(v));
                let m = super::max_of(st.m, _mm512_cvtss_f32(v));
                if m == f32::NEG_INFINITY {
                    return 1.0;
                }
                let p = exp16(_mm512_sub_ps(x, _mm512_set1_ps(m)));
                _mm512_storeu_ps(w.as_mut_ptr(), _mm512_maskz_mov_ps(inside, p));
                st.advance(m, Self::sum16(w))
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

    /// Keys 2i, 2i + 1 of a tile's lanes: per 128-bit group [x0+x2, y0+y2,
    /// x1+x3, y1+y3] (the first level of `sum16`'s tree for both keys).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn pair(x: __m512, y: __m512) -> __m512 {
        _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y))
    }

    /// Keys 4i..4i+4 from two [`pair`]s: per group, each key's (x0+x2) +
    /// (x1+x3).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn quad(a: __m512, b: __m512) -> __m512 {
        let (a, b) = (_mm512_castps_pd(a), _mm512_castps_pd(b));
        _mm512_add_ps(
            _mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
            _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)),
        )
    }

    /// Two [`quad`]s' groups 0 + 2 and 1 + 3, side by side.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn halves(a: __m512, b: __m512) -> __m512 {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x44>(a, b),
            _mm512_shuffle_f32x4::<0xEE>(a, b),
        )
    }

    /// The 16 x 16 block of f32 at `src` (rows `stride` apart) transposed
    /// into 16 rows of 16 at `dst`: row l of it holds column l of the block.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn transpose16(src: *const f32, stride: usize, dst: *mut f32) {
        let mut r = [_mm512_setzero_ps(); 16];
        for (j, r) in r.iter_mut().enumerate() {
            *r = _mm512_loadu_ps(src.add(j * stride));
        }
        // Per 128-bit lane k: rows (2i, 2i + 1) interleaved, columns 4k, 4k + 1
        // (lo) and 4k + 2, 4k + 3 (hi).
        let mut t = [_mm512_setzero_ps(); 16];
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        // u[4a + b], lane k: column 4k + b of rows 4a..4a + 4.
        let mut u = [_mm512_setzero_ps(); 16];
        for a in 0..4 {
            let (lo0, hi0, lo1, hi1) = (t[4 * a], t[4 * a + 1], t[4 * a + 2], t[4 * a + 3]);
            let pd = _mm512_castps_pd;
            u[4 * a] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(lo0), pd(lo1)));
            u[4 * a + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(lo0), pd(lo1)));
            u[4 * a + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(hi0), pd(hi1)));
            u[4 * a + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(hi0), pd(hi1)));
        }
        for b in 0..4 {
            // Lanes (k0, k2) and (k1, k3) of row groups (0, 1) and (2, 3).
            let x02 = _mm512_shuffle_f32x4::<0x88>(u[b], u[4 + b]);
            let x13 = _mm512_shuffle_f32x4::<0xDD>(u[b], u[4 + b]);
            let y02 = _mm512_shuffle_f32x4::<0x88>(u[8 + b], u[12 + b]);
            let y13 = _mm512_shuffle_f32x4::<0xDD>(u[8 + b], u[12 + b]);
            _mm512_storeu_ps(dst.add((b) * 16), _mm512_shuffle_f32x4::<0x88>(x02, y02));
            _mm512_storeu_ps(
                dst.add((8 + b) * 16),
                _mm512_shuffle_f32x4::<0xDD>(x02, y02),
            );
            _mm512_storeu_ps(
                dst.add((4 + b) * 16),
                _mm512_shuffle_f32x4::<0x88>(x13, y13),
            );
            _mm512_storeu_ps(
                dst.add((12 + b) * 16),
                _mm512_shuffle_f32x4::<0xDD>(x13, y13),
            );
        }
    }

    /// `exp_clamped` of 16 lanes, the same operations in vectors.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn exp16(x: __m512) -> __m512 {
        macro_rules! c {
            ($bits:expr) => {
                _mm512_set1_ps(f32::from_bits($bits))
            };
        }
        let x = _mm512_max_ps(x, _mm512_set1_ps(-87.0));
        let r = c!(0x4b40_0000);
        let z = _mm512_fmadd_ps(x, c!(0x3fb8_aa3b), r);
        let n = _mm512_sub_ps(z, r);
        let minus_n = _mm512_castsi512_ps(_mm512_xor_si512(
            _mm512_castps_si512(n),
            _mm512_set1_epi32(i32::MIN),
        ));
        let b = _mm512_fmadd_ps(
            minus_n,
            c!(0x35bf_be8e),
            _mm512_fmadd_ps(minus_n, c!(0x3f31_7200), x),
        );
        let k = _mm512_castsi512_ps(_mm512_add_epi32(
            _mm512_slli_epi32::<23>(_mm512_castps_si512(z)),
            _mm512_set1_epi32(1f32.to_bits() as i32),
        ));
        // expm1_reduced(b)
        let u = _mm512_mul_ps(b, b);
        let j = _mm512_fmadd_ps(
            _mm512_fmadd_ps(c!(0x3c07_2010), b, c!(0x3d2b_9f17)),
            u,
            _mm512_fmadd_ps(c!(0x3e2a_af33), b, c!(0x3eff_fedb)),
        );
        let j = _mm512_fmadd_ps(j, u, _mm512_mul_ps(c!(0x3f7f_fff6), b));
        _mm512_fmadd_ps(k, j, k)
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

    /// The vector exponential gives `exp_clamped`'s bits, clamp included.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_exponential_matches_scalar() {
        if !crate::kernels::x86::has_avx512f() {
            eprintln!("skipped: this CPU has no AVX-512 F");
            return;
        }
        let mut xs: Vec<f32> = (0..20_000).map(|i| -(i as f32) * 0.00731).collect();
        xs.extend([0.0, -0.0, -87.0, -87.5, -1e30, f32::NEG_INFINITY, -1e-40]);
        for chunk in xs.chunks(16) {
            let mut lanes = [0f32; 16];
            lanes[..chunk.len()].copy_from_slice(chunk);
            #[target_feature(enable = "avx512f")]
            unsafe fn vector(x: &[f32; 16]) -> [f32; 16] {
                use std::arch::x86_64::*;
                let mut out = [0f32; 16];
                _mm512_storeu_ps(out.as_mut_ptr(), x86::exp16(_mm512_loadu_ps(x.as_ptr())));
                out
            }
            // SAFETY: AVX-512 F checked above.
            let got = unsafe { vector(&lanes) };
            for (x, g) in lanes.iter().zip(got) {
                assert_eq!(g.to_bits(), exp_clamped(*x).to_bits(), "exp({x})");
            }
        }
    }

    /// Scores from a transposed tile are the dot products' bits.
    #[test]
    fn transposed_scores_equal_dot_products() {
        fn check<const D: usize>() {
            let mut r = uniform(D as u64);
            let q: Vec<f32> = (0..3 * D).map(|_| 3.0 * r()).collect();
            let kw: Vec<f32> = (0..TILE * D).map(|_| 3.0 * r()).collect();
            let mut kt = vec![0f32; TILE * D];
            Portable::transpose::<D>(&kw, &mut kt);
            let qs = [&q[..D], &q[D..2 * D], &q[2 * D..]];
            let want = Portable::scores::<D, 3>(qs, &kw, 0.125);
            let got = Portable::scores_transposed::<D, 3>(qs, &kt, 0.125);
            assert_eq!(
                want.map(|s| s.map(f32::to_bits)),
                got.map(|s| s.map(f32::to_bits))
            );
        }
        check::<64>();
        check::<128>();
    }

    /// The vector builds give the portable code's bits, for tasks of a few
    /// queries (dot products) and of many (transposed tiles), with rows
    /// that see different keys.
    #[test]
    fn simd_builds_agree_with_portable() {
        for (d, group, rows) in [(64, 7, 1), (64, 7, 4), (128, 6, 2), (32, 4, 5), (256, 4, 3)] {
            let p = params(group, 1, d);
            let kv_len = 333;
            let (q, k, v) = case(p, rows, kv_len, 99 + d as u64);
            let tile = TileSource {
                k: &k,
                v: &v,
                stride: d,
                offset: 0,
                d,
                first_key: 0,
            };
            let n = group * rows;
            let query = |i: usize| &q[i * d..][..d];
            let keys: Vec<Range<usize>> = (0..n)
                .map(|i| 3 + i / group..kv_len - 5 * (i / group))
                .collect();
            let mut want = (vec![Online::EMPTY; n], vec![0f32; n * d]);
            tiles::<Portable>(&tile, &query, &keys, p.scale, &mut want.0, &mut want.1);
            let mut got = (vec![Online::EMPTY; n], vec![0f32; n * d]);
            run_task(&tile, &query, &keys, p.scale, &mut got.0, &mut got.1);
            let bits = |x: &[f32]| x.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&want.1), bits(&got.1), "d {d}, {n} queries");
            for (a, b) in want.0.iter().zip(&got.0) {
                assert_eq!(
                    (a.m.to_bits(), a.l.to_bits()),
                    (b.m.to_bits(), b.l.to_bits())
                );
            }
        }
        let p = params(7, 1, 64);
        let kv_len = 333;
        let (q, k, v) = case(p, 1, kv_len, 99);
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
