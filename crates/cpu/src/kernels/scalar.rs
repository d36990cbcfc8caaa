//! Portable scalar kernels: the reference every SIMD path is tested against,
//! and the fallback on targets without one (wasm32, or rare types).
//!
//! Each kernel dots one weight row (`nb` blocks in the ggml layout) with
//! `x.len()` quantized activation rows, so the block bytes are decoded once.

use super::Act;

#[inline(always)]
pub(crate) unsafe fn f16_at(p: *const u8) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([*p, *p.add(1)])).to_f32()
}

#[inline(always)]
unsafe fn u32_at(p: *const u8) -> u32 {
    u32::from_le_bytes([*p, *p.add(1), *p.add(2), *p.add(3)])
}

/// 6-bit scale and min number `j` of a Q4_K/Q5_K super-block (12 packed
/// bytes): the format's own decoder.
pub(crate) use blockdraft_gguf::quants::kquants::scale_min_k4;

/// The 16 signed 6-bit scales of a Q3_K super-block, already minus 32.
#[inline(always)]
pub(crate) fn q3k_scales(s: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let lo = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
        let hi = (s[8 + (j % 4)] >> (2 * (j / 4))) & 3;
        *o = ((lo | (hi << 4)) as i8) - 32;
    }
    out
}

/// The integer dot of a 32-block's 16 nibble bytes (value j in the low
/// nibble of byte j, value 16 + j in its high nibble) with 32 activation
/// quants, each nibble mapped by `value` (exact in i32, in any order).
#[inline(always)]
pub(crate) fn nibble_dot(qs: &[u8], xq: &[i8], value: impl Fn(u8) -> i32) -> i32 {
    let mut s = 0i32;
    for j in 0..16 {
        s += value(qs[j] & 0xF) * xq[j] as i32;
        s += value(qs[j] >> 4) * xq[j + 16] as i32;
    }
    s
}

/// An IQ4_NL / IQ4_XS nibble's grid value.
#[inline(always)]
pub(crate) fn iq4_value(nibble: u8) -> i32 {
    KVALUES[nibble as usize] as i32
}

// Every kernel below has the `Kernel` signature; `x[i]` gives activation row
// i, `out[i]` receives its dot with the weight row.

pub(crate) unsafe fn q4_0(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
    out.fill(0.0);
    for b in 0..nb {
        let blk = w.add(b * 18);
        let d = f16_at(blk);
        let qs = std::slice::from_raw_parts(blk.add(2), 16);
        for (xi, o) in x.iter().zip(out.iter_mut()) {
            let xq = std::slice::from_raw_parts(xi.qs.add(b * 32), 32);
            let s = nibble_dot(qs, xq, |n| n as i32 - 8);
            *o += d * *xi.d.add(b) * s as f32;
        }
    }
}

pub(crate) unsafe fn q4_1(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
    out.fill(0.0);
    for b in 0..nb {
        let blk = w.add(b * 20);
        let d = f16_at(blk);
        let m = f16_at(blk.add(2));
        let qs = std::slice::from_raw_parts(blk.add(4), 16);
        for (xi, o) in x.iter().zip(out.iter_mut()) {
            let xq = std::slice::from_raw_parts(xi.qs.add(b * 32), 32);
            let s = nibble_dot(qs, xq, |n| n as i32);
            *o += d * *xi.d.add(b) * s as f32 + m * *xi.s.add(b);
        }
    }
}

pub(crate) unsafe fn q5_0(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
    out.fill(0.0);
    for b in 0..nb {
        let blk = w.add(b * 22);
        let d = f16_at(blk);
        let qh = u32_at(blk.add(2));
        let qs = std::slice::from_raw_parts(blk.add(6), 16);
        for (xi, o) in x.iter().zip(out.iter_mut()) {
            let xq = std::slice::from_raw_parts(xi.qs.add(b * 32), 32);
            let mut s = 0i32;
            for j in 0..16 {
                let lo = (qs[j] & 0xF) as i32 | (((qh >> j) & 1) << 4) as i32;
                let hi = (qs[j] >> 4) as i32 | (((qh >> (j + 16)) & 1) << 4) as i32;
                s += (lo - 16) * xq[j] as i32 + (hi - 16) * xq[j + 16] as i32;
            }
            *o += d * *xi.d.add(b) * s as f32;
        }
    }
}

pub(crate) unsafe fn q5_1(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
    out.fill(0.0);
    for b in 0..nb {
        let blk = w.add(b * 24);
        let d = f16_at(blk);
        let m = f16_at(blk.add(2));
        let qh = u32_at(blk.add(4));
        let qs = std::slice::from_raw_parts(blk.add(8), 16);
        for (xi, o) in x.iter().zip(out.iter_mut()) {
            let xq = std::slice::from_raw_parts(xi.qs.add(b * 32), 32);
            let mut s = 0i32;
            for j in 0..16 {
                let lo = (qs[j] & 0xF) as i32 | (((qh >> j) & 1) << 4) as i32;
                let hi = (qs[j] >> 4) as i32 | (((qh >> (j + 16)) & 1) << 4) as i32;
                s += lo * xq[j] as i32 + hi * xq[j + 16] as i32;
            }
            *o += d * *xi.d.add(b) * s as f32 + m * *xi.s.add(b);
        }
    }
}

/// Q8_0 (34-byte blocks) and Q8_1 (36-byte blocks; the stored sum is unused).
unsafe fn q8_generic(w: *const u8, nb: usize, bytes: usize, x: &[Act], out: &mut [f32]) {
    out.fill(0.0);
    for b in 0..nb {
        let blk = w.add(b * bytes);
        let d = f16_at(blk);
        let qs = std::slice::from_raw_parts(blk.add(bytes - 32) as *const i8, 32);
        for (xi, o) in x.iter().zip(out.iter_mut()) {
            let xq = std::slice::from_raw_parts(xi.qs.add(b * 32), 32);
            let s: i32 = qs.iter().zip(xq).map(|(&a, &b)| a as i32 * b as i32).sum();
            *o += d * *xi.d.add(b) * s as f32;
        }
    }
}

pub(crate) unsafe fn q8_0(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
    q8_generic(w, nb, 34, x, out)
}

pub(crate) unsafe fn q8_1(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
    q8_generic(w, nb, 36, x, out)
}

pub(crate) unsafe fn q2_k(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
    out.fill(0.0);
    for b in 0..nb {
        let blk = w.add(b * 84);
        let scales = std::slice::from_raw_parts(blk, 16);
        let qs = std::slice::from_raw_parts(blk.add(16), 64);
        let d = f16_at(blk.add(80));
        let dmin = f16_at(blk.add(82));
        for (xi, o) in x.iter().zip(out.iter_mut()) {
            let xq = std::slice::from_raw_parts(xi.qs.add(b * 256), 256);
            let bs = std::slice::from_raw_parts(xi.bs.add(b * 16), 16);
            let mut isum = 0i32;
            let mut msum = 0i32;
            for is in 0..16 {
                // Sub-block `is` holds 16 values: half h, shift pair j, 16-lane part p.
                let (h, j, p) = (is / 8, (is % 8) / 2, is % 2);
                let mut s = 0i32;
                for l in 0..16 {
                    let q = (qs[32 * h + 16 * p + l] >> (2 * j)) & 3;
                    s += q as i32 * xq[16 * is + l] as i32;
                }
                isum += (scales[is] & 0xF) as i32 * s;
                msum += (scales[is] >> 4) as i32 * bs[is] as i32;
            }
            *o += *xi.d.add(b) * (d * isum as f32 - dmin * msum as f32);
        }
    }
}

pub(crate) unsafe fn q3_k(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
    out.fill(0.0);
    for b in 0..nb {
        let blk = w.add(b * 110);
        let hmask = std::slice::from_raw_parts(blk, 32);
        let qs = std::slice::from_raw_parts(blk.add(32), 64);
        let sc = q3k_scales(std::slice::from_raw_parts(blk.add(96), 12));
        let d = f16_at(blk.add(108));
        for (xi, o) in x.iter().zip(out.iter_mut()) {
            let xq = std::slice::from_raw_parts(xi.qs.add(b * 256), 256);
            let mut isum = 0i32;
            for is in 0..16 {
                let (h, j, p) = (is / 8, (is % 8) / 2, is % 2);
                let m = 1u8 << (4 * h + j);
                let mut s = 0i32;
                for l in 0..16 {
                    let k = 16 * p + l;
                    let q = ((qs[32 * h + k] >> (2 * j)) & 3) as i32
                        - if hmask[k] & m != 0 { 0 } else { 4 };
                    s += q * xq[16 * is + l] as i32;
                }
                isum += sc[is] as i32 * s;
            }
            *o += *xi.d.add(b) * d * isum as f32;
        }
    }
}

pub(crate) unsafe fn q4_k(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
    out.fill(0.0);
    for b in 0..nb {
        let blk = w.add(b * 144);
        let d = f16_at(blk);
        let dmin = f16_at(blk.add(2));
        let scales = std::slice::from_raw_parts(blk.add(4), 12);
        let qs = std::slice::from_raw_parts(blk.add(16), 128);
        for (xi, o) in x.iter().zip(out.iter_mut()) {
            let xq = std::slice::from_raw_parts(xi.qs.add(b * 256), 256);
            let bs = std::slice::from_raw_parts(xi.bs.add(b * 16), 16);
            let mut isum = 0i32;
            let mut msum = 0i32;
            for j in 0..8 {
                let (sc, m) = scale_min_k4(j, scales);
                let q = &qs[32 * (j / 2)..32 * (j / 2) + 32];
                let shift = 4 * (j % 2);
                let mut s = 0i32;
                for l in 0..32 {
                    s += ((q[l] >> shift) & 0xF) as i32 * xq[32 * j + l] as i32;
                }
                isum += sc as i32 * s;
                msum += m as i32 * (bs[2 * j] as i32 + bs[2 * j + 1] as i32);
            }
            *o += *xi.d.add(b) * (d * isum as f32 - dmin * msum as f32);
        }
    }
}

pub(crate) unsafe fn q5_k(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
    out.fill(0.0);
    for b in 0..nb {
        let blk = w.add(b * 176);
        let d = f16_at(blk);
        let dmin = f16_at(blk.add(2));
        let scales = std::slice::from_raw_parts(blk.add(4), 12);
        let qh = std::slice::from_raw_parts(blk.add(16), 32);
        let qs = std::slice::from_raw_parts(blk.add(48), 128);
        for (xi, o) in x.iter().zip(out.iter_mut()) {
            let xq = std::slice::from_raw_parts(xi.qs.add(b * 256), 256);
            let bs = std::slice::from_raw_parts(xi.bs.add(b * 16), 16);
            let mut isum = 0i32;
            let mut msum = 0i32;
            for j in 0..8 {
                let (sc, m) = scale_min_k4(j, scales);
                let q = &qs[32 * (j / 2)..32 * (j / 2) + 32];
                let shift = 4 * (j % 2);
                let mut s = 0i32;
                for l in 0..32 {
                    let v = ((q[l] >> shift) & 0xF) as i32 | ((((qh[l] >> j) & 1) as i32) << 4);
                    s += v * xq[32 * j + l] as i32;
                }
                isum += sc as i32 * s;
                msum += m as i32 * (bs[2 * j] as i32 + bs[2 * j + 1] as i32);
            }
            *o += *xi.d.add(b) * (d * isum as f32 - dmin * msum as f32);
        }
    }
}

pub(crate) unsafe fn q6_k(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
    out.fill(0.0);
    for b in 0..nb {
        let blk = w.add(b * 210);
        let ql = std::slice::from_raw_parts(blk, 128);
        let qh = std::slice::from_raw_parts(blk.add(128), 64);
        let sc = std::slice::from_raw_parts(blk.add(192) as *const i8, 16);
        let d = f16_at(blk.add(208));
        for (xi, o) in x.iter().zip(out.iter_mut()) {
            let xq = std::slice::from_raw_parts(xi.qs.add(b * 256), 256);
            let mut isum = 0i32;
            for h in 0..2 {
                let (ql, qh, xq) = (&ql[64 * h..], &qh[32 * h..], &xq[128 * h..]);
                let sc = &sc[8 * h..];
                for l in 0..32 {
                    let is = l / 16;
                    let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                    let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                    let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                    let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                    isum += sc[is] as i32 * q1 * xq[l] as i32
                        + sc[is + 2] as i32 * q2 * xq[l + 32] as i32
                        + sc[is + 4] as i32 * q3 * xq[l + 64] as i32
                        + sc[is + 6] as i32 * q4 * xq[l + 96] as i32;
                }
            }
            *o += *xi.d.add(b) * d * isum as f32;
        }
    }
}

pub(crate) unsafe fn q8_k(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
    out.fill(0.0);
    for b in 0..nb {
        let blk = w.add(b * 292);
        let d = f32::from_le_bytes([*blk, *blk.add(1), *blk.add(2), *blk.add(3)]);
        let qs = std::slice::from_raw_parts(blk.add(4) as *const i8, 256);
        for (xi, o) in x.iter().zip(out.iter_mut()) {
            let xq = std::slice::from_raw_parts(xi.qs.add(b * 256), 256);
            let s: i32 = qs.iter().zip(xq).map(|(&a, &b)| a as i32 * b as i32).sum();
            *o += d * *xi.d.add(b) * s as f32;
        }
    }
}

/// The grid IQ4_NL and IQ4_XS indices pick from.
use blockdraft_gguf::quants::iquants::KVALUES;

pub(crate) unsafe fn iq4_nl(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
    out.fill(0.0);
    for b in 0..nb {
        let blk = w.add(b * 18);
        let d = f16_at(blk);
        let qs = std::slice::from_raw_parts(blk.add(2), 16);
        for (xi, o) in x.iter().zip(out.iter_mut()) {
            let xq = std::slice::from_raw_parts(xi.qs.add(b * 32), 32);
            *o += d * *xi.d.add(b) * nibble_dot(qs, xq, iq4_value) as f32;
        }
    }
}

pub(crate) unsafe fn iq4_xs(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
    use blockdraft_gguf::quants::iquants::iq4_xs;
    out.fill(0.0);
    for b in 0..nb {
        let blk = std::slice::from_raw_parts(w.add(b * iq4_xs::BYTES), iq4_xs::BYTES);
        let d = f16_at(blk.as_ptr());
        for (xi, o) in x.iter().zip(out.iter_mut()) {
            let xq = std::slice::from_raw_parts(xi.qs.add(b * 256), 256);
            let mut isum = 0i32;
            for ib in 0..8 {
                let qs = &blk[iq4_xs::QS + 16 * ib..][..16];
                let s = nibble_dot(qs, &xq[32 * ib..][..32], iq4_value);
                isum += iq4_xs::scale(blk, ib) * s;
            }
            *o += d * *xi.d.add(b) * isum as f32;
        }
    }
}

// Float weights dot f32 activations (`nb` = number of elements).

pub(crate) unsafe fn f32w(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
    for (xi, o) in x.iter().zip(out.iter_mut()) {
        let xf = std::slice::from_raw_parts(xi.f, nb);
        let mut s = 0f32;
        for (k, &xv) in xf.iter().enumerate() {
            let p = w.add(4 * k);
            s += f32::from_le_bytes([*p, *p.add(1), *p.add(2), *p.add(3)]) * xv;
        }
        *o = s;
    }
}

pub(crate) unsafe fn f16w(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
    for (xi, o) in x.iter().zip(out.iter_mut()) {
        let xf = std::slice::from_raw_parts(xi.f, nb);
        let mut s = 0f32;
        for (k, &xv) in xf.iter().enumerate() {
            s += f16_at(w.add(2 * k)) * xv;
        }
        *o = s;
    }
}

pub(crate) unsafe fn bf16w(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
    for (xi, o) in x.iter().zip(out.iter_mut()) {
        let xf = std::slice::from_raw_parts(xi.f, nb);
        let mut s = 0f32;
        for (k, &xv) in xf.iter().enumerate() {
            let p = w.add(2 * k);
            let bits = (u16::from_le_bytes([*p, *p.add(1)]) as u32) << 16;
            s += f32::from_bits(bits) * xv;
        }
        *o = s;
    }
}

/// Quantize `x` (a multiple of 32 long) to 32-blocks: `qs`, scale `d` and
/// `s = d * sum(qs)` per block (the sum serves the offset and min terms),
/// and the integer `sum(qs)` in `sums`.
/// As llama.cpp does, the scale is rounded to f16 (its block_q8_0 stores
/// it so) while the quants use the unrounded `127 / amax`: the same
/// rounding on both sides keeps logits within noise of llama.cpp's.
///
/// `q8_1_sums`: `s` as llama.cpp's block_q8_1 has it (the Q4_1/Q5_1 partner),
/// `f16(amax / 127 * sum)`, instead of the exact `d * sum`.
pub(crate) fn quantize_q8_0(
    x: &[f32],
    qs: &mut [i8],
    d: &mut [f32],
    s: &mut [f32],
    sums: &mut [i16],
    q8_1_sums: bool,
) {
    for (b, xb) in x.chunks_exact(32).enumerate() {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in qs[32 * b..32 * b + 32].iter_mut().zip(xb) {
            *q = (v * id).round_ties_even() as i8;
            sum += *q as i32;
        }
        d[b] = round_f16(amax / 127.0);
        // |sum of 32| <= 32 * 127: exact in i16.
        sums[b] = sum as i16;
        s[b] = if q8_1_sums {
            round_f16(amax / 127.0 * sum as f32)
        } else {
            d[b] * sum as f32
        };
    }
}

/// `x` rounded to the nearest f16.
pub(crate) fn round_f16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

/// Quantize `x` (a multiple of 256 long) to Q8_K super-blocks: one scale
/// per 256 and the sum of each 16 quants (for the min / offset terms).
/// Follows llama.cpp's rule exactly: the scale comes from the signed value
/// of largest magnitude (`iscale = -127 / max`, so the scale may be
/// negative), quants are clamped to 127.
pub(crate) fn quantize_q8_k(x: &[f32], qs: &mut [i8], d: &mut [f32], bs: &mut [i16]) {
    for (b, xb) in x.chunks_exact(256).enumerate() {
        let max = xb
            .iter()
            .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        let q = &mut qs[256 * b..256 * b + 256];
        if max == 0.0 {
            q.fill(0);
            bs[16 * b..16 * b + 16].fill(0);
            d[b] = 0.0;
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in q.iter_mut().zip(xb) {
            *q = (iscale * v).round_ties_even().min(127.0) as i8;
        }
        for g in 0..16 {
            bs[16 * b + g] = q[16 * g..16 * g + 16].iter().map(|&q| q as i16).sum();
        }
        d[b] = 1.0 / iscale;
    }
}
