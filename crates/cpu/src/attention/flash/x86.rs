//! [`flash_group`](super::flash_group) with AVX2/F16C, ggml's own
//! instructions: keys and values widened 8 at a time (`vcvtph2ps`), each dot
//! product in four 8-wide FMA accumulators, the value accumulators rounded
//! back with `vcvtps2ph`; and the same with AVX-512 F, 16 lanes at a time
//! (the 32 partial sums of a dot product are the same lanes in two 16-wide
//! accumulators, reduced in the same order) and the exponentials of eight
//! keys in one vector ([`expf8_avx512`]), for the same bits.

use super::{online_softmax, GroupSteps, KeyPass, Running, KEY_CHUNK, MAX_TASK_HEADS};
use crate::libm::expf8_avx512;
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

/// [`GroupSteps`] on raw pointers; only ever inlined into
/// [`flash_group`], whose target features its intrinsics need.
struct Avx2 {
    q: *const f32,
    k: *const f16,
    v: *const f16,
    acc: *mut f32,
    /// The widened key or value row, `d` elements.
    row: *mut f32,
    d: usize,
}

impl Avx2 {
    /// Widens the `d` halves at `src` into `row`.
    #[inline(always)]
    unsafe fn widen(&mut self, src: *const f16) {
        for i in (0..self.d).step_by(8) {
            _mm256_storeu_ps(self.row.add(i), load8(src.add(i)));
        }
    }
}

impl GroupSteps for Avx2 {
    #[inline(always)]
    fn load_key(&mut self, at: usize) {
        // SAFETY: see `flash_group`; `at + d` lies within the keys.
        unsafe { self.widen(self.k.add(at)) }
    }

    #[inline(always)]
    fn score(&self, h: usize) -> f64 {
        let simd_len = self.d - self.d % 32;
        // SAFETY: see `flash_group`; q holds the task's heads.
        unsafe {
            let (q, k) = (self.q.add(h * self.d), self.row);
            let mut sums = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            while i < simd_len {
                for (c, s) in sums.iter_mut().enumerate() {
                    let x = _mm256_loadu_ps(k.add(i + 8 * c));
                    *s = _mm256_fmadd_ps(x, _mm256_loadu_ps(q.add(i + 8 * c)), *s);
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
                dot += (*k.add(i) * *q.add(i)) as f64;
            }
            dot
        }
    }

    #[inline(always)]
    fn rescale(&mut self, h: usize, ms: f32) {
        // SAFETY: see `flash_group`; acc holds d elements per head, d % 8 == 0.
        unsafe {
            let (acc, msv) = (self.acc.add(h * self.d), _mm256_set1_ps(ms));
            for i in (0..self.d).step_by(8) {
                let a = _mm256_mul_ps(_mm256_loadu_ps(acc.add(i)), msv);
                _mm256_storeu_ps(acc.add(i), round8(a));
            }
        }
    }

    #[inline(always)]
    fn load_value(&mut self, at: usize) {
        // SAFETY: see `flash_group`; `at + d` lies within the values.
        unsafe { self.widen(self.v.add(at)) }
    }

    #[inline(always)]
    fn add_value(&mut self, h: usize, vs: f32) {
        // SAFETY: see `flash_group`; acc holds d elements per head.
        unsafe {
            let (acc, vsv) = (self.acc.add(h * self.d), _mm256_set1_ps(vs));
            for i in (0..self.d).step_by(8) {
                let x = _mm256_loadu_ps(self.row.add(i));
                let a = _mm256_fmadd_ps(x, vsv, _mm256_loadu_ps(acc.add(i)));
                _mm256_storeu_ps(acc.add(i), round8(a));
            }
        }
    }
}

/// # Safety
/// AVX2, FMA and F16C; `pass.q16.len() == acc.len() == state.len() * d`
/// with `d` a multiple of 8; rows `keys.lo..keys.hi` of `k` and `v` hold
/// `keys.offset + d` elements at `keys.stride` apart.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn flash_group(pass: KeyPass, acc: &mut [f32], state: &mut [Running]) {
    let d = pass.q16.len() / state.len();
    let mut row = vec![0f32; d];
    let mut steps = Avx2 {
        q: pass.q16.as_ptr(),
        k: pass.k.as_ptr(),
        v: pass.v.as_ptr(),
        acc: acc.as_mut_ptr(),
        row: row.as_mut_ptr(),
        d,
    };
    online_softmax(&mut steps, pass, state)
}

/// [`GroupSteps`] with AVX-512 F; only ever inlined into
/// [`flash_group_avx512`].
struct Avx512 {
    q: *const f32,
    k: *const f16,
    v: *const f16,
    acc: *mut f32,
    /// The widened key or value row, `d` elements.
    row: *mut f32,
    d: usize,
}

impl Avx512 {
    /// Widens the `d` halves at `src` into `row`.
    #[inline(always)]
    unsafe fn widen(&mut self, src: *const f16) {
        for i in (0..self.d).step_by(16) {
            let x = _mm512_cvtph_ps(_mm256_loadu_si256(src.add(i) as *const __m256i));
            _mm512_storeu_ps(self.row.add(i), x);
        }
    }
}

/// `x` rounded to f16 (nearest, ties to even) and back, 16 lanes.
#[inline(always)]
unsafe fn round16(x: __m512) -> __m512 {
    _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
}

impl GroupSteps for Avx512 {
    #[inline(always)]
    fn load_key(&mut self, at: usize) {
        // SAFETY: see `flash_group_avx512`; `at + d` lies within the keys.
        unsafe { self.widen(self.k.add(at)) }
    }

    #[inline(always)]
    fn score(&self, h: usize) -> f64 {
        let simd_len = self.d - self.d % 32;
        // SAFETY: see `flash_group_avx512`; q holds the task's heads.
        unsafe {
            let (q, k) = (self.q.add(h * self.d), self.row);
            // Lanes 0..16 and 16..32 of the AVX2 kernel's four accumulators.
            let mut sums = [_mm512_setzero_ps(); 2];
            let mut i = 0;
            while i < simd_len {
                for (c, s) in sums.iter_mut().enumerate() {
                    let x = _mm512_loadu_ps(k.add(i + 16 * c));
                    *s = _mm512_fmadd_ps(x, _mm512_loadu_ps(q.add(i + 16 * c)), *s);
                }
                i += 32;
            }
            // (acc0 + acc2 | acc1 + acc3), then their sum: the AVX2 order.
            let pairs = _mm512_add_ps(sums[0], sums[1]);
            let s4 = _mm256_add_ps(
                _mm512_castps512_ps256(pairs),
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(pairs))),
            );
            let t = _mm_add_ps(_mm256_castps256_ps128(s4), _mm256_extractf128_ps(s4, 1));
            let t = _mm_hadd_ps(t, t);
            let mut dot = _mm_cvtss_f32(_mm_hadd_ps(t, t)) as f64;
            for i in simd_len..self.d {
                dot += (*k.add(i) * *q.add(i)) as f64;
            }
            dot
        }
    }

    /// With no tail past the 32-lane sums, the eight heads' sums are
    /// reduced together: `lo + hi` of each head's eight lanes, then two
    /// rounds of pairwise `hadd` across heads, which add the same pairs in
    /// the same order as one head's reduction.
    #[inline(always)]
    fn scores(&self, n_heads: usize, scale: f32, out: &mut [f32; MAX_TASK_HEADS]) {
        if !self.d.is_multiple_of(32) {
            for (h, o) in out.iter_mut().enumerate().take(n_heads) {
                *o = self.score(h) as f32 * scale;
            }
            return;
        }
        // SAFETY: see `flash_group_avx512`; q holds n_heads <= 8 heads.
        unsafe {
            let mut s4 = [_mm256_setzero_ps(); MAX_TASK_HEADS];
            for (h, s4) in s4.iter_mut().enumerate().take(n_heads) {
                let (q, k) = (self.q.add(h * self.d), self.row);
                let mut sums = [_mm512_setzero_ps(); 2];
                for i in (0..self.d).step_by(32) {
                    for (c, s) in sums.iter_mut().enumerate() {
                        let x = _mm512_loadu_ps(k.add(i + 16 * c));
                        *s = _mm512_fmadd_ps(x, _mm512_loadu_ps(q.add(i + 16 * c)), *s);
                    }
                }
                let pairs = _mm512_add_ps(sums[0], sums[1]);
                *s4 = _mm256_add_ps(
                    _mm512_castps512_ps256(pairs),
                    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(pairs))),
                );
            }
            // [lo4 + hi4 of head h | of head h + 1].
            let fold = |a: __m256, b: __m256| {
                _mm256_add_ps(
                    _mm256_permute2f128_ps::<0x20>(a, b),
                    _mm256_permute2f128_ps::<0x31>(a, b),
                )
            };
            let t01 = fold(s4[0], s4[1]);
            let t23 = fold(s4[2], s4[3]);
            let t45 = fold(s4[4], s4[5]);
            let t67 = fold(s4[6], s4[7]);
            // Heads 0, 2, 4, 6 in the low half, 1, 3, 5, 7 in the high.
            let dots = _mm256_hadd_ps(_mm256_hadd_ps(t01, t23), _mm256_hadd_ps(t45, t67));
            let dots = _mm256_permutevar8x32_ps(dots, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_ps(out.as_mut_ptr(), _mm256_mul_ps(dots, _mm256_set1_ps(scale)));
        }
    }

    #[inline(always)]
    fn rescale(&mut self, h: usize, ms: f32) {
        // SAFETY: see `flash_group_avx512`; acc holds d elements per head, d % 16 == 0.
        unsafe {
            let (acc, msv) = (self.acc.add(h * self.d), _mm512_set1_ps(ms));
            for i in (0..self.d).step_by(16) {
                let a = _mm512_mul_ps(_mm512_loadu_ps(acc.add(i)), msv);
                _mm512_storeu_ps(acc.add(i), round16(a));
            }
        }
    }

    #[inline(always)]
    fn load_value(&mut self, at: usize) {
        // SAFETY: see `flash_group_avx512`; `at + d` lies within the values.
        unsafe { self.widen(self.v.add(at)) }
    }

    #[inline(always)]
    fn add_value(&mut self, h: usize, vs: f32) {
        // SAFETY: see `flash_group_avx512`; acc holds d elements per head.
        unsafe {
            let (acc, vsv) = (self.acc.add(h * self.d), _mm512_set1_ps(vs));
            for i in (0..self.d).step_by(16) {
                let x = _mm512_loadu_ps(self.row.add(i));
                let a = _mm512_fmadd_ps(x, vsv, _mm512_loadu_ps(acc.add(i)));
                _mm512_storeu_ps(acc.add(i), round16(a));
            }
        }
    }

    #[inline(always)]
    fn expf_each(&self, x: &mut [f32; KEY_CHUNK]) {
        // SAFETY: AVX-512 F, checked before `flash_group_avx512` runs.
        unsafe { expf8_avx512(x) }
    }
}

/// # Safety
/// AVX-512 F, AVX2, FMA and F16C; `pass.q16.len() == acc.len() ==
/// state.len() * d` with `d` a multiple of 16; rows `keys.lo..keys.hi` of `k` and `v` hold
/// `keys.offset + d` elements at `keys.stride` apart.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) unsafe fn flash_group_avx512(pass: KeyPass, acc: &mut [f32], state: &mut [Running]) {
    let d = pass.q16.len() / state.len();
    let mut row = vec![0f32; d];
    let mut steps = Avx512 {
        q: pass.q16.as_ptr(),
        k: pass.k.as_ptr(),
        v: pass.v.as_ptr(),
        acc: acc.as_mut_ptr(),
        row: row.as_mut_ptr(),
        d,
    };
    online_softmax(&mut steps, pass, state)
}
