//! glibc's single-precision `expf`, `sinf` and `cosf`, bit for bit, on
//! every platform.
//!
//! llama.cpp calls libm for RoPE's angles and for the softmax steps of its
//! f16 flash attention, so on x86-64 Linux its results carry glibc's
//! roundings. Other libms round differently (Rust's wasm32 `libm`: about
//! 1 % of `expf`, `sinf` and `cosf` inputs), which made the browser's
//! tokens drift from the CLI's. These follow glibc's algorithms (ARM's
//! optimized routines: f64 evaluation, rounded once) with the fused
//! multiply-adds of glibc's FMA build, the one x86-64 CPUs with AVX2 run;
//! they equal it on all 2^32 inputs (checked once; the tests sample).

/// Table entries of `expf`: `2^(i/N)`.
const N: f64 = 32.0;
/// `2^(i/32)` (nearest f64) minus `i << 47`, so that adding `k << 47`
/// applies `2^(k/32)`'s integer part `2^(k >> 5)` to the exponent field.
static EXPF_TABLE: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];

/// `exp(x)` as glibc's `expf`: `x = k/32 + r`, `exp(x) = 2^(k/32) · p(r)`
/// with a table of `2^(i/32)` and a degree-3 polynomial.
pub fn expf(x: f32) -> f32 {
    const INV_LN2_N: f64 = std::f64::consts::LOG2_E * N;
    // 1.5 · 2^52: adding it rounds to an integer held in the low mantissa bits.
    const SHIFT: f64 = 6755399441055744.0;
    let c0 = f64::from_bits(0x3fac6af84b912394) / (N * N * N);
    let c1 = f64::from_bits(0x3fcebfce50fac4f3) / (N * N);
    let c2 = f64::from_bits(0x3fe62e42ff0c52d6) / N;

    let bits = x.to_bits();
    if (bits >> 20) & 0x7ff >= 0x42b {
        // |x| >= 88, inf or NaN.
        if bits == 0xff80_0000 {
            return 0.0;
        }
        if (bits >> 20) & 0x7ff >= 0x7f8 {
            return x + x;
        }
        if x > f32::from_bits(0x42b1_7217) {
            return f32::INFINITY;
        }
        if x < f32::from_bits(0xc2cf_f1b4) {
            return 0.0;
        }
    }
    let xd = x as f64;
    let kd = INV_LN2_N.mul_add(xd, SHIFT);
    let ki = kd.to_bits();
    let r = INV_LN2_N.mul_add(xd, -(kd - SHIFT));
    let scale = f64::from_bits(EXPF_TABLE[(ki % 32) as usize].wrapping_add(ki << 47));
    let p = c0.mul_add(r, c1);
    let y = c2.mul_add(r, 1.0);
    let y = p.mul_add(r * r, y);
    (y * scale) as f32
}

/// [`expf`] of eight values at once with AVX-512 F, the same operations
/// lane by lane (so the same bits); lanes with `|x| >= 88`, infinities or
/// NaN take the scalar path.
///
/// # Safety
/// The CPU has AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub unsafe fn expf8_avx512(x: &mut [f32; 8]) {
    use std::arch::x86_64::*;
    const INV_LN2_N: f64 = std::f64::consts::LOG2_E * N;
    const SHIFT: f64 = 6755399441055744.0;
    let c0 = _mm512_set1_pd(f64::from_bits(0x3fac6af84b912394) / (N * N * N));
    let c1 = _mm512_set1_pd(f64::from_bits(0x3fcebfce50fac4f3) / (N * N));
    let c2 = _mm512_set1_pd(f64::from_bits(0x3fe62e42ff0c52d6) / N);
    let (inv_ln2_n, shift) = (_mm512_set1_pd(INV_LN2_N), _mm512_set1_pd(SHIFT));

    let xs = _mm256_loadu_ps(x.as_ptr());
    let xd = _mm512_cvtps_pd(xs);
    let kd = _mm512_fmadd_pd(inv_ln2_n, xd, shift);
    let ki = _mm512_castpd_si512(kd);
    let r = _mm512_fmsub_pd(inv_ln2_n, xd, _mm512_sub_pd(kd, shift));
    let index = _mm512_and_si512(ki, _mm512_set1_epi64(31));
    let table = _mm512_i64gather_epi64::<8>(index, EXPF_TABLE.as_ptr() as *const i64);
    let scale = _mm512_castsi512_pd(_mm512_add_epi64(table, _mm512_slli_epi64::<47>(ki)));
    let p = _mm512_fmadd_pd(c0, r, c1);
    let y = _mm512_fmadd_pd(c2, r, _mm512_set1_pd(1.0));
    let y = _mm512_fmadd_pd(p, _mm512_mul_pd(r, r), y);
    _mm256_storeu_ps(x.as_mut_ptr(), _mm512_cvtpd_ps(_mm512_mul_pd(y, scale)));
    // Lanes whose exponent field says |x| >= 88 (or inf/NaN).
    let top = _mm256_and_si256(
        _mm256_srli_epi32::<20>(_mm256_castps_si256(xs)),
        _mm256_set1_epi32(0x7ff),
    );
    let special = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(
        top,
        _mm256_set1_epi32(0x42a),
    )));
    if special != 0 {
        let xa: [f32; 8] = std::mem::transmute(xs);
        for (i, (o, &xi)) in x.iter_mut().zip(&xa).enumerate() {
            if special & (1 << i) != 0 {
                *o = expf(xi);
            }
        }
    }
}

/// `(sin(x), cos(x))` as glibc's `sinf` and `cosf` (one evaluation serves
/// both): `x = n·π/2 + r`, then a degree-7 odd and degree-10 even
/// polynomial in `r`, swapped and signed by the quadrant `n`.
// Inlined, so that rope's FMA build runs its `mul_add`s as instructions.
#[inline(always)]
pub fn sincosf(x: f32) -> (f32, f32) {
    // |x| < π/4: no reduction.
    if abs_top12(x) < abs_top12(f32::from_bits(0x3f49_0fdb)) {
        if abs_top12(x) < abs_top12(f32::from_bits(0x3980_0000)) {
            return (x, 1.0); // |x| < 2^-12
        }
        let xd = x as f64;
        return quadrant_poly(xd, xd * xd, 0, false);
    }
    // The sign of the odd part follows the quadrant (after the large
    // reduction, which works on |x|, shifted by the sign of x); the even
    // part's sign flips in the upper half.
    let (r, n, quadrant) = if abs_top12(x) < abs_top12(120.0) {
        let (r, n) = reduce_small(x as f64);
        (r, n, n)
    } else if x.is_finite() {
        let (r, n) = reduce_large(x.to_bits());
        (r, n, n + (x.to_bits() >> 31) as i32)
    } else {
        return (f32::NAN, f32::NAN); // inf and NaN
    };
    let odd_sign = if matches!(quadrant & 3, 0 | 3) {
        1.0
    } else {
        -1.0
    };
    quadrant_poly(r * odd_sign, r * r, n, quadrant & 2 != 0)
}

fn abs_top12(x: f32) -> u32 {
    (x.to_bits() >> 20) & 0x7ff
}

/// `x = n·π/2 + r` for |x| < 120 in f64: `n` from `x · 2/π · 2^24`.
fn reduce_small(x: f64) -> (f64, i32) {
    const TWO_OVER_PI_2_24: f64 = 10680707.430881744; // 0x1.45f306dc9c883p+23, 2/π · 2^24
    let n = ((x * TWO_OVER_PI_2_24) as i32).wrapping_add(0x80_0000) >> 24;
    ((-(n as f64)).mul_add(FRAC_PI_2, x), n)
}

const FRAC_PI_2: f64 = std::f64::consts::FRAC_PI_2;

/// `x = n·π/2 + r` for large |x|: the mantissa times 2/π's bits around the
/// exponent's position, in 64-bit fixed point (Payne–Hanek with 96 bits).
fn reduce_large(bits: u32) -> (f64, i32) {
    /// 2/π's bits (as 4/π, from bit 0): word `i` holds bits 8i−24 … 8i+7.
    const INV_PIO4: [u32; 24] = [
        0xa2, 0xa2f9, 0xa2f983, 0xa2f9836e, 0xf9836e4e, 0x836e4e44, 0x6e4e4415, 0x4e441529,
        0x441529fc, 0x1529fc27, 0x29fc2757, 0xfc2757d1, 0x2757d1f5, 0x57d1f534, 0xd1f534dd,
        0xf534ddc0, 0x34ddc0db, 0xddc0db62, 0xc0db6295, 0xdb629599, 0x6295993c, 0x95993c43,
        0x993c4390, 0x3c439041,
    ];
    let words = &INV_PIO4[((bits >> 26) & 15) as usize..];
    let m = ((bits & 0xff_ffff) | 0x80_0000) << ((bits >> 23) & 7);
    let top = m.wrapping_mul(words[0]) as u64;
    let mid = m as u64 * words[4] as u64;
    let low = m as u64 * words[8] as u64;
    let mut frac = ((low >> 32) | (top << 32)).wrapping_add(mid);
    let n = frac.wrapping_add(1 << 61) >> 62;
    frac = frac.wrapping_sub(n << 62);
    (
        frac as i64 as f64 * (FRAC_PI_2 / (1u64 << 62) as f64),
        n as i32,
    )
}

/// sin and cos polynomials of the reduced `r` (`r2 = r·r`): for odd `n`
/// they trade places; `negate_even` flips the even one's coefficients.
fn quadrant_poly(r: f64, r2: f64, n: i32, negate_even: bool) -> (f32, f32) {
    let f = f64::from_bits;
    let cos = [
        1.0,
        f(0xbfdffffffd0c621c), // -0x1.ffffffd0c621cp-2
        f(0x3fa55553e1068f19), // 0x1.55553e1068f19p-5
        f(0xbf56c087e89a359d), // -0x1.6c087e89a359dp-10
        f(0x3ef99343027bf8c3), // 0x1.99343027bf8c3p-16
    ];
    let sin = [
        f(0xbfc555545995a603), // -0x1.555545995a603p-3
        f(0x3f81107605230bc4), // 0x1.1107605230bc4p-7
        f(0xbf2994eb3774cf24), // -0x1.994eb3774cf24p-13
    ];
    let sign = if negate_even { -1.0 } else { 1.0 };
    let c = cos.map(|c| c * sign);
    let (r3, r4) = (r2 * r, r2 * r2);
    let c_hi = r2.mul_add(c[4], c[3]);
    let s_hi = r2.mul_add(sin[2], sin[1]);
    let c_lo = r2.mul_add(c[1], c[0]);
    let s_lo = r3.mul_add(sin[0], r);
    let c_mid = r4.mul_add(c[2], c_lo);
    let odd = (r3 * r2).mul_add(s_hi, s_lo) as f32;
    let even = (r4 * r2).mul_add(c_hi, c_mid) as f32;
    if n & 1 == 0 {
        (odd, even)
    } else {
        (even, odd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every 4099th f32 bit pattern (about a million, all signs and
    /// exponents) and the special values.
    fn inputs() -> impl Iterator<Item = f32> {
        (0..=u32::MAX)
            .step_by(4099)
            .map(f32::from_bits)
            .chain([
                0.0,
                -0.0,
                88.72283,
                88.72284,
                -103.97208,
                -103.972084,
                std::f32::consts::FRAC_PI_4,
            ])
            .chain([119.99999, 120.0, 8191.0, 32767.0, 1e30, -1e-5])
            .chain([
                f32::INFINITY,
                f32::NEG_INFINITY,
                f32::NAN,
                f32::MIN_POSITIVE,
            ])
    }

    fn same(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    /// Where the platform's libm is glibc's FMA build, ours equals it.
    #[test]
    fn equal_to_glibc_fma_build() {
        if !cfg!(all(
            target_arch = "x86_64",
            target_os = "linux",
            target_env = "gnu"
        )) {
            eprintln!("SKIPPED libm::tests::equal_to_glibc_fma_build: needs x86-64 glibc");
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if !crate::kernels::x86::has_avx2() {
            eprintln!(
                "SKIPPED libm::tests::equal_to_glibc_fma_build: glibc runs its non-FMA build here"
            );
            return;
        }
        for x in inputs() {
            let (e, (s, c)) = (expf(x), sincosf(x));
            let hex = x.to_bits();
            assert!(
                same(e, x.exp()),
                "expf({x:e} = {hex:#x}): {e:e}, glibc {:e}",
                x.exp()
            );
            assert!(
                same(s, x.sin()),
                "sinf({x:e} = {hex:#x}): {s:e}, glibc {:e}",
                x.sin()
            );
            assert!(
                same(c, x.cos()),
                "cosf({x:e} = {hex:#x}): {c:e}, glibc {:e}",
                x.cos()
            );
        }
    }

    /// The same sample's results hashed: a platform whose float arithmetic
    /// differs (wasm32, aarch64) fails here, not in a model's tokens.
    #[test]
    fn the_same_bits_everywhere() {
        // Every NaN counts as one (their payloads are not specified).
        let bits = |v: f32| if v.is_nan() { f32::NAN } else { v }.to_bits();
        let fnv = |h: u64, v: f32| (h ^ bits(v) as u64).wrapping_mul(0x100_0000_01b3);
        let hash = inputs().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
            let (s, c) = sincosf(x);
            fnv(fnv(fnv(h, expf(x)), s), c)
        });
        assert_eq!(
            hash, 12526507981400468583,
            "hash of expf and sincosf over the sample"
        );
    }

    /// Eight lanes at a time, the scalar function's bits, special inputs
    /// mixed among ordinary ones.
    #[test]
    fn expf8_equals_expf() {
        #[cfg(not(target_arch = "x86_64"))]
        eprintln!("SKIPPED libm::tests::expf8_equals_expf: an x86-64 kernel");
        #[cfg(target_arch = "x86_64")]
        {
            if !crate::kernels::x86::has_avx512f() {
                eprintln!("SKIPPED libm::tests::expf8_equals_expf: the CPU lacks AVX-512 F");
                return;
            }
            let sample: Vec<f32> = inputs().collect();
            for lanes in sample.chunks(8) {
                let mut x = [0.5f32; 8];
                x[..lanes.len()].copy_from_slice(lanes);
                let want = x.map(expf);
                // SAFETY: AVX-512 F checked above.
                unsafe { expf8_avx512(&mut x) };
                for (got, want) in x.iter().zip(&want) {
                    assert!(same(*got, *want), "{got:e} vs {want:e} in {lanes:?}");
                }
            }
        }
    }
}
