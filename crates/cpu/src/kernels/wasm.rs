//! wasm32 simd128 kernels (compiled in when the build enables `simd128`,
//! which every current browser runs; wasm has no run-time feature check).
//!
//! simd128 has no 8-bit dot product, so weights are widened to i16 (K-quant
//! weights pre-multiplied by their sub-block scale, which fits) and dotted
//! with the widened activations by `i32x4.dot_i16x8_s`. Integer sums are
//! exact; each block's float step follows the scalar kernel's formula, so
//! results match it within float reassociation. Every weight type has one.

use super::scalar::{f16_at, q3k_scales, scale_min_k4};
use super::{by_nr, Act, Kernel};
use blockdraft_gguf::GgmlType;
use core::arch::wasm32::*;

/// The simd128 kernel for `ty`, if there is one.
pub(crate) fn kernel(ty: GgmlType) -> Option<Kernel> {
    use GgmlType::*;
    Some(match ty {
        Q4_0 => by_nr!(q4_0),
        Q4_1 => by_nr!(q4_1),
        Q5_0 => by_nr!(q5_0),
        Q5_1 => by_nr!(q5_1),
        Q8_0 => by_nr!(q8_0),
        Q8_1 => by_nr!(q8_1),
        Q2_K => by_nr!(q2_k),
        Q3_K => by_nr!(q3_k),
        Q4_K => by_nr!(q4_k),
        Q5_K => by_nr!(q5_k),
        Q6_K => by_nr!(q6_k),
        Q8_K => by_nr!(q8_k),
        F32 => by_nr!(f32w),
        F16 => by_nr!(f16w),
        BF16 => by_nr!(bf16w),
        _ => return None,
    })
}

#[inline(always)]
unsafe fn load(p: *const u8) -> v128 {
    v128_load(p as *const v128)
}

#[inline(always)]
fn hsum_f32(v: v128) -> f32 {
    (f32x4_extract_lane::<0>(v) + f32x4_extract_lane::<1>(v))
        + (f32x4_extract_lane::<2>(v) + f32x4_extract_lane::<3>(v))
}

#[inline(always)]
fn hsum_i32(v: v128) -> i32 {
    i32x4_extract_lane::<0>(v)
        + i32x4_extract_lane::<1>(v)
        + i32x4_extract_lane::<2>(v)
        + i32x4_extract_lane::<3>(v)
}

/// 32 signed bytes (values 0..16 in `a`, 16..32 in `b`) as four i16x8.
#[inline(always)]
fn widen_i8(a: v128, b: v128) -> [v128; 4] {
    [
        i16x8_extend_low_i8x16(a),
        i16x8_extend_high_i8x16(a),
        i16x8_extend_low_i8x16(b),
        i16x8_extend_high_i8x16(b),
    ]
}

/// 32 unsigned bytes as four i16x8.
#[inline(always)]
fn widen_u8(a: v128, b: v128) -> [v128; 4] {
    [
        i16x8_extend_low_u8x16(a),
        i16x8_extend_high_u8x16(a),
        i16x8_extend_low_u8x16(b),
        i16x8_extend_high_u8x16(b),
    ]
}

/// `sum_k w[k] * x[k]` over 32 values as i32x4 partial sums; `w` widened,
/// `xp` the 32 activation quants, widened too (`Act::qs16`).
#[inline(always)]
unsafe fn dot32(w: &[v128; 4], xp: *const i16) -> v128 {
    let x = |k: usize| v128_load(xp.add(8 * k) as *const v128);
    i32x4_add(
        i32x4_add(i32x4_dot_i16x8(w[0], x(0)), i32x4_dot_i16x8(w[1], x(1))),
        i32x4_add(i32x4_dot_i16x8(w[2], x(2)), i32x4_dot_i16x8(w[3], x(3))),
    )
}

/// The 16 bytes at `p` as low nibbles (values 0..16) and high nibbles (16..32).
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> (v128, v128) {
    let q = load(p);
    (v128_and(q, u8x16_splat(0x0F)), u8x16_shr(q, 4))
}

/// `0x10` in byte k (of 32) where bit k of `bits` is set: the fifth bit of
/// Q5_0/Q5_1 quants.
#[inline(always)]
fn fifth_bits(bits: u32) -> (v128, v128) {
    let v = u32x4_splat(bits);
    let mask = u8x16(1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128);
    let pick = |b0: u8, b1: u8| {
        let spread = u8x16_swizzle(
            v,
            u8x16(
                b0, b0, b0, b0, b0, b0, b0, b0, b1, b1, b1, b1, b1, b1, b1, b1,
            ),
        );
        v128_and(u8x16_eq(v128_and(spread, mask), mask), u8x16_splat(0x10))
    };
    (pick(0, 1), pick(2, 3))
}

/// Shared body of the 32-block types: `$quants(blk)` gives the block's 32
/// quants as four i16x8 (offsets applied); `$min` says whether the block
/// stores a min at byte 2 (Q4_1/Q5_1: value = d q + m).
macro_rules! kernel_32 {
    ($name:ident, $bytes:expr, $min:expr, |$blk:ident| $quants:expr) => {
        unsafe fn $name<const NR: usize>(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
            let mut acc = [f32x4_splat(0.0); NR];
            let mut mins = [0f32; NR];
            for b in 0..nb {
                let $blk = w.add(b * $bytes);
                let d = f16_at($blk);
                let q: [v128; 4] = $quants;
                let m = if $min { f16_at($blk.add(2)) } else { 0.0 };
                for (i, xi) in x.iter().enumerate() {
                    let s = dot32(&q, xi.qs16.add(32 * b));
                    let scale = f32x4_splat(d * *xi.d.add(b));
                    acc[i] = f32x4_add(acc[i], f32x4_mul(f32x4_convert_i32x4(s), scale));
                    if $min {
                        mins[i] += m * *xi.s.add(b);
                    }
                }
            }
            for i in 0..NR {
                out[i] = hsum_f32(acc[i]) + mins[i];
            }
        }
    };
}

kernel_32!(q4_0, 18, false, |blk| {
    let (lo, hi) = nibbles(blk.add(2));
    let eight = i8x16_splat(8);
    widen_i8(i8x16_sub(lo, eight), i8x16_sub(hi, eight))
});
kernel_32!(q4_1, 20, true, |blk| {
    let (lo, hi) = nibbles(blk.add(4));
    widen_u8(lo, hi)
});
kernel_32!(q5_0, 22, false, |blk| {
    let (lo, hi) = nibbles(blk.add(6));
    let (h0, h1) = fifth_bits((blk.add(2) as *const u32).read_unaligned());
    let sixteen = i8x16_splat(16);
    widen_i8(
        i8x16_sub(v128_or(lo, h0), sixteen),
        i8x16_sub(v128_or(hi, h1), sixteen),
    )
});
kernel_32!(q5_1, 24, true, |blk| {
    let (lo, hi) = nibbles(blk.add(8));
    let (h0, h1) = fifth_bits((blk.add(4) as *const u32).read_unaligned());
    widen_u8(v128_or(lo, h0), v128_or(hi, h1))
});
kernel_32!(q8_0, 34, false, |blk| widen_i8(
    load(blk.add(2)),
    load(blk.add(18))
));
// Q8_1's stored sum is not needed: the activation side has its own.
kernel_32!(q8_1, 36, false, |blk| widen_i8(
    load(blk.add(4)),
    load(blk.add(20))
));

/// Q4_K, and Q5_K (`$five`: bit j of `qh[l]` is the fifth bit of value l
/// of sub-block j).
macro_rules! k4_kernel {
    ($name:ident, $bytes:expr, $qs_off:expr, $five:expr) => {
        unsafe fn $name<const NR: usize>(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
            out.fill(0.0);
            for b in 0..nb {
                let blk = w.add(b * $bytes);
                let d = f16_at(blk);
                let dmin = f16_at(blk.add(2));
                let scales = std::slice::from_raw_parts(blk.add(4), 12);
                let mut isum = [i32x4_splat(0); NR];
                let mut mins = [0u8; 8];
                for (j, min) in mins.iter_mut().enumerate() {
                    let (sc, m) = scale_min_k4(j, scales);
                    *min = m;
                    let qp = blk.add($qs_off + 32 * (j / 2));
                    let (mut a, mut c) = (load(qp), load(qp.add(16)));
                    (a, c) = if j % 2 == 0 {
                        (
                            v128_and(a, u8x16_splat(0x0F)),
                            v128_and(c, u8x16_splat(0x0F)),
                        )
                    } else {
                        (u8x16_shr(a, 4), u8x16_shr(c, 4))
                    };
                    if $five {
                        let bit = |v: v128| {
                            v128_and(u8x16_shl(u8x16_shr(v, j as u32), 4), u8x16_splat(0x10))
                        };
                        a = v128_or(a, bit(load(blk.add(16))));
                        c = v128_or(c, bit(load(blk.add(32))));
                    }
                    // q * scale <= 31 * 63 fits i16.
                    let s = i16x8_splat(sc as i16);
                    let q = widen_u8(a, c).map(|v| i16x8_mul(v, s));
                    for (i, xi) in x.iter().enumerate() {
                        isum[i] = i32x4_add(isum[i], dot32(&q, xi.qs16.add(256 * b + 32 * j)));
                    }
                }
                for (i, xi) in x.iter().enumerate() {
                    let bs = xi.bs.add(16 * b);
                    let msum: i32 = (0..8)
                        .map(|j| {
                            mins[j] as i32 * (*bs.add(2 * j) as i32 + *bs.add(2 * j + 1) as i32)
                        })
                        .sum();
                    out[i] += *xi.d.add(b) * (d * hsum_i32(isum[i]) as f32 - dmin * msum as f32);
                }
            }
        }
    };
}

k4_kernel!(q4_k, 144, 16, false);
k4_kernel!(q5_k, 176, 48, true);

unsafe fn q8_k<const NR: usize>(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
    out.fill(0.0);
    for b in 0..nb {
        let blk = w.add(b * 292);
        let d = (blk as *const f32).read_unaligned();
        let mut isum = [i32x4_splat(0); NR];
        for c in 0..8 {
            let qp = blk.add(4 + 32 * c);
            let q = widen_i8(load(qp), load(qp.add(16)));
            for (i, xi) in x.iter().enumerate() {
                isum[i] = i32x4_add(isum[i], dot32(&q, xi.qs16.add(256 * b + 32 * c)));
            }
        }
        for (i, xi) in x.iter().enumerate() {
            out[i] += d * *xi.d.add(b) * hsum_i32(isum[i]) as f32;
        }
    }
}

/// Q2_K and Q3_K share a layout: in half h, shift pair j covers the 32
/// values `(qs[32h..32h + 32] >> 2j) & 3` (sub-blocks 8h + 2j and + 1).
/// `$quants(blk, qs0, qs1, h, j)` finishes them (Q3_K: the high bit).
macro_rules! k23_kernel {
    ($name:ident, $bytes:expr, $qs_off:expr, $d_off:expr, $has_min:expr,
     $scales:expr, |$blk:ident, $q0:ident, $q1:ident, $h:ident, $j:ident| $quants:expr) => {
        unsafe fn $name<const NR: usize>(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
            out.fill(0.0);
            for b in 0..nb {
                let $blk = w.add(b * $bytes);
                let d = f16_at($blk.add($d_off));
                let scales: [i16; 16] = $scales;
                let mut isum = [i32x4_splat(0); NR];
                for $h in 0..2 {
                    let qp = $blk.add($qs_off + 32 * $h);
                    let (qs0, qs1) = (load(qp), load(qp.add(16)));
                    for $j in 0..4 {
                        let three = u8x16_splat(3);
                        let $q0 = v128_and(u8x16_shr(qs0, 2 * $j as u32), three);
                        let $q1 = v128_and(u8x16_shr(qs1, 2 * $j as u32), three);
                        let (a, c): (v128, v128) = $quants;
                        // Values 0..16 take sub-block scale 8h + 2j, 16..32
                        // the next; |q * scale| <= 4 * 32 fits i16.
                        let is = 8 * $h + 2 * $j;
                        let (sa, sb) = (i16x8_splat(scales[is]), i16x8_splat(scales[is + 1]));
                        let q = widen_i8(a, c);
                        let q = [
                            i16x8_mul(q[0], sa),
                            i16x8_mul(q[1], sa),
                            i16x8_mul(q[2], sb),
                            i16x8_mul(q[3], sb),
                        ];
                        for (i, xi) in x.iter().enumerate() {
                            let xp = xi.qs16.add(256 * b + 128 * $h + 32 * $j);
                            isum[i] = i32x4_add(isum[i], dot32(&q, xp));
                        }
                    }
                }
                for (i, xi) in x.iter().enumerate() {
                    let mut v = d * hsum_i32(isum[i]) as f32;
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
    std::array::from_fn(|is| (*blk.add(is) & 0xF) as i16),
    |blk, q0, q1, h, j| (q0, q1)
);
k23_kernel!(
    q3_k,
    110,
    32,
    108,
    false,
    q3k_scales(std::slice::from_raw_parts(blk.add(96), 12)).map(|v| v as i16),
    |blk, q0, q1, h, j| {
        // Stored as q2 - 4 where the hmask bit 4h + j is clear.
        let m = u8x16_splat(1 << (4 * h + j));
        let high = |q: v128, hm: *const u8| {
            let set = v128_and(
                u8x16_ne(v128_and(load(hm), m), u8x16_splat(0)),
                u8x16_splat(4),
            );
            i8x16_sub(v128_or(q, set), i8x16_splat(4))
        };
        (high(q0, blk), high(q1, blk.add(16)))
    }
);

unsafe fn q6_k<const NR: usize>(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
    out.fill(0.0);
    for b in 0..nb {
        let blk = w.add(b * 210);
        let sc = blk.add(192) as *const i8;
        let d = f16_at(blk.add(208));
        let mut isum = [i32x4_splat(0); NR];
        for h in 0..2 {
            let (ql, qh) = (blk.add(64 * h), blk.add(128 + 32 * h));
            let (qh0, qh1) = (load(qh), load(qh.add(16)));
            for k in 0..4 {
                // Quarter k: low or high nibbles of ql[0..32] or ql[32..64],
                // with bits 2k..2k+2 of qh as bits 4..6; stored +32.
                let lp = ql.add(32 * (k % 2));
                let (l0, l1) = (load(lp), load(lp.add(16)));
                let (l0, l1) = if k < 2 {
                    (
                        v128_and(l0, u8x16_splat(0x0F)),
                        v128_and(l1, u8x16_splat(0x0F)),
                    )
                } else {
                    (u8x16_shr(l0, 4), u8x16_shr(l1, 4))
                };
                let hb =
                    |v: v128| v128_and(u8x16_shl(u8x16_shr(v, 2 * k as u32), 4), u8x16_splat(0x30));
                let thirty_two = i8x16_splat(32);
                let q = widen_i8(
                    i8x16_sub(v128_or(l0, hb(qh0)), thirty_two),
                    i8x16_sub(v128_or(l1, hb(qh1)), thirty_two),
                );
                // Values 0..16 take scale 8h + 2k, 16..32 scale 8h + 2k + 1;
                // |q * scale| <= 32 * 128 fits i16.
                let (sa, sb) = (
                    i16x8_splat(*sc.add(8 * h + 2 * k) as i16),
                    i16x8_splat(*sc.add(8 * h + 2 * k + 1) as i16),
                );
                let q = [
                    i16x8_mul(q[0], sa),
                    i16x8_mul(q[1], sa),
                    i16x8_mul(q[2], sb),
                    i16x8_mul(q[3], sb),
                ];
                for (i, xi) in x.iter().enumerate() {
                    let xp = xi.qs16.add(256 * b + 128 * h + 32 * k);
                    isum[i] = i32x4_add(isum[i], dot32(&q, xp));
                }
            }
        }
        for (i, xi) in x.iter().enumerate() {
            out[i] += *xi.d.add(b) * d * hsum_i32(isum[i]) as f32;
        }
    }
}

/// Four f16 (8 bytes at `p`) as f32x4, exactly: the f16 bits moved into
/// f32 position and rescaled by 2^112 (which also normalises subnormals);
/// infinities and NaNs get the all-ones exponent back.
#[inline(always)]
unsafe fn f16x4(p: *const u8) -> v128 {
    let h = u32x4_extend_low_u16x8(v128_load64_zero(p as *const u64));
    let magnitude = u32x4_shl(v128_and(h, u32x4_splat(0x7FFF)), 13);
    let scaled = f32x4_mul(magnitude, f32x4_splat(f32::from_bits(0x7780_0000)));
    let inf_nan = u32x4_eq(v128_and(h, u32x4_splat(0x7C00)), u32x4_splat(0x7C00));
    let v = v128_bitselect(
        v128_or(magnitude, u32x4_splat(0x7F80_0000)),
        scaled,
        inf_nan,
    );
    v128_or(v, u32x4_shl(v128_and(h, u32x4_splat(0x8000)), 16))
}

/// Four bf16 (8 bytes at `p`) as f32x4.
#[inline(always)]
unsafe fn bf16x4(p: *const u8) -> v128 {
    u32x4_shl(
        u32x4_extend_low_u16x8(v128_load64_zero(p as *const u64)),
        16,
    )
}

/// Float weights (`n` = elements, `$esize` bytes each; `$load` gives four
/// as f32x4): four lanes of partial sums per activation row.
macro_rules! float_kernel {
    ($name:ident, $esize:expr, $load:expr, $one:expr) => {
        unsafe fn $name<const NR: usize>(w: *const u8, n: usize, x: &[Act], out: &mut [f32]) {
            let mut acc = [f32x4_splat(0.0); NR];
            let mut k = 0;
            while k + 4 <= n {
                let wv = $load(w.add($esize * k));
                for (i, xi) in x.iter().enumerate() {
                    let xv = load(xi.f.add(k) as *const u8);
                    acc[i] = f32x4_add(acc[i], f32x4_mul(wv, xv));
                }
                k += 4;
            }
            for (i, xi) in x.iter().enumerate() {
                let mut s = hsum_f32(acc[i]);
                for t in k..n {
                    s += $one(w.add($esize * t)) * *xi.f.add(t);
                }
                out[i] = s;
            }
        }
    };
}

float_kernel!(f32w, 4, |p: *const u8| load(p), |p: *const u8| (p
    as *const f32)
    .read_unaligned());
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
                v128_store(got.as_mut_ptr() as *mut v128, f16x4(bytes.as_ptr()));
                for (i, &v) in h.iter().enumerate() {
                    let want = half::f16::from_bits(v).to_f32();
                    assert!(
                        got[i].to_bits() == want.to_bits() || (want.is_nan() && got[i].is_nan()),
                        "f16 {v:#06x}: {} vs {want}",
                        got[i]
                    );
                }
                v128_store(got.as_mut_ptr() as *mut v128, bf16x4(bytes.as_ptr()));
                for (i, &v) in h.iter().enumerate() {
                    assert_eq!(got[i].to_bits(), (v as u32) << 16);
                }
            }
        }
    }
}
