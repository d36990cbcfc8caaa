//! The non-linear 4-bit formats: IQ4_NL (32-blocks) and IQ4_XS (256-super-
//! blocks of eight 32-blocks with 6-bit scales). Each 4-bit index picks one
//! of the 16 signed values of [`KVALUES`] (denser near zero than a uniform
//! grid), times the block's scale.
//!
//! Nibble order as in the legacy types: within a 32-block, byte `j` holds
//! element `j` in its low nibble and element `j + 16` in its high nibble.
//!
//! The dequantizers follow ggml's reference operation by operation. The
//! quantizers pick each block's scale by least squares from a start that maps
//! the largest magnitude onto the grid's end, then the nearest grid value per
//! element: valid blocks, simpler than ggml's search over several scales.

use super::{f16_at, put_f16, signed_absmax};

/// The grid both formats index (ggml's `kvalues_iq4nl`).
pub const KVALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Elements per 32-block.
const QK: usize = 32;

/// Index of the grid value nearest `v` (the lower one on a tie).
fn nearest(v: f32) -> u8 {
    let mut best = 0;
    for (i, &k) in KVALUES.iter().enumerate() {
        if (v - k as f32).abs() < (v - KVALUES[best] as f32).abs() {
            best = i;
        }
    }
    best as u8
}

/// The scale of a 32-block and its indices: the largest magnitude onto the
/// grid's end (-127), then one least-squares refit of the scale to the
/// indices that start picks, keeping whichever has the smaller error.
fn fit_block(x: &[f32]) -> (f32, [u8; QK]) {
    let max = signed_absmax(x);
    let mut idx = [0u8; QK];
    if max == 0.0 {
        return (0.0, [nearest(0.0); QK]);
    }
    let quantize_with = |d: f32, idx: &mut [u8; QK]| -> f32 {
        let id = 1.0 / d;
        let mut err = 0.0;
        for (i, &v) in x.iter().enumerate() {
            idx[i] = nearest(v * id);
            let e = v - d * KVALUES[idx[i] as usize] as f32;
            err += e * e;
        }
        err
    };
    let d0 = max / KVALUES[0] as f32;
    let err0 = quantize_with(d0, &mut idx);
    let (mut xq, mut qq) = (0.0f32, 0.0f32);
    for (&v, &i) in x.iter().zip(&idx) {
        let q = KVALUES[i as usize] as f32;
        xq += v * q;
        qq += q * q;
    }
    let d1 = if qq > 0.0 { xq / qq } else { 0.0 };
    let mut idx1 = [0u8; QK];
    if d1 != 0.0 && quantize_with(d1, &mut idx1) < err0 {
        return (d1, idx1);
    }
    (d0, idx)
}

/// The 32 values of one 32-block's 16 nibble bytes at scale `d`
/// (ggml's `d * kvalues_iq4nl[q]`, the order both formats use).
fn dequantize_32(d: f32, qs: &[u8], y: &mut [f32]) {
    for j in 0..QK / 2 {
        y[j] = d * KVALUES[(qs[j] & 0xF) as usize] as f32;
        y[j + QK / 2] = d * KVALUES[(qs[j] >> 4) as usize] as f32;
    }
}

/// Packs 32 indices two to a byte (element `j` low, `j + 16` high).
fn pack_nibbles(idx: &[u8; QK], qs: &mut [u8]) {
    for j in 0..QK / 2 {
        qs[j] = idx[j] | (idx[j + QK / 2] << 4);
    }
}

/// `{ f16 d; u8 qs[16] }`: x = d * KVALUES[q].
pub mod iq4_nl {
    use super::*;
    pub const BYTES: usize = 18;
    pub const D: usize = 0;
    pub const QS: usize = 2;

    /// ggml `dequantize_row_iq4_nl`.
    pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
        dequantize_32(f16_at(b, D), &b[QS..QS + QK / 2], y);
    }

    pub fn quantize_block(x: &[f32], b: &mut [u8]) {
        let (d, idx) = fit_block(x);
        put_f16(b, D, d);
        // Indices for the scale as stored (rounded to f16).
        let d = f16_at(b, D);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let idx = if d != 0.0 {
            std::array::from_fn(|i| nearest(x[i] * id))
        } else {
            idx
        };
        pack_nibbles(&idx, &mut b[QS..QS + QK / 2]);
    }
}

/// `{ f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128] }`: 32-block `ib` has
/// the 6-bit scale `ls` = nibble `ib % 2` of `scales_l[ib / 2]` | bits
/// `2 ib ..= 2 ib + 1` of `scales_h` << 4, and x = d * (ls - 32) * KVALUES[q].
pub mod iq4_xs {
    use super::*;
    pub const BYTES: usize = 136;
    pub const D: usize = 0;
    pub const SCALES_H: usize = 2;
    pub const SCALES_L: usize = 4;
    pub const QS: usize = 8;

    /// Scale `ib` (0..8) minus 32.
    pub fn scale(b: &[u8], ib: usize) -> i32 {
        let h = u16::from_le_bytes([b[SCALES_H], b[SCALES_H + 1]]) as i32;
        let lo = (b[SCALES_L + ib / 2] >> (4 * (ib % 2))) as i32 & 0xF;
        (lo | (((h >> (2 * ib)) & 3) << 4)) - 32
    }

    /// ggml `dequantize_row_iq4_xs`.
    pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
        let d = f16_at(b, D);
        for ib in 0..8 {
            let dl = d * scale(b, ib) as f32;
            let qs = &b[QS + 16 * ib..QS + 16 * (ib + 1)];
            dequantize_32(dl, qs, &mut y[32 * ib..32 * (ib + 1)]);
        }
    }

    pub fn quantize_block(x: &[f32], b: &mut [u8]) {
        let scales: [f32; 8] = std::array::from_fn(|ib| fit_block(&x[32 * ib..32 * (ib + 1)]).0);
        let max = signed_absmax(&scales);
        let d = max / -32.0;
        put_f16(b, D, d);
        let d = f16_at(b, D);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let (mut h, mut lo) = (0u16, [0u8; 4]);
        for ib in 0..8 {
            let l = ((scales[ib] * id).round() as i32).clamp(-32, 31);
            let ls = (l + 32) as u8;
            lo[ib / 2] |= (ls & 0xF) << (4 * (ib % 2));
            h |= ((ls >> 4) as u16) << (2 * ib);
            let dl = d * l as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            let idx = std::array::from_fn(|i| nearest(x[32 * ib + i] * idl));
            pack_nibbles(&idx, &mut b[QS + 16 * ib..QS + 16 * (ib + 1)]);
        }
        b[SCALES_H..SCALES_H + 2].copy_from_slice(&h.to_le_bytes());
        b[SCALES_L..SCALES_L + 4].copy_from_slice(&lo);
    }
}
