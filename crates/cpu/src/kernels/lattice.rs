//! Portable kernels of the lattice (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S,
//! IQ1_S, IQ1_M), ternary (TQ1_0, TQ2_0) and 4-bit float (MXFP4, NVFP4)
//! types: the reference the SIMD ones are tested against, and what every
//! CPU runs where there is no SIMD kernel for them.
//!
//! Each follows ggml's generic `ggml_vec_dot_*` sequence: the integer dot of
//! each scale's values, times the scale, summed exactly per super-block,
//! then one float multiply-add per super-block (per 32-block for the FP4
//! types) and the format's constant factor at the end. The block layouts are
//! [`blockdraft_gguf::quants`]'s (`lattice`, `ternary`, `fp4`).

use super::scalar::f16_at;
use super::Act;
use blockdraft_gguf::quants::fp4::{self, KVALUES as FP4};
use blockdraft_gguf::quants::lattice::{self, grid_value, IQ1_DELTA};
use blockdraft_gguf::quants::ternary::{tq1_0, tq2_0};

/// The dot of one 8-value group (grid row, sign byte) with 8 activations.
#[inline(always)]
fn signed_dot(row: u64, signs: u8, x: &[i8]) -> i32 {
    let mut s = 0;
    for (j, &xj) in x[..8].iter().enumerate() {
        let v = grid_value(row, j) as i32 * xj as i32;
        s += if signs >> j & 1 != 0 { -v } else { v };
    }
    s
}

/// The dot of one 8-value IQ1 group (signed grid row) with 8 activations.
#[inline(always)]
fn grid_dot(row: u64, x: &[i8]) -> i32 {
    x[..8]
        .iter()
        .enumerate()
        .map(|(j, &xj)| grid_value(row, j) as i8 as i32 * xj as i32)
        .sum()
}

/// A 256-value super-block format as [`superblocks`] reads it.
struct SuperBlock {
    bytes: usize,
    /// The block's scale.
    d: fn(&[u8]) -> f32,
    /// The format's constant factor, applied once at the end.
    scale: f32,
}

/// The shared shape of the super-block kernels: `isum(block, xq)` is a
/// block's exact integer dot (its scales applied);
/// `out[i] = scale * sum_b (d_w * d_x) * isum`.
#[inline(always)]
unsafe fn superblocks(
    w: *const u8,
    nb: usize,
    f: SuperBlock,
    x: &[Act],
    out: &mut [f32],
    isum: impl Fn(&[u8], &[i8]) -> i32,
) {
    out.fill(0.0);
    for b in 0..nb {
        let blk = std::slice::from_raw_parts(w.add(b * f.bytes), f.bytes);
        let d = (f.d)(blk);
        for (xi, o) in x.iter().zip(out.iter_mut()) {
            let xq = std::slice::from_raw_parts(xi.qs.add(b * 256), 256);
            *o += d * *xi.d.add(b) * isum(blk, xq) as f32;
        }
    }
    for o in out.iter_mut() {
        *o *= f.scale;
    }
}

/// The f16 scale the IQ2/IQ3 layouts keep in their first two bytes.
fn f16_d(blk: &[u8]) -> f32 {
    // SAFETY: blk holds a whole block, at least two bytes.
    unsafe { f16_at(blk.as_ptr()) }
}

/// An IQ2/IQ3 format of `bytes` per block and constant factor `scale`.
fn iq(bytes: usize, scale: f32) -> SuperBlock {
    SuperBlock {
        bytes,
        d: f16_d,
        scale,
    }
}

/// The exact integer dot of an IQ2/IQ3 super-block with its activations:
/// half `h` of 32-block `ib` has the odd scale `2 scales(ib)[h] + 1`, group
/// `l` of it the grid row and sign byte `group(ib, l)`.
#[inline(always)]
fn signed_lattice_dot(
    xq: &[i8],
    scales: impl Fn(usize) -> [u32; 2],
    group: impl Fn(usize, usize) -> (u64, u8),
) -> i32 {
    let mut bsum = 0;
    for ib in 0..8 {
        let ls = scales(ib).map(|s| 2 * s as i32 + 1);
        let mut sumi = [0; 2];
        for l in 0..4 {
            let (row, signs) = group(ib, l);
            sumi[l / 2] += signed_dot(row, signs, &xq[32 * ib + 8 * l..]);
        }
        bsum += ls[0] * sumi[0] + ls[1] * sumi[1];
    }
    bsum
}

/// The IQ2/IQ3 kernels: module `$m` of `lattice` (its `scales` and `group`)
/// with the format's constant factor.
macro_rules! signed_lattice_kernel {
    ($name:ident, $m:ident, $factor:expr) => {
        pub(crate) unsafe fn $name(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
            use lattice::$m::*;
            superblocks(w, nb, iq(BYTES, $factor), x, out, |blk, xq| {
                signed_lattice_dot(xq, |ib| scales(blk, ib), |ib, l| group(blk, ib, l))
            })
        }
    };
}

signed_lattice_kernel!(iq2_xxs, iq2_xxs, 0.125);
signed_lattice_kernel!(iq2_xs, iq2_xs, 0.125);
signed_lattice_kernel!(iq2_s, iq2_s, 0.125);
signed_lattice_kernel!(iq3_xxs, iq3_xxs, 0.25);
signed_lattice_kernel!(iq3_s, iq3_s, 1.0);

/// IQ1_S: `d_w d_x (sumi + 1/8 sumi1)`, sumi1 the offsets' part (the
/// block's ±scale times its activation sum), in ggml's float order.
pub(crate) unsafe fn iq1_s(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
    use lattice::iq1_s::*;
    out.fill(0.0);
    for b in 0..nb {
        let blk = std::slice::from_raw_parts(w.add(b * BYTES), BYTES);
        let d = f16_d(blk);
        for (xi, o) in x.iter().zip(out.iter_mut()) {
            let xq = std::slice::from_raw_parts(xi.qs.add(b * 256), 256);
            let bs = std::slice::from_raw_parts(xi.bs.add(b * 16), 16);
            let (mut sumi, mut sumi1) = (0i32, 0i32);
            for ib in 0..8 {
                let qh = qh(blk, ib);
                let ls = 2 * ((qh >> 12) & 7) as i32 + 1;
                let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
                let lsum: i32 = (0..4)
                    .map(|l| grid_dot(row(blk, ib, l), &xq[32 * ib + 8 * l..]))
                    .sum();
                sumi += ls * lsum;
                sumi1 += ls * delta * (bs[2 * ib] as i32 + bs[2 * ib + 1] as i32);
            }
            *o += d * *xi.d.add(b) * (sumi as f32 + IQ1_DELTA * sumi1 as f32);
        }
    }
}

/// IQ1_M: as IQ1_S with scales per 16 values and offset signs per 8.
pub(crate) unsafe fn iq1_m(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
    use lattice::iq1_m::*;
    out.fill(0.0);
    for b in 0..nb {
        let blk = std::slice::from_raw_parts(w.add(b * BYTES), BYTES);
        let d = lattice::iq1_m::d(blk);
        for (xi, o) in x.iter().zip(out.iter_mut()) {
            let xq = std::slice::from_raw_parts(xi.qs.add(b * 256), 256);
            let (mut sumi1, mut sumi2) = (0i32, 0i32);
            for ib in 0..8 {
                let (mut sum1, mut sum2) = ([0i32; 2], [0i32; 2]);
                for l in 0..4 {
                    let (row, negative) = group(blk, ib, l);
                    let xg = &xq[32 * ib + 8 * l..32 * ib + 8 * l + 8];
                    sum1[l / 2] += grid_dot(row, xg);
                    let lsum2: i32 = xg.iter().map(|&v| v as i32).sum();
                    sum2[l / 2] += if negative { -lsum2 } else { lsum2 };
                }
                let (ls1, ls2) = (
                    2 * scale(blk, ib, 0) as i32 + 1,
                    2 * scale(blk, ib, 1) as i32 + 1,
                );
                sumi1 += sum1[0] * ls1 + sum1[1] * ls2;
                sumi2 += sum2[0] * ls1 + sum2[1] * ls2;
            }
            *o += d * *xi.d.add(b) * (sumi1 as f32 + IQ1_DELTA * sumi2 as f32);
        }
    }
}

pub(crate) unsafe fn tq1_0(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
    let f = SuperBlock {
        bytes: tq1_0::BYTES,
        d: |blk| blockdraft_gguf::quants::f16_at(blk, tq1_0::D),
        scale: 1.0,
    };
    superblocks(w, nb, f, x, out, |blk, xq| {
        (0..256)
            .map(|i| {
                let (at, n) = tq1_0::position(i);
                tq1_0::digit(blk[at], n) * xq[i] as i32
            })
            .sum()
    })
}

pub(crate) unsafe fn tq2_0(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
    let f = SuperBlock {
        bytes: tq2_0::BYTES,
        d: |blk| blockdraft_gguf::quants::f16_at(blk, tq2_0::D),
        scale: 1.0,
    };
    superblocks(w, nb, f, x, out, |blk, xq| {
        (0..256).map(|i| tq2_0::value(blk, i) * xq[i] as i32).sum()
    })
}

/// The integer dot of nibble bytes through the E2M1 grid: byte `j` holds
/// value `j` (low nibble) and value `j + half` (high), `half` = 16 for
/// MXFP4's 32-blocks, 8 for NVFP4's 16-value parts.
#[inline(always)]
fn fp4_dot(qs: &[u8], xq: &[i8], half: usize) -> i32 {
    let mut s = 0;
    for (j, &q) in qs.iter().enumerate() {
        s += FP4[(q & 0xF) as usize] as i32 * xq[j] as i32;
        s += FP4[(q >> 4) as usize] as i32 * xq[j + half] as i32;
    }
    s
}

/// MXFP4 on Q8_0 activations: per 32-block `(d_x e8m0(e)) * sumi`.
pub(crate) unsafe fn mxfp4(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
    use fp4::mxfp4::*;
    out.fill(0.0);
    for b in 0..nb {
        let blk = std::slice::from_raw_parts(w.add(b * BYTES), BYTES);
        let e = fp4::e8m0_half(blk[E]);
        for (xi, o) in x.iter().zip(out.iter_mut()) {
            let xq = std::slice::from_raw_parts(xi.qs.add(b * 32), 32);
            *o += *xi.d.add(b) * e * fp4_dot(&blk[QS..QS + 16], xq, 16) as f32;
        }
    }
}

/// NVFP4 on Q8_0 activations (two per block): per 16-value part
/// `d_x * d_part * sumi`.
pub(crate) unsafe fn nvfp4(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]) {
    use fp4::nvfp4::*;
    out.fill(0.0);
    for b in 0..nb {
        let blk = std::slice::from_raw_parts(w.add(b * BYTES), BYTES);
        for (xi, o) in x.iter().zip(out.iter_mut()) {
            for s in 0..4 {
                let d = fp4::ue4m3_half(blk[D + s]);
                let dy = *xi.d.add(2 * b + s / 2);
                let xq = std::slice::from_raw_parts(xi.qs.add(64 * b + 16 * s), 16);
                let sumi = fp4_dot(&blk[QS + 8 * s..QS + 8 * s + 8], xq, 8);
                *o += dy * d * sumi as f32;
            }
        }
    }
}
