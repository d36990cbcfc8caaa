//! x86-64 AVX2 + FMA (+ F16C) kernels, selected at runtime.

use super::Kernel;
use blockdraft_gguf::GgmlType;
use std::arch::x86_64::*;
use std::sync::OnceLock;

/// AVX2, FMA and F16C (every AVX2 CPU in practice has all three).
pub(crate) fn has_avx2() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        std::env::var_os("BLOCKDRAFT_NO_SIMD").is_none()
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    })
}

/// The AVX2 kernel for `ty`, if there is one and the CPU has AVX2.
pub(crate) fn kernel(ty: GgmlType) -> Option<Kernel> {
    if !has_avx2() {
        return None;
    }
    let _ = ty;
    None
}

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps(v, 1);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len();
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, s) in acc.iter_mut().enumerate() {
            let x = _mm256_loadu_ps(pa.add(i + 8 * k));
            let y = _mm256_loadu_ps(pb.add(i + 8 * k));
            *s = _mm256_fmadd_ps(x, y, *s);
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(
            _mm256_loadu_ps(pa.add(i)),
            _mm256_loadu_ps(pb.add(i)),
            acc[0],
        );
        i += 8;
    }
    let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut s = hsum(v);
    while i < n {
        s += a[i] * b[i];
        i += 1;
    }
    s
}

#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn axpy_f32(y: &mut [f32], a: f32, x: &[f32]) {
    let n = y.len();
    let (py, px) = (y.as_mut_ptr(), x.as_ptr());
    let av = _mm256_set1_ps(a);
    let mut i = 0;
    while i + 8 <= n {
        let v = _mm256_fmadd_ps(av, _mm256_loadu_ps(px.add(i)), _mm256_loadu_ps(py.add(i)));
        _mm256_storeu_ps(py.add(i), v);
        i += 8;
    }
    while i < n {
        *py.add(i) += a * *px.add(i);
        i += 1;
    }
}

#[inline(always)]
unsafe fn amax8(p: *const f32, n8: usize) -> f32 {
    let sign = _mm256_set1_ps(-0.0);
    let mut m = _mm256_setzero_ps();
    for i in 0..n8 {
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(p.add(8 * i))));
    }
    let lo = _mm256_castps256_ps128(m);
    let hi = _mm256_extractf128_ps(m, 1);
    let s = _mm_max_ps(lo, hi);
    let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_max_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Round `32` floats times `id` to i8 at `q`; returns the 32 quants as a vector.
#[inline(always)]
unsafe fn round32(p: *const f32, id: f32, q: *mut i8) -> __m256i {
    let idv = _mm256_set1_ps(id);
    let r = |k: usize| {
        _mm256_cvtps_epi32(_mm256_round_ps(
            _mm256_mul_ps(_mm256_loadu_ps(p.add(8 * k)), idv),
            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
        ))
    };
    let (a, b, c, d) = (r(0), r(1), r(2), r(3));
    // Pack to i16 then i8; the packs interleave 128-bit lanes, so permute back.
    let ab = _mm256_packs_epi32(a, b);
    let cd = _mm256_packs_epi32(c, d);
    let abcd = _mm256_packs_epi16(ab, cd);
    let v = _mm256_permutevar8x32_epi32(abcd, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(q as *mut __m256i, v);
    v
}

#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn quantize_q8_0(x: &[f32], qs: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    let nb = x.len() / 32;
    assert!(qs.len() >= nb * 32 && d.len() >= nb && s.len() >= nb);
    let ones = _mm256_set1_epi8(1);
    for b in 0..nb {
        let p = x.as_ptr().add(32 * b);
        let db = amax8(p, 4) / 127.0;
        let id = if db > 0.0 { 1.0 / db } else { 0.0 };
        let v = round32(p, id, qs.as_mut_ptr().add(32 * b));
        // sum of the 32 quants: maddubs(1, v) gives pair sums as i16.
        let pairs = _mm256_maddubs_epi16(ones, v);
        let sums = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
        d[b] = db;
        s[b] = db * hsum_i32(sums) as f32;
    }
}

#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn quantize_q8_k(x: &[f32], qs: &mut [i8], d: &mut [f32], bs: &mut [i16]) {
    let nb = x.len() / 256;
    assert!(qs.len() >= nb * 256 && d.len() >= nb && bs.len() >= nb * 16);
    let ones = _mm256_set1_epi8(1);
    for b in 0..nb {
        let p = x.as_ptr().add(256 * b);
        let db = amax8(p, 32) / 127.0;
        let id = if db > 0.0 { 1.0 / db } else { 0.0 };
        for k in 0..8 {
            let v = round32(p.add(32 * k), id, qs.as_mut_ptr().add(256 * b + 32 * k));
            // Pair sums (i16) -> sums of 16 via madd within each 128-bit half.
            let pairs = _mm256_maddubs_epi16(ones, v);
            let quads = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)); // 8 x i32 sums of 4
            let h = _mm256_hadd_epi32(quads, quads); // per lane: s01 s23 s01 s23
            let h = _mm256_hadd_epi32(h, h); // per lane: sum of 16 in every slot
            bs[16 * b + 2 * k] = _mm256_extract_epi32(h, 0) as i16;
            bs[16 * b + 2 * k + 1] = _mm256_extract_epi32(h, 4) as i16;
        }
        d[b] = db;
    }
}

#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}
