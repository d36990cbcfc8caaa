//! x86 kernels of the lattice types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
//! IQ3_S, IQ1_S, IQ1_M), the ternary ones (TQ1_0, TQ2_0) and MXFP4 /
//! NVFP4, in the float sequences of ggml's AVX2 `ggml_vec_dot_*_q8_K` /
//! `_q8_0`, so results are bit-equal to llama.cpp's.
//!
//! Each 32-value block becomes one vector of 32 grid magnitudes (rows looked
//! up by index, four 8-byte or eight 4-byte rows) and a sign mask applied to
//! the activations; `maddubs` then `madd` by the block's scale (per 16
//! values where it has two) give eight i32 lanes of four values each, which
//! add up exactly over the super-block. Per super-block the lanes take one
//! `fma(d_w * d_x, lanes, acc)`, and the result is the format's factor times
//! the horizontal sum (IQ1 adds its offsets' part after it). The lane
//! partition and float steps are ggml's, so every build of the macro (AVX2,
//! AVX-VNNI, AVX-512 VNNI) gives the same bits.
//!
//! Expanded inside each build module of `x86.rs` by `lattice_kernels!`,
//! which uses that module's helpers (`h2f`, `h2f8`, `load`, `bits_to_bytes`,
//! `dot_i8`, `nibbles32`) and `hsum`.

macro_rules! lattice_kernels {
    ($feat:literal) => {
        /// This build's kernel for a lattice, ternary or FP4 type.
        fn lattice_kernel(ty: GgmlType) -> Option<Kernel> {
            use GgmlType::*;
            Some(match ty {
                IQ2_XXS => rows!($feat, iq2_xxs),
                IQ2_XS => rows!($feat, iq2_xs),
                IQ2_S => rows!($feat, iq2_s),
                IQ3_XXS => rows!($feat, iq3_xxs),
                IQ3_S => rows!($feat, iq3_s),
                IQ1_S => rows!($feat, iq1_s),
                IQ1_M => rows!($feat, iq1_m),
                MXFP4 => rows!($feat, mxfp4),
                NVFP4 => rows!($feat, nvfp4),
                TQ1_0 => rows!($feat, tq1_0),
                TQ2_0 => rows!($feat, tq2_0),
                _ => return None,
            })
        }

        /// Four 8-value groups (grid row, sign byte) as one vector of their
        /// grid bytes, and their four sign bytes as one word (byte l for
        /// group l).
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn grid_rows(g: [(u64, u8); 4]) -> (__m256i, u32) {
            let q = _mm256_set_epi64x(g[3].0 as i64, g[2].0 as i64, g[1].0 as i64, g[0].0 as i64);
            let signs = u32::from_le_bytes([g[0].1, g[1].1, g[2].1, g[3].1]);
            (q, signs)
        }

        /// The scale vector of a 32-block from its halves' stored scales
        /// `s`: the odd `2 s + 1` of `lo` in its first 16 values' i16 lanes,
        /// of `hi` in the rest.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn odd_scales(lo: u32, hi: u32) -> __m256i {
            let odd = |s: u32| _mm_set1_epi16(2 * s as i16 + 1);
            _mm256_set_m128i(odd(hi), odd(lo))
        }

        /// Four 7-bit sign indices as ±1 bytes (ggml's table lookups).
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn sign_masks(i: [u32; 4]) -> __m256i {
            use blockdraft_gguf::quants::grids::KSIGNS_MASKS as K;
            let k = |j: usize| K[(i[j] & 127) as usize] as i64;
            _mm256_set_epi64x(k(3), k(2), k(1), k(0))
        }

        /// Four plain sign bytes (bit j: value j negative) as ±1 bytes.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn sign_bytes(bits: u32) -> __m256i {
            _mm256_or_si256(bits_to_bytes(bits), _mm256_set1_epi8(1))
        }

        #[target_feature(enable = $feat)]
        unsafe fn iq2_xxs<const NR: usize>(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
            use blockdraft_gguf::quants::grids::IQ2XXS_GRID as G;
            use blockdraft_gguf::quants::lattice::iq2_xxs::*;
            signed_grid!(NR, w, nb, BYTES, 0.125, x, out, |blk, ib| {
                let at = QS + 8 * ib;
                let idx = u32::from_le_bytes(blk[at..at + 4].try_into().unwrap_unchecked());
                let aux = u32::from_le_bytes(blk[at + 4..at + 8].try_into().unwrap_unchecked());
                let row = |l: u32| G[(idx >> (8 * l)) as u8 as usize] as i64;
                let q = _mm256_set_epi64x(row(3), row(2), row(1), row(0));
                let signs = sign_masks([aux, aux >> 7, aux >> 14, aux >> 21]);
                (q, signs, odd_scales(aux >> 28, aux >> 28))
            })
        }

        #[target_feature(enable = $feat)]
        unsafe fn iq2_xs<const NR: usize>(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
            use blockdraft_gguf::quants::grids::IQ2XS_GRID as G;
            use blockdraft_gguf::quants::lattice::iq2_xs::*;
            signed_grid!(NR, w, nb, BYTES, 0.125, x, out, |blk, ib| {
                let at = QS + 8 * ib;
                let wd: [u32; 4] =
                    four!(|l| u16::from_le_bytes([blk[at + 2 * l], blk[at + 2 * l + 1]]) as u32);
                let row = |l: usize| G[(wd[l] & 511) as usize] as i64;
                let q = _mm256_set_epi64x(row(3), row(2), row(1), row(0));
                let signs = sign_masks([wd[0] >> 9, wd[1] >> 9, wd[2] >> 9, wd[3] >> 9]);
                let [s0, s1] = scales(blk, ib);
                (q, signs, odd_scales(s0, s1))
            })
        }

        #[target_feature(enable = $feat)]
        unsafe fn iq2_s<const NR: usize>(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
            use blockdraft_gguf::quants::lattice::iq2_s::*;
            signed_grid!(NR, w, nb, BYTES, 0.125, x, out, |blk, ib| {
                let (q, signs) = grid_rows(four!(|l| group(blk, ib, l)));
                let [s0, s1] = scales(blk, ib);
                (q, sign_bytes(signs), odd_scales(s0, s1))
            })
        }

        #[target_feature(enable = $feat)]
        unsafe fn iq3_xxs<const NR: usize>(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
            use blockdraft_gguf::quants::grids::IQ3XXS_GRID as G;
            use blockdraft_gguf::quants::lattice::iq3_xxs::*;
            signed_grid!(NR, w, nb, BYTES, 0.25, x, out, |blk, ib| {
                let at = SCALES_SIGNS + 4 * ib;
                let aux = u32::from_le_bytes(blk[at..at + 4].try_into().unwrap_unchecked());
                let qs = &blk[QS + 8 * ib..QS + 8 * ib + 8];
                let row = |k: usize| G[qs[k] as usize] as i32;
                let q = _mm256_set_epi32(
                    row(7),
                    row(6),
                    row(5),
                    row(4),
                    row(3),
                    row(2),
                    row(1),
                    row(0),
                );
                let signs = sign_masks([aux, aux >> 7, aux >> 14, aux >> 21]);
                (q, signs, odd_scales(aux >> 28, aux >> 28))
            })
        }

        #[target_feature(enable = $feat)]
        unsafe fn iq3_s<const NR: usize>(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
            use blockdraft_gguf::quants::grids::IQ3S_GRID as G;
            use blockdraft_gguf::quants::lattice::iq3_s::*;
            signed_grid!(NR, w, nb, BYTES, 1.0, x, out, |blk, ib| {
                // Index k of 8: qs[k] and bit k of the block's qh byte.
                let qs = &blk[QS + 8 * ib..QS + 8 * ib + 8];
                let qh = blk[QH + ib] as usize;
                let row = |k: usize| G[qs[k] as usize | ((qh >> k) & 1) << 8] as i32;
                let q = _mm256_set_epi32(
                    row(7),
                    row(6),
                    row(5),
                    row(4),
                    row(3),
                    row(2),
                    row(1),
                    row(0),
                );
                let at = SIGNS + 4 * ib;
                let signs = u32::from_le_bytes(blk[at..at + 4].try_into().unwrap_unchecked());
                let [s0, s1] = scales(blk, ib);
                (q, sign_bytes(signs), odd_scales(s0, s1))
            })
        }

        /// The dot of a signed ({-1, 0, 1}) grid vector with activations,
        /// as i16 pairs (ggml's `mul_add_epi8`).
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn signed_pairs(q: __m256i, xv: __m256i) -> __m256i {
            _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(xv, q))
        }

        /// IQ1_S: the grid part in lanes as above (scale per 32), the
        /// offsets' part `sum ±ls * bsum` as one integer per super-block,
        /// added as `fma(d, sumi1, acc1)` to a scalar; the result is
        /// `hsum(acc) + 1/8 * acc1`.
        #[target_feature(enable = $feat)]
        unsafe fn iq1_s<const NR: usize>(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
            use blockdraft_gguf::quants::grids::IQ1S_GRID as G;
            use blockdraft_gguf::quants::lattice::iq1_s::*;
            use blockdraft_gguf::quants::lattice::IQ1_DELTA;
            let mut acc = [_mm256_setzero_ps(); NR];
            let mut acc1 = [0f32; NR];
            let x: &[Act; NR] = x.try_into().unwrap_unchecked();
            for b in 0..nb {
                prefetch_ahead(w.add(b * BYTES), BYTES, 0, 1);
                let blk = std::slice::from_raw_parts(w.add(b * BYTES), BYTES);
                let mut sum = [_mm256_setzero_si256(); NR];
                let mut sum1 = [0i32; NR];
                for ib in 0..8 {
                    let qh = u16::from_le_bytes([blk[QH + 2 * ib], blk[QH + 2 * ib + 1]]);
                    let qs = &blk[QS + 4 * ib..QS + 4 * ib + 4];
                    let row =
                        |l: usize| G[qs[l] as usize | ((qh as usize >> (3 * l)) & 7) << 8] as i64;
                    let q = _mm256_set_epi64x(row(3), row(2), row(1), row(0));
                    let ls = 2 * ((qh >> 12) & 7) as i32 + 1;
                    let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
                    let scale = _mm256_set1_epi16(ls as i16);
                    for i in 0..NR {
                        let xv = load(x[i].qs.add(256 * b + 32 * ib) as *const u8);
                        let p = _mm256_madd_epi16(signed_pairs(q, xv), scale);
                        sum[i] = _mm256_add_epi32(sum[i], p);
                        let bs = x[i].bs.add(16 * b + 2 * ib);
                        sum1[i] += (*bs as i32 + *bs.add(1) as i32) * delta * ls;
                    }
                }
                let dw = h2f(blk.as_ptr());
                for i in 0..NR {
                    let d = *x[i].d.add(b) * dw;
                    acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sum[i]), acc[i]);
                    // Fused, as the C compiler contracts ggml's `accum1 += d * sumi1`.
                    acc1[i] = d.mul_add(sum1[i] as f32, acc1[i]);
                }
            }
            for i in 0..NR {
                out[i] = hsum(acc[i]) + IQ1_DELTA * acc1[i];
            }
        }

        /// IQ1_M: grid part and offsets' part (the activations signed by
        /// each group's offset sign, summed by `maddubs` with ones) in two
        /// lane vectors scaled per 16 values; the result is
        /// `hsum(acc1) + 1/8 * hsum(acc2)`. As ggml's AVX2 kernel: the
        /// sixteen scales expanded once per super-block, two 32-blocks per
        /// step.
        #[target_feature(enable = $feat)]
        unsafe fn iq1_m<const NR: usize>(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
            use blockdraft_gguf::quants::grids::IQ1S_GRID as G;
            use blockdraft_gguf::quants::lattice::iq1_m::*;
            use blockdraft_gguf::quants::lattice::IQ1_DELTA;
            let mut acc1 = [_mm256_setzero_ps(); NR];
            let mut acc2 = [_mm256_setzero_ps(); NR];
            let x: &[Act; NR] = x.try_into().unwrap_unchecked();
            let one = _mm256_set1_epi8(1);
            // Scale words' bits 0-2, 6-8 | 3-5, 9-11 into the four 64-bit
            // lanes: 128-bit half 0 holds each 32-block's first 16 values'
            // scale (word j: blocks 2j, 2j + 1), half 1 the second 16's.
            let shifts = _mm256_set_epi64x(9, 3, 6, 0);
            // Bit 3 of nibble l in every 16-bit element of 64-bit lane l.
            let sign_bits = _mm256_set_epi64x(
                0x8000_8000_8000_8000u64 as i64,
                0x0800_0800_0800_0800,
                0x0080_0080_0080_0080,
                0x0008_0008_0008_0008,
            );
            for b in 0..nb {
                let blk = w.add(b * BYTES);
                prefetch_ahead(blk, BYTES, 0, 1);
                let words = (blk.add(SCALES) as *const i64).read_unaligned();
                let s = _mm256_srlv_epi64(_mm256_set1_epi64x(words), shifts);
                let s = _mm256_and_si256(s, _mm256_set1_epi16(7));
                let scales = _mm256_add_epi16(_mm256_slli_epi16(s, 1), _mm256_set1_epi16(1));
                let mut sum1 = [_mm256_setzero_si256(); NR];
                let mut sum2 = [_mm256_setzero_si256(); NR];
                for ib in 0..8 {
                    // Group l: index qs[l] | three bits of qh nibble l, whose
                    // fourth bit makes the group's offset negative.
                    let (qs, qh) = (blk.add(QS + 4 * ib), blk.add(QH + 2 * ib));
                    let nibbles = (qh as *const u16).read_unaligned() as usize;
                    let index = |l: usize| *qs.add(l) as usize | (nibbles >> (4 * l) & 7) << 8;
                    let q = _mm256_set_epi64x(
                        G[index(3)] as i64,
                        G[index(2)] as i64,
                        G[index(1)] as i64,
                        G[index(0)] as i64,
                    );
                    // 0xFF bytes for a negative offset (bit 3 of the
                    // group's nibble), else 0x01.
                    let signs = _mm256_and_si256(_mm256_set1_epi16(nibbles as i16), sign_bits);
                    let delta = _mm256_or_si256(_mm256_cmpeq_epi16(signs, sign_bits), one);
                    // Element ib / 2 (+ 4 for an odd block) of each half, as
                    // eight i16.
                    let pick = 0x0100 + 0x0202 * (ib / 2) as i16 + 0x0808 * (ib % 2) as i16;
                    let scale = _mm256_shuffle_epi8(scales, _mm256_set1_epi16(pick));
                    for i in 0..NR {
                        let xv = load(x[i].qs.add(256 * b + 32 * ib) as *const u8);
                        let p1 = _mm256_madd_epi16(signed_pairs(q, xv), scale);
                        let offs = _mm256_maddubs_epi16(one, _mm256_sign_epi8(xv, delta));
                        sum1[i] = _mm256_add_epi32(sum1[i], p1);
                        sum2[i] = _mm256_add_epi32(sum2[i], _mm256_madd_epi16(offs, scale));
                    }
                }
                let dw = d(std::slice::from_raw_parts(blk, BYTES));
                for i in 0..NR {
                    let d = _mm256_set1_ps(*x[i].d.add(b) * dw);
                    acc1[i] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sum1[i]), acc1[i]);
                    acc2[i] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sum2[i]), acc2[i]);
                }
            }
            for i in 0..NR {
                out[i] = hsum(acc1[i]) + IQ1_DELTA * hsum(acc2[i]);
            }
        }

        /// MXFP4: IQ4_NL's kernel with the E2M1 grid and E8M0 scales (ggml's
        /// AVX2 `ggml_vec_dot_mxfp4_q8_0` has the same sequence: even and odd
        /// blocks in two accumulators, an odd last block as a scalar
        /// multiply-add, which the C compiler fuses).
        #[target_feature(enable = $feat)]
        unsafe fn mxfp4<const NR: usize>(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
            use blockdraft_gguf::quants::fp4::{e8m0_half, mxfp4::*, KVALUES};
            let grid =
                _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES.as_ptr() as *const __m128i));
            let mut acc = [[_mm256_setzero_ps(); 2]; NR];
            let x: &[Act; NR] = x.try_into().unwrap_unchecked();
            let paired = nb / 2 * 2;
            for b in 0..paired {
                let blk = w.add(b * BYTES);
                prefetch_ahead(blk, BYTES, 0, 1);
                let dw = _mm256_set1_ps(e8m0_half(*blk.add(E)));
                let q = _mm256_shuffle_epi8(grid, nibbles32(blk.add(QS)));
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
                    let blk = w.add(paired * BYTES);
                    let qs = std::slice::from_raw_parts(blk.add(QS), 16);
                    let xq = std::slice::from_raw_parts(x[i].qs.add(32 * paired), 32);
                    let sum =
                        $crate::kernels::scalar::nibble_dot(qs, xq, |n| KVALUES[n as usize] as i32);
                    let d = *x[i].d.add(paired) * e8m0_half(*blk.add(E));
                    out[i] = d.mul_add(sum as f32, out[i]);
                }
            }
        }

        /// NVFP4: per 64-block two vectors of 32 E2M1 values in order (the
        /// nibbles' quarters reordered), each dotted with its Q8_0 block
        /// into lanes whose halves have the parts' scales
        /// `ue4m3(d_s) * d_x`, both multiply-added into one accumulator
        /// (ggml's `ggml_vec_dot_nvfp4_q8_0` on AVX2).
        #[target_feature(enable = $feat)]
        unsafe fn nvfp4<const NR: usize>(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
            use blockdraft_gguf::quants::fp4::{nvfp4::*, ue4m3_half, KVALUES};
            let grid =
                _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES.as_ptr() as *const __m128i));
            let mut acc = [_mm256_setzero_ps(); NR];
            let x: &[Act; NR] = x.try_into().unwrap_unchecked();
            for b in 0..nb {
                let blk = w.add(b * BYTES);
                prefetch_ahead(blk, BYTES, 0, 1);
                let ds: [f32; 4] = std::array::from_fn(|s| ue4m3_half(*blk.add(D + s)));
                // Values 0..32 of parts (2h, 2h + 1): low nibbles of bytes
                // 16h..16h+16 are values 0..8 of both parts, high ones 8..16.
                let mut q = [_mm256_setzero_si256(); 2];
                let mut qa = [_mm256_setzero_si256(); 2];
                for h in 0..2 {
                    let v = _mm256_shuffle_epi8(grid, nibbles32(blk.add(QS + 16 * h)));
                    q[h] = _mm256_permute4x64_epi64::<0b11_01_10_00>(v);
                    qa[h] = _mm256_sign_epi8(q[h], q[h]);
                }
                for i in 0..NR {
                    for h in 0..2 {
                        let dy = *x[i].d.add(2 * b + h);
                        let scales = _mm256_set_m128(
                            _mm_set1_ps(ds[2 * h + 1] * dy),
                            _mm_set1_ps(ds[2 * h] * dy),
                        );
                        let xv = load(x[i].qs.add(64 * b + 32 * h) as *const u8);
                        let lanes = _mm256_cvtepi32_ps(dot_i8(qa[h], q[h], xv));
                        acc[i] = _mm256_fmadd_ps(scales, lanes, acc[i]);
                    }
                }
            }
            for i in 0..NR {
                out[i] = hsum(acc[i]);
            }
        }

        #[target_feature(enable = $feat)]
        unsafe fn tq2_0<const NR: usize>(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
            use blockdraft_gguf::quants::ternary::tq2_0::*;
            let three = _mm256_set1_epi8(3);
            ternary!(NR, w, nb, BYTES, D, x, out, |blk, q| {
                // Values 128j + 32l + m: bits 2l of byte 32j + m.
                for j in 0..2 {
                    let v = load(blk.add(QS + 32 * j));
                    q[4 * j] = _mm256_and_si256(v, three);
                    q[4 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 2), three);
                    q[4 * j + 2] = _mm256_and_si256(_mm256_srli_epi16(v, 4), three);
                    q[4 * j + 3] = _mm256_and_si256(_mm256_srli_epi16(v, 6), three);
                }
            })
        }

        /// Digits `(byte · 3ⁿ mod 256) · 3 >> 8` (0, 1, 2) of `bytes`, the
        /// power given per 16-bit lane (for both of its bytes) by `pow`.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn trits(bytes: __m256i, pow: __m256i) -> __m256i {
            let (low, three) = (_mm256_set1_epi16(0xFF), _mm256_set1_epi16(3));
            let even = _mm256_and_si256(_mm256_mullo_epi16(_mm256_and_si256(bytes, low), pow), low);
            let odd = _mm256_and_si256(_mm256_mullo_epi16(_mm256_srli_epi16(bytes, 8), pow), low);
            let even = _mm256_srli_epi16(_mm256_mullo_epi16(even, three), 8);
            let odd = _mm256_srli_epi16(_mm256_mullo_epi16(odd, three), 8);
            _mm256_or_si256(even, _mm256_slli_epi16(odd, 8))
        }

        /// TQ1_0: values 0..160 are digit n of byte m < 32 at 32n + m,
        /// 160..240 digit n of byte 32 + m < 48 at 160 + 16n + m, the last
        /// 16 digit n of qh byte m at 240 + 4n + m.
        #[target_feature(enable = $feat)]
        unsafe fn tq1_0<const NR: usize>(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
            use blockdraft_gguf::quants::ternary::tq1_0::*;
            let pow = [1, 3, 9, 27, 81].map(|p| _mm256_set1_epi16(p));
            // The 16 bytes after: digits n, n + 1 in the two halves.
            let pairs = [(1, 3), (9, 27)]
                .map(|(lo, hi)| _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo)));
            // qh: position 4n + m of the high half reads byte m at 3ⁿ.
            let qh_pow = _mm256_set_epi16(27, 27, 9, 9, 3, 3, 1, 1, 81, 81, 81, 81, 81, 81, 81, 81);
            let qh_spread = _mm_set_epi8(3, 2, 1, 0, 3, 2, 1, 0, 3, 2, 1, 0, 3, 2, 1, 0);
            ternary!(NR, w, nb, BYTES, D, x, out, |blk, q| {
                let head = load(blk.add(QS));
                for (qn, &p) in q.iter_mut().zip(&pow) {
                    *qn = trits(head, p);
                }
                let tail = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                    blk.add(QS + 32) as *const __m128i
                ));
                q[5] = trits(tail, pairs[0]);
                q[6] = trits(tail, pairs[1]);
                let qh = _mm_shuffle_epi8(
                    _mm_cvtsi32_si128((blk.add(QH) as *const i32).read_unaligned()),
                    qh_spread,
                );
                let last = _mm256_set_m128i(qh, _mm256_castsi256_si128(tail));
                q[7] = trits(last, qh_pow);
            })
        }
    };
}
pub(crate) use lattice_kernels;

/// The IQ2/IQ3 super-block loop, inline in the kernel that expands it (a
/// closure would lose its target features, and its intrinsics their
/// inlining): `$block` (with `$blk`, the block's bytes, and `$ib` bound)
/// gives 32-block `$ib`'s magnitudes, sign multipliers (±1 bytes) and
/// scale vector; `$factor`
/// is the format's constant (1/8 for IQ2, 1/4 for IQ3_XXS, 1 for IQ3_S).
macro_rules! signed_grid {
    ($nr:ident, $w:expr, $nb:expr, $bytes:expr, $factor:expr, $x:expr, $out:expr,
     |$blk:ident, $ib:ident| $block:expr) => {{
        let mut acc = [_mm256_setzero_ps(); $nr];
        let x: &[Act; $nr] = $x.try_into().unwrap_unchecked();
        for b in 0..$nb {
            prefetch_ahead($w.add(b * $bytes), $bytes, 0, 1);
            let $blk = std::slice::from_raw_parts($w.add(b * $bytes), $bytes);
            let mut sum = [_mm256_setzero_si256(); $nr];
            for $ib in 0..8 {
                // signs: 0xFF (negate) or 0x01 (keep) per byte, for sign_epi8.
                let (q, signs, scale): (__m256i, __m256i, __m256i) = $block;
                for i in 0..$nr {
                    let xv = load(x[i].qs.add(256 * b + 32 * $ib) as *const u8);
                    let p = _mm256_maddubs_epi16(q, _mm256_sign_epi8(xv, signs));
                    sum[i] = _mm256_add_epi32(sum[i], _mm256_madd_epi16(p, scale));
                }
            }
            let dw = h2f($blk.as_ptr());
            for i in 0..$nr {
                let d = _mm256_set1_ps(dw * *x[i].d.add(b));
                acc[i] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sum[i]), acc[i]);
            }
        }
        for i in 0..$nr {
            $out[i] = $factor * hsum(acc[i]);
        }
    }};
}
pub(crate) use signed_grid;

/// `[e(0), e(1), e(2), e(3)]`, spelled out: an array `map` with a closure
/// is not always inlined into the target-feature kernels.
macro_rules! four {
    (|$l:ident| $e:expr) => {
        [
            {
                let $l = 0;
                $e
            },
            {
                let $l = 1;
                $e
            },
            {
                let $l = 2;
                $e
            },
            {
                let $l = 3;
                $e
            },
        ]
    };
}
pub(crate) use four;

/// The ternary types' super-block loop, inline as `signed_grid!`: `$fill`
/// (with `$blk`, a pointer to the block, and `$q`, its eight vectors)
/// writes values `32k..32k+32` stored + 1 (0, 1, 2) into `$q[k]`. Lane
/// sums of the unsigned digits against the activations, less each lane's
/// two 16-sums (the + 1), then `fma(lanes, d_w * d_x, acc)` per super-block:
/// ggml's AVX2 `ggml_vec_dot_tq{1,2}_0_q8_K`, whose multiply-add the C
/// compiler fuses.
macro_rules! ternary {
    ($nr:ident, $w:expr, $nb:expr, $bytes:expr, $d_at:expr, $x:expr, $out:expr,
     |$blk:ident, $q:ident| $fill:expr) => {{
        let mut acc = [_mm256_setzero_ps(); $nr];
        let x: &[Act; $nr] = $x.try_into().unwrap_unchecked();
        let ones = _mm256_set1_epi16(1);
        for b in 0..$nb {
            let $blk = $w.add(b * $bytes);
            prefetch_ahead($blk, $bytes, 0, 1);
            let mut $q = [_mm256_setzero_si256(); 8];
            $fill;
            let dw = h2f($blk.add($d_at));
            for i in 0..$nr {
                let mut sum = _mm256_setzero_si256();
                for (k, &qk) in $q.iter().enumerate() {
                    let xv = load(x[i].qs.add(256 * b + 32 * k) as *const u8);
                    sum = _mm256_add_epi32(sum, dot_u8(qk, xv));
                }
                let bs = load(x[i].bs.add(16 * b) as *const u8);
                let lanes = _mm256_sub_epi32(sum, _mm256_madd_epi16(bs, ones));
                let d = _mm256_set1_ps(*x[i].d.add(b) * dw);
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), d, acc[i]);
            }
        }
        for i in 0..$nr {
            $out[i] = hsum(acc[i]);
        }
    }};
}
pub(crate) use ternary;
