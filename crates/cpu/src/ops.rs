//! The CPU backend's non-matmul ops. Written for clarity: they are the
//! reference for every other backend and cost little next to the matmuls.

use crate::kernels::with_fma;
use crate::libm;
use blockdraft_core::backend::{ConvParams, GatedActivation, RopeParams, RopeStyle};

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
    // Compiled for FMA where the CPU has it: its `mul_add`s (and sincosf's)
    // were libm calls, about 3 % of a SmolLM2 verify pass's samples on the
    // thread the other waits for.
    with_fma(
        #[inline(always)]
        || rope_rows(x, cols, pos0, p),
    )
}

#[inline(always)]
fn rope_rows(x: &mut [f32], cols: usize, pos0: usize, p: RopeParams) {
    let theta_scale = p.base.powf(-2.0 / p.n_rot as f32);
    let half = p.n_rot / 2;
    let mut cos_sin = vec![(0.0f32, 0.0f32); half];
    for (r, row) in x.chunks_exact_mut(cols).enumerate() {
        let mut theta = (pos0 + r) as f32;
        for cs in cos_sin.iter_mut() {
            let (sin, cos) = libm::sincosf(theta);
            *cs = (cos, sin);
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
    let j = expm1_reduced(b);
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

/// `exp(b) - 1` for `|b| <= ln 2 / 2`: ggml's polynomial.
#[inline(always)]
fn expm1_reduced(b: f32) -> f32 {
    let f = f32::from_bits;
    let u = b * b;
    let j = f(0x3c07_2010)
        .mul_add(b, f(0x3d2b_9f17))
        .mul_add(u, f(0x3e2a_af33).mul_add(b, f(0x3eff_fedb)));
    j.mul_add(u, f(0x3f7f_fff6) * b)
}

/// [`expf_ggml`] for `|x| <= 87` (a normal result), without its
/// branches, so that a loop of it is one vector: the same bits there.
#[inline(always)]
pub fn expf_ggml_normal(x: f32) -> f32 {
    let f = f32::from_bits;
    let r = f(0x4b40_0000);
    let z = x.mul_add(f(0x3fb8_aa3b), r);
    let n = z - r;
    let b = (-n).mul_add(f(0x35bf_be8e), (-n).mul_add(f(0x3f31_7200), x));
    let k = f((z.to_bits() << 23).wrapping_add(1f32.to_bits()));
    k.mul_add(expm1_reduced(b), k)
}

/// `act(gate) * up` over rows of `cols`, with llama.cpp's CPU float
/// sequences (the products feed a quantized matmul; see `expf_ggml`):
/// - SwiGLU: `x / (1 + exp(-x))` with `expf_ggml` over each row's whole
///   groups of 8 (ggml's vector loop) and libm's `expf` on the rest;
/// - GeGLU: ggml's tanh-GELU lookup table (`GGML_GELU_FP16`): the input
///   rounded to f16, GELU of that rounded to f16; 0 below -10, identity
///   above 10.
pub fn gated(act: GatedActivation, cols: usize, gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, g), u) in out
        .chunks_exact_mut(cols)
        .zip(gate.chunks_exact(cols))
        .zip(up.chunks_exact(cols))
    {
        gated_span(act, cols, 0, g, u, o);
    }
}

/// [`gated`] of columns `c0..c0 + out.len()` of one row of `cols`: the
/// same values as the whole row's there.
pub fn gated_span(
    act: GatedActivation,
    cols: usize,
    c0: usize,
    gate: &[f32],
    up: &[f32],
    out: &mut [f32],
) {
    with_fma(
        #[inline(always)]
        || gated_columns(act, cols, c0, gate, up, out),
    )
}

#[inline(always)]
fn gated_columns(
    act: GatedActivation,
    cols: usize,
    c0: usize,
    gate: &[f32],
    up: &[f32],
    out: &mut [f32],
) {
    assert!(gate.len() == out.len() && up.len() == out.len() && c0 + out.len() <= cols);
    let vec_end = cols - cols % 8;
    let mut j = 0;
    if act == GatedActivation::SwiGlu {
        // Whole groups of 8 (ggml's vector loop) whose exp arguments are
        // all within ±87, where `expf_ggml` takes no branch: one vector of
        // `expf_ggml_normal`, the same bits.
        let lead = (8 - c0 % 8) % 8;
        while j < lead.min(out.len()) {
            out[j] = swiglu(gate[j], up[j], c0 + j < vec_end);
            j += 1;
        }
        while j + 8 <= out.len() && c0 + j + 8 <= vec_end {
            let g: &[f32; 8] = gate[j..j + 8].try_into().expect("8 values");
            let u: &[f32; 8] = up[j..j + 8].try_into().expect("8 values");
            let o: &mut [f32; 8] = (&mut out[j..j + 8]).try_into().expect("8 values");
            if !swiglu_8(g, u, o) {
                for l in 0..8 {
                    o[l] = swiglu(g[l], u[l], true);
                }
            }
            j += 8;
        }
    }
    for (i, ((o, &g), &u)) in out.iter_mut().zip(gate).zip(up).enumerate().skip(j) {
        *o = match act {
            GatedActivation::SwiGlu => swiglu(g, u, c0 + i < vec_end),
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

/// SwiGLU of a whole group of 8 in one vector where the CPU has one and
/// every exp argument is within ±87 (`expf_ggml`'s branchless range):
/// the same bits as [`swiglu`]. False, writing nothing, otherwise.
#[inline(always)]
fn swiglu_8(g: &[f32; 8], u: &[f32; 8], out: &mut [f32; 8]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::x86::has_avx2() {
        // SAFETY: AVX2 and FMA checked at runtime.
        return unsafe { crate::kernels::x86::swiglu_8(g, u, out) };
    }
    if !g.iter().all(|g| g.abs() <= 87.0) {
        return false;
    }
    for l in 0..8 {
        out[l] = g[l] / (1.0 + expf_ggml_normal(-g[l])) * u[l];
    }
    true
}

/// `g / (1 + exp(-g)) * u`, the exp being ggml's vector one (`in_vector`)
/// or libm's (a row's last `cols % 8`).
#[inline(always)]
fn swiglu(g: f32, u: f32, in_vector: bool) -> f32 {
    let e = if in_vector {
        expf_ggml(-g)
    } else {
        libm::expf(-g)
    };
    g / (1.0 + e) * u
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

/// Grouped dynamic depthwise convolution (see `DrafterOps::grouped_conv`);
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

    /// SwiGLU's documented sequence, element by element: ggml's `expf` on
    /// each row's whole groups of 8, libm's on the rest. Whole rows and
    /// spans at any offset give it bit for bit, with arguments beyond the
    /// vector form's range (±87) inside some groups.
    #[test]
    fn gated_rows_and_spans_follow_the_per_element_sequence() {
        let cols = 45;
        let mut state = 7u32;
        let mut gate: Vec<f32> = (0..2 * cols)
            .map(|_| {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (state >> 8) as f32 / (1 << 24) as f32 * 16.0 - 8.0
            })
            .collect();
        for (i, v) in [(3, 88.0), (17, -90.0), (30, 200.0), (50, -1e4), (41, 95.0)] {
            gate[i] = v;
        }
        let up: Vec<f32> = gate.iter().rev().map(|g| g * 0.5 + 0.25).collect();
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        let want: Vec<f32> = gate
            .iter()
            .zip(&up)
            .enumerate()
            .map(|(i, (&g, &u))| {
                let e = if i % cols < 40 {
                    expf_ggml(-g)
                } else {
                    libm::expf(-g)
                };
                g / (1.0 + e) * u
            })
            .collect();
        for act in [GatedActivation::SwiGlu, GatedActivation::GeGlu] {
            let mut rows = vec![0.0; 2 * cols];
            gated(act, cols, &gate, &up, &mut rows);
            if act == GatedActivation::SwiGlu {
                assert_eq!(bits(&rows), bits(&want));
            }
            for (c0, c1) in [
                (0, 45),
                (3, 45),
                (8, 24),
                (13, 41),
                (16, 17),
                (40, 45),
                (5, 6),
            ] {
                for r in 0..2 {
                    let s = r * cols + c0..r * cols + c1;
                    let mut span = vec![0.0; c1 - c0];
                    gated_span(act, cols, c0, &gate[s.clone()], &up[s.clone()], &mut span);
                    assert_eq!(bits(&span), bits(&rows[s]), "{act:?} {c0}..{c1}");
                }
            }
        }
    }
}
