//! The CPU backend's non-matmul ops. Written for clarity: they are the
//! reference for every other backend and cost little next to the matmuls.

use crate::kernels::{axpy_f32, dot_f32, reduce32, with_fma};
use crate::pool::ThreadPool;
use blockdraft_core::backend::{
    AttentionMask, AttentionParams, ConvParams, GatedActivation, RopeParams, RopeStyle,
};
use half::{f16, slice::HalfFloatSliceExt};

/// RMS norm with ggml's exact float sequence (f32 squares summed in f64,
/// f32 mean, scale and products). Bit-equal inputs matter: the next
/// matmul quantizes them, and a one-ulp difference can flip a rounding.
pub fn rms_norm(x: &[f32], weight: &[f32], group: usize, eps: f32, out: &mut [f32]) {
    for (xs, os) in x.chunks_exact(group).zip(out.chunks_exact_mut(group)) {
        let sum: f64 = xs.iter().map(|v| (v * v) as f64).sum();
        let mean = (sum / group as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, v), w) in os.iter_mut().zip(xs).zip(weight) {
            *o = (v * scale) * w;
        }
    }
}

/// Rotary embedding with ggml's float sequence, so outputs are bit-equal
/// to llama.cpp's: angles `theta_i = pos · base^(-2i/n_rot)` by repeated
/// multiplication in f32, and the rotation contracted into FMAs as GCC
/// compiles ggml's `x0*cos - x1*sin`, `x0*sin + x1*cos` (checked against
/// ggml's output: `fma(x0, cos, -(x1*sin))`, `fma(x0, sin, x1*cos)`).
pub fn rope(x: &mut [f32], cols: usize, pos0: usize, p: RopeParams) {
    let theta_scale = p.base.powf(-2.0 / p.n_rot as f32);
    let half = p.n_rot / 2;
    let mut cos_sin = vec![(0.0f32, 0.0f32); half];
    for (r, row) in x.chunks_exact_mut(cols).enumerate() {
        let mut theta = (pos0 + r) as f32;
        for cs in cos_sin.iter_mut() {
            *cs = (theta.cos(), theta.sin());
            theta *= theta_scale;
        }
        for head in row.chunks_exact_mut(p.head_dim).take(p.n_head) {
            for (i, &(c, s)) in cos_sin.iter().enumerate() {
                let (a, b) = match p.style {
                    RopeStyle::Normal => (2 * i, 2 * i + 1),
                    RopeStyle::Neox => (i, i + half),
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0.mul_add(c, -(x1 * s));
                head[b] = x0.mul_add(s, x1 * c);
            }
        }
    }
}

/// `exp(x)` exactly as ggml's vectorised `ggml_v_expf` computes it (an
/// approximation within ~1.5 ulp, used by llama.cpp for softmax and SiLU):
/// softmax weights and SiLU outputs feed quantized matmuls, where a
/// one-ulp difference can flip a rounding, so we follow its float sequence
/// operation for operation (every lane is independent).
#[inline(always)]
pub fn expf_ggml(x: f32) -> f32 {
    let f = f32::from_bits;
    let r = f(0x4b40_0000); // 1.5 * 2^23
    let z = x.mul_add(f(0x3fb8_aa3b), r); // x / ln 2, rounded to an integer
    let n = z - r;
    let b = (-n).mul_add(f(0x35bf_be8e), (-n).mul_add(f(0x3f31_7200), x)); // x - n ln 2
    let e = z.to_bits() << 23;
    let k = f(e.wrapping_add(1f32.to_bits())); // 2^n
    let u = b * b;
    let j = f(0x3c07_2010)
        .mul_add(b, f(0x3d2b_9f17))
        .mul_add(u, f(0x3e2a_af33).mul_add(b, f(0x3eff_fedb)));
    let j = j.mul_add(u, f(0x3f7f_fff6) * b); // exp(b) - 1
    if n.abs() <= 126.0 || n.is_nan() {
        return k.mul_add(j, k);
    }
    // |n| > 126: 2^n is split in two factors to reach the subnormals and inf.
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f(g.wrapping_add(0x7f00_0000));
    let s2 = f(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        s2.mul_add(j, s2) * s1
    }
}

/// `act(gate) * up` over rows of `cols`, with llama.cpp's CPU float
/// sequences (the products feed a quantized matmul; see `expf_ggml`):
/// - SwiGLU: `x / (1 + exp(-x))` with `expf_ggml` over each row's whole
///   groups of 8 (ggml's vector loop) and libm's `expf` on the rest;
/// - GeGLU: ggml's tanh-GELU lookup table (`GGML_GELU_FP16`): the input
///   rounded to f16, GELU of that rounded to f16; 0 below -10, identity
///   above 10.
pub fn gated(act: GatedActivation, cols: usize, gate: &[f32], up: &[f32], out: &mut [f32]) {
    with_fma(
        #[inline(always)]
        || gated_rows(act, cols, gate, up, out),
    )
}

#[inline(always)]
fn gated_rows(act: GatedActivation, cols: usize, gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, g), u) in out
        .chunks_exact_mut(cols)
        .zip(gate.chunks_exact(cols))
        .zip(up.chunks_exact(cols))
    {
        let vec_end = cols - cols % 8;
        for (i, ((o, &g), &u)) in o.iter_mut().zip(g).zip(u).enumerate() {
            *o = match act {
                GatedActivation::SwiGlu => {
                    let e = if i < vec_end {
                        expf_ggml(-g)
                    } else {
                        (-g).exp()
                    };
                    g / (1.0 + e) * u
                }
                GatedActivation::GeGlu => {
                    if g <= -10.0 {
                        0.0
                    } else if g >= 10.0 {
                        g * u
                    } else {
                        gelu_f16_table(g) * u
                    }
                }
            };
        }
    }
}

/// An entry of ggml's `ggml_table_gelu_f16`: tanh-GELU of `x` rounded to
/// f16, computed in f32 and rounded to f16.
fn gelu_f16_table(x: f32) -> f32 {
    use half::f16;
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const GELU_COEF_A: f32 = 0.044_715;
    let x = f16::from_f32(x).to_f32();
    // `1 + A*x*x` is contracted to an FMA, as GCC compiles ggml's table.
    let y = 0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (GELU_COEF_A * x).mul_add(x, 1.0)).tanh());
    f16::from_f32(y).to_f32()
}

/// Grouped dynamic depthwise convolution (see `Backend::grouped_conv`);
/// `base` is `2T x cols`, `dynamic` has `2T · cols/group` columns.
pub fn grouped_conv(
    x: &[f32],
    cols: usize,
    base: &[f32],
    dynamic: &[f32],
    p: ConvParams,
    out: &mut [f32],
) {
    let groups = cols / p.group;
    let dyn_cols = 2 * p.taps * groups;
    for (i, o) in out.chunks_exact_mut(cols).enumerate() {
        o.fill(0.0);
        // Taps reaching before row 0 see zeros, so they are skipped.
        for t in 0..p.taps.min(i + 1) {
            let k = p.side * p.taps + t;
            let xs = &x[(i - t) * cols..][..cols];
            let bs = &base[k * cols..][..cols];
            let ds = &dynamic[i * dyn_cols + k * groups..][..groups];
            for (((oc, xc), bc), &dg) in o
                .chunks_exact_mut(p.group)
                .zip(xs.chunks_exact(p.group))
                .zip(bs.chunks_exact(p.group))
                .zip(ds)
            {
                for ((ov, &xv), &bv) in oc.iter_mut().zip(xc).zip(bc) {
                    *ov += (bv + dg) * xv;
                }
            }
        }
    }
}

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

/// An element type a KV cache may hold.
pub trait KvElement: Copy + Send + Sync {
    /// `src` as f32: itself where it is f32, else converted into `buf`.
    fn as_f32<'a>(src: &'a [Self], buf: &'a mut [f32]) -> &'a [f32];
}

impl KvElement for f32 {
    fn as_f32<'a>(src: &'a [f32], _buf: &'a mut [f32]) -> &'a [f32] {
        src
    }
}

impl KvElement for f16 {
    fn as_f32<'a>(src: &'a [f16], buf: &'a mut [f32]) -> &'a [f32] {
        let out = &mut buf[..src.len()];
        src.convert_to_f32_slice(out);
        out
    }
}

/// Attention of every (query row, head) pair, one pool task each, with
/// the float sequence of llama.cpp's CPU attention for an f32 KV cache
/// without flash attention (`mul_mat(K, Q)`, `soft_max_ext`,
/// `mul_mat(V^T, KQ)` over `n_kv` = the cache length padded to 256, masked
/// keys giving exact zeros): bit-equal outputs matter because the next
/// matmul quantizes them. Scores are `dot_f32(q, k) * scale`; the softmax
/// exponentials are `expf_ggml(s - max)`, summed in f64 per group of 8 keys
/// (each group first summed in f32 as ggml's AVX2 loop does), normalised by
/// multiplying with `(1 / sum) as f32`; the weighted sum of values
/// accumulates key `j` by FMA into lane `j % 32` then reduces as `dot_f32`
/// does (one query row: ggml's `ggml_vec_dot_f32`), or into lane `j % 8`
/// reduced like the softmax groups (several rows: llamafile's sgemm; only
/// with `llamacpp_batch`, otherwise every row is computed like one). An f16
/// cache is read as its values widened to f32, in the same sequence.
#[allow(clippy::too_many_arguments)]
pub fn attention<T: KvElement>(
    pool: &ThreadPool,
    q: &[f32],
    k: &[T],
    v: &[T],
    mask: AttentionMask,
    p: AttentionParams,
    llamacpp_batch: bool,
    out: &mut [f32],
) {
    let q_cols = p.n_head * p.head_dim;
    let kv_cols = p.n_head_kv * p.head_dim;
    let n_rows = q.len() / q_cols;
    let group = p.n_head / p.n_head_kv;
    assert!(
        out.len() >= n_rows * q_cols
            && k.len() >= mask.kv_len * kv_cols
            && v.len() >= mask.kv_len * kv_cols
    );
    // ggml multiplies V by the probabilities with its `ggml_vec_dot_f32`
    // for one query row (32 lanes) and with llamafile's sgemm for several
    // (one 8-wide accumulator per output, summed like the softmax groups).
    let n_lanes = if llamacpp_batch && n_rows > 1 { 8 } else { 32 };
    let shared = SharedOut(out.as_mut_ptr());
    let task = |t: usize| {
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
                let qh = &q[r * q_cols + h * p.head_dim..][..p.head_dim];
                let kv_off = (h / group) * p.head_dim;
                // SAFETY: this task alone writes out[r, h*head_dim .. (h+1)*head_dim].
                let oh = unsafe {
                    std::slice::from_raw_parts_mut(
                        shared.at(r * q_cols + h * p.head_dim),
                        p.head_dim,
                    )
                };
                oh.fill(0.0);
                if lo == hi {
                    return;
                }
                // Keys lo0..hi0 (whole groups of 8; keys outside lo..hi weigh 0).
                let (lo0, hi0) = (lo / 8 * 8, hi.div_ceil(8) * 8);
                let mut row = vec![0f32; p.head_dim];
                let mut w: Vec<f32> = (lo0..hi0)
                    .map(|j| {
                        if (lo..hi).contains(&j) {
                            let kj = T::as_f32(&k[j * kv_cols + kv_off..][..p.head_dim], &mut row);
                            dot_f32(qh, kj) * p.scale
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
                            expf_ggml(*s - max)
                        };
                    }
                    let t: [f32; 4] = std::array::from_fn(|i| g[i] + g[4 + i]);
                    sum += ((t[0] + t[2]) + (t[1] + t[3])) as f64;
                }
                let inv = (1.0 / sum) as f32;
                // Lane sums of head_dim each: key j goes to lane j % n_lanes.
                let mut acc = vec![0f32; n_lanes * p.head_dim];
                for (j, &e) in (lo0..hi0).zip(&w) {
                    if e != 0.0 {
                        let lane = &mut acc[(j % n_lanes) * p.head_dim..][..p.head_dim];
                        let vj = T::as_f32(&v[j * kv_cols + kv_off..][..p.head_dim], &mut row);
                        axpy_f32(lane, e * inv, vj);
                    }
                }
                let lane = |l: usize, d: usize| acc[l * p.head_dim + d];
                for (d, o) in oh.iter_mut().enumerate() {
                    *o = if n_lanes == 32 {
                        reduce32(&std::array::from_fn(|l| lane(l, d)))
                    } else {
                        let t: [f32; 4] = std::array::from_fn(|i| lane(i, d) + lane(4 + i, d));
                        (t[0] + t[2]) + (t[1] + t[3])
                    };
                }
            },
        )
    };
    pool.run(n_rows * p.n_head, &task);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_normalises_each_group() {
        let x = [3.0, 4.0, 1.0, 1.0];
        let mut out = [0.0; 4];
        rms_norm(&x, &[1.0, 2.0], 2, 0.0, &mut out);
        let s = (12.5f32).sqrt();
        assert!((out[0] - 3.0 / s).abs() < 1e-6 && (out[1] - 8.0 / s).abs() < 1e-6);
        assert!((out[2] - 1.0).abs() < 1e-6 && (out[3] - 2.0).abs() < 1e-6);
    }

    #[test]
    fn rope_rotates_by_position_and_preserves_norm() {
        let p = RopeParams {
            style: RopeStyle::Neox,
            n_head: 1,
            head_dim: 4,
            n_rot: 4,
            base: 10_000.0,
        };
        let mut x = [1.0, 0.0, 0.0, 0.0];
        rope(&mut x, 4, 1, p);
        // First pair rotates by angle 1 (theta_0 = pos).
        assert!((x[0] - 1f32.cos()).abs() < 1e-6 && (x[2] - 1f32.sin()).abs() < 1e-6);
        let mut y = [0.3, -0.7, 0.2, 0.9];
        let before: f32 = y.iter().map(|v| v * v).sum();
        rope(
            &mut y,
            4,
            17,
            RopeParams {
                style: RopeStyle::Normal,
                ..p
            },
        );
        let after: f32 = y.iter().map(|v| v * v).sum();
        assert!((before - after).abs() < 1e-5);
    }

    #[test]
    fn attention_respects_causal_and_window_masks() {
        let pool = ThreadPool::new(2);
        let p = AttentionParams {
            n_head: 2,
            n_head_kv: 1,
            head_dim: 2,
            scale: 1.0,
        };
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
        attention(&pool, &q, &k, &v, mask, p, false, &mut out);
        assert_eq!(&out[0..2], &[1.0, 10.0]); // row 0 sees key 0 only
        assert!((out[4] - 1.5).abs() < 1e-6); // row 1 sees keys 0,1
        assert!((out[8] - 2.0).abs() < 1e-6); // row 2 sees keys 0..=2
        let mask = AttentionMask {
            window: Some(2),
            ..mask
        };
        attention(&pool, &q, &k, &v, mask, p, false, &mut out);
        assert!((out[8] - 2.5).abs() < 1e-6); // row 2 sees keys 1,2
        let mask = AttentionMask {
            causal: false,
            window: None,
            ..mask
        };
        attention(&pool, &q, &k, &v, mask, p, false, &mut out);
        assert!((out[0] - 2.0).abs() < 1e-6); // non-causal: row 0 sees all
    }
}
