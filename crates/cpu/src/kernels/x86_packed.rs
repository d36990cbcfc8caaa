//! Weights re-laid out eight rows at a time, and their kernels: Q4_K,
//! Q4_0, Q4_1, Q5_0, Q8_0, IQ4_NL and Q6_K on AVX2 and AVX-512 VNNI.
//!
//! In ggml's layout one 32-byte vector holds 64 values of one weight row, so
//! every 32-value (sub-)block, which has its own scale, costs one `maddubs`
//! and one `madd` per activation row, and each output needs a horizontal
//! sum. Here a vector holds four values of each of eight rows (one i32 lane
//! per row), with the activation's four values broadcast to every lane: the
//! eight `maddubs` of a 32-value block add up exactly in i16 before one
//! `madd` (applying the eight rows' scales, for Q4_K), and lane r ends as
//! output r, with no horizontal sum. For Q4_K that is 9 multiply
//! instructions per (weight row, activation row, super-block) instead of
//! 17, which is what makes a verify batch of 8 rows cheap. The 32-value
//! block types llama.cpp repacks (Q4_0, IQ4_NL) gain the same way
//! (`block32_group`); those it runs unpacked (Q4_1, Q5_0, Q8_0) keep its
//! eight float lanes per output (`block32_lanes_group`), which still saves
//! the unpacking per activation row and the horizontal sums: packed Q4_1
//! ran 2.4-2.7x as fast as ggml's layout for one row and 1.3-1.8x for 4 to
//! 8 on one Zen 3 core (SmolLM2's shapes; in the fast kernels' own sequence,
//! `block32_group`, 3.2-3.4x and 2.2-2.8x). Q6_K's 6-bit
//! products fit two, not eight, to an i16 sum (`q6_k_group`): 13 multiplies
//! per (256 values, activation row) instead of 16, the same speed for one
//! row and 1.1-1.4x for 2 to 8. Multiplies are what an AVX2 verify batch
//! waits on: on Zen 3 both layouts top out near one vector multiply per
//! cycle.
//!
//! On AVX-512 VNNI every packed type takes two groups side by side (16
//! rows, one per i32 lane of a 512-bit vector, `x16_kernel!`; the pair's
//! blocks interleaved in memory, so that the kernel streams one run) and
//! `vpdpbusd` sums each (sub-)block in one instruction per four values,
//! scaled once per block: for Q4_K by `vpmulld`, 11 instructions per
//! (block, activation row, 16 weight rows) instead of 2 x 17.
//!
//! Float sequences: Q4_K's per-super-block integer sums are the row
//! kernel's exact values and its float steps per output the same (`fma(sum,
//! d * dx, acc)`, `fma(sum_min, dmin * dx, acc_min)`, `acc - acc_min`), so
//! results are bit-identical to `x86::q4_k`. Q4_0 takes the sequence of
//! llama.cpp's repacked Q4_0 kernels (what it runs on AVX2 for matrices
//! with whole groups of 8 rows): `acc = fma(sum_b, d_w * d_x, acc)` per
//! 32-block with the block's exact integer sum, in every batch shape.
//! IQ4_NL takes that sequence too, and Q6_K its per-super-block form: their
//! own, equal to llama.cpp's to rounding. Q4_1, Q5_0 and Q8_0 give the
//! ggml-layout kernels' (llama.cpp's) bits: eight float lanes per output,
//! each lane one `vpdpbusd` per (block, activation row, 16 weight rows) on
//! AVX-512 (`block32_lanes_group16`). The fast kernels (`layout`'s `fast`)
//! run them in Q4_0's sequence instead, one float sum per block: their
//! own, equal to llama.cpp's to rounding. A type's AVX2 and AVX-512
//! kernels give the same bits.

use super::x86::{k4_scales, prefetch_ahead, prefetch_lines};
use super::{tile_kernel, Act, Kernel};
use blockdraft_gguf::GgmlType;
use std::arch::x86_64::*;

/// A packed layout: how to build it and the kernel that reads it.
pub(crate) struct Layout {
    /// Values per block.
    pub block_len: usize,
    /// Bytes of one block of one row in ggml's layout.
    pub src_block_bytes: usize,
    /// Bytes of one block of [`GROUP_ROWS`] rows packed.
    pub group_block_bytes: usize,
    /// Packs `GROUP_ROWS` rows of `nb` blocks (`src`) into `out`, block b
    /// at `b * stride` (`group_block_bytes` for a group alone, twice that
    /// for a group interleaved with its pair).
    pub pack_group: fn(src: &[u8], nb: usize, out: &mut [u8], stride: usize),
    /// The AVX2 kernel.
    pub kernel: Kernel,
    /// The same float sequence on AVX-512 VNNI (pairs of groups).
    pub kernel_avx512: Kernel,
    /// The kernel's float sequence is also llama.cpp's for batches of 4 or
    /// more rows (its gemm), not only for single rows (its gemv).
    pub llamacpp_gemm_order: bool,
}

/// The [`Kernel`] running `$group` (the eight outputs of one group of
/// rows, for NR activation rows; `$kind` its [`Block32Kind`] where it
/// takes one) over
/// packed groups: `w` points at a group,
/// `row_bytes` is the packed bytes per row and `nw` a multiple of 8.
macro_rules! x8_kernel {
    ($group:ident $(, $kind:ty)?) => {{
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn groups<const NR: usize>(
            w: *const u8,
            row_bytes: usize,
            nw: usize,
            nb: usize,
            x: &[Act],
            out: *mut f32,
            ldo: usize,
        ) {
            debug_assert_eq!(nw % GROUP_ROWS, 0);
            let x: &[Act; NR] = x.try_into().unwrap_unchecked();
            for g in 0..nw / GROUP_ROWS {
                let r = $group::<$($kind,)? NR>(w.add(g * GROUP_ROWS * row_bytes), nb, x);
                store_group(&r, out, ldo, g * GROUP_ROWS);
            }
        }
        tile_kernel!(groups)
    }};
}

/// The [`Kernel`] running `$group16` (the outputs of two packed groups,
/// the first in lanes 0..8, for NR activation rows; `$kind` its
/// [`Block32Kind`] where it takes one) over pairs of groups, as `x8_kernel!` on AVX-512 VNNI.
/// A pair's blocks are interleaved (`$block` bytes each: block b of the
/// first group, then of the second), so that the kernel streams one run of
/// memory; a last odd group is laid out alone and runs as a pair with
/// itself (the duplicate high half dropped).
macro_rules! x16_kernel {
    ($group16:ident, $block:expr $(, $kind:ty)?) => {{
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        unsafe fn pairs<const NR: usize>(
            w: *const u8,
            row_bytes: usize,
            nw: usize,
            nb: usize,
            x: &[Act],
            out: *mut f32,
            ldo: usize,
        ) {
            debug_assert_eq!(nw % GROUP_ROWS, 0);
            let x: &[Act; NR] = x.try_into().unwrap_unchecked();
            let n_groups = nw / GROUP_ROWS;
            for g in (0..n_groups).step_by(2) {
                let a = w.add(g * GROUP_ROWS * row_bytes);
                let paired = g + 1 < n_groups;
                let (b, stride) = if paired { (a.add($block), 2 * $block) } else { (a, $block) };
                let r = $group16::<$($kind,)? NR>(a, b, stride, nb, x);
                for (i, v) in r.iter().enumerate() {
                    let at = out.add(i * ldo + g * GROUP_ROWS);
                    if paired {
                        _mm512_storeu_ps(at, *v);
                    } else {
                        _mm256_storeu_ps(at, _mm512_castps512_ps256(*v));
                    }
                }
            }
        }
        tile_kernel!(pairs)
    }};
}

/// The packed layout of `ty`, if it has one; `fast`: the fast kernels'
/// own sequence for Q4_1, Q5_0 and Q8_0 (one float sum per block, as
/// Q4_0's, with AVX-512 VNNI forms) instead of llama.cpp's eight lanes.
pub(crate) fn layout(ty: GgmlType, fast: bool) -> Option<&'static Layout> {
    static Q4_K: Layout = Layout {
        block_len: 256,
        src_block_bytes: 144,
        group_block_bytes: Q4_K_GROUP_BLOCK,
        pack_group: pack_q4_k_group,
        kernel: x8_kernel!(q4_k_group),
        kernel_avx512: x16_kernel!(q4_k_group16, Q4_K_GROUP_BLOCK),
        llamacpp_gemm_order: false,
    };
    static Q4_0: Layout = Layout {
        block_len: 32,
        src_block_bytes: 18,
        group_block_bytes: Q4_0_GROUP_BLOCK,
        pack_group: pack_q4_0_group,
        kernel: x8_kernel!(block32_group, kind::Q4_0),
        kernel_avx512: x16_kernel!(block32_group16, Q4_0_GROUP_BLOCK, kind::Q4_0),
        llamacpp_gemm_order: true,
    };
    static Q6_K: Layout = Layout {
        block_len: 256,
        src_block_bytes: 210,
        group_block_bytes: Q6_K_GROUP_BLOCK,
        pack_group: pack_q6_k_group,
        kernel: x8_kernel!(q6_k_group),
        kernel_avx512: x16_kernel!(q6_k_group16, Q6_K_GROUP_BLOCK),
        llamacpp_gemm_order: false,
    };
    const Q5_0: Layout = Layout {
        block_len: 32,
        src_block_bytes: 22,
        group_block_bytes: Q5_0_GROUP_BLOCK,
        pack_group: pack_q5_0_group,
        kernel: x8_kernel!(block32_lanes_group, kind::Q5_0),
        kernel_avx512: x16_kernel!(block32_lanes_group16, Q5_0_GROUP_BLOCK, kind::Q5_0),
        llamacpp_gemm_order: true,
    };
    const Q4_1: Layout = Layout {
        block_len: 32,
        src_block_bytes: 20,
        group_block_bytes: Q4_1_GROUP_BLOCK,
        pack_group: pack_q4_1_group,
        kernel: x8_kernel!(block32_lanes_group, kind::Q4_1),
        kernel_avx512: x16_kernel!(block32_lanes_group16, Q4_1_GROUP_BLOCK, kind::Q4_1),
        llamacpp_gemm_order: true,
    };
    const Q8_0: Layout = Layout {
        block_len: 32,
        src_block_bytes: 34,
        group_block_bytes: Q8_0_GROUP_BLOCK,
        pack_group: pack_q8_0_group,
        kernel: x8_kernel!(block32_lanes_group, kind::Q8_0),
        kernel_avx512: x16_kernel!(block32_lanes_group16, Q8_0_GROUP_BLOCK, kind::Q8_0),
        llamacpp_gemm_order: true,
    };
    // IQ4_NL's blocks are Q4_0's bytes (an f16 scale, 16 bytes of nibble
    // pairs), so they pack alike; the kernel looks the nibbles up.
    static IQ4_NL: Layout = Layout {
        block_len: 32,
        src_block_bytes: 18,
        group_block_bytes: Q4_0_GROUP_BLOCK,
        pack_group: pack_q4_0_group,
        kernel: x8_kernel!(block32_group, kind::Iq4Nl),
        kernel_avx512: x16_kernel!(block32_group16, Q4_0_GROUP_BLOCK, kind::Iq4Nl),
        llamacpp_gemm_order: false,
    };
    // The fast kernels' Q4_1, Q5_0 and Q8_0: the same packed bytes, summed
    // in Q4_0's sequence (`block32_group`), with AVX-512 VNNI forms.
    const Q5_0_FAST: Layout = Layout {
        kernel: x8_kernel!(block32_group, kind::Q5_0),
        kernel_avx512: x16_kernel!(block32_group16, Q5_0_GROUP_BLOCK, kind::Q5_0),
        llamacpp_gemm_order: false,
        ..Q5_0
    };
    const Q4_1_FAST: Layout = Layout {
        kernel: x8_kernel!(block32_group, kind::Q4_1),
        kernel_avx512: x16_kernel!(block32_group16, Q4_1_GROUP_BLOCK, kind::Q4_1),
        llamacpp_gemm_order: false,
        ..Q4_1
    };
    const Q8_0_FAST: Layout = Layout {
        kernel: x8_kernel!(block32_group, kind::Q8_0),
        kernel_avx512: x16_kernel!(block32_group16, Q8_0_GROUP_BLOCK, kind::Q8_0),
        llamacpp_gemm_order: false,
        ..Q8_0
    };
    match ty {
        GgmlType::Q4_1 if fast => Some(&Q4_1_FAST),
        GgmlType::Q5_0 if fast => Some(&Q5_0_FAST),
        GgmlType::Q8_0 if fast => Some(&Q8_0_FAST),
        GgmlType::IQ4_NL => Some(&IQ4_NL),
        GgmlType::Q4_1 => Some(&Q4_1),
        GgmlType::Q5_0 => Some(&Q5_0),
        GgmlType::Q8_0 => Some(&Q8_0),
        GgmlType::Q4_K => Some(&Q4_K),
        GgmlType::Q4_0 => Some(&Q4_0),
        GgmlType::Q6_K => Some(&Q6_K),
        _ => None,
    }
}

/// Bytes of one Q4_K super-block of eight rows:
/// - `0..16`: the rows' `d` (f16), row r at `2r`;
/// - `16..32`: the rows' `dmin` (f16);
/// - `32..96`: scales, `32 + 8j + r` = row r's scale of sub-block j;
/// - `96..160`: mins, laid out like the scales;
/// - `160..1184`: quants, 32 bytes per (sub-block j, quarter c) at
///   `160 + 32 (4j + c)`; byte `4r + t` holds row r's value `32j + 4c + t`
///   in its low nibble and value `32j + 16 + 4c + t` in its high nibble.
const Q4_K_GROUP_BLOCK: usize = 1184;
/// Rows per group.
pub(crate) const GROUP_ROWS: usize = 8;

/// Bytes of one Q6_K super-block of eight rows, ggml's bytes regrouped by
/// four so that the unpacking shifts of the row kernel apply unchanged:
/// - `0..16`: the rows' `d` (f16), row r at `2r`;
/// - `16..144`: scales (i8), `16 + 8s + r` = row r's scale of sub-block s;
/// - `144..1168`: `ql`, 32 bytes per word k at `144 + 32k`, bytes `4r..4r+4`
///   holding row r's `ql[4k..4k+4]`;
/// - `1168..1680`: `qh`, laid out like `ql` (16 words).
const Q6_K_GROUP_BLOCK: usize = 1680;
const Q6_QL: usize = 144;
const Q6_QH: usize = 1168;
const QS: usize = 160;

/// Bytes of one Q4_0 block of eight rows: the rows' `d` (f16) at `2r`,
/// then 32 bytes per quarter c at `16 + 32c`, byte `4r + t` holding row r's
/// ggml quant byte `4c + t` (values `4c + t` low, `16 + 4c + t` high).
const Q4_0_GROUP_BLOCK: usize = 144;

/// Bytes of one Q4_1 block of eight rows: the rows' `d` (f16) at `2r`,
/// their `m` (f16) at `16 + 2r`, then the nibbles as Q4_0's at `32 + 32c`.
const Q4_1_GROUP_BLOCK: usize = 160;

/// Bytes of one Q5_0 block of eight rows: the rows' `d` (f16) at `2r`;
/// the fifth bits at `16 + 4r`, regrouped per quarter c into byte c of
/// row r's word (bit t: value `4c + t`, bit 4 + t: value `16 + 4c + t`);
/// then the nibbles as Q4_0's, 32 bytes per quarter c at `48 + 32c`.
const Q5_0_GROUP_BLOCK: usize = 176;

/// Bytes of one Q8_0 block of eight rows: the rows' `d` (f16) at `2r`,
/// then 32 bytes per word k at `16 + 32k`, bytes `4r..4r+4` holding row
/// r's quants `4k..4k+4`.
const Q8_0_GROUP_BLOCK: usize = 272;

/// Calls `f(r, block, packed)` for every block b of every row r of a group
/// of [`GROUP_ROWS`] rows (`nb` blocks each): `block` is row r's ggml block
/// b (`src_bytes` long), `packed` the group's packed block b
/// (`group_bytes` at `b * stride` in `out`).
fn for_each_block(
    src: &[u8],
    nb: usize,
    src_bytes: usize,
    out: &mut [u8],
    group_bytes: usize,
    stride: usize,
    f: impl Fn(usize, &[u8], &mut [u8]),
) {
    let row_bytes = nb * src_bytes;
    assert!(src.len() >= GROUP_ROWS * row_bytes && stride >= group_bytes);
    assert!(nb == 0 || out.len() >= (nb - 1) * stride + group_bytes);
    for b in 0..nb {
        let packed = &mut out[b * stride..b * stride + group_bytes];
        for r in 0..GROUP_ROWS {
            let at = r * row_bytes + b * src_bytes;
            f(r, &src[at..at + src_bytes], packed);
        }
    }
}

/// Re-lays out eight rows of a Q4_K matrix (`nb` super-blocks per row).
fn pack_q4_k_group(src: &[u8], nb: usize, out: &mut [u8], stride: usize) {
    for_each_block(
        src,
        nb,
        144,
        out,
        Q4_K_GROUP_BLOCK,
        stride,
        |r, blk, dst| {
            dst[2 * r..2 * r + 2].copy_from_slice(&blk[0..2]);
            dst[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&blk[2..4]);
            let (sc, mn) = k4_scales(blk[4..16].as_ptr());
            for j in 0..8 {
                dst[32 + 8 * j + r] = sc[j];
                dst[96 + 8 * j + r] = mn[j];
            }
            // Sub-block j's 32 values are the low (j even) or high nibbles
            // of the 32 bytes at 16 + 32 (j / 2); four values per word.
            let word = |at: usize| u32::from_le_bytes(blk[at..at + 4].try_into().unwrap());
            for j in 0..8 {
                let (src, shift) = (16 + 32 * (j / 2), 4 * (j % 2));
                for c in 0..4 {
                    let lo = (word(src + 4 * c) >> shift) & 0x0F0F_0F0F;
                    let hi = (word(src + 16 + 4 * c) >> shift) & 0x0F0F_0F0F;
                    let at = QS + 32 * (4 * j + c) + 4 * r;
                    dst[at..at + 4].copy_from_slice(&(lo | (hi << 4)).to_le_bytes());
                }
            }
        },
    );
}

/// Re-lays out eight rows of a Q6_K matrix (`nb` super-blocks per row).
fn pack_q6_k_group(src: &[u8], nb: usize, out: &mut [u8], stride: usize) {
    for_each_block(
        src,
        nb,
        210,
        out,
        Q6_K_GROUP_BLOCK,
        stride,
        |r, blk, dst| {
            dst[2 * r..2 * r + 2].copy_from_slice(&blk[208..210]);
            for s in 0..16 {
                dst[16 + 8 * s + r] = blk[192 + s];
            }
            for k in 0..32 {
                let at = Q6_QL + 32 * k + 4 * r;
                dst[at..at + 4].copy_from_slice(&blk[4 * k..4 * k + 4]);
            }
            for k in 0..16 {
                let at = Q6_QH + 32 * k + 4 * r;
                dst[at..at + 4].copy_from_slice(&blk[128 + 4 * k..128 + 4 * k + 4]);
            }
        },
    );
}

/// Re-lays out eight rows of a Q5_0 matrix (`nb` blocks per row).
fn pack_q5_0_group(src: &[u8], nb: usize, out: &mut [u8], stride: usize) {
    for_each_block(src, nb, 22, out, Q5_0_GROUP_BLOCK, stride, |r, blk, dst| {
        dst[2 * r..2 * r + 2].copy_from_slice(&blk[0..2]);
        let qh = u32::from_le_bytes(blk[2..6].try_into().unwrap());
        let mut bits = 0u32;
        for c in 0..4 {
            for t in 0..4 {
                bits |= (qh >> (4 * c + t) & 1) << (8 * c + t);
                bits |= (qh >> (16 + 4 * c + t) & 1) << (8 * c + 4 + t);
            }
        }
        dst[16 + 4 * r..20 + 4 * r].copy_from_slice(&bits.to_le_bytes());
        for c in 0..4 {
            let at = 48 + 32 * c + 4 * r;
            dst[at..at + 4].copy_from_slice(&blk[6 + 4 * c..6 + 4 * c + 4]);
        }
    });
}

/// Re-lays out eight rows of a Q8_0 matrix (`nb` blocks per row).
fn pack_q8_0_group(src: &[u8], nb: usize, out: &mut [u8], stride: usize) {
    for_each_block(src, nb, 34, out, Q8_0_GROUP_BLOCK, stride, |r, blk, dst| {
        dst[2 * r..2 * r + 2].copy_from_slice(&blk[0..2]);
        for k in 0..8 {
            let at = 16 + 32 * k + 4 * r;
            dst[at..at + 4].copy_from_slice(&blk[2 + 4 * k..2 + 4 * k + 4]);
        }
    });
}

/// Re-lays out eight rows of a Q4_1 matrix (`nb` blocks per row).
fn pack_q4_1_group(src: &[u8], nb: usize, out: &mut [u8], stride: usize) {
    for_each_block(src, nb, 20, out, Q4_1_GROUP_BLOCK, stride, |r, blk, dst| {
        dst[2 * r..2 * r + 2].copy_from_slice(&blk[0..2]);
        dst[16 + 2 * r..18 + 2 * r].copy_from_slice(&blk[2..4]);
        for c in 0..4 {
            let at = 32 + 32 * c + 4 * r;
            dst[at..at + 4].copy_from_slice(&blk[4 + 4 * c..4 + 4 * c + 4]);
        }
    });
}

/// Re-lays out eight rows of a Q4_0 matrix (`nb` blocks per row).
fn pack_q4_0_group(src: &[u8], nb: usize, out: &mut [u8], stride: usize) {
    for_each_block(src, nb, 18, out, Q4_0_GROUP_BLOCK, stride, |r, blk, dst| {
        dst[2 * r..2 * r + 2].copy_from_slice(&blk[0..2]);
        for c in 0..4 {
            let at = 16 + 32 * c + 4 * r;
            dst[at..at + 4].copy_from_slice(&blk[2 + 4 * c..2 + 4 * c + 4]);
        }
    });
}

/// 32 bytes at `off` of each of two packed groups, `a`'s in the low half.
#[target_feature(enable = "avx2,avx512f")]
#[inline]
unsafe fn both32(a: *const u8, b: *const u8, off: usize) -> __m512i {
    let lo = _mm256_loadu_si256(a.add(off) as *const __m256i);
    let hi = _mm256_loadu_si256(b.add(off) as *const __m256i);
    _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
}

/// Eight bytes at `off` of each of two packed groups, `a`'s first.
#[target_feature(enable = "sse2")]
#[inline]
unsafe fn both8(a: *const u8, b: *const u8, off: usize) -> __m128i {
    let lo = _mm_loadl_epi64(a.add(off) as *const __m128i);
    let hi = _mm_loadl_epi64(b.add(off) as *const __m128i);
    _mm_unpacklo_epi64(lo, hi)
}

/// Eight f16 at `off` of each of two packed groups as f32, `a`'s in lanes
/// 0..8.
#[target_feature(enable = "avx2,f16c,avx512f")]
#[inline]
unsafe fn both_f16(a: *const u8, b: *const u8, off: usize) -> __m512 {
    let lo = _mm_loadu_si128(a.add(off) as *const __m128i);
    let hi = _mm_loadu_si128(b.add(off) as *const __m128i);
    _mm512_cvtph_ps(_mm256_set_m128i(hi, lo))
}

/// A group's eight outputs for each activation row: row i's go to
/// `out + i * ldo + col`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn store_group<const NR: usize>(r: &[__m256; NR], out: *mut f32, ldo: usize, col: usize) {
    for (i, v) in r.iter().enumerate() {
        _mm256_storeu_ps(out.add(i * ldo + col), *v);
    }
}

/// Four activation values broadcast to every row's lane.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn x4(p: *const i8) -> __m256i {
    _mm256_set1_epi32((p as *const i32).read_unaligned())
}

/// `sum_t q[r][t] x[t]` over one 32-value block in lane r: `q` the block's
/// eight unpacked vectors (low nibbles of the four quarters, then high),
/// `xp` its 32 activation quants. The eight `maddubs` add exactly in i16
/// (|each| <= 2 * 15 * 127); the result is i16 pairs per lane.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn block_pairs(q: &[__m256i; 8], xp: *const i8) -> __m256i {
    let mut p = _mm256_maddubs_epi16(q[0], x4(xp));
    for (k, &qk) in q.iter().enumerate().skip(1) {
        let off = if k < 4 { 4 * k } else { 16 + 4 * (k - 4) };
        p = _mm256_add_epi16(p, _mm256_maddubs_epi16(qk, x4(xp.add(off))));
    }
    p
}

/// `sum_k rows[k] . (sums[2k], sums[2k + 1])` in each row's lane: `rows[k]`
/// a pair of i16 per row (Q4_K's mins, Q6_K's scales, of sub-blocks 2k and
/// 2k + 1), `sums` the activation's i16 sums of those sub-blocks.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn pair_sums<const K: usize>(rows: &[__m256i; K], sums: *const i16) -> __m256i {
    let pairs = sums as *const i32;
    let mut acc = _mm256_setzero_si256();
    for (k, &r) in rows.iter().enumerate() {
        let s = _mm256_set1_epi32(pairs.add(k).read_unaligned());
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(r, s));
    }
    acc
}

/// The eight unpacked vectors of a 32-value block whose four packed
/// quarters start at `p`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn unpack_block(p: *const u8) -> [__m256i; 8] {
    let low4 = _mm256_set1_epi8(0x0F);
    let mut q = [_mm256_setzero_si256(); 8];
    for c in 0..4 {
        let v = _mm256_loadu_si256(p.add(32 * c) as *const __m256i);
        q[c] = _mm256_and_si256(v, low4);
        q[4 + c] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
    }
    q
}

/// ORs Q5_0's fifth bits (a packed block's 32 bytes at `bits`) into its
/// unpacked nibbles `q`, making values 0..=31.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn or_fifth_bits(q: &mut [__m256i; 8], bits: *const u8) {
    let sixteen = _mm256_set1_epi8(0x10);
    // Byte c of a row's word to its lane's four bytes; bit t (low
    // nibbles) or 4 + t (high) of byte t, where set, adds 16.
    let bits = _mm256_loadu_si256(bits as *const __m256i);
    let (lo, hi) = (
        _mm256_set1_epi32(0x0804_0201),
        _mm256_set1_epi32(0x8040_2010u32 as i32),
    );
    let set = |v: __m256i, m: __m256i| {
        _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, m), m), sixteen)
    };
    for c in 0..4 {
        // Byte 4j + c for the four bytes of dword j of each 128-bit
        // lane (vpshufb indexes within the lane).
        let idx = _mm256_add_epi8(
            _mm256_set_epi32(
                0x0C0C_0C0C,
                0x0808_0808,
                0x0404_0404,
                0,
                0x0C0C_0C0C,
                0x0808_0808,
                0x0404_0404,
                0,
            ),
            _mm256_set1_epi8(c as i8),
        );
        let spread = _mm256_shuffle_epi8(bits, idx);
        q[c] = _mm256_or_si256(q[c], set(spread, lo));
        q[4 + c] = _mm256_or_si256(q[4 + c], set(spread, hi));
    }
}

/// The eight outputs (lanes) of one group for each activation row.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q4_k_group<const NR: usize>(w: *const u8, nb: usize, x: &[Act; NR]) -> [__m256; NR] {
    let mut acc = [_mm256_setzero_ps(); NR];
    let mut acc_min = [_mm256_setzero_ps(); NR];
    // Eight u8 (one per row) as i16 pairs [v, v] in the rows' i32 lanes.
    let dup = |p: *const u8| {
        let v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i));
        _mm256_or_si256(v, _mm256_slli_epi32(v, 16))
    };
    for b in 0..nb {
        let blk = w.add(b * Q4_K_GROUP_BLOCK);
        let d = _mm256_cvtph_ps(_mm_loadu_si128(blk as *const __m128i));
        let dmin = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(16) as *const __m128i));
        let mut sum = [_mm256_setzero_si256(); NR];
        for j in 0..8 {
            // 24 lines for the block's 19: with `prefetch_ahead`'s
            // division and loop here, packed Q4_K ran 20-30 % slower on a
            // Zen 3 core.
            prefetch_lines(blk, 3 * j, 3);
            let scale = dup(blk.add(32 + 8 * j));
            let q = unpack_block(blk.add(QS + 128 * j));
            for i in 0..NR {
                let p = block_pairs(&q, x[i].qs.add(256 * b + 32 * j));
                sum[i] = _mm256_add_epi32(sum[i], _mm256_madd_epi16(p, scale));
            }
        }
        // Mins against the activation's sums of 32: rows' (m_2k, m_2k+1) as
        // i16 pairs times the broadcast pair of sums.
        let mins: [__m256i; 4] = std::array::from_fn(|k| {
            let lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64(blk.add(96 + 16 * k) as *const __m128i));
            let hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64(blk.add(104 + 16 * k) as *const __m128i));
            _mm256_or_si256(lo, _mm256_slli_epi32(hi, 16))
        });
        for i in 0..NR {
            let msum = pair_sums(&mins, x[i].b32.add(8 * b));
            let dx = _mm256_set1_ps(*x[i].d.add(b));
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[i]), _mm256_mul_ps(d, dx), acc[i]);
            acc_min[i] = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(msum),
                _mm256_mul_ps(dmin, dx),
                acc_min[i],
            );
        }
    }
    std::array::from_fn(|i| _mm256_sub_ps(acc[i], acc_min[i]))
}

/// [`q4_k_group`] for two groups at once (`a`: lanes 0..8, `b`: 8..16).
/// Lane r's integer sums are the same exact values (`vpdpbusd` per block
/// times the block's scale, where `q4_k_group` has maddubs + madd) and its
/// float steps the same, so the results are bit-identical.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn q4_k_group16<const NR: usize>(
    a: *const u8,
    b: *const u8,
    stride: usize,
    nb: usize,
    x: &[Act; NR],
) -> [__m512; NR] {
    let mut acc = [_mm512_setzero_ps(); NR];
    let mut acc_min = [_mm512_setzero_ps(); NR];
    let low4 = _mm512_set1_epi8(0x0F);
    for blk in 0..nb {
        let (pa, pb) = (a.add(blk * stride), b.add(blk * stride));
        // Eight u8 of each group at `off`, one per i32 lane.
        let both_u8 = |off: usize| _mm512_cvtepu8_epi32(both8(pa, pb, off));
        let d = both_f16(pa, pb, 0);
        let dmin = both_f16(pa, pb, 16);
        let mut sum = [_mm512_setzero_si512(); NR];
        for j in 0..8 {
            prefetch_ahead(pa, stride, j, 8);
            let scale = both_u8(32 + 8 * j);
            let mut q = [_mm512_setzero_si512(); 8];
            for c in 0..4 {
                let v = both32(pa, pb, QS + 128 * j + 32 * c);
                q[c] = _mm512_and_si512(v, low4);
                q[4 + c] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
            }
            for i in 0..NR {
                let xp = x[i].qs.add(256 * blk + 32 * j);
                let mut s = _mm512_setzero_si512();
                for (k, &qk) in q.iter().enumerate() {
                    let off = if k < 4 { 4 * k } else { 16 + 4 * (k - 4) };
                    let x4 = _mm512_set1_epi32((xp.add(off) as *const i32).read_unaligned());
                    s = _mm512_dpbusd_epi32(s, qk, x4);
                }
                sum[i] = _mm512_add_epi32(sum[i], _mm512_mullo_epi32(s, scale));
            }
        }
        // Mins: rows' (m_2k, m_2k+1) as i16 pairs times the activation's
        // broadcast pair of 32-sums, as in `q4_k_group`.
        let mins: [__m512i; 4] = std::array::from_fn(|k| {
            let lo = both_u8(96 + 16 * k);
            let hi = both_u8(104 + 16 * k);
            _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16))
        });
        for i in 0..NR {
            let pairs = x[i].b32.add(8 * blk) as *const i32;
            let mut msum = _mm512_setzero_si512();
            for (k, &m) in mins.iter().enumerate() {
                let bs = _mm512_set1_epi32(pairs.add(k).read_unaligned());
                msum = _mm512_add_epi32(msum, _mm512_madd_epi16(m, bs));
            }
            let dx = _mm512_set1_ps(*x[i].d.add(blk));
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[i]), _mm512_mul_ps(d, dx), acc[i]);
            acc_min[i] = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(msum),
                _mm512_mul_ps(dmin, dx),
                acc_min[i],
            );
        }
    }
    std::array::from_fn(|i| _mm512_sub_ps(acc[i], acc_min[i]))
}

/// The eight outputs (lanes) of one packed Q6_K group for each activation
/// row: [`q6_k_group16`]'s exact integer sums and float steps, so the same
/// bits. Without `vpdpbusd` a sub-block of 16 values takes four `maddubs`,
/// added two by two in i16 (|each pair| <= 2 * 2 * 63 * 128 < 2^15), and
/// two `madd` by the rows' scale; the stored +32 comes off once per
/// super-block as `32 sum_s sc_s bsum_s` (eight `madd`, as Q4_K's mins).
/// That is 13 multiplies per (256 values, activation row, 8 weight rows)
/// where the ggml layout takes 16 (see the module doc).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q6_k_group<const NR: usize>(w: *const u8, nb: usize, x: &[Act; NR]) -> [__m256; NR] {
    let mut acc = [_mm256_setzero_ps(); NR];
    let low4 = _mm256_set1_epi8(0x0F);
    let bits45 = _mm256_set1_epi8(0x30);
    // Eight i8 (one per row) as i16 pairs [lo, hi] in the rows' i32 lanes.
    let pair_i8 = |lo: *const u8, hi: *const u8| {
        let lo = _mm256_cvtepi8_epi32(_mm_loadl_epi64(lo as *const __m128i));
        let hi = _mm256_cvtepi8_epi32(_mm_loadl_epi64(hi as *const __m128i));
        _mm256_blend_epi16::<0xAA>(lo, _mm256_slli_epi32(hi, 16))
    };
    for blk in 0..nb {
        let p = w.add(blk * Q6_K_GROUP_BLOCK);
        let d = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
        let mut sum = [_mm256_setzero_si256(); NR];
        // Quarter c of `q6_k_group16`'s unpacking, one sub-block at a time
        // (four vectors live, which leaves registers to the rows' sums); `c`
        // a literal in each call, so that its shifts are immediates.
        let sub_block = |sum: &mut [__m256i; NR], h: usize, half: usize, c: usize| {
            let v: [__m256i; 4] = std::array::from_fn(|mi| {
                let m = 4 * half + mi;
                let load = |at: usize| _mm256_loadu_si256(p.add(at) as *const __m256i);
                let q = load(Q6_QL + 32 * (16 * h + 8 * (c % 2) + m));
                let qh = load(Q6_QH + 32 * (8 * h + m));
                // Bits 2c, 2c + 1 of qh to bits 4, 5.
                let high = _mm256_and_si256(
                    match c {
                        0 => _mm256_slli_epi16(qh, 4),
                        1 => _mm256_slli_epi16(qh, 2),
                        2 => qh,
                        _ => _mm256_srli_epi16(qh, 2),
                    },
                    bits45,
                );
                let low = if c < 2 { q } else { _mm256_srli_epi16(q, 4) };
                _mm256_or_si256(_mm256_and_si256(low, low4), high)
            });
            let sub = 8 * h + 2 * c + half;
            // Two lines per sub-block, 32 for the block's 27 (the last
            // reach into the next block; see `q4_k_group`).
            prefetch_lines(p, 2 * (4 * (2 * h + half) + c), 2);
            let at = p.add(16 + 8 * sub);
            let scale = pair_i8(at, at);
            for i in 0..NR {
                let xp = x[i].qs.add(256 * blk + 128 * h + 32 * c + 16 * half);
                let dot = |mi: usize| _mm256_maddubs_epi16(v[mi], x4(xp.add(4 * mi)));
                let p01 = _mm256_add_epi16(dot(0), dot(1));
                let p23 = _mm256_add_epi16(dot(2), dot(3));
                let s =
                    _mm256_add_epi32(_mm256_madd_epi16(p01, scale), _mm256_madd_epi16(p23, scale));
                sum[i] = _mm256_add_epi32(sum[i], s);
            }
        };
        for h in 0..2 {
            for half in 0..2 {
                sub_block(&mut sum, h, half, 0);
                sub_block(&mut sum, h, half, 1);
                sub_block(&mut sum, h, half, 2);
                sub_block(&mut sum, h, half, 3);
            }
        }
        // The +32: rows' (sc_2k, sc_2k+1) times the activation's broadcast
        // pair of 16-sums.
        let scales: [__m256i; 8] =
            std::array::from_fn(|k| pair_i8(p.add(16 + 16 * k), p.add(24 + 16 * k)));
        for i in 0..NR {
            let offset = pair_sums(&scales, x[i].bs.add(16 * blk));
            let exact = _mm256_sub_epi32(sum[i], _mm256_slli_epi32(offset, 5));
            let dx = _mm256_set1_ps(*x[i].d.add(blk));
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(exact), _mm256_mul_ps(d, dx), acc[i]);
        }
    }
    acc
}

/// The outputs of two packed Q6_K groups (`a`: lanes 0..8, `b`: 8..16) for
/// each activation row, one i32 lane per weight row.
///
/// Float sequence (its own, not the ggml-layout kernels'): per super-block,
/// the exact integer `sum_s sc_s sum_t (q_t - 32) x_t` over all 256 values,
/// then `acc = fma(sum, d * dx, acc)`. Each sub-block's 16 products come
/// from four `vpdpbusd` started at `-32 * bsum_s` (the quants are stored
/// +32) and are scaled by `vpmulld`: 7 instructions per (sub-block,
/// activation row, 16 weight rows) where the two-rows-per-vector kernel
/// takes 24. The sums are exact in i32 (|each| < 2^28 per super-block).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn q6_k_group16<const NR: usize>(
    a: *const u8,
    b: *const u8,
    stride: usize,
    nb: usize,
    x: &[Act; NR],
) -> [__m512; NR] {
    let mut acc = [_mm512_setzero_ps(); NR];
    let low4 = _mm512_set1_epi8(0x0F);
    let bits45 = _mm512_set1_epi8(0x30);
    for blk in 0..nb {
        let (pa, pb) = (a.add(blk * stride), b.add(blk * stride));
        let d = both_f16(pa, pb, 0);
        let mut sum = [_mm512_setzero_si512(); NR];
        for h in 0..2 {
            for half in 0..2 {
                // Values 128h + 32c + 16 half + 4m' + t (m = 4 half + m'):
                // quarter c of word m's low (c even) or high (c odd) nibbles
                // of `ql` and bits 2c, 2c+1 of `qh`, as in the row kernel.
                // Quarters c and c + 2 come from the same `ql` bytes, so
                // they are unpacked together: two quarters' eight vectors
                // live at a time, not all sixteen, which leaves registers
                // for four or more activation rows' sums. (Integer sums:
                // their order does not change the result.)
                for c0 in 0..2 {
                    let mut v = [[_mm512_setzero_si512(); 4]; 2];
                    for mi in 0..4 {
                        let m = 4 * half + mi;
                        let q = both32(pa, pb, Q6_QL + 32 * (16 * h + 8 * c0 + m));
                        let qh = both32(pa, pb, Q6_QH + 32 * (8 * h + m));
                        let hi2 = |v: __m512i| _mm512_and_si512(v, bits45);
                        // Bits 2c, 2c + 1 of qh to bits 4, 5: c = c0 and c0 + 2.
                        let (near, far) = if c0 == 0 {
                            (_mm512_slli_epi16(qh, 4), qh)
                        } else {
                            (_mm512_slli_epi16(qh, 2), _mm512_srli_epi16(qh, 2))
                        };
                        v[0][mi] = _mm512_or_si512(_mm512_and_si512(q, low4), hi2(near));
                        v[1][mi] = _mm512_or_si512(
                            _mm512_and_si512(_mm512_srli_epi16(q, 4), low4),
                            hi2(far),
                        );
                    }
                    for (pair, vc) in v.iter().enumerate() {
                        // Sixteen requests a block, one per step: with four
                        // (one per half) the head of Qwen2.5-Coder-1.5B
                        // streamed at 22 GB/s on one Zen 4 core, with
                        // sixteen at 27-29 (32: slower again).
                        prefetch_ahead(pa, stride, 8 * h + 4 * half + 2 * c0 + pair, 16);
                        let c = c0 + 2 * pair;
                        let sub = 8 * h + 2 * c + half;
                        // The rows' i8 scales, sign-extended to their lanes.
                        let scale = _mm512_cvtepi8_epi32(both8(pa, pb, 16 + 8 * sub));
                        for i in 0..NR {
                            let bsum = *x[i].bs.add(16 * blk + sub) as i32;
                            let mut s = _mm512_set1_epi32(-32 * bsum);
                            let xp = x[i].qs.add(256 * blk + 128 * h + 32 * c + 16 * half);
                            for (mi, vm) in vc.iter().enumerate() {
                                let x4 = (xp.add(4 * mi) as *const i32).read_unaligned();
                                s = _mm512_dpbusd_epi32(s, *vm, _mm512_set1_epi32(x4));
                            }
                            sum[i] = _mm512_add_epi32(sum[i], _mm512_mullo_epi32(s, scale));
                        }
                    }
                }
            }
        }
        for i in 0..NR {
            let dx = _mm512_set1_ps(*x[i].d.add(blk));
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[i]), _mm512_mul_ps(d, dx), acc[i]);
        }
    }
    acc
}

/// The 32-value block types with one scale per block, packed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Block32 {
    Q4_0,
    Q4_1,
    Q5_0,
    Q8_0,
    Iq4Nl,
}

/// A [`Block32`] type as a type parameter, so that each type's kernel is
/// compiled for it: passed as a value, one body served all five (it was
/// not inlined), with the type's branches and a prefetch loop of a
/// runtime length in every block.
trait Block32Kind {
    const TY: Block32;
}

/// One [`Block32Kind`] per [`Block32`] type, of the same name.
mod kind {
    use super::{Block32, Block32Kind};
    macro_rules! kinds {
        ($($name:ident),*) => {$(
            #[allow(non_camel_case_types)]
            pub(super) struct $name;
            impl Block32Kind for $name {
                const TY: Block32 = Block32::$name;
            }
        )*};
    }
    kinds!(Q4_0, Q4_1, Q5_0, Q8_0, Iq4Nl);
}

/// The outputs of two packed groups (`a`: lanes 0..8, `b`: 8..16) of a
/// [`Block32`] type for each activation row, one i32 lane per weight row.
///
/// Float sequence: per block, the exact integer dot `sum_t q_t x_t` of the
/// block's signed values, then `acc = fma(sum, d * dx, acc)` — llama.cpp's
/// repacked Q4_0 sequence, so packed Q4_0 gives its AVX2 kernel's results
/// bit for bit; for Q4_1, Q5_0 and Q8_0 this sequence is the fast
/// kernels' own ([`layout`]'s `fast`; by default they follow llama.cpp's
/// eight lanes, [`block32_lanes_group`]).
/// Q4_1's mins go as in llama.cpp, `acc_min = fma(m, s_x, acc_min)` per
/// block (`s_x` its activation block's stored sum), added at the end. The
/// values go to `vpdpbusd` unsigned, stored + 8 (Q4_0), + 16 (Q5_0) or
/// made so (+ 128, Q8_0; IQ4_NL's nibbles look up their grid value + 128),
/// the offset taken off with the block's sum of activation quants: eight
/// instructions per (block, activation row, 16 weight rows).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn block32_group16<T: Block32Kind, const NR: usize>(
    a: *const u8,
    b: *const u8,
    stride: usize,
    nb: usize,
    x: &[Act; NR],
) -> [__m512; NR] {
    let ty = T::TY;
    let offset = match ty {
        Block32::Q4_0 => 8,
        Block32::Q4_1 => 0,
        Block32::Q5_0 => 16,
        Block32::Q8_0 | Block32::Iq4Nl => 128,
    };
    // IQ4_NL: its grid + 128 (the values as `vpdpbusd` takes them) in each
    // 128-bit lane, for `vpshufb` to index by nibble.
    let grid = blockdraft_gguf::quants::iquants::KVALUES.map(|v| (v as u8) ^ 0x80);
    let grid = _mm512_broadcast_i32x4(_mm_loadu_si128(grid.as_ptr() as *const __m128i));
    let mut acc = [_mm512_setzero_ps(); NR];
    let mut acc_min = [_mm512_setzero_ps(); NR];
    let sign = _mm512_set1_epi8(-128);
    for blk in 0..nb {
        let (pa, pb) = (a.add(blk * stride), b.add(blk * stride));
        prefetch_ahead(pa, stride, 0, 1);
        let d = both_f16(pa, pb, 0);
        let mut q = block32_values16(ty, pa, pb);
        match ty {
            Block32::Q8_0 => q = q.map(|v| _mm512_xor_si512(v, sign)),
            Block32::Iq4Nl => q = q.map(|v| _mm512_shuffle_epi8(grid, v)),
            Block32::Q4_0 | Block32::Q4_1 | Block32::Q5_0 => {}
        }
        for i in 0..NR {
            let xp = x[i].qs.add(32 * blk);
            let mut s = _mm512_set1_epi32(-offset * *x[i].b32.add(blk) as i32);
            for (k, &qk) in q.iter().enumerate() {
                let x4 = (xp.add(4 * k) as *const i32).read_unaligned();
                s = _mm512_dpbusd_epi32(s, qk, _mm512_set1_epi32(x4));
            }
            let dx = _mm512_set1_ps(*x[i].d.add(blk));
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d, dx), acc[i]);
        }
        if ty == Block32::Q4_1 {
            let m = both_f16(pa, pb, 16);
            for i in 0..NR {
                let s = _mm512_set1_ps(*x[i].s.add(blk));
                acc_min[i] = _mm512_fmadd_ps(m, s, acc_min[i]);
            }
        }
    }
    match ty {
        Block32::Q4_1 => std::array::from_fn(|i| _mm512_add_ps(acc[i], acc_min[i])),
        _ => acc,
    }
}

/// The values of one block of two packed groups of a [`Block32`] type
/// (`pa`, `pb`: the block in each, lanes 0..8 and 8..16) as stored, one
/// vector per four values: `q[k]` holds values `4k..4k+4` of each row in
/// its lane. Q8_0's are its signed bytes, the others' unsigned: the nibbles
/// (IQ4_NL's grid indices) and Q5_0's nibbles plus 16 times its fifth bits.
#[target_feature(enable = "avx2,avx512f,avx512bw")]
#[inline]
unsafe fn block32_values16(ty: Block32, pa: *const u8, pb: *const u8) -> [__m512i; 8] {
    if ty == Block32::Q8_0 {
        return std::array::from_fn(|k| both32(pa, pb, ty.quants_at() + 32 * k));
    }
    let mut q = nibbles16(pa, pb, ty.quants_at());
    if ty == Block32::Q5_0 {
        let sixteen = _mm512_set1_epi8(0x10);
        for (qk, high) in q.iter_mut().zip(q5_0_fifth_bits16(pa, pb, false)) {
            *qk = _mm512_mask_add_epi8(*qk, high, *qk, sixteen);
        }
    }
    q
}

/// The nibbles of one block of two packed groups (`pa`, `pb`: the block
/// in each), 32 bytes per quarter at `at`, as [`block32_values16`] lays
/// out values.
#[target_feature(enable = "avx2,avx512f,avx512bw")]
#[inline]
unsafe fn nibbles16(pa: *const u8, pb: *const u8, at: usize) -> [__m512i; 8] {
    let low4 = _mm512_set1_epi8(0x0F);
    let mut q = [_mm512_setzero_si512(); 8];
    for c in 0..4 {
        let v = both32(pa, pb, at + 32 * c);
        q[c] = _mm512_and_si512(v, low4);
        q[4 + c] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
    }
    q
}

/// Where the values of one block of two packed Q5_0 groups (as in
/// [`block32_values16`]) have their fifth bit set (`clear`: not set), one
/// byte mask per vector of four values.
#[target_feature(enable = "avx2,avx512f,avx512bw")]
#[inline]
unsafe fn q5_0_fifth_bits16(pa: *const u8, pb: *const u8, clear: bool) -> [__mmask64; 8] {
    // Byte c of a row's word to its lane's four bytes, then bit t (low
    // nibbles) or 4 + t (high) of byte t.
    let bits = both32(pa, pb, 16);
    let test = |v, m| {
        if clear {
            _mm512_testn_epi8_mask(v, m)
        } else {
            _mm512_test_epi8_mask(v, m)
        }
    };
    let mut masks = [0; 8];
    for c in 0..4 {
        // Byte 4j + c for the four bytes of dword j of each 128-bit lane
        // (vpshufb indexes within the lane).
        let idx = _mm512_add_epi8(
            _mm512_set4_epi32(0x0C0C_0C0C, 0x0808_0808, 0x0404_0404, 0),
            _mm512_set1_epi8(c as i8),
        );
        let spread = _mm512_shuffle_epi8(bits, idx);
        masks[c] = test(spread, _mm512_set1_epi32(0x0804_0201));
        masks[4 + c] = test(spread, _mm512_set1_epi32(0x8040_2010u32 as i32));
    }
    masks
}

/// [`block32_lanes_group`] for two groups at once (`a`: lanes 0..8, `b`:
/// 8..16): llama.cpp's eight float lanes per output, each lane's exact
/// integer sum from one `vpdpbusd` per (lane, activation row, 16 weight
/// rows) where AVX2 takes `vpsignb`, `maddubs` and `madd` per 8, and the
/// same float steps, so the results are bit-identical. Signed values go in
/// as their magnitudes, with the activation bytes negated where the value
/// is negative (a mask per lane, shared by the rows: AVX-512 has no
/// `vpsignb`). The rows go [`LANES_ROWS`] at a time, so that their
/// accumulators stay in registers.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn block32_lanes_group16<T: Block32Kind, const NR: usize>(
    a: *const u8,
    b: *const u8,
    stride: usize,
    nb: usize,
    x: &[Act; NR],
) -> [__m512; NR] {
    let mut out = [_mm512_setzero_ps(); NR];
    let mut i0 = 0;
    while i0 + LANES_ROWS <= NR {
        let xs: &[Act; LANES_ROWS] = x[i0..i0 + LANES_ROWS].try_into().unwrap_unchecked();
        let r = block32_lanes_rows16::<T, LANES_ROWS>(a, b, stride, nb, xs);
        out[i0..i0 + LANES_ROWS].copy_from_slice(&r);
        i0 += LANES_ROWS;
    }
    while i0 < NR {
        let r = block32_lanes_rows16::<T, 1>(a, b, stride, nb, &[x[i0]]);
        out[i0] = r[0];
        i0 += 1;
    }
    out
}

/// Activation rows per pass of [`block32_lanes_group16`] over a pair of
/// groups: eight accumulators each, so four fill the 32 vector registers
/// with the unpacked block beside them; the block is unpacked again for
/// each pass (from L1 or L2). On one core of an AVX-512 Xeon (896 x 4864
/// and 151936 x 896, unpaired runs), eight rows ran 1.05-2x as fast as in
/// one pass and 1.15-1.5x as fast as two rows per pass.
const LANES_ROWS: usize = 4;

/// [`block32_lanes_group16`] for up to [`LANES_ROWS`] activation rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn block32_lanes_rows16<T: Block32Kind, const NR: usize>(
    a: *const u8,
    b: *const u8,
    stride: usize,
    nb: usize,
    x: &[Act; NR],
) -> [__m512; NR] {
    let ty = T::TY;
    debug_assert!(ty.eight_lanes());
    let signed = ty != Block32::Q4_1;
    let sixteen = _mm512_set1_epi8(0x10);
    let zero = _mm512_setzero_si512();
    let mut acc = [[_mm512_setzero_ps(); 8]; NR];
    let mut summs = [_mm512_setzero_ps(); NR];
    for blk in 0..nb {
        let (pa, pb) = (a.add(blk * stride), b.add(blk * stride));
        prefetch_ahead(pa, stride, 0, 1);
        let dw = both_f16(pa, pb, 0);
        // Signed values (Q5_0 as stored - 16, Q8_0) as their magnitudes and
        // where they are negative.
        let (magnitude, negative) = match ty {
            Block32::Q5_0 => {
                // Values with the fifth bit clear are the negative ones,
                // 16 - nibble in magnitude; the others are their nibble.
                let negative = q5_0_fifth_bits16(pa, pb, true);
                let mut q = nibbles16(pa, pb, ty.quants_at());
                for (qk, &n) in q.iter_mut().zip(&negative) {
                    *qk = _mm512_mask_sub_epi8(*qk, n, sixteen, *qk);
                }
                (q, negative)
            }
            _ => {
                let q = block32_values16(ty, pa, pb);
                let magnitude = if signed {
                    q.map(|v| _mm512_abs_epi8(v))
                } else {
                    q
                };
                (magnitude, q.map(|v| _mm512_movepi8_mask(v)))
            }
        };
        let m = if ty == Block32::Q4_1 {
            both_f16(pa, pb, 16)
        } else {
            _mm512_setzero_ps()
        };
        for i in 0..NR {
            let xp = x[i].qs.add(32 * blk);
            let d = _mm512_mul_ps(dw, _mm512_set1_ps(*x[i].d.add(blk)));
            for k in 0..8 {
                let x4 = _mm512_set1_epi32((xp.add(4 * k) as *const i32).read_unaligned());
                let xs = if signed {
                    _mm512_mask_sub_epi8(x4, negative[k], zero, x4)
                } else {
                    x4
                };
                let lanes = _mm512_dpbusd_epi32(zero, magnitude[k], xs);
                acc[i][k] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(lanes), acc[i][k]);
            }
            if ty == Block32::Q4_1 {
                summs[i] = _mm512_fmadd_ps(m, _mm512_set1_ps(*x[i].s.add(blk)), summs[i]);
            }
        }
    }
    // `block32_lanes_group`'s tree.
    std::array::from_fn(|i| {
        let a = &acc[i];
        let s: [__m512; 4] = std::array::from_fn(|j| _mm512_add_ps(a[j], a[j + 4]));
        let even = _mm512_add_ps(s[0], s[2]);
        let odd = _mm512_add_ps(s[1], s[3]);
        _mm512_add_ps(_mm512_add_ps(even, odd), summs[i])
    })
}

impl Block32 {
    /// Bytes of one packed block of a group (the `*_GROUP_BLOCK` layouts).
    fn group_block_bytes(self) -> usize {
        match self {
            Block32::Q4_0 | Block32::Iq4Nl => Q4_0_GROUP_BLOCK,
            Block32::Q4_1 => Q4_1_GROUP_BLOCK,
            Block32::Q5_0 => Q5_0_GROUP_BLOCK,
            Block32::Q8_0 => Q8_0_GROUP_BLOCK,
        }
    }

    /// llama.cpp runs this type unpacked (its `vec_dot`, eight float lanes
    /// per output), so the default packed kernel follows that sequence
    /// ([`block32_lanes_group`]; the fast kernels take [`block32_group`]'s);
    /// it repacks Q4_0 and IQ4_NL, whose sequence [`block32_group`]
    /// follows.
    const fn eight_lanes(self) -> bool {
        matches!(self, Block32::Q4_1 | Block32::Q5_0 | Block32::Q8_0)
    }

    /// Where a packed block's quants start (after the scales, Q4_1's mins
    /// and Q5_0's fifth bits): 32 bytes per quarter (nibbles) or word.
    fn quants_at(self) -> usize {
        match self {
            Block32::Q4_0 | Block32::Iq4Nl | Block32::Q8_0 => 16,
            Block32::Q4_1 => 32,
            Block32::Q5_0 => 48,
        }
    }
}

/// [`block32_group16`] on AVX2, for one packed group: the same exact
/// integer dot per block and the same float steps, so the results are
/// bit-identical.
///
/// The integer dots: `maddubs` multiplies unsigned by signed bytes into
/// saturating i16 pairs, so each type sums only what cannot overflow.
/// Q4_0 and Q4_1 (values as stored, 0..=15): all eight `maddubs` of a
/// block in i16 (|sum| <= 8 * 2 * 15 * 127), then one `madd`. Q5_0
/// (0..=31): four at a time, two `madd`s. Q8_0 and IQ4_NL (signed): the
/// value's magnitude times the activation with the value's sign, one
/// `madd` each (|pair| <= 2 * 128 * 127). The stored offset (+8 Q4_0, +16
/// Q5_0) comes off with the block's sum of activation quants, as there.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn block32_group<T: Block32Kind, const NR: usize>(
    w: *const u8,
    nb: usize,
    x: &[Act; NR],
) -> [__m256; NR] {
    let ty = T::TY;
    let offset = match ty {
        Block32::Q4_0 => 8,
        Block32::Q5_0 => 16,
        Block32::Q4_1 | Block32::Q8_0 | Block32::Iq4Nl => 0,
    };
    let signed = matches!(ty, Block32::Q8_0 | Block32::Iq4Nl);
    let grid = _mm256_broadcastsi128_si256(_mm_loadu_si128(
        blockdraft_gguf::quants::iquants::KVALUES.as_ptr() as *const __m128i,
    ));
    let ones = _mm256_set1_epi16(1);
    let block_bytes = ty.group_block_bytes();
    let mut acc = [_mm256_setzero_ps(); NR];
    // Q4_1's mins, a chain of their own: beside the dots for one or two
    // activation rows; for more, in a loop after them, so that their
    // accumulators leave the registers to the dots (the group's blocks are
    // still in L1 or L2 then): 13 % faster at 4 rows, 15 % slower at 1.
    let mut acc_min = [_mm256_setzero_ps(); NR];
    let mins_apart = NR > 2;
    let add_mins = |acc_min: &mut [__m256; NR], b: usize| {
        let m = _mm256_cvtph_ps(_mm_loadu_si128(
            w.add(b * block_bytes + 16) as *const __m128i
        ));
        for i in 0..NR {
            acc_min[i] = _mm256_fmadd_ps(m, _mm256_set1_ps(*x[i].s.add(b)), acc_min[i]);
        }
    };
    for b in 0..nb {
        let blk = w.add(b * block_bytes);
        prefetch_ahead(blk, block_bytes, 0, 1);
        let d = _mm256_cvtph_ps(_mm_loadu_si128(blk as *const __m128i));
        // q[k]: values 4k..4k+4 of each row, in its lane.
        let quants = blk.add(ty.quants_at());
        let mut q = match ty {
            Block32::Q8_0 => {
                std::array::from_fn(|k| _mm256_loadu_si256(quants.add(32 * k) as *const __m256i))
            }
            Block32::Q4_0 | Block32::Q4_1 | Block32::Q5_0 | Block32::Iq4Nl => unpack_block(quants),
        };
        if ty == Block32::Iq4Nl {
            for qk in q.iter_mut() {
                *qk = _mm256_shuffle_epi8(grid, *qk);
            }
        }
        if ty == Block32::Q5_0 {
            or_fifth_bits(&mut q, blk.add(16));
        }
        // Signed values: their magnitudes, shared by every activation row.
        let magnitude: [__m256i; 8] = if signed {
            std::array::from_fn(|k| _mm256_abs_epi8(q[k]))
        } else {
            q
        };
        for i in 0..NR {
            let xp = x[i].qs.add(32 * b);
            let dot = if signed {
                let mut s = _mm256_setzero_si256();
                for k in 0..8 {
                    let xs = _mm256_sign_epi8(x4(xp.add(4 * k)), q[k]);
                    let p = _mm256_maddubs_epi16(magnitude[k], xs);
                    s = _mm256_add_epi32(s, _mm256_madd_epi16(p, ones));
                }
                s
            } else if ty == Block32::Q5_0 {
                let half = |h: usize| {
                    let mut p = _mm256_setzero_si256();
                    for (k, &qk) in q.iter().enumerate().skip(4 * h).take(4) {
                        p = _mm256_add_epi16(p, _mm256_maddubs_epi16(qk, x4(xp.add(4 * k))));
                    }
                    _mm256_madd_epi16(p, ones)
                };
                _mm256_add_epi32(half(0), half(1))
            } else {
                _mm256_madd_epi16(block_pairs(&q, xp), ones)
            };
            let sum_x = _mm256_set1_epi32(offset * *x[i].b32.add(b) as i32);
            let sum = _mm256_sub_epi32(dot, sum_x);
            let dx = _mm256_set1_ps(*x[i].d.add(b));
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(d, dx), acc[i]);
        }
        if ty == Block32::Q4_1 && !mins_apart {
            add_mins(&mut acc_min, b);
        }
    }
    if ty != Block32::Q4_1 {
        return acc;
    }
    if mins_apart {
        for b in 0..nb {
            add_mins(&mut acc_min, b);
        }
    }
    std::array::from_fn(|i| _mm256_add_ps(acc[i], acc_min[i]))
}

/// The eight outputs of one packed group of a [`Block32`] type that
/// llama.cpp does not repack (Q4_1, Q5_0, Q8_0: [`Block32::eight_lanes`]),
/// for each activation row, in the float sequence of its AVX2 `vec_dot`
/// (`x86::kernel_32`), so the results equal the ggml-layout kernel's (and
/// llama.cpp's) bit for bit.
///
/// llama.cpp keeps eight float lanes per output: lane k takes the integer
/// sum of values `4k..4k+4` of each block, `acc_k = fma(d_w * d_x, sum_k,
/// acc_k)`, and the output is their `hsum` (plus Q4_1's mins, `summs =
/// fma(m, s_x, summs)` per block). Packed vector k holds exactly those
/// four values for every row, so lane k of every row is one `maddubs` and
/// one `madd` per block; the cost over one sum per block is a conversion
/// and an FMA per lane instead of one per block.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn block32_lanes_group<T: Block32Kind, const NR: usize>(
    w: *const u8,
    nb: usize,
    x: &[Act; NR],
) -> [__m256; NR] {
    let ty = T::TY;
    debug_assert!(ty.eight_lanes());
    let ones = _mm256_set1_epi16(1);
    let block_bytes = ty.group_block_bytes();
    let mut acc = [[_mm256_setzero_ps(); 8]; NR];
    let mut summs = [_mm256_setzero_ps(); NR];
    for b in 0..nb {
        let blk = w.add(b * block_bytes);
        prefetch_ahead(blk, block_bytes, 0, 1);
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(blk as *const __m128i));
        let quants = blk.add(ty.quants_at());
        // q[k]: values 4k..4k+4 of each row, in its lane; signed for Q5_0
        // and Q8_0, as llama.cpp takes them.
        let q: [__m256i; 8] = match ty {
            Block32::Q8_0 => {
                std::array::from_fn(|k| _mm256_loadu_si256(quants.add(32 * k) as *const __m256i))
            }
            Block32::Q5_0 => {
                let mut q = unpack_block(quants);
                or_fifth_bits(&mut q, blk.add(16));
                q.map(|v| _mm256_sub_epi8(v, _mm256_set1_epi8(16)))
            }
            _ => unpack_block(quants),
        };
        let signed = ty != Block32::Q4_1;
        // Signed values: their magnitudes, shared by every activation row.
        let magnitude = if signed {
            q.map(|v| _mm256_sign_epi8(v, v))
        } else {
            q
        };
        let m = if ty == Block32::Q4_1 {
            _mm256_cvtph_ps(_mm_loadu_si128(blk.add(16) as *const __m128i))
        } else {
            _mm256_setzero_ps()
        };
        for i in 0..NR {
            let xp = x[i].qs.add(32 * b);
            let d = _mm256_mul_ps(dw, _mm256_set1_ps(*x[i].d.add(b)));
            for k in 0..8 {
                let xs = if signed {
                    _mm256_sign_epi8(x4(xp.add(4 * k)), q[k])
                } else {
                    x4(xp.add(4 * k))
                };
                let lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude[k], xs), ones);
                acc[i][k] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), acc[i][k]);
            }
            if ty == Block32::Q4_1 {
                summs[i] = _mm256_fmadd_ps(m, _mm256_set1_ps(*x[i].s.add(b)), summs[i]);
            }
        }
    }
    // `x86::hsum`'s tree, lane by lane: (l0 + l4) + (l2 + l6), then
    // (l1 + l5) + (l3 + l7), and their sum.
    std::array::from_fn(|i| {
        let a = &acc[i];
        let s: [__m256; 4] = std::array::from_fn(|j| _mm256_add_ps(a[j], a[j + 4]));
        let even = _mm256_add_ps(s[0], s[2]);
        let odd = _mm256_add_ps(s[1], s[3]);
        _mm256_add_ps(_mm256_add_ps(even, odd), summs[i])
    })
}
