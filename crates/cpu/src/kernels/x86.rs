//! x86-64 AVX2 + FMA (+ F16C) kernels, selected at runtime.

use super::x86_lattice::{four, lattice_kernels, signed_grid, ternary};
use super::{by_nr, per_row, Act, Kernel};
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

/// AVX-512 F (Skylake-SP, Ice Lake, Zen 4 and later), unless
/// `BLOCKDRAFT_NO_AVX512=1` asks for the AVX2 build.
pub(crate) fn has_avx512f() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        has_avx2()
            && std::env::var_os("BLOCKDRAFT_NO_AVX512").is_none()
            && is_x86_feature_detected!("avx512f")
    })
}

/// AVX-512 F/BW/VL with VNNI (Zen 4, Sapphire Rapids and later), unless
/// `BLOCKDRAFT_NO_AVX512=1` asks for the AVX2 build.
pub(crate) fn has_avx512_vnni() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        has_avx2()
            && std::env::var_os("BLOCKDRAFT_NO_AVX512").is_none()
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni")
    })
}

/// AVX-VNNI: `vpdpbusd` on 256-bit vectors without AVX-512 (Intel Alder
/// Lake and later client CPUs; Zen 5 has it beside AVX-512).
pub(crate) fn has_avx_vnni() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| has_avx2() && is_x86_feature_detected!("avxvnni"))
}

/// The matmul kernel for `ty` of the widest build this CPU runs.
pub(crate) fn kernel(ty: GgmlType) -> Option<Kernel> {
    if has_avx512_vnni() {
        return avx512_kernel(ty);
    }
    if has_avx_vnni() {
        return avx_vnni::kernel(ty);
    }
    if has_avx2() {
        return avx2::kernel(ty);
    }
    None
}

/// The AVX-512 VNNI kernel for `ty`: two weight rows per vector where
/// there is such a kernel (`x86_avx512`), else the 256-bit VNNI build.
pub(crate) fn avx512_kernel(ty: GgmlType) -> Option<Kernel> {
    super::x86_avx512::kernel(ty).or_else(|| avx512::kernel(ty))
}

/// Asks for part `part` of `parts` of the `bytes` at `PREFETCH_DISTANCE`
/// past `p` (whole cache lines): a decode streams each weight once, and
/// with the hardware prefetcher alone the kernels wait on DRAM. Kernels
/// spread a block's requests over their inner loop: a burst of them at the
/// start of each block gained less. With the AVX-512 pairs interleaved
/// (`x86_packed`), Qwen2.5-Coder-1.5B decoded 2.3x faster on one Zen 5
/// core. The ggml-layout row kernels ask for each block's lines once per
/// block (`part` 0 of 1; blocks under a line repeat a request, which costs
/// less than a branch): on one Zen 3 core that streamed Qwen2.5-Coder's
/// 151936-row heads 1.2x (Q8_0) to 1.37x (Q6_K) faster.
#[inline(always)]
pub(crate) unsafe fn prefetch_ahead(p: *const u8, bytes: usize, part: usize, parts: usize) {
    let lines = bytes.div_ceil(64);
    let (first, end) = (part * lines / parts, (part + 1) * lines / parts);
    prefetch_lines(p, first, end - first);
}

/// Asks for cache lines `first..first + n` of the bytes at
/// `PREFETCH_DISTANCE` past `p`: [`prefetch_ahead`] where the part is not
/// a constant, without its division and loop (`n` is).
#[inline(always)]
pub(crate) unsafe fn prefetch_lines(p: *const u8, first: usize, n: usize) {
    for line in first..first + n {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_DISTANCE + 64 * line) as *const i8);
    }
}

/// How far ahead of use the kernels ask for weights.
const PREFETCH_DISTANCE: usize = 8192;

#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) unsafe fn hsum(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps(v, 1);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// See `super::dot_f32`: ggml's `ggml_vec_dot_f32` sequence on AVX2.
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
    let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
    let t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let t = _mm_hadd_ps(t, t);
    let mut s = _mm_cvtss_f32(_mm_hadd_ps(t, t));
    while i < n {
        s += a[i] * b[i];
        i += 1;
    }
    s
}

/// `y = fma(a, x, y)` elementwise (see `super::axpy_f32`).
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
        *py.add(i) = a.mul_add(*px.add(i), *py.add(i));
        i += 1;
    }
}

#[target_feature(enable = "avx2,fma")]
#[inline]
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

/// The first of the 256 values at `p` whose magnitude is the largest
/// (the scalar fold's `|v| > |max|` rule, NaNs passed over; 0 when all are
/// zero): the magnitude by vector maxima, then its first occurrence.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn signed_max256(p: *const f32) -> f32 {
    let sign = _mm256_set1_ps(-0.0);
    let abs = |i: usize| _mm256_andnot_ps(sign, _mm256_loadu_ps(p.add(8 * i)));
    // A NaN lane of the first operand yields the second: NaNs never enter.
    let mut m = _mm256_setzero_ps();
    for i in 0..32 {
        m = _mm256_max_ps(abs(i), m);
    }
    let s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    let amax = _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
    if amax == 0.0 {
        return 0.0;
    }
    let target = _mm256_set1_ps(amax);
    for i in 0..32 {
        let hits = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(abs(i), target));
        if hits != 0 {
            return *p.add(8 * i + hits.trailing_zeros() as usize);
        }
    }
    unreachable!("the largest magnitude is one of the values")
}

/// Round `32` floats times `id` to i8 at `q`; returns the 32 quants as a vector.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn round32(p: *const f32, id: f32, q: *mut i8) -> __m256i {
    let idv = _mm256_set1_ps(id);
    let mut r = [_mm256_setzero_si256(); 4];
    for (k, v) in r.iter_mut().enumerate() {
        // cvtps rounds to nearest-even under the default MXCSR, like the scalar path.
        *v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p.add(8 * k)), idv));
    }
    let [a, b, c, d] = r;
    // Pack to i16 then i8; the packs interleave 128-bit lanes, so permute back.
    let ab = _mm256_packs_epi32(a, b);
    let cd = _mm256_packs_epi32(c, d);
    let abcd = _mm256_packs_epi16(ab, cd);
    let v = _mm256_permutevar8x32_epi32(abcd, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(q as *mut __m256i, v);
    v
}

#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn quantize_q8_0(
    x: &[f32],
    qs: &mut [i8],
    d: &mut [f32],
    s: &mut [f32],
    sums: &mut [i16],
    q8_1_sums: bool,
) {
    let nb = x.len() / 32;
    assert!(qs.len() >= nb * 32 && d.len() >= nb && s.len() >= nb && sums.len() >= nb);
    let ones = _mm256_set1_epi8(1);
    for b in 0..nb {
        let p = x.as_ptr().add(32 * b);
        // Same rounding as the scalar path (see there): f16 scale, 127/amax quants.
        let amax = amax8(p, 4);
        let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        let v = round32(p, id, qs.as_mut_ptr().add(32 * b));
        // sum of the 32 quants: maddubs(1, v) gives pair sums as i16.
        let pairs = _mm256_maddubs_epi16(ones, v);
        let quads = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
        d[b] = super::scalar::round_f16(amax / 127.0);
        let sum = hsum_i32(quads);
        // |sum of 32| <= 32 * 127: exact in i16.
        sums[b] = sum as i16;
        s[b] = if q8_1_sums {
            super::scalar::round_f16(amax / 127.0 * sum as f32)
        } else {
            d[b] * sum as f32
        };
    }
}

#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn quantize_q8_k(x: &[f32], qs: &mut [i8], d: &mut [f32], bs: &mut [i16]) {
    let nb = x.len() / 256;
    assert!(qs.len() >= nb * 256 && d.len() >= nb && bs.len() >= nb * 16);
    let ones = _mm256_set1_epi8(1);
    for b in 0..nb {
        let p = x.as_ptr().add(256 * b);
        // llama.cpp's rule (see the scalar path): scale from the signed value
        // of largest magnitude; |iscale * x| <= 127 so no clamp is needed.
        let max = signed_max256(p);
        let iscale = if max != 0.0 { -127.0 / max } else { 0.0 };
        for k in 0..8 {
            let v = round32(p.add(32 * k), iscale, qs.as_mut_ptr().add(256 * b + 32 * k));
            // Pair sums (i16) -> sums of 16 via madd within each 128-bit half.
            let pairs = _mm256_maddubs_epi16(ones, v);
            let quads = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)); // 8 x i32 sums of 4
            let h = _mm256_hadd_epi32(quads, quads); // per lane: s01 s23 s01 s23
            let h = _mm256_hadd_epi32(h, h); // per lane: sum of 16 in every slot
            bs[16 * b + 2 * k] = _mm256_extract_epi32(h, 0) as i16;
            bs[16 * b + 2 * k + 1] = _mm256_extract_epi32(h, 4) as i16;
        }
        d[b] = if iscale != 0.0 { 1.0 / iscale } else { 0.0 };
    }
}

#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

// ---------------------------------------------------------------------------
// Matmul kernels. Each is generic over NR (activation rows per call,
// 1..=MAX_NR): the weight block is loaded and unpacked once, then dotted
// with every row. They are built twice (`matmul_kernels!`): for AVX2, where
// the integer dot is maddubs (u8 x i8 pairs -> i16) then madd (-> i32,
// applying a sub-block scale when there is one), and for AVX-512 VNNI, where
// `vpdpbusd` gives the same i32 lanes in one instruction and the compiler
// has 32 vector registers for the accumulators of many rows. The float
// sequence is the same, so both builds give bit-identical results.

/// Eight i32 lanes, each the sum of four u8 x i8 products of its bytes:
/// `vpdpbusd` (`yes`: the EVEX form, `vex`: AVX-VNNI's) or maddubs + madd
/// (`no`; exact too, since no pair of products here reaches the i16
/// limit).
macro_rules! dot_lanes {
    (yes, $u:expr, $s:expr) => {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), $u, $s)
    };
    (vex, $u:expr, $s:expr) => {
        _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), $u, $s)
    };
    (no, $u:expr, $s:expr) => {
        _mm256_madd_epi16(_mm256_maddubs_epi16($u, $s), _mm256_set1_epi16(1))
    };
}

/// Like `by_nr!` for the float kernels, which keep two accumulators per row
/// and would spill beyond 4 rows: more rows are done 4 at a time (the weight
/// row is in L1 by then).
macro_rules! by_nr4 {
    ($feat:literal, $f:ident) => {{
        unsafe fn row(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
            let mut i = 0;
            while i < x.len() {
                let (xs, os) = (
                    &x[i..(i + 4).min(x.len())],
                    &mut out[i..(i + 4).min(x.len())],
                );
                match xs.len() {
                    1 => $f::<1>(w, nb, xs, os),
                    2 => $f::<2>(w, nb, xs, os),
                    3 => $f::<3>(w, nb, xs, os),
                    _ => $f::<4>(w, nb, xs, os),
                }
                i += 4;
            }
        }
        per_row!(row)
    }};
}

/// The [`Kernel`] running the row kernel `$f::<NR>` (NR = `x.len()`) over
/// the weight rows, like `by_nr!` but with the row loop inside the kernels'
/// target features, so `$f` is inlined into it and the row count is
/// matched once per call instead of once per weight row.
macro_rules! rows {
    ($feat:literal, $f:ident) => {{
        #[target_feature(enable = $feat)]
        unsafe fn each<const NR: usize>(
            w: *const u8,
            rb: usize,
            nw: usize,
            nb: usize,
            x: &[Act],
            out: *mut f32,
            ldo: usize,
        ) {
            let mut tmp = [0f32; NR];
            for j in 0..nw {
                $f::<NR>(w.add(j * rb), nb, x, &mut tmp);
                for (i, &v) in tmp.iter().enumerate() {
                    *out.add(i * ldo + j) = v;
                }
            }
        }
        $crate::kernels::tile_kernel!(each)
    }};
}

/// Shared body of the 32-block types, with the float sequence of ggml's
/// AVX2 `ggml_vec_dot_*_q8_0/_q8_1` (and llamafile's sgemm, which matches
/// it), so results are bit-equal to llama.cpp's: per block, the 8 lane sums
/// of 4 integer products each go into an 8-wide accumulator by
/// `fma(d_w * d_x, lanes, acc)`; a stored min adds `fma(m, s_x, summs)`
/// (s_x: the activation block's f16 sum); the result is `hsum(acc) +
/// summs`. Bit-equal matters because the next matmul quantizes our outputs
/// (a one-ulp difference can flip a rounding). Quants with a fixed offset
/// (Q4_0: 8, Q5_0: 16) are made signed first, as ggml does. One weight row
/// at a time: tiles of several weight rows measured slower on an idle Zen 3
/// (SmolLM2 decode 33 tok/s with 4-row tiles, 49 with one).
macro_rules! kernel_32 {
    ($feat:literal, $name:ident, $bytes:expr, $unpack:ident, $offset:expr, $has_min:expr) => {
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn $name<const NR: usize>(
            w: *const u8,
            nb: usize,
            x: &[Act],
            out: &mut [f32],
        ) {
            let mut acc = [_mm256_setzero_ps(); NR];
            let mut summs = [0f32; NR];
            let x: &[Act; NR] = x.try_into().unwrap_unchecked();
            for b in 0..nb {
                let blk = w.add(b * $bytes);
                prefetch_ahead(blk, $bytes, 0, 1);
                let dw = h2f8(blk);
                let q = $unpack(blk);
                let q = if $offset != 0 {
                    _mm256_sub_epi8(q, _mm256_set1_epi8($offset))
                } else {
                    q
                };
                let qa = _mm256_sign_epi8(q, q);
                let m = if $has_min { h2f(blk.add(2)) } else { 0.0 };
                for i in 0..NR {
                    let xv = load(x[i].qs.add(32 * b) as *const u8);
                    let lanes = if $has_min {
                        dot_u8(q, xv)
                    } else {
                        dot_i8(qa, q, xv)
                    };
                    // Lane-wise d_w * d_x: the same product as a scalar one.
                    let d = _mm256_mul_ps(dw, _mm256_broadcast_ss(&*x[i].d.add(b)));
                    acc[i] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), acc[i]);
                    if $has_min {
                        summs[i] = m.mul_add(*x[i].s.add(b), summs[i]);
                    }
                }
            }
            finish(&acc, &summs, out);
        }
    };
}

/// Shared body of Q4_K / Q5_K (`$five`: OR in the fifth bit of each quant
/// from the 32 `qh` bytes, bit j for sub-block j).
///
/// Q4_K's float sequence is that of ggml's AVX2 kernels for Q4_K repacked
/// 8x8 (what llama.cpp runs on AVX2 CPUs), so results are bit-equal to
/// its (the next matmul quantizes them, and a
/// one-ulp difference can flip a rounding): per super-block, the exact
/// integer sums `sum_j sc_j (q . x)_j` and `sum_j m_j bsum_j` accumulate by
/// `fma(sum, d_w * d_x, acc)` and `fma(sum_m, dmin_w * d_x, acc_min)`; the
/// result is `acc - acc_min`. llama.cpp's gemm, which takes the batch's
/// whole groups of 4 rows, accumulates the same way per 64 values (pair of
/// sub-blocks) instead of per super-block.
macro_rules! k4_kernel {
    ($feat:literal, $name:ident, $bytes:expr, $qs_off:expr, $five:expr) => {
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn $name<const NR: usize>(
            w: *const u8,
            nb: usize,
            x: &[Act],
            out: &mut [f32],
        ) {
            let mut acc = [_mm256_setzero_ps(); NR];
            let (mut acc1, mut acc_min) = ([0f32; NR], [0f32; NR]);
            let x: &[Act; NR] = x.try_into().unwrap_unchecked();
            let low4 = _mm256_set1_epi8(0x0F);
            for b in 0..nb {
                let blk = w.add(b * $bytes);
                prefetch_ahead(blk, $bytes, 0, 1);
                let d = h2f(blk);
                let dmin = h2f(blk.add(2));
                let (sc, mn) = k4_scales(blk.add(4));
                let scv = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64(
                    sc.as_ptr() as *const __m128i,
                )));
                // -dmin * m_j as f32; the activation side holds dx * sum per 32.
                let m32 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(mn.as_ptr() as *const __m128i));
                let mv = _mm256_mul_ps(_mm256_cvtepi32_ps(m32), _mm256_set1_ps(-dmin));
                let mut sum = [_mm256_setzero_si256(); NR];
                let qh = if $five {
                    load(blk.add(16))
                } else {
                    _mm256_setzero_si256()
                };
                for jj in 0..4 {
                    let q = load(blk.add($qs_off + 32 * jj));
                    let mut lo = _mm256_and_si256(q, low4);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
                    if $five {
                        // Bit 2jj of qh -> sub-block 2jj, bit 2jj+1 -> 2jj+1.
                        let h = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * jj as i32));
                        let one = _mm256_set1_epi8(1);
                        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(h, one), 4));
                        hi = _mm256_or_si256(
                            hi,
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 1), one), 4),
                        );
                    }
                    // Broadcast scale j to all 16 lanes: a byte shuffle picking
                    // i16 lane j of `scv` (cheaper than GPR -> vector moves).
                    let pick = |j: usize| {
                        let m = (2 * j as i16) | ((2 * j as i16 + 1) << 8);
                        _mm256_shuffle_epi8(scv, _mm256_set1_epi16(m))
                    };
                    let (s_lo, s_hi) = (pick(2 * jj), pick(2 * jj + 1));
                    for i in 0..NR {
                        let xp = x[i].qs.add(256 * b + 64 * jj) as *const u8;
                        let p_lo = _mm256_maddubs_epi16(lo, load(xp));
                        let p_hi = _mm256_maddubs_epi16(hi, load(xp.add(32)));
                        let s = _mm256_add_epi32(
                            _mm256_madd_epi16(p_lo, s_lo),
                            _mm256_madd_epi16(p_hi, s_hi),
                        );
                        if !$five && x[i].in_group4 {
                            // ggml's gemm: accumulate per pair of sub-blocks.
                            let bs = x[i].bs.add(16 * b + 4 * jj);
                            let bsum = |k: usize| *bs.add(2 * k) as i32 + *bs.add(2 * k + 1) as i32;
                            let summ =
                                mn[2 * jj] as i32 * bsum(0) + mn[2 * jj + 1] as i32 * bsum(1);
                            let dx = *x[i].d.add(b);
                            acc1[i] = (hsum_i32(s) as f32).mul_add(d * dx, acc1[i]);
                            acc_min[i] = (summ as f32).mul_add(dmin * dx, acc_min[i]);
                        } else {
                            sum[i] = _mm256_add_epi32(sum[i], s);
                        }
                    }
                }
                for i in 0..NR {
                    if $five {
                        let s = _mm256_cvtepi32_ps(sum[i]);
                        let t = _mm256_mul_ps(mv, _mm256_loadu_ps(x[i].s.add(8 * b)));
                        let t = _mm256_fmadd_ps(s, _mm256_set1_ps(d * *x[i].d.add(b)), t);
                        acc[i] = _mm256_add_ps(acc[i], t);
                    } else if !x[i].in_group4 {
                        let bs = x[i].bs.add(16 * b);
                        let summ: i32 = (0..8)
                            .map(|j| {
                                mn[j] as i32 * (*bs.add(2 * j) as i32 + *bs.add(2 * j + 1) as i32)
                            })
                            .sum();
                        let dx = *x[i].d.add(b);
                        acc1[i] = (hsum_i32(sum[i]) as f32).mul_add(d * dx, acc1[i]);
                        acc_min[i] = (summ as f32).mul_add(dmin * dx, acc_min[i]);
                    }
                }
            }
            if $five {
                finish(&acc, &[0.0; NR], out);
            } else {
                for i in 0..NR {
                    out[i] = acc1[i] - acc_min[i];
                }
            }
        }
    };
}

/// Float weights: `$load(ptr to element k)` gives 8 f32 weights.
macro_rules! float_kernel {
    ($feat:literal, $name:ident, $esize:expr, |$p:ident| $load:expr) => {
        #[target_feature(enable = $feat)]
        unsafe fn $name<const NR: usize>(w: *const u8, n: usize, x: &[Act], out: &mut [f32]) {
            // Two accumulators per row hide the FMA latency.
            let mut acc = [[_mm256_setzero_ps(); 2]; NR];
            let x: &[Act; NR] = x.try_into().unwrap_unchecked();
            let mut k = 0;
            while k + 16 <= n {
                let $p = w.add(k * $esize);
                prefetch_ahead($p, 16 * $esize, 0, 1);
                let w0: __m256 = $load;
                let $p = w.add((k + 8) * $esize);
                let w1: __m256 = $load;
                for i in 0..NR {
                    let xp = x[i].f.add(k);
                    acc[i][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xp), acc[i][0]);
                    acc[i][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xp.add(8)), acc[i][1]);
                }
                k += 16;
            }
            let mut tail = [0f32; NR];
            if k < n {
                // Fewer than 16 left: finish with the scalar kernel.
                let mut xs = [x[0]; NR];
                for i in 0..NR {
                    xs[i].f = x[i].f.add(k);
                }
                crate::kernels::scalar::$name(w.add(k * $esize), n - k, &xs, &mut tail);
            }
            for i in 0..NR {
                out[i] = hsum(_mm256_add_ps(acc[i][0], acc[i][1])) + tail[i];
            }
        }
    };
}

/// The sixteen signed Q3_K scales (already minus 32, as `scalar::q3k_scales`
/// gives them) from the 12 scale bytes at `p`: low 4 bits from bytes 0..8
/// (their low nibbles, then their high ones), high 2 bits from bits
/// 2 (j / 4) of byte 8 + j % 4. Reads exactly 12 bytes.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) unsafe fn q3_scales_i8(p: *const u8) -> __m128i {
    let first8 = _mm_loadl_epi64(p as *const __m128i);
    let s = _mm_insert_epi32(first8, (p.add(8) as *const i32).read_unaligned(), 2);
    let m4 = _mm_set1_epi8(0x0F);
    let lo = _mm_unpacklo_epi64(
        _mm_and_si128(s, m4),
        _mm_and_si128(_mm_srli_epi16(s, 4), m4),
    );
    // Bytes 8..12 in every dword, dword g shifted right by 2g: the low two
    // bits of each byte are then its bits 2g, 2g + 1 (the shift is under 8,
    // so nothing from the byte above reaches them).
    let t = _mm_shuffle_epi8(
        s,
        _mm_setr_epi8(8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 11),
    );
    let hi = _mm_and_si128(
        _mm_srlv_epi32(t, _mm_setr_epi32(0, 2, 4, 6)),
        _mm_set1_epi8(3),
    );
    _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32))
}

/// Eight 6-bit scales and eight 6-bit mins of a Q4_K/Q5_K super-block.
#[inline(always)]
pub(crate) fn k4_scales(p: *const u8) -> ([u8; 8], [u8; 8]) {
    // SAFETY: callers pass a pointer to the 12 scale bytes of a block.
    let (w0, w1, w2) = unsafe {
        (
            (p as *const u32).read_unaligned(),
            (p.add(4) as *const u32).read_unaligned(),
            (p.add(8) as *const u32).read_unaligned(),
        )
    };
    let (m6, m4, m2) = (0x3f3f_3f3fu32, 0x0f0f_0f0fu32, 0x0303_0303u32);
    let sc_lo = w0 & m6;
    let mn_lo = w1 & m6;
    let sc_hi = (w2 & m4) | (((w0 >> 6) & m2) << 4);
    let mn_hi = ((w2 >> 4) & m4) | (((w1 >> 6) & m2) << 4);
    let (a, b) = (sc_lo.to_le_bytes(), sc_hi.to_le_bytes());
    let (c, d) = (mn_lo.to_le_bytes(), mn_hi.to_le_bytes());
    (
        [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]],
        [c[0], c[1], c[2], c[3], d[0], d[1], d[2], d[3]],
    )
}

/// The matmul kernels for one instruction set: `$feat` its target
/// features, `$vnni` whether its 8-bit dots are `vpdpbusd` (see `dot_lanes!`).
macro_rules! matmul_kernels {
    ($feat:literal, $vnni:ident) => {
        // ---------------------------------------------------------------------------
        // Matmul kernels. Each is generic over NR (activation rows per call,
        // 1..=MAX_NR): the weight block is loaded and unpacked once, then dotted
        // with every row. On AVX2 the integer dot is maddubs (u8 x i8 pairs -> i16)
        // then madd (-> i32, applying a sub-block scale when there is one).

        /// Q4_K: `q4_k`, except for rows that must follow llama.cpp's batch (gemm)
        /// order, which take `q4_k_rows`.
        unsafe fn q4_k_any(
            w: *const u8,
            rb: usize,
            nw: usize,
            nb: usize,
            x: &[Act],
            out: *mut f32,
            ldo: usize,
        ) {
            let k = if x.iter().any(|a| a.in_group4) {
                by_nr!(q4_k_rows)
            } else {
                rows!($feat, q4_k)
            };
            k(w, rb, nw, nb, x, out, ldo)
        }

        /// This build's kernel for `ty`, if there is one.
        pub(crate) fn kernel(ty: GgmlType) -> Option<Kernel> {
            use GgmlType::*;
            Some(match ty {
                F32 => by_nr4!($feat, f32w),
                F16 => by_nr4!($feat, f16w),
                BF16 => by_nr4!($feat, bf16w),
                Q4_0 => rows!($feat, q4_0),
                Q4_1 => rows!($feat, q4_1),
                Q5_0 => rows!($feat, q5_0),
                Q5_1 => rows!($feat, q5_1),
                Q8_0 => rows!($feat, q8_0),
                Q8_1 => rows!($feat, q8_1),
                Q4_K => q4_k_any,
                Q5_K => rows!($feat, q5_k),
                Q6_K => rows!($feat, q6_k),
                Q3_K => rows!($feat, q3_k),
                Q2_K => rows!($feat, q2_k),
                Q8_K => rows!($feat, q8_k),
                IQ4_NL => rows!($feat, iq4_nl),
                IQ4_XS => rows!($feat, iq4_xs),
                _ => return lattice_kernel(ty),
            })
        }

        lattice_kernels!($feat);

        #[target_feature(enable = $feat)]
        #[inline]
        pub(crate) unsafe fn h2f(p: *const u8) -> f32 {
            let bits = (p as *const u16).read_unaligned();
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
        }

        /// The f16 at `p` as f32 in all 8 lanes.
        #[target_feature(enable = $feat)]
        #[inline]
        pub(crate) unsafe fn h2f8(p: *const u8) -> __m256 {
            _mm256_cvtph_ps(_mm_set1_epi16((p as *const i16).read_unaligned()))
        }

        #[target_feature(enable = $feat)]
        #[inline]
        pub(crate) unsafe fn load(p: *const u8) -> __m256i {
            _mm256_loadu_si256(p as *const __m256i)
        }

        /// 16 bytes at `p` -> 32 nibbles: low nibbles in bytes 0..16, high in 16..32.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn nibbles32(p: *const u8) -> __m256i {
            let q = _mm_loadu_si128(p as *const __m128i);
            let v = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
            _mm256_and_si256(v, _mm256_set1_epi8(0x0F))
        }

        /// The 32 bits of `bits` spread to bytes: 0xFF where the bit is set.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn bits_to_bytes(bits: u32) -> __m256i {
            let v = _mm256_set1_epi32(bits as i32);
            // Byte i takes source byte i / 8, then tests bit i % 8.
            let spread = _mm256_shuffle_epi8(
                v,
                _mm256_setr_epi8(
                    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                    3, 3, 3, 3, 3, 3,
                ),
            );
            let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
            _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit)
        }

        /// Signed i8 x signed i8 dot of 32 pairs -> 8 i32 partial sums.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn dot_i8(w_abs: __m256i, w: __m256i, x: __m256i) -> __m256i {
            // maddubs needs one unsigned operand: |w| and x carrying w's sign.
            dot_lanes!($vnni, w_abs, _mm256_sign_epi8(x, w))
        }

        /// Unsigned u8 (< 128) x signed i8 dot of 32 pairs -> 8 i32 partial sums.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn dot_u8(w: __m256i, x: __m256i) -> __m256i {
            dot_lanes!($vnni, w, x)
        }

        /// Finish: horizontal sums of the NR accumulators into `out`.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn finish<const NR: usize>(acc: &[__m256; NR], extra: &[f32; NR], out: &mut [f32]) {
            for i in 0..NR {
                out[i] = hsum(acc[i]) + extra[i];
            }
        }

        // Unpack one 32-block's quants to 32 bytes.

        #[target_feature(enable = $feat)]
        #[inline]
        pub(crate) unsafe fn unpack_q8_0(blk: *const u8) -> __m256i {
            load(blk.add(2))
        }

        #[target_feature(enable = $feat)]
        #[inline]
        pub(crate) unsafe fn unpack_q8_1(blk: *const u8) -> __m256i {
            load(blk.add(4))
        }

        #[target_feature(enable = $feat)]
        #[inline]
        pub(crate) unsafe fn unpack_q4_0(blk: *const u8) -> __m256i {
            // Unsigned 0..15; the -8 offset is applied through the activation sums.
            nibbles32(blk.add(2))
        }

        #[target_feature(enable = $feat)]
        #[inline]
        pub(crate) unsafe fn unpack_q5_0(blk: *const u8) -> __m256i {
            // Unsigned 0..31; the -16 offset is applied through the activation sums.
            let hb = bits_to_bytes((blk.add(2) as *const u32).read_unaligned());
            _mm256_or_si256(
                nibbles32(blk.add(6)),
                _mm256_and_si256(hb, _mm256_set1_epi8(0x10)),
            )
        }

        #[target_feature(enable = $feat)]
        #[inline]
        pub(crate) unsafe fn unpack_q4_1(blk: *const u8) -> __m256i {
            nibbles32(blk.add(4))
        }

        #[target_feature(enable = $feat)]
        #[inline]
        pub(crate) unsafe fn unpack_q5_1(blk: *const u8) -> __m256i {
            let hb = bits_to_bytes((blk.add(4) as *const u32).read_unaligned());
            _mm256_or_si256(
                nibbles32(blk.add(8)),
                _mm256_and_si256(hb, _mm256_set1_epi8(0x10)),
            )
        }

        /// The 16 grid values of IQ4_NL / IQ4_XS in both 128-bit lanes, for
        /// `_mm256_shuffle_epi8` to look nibbles up in.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn iq4_grid() -> __m256i {
            let grid = blockdraft_gguf::quants::iquants::KVALUES;
            _mm256_broadcastsi128_si256(_mm_loadu_si128(grid.as_ptr() as *const __m128i))
        }

        /// IQ4_NL: each nibble looks its value up in the grid (a byte
        /// shuffle), then the signed dot of the 32-block types, in the float
        /// sequence of ggml's AVX2 `ggml_vec_dot_iq4_nl_q8_0`: even and odd
        /// blocks in two accumulators, added before the horizontal sum, and
        /// an odd last block added after it as a scalar multiply-add (fused,
        /// as llama.cpp's compiled code has it).
        #[target_feature(enable = $feat)]
        unsafe fn iq4_nl<const NR: usize>(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
            let grid = iq4_grid();
            let mut acc = [[_mm256_setzero_ps(); 2]; NR];
            let x: &[Act; NR] = x.try_into().unwrap_unchecked();
            let paired = nb / 2 * 2;
            for b in 0..paired {
                let blk = w.add(b * 18);
                let dw = h2f8(blk);
                let q = _mm256_shuffle_epi8(grid, nibbles32(blk.add(2)));
                let qa = _mm256_sign_epi8(q, q);
                for i in 0..NR {
                    let xv = load(x[i].qs.add(32 * b) as *const u8);
                    let d = _mm256_mul_ps(dw, _mm256_broadcast_ss(&*x[i].d.add(b)));
                    let lanes = _mm256_cvtepi32_ps(dot_i8(qa, q, xv));
                    acc[i][b % 2] = _mm256_fmadd_ps(d, lanes, acc[i][b % 2]);
                }
            }
            for i in 0..NR {
                out[i] = hsum(_mm256_add_ps(acc[i][0], acc[i][1]));
                if paired < nb {
                    use $crate::kernels::scalar::{iq4_value, nibble_dot};
                    let blk = w.add(paired * 18);
                    let qs = std::slice::from_raw_parts(blk.add(2), 16);
                    let xq = std::slice::from_raw_parts(x[i].qs.add(32 * paired), 32);
                    let sum = nibble_dot(qs, xq, iq4_value);
                    // Fused: the C compiler contracts ggml's `sumf += d * sumi`.
                    let d = *x[i].d.add(paired) * h2f(blk);
                    out[i] = d.mul_add(sum as f32, out[i]);
                }
            }
        }

        /// IQ4_XS: the grid lookup of `iq4_nl`, each 32-block's integer dot
        /// times its 6-bit scale, summed exactly per super-block; the float
        /// sequence of ggml's AVX2 `ggml_vec_dot_iq4_xs_q8_K`: one
        /// `fma(d_w * d_x, lanes, acc)` per super-block.
        #[target_feature(enable = $feat)]
        unsafe fn iq4_xs<const NR: usize>(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
            use blockdraft_gguf::quants::iquants::iq4_xs::{scale, BYTES, QS};
            let grid = iq4_grid();
            let mut acc = [_mm256_setzero_ps(); NR];
            let x: &[Act; NR] = x.try_into().unwrap_unchecked();
            for b in 0..nb {
                let blk = w.add(b * BYTES);
                prefetch_ahead(blk, BYTES, 0, 1);
                let head = std::slice::from_raw_parts(blk, QS);
                let mut sum = [_mm256_setzero_si256(); NR];
                for ib in 0..8 {
                    let q = _mm256_shuffle_epi8(grid, nibbles32(blk.add(QS + 16 * ib)));
                    let qa = _mm256_sign_epi8(q, q);
                    let ls = _mm256_set1_epi32(scale(head, ib));
                    for i in 0..NR {
                        let xv = load(x[i].qs.add(256 * b + 32 * ib) as *const u8);
                        let lanes = _mm256_mullo_epi32(dot_i8(qa, q, xv), ls);
                        sum[i] = _mm256_add_epi32(sum[i], lanes);
                    }
                }
                let dw = h2f(blk);
                for i in 0..NR {
                    let d = _mm256_set1_ps(dw * *x[i].d.add(b));
                    acc[i] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sum[i]), acc[i]);
                }
            }
            finish(&acc, &[0.0; NR], out);
        }

        // Q8_0/Q8_1/Q4_0/Q5_0 are signed; Q4_1/Q5_1 unsigned with a stored min.
        kernel_32!($feat, q8_0, 34, unpack_q8_0, 0, false);
        kernel_32!($feat, q8_1, 36, unpack_q8_1, 0, false);
        kernel_32!($feat, q4_0, 18, unpack_q4_0, 8, false);
        kernel_32!($feat, q5_0, 22, unpack_q5_0, 16, false);
        kernel_32!($feat, q4_1, 20, unpack_q4_1, 0, true);
        kernel_32!($feat, q5_1, 24, unpack_q5_1, 0, true);

        #[target_feature(enable = $feat)]
        unsafe fn q8_k<const NR: usize>(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
            let mut acc = [_mm256_setzero_ps(); NR];
            let x: &[Act; NR] = x.try_into().unwrap_unchecked();
            for b in 0..nb {
                let blk = w.add(b * 292);
                prefetch_ahead(blk, 292, 0, 1);
                let dw = (blk as *const f32).read_unaligned();
                let mut sum = [_mm256_setzero_si256(); NR];
                for c in 0..8 {
                    let q = load(blk.add(4 + 32 * c));
                    let qa = _mm256_sign_epi8(q, q);
                    for i in 0..NR {
                        let xq = load(x[i].qs.add(256 * b + 32 * c) as *const u8);
                        sum[i] = _mm256_add_epi32(sum[i], dot_i8(qa, q, xq));
                    }
                }
                for i in 0..NR {
                    let s = _mm256_cvtepi32_ps(sum[i]);
                    acc[i] = _mm256_fmadd_ps(s, _mm256_set1_ps(dw * *x[i].d.add(b)), acc[i]);
                }
            }
            finish(&acc, &[0.0; NR], out);
        }

        k4_kernel!($feat, q4_k_rows, 144, 16, false);
        k4_kernel!($feat, q5_k, 176, 48, true);

        /// Horizontal sums of eight i32x8 vectors: lane k of the result = sum of `v[k]`.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn reduce8(v: &[__m256i; 8]) -> __m256i {
            let h01 = _mm256_hadd_epi32(v[0], v[1]);
            let h23 = _mm256_hadd_epi32(v[2], v[3]);
            let h45 = _mm256_hadd_epi32(v[4], v[5]);
            let h67 = _mm256_hadd_epi32(v[6], v[7]);
            // Per 128-bit half: partial sums of [v0 v1 v2 v3] and [v4 v5 v6 v7].
            let a = _mm256_hadd_epi32(h01, h23);
            let b = _mm256_hadd_epi32(h45, h67);
            let lo = _mm256_permute2x128_si256(a, b, 0x20);
            let hi = _mm256_permute2x128_si256(a, b, 0x31);
            _mm256_add_epi32(lo, hi)
        }

        /// Q4_K for NR activation rows (NR <= 8) with `q4_k_rows`' float sequence
        /// for each output (llama.cpp's gemv): the integer sums are exact, so they
        /// are reduced for all rows at once, and the two per-super-block FMAs of
        /// every output run as lanes of one vector (lane i: activation row i), with
        /// the weight's two scales converted once for all of them.
        #[target_feature(enable = $feat)]
        unsafe fn q4_k<const NR: usize>(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
            let mut acc = _mm256_setzero_ps();
            let mut acc_min = _mm256_setzero_ps();
            let x: &[Act; NR] = x.try_into().unwrap_unchecked();
            let low4 = _mm256_set1_epi8(0x0F);
            for b in 0..nb {
                let mut sum = [_mm256_setzero_si256(); 8];
                let mut msum = [_mm256_setzero_si256(); 8];
                let mut dx = [0f32; 8];
                let blk = w.add(b * 144);
                let (sc, mn) = k4_scales(blk.add(4));
                let scv = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64(
                    sc.as_ptr() as *const __m128i,
                )));
                // Min j for each 16-sum of the activations (two per sub-block).
                let m8 = _mm_loadl_epi64(mn.as_ptr() as *const __m128i);
                let mn16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
                for jj in 0..4 {
                    let q = load(blk.add(16 + 32 * jj));
                    let lo = _mm256_and_si256(q, low4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
                    // Scale j in all 16 i16 lanes: a byte shuffle of `scv`.
                    let pick = |j: usize| {
                        let m = (2 * j as i16) | ((2 * j as i16 + 1) << 8);
                        _mm256_shuffle_epi8(scv, _mm256_set1_epi16(m))
                    };
                    let (s_lo, s_hi) = (pick(2 * jj), pick(2 * jj + 1));
                    for i in 0..NR {
                        let xp = x[i].qs.add(256 * b + 64 * jj) as *const u8;
                        let p_lo = _mm256_maddubs_epi16(lo, load(xp));
                        let p_hi = _mm256_maddubs_epi16(hi, load(xp.add(32)));
                        let s = _mm256_add_epi32(
                            _mm256_madd_epi16(p_lo, s_lo),
                            _mm256_madd_epi16(p_hi, s_hi),
                        );
                        sum[i] = _mm256_add_epi32(sum[i], s);
                    }
                }
                for (i, xi) in x.iter().enumerate() {
                    msum[i] = _mm256_madd_epi16(load(xi.bs.add(16 * b) as *const u8), mn16);
                    dx[i] = *xi.d.add(b);
                }
                let s = _mm256_cvtepi32_ps(reduce8(&sum));
                let m = _mm256_cvtepi32_ps(reduce8(&msum));
                let dxv = _mm256_loadu_ps(dx.as_ptr());
                let dd = _mm256_mul_ps(h2f8(blk), dxv);
                let dm = _mm256_mul_ps(h2f8(blk.add(2)), dxv);
                acc = _mm256_fmadd_ps(s, dd, acc);
                acc_min = _mm256_fmadd_ps(m, dm, acc_min);
            }
            let mut r = [0f32; 8];
            _mm256_storeu_ps(r.as_mut_ptr(), _mm256_sub_ps(acc, acc_min));
            out[..NR].copy_from_slice(&r[..NR]);
        }

        /// From sixteen i16 scales, scale `is` (even) in the low 8 lanes and
        /// `is + 1` in the high 8 (the scales of two 16-value sub-blocks
        /// covered by one 32-byte maddubs): the dword holding both, in every
        /// lane, then each 128-bit half's i16 of it.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn scale_pair(sc16: __m256i, is: usize) -> __m256i {
            let both = _mm256_permutevar8x32_epi32(sc16, _mm256_set1_epi32(is as i32 / 2));
            _mm256_shuffle_epi8(
                both,
                _mm256_setr_epi8(
                    0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3,
                    2, 3, 2, 3, 2, 3,
                ),
            )
        }

        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn q6_k<const NR: usize>(
            w: *const u8,
            nb: usize,
            x: &[Act],
            out: &mut [f32],
        ) {
            let mut acc = [_mm256_setzero_ps(); NR];
            let x: &[Act; NR] = x.try_into().unwrap_unchecked();
            let low4 = _mm256_set1_epi8(0x0F);
            let low2 = _mm256_set1_epi8(0x03);
            for b in 0..nb {
                let blk = w.add(b * 210);
                prefetch_ahead(blk, 210, 0, 1);
                let d = h2f(blk.add(208));
                let sc = blk.add(192) as *const i8;
                // Quants are stored +32; the offset is removed with the 16-sums:
                // sum (q - 32) x = sum q x - 32 sum_g sc_g bsum_g.
                let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc as *const __m128i));
                let dup_lo = _mm256_unpacklo_epi16(sc16, sc16);
                let dup_hi = _mm256_unpackhi_epi16(sc16, sc16);
                let mut sum = [_mm256_setzero_si256(); NR];
                for h in 0..2 {
                    let ql0 = load(blk.add(64 * h));
                    let ql1 = load(blk.add(64 * h + 32));
                    let qh = load(blk.add(128 + 32 * h));
                    let q = [
                        _mm256_or_si256(
                            _mm256_and_si256(ql0, low4),
                            _mm256_slli_epi16(_mm256_and_si256(qh, low2), 4),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(ql1, low4),
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), low2), 4),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), low2), 4),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), low2), 4),
                        ),
                    ];
                    // Scale pairs (8h + 2k, 8h + 2k + 1) by one cross-lane permute:
                    // dup_lo holds scales 0-3, 8-11 and dup_hi 4-7, 12-15, each
                    // doubled into a 32-bit lane.
                    let (o0, o1) = (4 * h as i32, 4 * h as i32 + 1);
                    let (o2, o3) = (4 * h as i32 + 2, 4 * h as i32 + 3);
                    let perm = |v: __m256i, a: i32, b: i32| {
                        _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(a, a, a, a, b, b, b, b))
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
                            let p = _mm256_maddubs_epi16(q[k], load(xp.add(32 * k)));
                            sum[i] = _mm256_add_epi32(sum[i], _mm256_madd_epi16(p, s[k]));
                        }
                    }
                }
                for i in 0..NR {
                    let bs = load(x[i].bs.add(16 * b) as *const u8);
                    let off = _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5);
                    let s = _mm256_cvtepi32_ps(_mm256_sub_epi32(sum[i], off));
                    acc[i] = _mm256_fmadd_ps(s, _mm256_set1_ps(d * *x[i].d.add(b)), acc[i]);
                }
            }
            finish(&acc, &[0.0; NR], out);
        }

        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn q3_k<const NR: usize>(
            w: *const u8,
            nb: usize,
            x: &[Act],
            out: &mut [f32],
        ) {
            let mut acc = [_mm256_setzero_ps(); NR];
            let x: &[Act; NR] = x.try_into().unwrap_unchecked();
            let low2 = _mm256_set1_epi8(0x03);
            let one = _mm256_set1_epi8(1);
            for b in 0..nb {
                let blk = w.add(b * 110);
                prefetch_ahead(blk, 110, 0, 1);
                let d = h2f(blk.add(108));
                let sc16 = _mm256_cvtepi8_epi16(q3_scales_i8(blk.add(96)));
                let hm = load(blk);
                let mut sum = [_mm256_setzero_si256(); NR];
                for h in 0..2 {
                    let qs = load(blk.add(32 + 32 * h));
                    for j in 0..4 {
                        let sh = _mm_cvtsi32_si128(2 * j as i32);
                        let q2 = _mm256_and_si256(_mm256_srl_epi16(qs, sh), low2);
                        let hb = _mm256_and_si256(
                            _mm256_srl_epi16(hm, _mm_cvtsi32_si128((4 * h + j) as i32)),
                            one,
                        );
                        // Stored as q2 - 4 * (1 - hbit); use q2 + 4 hbit (>= 0), subtract 4 later.
                        let q = _mm256_or_si256(q2, _mm256_slli_epi16(hb, 2));
                        let s = scale_pair(sc16, 8 * h + 2 * j);
                        for i in 0..NR {
                            let xp = x[i].qs.add(256 * b + 128 * h + 32 * j) as *const u8;
                            let p = _mm256_maddubs_epi16(q, load(xp));
                            sum[i] = _mm256_add_epi32(sum[i], _mm256_madd_epi16(p, s));
                        }
                    }
                }
                for i in 0..NR {
                    let bs = load(x[i].bs.add(16 * b) as *const u8);
                    let off = _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 2);
                    let s = _mm256_cvtepi32_ps(_mm256_sub_epi32(sum[i], off));
                    acc[i] = _mm256_fmadd_ps(s, _mm256_set1_ps(d * *x[i].d.add(b)), acc[i]);
                }
            }
            finish(&acc, &[0.0; NR], out);
        }

        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn q2_k<const NR: usize>(
            w: *const u8,
            nb: usize,
            x: &[Act],
            out: &mut [f32],
        ) {
            let mut acc = [_mm256_setzero_ps(); NR];
            let x: &[Act; NR] = x.try_into().unwrap_unchecked();
            let low2 = _mm256_set1_epi8(0x03);
            for b in 0..nb {
                let blk = w.add(b * 84);
                prefetch_ahead(blk, 84, 0, 1);
                let d = h2f(blk.add(80));
                let dmin = h2f(blk.add(82));
                let scb = _mm_loadu_si128(blk as *const __m128i);
                let sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(scb, _mm_set1_epi8(0x0F)));
                let mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(
                    _mm_srli_epi16(scb, 4),
                    _mm_set1_epi8(0x0F),
                ));
                let mut sum = [_mm256_setzero_si256(); NR];
                for h in 0..2 {
                    let qs = load(blk.add(16 + 32 * h));
                    for j in 0..4 {
                        let q = _mm256_and_si256(
                            _mm256_srl_epi16(qs, _mm_cvtsi32_si128(2 * j as i32)),
                            low2,
                        );
                        let s = scale_pair(sc16, 8 * h + 2 * j);
                        for i in 0..NR {
                            let xp = x[i].qs.add(256 * b + 128 * h + 32 * j) as *const u8;
                            let p = _mm256_maddubs_epi16(q, load(xp));
                            sum[i] = _mm256_add_epi32(sum[i], _mm256_madd_epi16(p, s));
                        }
                    }
                }
                for i in 0..NR {
                    let xd = *x[i].d.add(b);
                    let bs = load(x[i].bs.add(16 * b) as *const u8);
                    let msum = _mm256_cvtepi32_ps(_mm256_madd_epi16(bs, mins16));
                    acc[i] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[i]), _mm256_set1_ps(d * xd), acc[i]);
                    acc[i] = _mm256_fmadd_ps(msum, _mm256_set1_ps(-dmin * xd), acc[i]);
                }
            }
            finish(&acc, &[0.0; NR], out);
        }

        float_kernel!($feat, f32w, 4, |p| _mm256_loadu_ps(p as *const f32));
        float_kernel!($feat, f16w, 2, |p| _mm256_cvtph_ps(_mm_loadu_si128(
            p as *const __m128i
        )));
        float_kernel!($feat, bf16w, 2, |p| _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i)),
            16
        )));
    };
}

/// The AVX2 + FMA + F16C build.
pub(crate) mod avx2 {
    use super::*;
    matmul_kernels!("avx2,fma,f16c", no);
}

/// The AVX2 build with AVX-VNNI dots (same results bit for bit).
pub(crate) mod avx_vnni {
    use super::*;
    matmul_kernels!("avx2,fma,f16c,avxvnni", vex);
}

/// The AVX-512 F/BW/VL + VNNI build.
pub(crate) mod avx512 {
    use super::*;
    matmul_kernels!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", yes);
}

/// SwiGLU of 8 values, `g / (1 + exp(-g)) * u` with `ops::expf_ggml`'s float
/// sequence, where every `|g| <= 87` (its branchless range); returns false,
/// writing nothing, otherwise.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn swiglu_8(g: &[f32; 8], u: &[f32; 8], out: &mut [f32; 8]) -> bool {
    let c = |bits: u32| _mm256_set1_ps(f32::from_bits(bits));
    // SAFETY: 8 values each.
    let (g, u) = unsafe { (_mm256_loadu_ps(g.as_ptr()), _mm256_loadu_ps(u.as_ptr())) };
    let abs = _mm256_andnot_ps(_mm256_set1_ps(-0.0), g);
    // Ordered compare: a NaN fails it too.
    if _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(abs, _mm256_set1_ps(87.0))) != 0xff {
        return false;
    }
    let x = _mm256_sub_ps(_mm256_setzero_ps(), g);
    let r = c(0x4b40_0000);
    let z = _mm256_fmadd_ps(x, c(0x3fb8_aa3b), r);
    let n = _mm256_sub_ps(z, r);
    let b = _mm256_fnmadd_ps(n, c(0x35bf_be8e), _mm256_fnmadd_ps(n, c(0x3f31_7200), x));
    let k = _mm256_castsi256_ps(_mm256_add_epi32(
        _mm256_slli_epi32::<23>(_mm256_castps_si256(z)),
        _mm256_castps_si256(_mm256_set1_ps(1.0)),
    ));
    let b2 = _mm256_mul_ps(b, b);
    let j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
        b2,
        _mm256_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
    );
    let j = _mm256_fmadd_ps(j, b2, _mm256_mul_ps(c(0x3f7f_fff6), b));
    let e = _mm256_fmadd_ps(k, j, k);
    let y = _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0), e)), u);
    // SAFETY: 8 values.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), y) };
    true
}
