//! aarch64 NEON kernels (NEON is part of every aarch64 CPU).
//!
//! Every quant of the types here fits in i8 (offsets applied first), so an
//! 8-bit dot is one `sdot` where the CPU has it (chosen at run time), else
//! `vmull_s8` (i8 x i8 -> i16) plus a pairwise widening add to i32; K-quant sub-block scales multiply the exact integer sub-block sums.
//! Each block's float step follows the scalar kernel's formula, so results
//! match it within float reassociation. Every weight type has one.

use super::scalar::{f16_at, q3k_scales, scale_min_k4};
use super::{by_nr, Act, Kernel};
use blockdraft_gguf::GgmlType;
use core::arch::aarch64::*;

/// `BLOCKDRAFT_NO_SIMD` is set: the scalar kernels are wanted (read once).
pub(crate) fn disabled() -> bool {
    static NO_SIMD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *NO_SIMD.get_or_init(|| std::env::var_os("BLOCKDRAFT_NO_SIMD").is_some())
}

/// The NEON kernel for `ty`, if there is one: the integer kernels built
/// with `sdot` where the CPU has it.
pub(crate) fn kernel(ty: GgmlType) -> Option<Kernel> {
    kernel_with(ty, has_dotprod())
}

/// The kernel for `ty` with the `sdot` integer kernels or the baseline
/// ones (`sdot` must only be asked for where the CPU has it).
pub(crate) fn kernel_with(ty: GgmlType, sdot: bool) -> Option<Kernel> {
    use GgmlType::*;
    macro_rules! integer {
        ($dot:ty) => {
            match ty {
                Q4_0 => by_nr!(q4_0, $dot),
                Q4_1 => by_nr!(q4_1, $dot),
                Q5_0 => by_nr!(q5_0, $dot),
                Q5_1 => by_nr!(q5_1, $dot),
                Q8_0 => by_nr!(q8_0, $dot),
                Q8_1 => by_nr!(q8_1, $dot),
                Q2_K => by_nr!(q2_k, $dot),
                Q3_K => by_nr!(q3_k, $dot),
                Q4_K => by_nr!(q4_k, $dot),
                Q5_K => by_nr!(q5_k, $dot),
                Q6_K => by_nr!(q6_k, $dot),
                Q8_K => by_nr!(q8_k, $dot),
                F32 => by_nr!(f32w),
                F16 => by_nr!(f16w),
                BF16 => by_nr!(bf16w),
                _ => return None,
            }
        };
    }
    Some(if sdot {
        integer!(Sdot)
    } else {
        integer!(Widening)
    })
}

/// The 8-bit dot product the integer kernels are built with.
trait Dot {
    /// `acc + sum_k w[k] * x[k]` over 16 i8 pairs, as i32x4 partial sums.
    /// Which pairs a lane holds differs by implementation, so the 32-block
    /// kernels (which accumulate the lanes in f32) differ in their last
    /// bits between the two; the K-quant kernels sum the lanes exactly.
    unsafe fn dot16(acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t;
}

/// Baseline NEON: widening multiplies (i8 x i8 -> i16), pairwise adds.
struct Widening;

impl Dot for Widening {
    #[inline(always)]
    unsafe fn dot16(acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t {
        let lo = vmull_s8(vget_low_s8(w), vget_low_s8(x));
        let hi = vmull_high_s8(w, x);
        vaddq_s32(acc, vaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)))
    }
}

/// `sdot` (FEAT_DotProd, Armv8.2+: Apple M1 and later, Graviton 2 and
/// later, Cortex-A76 and later): 16 products and their sums in one
/// instruction. Only used where the CPU reports it ([`has_dotprod`]).
struct Sdot;

impl Dot for Sdot {
    #[inline(always)]
    unsafe fn dot16(acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t {
        let mut acc = acc;
        // Rust's `vdotq_s32` is still unstable; the instruction needs only
        // the CPU feature, which the caller checked.
        core::arch::asm!(
            ".arch_extension dotprod",
            "sdot {acc:v}.4s, {w:v}.16b, {x:v}.16b",
            acc = inout(vreg) acc,
            w = in(vreg) w,
            x = in(vreg) x,
            options(pure, nomem, nostack, preserves_flags)
        );
        acc
    }
}

/// The CPU has `sdot` (and `BLOCKDRAFT_NO_DOTPROD` is not set).
pub(crate) fn has_dotprod() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        std::env::var_os("BLOCKDRAFT_NO_DOTPROD").is_none()
            && std::arch::is_aarch64_feature_detected!("dotprod")
    })
}

/// 32 values: quants `q` (0..16, 16..32) against the activation quants at `xp`.
#[inline(always)]
unsafe fn dot32<D: Dot>(q: (int8x16_t, int8x16_t), xp: *const i8) -> int32x4_t {
    let acc = D::dot16(vdupq_n_s32(0), q.0, vld1q_s8(xp));
    D::dot16(acc, q.1, vld1q_s8(xp.add(16)))
}

/// The 16 bytes at `p` as low nibbles (values 0..16) and high nibbles (16..32).
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> (int8x16_t, int8x16_t) {
    let q = vld1q_u8(p);
    (
        vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0F))),
        vreinterpretq_s8_u8(vshrq_n_u8::<4>(q)),
    )
}

/// `0x10` in byte k (of 32) where bit k of `bits` is set: the fifth bit of
/// Q5_0/Q5_1 quants.
#[inline(always)]
unsafe fn fifth_bits(bits: u32) -> (int8x16_t, int8x16_t) {
    let b = bits.to_le_bytes();
    let mask = vld1q_u8([1u8, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128].as_ptr());
    let pick = |b0: u8, b1: u8| {
        let spread = vcombine_u8(vdup_n_u8(b0), vdup_n_u8(b1));
        vreinterpretq_s8_u8(vandq_u8(vtstq_u8(spread, mask), vdupq_n_u8(0x10)))
    };
    (pick(b[0], b[1]), pick(b[2], b[3]))
}

/// Shared body of the 32-block types: `$quants(blk)` gives the block's 32
/// quants as two i8x16 (offsets applied); `$min` says whether the block
/// stores a min at byte 2 (Q4_1/Q5_1: value = d q + m).
macro_rules! kernel_32 {
    ($name:ident, $bytes:expr, $min:expr, |$blk:ident| $quants:expr) => {
        unsafe fn $name<D: Dot, const NR: usize>(
            w: *const u8,
            nb: usize,
            x: &[Act],
            out: &mut [f32],
        ) {
            let mut acc = [vdupq_n_f32(0.0); NR];
            let mut mins = [0f32; NR];
            for b in 0..nb {
                let $blk = w.add(b * $bytes);
                let d = f16_at($blk);
                let q: (int8x16_t, int8x16_t) = $quants;
                let m = if $min { f16_at($blk.add(2)) } else { 0.0 };
                for (i, xi) in x.iter().enumerate() {
                    let s = vcvtq_f32_s32(dot32::<D>(q, xi.qs.add(32 * b)));
                    acc[i] = vfmaq_n_f32(acc[i], s, d * *xi.d.add(b));
                    if $min {
                        mins[i] += m * *xi.s.add(b);
                    }
                }
            }
            for i in 0..NR {
                out[i] = vaddvq_f32(acc[i]) + mins[i];
            }
        }
    };
}

kernel_32!(q4_0, 18, false, |blk| {
    let (lo, hi) = nibbles(blk.add(2));
    let eight = vdupq_n_s8(8);
    (vsubq_s8(lo, eight), vsubq_s8(hi, eight))
});
kernel_32!(q4_1, 20, true, |blk| nibbles(blk.add(4)));
kernel_32!(q5_0, 22, false, |blk| {
    let (lo, hi) = nibbles(blk.add(6));
    let (h0, h1) = fifth_bits((blk.add(2) as *const u32).read_unaligned());
    let sixteen = vdupq_n_s8(16);
    (
        vsubq_s8(vorrq_s8(lo, h0), sixteen),
        vsubq_s8(vorrq_s8(hi, h1), sixteen),
    )
});
kernel_32!(q5_1, 24, true, |blk| {
    let (lo, hi) = nibbles(blk.add(8));
    let (h0, h1) = fifth_bits((blk.add(4) as *const u32).read_unaligned());
    (vorrq_s8(lo, h0), vorrq_s8(hi, h1))
});
kernel_32!(q8_0, 34, false, |blk| (
    vld1q_s8(blk.add(2) as *const i8),
    vld1q_s8(blk.add(18) as *const i8)
));
// Q8_1's stored sum is not needed: the activation side has its own.
kernel_32!(q8_1, 36, false, |blk| (
    vld1q_s8(blk.add(4) as *const i8),
    vld1q_s8(blk.add(20) as *const i8)
));

/// Q4_K, and Q5_K (`$five`: bit j of `qh[l]` is the fifth bit of value l
/// of sub-block j).
macro_rules! k4_kernel {
    ($name:ident, $bytes:expr, $qs_off:expr, $five:expr) => {
        unsafe fn $name<D: Dot, const NR: usize>(
            w: *const u8,
            nb: usize,
            x: &[Act],
            out: &mut [f32],
        ) {
            out.fill(0.0);
            for b in 0..nb {
                let blk = w.add(b * $bytes);
                let d = f16_at(blk);
                let dmin = f16_at(blk.add(2));
                let scales = std::slice::from_raw_parts(blk.add(4), 12);
                let mut isum = [0i32; NR];
                let mut mins = [0u8; 8];
                for (j, min) in mins.iter_mut().enumerate() {
                    let (sc, m) = scale_min_k4(j, scales);
                    *min = m;
                    let qp = blk.add($qs_off + 32 * (j / 2));
                    let (mut a, mut c) = (vld1q_u8(qp), vld1q_u8(qp.add(16)));
                    (a, c) = if j % 2 == 0 {
                        let low = vdupq_n_u8(0x0F);
                        (vandq_u8(a, low), vandq_u8(c, low))
                    } else {
                        (vshrq_n_u8::<4>(a), vshrq_n_u8::<4>(c))
                    };
                    if $five {
                        // Bit j of each qh byte to bit 4.
                        let shift = vdupq_n_s8(4 - j as i8);
                        let bit = |v: uint8x16_t| vandq_u8(vshlq_u8(v, shift), vdupq_n_u8(0x10));
                        a = vorrq_u8(a, bit(vld1q_u8(blk.add(16))));
                        c = vorrq_u8(c, bit(vld1q_u8(blk.add(32))));
                    }
                    let q = (vreinterpretq_s8_u8(a), vreinterpretq_s8_u8(c));
                    for (i, xi) in x.iter().enumerate() {
                        let s = vaddvq_s32(dot32::<D>(q, xi.qs.add(256 * b + 32 * j)));
                        isum[i] += sc as i32 * s;
                    }
                }
                for (i, xi) in x.iter().enumerate() {
                    let bs = xi.bs.add(16 * b);
                    let msum: i32 = (0..8)
                        .map(|j| {
                            mins[j] as i32 * (*bs.add(2 * j) as i32 + *bs.add(2 * j + 1) as i32)
                        })
                        .sum();
                    out[i] += *xi.d.add(b) * (d * isum[i] as f32 - dmin * msum as f32);
                }
            }
        }
    };
}

k4_kernel!(q4_k, 144, 16, false);
k4_kernel!(q5_k, 176, 48, true);

unsafe fn q8_k<D: Dot, const NR: usize>(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
    out.fill(0.0);
    for b in 0..nb {
        let blk = w.add(b * 292);
        let d = (blk as *const f32).read_unaligned();
        let mut isum = [vdupq_n_s32(0); NR];
        for c in 0..8 {
            let qp = blk.add(4 + 32 * c) as *const i8;
            let q = (vld1q_s8(qp), vld1q_s8(qp.add(16)));
            for (i, xi) in x.iter().enumerate() {
                isum[i] = vaddq_s32(isum[i], dot32::<D>(q, xi.qs.add(256 * b + 32 * c)));
            }
        }
        for (i, xi) in x.iter().enumerate() {
            out[i] += d * *xi.d.add(b) * vaddvq_s32(isum[i]) as f32;
        }
    }
}

/// Q2_K and Q3_K share a layout: in half h, shift pair j covers the 32
/// values `(qs[32h..32h + 32] >> 2j) & 3` (sub-blocks 8h + 2j and + 1).
/// `$quants(blk, qs0, qs1, h, j)` finishes them (Q3_K: the high bit).
macro_rules! k23_kernel {
    ($name:ident, $bytes:expr, $qs_off:expr, $d_off:expr, $has_min:expr,
     $scales:expr, |$blk:ident, $q0:ident, $q1:ident, $h:ident, $j:ident| $quants:expr) => {
        unsafe fn $name<D: Dot, const NR: usize>(
            w: *const u8,
            nb: usize,
            x: &[Act],
            out: &mut [f32],
        ) {
            out.fill(0.0);
            for b in 0..nb {
                let $blk = w.add(b * $bytes);
                let d = f16_at($blk.add($d_off));
                let scales: [i32; 16] = $scales;
                let mut isum = [0i32; NR];
                for $h in 0..2 {
                    let qp = $blk.add($qs_off + 32 * $h);
                    let (qs0, qs1) = (vld1q_u8(qp), vld1q_u8(qp.add(16)));
                    for $j in 0..4 {
                        let shift = vdupq_n_s8(-2 * $j as i8);
                        let three = vdupq_n_u8(3);
                        let $q0 = vandq_u8(vshlq_u8(qs0, shift), three);
                        let $q1 = vandq_u8(vshlq_u8(qs1, shift), three);
                        let q: (int8x16_t, int8x16_t) = $quants;
                        let is = 8 * $h + 2 * $j;
                        for (i, xi) in x.iter().enumerate() {
                            let xp = xi.qs.add(256 * b + 128 * $h + 32 * $j);
                            isum[i] += scales[is]
                                * vaddvq_s32(D::dot16(vdupq_n_s32(0), q.0, vld1q_s8(xp)))
                                + scales[is + 1]
                                    * vaddvq_s32(D::dot16(
                                        vdupq_n_s32(0),
                                        q.1,
                                        vld1q_s8(xp.add(16)),
                                    ));
                        }
                    }
                }
                for (i, xi) in x.iter().enumerate() {
                    let mut v = d * isum[i] as f32;
                    if $has_min {
                        // Q2_K: min m_is (high nibble) per 16 values, times dmin.
                        let bs = xi.bs.add(16 * b);
                        let msum: i32 = (0..16)
                            .map(|is| (*$blk.add(is) >> 4) as i32 * *bs.add(is) as i32)
                            .sum();
                        v -= f16_at($blk.add($d_off + 2)) * msum as f32;
                    }
                    out[i] += *xi.d.add(b) * v;
                }
            }
        }
    };
}

k23_kernel!(
    q2_k,
    84,
    16,
    80,
    true,
    std::array::from_fn(|is| (*blk.add(is) & 0xF) as i32),
    |blk, q0, q1, h, j| (vreinterpretq_s8_u8(q0), vreinterpretq_s8_u8(q1))
);
k23_kernel!(
    q3_k,
    110,
    32,
    108,
    false,
    q3k_scales(std::slice::from_raw_parts(blk.add(96), 12)).map(|v| v as i32),
    |blk, q0, q1, h, j| {
        // Stored as q2 - 4 where the hmask bit 4h + j is clear.
        let m = vdupq_n_u8(1 << (4 * h + j));
        let four = vdupq_n_u8(4);
        let high = |q: uint8x16_t, hm: *const u8| {
            let set = vandq_u8(vtstq_u8(vld1q_u8(hm), m), four);
            vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(q, set)), vdupq_n_s8(4))
        };
        (high(q0, blk), high(q1, blk.add(16)))
    }
);

unsafe fn q6_k<D: Dot, const NR: usize>(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
    out.fill(0.0);
    for b in 0..nb {
        let blk = w.add(b * 210);
        let sc = blk.add(192) as *const i8;
        let d = f16_at(blk.add(208));
        let mut isum = [0i32; NR];
        for h in 0..2 {
            let (ql, qh) = (blk.add(64 * h), blk.add(128 + 32 * h));
            let (qh0, qh1) = (vld1q_u8(qh), vld1q_u8(qh.add(16)));
            for k in 0..4 {
                // Quarter k: low or high nibbles of ql[0..32] or ql[32..64],
                // with bits 2k..2k+2 of qh as bits 4..6; stored +32.
                let lp = ql.add(32 * (k % 2));
                let (l0, l1) = (vld1q_u8(lp), vld1q_u8(lp.add(16)));
                let (l0, l1) = if k < 2 {
                    let low = vdupq_n_u8(0x0F);
                    (vandq_u8(l0, low), vandq_u8(l1, low))
                } else {
                    (vshrq_n_u8::<4>(l0), vshrq_n_u8::<4>(l1))
                };
                let shift = vdupq_n_s8(4 - 2 * k as i8); // bits 2k.. to bit 4
                let hb = |v: uint8x16_t| vandq_u8(vshlq_u8(v, shift), vdupq_n_u8(0x30));
                let thirty_two = vdupq_n_s8(32);
                let q = (
                    vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(l0, hb(qh0))), thirty_two),
                    vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(l1, hb(qh1))), thirty_two),
                );
                // Values 0..16 take scale 8h + 2k, 16..32 scale 8h + 2k + 1.
                let (sa, sb) = (
                    *sc.add(8 * h + 2 * k) as i32,
                    *sc.add(8 * h + 2 * k + 1) as i32,
                );
                for (i, xi) in x.iter().enumerate() {
                    let xp = xi.qs.add(256 * b + 128 * h + 32 * k);
                    isum[i] += sa * vaddvq_s32(D::dot16(vdupq_n_s32(0), q.0, vld1q_s8(xp)))
                        + sb * vaddvq_s32(D::dot16(vdupq_n_s32(0), q.1, vld1q_s8(xp.add(16))));
                }
            }
        }
        for (i, xi) in x.iter().enumerate() {
            out[i] += *xi.d.add(b) * d * isum[i] as f32;
        }
    }
}

/// Four f16 (8 bytes at `p`) as f32x4, exactly: the f16 bits moved into
/// f32 position and rescaled by 2^112 (which also normalises subnormals);
/// infinities and NaNs get the all-ones exponent back.
#[inline(always)]
unsafe fn f16x4(p: *const u8) -> float32x4_t {
    let h = vmovl_u16(vreinterpret_u16_u8(vld1_u8(p)));
    let magnitude = vshlq_n_u32::<13>(vandq_u32(h, vdupq_n_u32(0x7FFF)));
    let scaled = vmulq_f32(
        vreinterpretq_f32_u32(magnitude),
        vdupq_n_f32(f32::from_bits(0x7780_0000)),
    );
    let inf_nan = vceqq_u32(vandq_u32(h, vdupq_n_u32(0x7C00)), vdupq_n_u32(0x7C00));
    let v = vbslq_u32(
        inf_nan,
        vorrq_u32(magnitude, vdupq_n_u32(0x7F80_0000)),
        vreinterpretq_u32_f32(scaled),
    );
    let sign = vshlq_n_u32::<16>(vandq_u32(h, vdupq_n_u32(0x8000)));
    vreinterpretq_f32_u32(vorrq_u32(v, sign))
}

/// Four bf16 (8 bytes at `p`) as f32x4.
#[inline(always)]
unsafe fn bf16x4(p: *const u8) -> float32x4_t {
    vreinterpretq_f32_u32(vshlq_n_u32::<16>(vmovl_u16(vreinterpret_u16_u8(vld1_u8(
        p,
    )))))
}

/// Float weights (`n` = elements, `$esize` bytes each; `$load` gives four
/// as f32x4): four lanes of partial sums per activation row.
macro_rules! float_kernel {
    ($name:ident, $esize:expr, $load:expr, $one:expr) => {
        unsafe fn $name<const NR: usize>(w: *const u8, n: usize, x: &[Act], out: &mut [f32]) {
            let mut acc = [vdupq_n_f32(0.0); NR];
            let mut k = 0;
            while k + 4 <= n {
                let wv = $load(w.add($esize * k));
                for (i, xi) in x.iter().enumerate() {
                    acc[i] = vfmaq_f32(acc[i], wv, vld1q_f32(xi.f.add(k)));
                }
                k += 4;
            }
            for (i, xi) in x.iter().enumerate() {
                let mut s = vaddvq_f32(acc[i]);
                for t in k..n {
                    s += $one(w.add($esize * t)) * *xi.f.add(t);
                }
                out[i] = s;
            }
        }
    };
}

float_kernel!(
    f32w,
    4,
    |p: *const u8| vreinterpretq_f32_u8(vld1q_u8(p)),
    |p: *const u8| (p as *const f32).read_unaligned()
);
float_kernel!(f16w, 2, |p| f16x4(p), |p| f16_at(p));
float_kernel!(bf16w, 2, |p| bf16x4(p), |p: *const u8| f32::from_bits(
    ((p as *const u16).read_unaligned() as u32) << 16
));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_and_bf16_conversions_are_exact_for_every_bit_pattern() {
        for bits in (0..=u16::MAX).step_by(4) {
            let h: [u16; 4] = std::array::from_fn(|i| bits + i as u16);
            let bytes: Vec<u8> = h.iter().flat_map(|v| v.to_le_bytes()).collect();
            let mut got = [0f32; 4];
            // SAFETY: 8 readable bytes; 16 writable.
            unsafe {
                vst1q_f32(got.as_mut_ptr(), f16x4(bytes.as_ptr()));
                for (i, &v) in h.iter().enumerate() {
                    let want = half::f16::from_bits(v).to_f32();
                    assert!(
                        got[i].to_bits() == want.to_bits() || (want.is_nan() && got[i].is_nan()),
                        "f16 {v:#06x}: {} vs {want}",
                        got[i]
                    );
                }
                vst1q_f32(got.as_mut_ptr(), bf16x4(bytes.as_ptr()));
                for (i, &v) in h.iter().enumerate() {
                    assert_eq!(got[i].to_bits(), (v as u32) << 16);
                }
            }
        }
    }
}
