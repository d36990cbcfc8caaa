//! The 4-bit float formats: each nibble is an E2M1 value (±0, 0.5, 1, 1.5,
//! 2, 3, 4, 6; stored doubled as integers, [`KVALUES`]) times a block scale
//! that carries the missing half.
//!
//! MXFP4 (OCP microscaling): 32 values per power-of-two scale (E8M0).
//! NVFP4: 64 values in four 16-value parts, each with an unsigned E4M3
//! scale. Dequantizers follow ggml's; MXFP4's quantizer follows ggml's
//! reference as the PyPI `gguf` package has it (NVFP4 is not quantized
//! here).

/// The E2M1 values, doubled (ggml's `kvalues_mxfp4`): index = the nibble.
pub const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// An E8M0 exponent byte as `2^(e - 127) / 2` (ggml's
/// `ggml_e8m0_to_fp32_half`; the half undoes the doubled [`KVALUES`]).
#[inline]
pub fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

/// An unsigned E4M3 scale byte, halved (ggml's `ggml_ue4m3_to_fp32`; 0 and
/// 0x7F, its NaN, read as 0).
#[inline]
pub fn ue4m3_half(x: u8) -> f32 {
    if x == 0 || x == 0x7F {
        return 0.0;
    }
    let (exp, man) = ((x >> 3) & 0xF, (x & 7) as f32);
    let raw = if exp == 0 {
        man * (-9f32).exp2()
    } else {
        (1.0 + man / 8.0) * (exp as f32 - 7.0).exp2()
    };
    raw * 0.5
}

/// `{ u8 e; u8 qs[16] }`: value `j` is the low nibble of `qs[j]`, value
/// `16 + j` its high nibble; x = e8m0_half(e) · KVALUES[q].
pub mod mxfp4 {
    use super::*;
    pub const BYTES: usize = 17;
    pub const E: usize = 0;
    pub const QS: usize = 1;

    pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
        let d = e8m0_half(b[E]);
        for j in 0..16 {
            y[j] = KVALUES[(b[QS + j] & 0xF) as usize] as f32 * d;
            y[j + 16] = KVALUES[(b[QS + j] >> 4) as usize] as f32 * d;
        }
    }

    /// The exponent puts the largest magnitude in the top binade of the
    /// grid (`floor(log2 max) - 2`, taken exactly from the float's bits),
    /// then each value takes the nearest grid point (the first on a tie).
    pub fn quantize_block(x: &[f32], b: &mut [u8]) {
        let max = x[..32].iter().fold(0f32, |m, v| m.max(v.abs()));
        let e = if max > 0.0 {
            (floor_log2(max) - 2 + 127).clamp(0, 255) as u8
        } else {
            0
        };
        b[E] = e;
        let d = e8m0_half(e);
        let nearest = |v: f32| {
            let mut best = 0;
            for (i, &k) in KVALUES.iter().enumerate() {
                if (d * k as f32 - v).abs() < (d * KVALUES[best] as f32 - v).abs() {
                    best = i;
                }
            }
            best as u8
        };
        for j in 0..16 {
            b[QS + j] = nearest(x[j]) | nearest(x[j + 16]) << 4;
        }
    }

    /// `floor(log2 v)` for a positive finite `v`, subnormals included.
    fn floor_log2(v: f32) -> i32 {
        let bits = v.to_bits();
        let exp = (bits >> 23) as i32;
        if exp == 0 {
            -127 - (bits.leading_zeros() as i32 - 9)
        } else {
            exp - 127
        }
    }
}

/// `{ u8 d[4]; u8 qs[32] }`: part `s` (16 values) has scale `d[s]`; its
/// value `j` is the low nibble of `qs[8 s + j]`, value `8 + j` the high one.
pub mod nvfp4 {
    use super::*;
    pub const BYTES: usize = 36;
    pub const D: usize = 0;
    pub const QS: usize = 4;

    pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
        for s in 0..4 {
            let d = ue4m3_half(b[D + s]);
            for j in 0..8 {
                let q = b[QS + 8 * s + j];
                y[16 * s + j] = KVALUES[(q & 0xF) as usize] as f32 * d;
                y[16 * s + j + 8] = KVALUES[(q >> 4) as usize] as f32 * d;
            }
        }
    }
}
