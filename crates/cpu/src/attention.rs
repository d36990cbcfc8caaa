//! Attention over the KV cache, one pool task per (query row, head), in the
//! float sequence llama.cpp's CPU backend uses for the same cache type, so
//! outputs are bit-equal to its own (they feed a quantized matmul, where one
//! ulp can flip a rounding):
//! - an f32 cache: llama.cpp's precise configuration (`-fa off -ctk f32
//!   -ctv f32`), [`attention_f32`];
//! - an f16 cache: its default one (flash attention on, f16 cache),
//!   [`flash_attention_f16`].

use crate::kernels::{axpy_f32, dot_f32, reduce32, with_fma};
use crate::libm::expf;
use crate::pool::ThreadPool;
use blockdraft_core::backend::{AttentionMask, AttentionParams};
use half::{f16, slice::HalfFloatSliceExt};

/// Raw pointer to the output, shared across pool tasks that each write a
/// disjoint `(row, head)` slice.
struct SharedOut(*mut f32);
// SAFETY: tasks write disjoint ranges; the pool joins before `out` is used again.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// A method, so closures capture the whole `Sync` wrapper rather than the raw field.
    fn at(&self, offset: usize) -> *mut f32 {
        self.0.wrapping_add(offset)
    }
}

/// What one (query row, head) task works on.
struct HeadTask<'a> {
    /// The query head.
    q: &'a [f32],
    /// The keys this row sees: `lo..hi` (causal and window masks applied).
    lo: usize,
    hi: usize,
    /// Offset of this head's K/V head within a cache row.
    kv_off: usize,
    /// The output head, zeroed.
    out: &'a mut [f32],
}

/// Runs `task` for every (query row, head) pair on the pool, with FMA
/// enabled where the CPU has it; a row that sees no key gives zeros.
fn for_each_head(
    pool: &ThreadPool,
    q: &[f32],
    kv_len_needed: (usize, usize),
    mask: AttentionMask,
    p: AttentionParams,
    out: &mut [f32],
    task: impl Fn(HeadTask) + Sync,
) {
    let q_cols = p.n_head * p.head_dim;
    let kv_cols = p.n_head_kv * p.head_dim;
    let n_rows = q.len() / q_cols;
    let group = p.n_head / p.n_head_kv;
    assert!(
        out.len() >= n_rows * q_cols
            && kv_len_needed.0 >= mask.kv_len * kv_cols
            && kv_len_needed.1 >= mask.kv_len * kv_cols
    );
    let shared = SharedOut(out.as_mut_ptr());
    let run = |t: usize| {
        with_fma(
            #[inline(always)]
            || {
                let (r, h) = (t / p.n_head, t % p.n_head);
                let pos = mask.q_pos0 + r;
                let hi = if mask.causal {
                    (pos + 1).min(mask.kv_len)
                } else {
                    mask.kv_len
                };
                let lo = mask
                    .window
                    .map_or(0, |w| (pos + 1).saturating_sub(w))
                    .min(hi);
                // SAFETY: this task alone writes out[r, h*head_dim .. (h+1)*head_dim].
                let out = unsafe {
                    std::slice::from_raw_parts_mut(
                        shared.at(r * q_cols + h * p.head_dim),
                        p.head_dim,
                    )
                };
                out.fill(0.0);
                if lo < hi {
                    task(HeadTask {
                        q: &q[r * q_cols + h * p.head_dim..][..p.head_dim],
                        lo,
                        hi,
                        kv_off: (h / group) * p.head_dim,
                        out,
                    });
                }
            },
        )
    };
    pool.run(n_rows * p.n_head, &run);
}

/// llama.cpp's attention for an f32 KV cache without flash attention
/// (`mul_mat(K, Q)`, `soft_max_ext`, `mul_mat(V^T, KQ)` over `n_kv` = the
/// cache length padded to 256, masked keys giving exact zeros). Scores are
/// `dot_f32(q, k) * scale`; the softmax exponentials are `expf_ggml(s -
/// max)`, summed in f64 per group of 8 keys (each group first summed in f32
/// as ggml's AVX2 loop does), normalised by multiplying with `(1 / sum) as
/// f32`; the weighted sum of values accumulates key `j` by FMA into lane
/// `j % 32` then reduces as `dot_f32` does (one query row: ggml's
/// `ggml_vec_dot_f32`), or into lane `j % 8` reduced like the softmax
/// groups (several rows: llamafile's sgemm; only with `llamacpp_batch`,
/// otherwise every row is computed like one).
#[allow(clippy::too_many_arguments)]
pub fn attention_f32(
    pool: &ThreadPool,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: AttentionMask,
    p: AttentionParams,
    llamacpp_batch: bool,
    out: &mut [f32],
) {
    let kv_cols = p.n_head_kv * p.head_dim;
    let n_rows = q.len() / (p.n_head * p.head_dim);
    let n_lanes = if llamacpp_batch && n_rows > 1 { 8 } else { 32 };
    let d = p.head_dim;
    for_each_head(pool, q, (k.len(), v.len()), mask, p, out, |t| {
        // Keys lo0..hi0 (whole groups of 8; keys outside lo..hi weigh 0).
        let (lo0, hi0) = (t.lo / 8 * 8, t.hi.div_ceil(8) * 8);
        let mut w: Vec<f32> = (lo0..hi0)
            .map(|j| {
                if (t.lo..t.hi).contains(&j) {
                    dot_f32(t.q, &k[j * kv_cols + t.kv_off..][..d]) * p.scale
                } else {
                    f32::NEG_INFINITY
                }
            })
            .collect();
        let max = w.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f64;
        for g in w.chunks_exact_mut(8) {
            for s in g.iter_mut() {
                *s = if *s == f32::NEG_INFINITY {
                    0.0
                } else {
                    crate::ops::expf_ggml(*s - max)
                };
            }
            let t: [f32; 4] = std::array::from_fn(|i| g[i] + g[4 + i]);
            sum += ((t[0] + t[2]) + (t[1] + t[3])) as f64;
        }
        let inv = (1.0 / sum) as f32;
        // Lane sums of head_dim each: key j goes to lane j % n_lanes.
        let mut acc = vec![0f32; n_lanes * d];
        for (j, &e) in (lo0..hi0).zip(&w) {
            if e != 0.0 {
                let lane = &mut acc[(j % n_lanes) * d..][..d];
                axpy_f32(lane, e * inv, &v[j * kv_cols + t.kv_off..][..d]);
            }
        }
        let lane = |l: usize, i: usize| acc[l * d + i];
        for (i, o) in t.out.iter_mut().enumerate() {
            *o = if n_lanes == 32 {
                reduce32(&std::array::from_fn(|l| lane(l, i)))
            } else {
                let t: [f32; 4] = std::array::from_fn(|l| lane(l, i) + lane(4 + l, i));
                (t[0] + t[2]) + (t[1] + t[3])
            };
        }
    });
}

/// llama.cpp's flash attention over an f16 KV cache, its default
/// configuration (`ggml_compute_forward_flash_attn_ext_f16`, one query row
/// at a time, AVX2 build):
/// - the query is rounded to f16; each score is `ggml_vec_dot_f16(k, q)`
///   (f32 products summed as `dot_f32` sums its first `n - n % 32`
///   elements, the rest added in f64), then `* scale`;
/// - keys are visited in order with an online softmax: a new maximum
///   rescales the value accumulator by `ms = expf(M_old - M)`, otherwise a
///   key weighs `vs = expf(s - M)` (libm's `expf`); the accumulator is f16,
///   rounded to nearest-even after every rescale and every
///   `fma(v, vs, acc)`; the weight sum is `S = fma(S, ms, vs)` in f32;
/// - the output is the accumulator times `1 / S`.
///
/// Every row is computed alone, so results do not depend on the batch
/// (speculative verify rows equal plain decoding's). Not followed: the
/// tiled f32 path llama.cpp takes for prompt batches of 64 rows or more,
/// and its decode split of a cache of 512+ cells across threads.
pub fn flash_attention_f16(
    pool: &ThreadPool,
    q: &[f32],
    k: &[f16],
    v: &[f16],
    mask: AttentionMask,
    p: AttentionParams,
    out: &mut [f32],
) {
    let kv_cols = p.n_head_kv * p.head_dim;
    let d = p.head_dim;
    for_each_head(pool, q, (k.len(), v.len()), mask, p, out, |t| {
        let mut half = vec![f16::ZERO; d];
        half.convert_from_f32_slice(t.q);
        let mut q16 = vec![0f32; d];
        half.convert_to_f32_slice(&mut q16);
        let keys = KeyRange {
            stride: kv_cols,
            offset: t.kv_off,
            lo: t.lo,
            hi: t.hi,
        };
        let mut acc = vec![0f32; d];
        let s_sum = flash_head(&q16, k, v, keys, p.scale, &mut acc);
        let inv = if s_sum == 0.0 { 0.0 } else { 1.0 / s_sum };
        for (o, a) in t.out.iter_mut().zip(&acc) {
            *o = a * inv;
        }
    });
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

/// One head of [`flash_attention_f16`]: the unnormalised value sum into
/// `acc` (each element an f16 value) and the weight sum `S` returned.
fn flash_head(
    q16: &[f32],
    k: &[f16],
    v: &[f16],
    keys: KeyRange,
    scale: f32,
    acc: &mut [f32],
) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::x86::has_avx2() && q16.len().is_multiple_of(8) {
        // SAFETY: AVX2, FMA and F16C checked at run time; the rows lie
        // within k and v (checked by `for_each_head`), whole groups of 8.
        return unsafe { x86::flash_head(q16, k, v, keys, scale, acc) };
    }
    flash_head_portable(q16, k, v, keys, scale, acc)
}

/// The per-key steps of one head, which each kernel provides in its own
/// instructions; [`online_softmax`] orders them.
trait HeadSteps {
    /// `ggml_vec_dot_f16(k, q)` of the key at cache offset `at`.
    fn score(&mut self, at: usize) -> f64;
    /// `acc = f16(acc * ms)`.
    fn rescale(&mut self, ms: f32);
    /// `acc = f16(fma(v, vs, acc))` with the value at cache offset `at`.
    fn add_value(&mut self, at: usize, vs: f32);
}

/// llama.cpp's online softmax over `keys`: a new maximum rescales the
/// accumulator, otherwise a key weighs `expf(s - M)`; returns `S`.
#[inline(always)]
fn online_softmax(steps: &mut impl HeadSteps, keys: KeyRange, scale: f32) -> f32 {
    let (mut m, mut s_sum) = (f32::NEG_INFINITY, 0f32);
    for j in keys.lo..keys.hi {
        let at = j * keys.stride + keys.offset;
        let s = steps.score(at) as f32 * scale;
        let (ms, vs) = if s > m {
            let ms = expf(m - s);
            steps.rescale(ms);
            m = s;
            (ms, 1.0)
        } else {
            (1.0, expf(s - m))
        };
        steps.add_value(at, vs);
        s_sum = s_sum.mul_add(ms, vs);
    }
    s_sum
}

/// [`HeadSteps`] on slices, with the half crate's conversions.
struct Portable<'a> {
    q16: &'a [f32],
    k: &'a [f16],
    v: &'a [f16],
    acc: &'a mut [f32],
    /// A widened key or value row.
    row: Vec<f32>,
    /// The accumulator rounded to f16.
    half: Vec<f16>,
}

impl Portable<'_> {
    fn round_acc(&mut self) {
        self.half.convert_from_f32_slice(self.acc);
        self.half.convert_to_f32_slice(self.acc);
    }
}

impl HeadSteps for Portable<'_> {
    fn score(&mut self, at: usize) -> f64 {
        let d = self.q16.len();
        let simd_len = d - d % 32;
        self.k[at..][..d].convert_to_f32_slice(&mut self.row);
        let (q, k) = (self.q16, &self.row);
        let mut dot = dot_f32(&q[..simd_len], &k[..simd_len]) as f64;
        for (a, b) in q[simd_len..].iter().zip(&k[simd_len..]) {
            dot += (a * b) as f64;
        }
        dot
    }

    fn rescale(&mut self, ms: f32) {
        self.acc.iter_mut().for_each(|a| *a *= ms);
        self.round_acc();
    }

    fn add_value(&mut self, at: usize, vs: f32) {
        let d = self.q16.len();
        self.v[at..][..d].convert_to_f32_slice(&mut self.row);
        axpy_f32(self.acc, vs, &self.row);
        self.round_acc();
    }
}

fn flash_head_portable(
    q16: &[f32],
    k: &[f16],
    v: &[f16],
    keys: KeyRange,
    scale: f32,
    acc: &mut [f32],
) -> f32 {
    let d = q16.len();
    let mut steps = Portable {
        q16,
        k,
        v,
        acc,
        row: vec![0f32; d],
        half: vec![f16::ZERO; d],
    };
    online_softmax(&mut steps, keys, scale)
}

/// [`flash_head`] with AVX2/F16C, ggml's own instructions: keys and values
/// widened 8 at a time (`vcvtph2ps`), the dot product in four 8-wide FMA
/// accumulators, the value accumulator rounded back with `vcvtps2ph`.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{online_softmax, HeadSteps, KeyRange};
    use half::f16;
    use std::arch::x86_64::*;

    /// 8 f16 at `p`, widened.
    #[inline(always)]
    unsafe fn load8(p: *const f16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }

    /// `x` rounded to f16 (nearest, ties to even) and back.
    #[inline(always)]
    unsafe fn round8(x: __m256) -> __m256 {
        _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
    }

    /// [`HeadSteps`] on raw pointers; only ever inlined into
    /// [`flash_head`], whose target features its intrinsics need.
    struct Avx2 {
        q: *const f32,
        k: *const f16,
        v: *const f16,
        acc: *mut f32,
        d: usize,
    }

    impl HeadSteps for Avx2 {
        #[inline(always)]
        fn score(&mut self, at: usize) -> f64 {
            let simd_len = self.d - self.d % 32;
            // SAFETY: see `flash_head`; `at + d` lies within the keys.
            unsafe {
                let kp = self.k.add(at);
                let mut sums = [_mm256_setzero_ps(); 4];
                let mut i = 0;
                while i < simd_len {
                    for (c, s) in sums.iter_mut().enumerate() {
                        let x = load8(kp.add(i + 8 * c));
                        *s = _mm256_fmadd_ps(x, _mm256_loadu_ps(self.q.add(i + 8 * c)), *s);
                    }
                    i += 32;
                }
                let s4 = _mm256_add_ps(
                    _mm256_add_ps(sums[0], sums[2]),
                    _mm256_add_ps(sums[1], sums[3]),
                );
                let t = _mm_add_ps(_mm256_castps256_ps128(s4), _mm256_extractf128_ps(s4, 1));
                let t = _mm_hadd_ps(t, t);
                let mut dot = _mm_cvtss_f32(_mm_hadd_ps(t, t)) as f64;
                for i in simd_len..self.d {
                    dot += ((*kp.add(i)).to_f32() * *self.q.add(i)) as f64;
                }
                dot
            }
        }

        #[inline(always)]
        fn rescale(&mut self, ms: f32) {
            // SAFETY: see `flash_head`; acc holds d elements, d % 8 == 0.
            unsafe {
                let msv = _mm256_set1_ps(ms);
                for i in (0..self.d).step_by(8) {
                    let a = _mm256_mul_ps(_mm256_loadu_ps(self.acc.add(i)), msv);
                    _mm256_storeu_ps(self.acc.add(i), round8(a));
                }
            }
        }

        #[inline(always)]
        fn add_value(&mut self, at: usize, vs: f32) {
            // SAFETY: see `flash_head`; `at + d` lies within the values.
            unsafe {
                let (vp, vsv) = (self.v.add(at), _mm256_set1_ps(vs));
                for i in (0..self.d).step_by(8) {
                    let a =
                        _mm256_fmadd_ps(load8(vp.add(i)), vsv, _mm256_loadu_ps(self.acc.add(i)));
                    _mm256_storeu_ps(self.acc.add(i), round8(a));
                }
            }
        }
    }

    /// # Safety
    /// AVX2, FMA and F16C; `q16.len() == acc.len()`, a multiple of 8; rows
    /// `keys.lo..keys.hi` of `k` and `v` hold `keys.offset + q16.len()`
    /// elements at `keys.stride` apart.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn flash_head(
        q16: &[f32],
        k: &[f16],
        v: &[f16],
        keys: KeyRange,
        scale: f32,
        acc: &mut [f32],
    ) -> f32 {
        let mut steps = Avx2 {
            q: q16.as_ptr(),
            k: k.as_ptr(),
            v: v.as_ptr(),
            acc: acc.as_mut_ptr(),
            d: q16.len(),
        };
        online_softmax(&mut steps, keys, scale)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(head_dim: usize) -> AttentionParams {
        AttentionParams {
            n_head: 2,
            n_head_kv: 1,
            head_dim,
            scale: 1.0,
        }
    }

    fn halves(x: &[f32]) -> Vec<f16> {
        x.iter().map(|&x| f16::from_f32(x)).collect()
    }

    #[test]
    fn attention_respects_causal_and_window_masks() {
        let pool = ThreadPool::new(2);
        let p = params(2);
        // 3 cached keys with distinct values; zero queries -> uniform weights.
        let k = [0.0; 6];
        let v = [1.0, 10.0, 2.0, 20.0, 3.0, 30.0];
        let q = [0.0; 4 * 3];
        let mut out = [0.0; 12];
        let mask = AttentionMask {
            q_pos0: 0,
            kv_len: 3,
            causal: true,
            window: None,
        };
        for f16_cache in [false, true] {
            let run = |mask, out: &mut [f32]| {
                if f16_cache {
                    flash_attention_f16(&pool, &q, &halves(&k), &halves(&v), mask, p, out);
                } else {
                    attention_f32(&pool, &q, &k, &v, mask, p, false, out);
                }
            };
            run(mask, &mut out);
            assert_eq!(&out[0..2], &[1.0, 10.0]); // row 0 sees key 0 only
            assert!((out[4] - 1.5).abs() < 1e-6); // row 1 sees keys 0,1
            assert!((out[8] - 2.0).abs() < 1e-6); // row 2 sees keys 0..=2
            let window = AttentionMask {
                window: Some(2),
                ..mask
            };
            run(window, &mut out);
            assert!((out[8] - 2.5).abs() < 1e-6); // row 2 sees keys 1,2
            let bidirectional = AttentionMask {
                causal: false,
                window: None,
                ..mask
            };
            run(bidirectional, &mut out);
            assert!((out[0] - 2.0).abs() < 1e-6); // non-causal: row 0 sees all
        }
    }

    /// Two keys of equal score with values 1 and 2^-11: an f32 sum gives
    /// (1 + 2^-11) / 2, llama.cpp's f16 accumulator rounds 1 + 2^-11 to 1
    /// (a tie, to even), so the output is exactly 0.5.
    #[test]
    fn flash_attention_accumulates_values_in_f16() {
        let pool = ThreadPool::new(1);
        let p = params(32);
        let tiny = 1.0 / 2048.0;
        let (k, mut v) = (vec![0.0; 64], vec![1.0; 64]);
        v[32..].fill(tiny);
        let q = vec![0.5; 64];
        let mask = AttentionMask {
            q_pos0: 1,
            kv_len: 2,
            causal: true,
            window: None,
        };
        let mut out = vec![0.0; 64];
        flash_attention_f16(&pool, &q, &halves(&k), &halves(&v), mask, p, &mut out);
        assert!(out.iter().all(|&o| o == 0.5), "{out:?}");
        attention_f32(&pool, &q, &k, &v, mask, p, false, &mut out);
        assert!(out.iter().all(|&o| o == (1.0 + tiny) / 2.0), "{out:?}");
    }

    /// Against softmax in f64 over the same f16 values: within what f16
    /// accumulation costs, for head sizes with and without a tail past the
    /// 32-lane dot product, and a new maximum arriving late (a rescale).
    #[test]
    fn flash_attention_matches_exact_softmax_within_f16_rounding() {
        let pool = ThreadPool::new(2);
        let mut seed = 7u64;
        let mut rnd = move || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        for d in [40, 64] {
            let p = AttentionParams {
                scale: 0.3,
                ..params(d)
            };
            let n_keys = 23;
            let k16 = halves(&(0..n_keys * d).map(|_| rnd() * 2.0).collect::<Vec<_>>());
            let v16 = halves(&(0..n_keys * d).map(|_| rnd()).collect::<Vec<_>>());
            let q: Vec<f32> = (0..2 * d).map(|_| rnd() * 2.0).collect();
            let mask = AttentionMask {
                q_pos0: n_keys - 1,
                kv_len: n_keys,
                causal: true,
                window: None,
            };
            let mut out = vec![0.0; 2 * d];
            flash_attention_f16(&pool, &q, &k16, &v16, mask, p, &mut out);
            for h in 0..2 {
                let qh: Vec<f64> = q[h * d..][..d]
                    .iter()
                    .map(|&x| f16::from_f32(x).to_f64())
                    .collect();
                let scores: Vec<f64> = (0..n_keys)
                    .map(|j| {
                        let kj = &k16[j * d..][..d];
                        qh.iter().zip(kj).map(|(a, b)| a * b.to_f64()).sum::<f64>() * 0.3
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::MIN, f64::max);
                let w: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let z: f64 = w.iter().sum();
                for i in 0..d {
                    let want: f64 = (0..n_keys)
                        .map(|j| w[j] * v16[j * d + i].to_f64())
                        .sum::<f64>()
                        / z;
                    let got = out[h * d + i] as f64;
                    assert!(
                        (got - want).abs() < 4e-3,
                        "d {d} head {h} dim {i}: {got} vs {want}"
                    );
                }
            }
        }
    }

    /// The AVX2/F16C head kernel gives the portable one's bits, for head
    /// sizes with and without a tail past the 32-lane dot product, and
    /// scores that set a new maximum often (rescales).
    #[test]
    fn flash_head_kernels_agree_bit_for_bit() {
        #[cfg(target_arch = "x86_64")]
        {
            if !crate::kernels::x86::has_avx2() {
                eprintln!("SKIPPED: the CPU lacks AVX2/FMA/F16C");
                return;
            }
            let mut seed = 11u64;
            let mut rnd = move || {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            };
            for d in [8, 40, 64, 128, 256] {
                let (n_keys, stride) = (37, 2 * d);
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
                let q16: Vec<f32> = (0..d)
                    .map(|_| f16::from_f32(rnd() * 2.0).to_f32())
                    .collect();
                let keys = KeyRange {
                    stride,
                    offset: d,
                    lo: 3,
                    hi: n_keys,
                };
                let (mut a, mut b) = (vec![0f32; d], vec![0f32; d]);
                // SAFETY: checked above; rows 3..37 of stride 2d hold offset d + d.
                let sa = unsafe { x86::flash_head(&q16, &k, &v, keys, 0.7, &mut a) };
                let sb = flash_head_portable(&q16, &k, &v, keys, 0.7, &mut b);
                assert_eq!(sa.to_bits(), sb.to_bits(), "d {d}: S");
                assert!(
                    a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "d {d}"
                );
            }
        }
    }
}
