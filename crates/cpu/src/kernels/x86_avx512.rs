//! AVX-512 kernels that take two weight rows per 512-bit vector: row j in
//! the low 256 bits, row j + 1 in the high, the activation broadcast to
//! both halves. Each half runs exactly the instructions of the AVX2 row
//! kernel on its row (the shuffles used are per 128-bit lane, or given
//! per-half indices), so each output keeps that kernel's float sequence
//! bit for bit, while one instruction does the work of two: what makes a
//! verify batch cheap where the 256-bit kernels run out of issue slots.
//! Q6_K and the 32-block types (Q4_0 .. Q8_1) have one.

use super::x86::avx512::{self, load};
use super::x86::{hsum, prefetch_ahead};
use super::{tile_kernel, Act, Kernel};
use blockdraft_gguf::GgmlType;
use std::arch::x86_64::*;

/// The kernel for `ty` built this way, where there is one.
pub(crate) fn kernel(ty: GgmlType) -> Option<Kernel> {
    use GgmlType::*;
    Some(match ty {
        Q4_0 => pairs_kernel!(q4_0_pair, avx512::q4_0),
        Q4_1 => pairs_kernel!(q4_1_pair, avx512::q4_1),
        Q5_0 => pairs_kernel!(q5_0_pair, avx512::q5_0),
        Q5_1 => pairs_kernel!(q5_1_pair, avx512::q5_1),
        Q8_0 => pairs_kernel!(q8_0_pair, avx512::q8_0),
        Q8_1 => pairs_kernel!(q8_1_pair, avx512::q8_1),
        Q6_K => pairs_kernel!(q6_k_pair, avx512::q6_k),
        _ => return None,
    })
}

/// The [`Kernel`] running `$pair` (two weight rows for NR activation rows)
/// over `nw` weight rows, a last odd row through the 256-bit `$row`.
macro_rules! pairs_kernel {
    ($pair:ident, $($row:ident)::+) => {{
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        unsafe fn each<const NR: usize>(
            w: *const u8,
            row_bytes: usize,
            nw: usize,
            nb: usize,
            x: &[Act],
            out: *mut f32,
            ldo: usize,
        ) {
            let x: &[Act; NR] = x.try_into().unwrap_unchecked();
            let mut j = 0;
            while j + 2 <= nw {
                let r = $pair::<NR>(w.add(j * row_bytes), w.add((j + 1) * row_bytes), nb, x);
                for (i, &(a, b)) in r.iter().enumerate() {
                    *out.add(i * ldo + j) = a;
                    *out.add(i * ldo + j + 1) = b;
                }
                j += 2;
            }
            if j < nw {
                let mut r = [0f32; NR];
                $($row)::+::<NR>(w.add(j * row_bytes), nb, x, &mut r);
                for (i, &v) in r.iter().enumerate() {
                    *out.add(i * ldo + j) = v;
                }
            }
        }
        tile_kernel!(each)
    }};
}
use pairs_kernel;

/// 32 bytes at `a` in the low half, 32 at `b` in the high.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn halves(a: __m256i, b: __m256i) -> __m512i {
    _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1)
}

/// Eight f32 lanes of `a` in the low half, of `b` in the high.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn halves_ps(a: __m256, b: __m256) -> __m512 {
    _mm512_castpd_ps(_mm512_insertf64x4(
        _mm512_castpd256_pd512(_mm256_castps_pd(a)),
        _mm256_castps_pd(b),
        1,
    ))
}

/// Each half's horizontal sum, as the 256-bit kernels take it.
#[target_feature(enable = "avx2,fma,avx512f")]
#[inline]
unsafe fn hsum_halves(v: __m512) -> (f32, f32) {
    let lo = _mm512_castps512_ps256(v);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    (hsum(lo), hsum(hi))
}

/// `x86`'s `q6_k` for weight rows `w0` (low half) and `w1` (high half):
/// per super-block the same i32 lanes per half (maddubs, madd with the
/// scale pairs, minus `32 * sum_g sc_g bsum_g`), `fma(lanes, d * dx, acc)`,
/// and the same horizontal sum of each half at the end.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn q6_k_pair<const NR: usize>(
    w0: *const u8,
    w1: *const u8,
    nb: usize,
    x: &[Act; NR],
) -> [(f32, f32); NR] {
    let mut acc = [_mm512_setzero_ps(); NR];
    let low4 = _mm512_set1_epi8(0x0F);
    let low2 = _mm512_set1_epi8(0x03);
    for b in 0..nb {
        let (b0, b1) = (w0.add(b * 210), w1.add(b * 210));
        prefetch_ahead(b0, 210, 0, 1);
        prefetch_ahead(b1, 210, 0, 1);
        let both = |off: usize| halves(load(b0.add(off)), load(b1.add(off)));
        let (d0, d1) = (avx512::h2f(b0.add(208)), avx512::h2f(b1.add(208)));
        let scales = |p: *const u8| _mm256_cvtepi8_epi16(_mm_loadu_si128(p as *const __m128i));
        let sc16 = halves(scales(b0.add(192)), scales(b1.add(192)));
        let dup_lo = _mm512_unpacklo_epi16(sc16, sc16);
        let dup_hi = _mm512_unpackhi_epi16(sc16, sc16);
        let mut sum = [_mm512_setzero_si512(); NR];
        for h in 0..2 {
            let ql0 = both(64 * h);
            let ql1 = both(64 * h + 32);
            let qh = both(128 + 32 * h);
            let bits = |ql: __m512i, ql_shift: u32, qh_shift: u32| {
                let lo = _mm512_and_si512(
                    _mm512_srl_epi16(ql, _mm_cvtsi32_si128(ql_shift as i32)),
                    low4,
                );
                let hi = _mm512_and_si512(
                    _mm512_srl_epi16(qh, _mm_cvtsi32_si128(qh_shift as i32)),
                    low2,
                );
                _mm512_or_si512(lo, _mm512_slli_epi16(hi, 4))
            };
            let q = [
                bits(ql0, 0, 0),
                bits(ql1, 0, 2),
                bits(ql0, 4, 4),
                bits(ql1, 4, 6),
            ];
            // The AVX2 kernel's cross-lane permute of the doubled scales,
            // with each half's indices kept inside that half.
            let (o0, o1) = (4 * h as i32, 4 * h as i32 + 1);
            let (o2, o3) = (4 * h as i32 + 2, 4 * h as i32 + 3);
            let perm = |v: __m512i, a: i32, b: i32| {
                let (c, d) = (a + 8, b + 8);
                let idx = _mm512_setr_epi32(a, a, a, a, b, b, b, b, c, c, c, c, d, d, d, d);
                _mm512_permutexvar_epi32(idx, v)
            };
            let s = [
                perm(dup_lo, o0, o1),
                perm(dup_lo, o2, o3),
                perm(dup_hi, o0, o1),
                perm(dup_hi, o2, o3),
            ];
            for i in 0..NR {
                let xp = x[i].qs.add(256 * b + 128 * h) as *const u8;
                for k in 0..4 {
                    let xv = _mm512_broadcast_i64x4(load(xp.add(32 * k)));
                    let p = _mm512_maddubs_epi16(q[k], xv);
                    sum[i] = _mm512_add_epi32(sum[i], _mm512_madd_epi16(p, s[k]));
                }
            }
        }
        let dd = halves_ps(_mm256_set1_ps(d0), _mm256_set1_ps(d1));
        for i in 0..NR {
            let bs = _mm512_broadcast_i64x4(load(x[i].bs.add(16 * b) as *const u8));
            let off = _mm512_slli_epi32(_mm512_madd_epi16(bs, sc16), 5);
            let s = _mm512_cvtepi32_ps(_mm512_sub_epi32(sum[i], off));
            // d * dx lane-wise: the same product as the scalar one.
            let d = _mm512_mul_ps(dd, _mm512_set1_ps(*x[i].d.add(b)));
            acc[i] = _mm512_fmadd_ps(s, d, acc[i]);
        }
    }
    std::array::from_fn(|i| hsum_halves(acc[i]))
}

/// `x86`'s `kernel_32` (the 32-block types, llama.cpp's float sequence)
/// for weight rows `w0` (low half) and `w1` (high half). AVX-512 has no
/// `vpsignb`: the activation takes the weight's sign by a masked negate,
/// which gives the same lanes (where a weight is 0 its |w| is 0 too).
macro_rules! pair_32 {
    ($name:ident, $bytes:expr, $unpack:path, $offset:expr, $has_min:expr) => {
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        #[inline]
        unsafe fn $name<const NR: usize>(
            w0: *const u8,
            w1: *const u8,
            nb: usize,
            x: &[Act; NR],
        ) -> [(f32, f32); NR] {
            let mut acc = [_mm512_setzero_ps(); NR];
            let mut summs = [(0f32, 0f32); NR];
            let zero = _mm512_setzero_si512();
            for b in 0..nb {
                let (b0, b1) = (w0.add(b * $bytes), w1.add(b * $bytes));
                prefetch_ahead(b0, $bytes, 0, 1);
                prefetch_ahead(b1, $bytes, 0, 1);
                let dw = halves_ps(avx512::h2f8(b0), avx512::h2f8(b1));
                let q = halves($unpack(b0), $unpack(b1));
                let q = if $offset != 0 {
                    _mm512_sub_epi8(q, _mm512_set1_epi8($offset))
                } else {
                    q
                };
                let (qa, negative) = (_mm512_abs_epi8(q), _mm512_movepi8_mask(q));
                let (m0, m1) = if $has_min {
                    (avx512::h2f(b0.add(2)), avx512::h2f(b1.add(2)))
                } else {
                    (0.0, 0.0)
                };
                for i in 0..NR {
                    let xv = _mm512_broadcast_i64x4(load(x[i].qs.add(32 * b) as *const u8));
                    let lanes = if $has_min {
                        _mm512_dpbusd_epi32(zero, q, xv)
                    } else {
                        let signed = _mm512_mask_sub_epi8(xv, negative, zero, xv);
                        _mm512_dpbusd_epi32(zero, qa, signed)
                    };
                    let d = _mm512_mul_ps(dw, _mm512_set1_ps(*x[i].d.add(b)));
                    acc[i] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(lanes), acc[i]);
                    if $has_min {
                        let s = *x[i].s.add(b);
                        summs[i] = (m0.mul_add(s, summs[i].0), m1.mul_add(s, summs[i].1));
                    }
                }
            }
            std::array::from_fn(|i| {
                let (a, b) = hsum_halves(acc[i]);
                (a + summs[i].0, b + summs[i].1)
            })
        }
    };
}

pair_32!(q8_0_pair, 34, avx512::unpack_q8_0, 0, false);
pair_32!(q8_1_pair, 36, avx512::unpack_q8_1, 0, false);
pair_32!(q4_0_pair, 18, avx512::unpack_q4_0, 8, false);
pair_32!(q5_0_pair, 22, avx512::unpack_q5_0, 16, false);
pair_32!(q4_1_pair, 20, avx512::unpack_q4_1, 0, true);
pair_32!(q5_1_pair, 24, avx512::unpack_q5_1, 0, true);
