//! The lattice formats IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and
//! IQ1_M: 256-value super-blocks in which one index picks a whole row of 8
//! (IQ1, IQ2) or 4 (IQ3) magnitudes from a fixed grid ([`super::grids`]),
//! signs come separately (7 stored bits per 8 values, the eighth implied by
//! parity, or 8 plain bits in the `_S` types; IQ1 has none, its grid is
//! signed), and each 32 (or 16) values share a small odd scale.
//!
//! Only dequantizers: these formats are made by an importance-weighted
//! search over the grids (llama-quantize with an importance matrix), which
//! blockdraft does not reproduce; [`super::quantize`] refuses them with a
//! typed error. Each dequantizer follows ggml's `dequantize_row_*`
//! operation by operation.

use super::f16_at;
use super::grids::{ksigns, IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};

/// Byte `j` (value `j`) of a grid row.
#[inline(always)]
pub fn grid_value(row: u64, j: usize) -> u8 {
    (row >> (8 * j)) as u8
}

/// `±1` for value `j` of an 8-value group with sign byte `signs`.
#[inline(always)]
fn sign(signs: u8, j: usize) -> f32 {
    if signs >> j & 1 != 0 {
        -1.0
    } else {
        1.0
    }
}

/// Eight values `db * grid[j] * sign_j` (ggml's order) into `y`.
#[inline(always)]
fn signed_row(db: f32, row: u64, signs: u8, y: &mut [f32]) {
    for (j, v) in y[..8].iter_mut().enumerate() {
        *v = db * grid_value(row, j) as f32 * sign(signs, j);
    }
}

/// The dequantizer the IQ2/IQ3 formats share: half `h` (16 values) of
/// 32-block `ib` has the 4-bit scale `scales(ib)[h]`, which `db` turns into
/// its multiplier; group `l` (8 values) is `group(ib, l)`.
fn dequantize_signed(
    y: &mut [f32],
    scales: impl Fn(usize) -> [u32; 2],
    db: impl Fn(u32) -> f32,
    group: impl Fn(usize, usize) -> (u64, u8),
) {
    for ib in 0..8 {
        let db = scales(ib).map(&db);
        for l in 0..4 {
            let (row, signs) = group(ib, l);
            signed_row(db[l / 2], row, signs, &mut y[32 * ib + 8 * l..]);
        }
    }
}

#[inline]
fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

#[inline]
fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// `{ f16 d; u16 qs[32] }`: per 32 values two words, the first four bytes
/// of grid indices, the second four 7-bit sign indices and a 4-bit scale
/// `s` on top; x = d (0.5 + s) / 4 · grid · sign.
pub mod iq2_xxs {
    use super::*;
    pub const BYTES: usize = 66;
    pub const D: usize = 0;
    pub const QS: usize = 2;

    /// The 4-bit scales of 32-block `ib`'s two halves (one for both).
    #[inline]
    pub fn scales(b: &[u8], ib: usize) -> [u32; 2] {
        [u32_at(b, QS + 8 * ib + 4) >> 28; 2]
    }

    /// Group `l` (0..4) of 32-block `ib`: its grid row and sign byte.
    #[inline]
    pub fn group(b: &[u8], ib: usize, l: usize) -> (u64, u8) {
        let aux = u32_at(b, QS + 8 * ib + 4);
        let row = IQ2XXS_GRID[b[QS + 8 * ib + l] as usize];
        (row, ksigns((aux >> (7 * l)) as u8 & 127))
    }

    pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
        let d = f16_at(b, D);
        let db = |s: u32| d * (0.5 + s as f32) * 0.25;
        dequantize_signed(y, |ib| scales(b, ib), db, |ib, l| group(b, ib, l));
    }
}

/// `{ f16 d; u16 qs[32]; u8 scales[8] }`: each `qs` word a 9-bit grid
/// index and a 7-bit sign index; 4-bit scales per 16 values (low nibble
/// first); x = d (0.5 + s) / 4 · grid · sign.
pub mod iq2_xs {
    use super::*;
    pub const BYTES: usize = 74;
    pub const D: usize = 0;
    pub const QS: usize = 2;
    pub const SCALES: usize = 66;

    /// The 4-bit scales of 32-block `ib`'s two halves.
    #[inline]
    pub fn scales(b: &[u8], ib: usize) -> [u32; 2] {
        let sc = b[SCALES + ib] as u32;
        [sc & 0xF, sc >> 4]
    }

    /// Group `l` (0..4) of 32-block `ib` (its `qs` word): the grid row and
    /// the sign byte it gives.
    #[inline]
    pub fn group(b: &[u8], ib: usize, l: usize) -> (u64, u8) {
        let w = u16_at(b, QS + 2 * (4 * ib + l));
        (IQ2XS_GRID[(w & 511) as usize], ksigns((w >> 9) as u8))
    }

    pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
        let d = f16_at(b, D);
        let db = |s: u32| d * (0.5 + s as f32) * 0.25;
        dequantize_signed(y, |ib| scales(b, ib), db, |ib, l| group(b, ib, l));
    }
}

/// `{ f16 d; u8 qs[32]; u8 signs[32]; u8 qh[8]; u8 scales[8] }`: 10-bit grid
/// indices (`qs` low bits, two bits per group from `qh`), one plain sign
/// byte per 8 values, 4-bit scales per 16 values; x = d (0.5 + s) / 4 ·
/// grid · sign.
pub mod iq2_s {
    use super::*;
    pub const BYTES: usize = 82;
    pub const D: usize = 0;
    pub const QS: usize = 2;
    pub const SIGNS: usize = 34;
    pub const QH: usize = 66;
    pub const SCALES: usize = 74;

    /// Group `l` (0..4) of 32-block `ib`: its grid row and sign byte.
    #[inline]
    pub fn group(b: &[u8], ib: usize, l: usize) -> (u64, u8) {
        let hi = ((b[QH + ib] as usize) << (8 - 2 * l)) & 0x300;
        (
            IQ2S_GRID[b[QS + 4 * ib + l] as usize | hi],
            b[SIGNS + 4 * ib + l],
        )
    }

    /// The 4-bit scales of 32-block `ib`'s two halves.
    #[inline]
    pub fn scales(b: &[u8], ib: usize) -> [u32; 2] {
        let sc = b[SCALES + ib] as u32;
        [sc & 0xF, sc >> 4]
    }

    pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
        let d = f16_at(b, D);
        let db = |s: u32| d * (0.5 + s as f32) * 0.25;
        dequantize_signed(y, |ib| scales(b, ib), db, |ib, l| group(b, ib, l));
    }
}

/// `{ f16 d; u8 qs[64]; u32 scales_and_signs[8] }`: one 8-bit grid index per
/// 4 values; per 32 values a word of four 7-bit sign indices and a 4-bit
/// scale on top; x = d (0.5 + s) / 2 · grid · sign.
pub mod iq3_xxs {
    use super::*;
    pub const BYTES: usize = 98;
    pub const D: usize = 0;
    pub const QS: usize = 2;
    pub const SCALES_SIGNS: usize = 66;

    /// The eight values of group `l` (0..4) of 32-block `ib` as one 8-byte
    /// row (two 4-value grid rows), and its sign byte.
    #[inline]
    pub fn group(b: &[u8], ib: usize, l: usize) -> (u64, u8) {
        let aux = u32_at(b, SCALES_SIGNS + 4 * ib);
        let q = &b[QS + 8 * ib + 2 * l..];
        let row = IQ3XXS_GRID[q[0] as usize] as u64 | (IQ3XXS_GRID[q[1] as usize] as u64) << 32;
        (row, ksigns((aux >> (7 * l)) as u8 & 127))
    }

    /// The 4-bit scales of 32-block `ib`'s two halves (one for both).
    #[inline]
    pub fn scales(b: &[u8], ib: usize) -> [u32; 2] {
        [u32_at(b, SCALES_SIGNS + 4 * ib) >> 28; 2]
    }

    pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
        let d = f16_at(b, D);
        let db = |s: u32| d * (0.5 + s as f32) * 0.5;
        dequantize_signed(y, |ib| scales(b, ib), db, |ib, l| group(b, ib, l));
    }
}

/// `{ f16 d; u8 qs[64]; u8 qh[8]; u8 signs[32]; u8 scales[4] }`: 9-bit grid
/// indices per 4 values (the ninth bit from `qh`), one plain sign byte per 8
/// values, 4-bit scales per 32 values; x = d (1 + 2 s) · grid · sign.
pub mod iq3_s {
    use super::*;
    pub const BYTES: usize = 110;
    pub const D: usize = 0;
    pub const QS: usize = 2;
    pub const QH: usize = 66;
    pub const SIGNS: usize = 74;
    pub const SCALES: usize = 106;

    /// Group `l` (0..4) of 32-block `ib`, as [`super::iq3_xxs::group`].
    #[inline]
    pub fn group(b: &[u8], ib: usize, l: usize) -> (u64, u8) {
        let qh = b[QH + ib] as usize;
        let q = &b[QS + 8 * ib + 2 * l..];
        let lo = IQ3S_GRID[q[0] as usize | ((qh << (8 - 2 * l)) & 256)] as u64;
        let hi = IQ3S_GRID[q[1] as usize | ((qh << (7 - 2 * l)) & 256)] as u64;
        (lo | hi << 32, b[SIGNS + 4 * ib + l])
    }

    /// The 4-bit scales of 32-block `ib`'s two halves (one for both).
    #[inline]
    pub fn scales(b: &[u8], ib: usize) -> [u32; 2] {
        [(b[SCALES + ib / 2] >> (4 * (ib % 2))) as u32 & 0xF; 2]
    }

    pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
        let d = f16_at(b, D);
        let db = |s: u32| d * (1 + 2 * s) as f32;
        dequantize_signed(y, |ib| scales(b, ib), db, |ib, l| group(b, ib, l));
    }
}

/// The offset IQ1_S and IQ1_M add to every grid value, by the sign bit of
/// its group (ggml's `IQ1S_DELTA` / `IQ1M_DELTA`).
pub const IQ1_DELTA: f32 = 0.125;

/// Eight values `dl * (grid[j] + delta)` (ggml's order) into `y`.
#[inline(always)]
fn shifted_row(dl: f32, row: u64, delta: f32, y: &mut [f32]) {
    for (j, v) in y[..8].iter_mut().enumerate() {
        *v = dl * (grid_value(row, j) as i8 as f32 + delta);
    }
}

/// `{ f16 d; u8 qs[32]; u16 qh[8] }`: 11-bit indices into the signed
/// {-1, 0, 1} grid (`qs` and three bits each from `qh`); per 32 values a
/// 3-bit scale `s` and the sign of the offset in `qh`'s top bits;
/// x = d (2 s + 1) (grid ± 1/8).
pub mod iq1_s {
    use super::*;
    pub const BYTES: usize = 50;
    pub const D: usize = 0;
    pub const QS: usize = 2;
    pub const QH: usize = 34;

    /// `qh` of 32-block `ib`.
    #[inline]
    pub fn qh(b: &[u8], ib: usize) -> u16 {
        u16_at(b, QH + 2 * ib)
    }

    /// The grid row of group `l` (0..4) of 32-block `ib`.
    #[inline]
    pub fn row(b: &[u8], ib: usize, l: usize) -> u64 {
        let hi = ((qh(b, ib) >> (3 * l)) & 7) as usize;
        IQ1S_GRID[b[QS + 4 * ib + l] as usize | hi << 8]
    }

    pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
        let d = f16_at(b, D);
        for ib in 0..8 {
            let qh = qh(b, ib);
            let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
            let delta = if qh & 0x8000 != 0 {
                -IQ1_DELTA
            } else {
                IQ1_DELTA
            };
            for l in 0..4 {
                shifted_row(dl, row(b, ib, l), delta, &mut y[32 * ib + 8 * l..]);
            }
        }
    }
}

/// `{ u8 qs[32]; u8 qh[16]; u16 scales[4] }`: indices as IQ1_S's (three
/// high bits per group from a `qh` nibble, whose fourth bit is the sign of
/// that group's offset); 3-bit scales per 16 values, and the f16 super-block
/// scale spread over the top nibbles of the four `scales` words;
/// x = d (2 s + 1) (grid ± 1/8).
pub mod iq1_m {
    use super::*;
    pub const BYTES: usize = 56;
    pub const QS: usize = 0;
    pub const QH: usize = 32;
    pub const SCALES: usize = 48;

    #[inline]
    fn word(b: &[u8], k: usize) -> u16 {
        u16_at(b, SCALES + 2 * k)
    }

    /// The super-block scale, assembled from the four top nibbles.
    #[inline]
    pub fn d(b: &[u8]) -> f32 {
        let bits = (word(b, 0) >> 12)
            | ((word(b, 1) >> 8) & 0x00F0)
            | ((word(b, 2) >> 4) & 0x0F00)
            | (word(b, 3) & 0xF000);
        half::f16::from_bits(bits).to_f32()
    }

    /// The 3-bit scale of 16-value half `h` (0, 1) of 32-block `ib`.
    #[inline]
    pub fn scale(b: &[u8], ib: usize, h: usize) -> u16 {
        (word(b, ib / 2) >> (6 * (ib % 2) + 3 * h)) & 7
    }

    /// Group `l` (0..4) of 32-block `ib`: its grid row and whether its
    /// offset is negative.
    #[inline]
    pub fn group(b: &[u8], ib: usize, l: usize) -> (u64, bool) {
        let nib = (b[QH + 2 * ib + l / 2] >> (4 * (l % 2))) & 0xF;
        let idx = b[QS + 4 * ib + l] as usize | ((nib & 7) as usize) << 8;
        (IQ1S_GRID[idx], nib & 8 != 0)
    }

    pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
        let d = self::d(b);
        for ib in 0..8 {
            for l in 0..4 {
                let dl = d * (2 * scale(b, ib, l / 2) + 1) as f32;
                let (row, negative) = group(b, ib, l);
                let delta = if negative { -IQ1_DELTA } else { IQ1_DELTA };
                shifted_row(dl, row, delta, &mut y[32 * ib + 8 * l..]);
            }
        }
    }
}

/// Writes the super-block scale `d` (rounded to f16) into one block of a
/// lattice type `ty`, leaving the rest: with random bytes elsewhere that
/// makes a valid block, which is how tests build these read-only formats.
/// Returns false (and writes nothing) for a type that is not one of them.
pub fn set_scale(ty: crate::GgmlType, b: &mut [u8], d: f32) -> bool {
    use crate::GgmlType as T;
    let bits = half::f16::from_f32(d).to_bits();
    match ty {
        T::IQ2_XXS | T::IQ2_XS | T::IQ2_S | T::IQ3_XXS | T::IQ3_S | T::IQ1_S => {
            b[..2].copy_from_slice(&bits.to_le_bytes());
        }
        T::IQ1_M => {
            // Nibble k of the f16 is the top nibble of scales word k.
            for k in 0..4 {
                let at = iq1_m::SCALES + 2 * k + 1;
                b[at] = (b[at] & 0x0F) | (((bits >> (4 * k)) as u8 & 0xF) << 4);
            }
        }
        _ => return false,
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GgmlType as T;

    #[test]
    fn set_scale_sets_what_the_dequantizer_reads() {
        assert_eq!(iq1_m::BYTES, T::IQ1_M.block_bytes());
        let mut b = vec![0xA5u8; iq1_m::BYTES];
        assert!(set_scale(T::IQ1_M, &mut b, -0.375));
        assert_eq!(iq1_m::d(&b), -0.375);
        // The 3-bit scales below the nibbles are untouched.
        assert_eq!(iq1_m::scale(&b, 0, 0), 0xA5 & 7);
        let mut b = vec![0u8; iq2_xs::BYTES];
        assert!(set_scale(T::IQ2_XS, &mut b, 0.5));
        assert_eq!(f16_at(&b, iq2_xs::D), 0.5);
        assert!(!set_scale(T::Q4_K, &mut b, 0.5));
    }
}
