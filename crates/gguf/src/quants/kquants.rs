//! The 256-element "k-quant" super-block formats: Q2_K … Q6_K and Q8_K.
//!
//! Slices passed to the block functions must be exactly one block long
//! (`BYTES` bytes and 256 floats); [`super::dequantize`] guarantees that.

use super::{f16_at, put_f16, round_f16, signed_absmax};

/// Elements per super-block.
pub const QK_K: usize = 256;
/// Bytes of packed 6-bit scales/mins in Q4_K and Q5_K.
pub const K_SCALE_SIZE: usize = 12;

/// Unpacks the 6-bit (scale, min) pair `j` (0..8) of Q4_K / Q5_K.
///
/// Bytes 0..4 hold scales 0..4 (low 6 bits), bytes 4..8 mins 0..4; bytes
/// 8..12 hold the low nibbles of scales 4..8 and mins 4..8 (high nibble),
/// whose top two bits live in the spare bits 6..7 of bytes 0..8.
#[inline]
pub fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Packs 8 six-bit scales and mins into the 12-byte Q4_K/Q5_K layout.
pub fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8], q: &mut [u8]) {
    q[..K_SCALE_SIZE].fill(0);
    for j in 0..8 {
        let (s, m) = (ls[j] & 63, lm[j] & 63);
        if j < 4 {
            q[j] |= s;
            q[j + 4] |= m;
        } else {
            q[j + 4] = (s & 0xF) | ((m & 0xF) << 4);
            q[j - 4] |= (s >> 4) << 6;
            q[j] |= (m >> 4) << 6;
        }
    }
}

/// Round-to-nearest affine quantization of one super-block, shared by the
/// Q2_K / Q4_K / Q5_K quantizers: each `sub`-element sub-block gets
/// x ≈ d·ls·q − dmin·lm with q in 0..=nmax and ls, lm in 0..=smax.
///
/// Sub-block scale = (max − min(min, 0)) / nmax and min = −min(min, 0); both
/// are rounded against the super-block maxima, and the values are then
/// re-rounded with the scales actually stored (d, dmin rounded to f16, which
/// is what this returns). Simpler than ggml's iterative search, so slightly
/// less accurate, but produces valid blocks.
pub fn affine_rtn(
    x: &[f32],
    sub: usize,
    nmax: f32,
    smax: f32,
    levels: &mut [u8],
    ls: &mut [u8],
    lm: &mut [u8],
) -> (f32, f32) {
    let n_sub = x.len() / sub;
    let mut scales = [0f32; 16];
    let mut mins = [0f32; 16];
    for j in 0..n_sub {
        let blk = &x[sub * j..sub * j + sub];
        let mn = blk.iter().fold(0f32, |a, &v| a.min(v));
        let mx = blk.iter().fold(mn, |a, &v| a.max(v));
        scales[j] = (mx - mn) / nmax;
        mins[j] = -mn;
    }
    let max_scale = scales.iter().fold(0f32, |a, &v| a.max(v));
    let max_min = mins.iter().fold(0f32, |a, &v| a.max(v));
    let inv_s = if max_scale > 0.0 {
        smax / max_scale
    } else {
        0.0
    };
    let inv_m = if max_min > 0.0 { smax / max_min } else { 0.0 };
    let d = round_f16(max_scale / smax);
    let dmin = round_f16(max_min / smax);
    for j in 0..n_sub {
        ls[j] = (inv_s * scales[j]).round_ties_even().clamp(0.0, smax) as u8;
        lm[j] = (inv_m * mins[j]).round_ties_even().clamp(0.0, smax) as u8;
        let dl = d * ls[j] as f32;
        let ml = dmin * lm[j] as f32;
        for i in sub * j..sub * j + sub {
            levels[i] = if dl > 0.0 {
                ((x[i] + ml) / dl).round_ties_even().clamp(0.0, nmax) as u8
            } else {
                0
            };
        }
    }
    (d, dmin)
}

/// `{ u8 scales[16]; u8 qs[64]; f16 d; f16 dmin }`: 16 sub-blocks of 16,
/// x = d * (sc & 15) * q - dmin * (sc >> 4), q 2-bit.
pub mod q2_k {
    use super::*;
    pub const BYTES: usize = 84;
    pub const SCALES: usize = 0;
    pub const QS: usize = 16;
    pub const D: usize = 80;
    pub const DMIN: usize = 82;

    pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
        let d = f16_at(b, D);
        let min = f16_at(b, DMIN);
        let sc = &b[SCALES..SCALES + 16];
        let mut is = 0;
        let mut yi = 0;
        for n in 0..2 {
            let q = &b[QS + 32 * n..QS + 32 * n + 32];
            for shift in [0, 2, 4, 6] {
                for half in 0..2 {
                    let s = sc[is];
                    is += 1;
                    let dl = d * (s & 0xF) as f32;
                    let ml = min * (s >> 4) as f32;
                    for l in 0..16 {
                        y[yi] = dl * ((q[16 * half + l] >> shift) & 3) as f32 - ml;
                        yi += 1;
                    }
                }
            }
        }
    }

    /// Round-to-nearest quantizer (see [`affine_rtn`]).
    pub fn quantize_block(x: &[f32], b: &mut [u8]) {
        let mut l = [0u8; QK_K];
        let (mut ls, mut lm) = ([0u8; 16], [0u8; 16]);
        let (d, dmin) = affine_rtn(x, 16, 3.0, 15.0, &mut l, &mut ls, &mut lm);
        put_f16(b, D, d);
        put_f16(b, DMIN, dmin);
        for i in 0..16 {
            b[SCALES + i] = ls[i] | (lm[i] << 4);
        }
        b[QS..QS + 64].fill(0);
        for n in 0..2 {
            for j in 0..4 {
                for i in 0..32 {
                    b[QS + 32 * n + i] |= l[128 * n + 32 * j + i] << (2 * j);
                }
            }
        }
    }
}

/// `{ u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d }`: 16 sub-blocks of 16
/// with signed 6-bit scales (stored +32), q 3-bit = 2 low bits + hmask bit
/// (a *clear* hmask bit subtracts 4).
pub mod q3_k {
    use super::*;
    pub const BYTES: usize = 110;
    pub const HMASK: usize = 0;
    pub const QS: usize = 32;
    pub const SCALES: usize = 96;
    pub const D: usize = 108;

    /// The 16 signed scales (already minus 32).
    pub fn unpack_scales(s: &[u8]) -> [i8; 16] {
        let mut out = [0i8; 16];
        for (i, o) in out.iter_mut().enumerate() {
            let low = if i < 8 { s[i] & 0xF } else { s[i - 8] >> 4 };
            let high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
            *o = ((low | (high << 4)) as i8).wrapping_sub(32);
        }
        out
    }

    pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
        let d_all = f16_at(b, D);
        let scales = unpack_scales(&b[SCALES..SCALES + 12]);
        let hm = &b[HMASK..HMASK + 32];
        let mut is = 0;
        let mut yi = 0;
        let mut m = 1u8;
        for n in 0..2 {
            let q = &b[QS + 32 * n..QS + 32 * n + 32];
            for shift in [0, 2, 4, 6] {
                for half in 0..2 {
                    let dl = d_all * scales[is] as f32;
                    is += 1;
                    for l in 0..16 {
                        let i = 16 * half + l;
                        let lo = ((q[i] >> shift) & 3) as i8;
                        let v = lo - if hm[i] & m != 0 { 0 } else { 4 };
                        y[yi] = dl * v as f32;
                        yi += 1;
                    }
                }
                m <<= 1;
            }
        }
    }

    /// Inverse of [`unpack_scales`] (values in -32..=31).
    pub fn pack_scales(sc: &[i8; 16], s: &mut [u8]) {
        s[..12].fill(0);
        for (i, &v) in sc.iter().enumerate() {
            let u = (v as i32 + 32).clamp(0, 63) as u8;
            if i < 8 {
                s[i] |= u & 0xF;
            } else {
                s[i - 8] |= (u & 0xF) << 4;
            }
            s[8 + i % 4] |= (u >> 4) << (2 * (i / 4));
        }
    }

    /// Round-to-nearest quantizer: the largest magnitude of each 16-element
    /// sub-block maps to -4, the largest sub-block scale to -32.
    pub fn quantize_block(x: &[f32], b: &mut [u8]) {
        let mut scales = [0f32; 16];
        for (i, s) in scales.iter_mut().enumerate() {
            *s = signed_absmax(&x[16 * i..16 * i + 16]) / -4.0;
        }
        let max_scale = signed_absmax(&scales);
        let iscale = if max_scale != 0.0 {
            -32.0 / max_scale
        } else {
            0.0
        };
        let d = round_f16(if iscale != 0.0 { 1.0 / iscale } else { 0.0 });
        put_f16(b, D, d);
        let mut sc = [0i8; 16];
        let mut l = [0u8; QK_K];
        for i in 0..16 {
            sc[i] = (iscale * scales[i]).round_ties_even().clamp(-32.0, 31.0) as i8;
            let dl = d * sc[i] as f32;
            for k in 16 * i..16 * i + 16 {
                let q = if dl != 0.0 {
                    (x[k] / dl).round_ties_even().clamp(-4.0, 3.0) as i8
                } else {
                    0
                };
                l[k] = (q + 4) as u8;
            }
        }
        pack_scales(&sc, &mut b[SCALES..SCALES + 12]);
        b[HMASK..HMASK + 32].fill(0);
        b[QS..QS + 64].fill(0);
        for n in 0..2 {
            for j in 0..4 {
                for i in 0..32 {
                    let v = l[128 * n + 32 * j + i];
                    b[QS + 32 * n + i] |= (v & 3) << (2 * j);
                    if v & 4 != 0 {
                        b[HMASK + i] |= 1 << (4 * n + j);
                    }
                }
            }
        }
    }
}

/// `{ f16 d; f16 dmin; u8 scales[12]; u8 qs[128] }`: 8 sub-blocks of 32,
/// x = d * sc * q - dmin * m with 6-bit sc/m ([`scale_min_k4`]), q 4-bit.
/// Each 32 bytes of `qs` hold sub-block 2k in low and 2k+1 in high nibbles.
pub mod q4_k {
    use super::*;
    pub const BYTES: usize = 144;
    pub const D: usize = 0;
    pub const DMIN: usize = 2;
    pub const SCALES: usize = 4;
    pub const QS: usize = 16;

    pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
        let d = f16_at(b, D);
        let min = f16_at(b, DMIN);
        let scales = &b[SCALES..SCALES + K_SCALE_SIZE];
        for j in 0..4 {
            let (sc, m) = scale_min_k4(2 * j, scales);
            let (d1, m1) = (d * sc as f32, min * m as f32);
            let (sc, m) = scale_min_k4(2 * j + 1, scales);
            let (d2, m2) = (d * sc as f32, min * m as f32);
            let q = &b[QS + 32 * j..QS + 32 * j + 32];
            let out = &mut y[64 * j..64 * j + 64];
            for l in 0..32 {
                out[l] = d1 * (q[l] & 0xF) as f32 - m1;
                out[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }

    /// Round-to-nearest quantizer (see [`affine_rtn`]).
    pub fn quantize_block(x: &[f32], b: &mut [u8]) {
        let mut l = [0u8; QK_K];
        let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
        let (d, dmin) = affine_rtn(x, 32, 15.0, 63.0, &mut l, &mut ls, &mut lm);
        put_f16(b, D, d);
        put_f16(b, DMIN, dmin);
        pack_scale_min_k4(&ls, &lm, &mut b[SCALES..SCALES + K_SCALE_SIZE]);
        for j in 0..4 {
            for i in 0..32 {
                b[QS + 32 * j + i] = l[64 * j + i] | (l[64 * j + 32 + i] << 4);
            }
        }
    }
}

/// `{ f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128] }`: like Q4_K
/// with a fifth bit per value: bit `2k` / `2k+1` of `qh[l]` is bit 4 of
/// element `l` of sub-block `2k` / `2k+1`.
pub mod q5_k {
    use super::*;
    pub const BYTES: usize = 176;
    pub const D: usize = 0;
    pub const DMIN: usize = 2;
    pub const SCALES: usize = 4;
    pub const QH: usize = 16;
    pub const QS: usize = 48;

    pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
        let d = f16_at(b, D);
        let min = f16_at(b, DMIN);
        let scales = &b[SCALES..SCALES + K_SCALE_SIZE];
        let qh = &b[QH..QH + 32];
        let mut u1 = 1u8;
        let mut u2 = 2u8;
        for j in 0..4 {
            let (sc, m) = scale_min_k4(2 * j, scales);
            let (d1, m1) = (d * sc as f32, min * m as f32);
            let (sc, m) = scale_min_k4(2 * j + 1, scales);
            let (d2, m2) = (d * sc as f32, min * m as f32);
            let ql = &b[QS + 32 * j..QS + 32 * j + 32];
            let out = &mut y[64 * j..64 * j + 64];
            for l in 0..32 {
                let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
                out[l] = d1 * ((ql[l] & 0xF) + h1) as f32 - m1;
                out[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
            }
            u1 <<= 2;
            u2 <<= 2;
        }
    }

    /// Round-to-nearest quantizer (see [`affine_rtn`]).
    pub fn quantize_block(x: &[f32], b: &mut [u8]) {
        let mut l = [0u8; QK_K];
        let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
        let (d, dmin) = affine_rtn(x, 32, 31.0, 63.0, &mut l, &mut ls, &mut lm);
        put_f16(b, D, d);
        put_f16(b, DMIN, dmin);
        pack_scale_min_k4(&ls, &lm, &mut b[SCALES..SCALES + K_SCALE_SIZE]);
        b[QH..QH + 32].fill(0);
        for j in 0..4 {
            for i in 0..32 {
                let (lo, hi) = (l[64 * j + i], l[64 * j + 32 + i]);
                b[QS + 32 * j + i] = (lo & 0xF) | ((hi & 0xF) << 4);
                b[QH + i] |= ((lo >> 4) << (2 * j)) | ((hi >> 4) << (2 * j + 1));
            }
        }
    }
}

/// `{ u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }`: 16 sub-blocks of 16,
/// x = d * sc * (q - 32), q 6-bit = 4 bits from `ql` + 2 bits from `qh`.
pub mod q6_k {
    use super::*;
    pub const BYTES: usize = 210;
    pub const QL: usize = 0;
    pub const QH: usize = 128;
    pub const SCALES: usize = 192;
    pub const D: usize = 208;

    pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
        let d = f16_at(b, D);
        for n in 0..2 {
            let ql = &b[QL + 64 * n..QL + 64 * n + 64];
            let qh = &b[QH + 32 * n..QH + 32 * n + 32];
            let sc = &b[SCALES + 8 * n..SCALES + 8 * n + 8];
            let out = &mut y[128 * n..128 * n + 128];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
                let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
                out[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                out[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                out[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                out[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
            }
        }
    }

    /// Round-to-nearest quantizer (ggml-style signed scales: the largest
    /// magnitude of each sub-block maps to -32, the largest scale to -128).
    pub fn quantize_block(x: &[f32], b: &mut [u8]) {
        let mut scales = [0f32; 16];
        for (i, s) in scales.iter_mut().enumerate() {
            *s = signed_absmax(&x[16 * i..16 * i + 16]) / -32.0;
        }
        let max_scale = signed_absmax(&scales);
        let iscale = if max_scale != 0.0 {
            -128.0 / max_scale
        } else {
            0.0
        };
        let d = if iscale != 0.0 { 1.0 / iscale } else { 0.0 };
        put_f16(b, D, d);
        let d = f16_at(b, D);
        let mut l = [0u8; QK_K];
        for i in 0..16 {
            let sc = (iscale * scales[i]).round_ties_even().clamp(-128.0, 127.0) as i8;
            b[SCALES + i] = sc as u8;
            let dl = d * sc as f32;
            for k in 16 * i..16 * i + 16 {
                let q = if dl != 0.0 {
                    (x[k] / dl).round_ties_even().clamp(-32.0, 31.0) as i8
                } else {
                    0
                };
                l[k] = (q + 32) as u8;
            }
        }
        for n in 0..2 {
            let lb = &l[128 * n..128 * n + 128];
            for i in 0..32 {
                b[QL + 64 * n + i] = (lb[i] & 0xF) | ((lb[i + 64] & 0xF) << 4);
                b[QL + 64 * n + i + 32] = (lb[i + 32] & 0xF) | ((lb[i + 96] & 0xF) << 4);
                b[QH + 32 * n + i] = (lb[i] >> 4)
                    | ((lb[i + 32] >> 4) << 2)
                    | ((lb[i + 64] >> 4) << 4)
                    | ((lb[i + 96] >> 4) << 6);
            }
        }
    }
}

/// `{ f32 d; i8 qs[256]; i16 bsums[16] }`: x = d * q; `bsums[i]` is the sum
/// of `qs[16i..16i+16]` (for k-quant dot products). Activations only.
pub mod q8_k {
    use super::*;
    pub const BYTES: usize = 292;
    pub const D: usize = 0;
    pub const QS: usize = 4;
    pub const BSUMS: usize = 260;

    pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
        let d = f32::from_le_bytes([b[D], b[D + 1], b[D + 2], b[D + 3]]);
        for (j, o) in y.iter_mut().enumerate().take(QK_K) {
            *o = d * (b[QS + j] as i8) as f32;
        }
    }

    /// ggml `quantize_row_q8_K_ref` (nearest-even rounding, scale -127/max).
    pub fn quantize_block(x: &[f32], b: &mut [u8]) {
        let max = signed_absmax(x);
        if max == 0.0 {
            b[..BYTES].fill(0);
            return;
        }
        let iscale = -127.0 / max;
        for j in 0..QK_K {
            let v = (iscale * x[j]).round_ties_even().clamp(-128.0, 127.0) as i8;
            b[QS + j] = v as u8;
        }
        for j in 0..16 {
            let sum: i16 = (0..16).map(|i| b[QS + 16 * j + i] as i8 as i16).sum();
            b[BSUMS + 2 * j..BSUMS + 2 * j + 2].copy_from_slice(&sum.to_le_bytes());
        }
        b[D..D + 4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}
