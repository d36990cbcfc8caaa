//! AVX-512 kernels that take two weight rows per 512-bit vector: row j in
//! the low 256 bits, row j + 1 in the high, the activation broadcast to
//! both halves. Each half runs exactly the instructions of the AVX2 row
//! kernel on its row (the shuffles used are per 128-bit lane, or given
//! per-half indices), so each output keeps that kernel's float sequence
//! bit for bit, while one instruction does the work of two: what makes a
//! verify batch cheap where the 256-bit kernels run out of issue slots.
//! Q2_K, Q3_K, Q5_K, Q6_K and the 32-block types (Q4_0 .. Q8_1) have one
//! (Q4_K's packed kernel in `x86_packed` is faster still; Q8_K is an
//! activation type, rare as a weight).

use super::x86::avx512::{self, load};
use super::x86::{hsum, k4_scales, prefetch_ahead, q3_scales_i8};
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
        Q5_K => pairs_kernel!(q5_k_pair, avx512::q5_k, one_row_by_rows),
        Q3_K => pairs_kernel!(q3_k_pair, avx512::q3_k, one_row_by_rows),
        Q2_K => pairs_kernel!(q2_k_pair, avx512::q2_k),
        _ => return None,
    })
}

/// The [`Kernel`] running `$pair` (two weight rows for NR activation rows)
/// over `nw` weight rows, a last odd row through the 256-bit `$row`; with
/// `one_row_by_rows`, a single activation row goes through `$row` alone
/// (Q5_K's and Q3_K's pairs decode one row 13-30 % slower on Zen 4, where a
/// 512-bit shuffle or insert costs two 256-bit ones and one row leaves
/// nothing to share).
macro_rules! pairs_kernel {
    ($pair:ident, $($row:ident)::+) => {
        pairs_kernel!($pair, $($row)::+, false)
    };
    ($pair:ident, $($row:ident)::+, one_row_by_rows) => {
        pairs_kernel!($pair, $($row)::+, true)
    };
    ($pair:ident, $($row:ident)::+, $one_by_rows:expr) => {{
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
            while j + 2 <= nw && !($one_by_rows && NR == 1) {
                let r = $pair::<NR>(w.add(j * row_bytes), w.add((j + 1) * row_bytes), nb, x);
                for (i, &(a, b)) in r.iter().enumerate() {
                    *out.add(i * ldo + j) = a;
                    *out.add(i * ldo + j + 1) = b;
                }
                j += 2;
            }
            while j < nw {
                let mut r = [0f32; NR];
                $($row)::+::<NR>(w.add(j * row_bytes), nb, x, &mut r);
                for (i, &v) in r.iter().enumerate() {
                    *out.add(i * ldo + j) = v;
                }
                j += 1;
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
        add_offset_block::<NR, 5>(&mut acc, &sum, x, b, sc16, dd);
    }
    std::array::from_fn(|i| hsum_halves(acc[i]))
}

/// The end of a Q6_K or Q3_K super-block `b` (quants stored with an offset
/// of `2^SHIFT`): per activation row, `fma(sum - (sum_g sc_g bsum_g) <<
/// SHIFT, d * dx, acc)`, each half with its row's scales `sc16` and `d` in
/// `dd`, as the AVX2 kernels take it.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn add_offset_block<const NR: usize, const SHIFT: u32>(
    acc: &mut [__m512; NR],
    sum: &[__m512i; NR],
    x: &[Act; NR],
    b: usize,
    sc16: __m512i,
    dd: __m512,
) {
    for i in 0..NR {
        let bs = _mm512_broadcast_i64x4(load(x[i].bs.add(16 * b) as *const u8));
        let off = _mm512_slli_epi32::<SHIFT>(_mm512_madd_epi16(bs, sc16));
        let s = _mm512_cvtepi32_ps(_mm512_sub_epi32(sum[i], off));
        // d * dx lane-wise: the same product as the scalar one.
        let d = _mm512_mul_ps(dd, _mm512_set1_ps(*x[i].d.add(b)));
        acc[i] = _mm512_fmadd_ps(s, d, acc[i]);
    }
}

/// Sixteen i16 lanes per half: `lo` of `a` (low half) and `b` (high half)
/// in lanes 0..8, `hi` in lanes 8..16: the AVX2 kernels' `pair16(sc[lo],
/// sc[hi])`, taken from each half's 16 scales (`sc`, one row per half).
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn pick_pair16(sc: __m512i, lo: i16, hi: i16) -> __m512i {
    let (a, b) = (lo, hi);
    let (c, d) = (lo + 16, hi + 16);
    let idx = _mm512_set_epi16(
        d, d, d, d, d, d, d, d, c, c, c, c, c, c, c, c, b, b, b, b, b, b, b, b, a, a, a, a, a, a,
        a, a,
    );
    _mm512_permutexvar_epi16(idx, sc)
}

/// Eight f32 lanes of `v` in both halves.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn both_ps(v: __m256) -> __m512 {
    halves_ps(v, v)
}

// Helpers are functions with the kernels' target features rather than
// closures: a closure is compiled without them, and where it is not
// inlined its intrinsics become calls (13 % slower Q5_K decode).

/// Q4_K/Q5_K's eight scales as i16, in both 128-bit lanes.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn k4_scales16(sc: &[u8; 8]) -> __m256i {
    _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64(
        sc.as_ptr() as *const __m128i
    )))
}

/// Q4_K/Q5_K's eight mins times `-dmin`, as the AVX2 kernel takes them.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn k4_mins(mn: &[u8; 8], dmin: f32) -> __m256 {
    let m32 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(mn.as_ptr() as *const __m128i));
    _mm256_mul_ps(_mm256_cvtepi32_ps(m32), _mm256_set1_ps(-dmin))
}

/// Scale `j` of each 128-bit lane's eight (`k4_scales16`) in all its i16
/// lanes: a byte shuffle, as the AVX2 kernel picks it.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn pick16(scv: __m512i, j: usize) -> __m512i {
    let m = (2 * j as i16) | ((2 * j as i16 + 1) << 8);
    _mm512_shuffle_epi8(scv, _mm512_set1_epi16(m))
}

/// Q3_K's sixteen signed scales (the 12 bytes at `p`) as i16.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn q3_scales16(p: *const u8) -> __m256i {
    _mm256_cvtepi8_epi16(q3_scales_i8(p))
}

/// Q2_K's sixteen 4-bit scales (`shift` 0) or mins (`shift` 4) as i16.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn q2_nibbles16(blk: *const u8, shift: i32) -> __m256i {
    let scb = _mm_loadu_si128(blk as *const __m128i);
    let v = _mm_srl_epi16(scb, _mm_cvtsi32_si128(shift));
    _mm256_cvtepu8_epi16(_mm_and_si128(v, _mm_set1_epi8(0x0F)))
}

/// `x86`'s `q5_k` (the `k4_kernel` with high bits) for weight rows `w0`
/// (low half) and `w1` (high half): per super-block the same i32 lanes per
/// half, `(lanes as f32) * (d * dx) + mins`, added to the accumulator.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn q5_k_pair<const NR: usize>(
    w0: *const u8,
    w1: *const u8,
    nb: usize,
    x: &[Act; NR],
) -> [(f32, f32); NR] {
    let mut acc = [_mm512_setzero_ps(); NR];
    let low4 = _mm512_set1_epi8(0x0F);
    let one = _mm512_set1_epi8(1);
    for b in 0..nb {
        let (b0, b1) = (w0.add(b * 176), w1.add(b * 176));
        let (d0, d1) = (avx512::h2f(b0), avx512::h2f(b1));
        let (dmin0, dmin1) = (avx512::h2f(b0.add(2)), avx512::h2f(b1.add(2)));
        let ((sc0, mn0), (sc1, mn1)) = (k4_scales(b0.add(4)), k4_scales(b1.add(4)));
        let scv = halves(k4_scales16(&sc0), k4_scales16(&sc1));
        let mv = halves_ps(k4_mins(&mn0, dmin0), k4_mins(&mn1, dmin1));
        let qh = halves(load(b0.add(16)), load(b1.add(16)));
        let mut sum = [_mm512_setzero_si512(); NR];
        for jj in 0..4 {
            prefetch_ahead(b0, 176, jj, 4);
            prefetch_ahead(b1, 176, jj, 4);
            let q = halves(load(b0.add(48 + 32 * jj)), load(b1.add(48 + 32 * jj)));
            let h = _mm512_srl_epi16(qh, _mm_cvtsi32_si128(2 * jj as i32));
            let lo = _mm512_or_si512(
                _mm512_and_si512(q, low4),
                _mm512_slli_epi16(_mm512_and_si512(h, one), 4),
            );
            let hi = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16(q, 4), low4),
                _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(h, 1), one), 4),
            );
            let (s_lo, s_hi) = (pick16(scv, 2 * jj), pick16(scv, 2 * jj + 1));
            for i in 0..NR {
                let xp = x[i].qs.add(256 * b + 64 * jj) as *const u8;
                let p_lo = _mm512_maddubs_epi16(lo, _mm512_broadcast_i64x4(load(xp)));
                let p_hi = _mm512_maddubs_epi16(hi, _mm512_broadcast_i64x4(load(xp.add(32))));
                let s =
                    _mm512_add_epi32(_mm512_madd_epi16(p_lo, s_lo), _mm512_madd_epi16(p_hi, s_hi));
                sum[i] = _mm512_add_epi32(sum[i], s);
            }
        }
        let dd = halves_ps(_mm256_set1_ps(d0), _mm256_set1_ps(d1));
        for i in 0..NR {
            let s = _mm512_cvtepi32_ps(sum[i]);
            let t = _mm512_mul_ps(mv, both_ps(_mm256_loadu_ps(x[i].s.add(8 * b))));
            let d = _mm512_mul_ps(dd, _mm512_set1_ps(*x[i].d.add(b)));
            acc[i] = _mm512_add_ps(acc[i], _mm512_fmadd_ps(s, d, t));
        }
    }
    std::array::from_fn(|i| hsum_halves(acc[i]))
}

/// `x86`'s `q3_k` for weight rows `w0` (low half) and `w1` (high half):
/// the same i32 lanes per half (quants as `q2 + 4 hbit`, the 4 taken off
/// through the activation's sums), `fma(lanes, d * dx, acc)`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn q3_k_pair<const NR: usize>(
    w0: *const u8,
    w1: *const u8,
    nb: usize,
    x: &[Act; NR],
) -> [(f32, f32); NR] {
    let mut acc = [_mm512_setzero_ps(); NR];
    let low2 = _mm512_set1_epi8(0x03);
    let one = _mm512_set1_epi8(1);
    for b in 0..nb {
        let (b0, b1) = (w0.add(b * 110), w1.add(b * 110));
        let (d0, d1) = (avx512::h2f(b0.add(108)), avx512::h2f(b1.add(108)));
        let sc16 = halves(q3_scales16(b0.add(96)), q3_scales16(b1.add(96)));
        let hm = halves(load(b0), load(b1));
        let mut sum = [_mm512_setzero_si512(); NR];
        for h in 0..2 {
            prefetch_ahead(b0, 110, h, 2);
            prefetch_ahead(b1, 110, h, 2);
            let qs = halves(load(b0.add(32 + 32 * h)), load(b1.add(32 + 32 * h)));
            for j in 0..4 {
                let sh = _mm_cvtsi32_si128(2 * j as i32);
                let q2 = _mm512_and_si512(_mm512_srl_epi16(qs, sh), low2);
                let hb = _mm512_and_si512(
                    _mm512_srl_epi16(hm, _mm_cvtsi32_si128((4 * h + j) as i32)),
                    one,
                );
                let q = _mm512_or_si512(q2, _mm512_slli_epi16(hb, 2));
                let is = (8 * h + 2 * j) as i16;
                let s = pick_pair16(sc16, is, is + 1);
                for i in 0..NR {
                    let xp = x[i].qs.add(256 * b + 128 * h + 32 * j) as *const u8;
                    let p = _mm512_maddubs_epi16(q, _mm512_broadcast_i64x4(load(xp)));
                    sum[i] = _mm512_add_epi32(sum[i], _mm512_madd_epi16(p, s));
                }
            }
        }
        let dd = halves_ps(_mm256_set1_ps(d0), _mm256_set1_ps(d1));
        add_offset_block::<NR, 2>(&mut acc, &sum, x, b, sc16, dd);
    }
    std::array::from_fn(|i| hsum_halves(acc[i]))
}

/// `x86`'s `q2_k` for weight rows `w0` (low half) and `w1` (high half):
/// the same i32 lanes per half, `fma(lanes, d * dx, acc)` then
/// `fma(mins, -dmin * dx, acc)`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn q2_k_pair<const NR: usize>(
    w0: *const u8,
    w1: *const u8,
    nb: usize,
    x: &[Act; NR],
) -> [(f32, f32); NR] {
    let mut acc = [_mm512_setzero_ps(); NR];
    let low2 = _mm512_set1_epi8(0x03);
    for b in 0..nb {
        let (b0, b1) = (w0.add(b * 84), w1.add(b * 84));
        let (d0, d1) = (avx512::h2f(b0.add(80)), avx512::h2f(b1.add(80)));
        let (dmin0, dmin1) = (avx512::h2f(b0.add(82)), avx512::h2f(b1.add(82)));
        // Per half, 16 scales (low nibbles) and 16 mins (high nibbles) as i16.
        let sc16 = halves(q2_nibbles16(b0, 0), q2_nibbles16(b1, 0));
        let mins16 = halves(q2_nibbles16(b0, 4), q2_nibbles16(b1, 4));
        let mut sum = [_mm512_setzero_si512(); NR];
        for h in 0..2 {
            prefetch_ahead(b0, 84, h, 2);
            prefetch_ahead(b1, 84, h, 2);
            let qs = halves(load(b0.add(16 + 32 * h)), load(b1.add(16 + 32 * h)));
            for j in 0..4 {
                let q =
                    _mm512_and_si512(_mm512_srl_epi16(qs, _mm_cvtsi32_si128(2 * j as i32)), low2);
                let is = (8 * h + 2 * j) as i16;
                let s = pick_pair16(sc16, is, is + 1);
                for i in 0..NR {
                    let xp = x[i].qs.add(256 * b + 128 * h + 32 * j) as *const u8;
                    let p = _mm512_maddubs_epi16(q, _mm512_broadcast_i64x4(load(xp)));
                    sum[i] = _mm512_add_epi32(sum[i], _mm512_madd_epi16(p, s));
                }
            }
        }
        let dd = halves_ps(_mm256_set1_ps(d0), _mm256_set1_ps(d1));
        let neg_dmin = halves_ps(_mm256_set1_ps(-dmin0), _mm256_set1_ps(-dmin1));
        for i in 0..NR {
            let xd = _mm512_set1_ps(*x[i].d.add(b));
            let bs = _mm512_broadcast_i64x4(load(x[i].bs.add(16 * b) as *const u8));
            let msum = _mm512_cvtepi32_ps(_mm512_madd_epi16(bs, mins16));
            let s = _mm512_cvtepi32_ps(sum[i]);
            acc[i] = _mm512_fmadd_ps(s, _mm512_mul_ps(dd, xd), acc[i]);
            acc[i] = _mm512_fmadd_ps(msum, _mm512_mul_ps(neg_dmin, xd), acc[i]);
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
