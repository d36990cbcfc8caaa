//! Scalar reference (de)quantization of the ggml block formats.
//!
//! These are the ground truth the SIMD / GPU kernels are tested against, so
//! they follow ggml's reference C code operation by operation (same order of
//! f32 multiplies and subtractions, no fused multiply-add) and match the PyPI
//! `gguf` package bit for bit (see `tests/fixtures/gguf/quants.gguf`).
//!
//! Each family module documents its block layout with byte-offset constants
//! (`D`, `QS`, ...) and exposes single-block `dequantize_block` /
//! `quantize_block` functions for kernels that work block by block.

pub mod float;
pub mod fp4;
pub mod grids;
pub mod iquants;
pub mod kquants;
pub mod lattice;
pub mod legacy;
pub mod ternary;

use crate::error::{GgufError, Result};
use crate::GgmlType;

/// Reads a little-endian f16 at `b[i..i + 2]` as f32.
#[inline]
pub fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

/// Writes `x` rounded to f16 (nearest even, like ggml and numpy).
#[inline]
pub fn put_f16(b: &mut [u8], i: usize, x: f32) {
    b[i..i + 2].copy_from_slice(&half::f16::from_f32(x).to_bits().to_le_bytes());
}

/// Rounds `x` to f16 and back, i.e. the value a stored f16 scale will have.
#[inline]
pub fn round_f16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

/// The value with the largest magnitude (first one wins ties), as ggml's
/// reference quantizers pick it.
pub(crate) fn signed_absmax(x: &[f32]) -> f32 {
    let mut amax = 0f32;
    let mut max = 0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// Number of blocks in `bytes`, checking that `n_values` matches.
fn check_lengths(ty: GgmlType, n_bytes: usize, n_values: usize, op: &str) -> Result<usize> {
    let bb = ty.block_bytes();
    let bl = ty.block_len();
    if n_bytes % bb != 0 {
        return Err(GgufError::BadLength {
            what: format!("{op} {ty}: byte length is not a whole number of {bb}-byte blocks"),
            expected: (n_bytes / bb * bb) as u64,
            found: n_bytes as u64,
        });
    }
    let blocks = n_bytes / bb;
    if blocks.checked_mul(bl) != Some(n_values) {
        return Err(GgufError::BadLength {
            what: format!("{op} {ty}: f32 buffer length"),
            expected: (blocks as u64).saturating_mul(bl as u64),
            found: n_values as u64,
        });
    }
    Ok(blocks)
}

/// Decodes `bytes` (whole blocks of `ty`) into `out`; `out.len()` must equal
/// the number of encoded elements. Integer types are converted to f32.
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    check_lengths(ty, bytes.len(), out.len(), "dequantize")?;
    let bb = ty.block_bytes();
    let bl = ty.block_len();
    macro_rules! blocks {
        ($f:path) => {
            for (b, o) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(bl)) {
                $f(b, o);
            }
        };
    }
    use GgmlType as T;
    match ty {
        T::F32 | T::F16 | T::BF16 | T::I8 | T::I16 | T::I32 | T::I64 | T::F64 => {
            float::dequantize(ty, bytes, out)
        }
        T::Q4_0 => blocks!(legacy::q4_0::dequantize_block),
        T::Q4_1 => blocks!(legacy::q4_1::dequantize_block),
        T::Q5_0 => blocks!(legacy::q5_0::dequantize_block),
        T::Q5_1 => blocks!(legacy::q5_1::dequantize_block),
        T::Q8_0 => blocks!(legacy::q8_0::dequantize_block),
        T::Q8_1 => blocks!(legacy::q8_1::dequantize_block),
        T::Q2_K => blocks!(kquants::q2_k::dequantize_block),
        T::Q3_K => blocks!(kquants::q3_k::dequantize_block),
        T::Q4_K => blocks!(kquants::q4_k::dequantize_block),
        T::Q5_K => blocks!(kquants::q5_k::dequantize_block),
        T::Q6_K => blocks!(kquants::q6_k::dequantize_block),
        T::Q8_K => blocks!(kquants::q8_k::dequantize_block),
        T::IQ4_NL => blocks!(iquants::iq4_nl::dequantize_block),
        T::IQ4_XS => blocks!(iquants::iq4_xs::dequantize_block),
        T::IQ2_XXS => blocks!(lattice::iq2_xxs::dequantize_block),
        T::IQ2_XS => blocks!(lattice::iq2_xs::dequantize_block),
        T::IQ2_S => blocks!(lattice::iq2_s::dequantize_block),
        T::IQ3_XXS => blocks!(lattice::iq3_xxs::dequantize_block),
        T::IQ3_S => blocks!(lattice::iq3_s::dequantize_block),
        T::IQ1_S => blocks!(lattice::iq1_s::dequantize_block),
        T::IQ1_M => blocks!(lattice::iq1_m::dequantize_block),
        T::TQ1_0 => blocks!(ternary::tq1_0::dequantize_block),
        T::TQ2_0 => blocks!(ternary::tq2_0::dequantize_block),
        T::MXFP4 => blocks!(fp4::mxfp4::dequantize_block),
        T::NVFP4 => blocks!(fp4::nvfp4::dequantize_block),
    }
    Ok(())
}

/// Convenience: dequantizes into a new vector.
pub fn dequantize_to_vec(ty: GgmlType, bytes: &[u8]) -> Result<Vec<f32>> {
    let bb = ty.block_bytes();
    let n = bytes.len() / bb * ty.block_len();
    let mut out = vec![0f32; n];
    dequantize(ty, bytes, &mut out)?;
    Ok(out)
}

/// Whether [`quantize`] supports `ty`: every type but the lattice formats
/// (IQ1/IQ2/IQ3, see [`lattice`]) and NVFP4, which are read only.
pub fn can_quantize(ty: GgmlType) -> bool {
    use GgmlType as T;
    !matches!(
        ty,
        T::IQ2_XXS | T::IQ2_XS | T::IQ2_S | T::IQ3_XXS | T::IQ3_S | T::IQ1_S | T::IQ1_M | T::NVFP4
    )
}

/// Encodes `x` as `ty` into `out` (round-to-nearest reference quantizers;
/// `x.len()` must be a whole number of blocks and `out` exactly its size).
///
/// Q8_0 / Q8_1 / Q8_K / Q4_0 / Q4_1 / Q5_0 / Q5_1 follow ggml's `*_ref`
/// quantizers exactly (Q4_0..Q8_0 checked bit-exact against the `gguf`
/// Python package); Q2_K..Q6_K use simpler round-to-nearest scale choices
/// than ggml's iterative search (valid blocks, slightly less accurate), and
/// so do IQ4_NL / IQ4_XS (one least-squares refit of each block's scale).
/// TQ1_0 / TQ2_0 / MXFP4 follow ggml's references as the `gguf` package
/// has them. The types [`can_quantize`] rejects are a typed error.
pub fn quantize(ty: GgmlType, x: &[f32], out: &mut [u8]) -> Result<()> {
    check_lengths(ty, out.len(), x.len(), "quantize")?;
    let bb = ty.block_bytes();
    let bl = ty.block_len();
    macro_rules! blocks {
        ($f:path) => {
            for (xb, o) in x.chunks_exact(bl).zip(out.chunks_exact_mut(bb)) {
                $f(xb, o);
            }
        };
    }
    use GgmlType as T;
    match ty {
        T::F32 | T::F16 | T::BF16 | T::I8 | T::I16 | T::I32 | T::I64 | T::F64 => {
            float::quantize(ty, x, out)
        }
        T::Q4_0 => blocks!(legacy::q4_0::quantize_block),
        T::Q4_1 => blocks!(legacy::q4_1::quantize_block),
        T::Q5_0 => blocks!(legacy::q5_0::quantize_block),
        T::Q5_1 => blocks!(legacy::q5_1::quantize_block),
        T::Q8_0 => blocks!(legacy::q8_0::quantize_block),
        T::Q8_1 => blocks!(legacy::q8_1::quantize_block),
        T::Q2_K => blocks!(kquants::q2_k::quantize_block),
        T::Q3_K => blocks!(kquants::q3_k::quantize_block),
        T::Q4_K => blocks!(kquants::q4_k::quantize_block),
        T::Q5_K => blocks!(kquants::q5_k::quantize_block),
        T::Q6_K => blocks!(kquants::q6_k::quantize_block),
        T::Q8_K => blocks!(kquants::q8_k::quantize_block),
        T::IQ4_NL => blocks!(iquants::iq4_nl::quantize_block),
        T::IQ4_XS => blocks!(iquants::iq4_xs::quantize_block),
        T::TQ1_0 => blocks!(ternary::tq1_0::quantize_block),
        T::TQ2_0 => blocks!(ternary::tq2_0::quantize_block),
        T::MXFP4 => blocks!(fp4::mxfp4::quantize_block),
        T::IQ2_XXS
        | T::IQ2_XS
        | T::IQ2_S
        | T::IQ3_XXS
        | T::IQ3_S
        | T::IQ1_S
        | T::IQ1_M
        | T::NVFP4 => {
            return Err(GgufError::UnsupportedType {
                what: "quantize (a read-only format)".into(),
                ty,
            })
        }
    }
    Ok(())
}

/// Convenience: quantizes into a new vector.
pub fn quantize_to_vec(ty: GgmlType, x: &[f32]) -> Result<Vec<u8>> {
    let bl = ty.block_len();
    let n = x.len() / bl * ty.block_bytes();
    let mut out = vec![0u8; n];
    quantize(ty, x, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic pseudo-random values in [-1, 1) (xorshift).
    pub(crate) fn noise(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn quantize_dequantize_error_is_small() {
        // Max abs error allowed relative to the block's max |x|.
        let cases = [
            (GgmlType::F32, 0.0),
            (GgmlType::F16, 1e-3),
            (GgmlType::BF16, 1e-2),
            (GgmlType::Q8_0, 0.01),
            (GgmlType::Q8_1, 0.01),
            (GgmlType::Q8_K, 0.01),
            (GgmlType::Q4_0, 0.15),
            (GgmlType::Q4_1, 0.1),
            (GgmlType::Q5_0, 0.07),
            (GgmlType::Q5_1, 0.05),
            (GgmlType::Q2_K, 0.35),
            (GgmlType::Q3_K, 0.3),
            (GgmlType::Q4_K, 0.08),
            (GgmlType::Q5_K, 0.04),
            (GgmlType::Q6_K, 0.04),
            (GgmlType::IQ4_NL, 0.15),
            (GgmlType::IQ4_XS, 0.15),
            // Three levels: anything up to half the scale away.
            (GgmlType::TQ1_0, 0.5),
            (GgmlType::TQ2_0, 0.5),
            // E2M1: at most half its top gap (8 to 12 scales), a quarter of max.
            (GgmlType::MXFP4, 0.26),
        ];
        for (ty, tol) in cases {
            for seed in 0..4 {
                let mut x = noise(512, seed);
                if seed == 3 {
                    x.iter_mut().for_each(|v| *v = *v * 100.0 + 3.0);
                }
                let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
                let q = quantize_to_vec(ty, &x).unwrap();
                assert_eq!(q.len() as u64, ty.bytes_for(512).unwrap());
                let y = dequantize_to_vec(ty, &q).unwrap();
                let err = x
                    .iter()
                    .zip(&y)
                    .fold(0f32, |a, (p, q)| a.max((p - q).abs()));
                assert!(
                    err <= tol * amax + 1e-7,
                    "{ty} seed {seed}: err {err} amax {amax}"
                );
            }
        }
    }

    #[test]
    fn zeros_quantize_to_zeros() {
        for ty in GgmlType::ALL {
            if !can_quantize(ty) {
                continue;
            }
            let x = vec![0f32; 256];
            let q = quantize_to_vec(ty, &x).unwrap();
            assert!(
                dequantize_to_vec(ty, &q).unwrap().iter().all(|&v| v == 0.0),
                "{ty}"
            );
        }
    }

    #[test]
    fn length_mismatches_are_errors_not_panics() {
        let mut out = vec![0f32; 32];
        assert!(dequantize(GgmlType::Q8_0, &[0; 33], &mut out).is_err());
        assert!(dequantize(GgmlType::Q8_0, &[0; 68], &mut out).is_err());
        assert!(dequantize(GgmlType::Q8_0, &[0; 34], &mut out).is_ok());
        let mut b = vec![0u8; 34];
        assert!(quantize(GgmlType::Q8_0, &[0.0; 31], &mut b).is_err());
        assert!(quantize(GgmlType::Q2_K, &[0.0; 256], &mut [0; 83]).is_err());
    }
}
