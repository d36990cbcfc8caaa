//! The ternary formats of BitNet-style models: every weight is -1, 0 or 1
//! times one f16 scale per 256 values.
//!
//! TQ2_0 stores each value in 2 bits; TQ1_0 packs five values into a byte
//! as base-3 digits in fixed point (`byte = ceil(n * 256 / 243)` for the
//! base-3 number `n`, so that multiplying by 3^k and taking the top bits of
//! `q * 3` reads digit k, most significant first), plus four more per byte
//! in its `qh` tail. Both follow ggml's reference (de)quantizers, which the
//! PyPI `gguf` package reproduces.

use super::{f16_at, put_f16};

/// ggml's rounding (half away from zero), as `gguf`'s `np_roundf`.
fn trit(v: f32) -> u8 {
    (v.round() as i32 + 1) as u8
}

/// The scale `max |x|` and its reciprocal (0 for an all-zero block).
fn scale(x: &[f32]) -> (f32, f32) {
    let d = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    (d, if d == 0.0 { 0.0 } else { 1.0 / d })
}

/// `{ u8 qs[48]; u8 qh[4]; f16 d }`: values `0..160` are digit `n` of
/// `qs[m]` (m < 32) at `32 n + m`, values `160..240` digit `n` of
/// `qs[32 + m]` at `160 + 16 n + m`, values `240..256` digit `n` of `qh[m]`
/// at `240 + 4 n + m`.
pub mod tq1_0 {
    use super::*;
    pub const BYTES: usize = 54;
    pub const QS: usize = 0;
    pub const QH: usize = 48;
    pub const D: usize = 52;

    /// Digit `n` (0 = most significant) of a packed byte, as -1, 0 or 1.
    #[inline(always)]
    pub fn digit(byte: u8, n: usize) -> i32 {
        const POW3: [u8; 5] = [1, 3, 9, 27, 81];
        let q = byte.wrapping_mul(POW3[n]);
        ((q as u16 * 3) >> 8) as i32 - 1
    }

    /// Byte and digit holding value `i` (0..256) of a block.
    #[inline(always)]
    pub fn position(i: usize) -> (usize, usize) {
        match i {
            0..160 => (QS + i % 32, i / 32),
            160..240 => (QS + 32 + (i - 160) % 16, (i - 160) / 16),
            _ => (QH + (i - 240) % 4, (i - 240) / 4),
        }
    }

    pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
        let d = f16_at(b, D);
        for (i, v) in y[..256].iter_mut().enumerate() {
            let (at, n) = position(i);
            *v = digit(b[at], n) as f32 * d;
        }
    }

    pub fn quantize_block(x: &[f32], b: &mut [u8]) {
        let (d, id) = scale(x);
        let mut n = [0u16; 52];
        for (i, &v) in x[..256].iter().enumerate() {
            let (at, k) = position(i);
            // Digit k of five (four in qh) is worth 3^(4 - k).
            n[at] += trit(v * id) as u16 * [81, 27, 9, 3, 1][k];
        }
        for (dst, n) in b[..52].iter_mut().zip(n) {
            *dst = (n * 256).div_ceil(243) as u8;
        }
        put_f16(b, D, d);
    }
}

/// `{ u8 qs[64]; f16 d }`: value `128 j + 32 l + m` is bits `2l, 2l + 1` of
/// `qs[32 j + m]`, stored + 1.
pub mod tq2_0 {
    use super::*;
    pub const BYTES: usize = 66;
    pub const QS: usize = 0;
    pub const D: usize = 64;

    /// Value `i` (0..256) as -1, 0 or 1.
    #[inline(always)]
    pub fn value(b: &[u8], i: usize) -> i32 {
        let (j, l, m) = (i / 128, (i % 128) / 32, i % 32);
        ((b[QS + 32 * j + m] >> (2 * l)) & 3) as i32 - 1
    }

    pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
        let d = f16_at(b, D);
        for (i, v) in y[..256].iter_mut().enumerate() {
            *v = value(b, i) as f32 * d;
        }
    }

    pub fn quantize_block(x: &[f32], b: &mut [u8]) {
        let (d, id) = scale(x);
        b[..64].fill(0);
        for (i, &v) in x[..256].iter().enumerate() {
            let (j, l, m) = (i / 128, (i % 128) / 32, i % 32);
            b[QS + 32 * j + m] |= trit(v * id) << (2 * l);
        }
        put_f16(b, D, d);
    }
}
