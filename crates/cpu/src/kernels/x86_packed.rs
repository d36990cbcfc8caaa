//! Q4_K weights re-laid out eight rows at a time, and their AVX2 kernel.
//!
//! In ggml's layout one 32-byte vector holds 64 values of one weight row, so
//! every 32-value sub-block (which has its own scale) costs one `maddubs`
//! and one `madd` per activation row, and each output needs a horizontal
//! sum. Here a vector holds four values of each of eight rows (one i32 lane
//! per row), with the activation's four values broadcast to every lane: the
//! eight `maddubs` of a sub-block add up exactly in i16 before one `madd`
//! applies the eight rows' scales, and lane r ends as output r, with no
//! horizontal sum. That is 9 multiply instructions per (weight row,
//! activation row, super-block) instead of 17, which is what makes a verify
//! batch of 8 rows cheap.
//!
//! The integer sums per super-block are the same exact values as the row
//! kernel's, and the float steps per output are the same (`fma(sum, d * dx,
//! acc)`, `fma(sum_min, dmin * dx, acc_min)`, `acc - acc_min`), so results
//! are bit-identical to `x86::q4_k`.

use super::x86::k4_scales;
use super::Act;
use std::arch::x86_64::*;

/// Bytes of one super-block of eight rows:
/// - `0..16`: the rows' `d` (f16), row r at `2r`;
/// - `16..32`: the rows' `dmin` (f16);
/// - `32..96`: scales, `32 + 8j + r` = row r's scale of sub-block j;
/// - `96..160`: mins, laid out like the scales;
/// - `160..1184`: quants, 32 bytes per (sub-block j, quarter c) at
///   `160 + 32 (4j + c)`; byte `4r + t` holds row r's value `32j + 4c + t`
///   in its low nibble and value `32j + 16 + 4c + t` in its high nibble.
pub(crate) const GROUP_BLOCK_BYTES: usize = 1184;
/// Rows per group.
pub(crate) const GROUP_ROWS: usize = 8;
const QS: usize = 160;

/// Re-lays out rows `8g..8g + 8` of a Q4_K matrix (`nb` super-blocks per
/// row, `row_bytes` = 144 `nb`) into `out` (`nb * GROUP_BLOCK_BYTES` bytes).
pub(crate) fn pack_group(src: &[u8], nb: usize, out: &mut [u8]) {
    let row_bytes = nb * 144;
    assert!(src.len() >= GROUP_ROWS * row_bytes && out.len() == nb * GROUP_BLOCK_BYTES);
    for b in 0..nb {
        let dst = &mut out[b * GROUP_BLOCK_BYTES..(b + 1) * GROUP_BLOCK_BYTES];
        for r in 0..GROUP_ROWS {
            let blk = &src[r * row_bytes + b * 144..r * row_bytes + (b + 1) * 144];
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
        }
    }
}

/// The kernel over packed groups: `w` points at a group, `row_bytes` is the
/// packed bytes per row (`nb * GROUP_BLOCK_BYTES / 8`) and `nw` a multiple
/// of 8; see [`super::Kernel`] for the rest.
pub(crate) unsafe fn q4_k_x8(
    w: *const u8,
    row_bytes: usize,
    nw: usize,
    nb: usize,
    x: &[Act],
    out: *mut f32,
    ldo: usize,
) {
    debug_assert_eq!(nw % GROUP_ROWS, 0);
    match x.len() {
        1 => groups::<1>(w, row_bytes, nw, nb, x, out, ldo),
        2 => groups::<2>(w, row_bytes, nw, nb, x, out, ldo),
        3 => groups::<3>(w, row_bytes, nw, nb, x, out, ldo),
        4 => groups::<4>(w, row_bytes, nw, nb, x, out, ldo),
        5 => groups::<5>(w, row_bytes, nw, nb, x, out, ldo),
        6 => groups::<6>(w, row_bytes, nw, nb, x, out, ldo),
        7 => groups::<7>(w, row_bytes, nw, nb, x, out, ldo),
        _ => groups::<8>(w, row_bytes, nw, nb, x, out, ldo),
    }
}

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
    let x: &[Act; NR] = x.try_into().unwrap_unchecked();
    for g in 0..nw / GROUP_ROWS {
        let r = group::<NR>(w.add(g * GROUP_ROWS * row_bytes), nb, x);
        for (i, v) in r.iter().enumerate() {
            _mm256_storeu_ps(out.add(i * ldo + g * GROUP_ROWS), *v);
        }
    }
}

/// The eight outputs (lanes) of one group for each activation row.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn group<const NR: usize>(w: *const u8, nb: usize, x: &[Act; NR]) -> [__m256; NR] {
    let low4 = _mm256_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); NR];
    let mut acc_min = [_mm256_setzero_ps(); NR];
    // Four activation values broadcast to every row's lane.
    let x4 = |p: *const i8| _mm256_set1_epi32((p as *const i32).read_unaligned());
    // Eight u8 (one per row) as i16 pairs [v, v] in the rows' i32 lanes.
    let dup = |p: *const u8| {
        let v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i));
        _mm256_or_si256(v, _mm256_slli_epi32(v, 16))
    };
    for b in 0..nb {
        let blk = w.add(b * GROUP_BLOCK_BYTES);
        let d = _mm256_cvtph_ps(_mm_loadu_si128(blk as *const __m128i));
        let dmin = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(16) as *const __m128i));
        let mut sum = [_mm256_setzero_si256(); NR];
        for j in 0..8 {
            let scale = dup(blk.add(32 + 8 * j));
            let mut q = [_mm256_setzero_si256(); 8];
            for c in 0..4 {
                let v = _mm256_loadu_si256(blk.add(QS + 32 * (4 * j + c)) as *const __m256i);
                q[c] = _mm256_and_si256(v, low4);
                q[4 + c] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
            }
            for i in 0..NR {
                let xp = x[i].qs.add(256 * b + 32 * j);
                // |each i16| <= 2 * 15 * 127, so the eight add exactly.
                let mut p = _mm256_maddubs_epi16(q[0], x4(xp));
                for (k, &qk) in q.iter().enumerate().skip(1) {
                    let off = if k < 4 { 4 * k } else { 16 + 4 * (k - 4) };
                    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(qk, x4(xp.add(off))));
                }
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
            let pairs = x[i].b32.add(8 * b) as *const i32;
            let mut msum = _mm256_setzero_si256();
            for (k, &m) in mins.iter().enumerate() {
                let bs = _mm256_set1_epi32(pairs.add(k).read_unaligned());
                msum = _mm256_add_epi32(msum, _mm256_madd_epi16(m, bs));
            }
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
