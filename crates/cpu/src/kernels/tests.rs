//! Kernel tests: every weight type against a dequantize-then-f64 reference,
//! every SIMD kernel against the scalar one, thread counts against each other.

use super::*;
use blockdraft_gguf::GgmlType::{self, *};

pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub(crate) fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    pub(crate) fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

pub(crate) const ALL_TYPES: [GgmlType; 28] = [
    F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_NL,
    IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0, TQ2_0, MXFP4, NVFP4,
];

/// The types `dequant_row` has no second reading of: their gguf readers are
/// checked bit for bit against the `gguf` package's by the gguf crate's
/// fixtures instead.
const FIXTURE_CHECKED: [GgmlType; 11] = [
    IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0, TQ2_0, MXFP4, NVFP4,
];

fn put_f16(b: &mut [u8], at: usize, v: f32) {
    b[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
}

/// Random but valid weight data: random quant bits, small finite scales.
pub(crate) fn random_weights(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let n = rows * cols;
    match ty {
        F32 => return (0..n).flat_map(|_| rng.f().to_le_bytes()).collect(),
        F16 => {
            return (0..n)
                .flat_map(|_| half::f16::from_f32(rng.f()).to_bits().to_le_bytes())
                .collect()
        }
        BF16 => {
            return (0..n)
                .flat_map(|_| ((rng.f().to_bits() >> 16) as u16).to_le_bytes())
                .collect()
        }
        _ => {}
    }
    let (bl, bb) = (ty.block_len(), ty.block_bytes());
    let mut data: Vec<u8> = (0..n / bl * bb).map(|_| rng.next() as u8).collect();
    for blk in data.chunks_exact_mut(bb) {
        // Scales positive and negative, like real files (Q6_K/Q3_K d may be either).
        let mut sc = || rng.f() * 0.05;
        match ty {
            Q4_0 | Q5_0 | Q8_0 | Q4_K | Q5_K | IQ4_NL | IQ4_XS => {
                put_f16(blk, 0, sc());
                if matches!(ty, Q4_K | Q5_K) {
                    put_f16(blk, 2, sc().abs());
                }
            }
            Q4_1 | Q5_1 | Q8_1 => {
                put_f16(blk, 0, sc());
                put_f16(blk, 2, sc());
            }
            Q2_K => {
                put_f16(blk, 80, sc());
                put_f16(blk, 82, sc().abs());
            }
            Q3_K => put_f16(blk, 108, sc()),
            Q6_K => put_f16(blk, 208, sc()),
            IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S | IQ1_M => {
                blockdraft_gguf::quants::lattice::set_scale(ty, blk, sc());
            }
            TQ1_0 => put_f16(blk, 52, sc()),
            TQ2_0 => put_f16(blk, 64, sc()),
            // E8M0 exponents 2^-9 .. 2^-3 (halved): weights up to ~0.02.
            MXFP4 => blk[0] = 118 + blk[0] % 7,
            // E4M3 scales 2^-8 .. 2^-5 (halved; exponents 0..3).
            NVFP4 => blk[..4].iter_mut().for_each(|s| *s &= 0x1F),
            Q8_K => {
                blk[..4].copy_from_slice(&(sc() * 0.1).to_le_bytes());
                // Real Q8_K quants are in -127..=127.
                for q in &mut blk[4..260] {
                    if *q == 0x80 {
                        *q = 0x81;
                    }
                }
            }
            _ => unreachable!(),
        }
    }
    data
}

fn f16v(b: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// Independent scalar dequantization of one row (a second reading of the
/// formats, cross-checked against the gguf crate's), written from the ggml
/// format description (element-order loops, not the kernels' code).
pub(crate) fn dequant_row(ty: GgmlType, b: &[u8], out: &mut [f32]) {
    let bl = ty.block_len();
    let bb = ty.block_bytes();
    for (blk, y) in b.chunks_exact(bb).zip(out.chunks_exact_mut(bl)) {
        match ty {
            F32 => y[0] = f32::from_le_bytes(blk.try_into().unwrap()),
            F16 => y[0] = f16v(blk, 0),
            BF16 => y[0] = f32::from_bits((u16::from_le_bytes([blk[0], blk[1]]) as u32) << 16),
            Q4_0 | Q4_1 | Q5_0 | Q5_1 => {
                let d = f16v(blk, 0);
                let has_m = matches!(ty, Q4_1 | Q5_1);
                let m = if has_m { f16v(blk, 2) } else { 0.0 };
                let five = matches!(ty, Q5_0 | Q5_1);
                let mut off = if has_m { 4 } else { 2 };
                let qh = if five {
                    off += 4;
                    u32::from_le_bytes(blk[off - 4..off].try_into().unwrap())
                } else {
                    0
                };
                for (i, v) in y.iter_mut().enumerate() {
                    let byte = blk[off + i % 16];
                    let mut q = if i < 16 { byte & 15 } else { byte >> 4 } as i32;
                    if five {
                        q |= (((qh >> i) & 1) << 4) as i32;
                    }
                    *v = match ty {
                        Q4_0 => (q - 8) as f32 * d,
                        Q5_0 => (q - 16) as f32 * d,
                        _ => q as f32 * d + m,
                    };
                }
            }
            Q8_0 | Q8_1 => {
                let d = f16v(blk, 0);
                let off = bb - 32;
                for (i, v) in y.iter_mut().enumerate() {
                    *v = blk[off + i] as i8 as f32 * d;
                }
            }
            Q8_K => {
                let d = f32::from_le_bytes(blk[..4].try_into().unwrap());
                for (i, v) in y.iter_mut().enumerate() {
                    *v = blk[4 + i] as i8 as f32 * d;
                }
            }
            IQ4_NL | IQ4_XS => {
                const GRID: [i8; 16] = [
                    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
                ];
                let d = f16v(blk, 0);
                let qs = if ty == IQ4_NL { &blk[2..] } else { &blk[8..] };
                for (i, v) in y.iter_mut().enumerate() {
                    // Element i of 32-block i / 32: byte 16 (i / 32) + i % 16,
                    // low nibble for the block's first 16 elements.
                    let (ib, l) = (i / 32, i % 32);
                    let byte = qs[16 * ib + l % 16];
                    let q = if l < 16 { byte & 15 } else { byte >> 4 };
                    let scale = if ty == IQ4_NL {
                        1
                    } else {
                        let lo = (blk[4 + ib / 2] >> (4 * (ib % 2))) & 15;
                        let hi = (u16::from_le_bytes([blk[2], blk[3]]) >> (2 * ib)) & 3;
                        (lo as i32 | (hi as i32) << 4) - 32
                    };
                    *v = d * scale as f32 * GRID[q as usize] as f32;
                }
            }
            Q2_K => {
                let (d, dmin) = (f16v(blk, 80), f16v(blk, 82));
                for (i, v) in y.iter_mut().enumerate() {
                    // i = 128 h + 32 j + l32 ; sub-block i / 16.
                    let (h, j, l) = (i / 128, (i % 128) / 32, i % 32);
                    let q = (blk[16 + 32 * h + l] >> (2 * j)) & 3;
                    let sc = blk[i / 16];
                    *v = d * (sc & 15) as f32 * q as f32 - dmin * (sc >> 4) as f32;
                }
            }
            Q3_K => {
                let d = f16v(blk, 108);
                let s = &blk[96..108];
                for (i, v) in y.iter_mut().enumerate() {
                    let (h, j, l) = (i / 128, (i % 128) / 32, i % 32);
                    let q = ((blk[32 + 32 * h + l] >> (2 * j)) & 3) as i32;
                    let hb = (blk[l] >> (4 * h + j)) & 1;
                    let q = q - if hb == 1 { 0 } else { 4 };
                    let is = i / 16;
                    // 6-bit scale: low 4 bits from bytes 0..8 (nibbles), high 2 bits from 8..12.
                    let lo = if is < 8 { s[is] & 15 } else { s[is - 8] >> 4 };
                    let hi = (s[8 + is % 4] >> (2 * (is / 4))) & 3;
                    let sc = (lo | (hi << 4)) as i32 - 32;
                    *v = d * sc as f32 * q as f32;
                }
            }
            Q4_K | Q5_K => {
                let (d, dmin) = (f16v(blk, 0), f16v(blk, 2));
                let s = &blk[4..16];
                let qs_off = if ty == Q5_K { 48 } else { 16 };
                for (i, v) in y.iter_mut().enumerate() {
                    let j = i / 32; // sub-block
                    let (sc, m) = if j < 4 {
                        (s[j] & 63, s[j + 4] & 63)
                    } else {
                        (
                            (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4),
                            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
                        )
                    };
                    let byte = blk[qs_off + 32 * (j / 2) + i % 32];
                    let mut q = if j % 2 == 0 { byte & 15 } else { byte >> 4 } as i32;
                    if ty == Q5_K {
                        q |= (((blk[16 + i % 32] >> j) & 1) as i32) << 4;
                    }
                    *v = d * sc as f32 * q as f32 - dmin * m as f32;
                }
            }
            Q6_K => {
                let d = f16v(blk, 208);
                for (i, v) in y.iter_mut().enumerate() {
                    let (h, k, l) = (i / 128, (i % 128) / 32, i % 32);
                    let ql = blk[64 * h + l + 32 * (k % 2)];
                    let lo = if k < 2 { ql & 15 } else { ql >> 4 };
                    let hi = (blk[128 + 32 * h + l] >> (2 * k)) & 3;
                    let q = (lo | (hi << 4)) as i32 - 32;
                    let sc = blk[192 + i / 16] as i8 as f32;
                    *v = d * sc * q as f32;
                }
            }
            t => panic!("no reference for {t}"),
        }
    }
}

/// The activations as the kernels see them: quantized then dequantized.
fn requantized(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    let blk = match act_kind(ty) {
        ActKind::F32 => return x.to_vec(),
        ActKind::Q8_0 => 32,
        ActKind::Q8K => 256,
    };
    let mut q = vec![0i8; x.len()];
    let nb = x.len() / blk;
    let mut d = vec![0f32; nb];
    if blk == 32 {
        scalar::quantize_q8_0(
            x,
            &mut q,
            &mut d,
            &mut vec![0f32; nb],
            &mut vec![0i16; nb],
            false,
        );
    } else {
        scalar::quantize_q8_k(x, &mut q, &mut d, &mut vec![0i16; x.len() / 16]);
    }
    q.iter()
        .enumerate()
        .map(|(i, &v)| v as f32 * d[i / blk])
        .collect()
}

fn shapes(ty: GgmlType) -> Vec<(usize, usize)> {
    let mut v = Vec::new();
    // 352: an odd number of 32-blocks.
    for cols in [256, 352, 512, 896, 1536] {
        if cols % ty.block_len() != 0 {
            continue;
        }
        for rows in [1, 7, 16, 37] {
            v.push((rows, cols));
        }
    }
    v
}

const NS: [usize; 6] = [1, 2, 3, 8, 16, 33];

/// `matmul` (best kernels, 2 threads) against dequantized weights times the
/// requantized activations in f64 (tight: only float rounding differs), and
/// against the true activations within the Q8 rounding error.
#[test]
fn matmul_matches_dequantized_reference() {
    let pool = ThreadPool::new(2);
    let mut rng = Rng::new(1);
    for ty in ALL_TYPES {
        for (rows, cols) in shapes(ty) {
            let data = random_weights(ty, rows, cols, &mut rng);
            let mut wf = vec![0f32; rows * cols];
            let row_bytes = cols / ty.block_len() * ty.block_bytes();
            for o in 0..rows {
                let r = &data[o * row_bytes..(o + 1) * row_bytes];
                blockdraft_gguf::quants::dequantize(ty, r, &mut wf[o * cols..(o + 1) * cols])
                    .unwrap();
            }
            let w = WeightRef {
                ty,
                data: &data,
                rows,
                cols,
            };
            for n in NS {
                let x: Vec<f32> = (0..n * cols).map(|_| rng.f()).collect();
                let mut out = vec![f32::NAN; n * rows];
                matmul(&pool, &w, &x, &mut out);
                for r in 0..n {
                    let xr = &x[r * cols..(r + 1) * cols];
                    let xq = requantized(ty, xr);
                    let blk = match act_kind(ty) {
                        ActKind::F32 => 1,
                        ActKind::Q8_0 => 32,
                        ActKind::Q8K => 256,
                    };
                    for o in 0..rows {
                        let wr = &wf[o * cols..(o + 1) * cols];
                        let (mut exact, mut quant, mut mag, mut var) = (0f64, 0f64, 0f64, 0f64);
                        for k in 0..cols {
                            let (wv, xv) = (wr[k] as f64, xr[k] as f64);
                            exact += wv * xv;
                            quant += wv * xq[k] as f64;
                            mag += (wv * xv).abs();
                            if blk > 1 {
                                let b = k / blk * blk;
                                let amax = xr[b..b + blk].iter().fold(0f32, |m, v| m.max(v.abs()));
                                let step = amax as f64 / 127.0;
                                // Rounding error ~ uniform in ±step/2: variance step²/12.
                                var += wv * wv * step * step / 12.0;
                            }
                        }
                        let got = out[r * rows + o] as f64;
                        // Float accumulation error (f32 sums, f16 scale products).
                        let fl = 1e-4 * mag + 1e-6;
                        assert!(
                            (got - quant).abs() <= fl,
                            "{ty} {rows}x{cols} n={n} r={r} o={o}: got {got} want {quant} (requantized x)"
                        );
                        // Six standard deviations of the activation rounding.
                        let tol = 6.0 * var.sqrt() + fl;
                        assert!(
                            (got - exact).abs() <= tol,
                            "{ty} {rows}x{cols} n={n}: got {got} want {exact} tol {tol}"
                        );
                    }
                }
            }
        }
    }
}

/// The SIMD kernels to check for `ty`: the one `best_kernel` picks and,
/// on aarch64 CPUs with `sdot`, the baseline NEON build as well.
fn simd_variants(ty: GgmlType) -> Vec<(GgmlType, Kernel)> {
    let best = (ty, best_kernel(ty));
    #[cfg(target_arch = "aarch64")]
    {
        // tests/run.sh runs these under qemu's `max` CPU, which has sdot:
        // make sure that path is the one `best_kernel` took.
        if std::env::var_os("BLOCKDRAFT_EXPECT_DOTPROD").is_some() {
            assert!(super::neon::has_dotprod(), "the CPU should report dotprod");
        }
        if super::neon::has_dotprod() {
            let baseline = super::neon::kernel_with(ty, false).map(|k| (ty, k));
            return std::iter::once(best).chain(baseline).collect();
        }
    }
    vec![best]
}

/// Every kernel `best_kernel` picks agrees with the scalar one.
#[test]
fn simd_kernels_match_scalar() {
    // The wasm test build enables simd128 (.cargo/config.toml): its kernels
    // are the ones under test there.
    #[cfg(target_arch = "wasm32")]
    assert_eq!(super::simd_level(), "simd128");
    #[cfg(target_arch = "aarch64")]
    assert!(
        std::env::var_os("BLOCKDRAFT_NO_SIMD").is_some() || super::simd_level().starts_with("neon")
    );
    let pairs = |ty| {
        simd_variants(ty)
            .into_iter()
            .map(move |(ty, best)| (ty, best, scalar_kernel(ty)))
    };
    matmul_pairs(2, pairs, |case, a, b| {
        for (i, (p, q)) in a.iter().zip(b).enumerate() {
            let tol = 1e-4 * (p.abs() + q.abs()) + 2e-3;
            assert!((p - q).abs() <= tol, "{case} [{i}]: simd {p} scalar {q}");
        }
    });
}

/// For every type (with the kernel pairs `pairs` gives for it), shape of
/// `shapes` and row count of `NS`: random weights and activations through
/// both kernels, `check(case, first's output, second's)`.
fn matmul_pairs<I: Iterator<Item = (GgmlType, Kernel, Kernel)>>(
    seed: u64,
    pairs: impl Fn(GgmlType) -> I,
    check: impl Fn(&str, &[f32], &[f32]),
) {
    let pool = ThreadPool::new(1);
    let mut rng = Rng::new(seed);
    for (ty, first, second) in ALL_TYPES.into_iter().flat_map(pairs) {
        for (rows, cols) in shapes(ty) {
            let data = random_weights(ty, rows, cols, &mut rng);
            let w = WeightRef {
                ty,
                data: &data,
                rows,
                cols,
            };
            for n in NS {
                let x: Vec<f32> = (0..n * cols).map(|_| rng.f() * 3.0).collect();
                let mut a = vec![0f32; n * rows];
                let mut b = vec![0f32; n * rows];
                matmul_with(&pool, &w, &x, &mut a, first, false);
                matmul_with(&pool, &w, &x, &mut b, second, false);
                check(&format!("{ty} {rows}x{cols} n={n}"), &a, &b);
            }
        }
    }
}

/// The AVX-512 VNNI build of the kernels gives the AVX2 build's results bit
/// for bit: same float sequence, and `vpdpbusd` lanes equal to those of
/// maddubs + madd.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_kernels_equal_the_avx2_ones_bit_for_bit() {
    if !super::x86::has_avx512_vnni() {
        eprintln!("SKIPPED: this CPU has no AVX-512 VNNI (or BLOCKDRAFT_NO_AVX512 is set)");
        return;
    }
    assert_equal_to_avx2_bit_for_bit(5, super::x86::avx512_kernel);
}

/// For every type where `build` has a kernel: its results equal the AVX2
/// build's bit for bit.
#[cfg(target_arch = "x86_64")]
fn assert_equal_to_avx2_bit_for_bit(seed: u64, build: fn(GgmlType) -> Option<Kernel>) {
    let pairs = |ty| {
        build(ty)
            .zip(super::x86::avx2::kernel(ty))
            .map(|(other, base)| (ty, other, base))
            .into_iter()
    };
    matmul_pairs(seed, pairs, |case, a, b| {
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(a), bits(b), "{case}");
    });
}

/// The AVX-VNNI build gives the AVX2 build's results bit for bit (its
/// `vpdpbusd` lanes equal maddubs + madd's).
#[cfg(target_arch = "x86_64")]
#[test]
fn avx_vnni_kernels_equal_the_avx2_ones_bit_for_bit() {
    if !super::x86::has_avx_vnni() {
        eprintln!("SKIPPED: this CPU has no AVX-VNNI (Intel Alder Lake or later, AMD Zen 5)");
        return;
    }
    assert_equal_to_avx2_bit_for_bit(6, super::x86::avx_vnni::kernel);
}

/// The vector Q3_K scale decoder gives the scalar one's scales.
#[cfg(target_arch = "x86_64")]
#[test]
fn q3_k_scales_decode_like_the_scalar_reference() {
    if !super::x86::has_avx2() {
        eprintln!("SKIPPED: this CPU has no AVX2");
        return;
    }
    let mut rng = Rng::new(7);
    for _ in 0..2000 {
        let bytes: [u8; 12] = std::array::from_fn(|_| rng.next() as u8);
        let mut got = [0i8; 16];
        // SAFETY: AVX2 checked above; 12 readable bytes.
        unsafe {
            let v = super::x86::q3_scales_i8(bytes.as_ptr());
            std::arch::x86_64::_mm_storeu_si128(got.as_mut_ptr() as *mut _, v);
        }
        assert_eq!(got, scalar::q3k_scales(&bytes), "{bytes:?}");
    }
}

#[test]
fn results_identical_across_thread_counts() {
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(4)];
    let mut rng = Rng::new(3);
    for ty in [Q4_K, Q6_K, Q8_0, Q5_0, F16] {
        let (rows, cols) = (301, 512);
        let data = random_weights(ty, rows, cols, &mut rng);
        let w = WeightRef {
            ty,
            data: &data,
            rows,
            cols,
        };
        for n in [1, 5, 70] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f()).collect();
            let outs: Vec<Vec<f32>> = pools
                .iter()
                .map(|p| {
                    let mut o = vec![0f32; n * rows];
                    matmul(p, &w, &x, &mut o);
                    o
                })
                .collect();
            assert!(outs[0] == outs[1] && outs[0] == outs[2], "{ty} n={n}");
        }
    }
}

#[test]
fn simd_quantizers_match_scalar() {
    let mut rng = Rng::new(4);
    let x: Vec<f32> = (0..1536).map(|_| rng.f() * 4.0).collect();
    let (mut q1, mut q2) = (vec![0i8; 1536], vec![0i8; 1536]);
    let (mut d1, mut d2) = (vec![0f32; 48], vec![0f32; 48]);
    let (mut s1, mut s2) = (vec![0f32; 48], vec![0f32; 48]);
    let (mut n1, mut n2) = (vec![0i16; 48], vec![0i16; 48]);
    for q8_1_sums in [false, true] {
        scalar::quantize_q8_0(&x, &mut q1, &mut d1, &mut s1, &mut n1, q8_1_sums);
        quantize_q8_0(&x, &mut q2, &mut d2, &mut s2, &mut n2, q8_1_sums);
        assert_eq!((&q1, &d1, &s1, &n1), (&q2, &d2, &s2, &n2));
        for (b, &n) in n1.iter().enumerate() {
            let want: i32 = q1[32 * b..32 * b + 32].iter().map(|&v| v as i32).sum();
            assert_eq!(n as i32, want, "block {b}");
        }
    }
    // Super-blocks whose largest magnitude appears with both signs (the
    // first occurrence sets the scale's sign), in either order and in
    // different lanes, and one of zeros.
    let mut x = x;
    x[256 + 37] = -9.0;
    x[256 + 200] = 9.0;
    x[512 + 3] = 9.0;
    x[512 + 4] = -9.0;
    x[768 + 255] = -9.5;
    x[1024..1280].fill(0.0);
    let (mut b1, mut b2) = (vec![0i16; 96], vec![0i16; 96]);
    scalar::quantize_q8_k(&x, &mut q1, &mut d1[..6], &mut b1);
    quantize_q8_k(&x, &mut q2, &mut d2[..6], &mut b2);
    assert_eq!((&q1, &d1, &b1), (&q2, &d2, &b2));
    assert!(
        d1[1] > 0.0 && d1[2] < 0.0 && d1[3] > 0.0 && d1[4] == 0.0,
        "{d1:?}"
    );
}

#[test]
fn dot_and_axpy() {
    let mut rng = Rng::new(5);
    for len in [0, 1, 7, 8, 31, 32, 33, 100, 1000] {
        let a: Vec<f32> = (0..len).map(|_| rng.f()).collect();
        let b: Vec<f32> = (0..len).map(|_| rng.f()).collect();
        let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        assert!((dot_f32(&a, &b) as f64 - want).abs() < 1e-4 * (len as f64).sqrt() + 1e-6);
        assert!((dot_f32_scalar(&a, &b) as f64 - want).abs() < 1e-4 * (len as f64).sqrt() + 1e-6);
        let mut y = b.clone();
        axpy_f32(&mut y, 0.5, &a);
        for i in 0..len {
            assert!((y[i] - (b[i] + 0.5 * a[i])).abs() < 1e-6);
        }
    }
}

#[test]
fn zero_rows_and_zero_activations() {
    let pool = ThreadPool::new(2);
    let mut rng = Rng::new(6);
    for ty in ALL_TYPES {
        let cols = 256;
        let data = random_weights(ty, 3, cols, &mut rng);
        let w = WeightRef {
            ty,
            data: &data,
            rows: 3,
            cols,
        };
        let mut out = vec![1f32; 6];
        matmul(&pool, &w, &vec![0f32; 2 * cols], &mut out);
        assert!(out.iter().all(|&v| v == 0.0), "{ty}: {out:?}");
        matmul(&pool, &w, &[], &mut []);
    }
}

/// Our independent reading of the block formats agrees with the gguf crate's.
#[test]
fn own_dequant_matches_gguf() {
    let mut rng = Rng::new(7);
    for ty in ALL_TYPES
        .into_iter()
        .filter(|t| !FIXTURE_CHECKED.contains(t))
    {
        let data = random_weights(ty, 2, 512, &mut rng);
        let (mut a, mut b) = (vec![0f32; 1024], vec![0f32; 1024]);
        dequant_row(ty, &data, &mut a);
        blockdraft_gguf::quants::dequantize(ty, &data, &mut b).unwrap();
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert!(
                (x - y).abs() <= 1e-6 * x.abs().max(1.0),
                "{ty} [{i}]: {x} vs {y}"
            );
        }
    }
}

/// Weights quantized from smooth data by the gguf quantizers (realistic
/// scales and mins, Q8_K with true bsums): matmul tracks the f32 product of
/// the dequantized weights within the activation rounding.
#[test]
fn matmul_on_gguf_quantized_weights() {
    let pool = ThreadPool::new(2);
    let mut rng = Rng::new(8);
    let (rows, cols, n) = (9, 1536, 3);
    for ty in ALL_TYPES {
        if !blockdraft_gguf::quants::can_quantize(ty) {
            continue;
        }
        // Sum of uniforms: roughly Gaussian, like trained weights.
        let wf: Vec<f32> = (0..rows * cols)
            .map(|_| (rng.f() + rng.f() + rng.f()) * 0.02)
            .collect();
        let data = blockdraft_gguf::quants::quantize_to_vec(ty, &wf).unwrap();
        let wd = blockdraft_gguf::quants::dequantize_to_vec(ty, &data).unwrap();
        let w = WeightRef {
            ty,
            data: &data,
            rows,
            cols,
        };
        let x: Vec<f32> = (0..n * cols).map(|_| rng.f()).collect();
        let mut out = vec![0f32; n * rows];
        matmul(&pool, &w, &x, &mut out);
        for r in 0..n {
            for o in 0..rows {
                let (mut want, mut w2) = (0f64, 0f64);
                for k in 0..cols {
                    let wv = wd[o * cols + k] as f64;
                    want += wv * x[r * cols + k] as f64;
                    w2 += wv * wv;
                }
                // x in [-1, 1): rounding step <= 1/127, error sd <= |w| / (127 sqrt 12).
                let tol = 6.0 * w2.sqrt() / (127.0 * 12f64.sqrt()) + 1e-4;
                let got = out[r * rows + o] as f64;
                assert!(
                    (got - want).abs() <= tol,
                    "{ty} r={r} o={o}: {got} vs {want} (tol {tol})"
                );
            }
        }
    }
}

/// Float weights take any row length (SIMD body plus scalar tail).
#[test]
fn float_weights_with_odd_row_lengths() {
    let pool = ThreadPool::new(2);
    let mut rng = Rng::new(9);
    for ty in [F32, F16, BF16] {
        for cols in [1, 7, 15, 16, 17, 37, 100] {
            let rows = 5;
            let data = random_weights(ty, rows, cols, &mut rng);
            let wf = blockdraft_gguf::quants::dequantize_to_vec(ty, &data).unwrap();
            let w = WeightRef {
                ty,
                data: &data,
                rows,
                cols,
            };
            for n in [1, 3, 9] {
                let x: Vec<f32> = (0..n * cols).map(|_| rng.f()).collect();
                let mut out = vec![0f32; n * rows];
                matmul(&pool, &w, &x, &mut out);
                for r in 0..n {
                    for o in 0..rows {
                        let want: f64 = (0..cols)
                            .map(|k| wf[o * cols + k] as f64 * x[r * cols + k] as f64)
                            .sum();
                        let got = out[r * rows + o] as f64;
                        assert!(
                            (got - want).abs() < 1e-5 * cols as f64,
                            "{ty} cols={cols} n={n}"
                        );
                    }
                }
            }
        }
    }
}

/// `matmul_llamacpp_batch` differs from `matmul` only in float order: rows
/// outside the batch's whole groups of 4 are bit-equal, the others close.
#[test]
fn llamacpp_batch_matmul_only_reorders() {
    let pool = ThreadPool::new(2);
    let mut rng = Rng::new(3);
    for ty in ALL_TYPES {
        for (rows, cols) in shapes(ty) {
            let data = random_weights(ty, rows, cols, &mut rng);
            let w = WeightRef {
                ty,
                data: &data,
                rows,
                cols,
            };
            let n = 6;
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f()).collect();
            let (mut a, mut b) = (vec![0f32; n * rows], vec![0f32; n * rows]);
            matmul(&pool, &w, &x, &mut a);
            matmul_llamacpp_batch(&pool, &w, &x, &mut b);
            for (i, (p, q)) in a.iter().zip(&b).enumerate() {
                if i >= 4 * rows {
                    assert_eq!(p.to_bits(), q.to_bits(), "{ty} [{i}]");
                } else {
                    let tol = 1e-5 * (p.abs() + q.abs()) + 1e-5;
                    assert!((p - q).abs() <= tol, "{ty} [{i}]: {p} vs {q}");
                }
            }
        }
    }
}

/// A result depends only on its weight row and activation row: not on the
/// rows batched beside it, nor on where the row falls in the kernels' tiles
/// of weight rows (speculative identity and llama.cpp agreement need this
/// bit for bit).
#[test]
fn results_independent_of_batch_and_tiling() {
    let pool = ThreadPool::new(2);
    let mut rng = Rng::new(4);
    for ty in ALL_TYPES {
        let (rows, cols) = (37, 2 * ty.block_len().max(256));
        let data = random_weights(ty, rows, cols, &mut rng);
        let row_bytes = data.len() / rows;
        let n = 17;
        let x: Vec<f32> = (0..n * cols).map(|_| rng.f() * 3.0).collect();
        let mut all = vec![0f32; n * rows];
        let w = WeightRef {
            ty,
            data: &data,
            rows,
            cols,
        };
        matmul(&pool, &w, &x, &mut all);
        // Weight rows 1.. on their own shift every tile by one row.
        let shifted = WeightRef {
            ty,
            data: &data[row_bytes..],
            rows: rows - 1,
            cols,
        };
        for r in 0..n {
            let xr = &x[r * cols..(r + 1) * cols];
            let mut one = vec![0f32; rows - 1];
            matmul(&pool, &shifted, xr, &mut one);
            for (o, v) in one.iter().enumerate() {
                let want = all[r * rows + o + 1];
                assert_eq!(v.to_bits(), want.to_bits(), "{ty} row {r} out {}", o + 1);
            }
        }
    }
}

/// `pack(w, fast)`, which packs exactly where this CPU has packed kernels
/// (x86: Q4_K, Q4_0, Q4_1, Q5_0, Q8_0, IQ4_NL and Q6_K on AVX2 and AVX-512
/// VNNI).
fn packed_where_supported(pool: &ThreadPool, w: &WeightRef, fast: bool) -> Option<PackedWeight> {
    let packed = pack(pool, w, fast);
    let supported = cfg!(target_arch = "x86_64") && simd_level().starts_with("avx");
    if !supported {
        eprintln!(
            "skipped: no packed {} kernel on this CPU ({})",
            w.ty,
            simd_level()
        );
    }
    assert_eq!(
        packed.is_some(),
        supported,
        "{} {}x{}",
        w.ty,
        w.rows,
        w.cols
    );
    packed
}

/// A packed Q4_K, Q4_1, Q5_0 or Q8_0 weight gives the ggml-layout kernels'
/// results (llama.cpp's sequence) bit for bit, for every batch size and
/// thread count; shapes it cannot pack are refused.
#[test]
fn packed_weights_match_the_ggml_layout_bit_for_bit() {
    let mut rng = Rng::new(5);
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    let shapes = [(8, 256), (24, 512), (64, 1536), (136, 256)];
    for (ty, (rows, cols)) in [Q4_K, Q4_1, Q5_0, Q8_0]
        .into_iter()
        .flat_map(|ty| shapes.map(|s| (ty, s)))
    {
        let data = random_weights(ty, rows, cols, &mut rng);
        let w = WeightRef {
            ty,
            data: &data,
            rows,
            cols,
        };
        let Some(packed) = packed_where_supported(&pools[1], &w, false) else {
            return;
        };
        // Q4_K's scales and mins are stored unpacked; the others' bytes
        // are only regrouped.
        let bytes = if ty == Q4_K {
            rows / 8 * cols / 256 * 1184
        } else {
            data.len()
        };
        assert_eq!(packed.bytes(), bytes);
        for n in [1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 33] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f() * 3.0).collect();
            for pool in &pools {
                let mut want = vec![0f32; n * rows];
                let mut got = vec![f32::NAN; n * rows];
                matmul(pool, &w, &x, &mut want);
                matmul_packed(pool, &packed, &x, &mut got);
                for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        e.to_bits(),
                        "{ty} {rows}x{cols} n={n} [{i}]: {g} vs {e}"
                    );
                }
                // The AVX2 kernel, where the one above was the AVX-512 one.
                assert_avx2_packed_kernel_agrees(pool, (&w, false), &x, &got);
            }
        }
    }
    for (ty, rows) in [(Q4_K, 7), (Q4_K, 12), (Q4_0, 12), (Q6_K, 12), (Q8_0, 12)] {
        let data = random_weights(ty, rows, 256, &mut rng);
        let w = WeightRef {
            ty,
            data: &data,
            rows,
            cols: 256,
        };
        assert!(pack(&pools[0], &w, false).is_none(), "{ty} {rows} rows");
    }
}

/// The float sequence of packed 32-value blocks with one scale (Q4_0, as
/// llama.cpp's repacked kernels run it, its AVX2 gemv and gemm alike;
/// IQ4_NL; Q4_1, Q5_0 and Q8_0 in the fast kernels) for one output: `acc = fma(sum_b,
/// d_w * d_x, acc)` over the blocks, `sum_b` the block's exact integer dot;
/// Q4_1's mins as llama.cpp takes them, `acc_min = fma(m, s_x, acc_min)`
/// (`sx`: the activation blocks' stored sums), added at the end.
fn block32_packed_reference(ty: GgmlType, w_row: &[u8], xq: &[i8], dx: &[f32], sx: &[f32]) -> f32 {
    let (mut acc, mut acc_min) = (0f32, 0f32);
    for (b, blk) in w_row.chunks_exact(ty.block_bytes()).enumerate() {
        let dw = f16v(blk, 0);
        // Value t's nibble of the 16 bytes at `at` (low: t < 16).
        let nibble = |at: usize, t: usize| (blk[at + t % 16] >> (4 * (t / 16)) & 15) as i32;
        let value = |t: usize| -> i32 {
            match ty {
                Q4_0 => nibble(2, t) - 8,
                Q4_1 => nibble(4, t),
                Q5_0 => {
                    let qh = u32::from_le_bytes(blk[2..6].try_into().unwrap());
                    (nibble(6, t) | ((qh >> t & 1) << 4) as i32) - 16
                }
                Q8_0 => blk[2 + t] as i8 as i32,
                IQ4_NL => blockdraft_gguf::quants::iquants::KVALUES[nibble(2, t) as usize] as i32,
                _ => unreachable!("{ty}"),
            }
        };
        let sum: i32 = (0..32).map(|t| value(t) * xq[32 * b + t] as i32).sum();
        acc = (sum as f32).mul_add(dw * dx[b], acc);
        if ty == Q4_1 {
            acc_min = f16v(blk, 2).mul_add(sx[b], acc_min);
        }
    }
    if ty == Q4_1 {
        acc + acc_min
    } else {
        acc
    }
}

/// Packed Q4_0 gives llama.cpp's repacked-Q4_0 results bit for bit (the
/// ggml-layout kernel follows its unpacked gemv instead, so the two agree
/// only to rounding), and packed IQ4_NL the same sequence, as do the fast
/// kernels' Q4_1, Q5_0 and Q8_0, for every batch size and thread count,
/// with an odd last group of 8 rows.
#[test]
fn packed_32_blocks_follow_llamacpp_repacked_sequence() {
    let fast_only = [(Q4_1, 10), (Q5_0, 8), (Q8_0, 9)].map(|(ty, seed)| (ty, seed, true));
    for (ty, seed, fast) in [(Q4_0, 6, false), (IQ4_NL, 12, false)]
        .into_iter()
        .chain(fast_only)
    {
        check_packed_sequence(
            (ty, fast),
            seed,
            &[(8, 32), (16, 256), (24, 64), (40, 1536)],
            &[1, 3, 8, 11],
            |w_row, xq, dx, sx| block32_packed_reference(ty, w_row, xq, dx, sx),
        );
    }
}

/// The documented float sequence of packed Q6_K (`x86_packed::q6_k_group16`)
/// for one output: per super-block the exact integer
/// `sum_s sc_s sum_t (q_t - 32) x_t`, then `acc = fma(sum, d_w * d_x, acc)`.
fn q6_k_packed_reference(w_row: &[u8], xq: &[i8], dx: &[f32]) -> f32 {
    let mut acc = 0f32;
    for (b, blk) in w_row.chunks_exact(210).enumerate() {
        let (ql, qh, sc) = (&blk[..128], &blk[128..192], &blk[192..208]);
        let mut sum = 0i32;
        for v in 0..256 {
            // ggml's Q6_K: value 128h + 32c + l from ql[64h + l + 32 (c % 2)]
            // (low nibble for c < 2) and bits 2c, 2c+1 of qh[32h + l].
            let (h, c, l) = (v / 128, v % 128 / 32, v % 32);
            let low = ql[64 * h + l + 32 * (c % 2)] >> (4 * (c / 2)) & 15;
            let high = qh[32 * h + l] >> (2 * c) & 3;
            let q = (low | high << 4) as i32 - 32;
            sum += sc[v / 16] as i8 as i32 * q * xq[256 * b + v] as i32;
        }
        acc = (sum as f32).mul_add(f16v(blk, 208) * dx[b], acc);
    }
    acc
}

/// Packed Q6_K gives its documented sequence bit for bit, for every batch
/// size, thread count and an odd last group of 8 rows; it agrees with the
/// ggml-layout kernels (llama.cpp's sequence) to rounding.
#[test]
fn packed_q6_k_follows_its_documented_sequence() {
    check_packed_sequence(
        (Q6_K, false),
        7,
        &[(8, 256), (24, 512), (48, 1536)],
        &[1, 2, 5, 8, 11],
        |w_row, xq, dx, _| q6_k_packed_reference(w_row, xq, dx),
    );
}

/// Packed `ty` (`fast`: the fast kernels' layout) against `reference` (one output of its documented float
/// sequence, from a weight row and a quantized activation row: quants,
/// scales, and the block sums llama.cpp stores with them) bit for bit,
/// for every shape, batch size `n` and thread count; within rounding of
/// the ggml-layout kernels; and, on AVX-512 VNNI, bit-identical to the
/// AVX2 kernel. Skips visibly where this CPU does not pack `ty`.
fn check_packed_sequence(
    (ty, fast): (GgmlType, bool),
    seed: u64,
    shapes: &[(usize, usize)],
    ns: &[usize],
    reference: impl Fn(&[u8], &[i8], &[f32], &[f32]) -> f32,
) {
    let mut rng = Rng::new(seed);
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    let bl = ty.block_len();
    for &(rows, cols) in shapes {
        let data = random_weights(ty, rows, cols, &mut rng);
        let w = WeightRef {
            ty,
            data: &data,
            rows,
            cols,
        };
        let Some(packed) = packed_where_supported(&pools[1], &w, fast) else {
            return;
        };
        assert_eq!(packed.bytes(), data.len());
        let row_bytes = cols / bl * ty.block_bytes();
        for &n in ns {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f() * 3.0).collect();
            let mut want = vec![0f32; n * rows];
            for r in 0..n {
                let x_row = &x[r * cols..(r + 1) * cols];
                let (mut xq, mut dx) = (vec![0i8; cols], vec![0f32; cols / bl]);
                let mut sx = vec![0f32; cols / 32];
                match act_kind(ty) {
                    ActKind::Q8_0 => scalar::quantize_q8_0(
                        x_row,
                        &mut xq,
                        &mut dx,
                        &mut sx,
                        &mut vec![0i16; cols / 32],
                        matches!(ty, Q4_1 | Q5_1),
                    ),
                    ActKind::Q8K => {
                        scalar::quantize_q8_k(x_row, &mut xq, &mut dx, &mut vec![0i16; cols / 16])
                    }
                    ActKind::F32 => unreachable!("{ty} is not packed"),
                }
                for o in 0..rows {
                    let w_row = &data[o * row_bytes..(o + 1) * row_bytes];
                    want[r * rows + o] = reference(w_row, &xq, &dx, &sx);
                }
            }
            for pool in &pools {
                let mut got = vec![f32::NAN; n * rows];
                matmul_packed(pool, &packed, &x, &mut got);
                for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        e.to_bits(),
                        "{ty} {rows}x{cols} n={n} [{i}]: {g} vs {e}"
                    );
                }
                let mut ggml = vec![0f32; n * rows];
                matmul(pool, &w, &x, &mut ggml);
                for (g, e) in got.iter().zip(&ggml) {
                    assert!(
                        (g - e).abs() <= 1e-4 * e.abs() + 1e-4,
                        "{ty}: {g} vs ggml layout {e}"
                    );
                }
                assert_avx2_packed_kernel_agrees(pool, (&w, fast), &x, &got);
            }
        }
    }
}

/// Where the packed kernel that ran (`got`) was the AVX-512 one, the AVX2
/// kernel on `w` packed for it (`fast`: the fast kernels') gives `got` bit
/// for bit.
fn assert_avx2_packed_kernel_agrees(
    pool: &ThreadPool,
    (w, fast): (&WeightRef, bool),
    x: &[f32],
    got: &[f32],
) {
    #[cfg(target_arch = "x86_64")]
    if super::x86::has_avx512_vnni() {
        // Packed again: the AVX-512 kernels' layout interleaves pairs of
        // groups, the AVX2 kernel's does not.
        let layout = super::x86_packed::layout(w.ty, fast).unwrap();
        let alone = super::pack_for(pool, w, layout, layout.kernel, 1).unwrap();
        let mut base = vec![f32::NAN; got.len()];
        super::matmul_packed(pool, &alone, x, &mut base);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&base),
            bits(got),
            "{} n={}: AVX2 packed",
            w.ty,
            x.len() / w.cols
        );
    }
    let _ = (pool, w, fast, x, got);
}

/// `w` as the CPU backend reads it: packed where this CPU packs its type,
/// in the ggml layout otherwise.
fn operand_of<'a>(w: &WeightRef<'a>, packed: &'a Option<PackedWeight>) -> Operand<'a> {
    match packed {
        Some(p) => p.operand(),
        None => Operand::ggml(*w, best_kernel(w.ty), false),
    }
}

/// `matmul_many` equals one matmul (and bias add) per product, bit for bit,
/// whether the products share the input's quantization (one parallel
/// section) or not (one each), packed or not, with more activation rows
/// than a kernel call takes.
#[test]
fn products_of_one_input_equal_their_matmuls() {
    let pool = ThreadPool::new(2);
    let cols = 512;
    let sets: [&[(GgmlType, usize)]; 4] = [
        &[(Q4_K, 48), (Q4_K, 16), (Q6_K, 32)],
        &[(Q8_0, 40), (Q4_0, 24)],
        &[(Q4_1, 16), (Q5_1, 32), (Q8_0, 8)],
        &[(F16, 24), (Q8_0, 16)],
    ];
    let mut rng = Rng::new(41);
    for set in sets {
        let data: Vec<_> = set
            .iter()
            .map(|&(ty, rows)| random_weights(ty, rows, cols, &mut rng))
            .collect();
        let ws: Vec<_> = set
            .iter()
            .zip(&data)
            .map(|(&(ty, rows), d)| WeightRef {
                ty,
                data: d,
                rows,
                cols,
            })
            .collect();
        let packed: Vec<_> = ws.iter().map(|w| pack(&pool, w, false)).collect();
        let biases: Vec<Vec<f32>> = set
            .iter()
            .map(|&(_, rows)| (0..rows).map(|_| rng.f()).collect())
            .collect();
        for n in [1, 3, 9, 17] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f() * 2.0).collect();
            let mut got: Vec<Vec<f32>> = set.iter().map(|&(_, r)| vec![f32::NAN; n * r]).collect();
            let mut products: Vec<_> = got
                .iter_mut()
                .enumerate()
                .map(|(i, out)| Product {
                    op: operand_of(&ws[i], &packed[i]),
                    bias: (i % 2 == 0).then_some(biases[i].as_slice()),
                    out,
                })
                .collect();
            matmul_many(&pool, &x, &mut products);
            for (i, got) in got.iter().enumerate() {
                let mut want = vec![0f32; got.len()];
                match &packed[i] {
                    Some(p) => matmul_packed(&pool, p, &x, &mut want),
                    None => matmul(&pool, &ws[i], &x, &mut want),
                }
                if i % 2 == 0 {
                    for row in want.chunks_exact_mut(ws[i].rows) {
                        row.iter_mut().zip(&biases[i]).for_each(|(v, b)| *v += b);
                    }
                }
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(got), bits(&want), "{:?} n={n} product {i}", set);
            }
        }
    }
}

/// `matmul_pair_combined` hands `combine` the spans of both products and
/// equals both matmuls followed by `combine` over whole rows, bit for bit,
/// fused (same type and layout) or not.
#[test]
fn paired_products_combine_like_their_matmuls() {
    let pool = ThreadPool::new(2);
    let (rows, cols) = (136, 256);
    let mut rng = Rng::new(43);
    for (ta, tb) in [(Q4_K, Q4_K), (Q8_0, Q8_0), (Q4_K, Q6_K), (Q4_1, Q8_0)] {
        let (da, db) = (
            random_weights(ta, rows, cols, &mut rng),
            random_weights(tb, rows, cols, &mut rng),
        );
        let wa = WeightRef {
            ty: ta,
            data: &da,
            rows,
            cols,
        };
        let wb = WeightRef {
            ty: tb,
            data: &db,
            rows,
            cols,
        };
        let (pa, pb) = (pack(&pool, &wa, false), pack(&pool, &wb, false));
        // A combination whose result shows the column it was given.
        let combine = |c0: usize, a: &[f32], b: &[f32], o: &mut [f32]| {
            for (j, ((o, a), b)) in o.iter_mut().zip(a).zip(b).enumerate() {
                *o = a * b + (c0 + j) as f32;
            }
        };
        for n in [1, 4, 10] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f()).collect();
            let (mut a, mut b, mut got) = (
                vec![0f32; n * rows],
                vec![0f32; n * rows],
                vec![0f32; n * rows],
            );
            matmul_pair_combined(
                &pool,
                &x,
                Product {
                    op: operand_of(&wa, &pa),
                    bias: None,
                    out: &mut a,
                },
                Product {
                    op: operand_of(&wb, &pb),
                    bias: None,
                    out: &mut b,
                },
                &mut got,
                &combine,
            );
            let mut want = vec![0f32; n * rows];
            for (w, p, out) in [(&wa, &pa, &mut a), (&wb, &pb, &mut b)] {
                match p {
                    Some(p) => matmul_packed(&pool, p, &x, out),
                    None => matmul(&pool, w, &x, out),
                }
            }
            for r in 0..n {
                let s = r * rows..(r + 1) * rows;
                combine(0, &a[s.clone()], &b[s.clone()], &mut want[s]);
            }
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{ta}/{tb} n={n}");
        }
    }
}
