//! Attention over the KV cache, in the float sequence llama.cpp's CPU backend uses for the same cache type, so
//! outputs are bit-equal to its own (they feed a quantized matmul, where one
//! ulp can flip a rounding):
//! - an f32 cache: llama.cpp's precise configuration (`-fa off -ctk f32
//!   -ctv f32`), [`attention_f32`], one pool task per (query row, head);
//! - an f16 cache: its default one (flash attention on, f16 cache),
//!   [`flash_attention_f16`] (`flash`).
//!
//! The default backend runs an f16 cache in its own, faster sequence
//! instead, [`tiled_attention_f16`] (`tiled`): keys in tiles shared by every
//! query of a KV head and by the rows of a pass, f32 accumulators.

mod flash;
mod tiled;

pub use flash::flash_attention_f16;
pub use tiled::{supports_head_dim as tiled_supports_head_dim, tiled_attention_f16};

use crate::kernels::{axpy_f32, dot_f32, reduce32, with_fma};
use crate::pool::ThreadPool;
use blockdraft_core::backend::{AttentionMask, AttentionParams};

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

/// The keys query row `row` sees, `lo..hi`: the causal and window masks
/// applied (empty when it sees none).
fn visible_keys(mask: AttentionMask, row: usize) -> (usize, usize) {
    let pos = mask.q_pos0 + row;
    let hi = if mask.causal {
        (pos + 1).min(mask.kv_len)
    } else {
        mask.kv_len
    };
    let lo = mask
        .window
        .map_or(0, |w| (pos + 1).saturating_sub(w))
        .min(hi);
    (lo, hi)
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
                let (lo, hi) = visible_keys(mask, r);
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

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

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
}
