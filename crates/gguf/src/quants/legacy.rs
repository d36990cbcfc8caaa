//! The 32-element block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1.
//!
//! Nibble order (all 4/5-bit types): byte `j` holds element `j` in its low
//! nibble and element `j + 16` in its high nibble. For the 5-bit types, bit
//! `j` of the little-endian u32 `qh` is bit 4 of element `j`.
//!
//! Slices passed to the block functions must be exactly one block long
//! (`BYTES` bytes and 32 floats); [`super::dequantize`] guarantees that.

use super::{f16_at, put_f16, signed_absmax};

/// Elements per block.
pub const QK: usize = 32;

fn min_max(x: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        min = min.min(v);
        max = max.max(v);
    }
    (min, max)
}

/// `{ f16 d; u8 qs[16] }`: x = d * (q - 8).
pub mod q4_0 {
    use super::*;
    pub const BYTES: usize = 18;
    pub const D: usize = 0;
    pub const QS: usize = 2;

    pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
        let d = f16_at(b, D);
        for j in 0..QK / 2 {
            let q = b[QS + j];
            y[j] = ((q & 0xF) as i32 - 8) as f32 * d;
            y[j + QK / 2] = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }

    /// ggml `quantize_row_q4_0_ref`.
    pub fn quantize_block(x: &[f32], b: &mut [u8]) {
        let max = signed_absmax(x);
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(b, D, d);
        for j in 0..QK / 2 {
            let x0 = x[j] * id;
            let x1 = x[j + QK / 2] * id;
            let q0 = ((x0 + 8.5) as i8).clamp(0, 15) as u8;
            let q1 = ((x1 + 8.5) as i8).clamp(0, 15) as u8;
            b[QS + j] = q0 | (q1 << 4);
        }
    }
}

/// `{ f16 d; f16 m; u8 qs[16] }`: x = d * q + m.
pub mod q4_1 {
    use super::*;
    pub const BYTES: usize = 20;
    pub const D: usize = 0;
    pub const M: usize = 2;
    pub const QS: usize = 4;

    pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
        let d = f16_at(b, D);
        let m = f16_at(b, M);
        for j in 0..QK / 2 {
            let q = b[QS + j];
            y[j] = (q & 0xF) as f32 * d + m;
            y[j + QK / 2] = (q >> 4) as f32 * d + m;
        }
    }

    /// ggml `quantize_row_q4_1_ref`.
    pub fn quantize_block(x: &[f32], b: &mut [u8]) {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(b, D, d);
        put_f16(b, M, min);
        for j in 0..QK / 2 {
            let x0 = (x[j] - min) * id;
            let x1 = (x[j + QK / 2] - min) * id;
            let q0 = ((x0 + 0.5) as i8).clamp(0, 15) as u8;
            let q1 = ((x1 + 0.5) as i8).clamp(0, 15) as u8;
            b[QS + j] = q0 | (q1 << 4);
        }
    }
}

/// `{ f16 d; u8 qh[4]; u8 qs[16] }`: x = d * (q - 16), q 5-bit.
pub mod q5_0 {
    use super::*;
    pub const BYTES: usize = 22;
    pub const D: usize = 0;
    pub const QH: usize = 2;
    pub const QS: usize = 6;

    pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
        let d = f16_at(b, D);
        let qh = u32::from_le_bytes([b[QH], b[QH + 1], b[QH + 2], b[QH + 3]]);
        for j in 0..QK / 2 {
            let h0 = ((qh >> j) << 4) & 0x10;
            let h1 = (qh >> (j + 12)) & 0x10;
            let q = b[QS + j] as u32;
            y[j] = (((q & 0xF) | h0) as i32 - 16) as f32 * d;
            y[j + QK / 2] = (((q >> 4) | h1) as i32 - 16) as f32 * d;
        }
    }

    /// ggml `quantize_row_q5_0_ref`.
    pub fn quantize_block(x: &[f32], b: &mut [u8]) {
        let max = signed_absmax(x);
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(b, D, d);
        let mut qh = 0u32;
        for j in 0..QK / 2 {
            let x0 = x[j] * id;
            let x1 = x[j + QK / 2] * id;
            let q0 = ((x0 + 16.5) as i8).clamp(0, 31) as u8;
            let q1 = ((x1 + 16.5) as i8).clamp(0, 31) as u8;
            b[QS + j] = (q0 & 0xF) | ((q1 & 0xF) << 4);
            qh |= ((q0 as u32 & 0x10) >> 4) << j;
            qh |= ((q1 as u32 & 0x10) >> 4) << (j + QK / 2);
        }
        b[QH..QH + 4].copy_from_slice(&qh.to_le_bytes());
    }
}

/// `{ f16 d; f16 m; u8 qh[4]; u8 qs[16] }`: x = d * q + m, q 5-bit.
pub mod q5_1 {
    use super::*;
    pub const BYTES: usize = 24;
    pub const D: usize = 0;
    pub const M: usize = 2;
    pub const QH: usize = 4;
    pub const QS: usize = 8;

    pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
        let d = f16_at(b, D);
        let m = f16_at(b, M);
        let qh = u32::from_le_bytes([b[QH], b[QH + 1], b[QH + 2], b[QH + 3]]);
        for j in 0..QK / 2 {
            let h0 = ((qh >> j) << 4) & 0x10;
            let h1 = (qh >> (j + 12)) & 0x10;
            let q = b[QS + j] as u32;
            y[j] = ((q & 0xF) | h0) as f32 * d + m;
            y[j + QK / 2] = ((q >> 4) | h1) as f32 * d + m;
        }
    }

    /// ggml `quantize_row_q5_1_ref`.
    pub fn quantize_block(x: &[f32], b: &mut [u8]) {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(b, D, d);
        put_f16(b, M, min);
        let mut qh = 0u32;
        for j in 0..QK / 2 {
            let x0 = (x[j] - min) * id;
            let x1 = (x[j + QK / 2] - min) * id;
            let q0 = ((x0 + 0.5) as u8).min(31);
            let q1 = ((x1 + 0.5) as u8).min(31);
            b[QS + j] = (q0 & 0xF) | ((q1 & 0xF) << 4);
            qh |= ((q0 as u32 & 0x10) >> 4) << j;
            qh |= ((q1 as u32 & 0x10) >> 4) << (j + QK / 2);
        }
        b[QH..QH + 4].copy_from_slice(&qh.to_le_bytes());
    }
}

/// `{ f16 d; i8 qs[32] }`: x = d * q.
pub mod q8_0 {
    use super::*;
    pub const BYTES: usize = 34;
    pub const D: usize = 0;
    pub const QS: usize = 2;

    pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
        let d = f16_at(b, D);
        for j in 0..QK {
            y[j] = (b[QS + j] as i8) as f32 * d;
        }
    }

    /// ggml `quantize_row_q8_0_ref` (roundf: half away from zero).
    pub fn quantize_block(x: &[f32], b: &mut [u8]) {
        let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(b, D, d);
        for j in 0..QK {
            b[QS + j] = ((x[j] * id).round() as i8) as u8;
        }
    }
}

/// `{ f16 d; f16 s; i8 qs[32] }`: x = d * q; `s = d * sum(q)` is a
/// precomputed term for dot products with Q4_1/Q5_1 weights.
pub mod q8_1 {
    use super::*;
    pub const BYTES: usize = 36;
    pub const D: usize = 0;
    pub const S: usize = 2;
    pub const QS: usize = 4;

    pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
        let d = f16_at(b, D);
        for j in 0..QK {
            y[j] = (b[QS + j] as i8) as f32 * d;
        }
    }

    /// ggml `quantize_row_q8_1_ref`.
    pub fn quantize_block(x: &[f32], b: &mut [u8]) {
        let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for j in 0..QK {
            let q = (x[j] * id).round() as i8;
            sum += q as i32;
            b[QS + j] = q as u8;
        }
        put_f16(b, D, d);
        put_f16(b, S, sum as f32 * d);
    }
}
