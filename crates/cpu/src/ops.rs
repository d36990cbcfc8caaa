//! The CPU backend's non-matmul ops. Written for clarity: they are the
//! reference for every other backend and cost little next to the matmuls.

use crate::kernels::{axpy_f32, dot_f32};
use crate::pool::ThreadPool;
use blockdraft_core::backend::{
    AttentionMask, AttentionParams, ConvParams, GatedActivation, RopeParams, RopeStyle,
};

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

/// Rotary embedding, with angles computed as ggml does (`theta_i =
/// pos · base^(-2i/n_rot)` by repeated multiplication) so logits match
/// llama.cpp's closely.
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
                head[a] = x0 * c - x1 * s;
                head[b] = x0 * s + x1 * c;
            }
        }
    }
}

pub fn gated(act: GatedActivation, gate: &[f32], up: &[f32], out: &mut [f32]) {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        let a = match act {
            GatedActivation::SwiGlu => g / (1.0 + (-g).exp()),
            GatedActivation::GeGlu => {
                0.5 * g * (1.0 + (SQRT_2_OVER_PI * g * (1.0 + 0.044_715 * g * g)).tanh())
            }
        };
        *o = a * u;
    }
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

/// Attention of every (query row, head) pair, one pool task each, with a
/// numerically stable two-pass softmax over the visible keys.
pub fn attention(
    pool: &ThreadPool,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: AttentionMask,
    p: AttentionParams,
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
    let shared = SharedOut(out.as_mut_ptr());
    let task = |t: usize| {
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
        let mut scores: Vec<f32> = (lo..hi)
            .map(|j| dot_f32(qh, &k[j * kv_cols + kv_off..][..p.head_dim]) * p.scale)
            .collect();
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0;
        for s in scores.iter_mut() {
            *s = (*s - max).exp();
            sum += *s;
        }
        // SAFETY: this task alone writes out[r, h*head_dim .. (h+1)*head_dim].
        let oh = unsafe {
            std::slice::from_raw_parts_mut(shared.at(r * q_cols + h * p.head_dim), p.head_dim)
        };
        oh.fill(0.0);
        if sum == 0.0 {
            return;
        }
        for (j, s) in (lo..hi).zip(&scores) {
            axpy_f32(oh, s / sum, &v[j * kv_cols + kv_off..][..p.head_dim]);
        }
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
        attention(&pool, &q, &k, &v, mask, p, &mut out);
        assert_eq!(&out[0..2], &[1.0, 10.0]); // row 0 sees key 0 only
        assert!((out[4] - 1.5).abs() < 1e-6); // row 1 sees keys 0,1
        assert!((out[8] - 2.0).abs() < 1e-6); // row 2 sees keys 0..=2
        let mask = AttentionMask {
            window: Some(2),
            ..mask
        };
        attention(&pool, &q, &k, &v, mask, p, &mut out);
        assert!((out[8] - 2.5).abs() < 1e-6); // row 2 sees keys 1,2
        let mask = AttentionMask {
            causal: false,
            window: None,
            ..mask
        };
        attention(&pool, &q, &k, &v, mask, p, &mut out);
        assert!((out[0] - 2.0).abs() < 1e-6); // non-causal: row 0 sees all
    }
}
