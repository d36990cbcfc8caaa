// GGUF quantized blocks, read in place from the weight binding (which the
// including file declares as `w: array<u32>`). Pulled in with
// `#include "quant_blocks.wgsl"` after common.wgsl.
//
// Block sizes are not multiples of 4 bytes (Q4_0 is 18, Q3_K 110, ...), so
// every read is by byte offset, assembled from the surrounding words.
//
// Every type is decoded in units of 32 values: one block of the legacy
// types (and MXFP4), one eighth of a 256-value super-block, half an NVFP4
// block. A unit's quants fit in i8 for every type (offsets such as -8 or -32
// already applied, the non-linear types' grid values looked up, signs
// applied), so they come out packed four per u32 like the quantized
// activations, with the scales that turn integer dots into floats. The
// formulas mirror the CPU backend's (crates/cpu/src/kernels/scalar.rs,
// lattice.rs) and `blockdraft_gguf::quants`.
//
// The lattice types (IQ2_*, IQ3_*, IQ1_*) index grids of 256 to 2048 rows,
// too large to write out here: weights.rs appends the type's grid
// (`blockdraft_gguf::quants::grids`) to each weight part's buffer, after
// its rows rounded up to a word, and the decoders read it from there
// (`grid_at`), so no binding is added.

const Q4_0: u32 = 0u;
const Q4_1: u32 = 1u;
const Q5_0: u32 = 2u;
const Q5_1: u32 = 3u;
const Q8_0: u32 = 4u;
const Q8_1: u32 = 5u;
const Q2_K: u32 = 6u;
const Q3_K: u32 = 7u;
const Q4_K: u32 = 8u;
const Q5_K: u32 = 9u;
const Q6_K: u32 = 10u;
const Q8_K: u32 = 11u;
const IQ4_NL: u32 = 12u;
const IQ4_XS: u32 = 13u;
const IQ2_XXS: u32 = 14u;
const IQ2_XS: u32 = 15u;
const IQ2_S: u32 = 16u;
const IQ3_XXS: u32 = 17u;
const IQ3_S: u32 = 18u;
const IQ1_S: u32 = 19u;
const IQ1_M: u32 = 20u;
const TQ1_0: u32 = 21u;
const TQ2_0: u32 = 22u;
const MXFP4: u32 = 23u;
const NVFP4: u32 = 24u;

// The signed values IQ4_NL / IQ4_XS nibbles index (ggml's kvalues_iq4nl).
var<private> IQ4_GRID: array<i32, 16> = array<i32, 16>(
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);

// The E2M1 values MXFP4 / NVFP4 nibbles stand for, doubled to integers
// (ggml's kvalues_mxfp4; the block scales carry the half).
var<private> FP4_GRID: array<i32, 16> = array<i32, 16>(
    0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);

// 32 decoded values and their scales: value k is
//   (wd * (k < 16 ? ka : kb)) * q[k] - wmin * (k < 16 ? ma : mb) + wm.
// Integer sub-block scales (ka, kb) and mins (ma, mb) are 1 and 0 for the
// legacy types; wmin is 0 without a min, wm is 0 without an offset. NVFP4
// alone scales values 16..31 by a float of their own, wdb (`has_split_scale`).
struct Unit {
    q: array<u32, 8>,
    ka: i32,
    kb: i32,
    ma: i32,
    mb: i32,
    wd: f32,
    wdb: f32,
    wmin: f32,
    wm: f32,
}

// Types of 256-value super-blocks (eight units each), whose activations are
// Q8_K: the K-quants, IQ4_XS, the lattice and the ternary types.
fn is_k_quant(ty: u32) -> bool {
    return (ty >= Q2_K && ty <= Q8_K) || ty == IQ4_XS || (ty >= IQ2_XXS && ty <= TQ2_0);
}

// NVFP4: each 16 values of a unit have their own E4M3 scale (wd, wdb).
fn has_split_scale(ty: u32) -> bool {
    return ty == NVFP4;
}

// Types whose value has a min term subtracted (integer mins times dmin).
fn has_min(ty: u32) -> bool {
    return ty == Q2_K || ty == Q4_K || ty == Q5_K;
}

// Types whose value has a float offset added (legacy `m`).
fn has_offset(ty: u32) -> bool {
    return ty == Q4_1 || ty == Q5_1;
}

fn block_bytes(ty: u32) -> u32 {
    switch ty {
        case 0u: { return 18u; }
        case 1u: { return 20u; }
        case 2u: { return 22u; }
        case 3u: { return 24u; }
        case 4u: { return 34u; }
        case 5u: { return 36u; }
        case 6u: { return 84u; }
        case 7u: { return 110u; }
        case 8u: { return 144u; }
        case 9u: { return 176u; }
        case 10u: { return 210u; }
        case 12u: { return 18u; }
        case 13u: { return 136u; }
        case 14u: { return 66u; }
        case 15u: { return 74u; }
        case 16u: { return 82u; }
        case 17u: { return 98u; }
        case 18u: { return 110u; }
        case 19u: { return 50u; }
        case 20u: { return 56u; }
        case 21u: { return 54u; }
        case 22u: { return 66u; }
        case 23u: { return 17u; }
        case 24u: { return 36u; }
        default: { return 292u; }
    }
}

fn byte_at(i: u32) -> u32 {
    return (w[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu;
}

// Four bytes from any byte offset, little-endian.
fn u32_at(i: u32) -> u32 {
    let k = i >> 2u;
    let s = (i & 3u) * 8u;
    if s == 0u {
        return w[k];
    }
    return (w[k] >> s) | (w[k + 1u] << (32u - s));
}

fn f16_at(i: u32) -> f32 {
    return f16_bits(byte_at(i) | (byte_at(i + 1u) << 8u));
}

fn sext8(b: u32) -> i32 {
    return extractBits(bitcast<i32>(b), 0u, 8u);
}

// Per-byte `v - 2^(bits-1)` for bytes holding unsigned `bits`-bit values:
// flip the top bit, then sign-extend it through the byte (no carries cross
// bytes, so the four lanes stay independent).
fn offset4(v: u32, bits: u32) -> u32 {
    let top = 0x01010101u << (bits - 1u);
    let t = v ^ top;
    let fill = (0xffu << bits) & 0xffu; // bits above `bits` in one byte
    // WGSL (Tint) requires the parentheses when mixing `|` and `*`; naga does not.
    return t | (((t & top) >> (bits - 1u)) * fill);
}

// Bits 0..3 of `x` to bit 4 of bytes 0..3 (Q5_0/Q5_1 high bits).
fn high_bits4(x: u32) -> u32 {
    return ((x & 1u) << 4u) | ((x & 2u) << 11u) | ((x & 4u) << 18u) | ((x & 8u) << 25u);
}

fn unit_default() -> Unit {
    var u: Unit;
    u.ka = 1;
    u.kb = 1;
    u.ma = 0;
    u.mb = 0;
    u.wdb = 0.0;
    u.wmin = 0.0;
    u.wm = 0.0;
    return u;
}

// Q4_0 {f16 d; u8 qs[16]}, Q4_1 {f16 d; f16 m; u8 qs[16]}: value j is the
// low nibble of byte j, value 16 + j its high nibble.
fn unit_q4(b: u32, ty: u32) -> Unit {
    var u = unit_default();
    u.wd = f16_at(b);
    var qs = b + 2u;
    if ty == Q4_1 {
        u.wm = f16_at(b + 2u);
        qs = b + 4u;
    }
    for (var k = 0u; k < 4u; k++) {
        let qw = u32_at(qs + 4u * k);
        var lo = qw & 0x0f0f0f0fu;
        var hi = (qw >> 4u) & 0x0f0f0f0fu;
        if ty == Q4_0 {
            lo = offset4(lo, 4u);
            hi = offset4(hi, 4u);
        }
        u.q[k] = lo;
        u.q[4u + k] = hi;
    }
    return u;
}

// Q5_0 {f16 d; u32 qh; u8 qs[16]}, Q5_1 {f16 d; f16 m; u32 qh; u8 qs[16]}:
// as Q4 with bit j of qh the fifth bit of value j.
fn unit_q5(b: u32, ty: u32) -> Unit {
    var u = unit_default();
    u.wd = f16_at(b);
    var o = b + 2u;
    if ty == Q5_1 {
        u.wm = f16_at(b + 2u);
        o = b + 4u;
    }
    let qh = u32_at(o);
    for (var k = 0u; k < 4u; k++) {
        let qw = u32_at(o + 4u + 4u * k);
        var lo = (qw & 0x0f0f0f0fu) | high_bits4(qh >> (4u * k));
        var hi = ((qw >> 4u) & 0x0f0f0f0fu) | high_bits4(qh >> (16u + 4u * k));
        if ty == Q5_0 {
            lo = offset4(lo, 5u);
            hi = offset4(hi, 5u);
        }
        u.q[k] = lo;
        u.q[4u + k] = hi;
    }
    return u;
}

// Q8_0 {f16 d; i8 qs[32]}, Q8_1 {f16 d; f16 s; i8 qs[32]} (s unused).
fn unit_q8(b: u32, ty: u32) -> Unit {
    var u = unit_default();
    u.wd = f16_at(b);
    var qs = b + 2u;
    if ty == Q8_1 {
        qs = b + 4u;
    }
    for (var k = 0u; k < 8u; k++) {
        u.q[k] = u32_at(qs + 4u * k);
    }
    return u;
}

// Q2_K {u8 scales[16]; u8 qs[64]; f16 d; f16 dmin}: unit j holds sub-blocks
// 2j, 2j+1: the 2-bit fields at shift 2(j%4) of bytes 32(j/4)..+32.
fn unit_q2_k(b: u32, j: u32) -> Unit {
    var u = unit_default();
    let shift = 2u * (j % 4u);
    for (var k = 0u; k < 8u; k++) {
        u.q[k] = (u32_at(b + 16u + 32u * (j / 4u) + 4u * k) >> shift) & 0x03030303u;
    }
    let s0 = byte_at(b + 2u * j);
    let s1 = byte_at(b + 2u * j + 1u);
    u.ka = i32(s0 & 15u);
    u.kb = i32(s1 & 15u);
    u.ma = i32(s0 >> 4u);
    u.mb = i32(s1 >> 4u);
    u.wd = f16_at(b + 80u);
    u.wmin = f16_at(b + 82u);
    return u;
}

// Signed 6-bit scale `is` of Q3_K's 12 packed scale bytes at `s`, minus 32.
fn q3_k_scale(s: u32, is: u32) -> i32 {
    var lo: u32;
    if is < 8u {
        lo = byte_at(s + is) & 15u;
    } else {
        lo = byte_at(s + is - 8u) >> 4u;
    }
    let hi = (byte_at(s + 8u + is % 4u) >> (2u * (is / 4u))) & 3u;
    return i32(lo | (hi << 4u)) - 32;
}

// Q3_K {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}: value k of unit j
// is its 2-bit field (as Q2_K) minus 4 unless bit 4(j/4) + j%4 of hmask[k].
fn unit_q3_k(b: u32, j: u32) -> Unit {
    var u = unit_default();
    let shift = 2u * (j % 4u);
    let hbit = 4u * (j / 4u) + j % 4u;
    for (var k = 0u; k < 8u; k++) {
        let lo = (u32_at(b + 32u + 32u * (j / 4u) + 4u * k) >> shift) & 0x03030303u;
        let h = (u32_at(b + 4u * k) >> hbit) & 0x01010101u;
        // lo + 4h is 0..7; minus 4 gives lo - (h ? 0 : 4).
        u.q[k] = offset4(lo | (h << 2u), 3u);
    }
    u.ka = q3_k_scale(b + 96u, 2u * j);
    u.kb = q3_k_scale(b + 96u, 2u * j + 1u);
    u.wd = f16_at(b + 108u);
    return u;
}

// 6-bit scale and min `j` of the 12 packed Q4_K/Q5_K bytes at `s`.
fn scale_min_k4(s: u32, j: u32) -> vec2<i32> {
    if j < 4u {
        return vec2<i32>(i32(byte_at(s + j) & 63u), i32(byte_at(s + j + 4u) & 63u));
    }
    let sc = (byte_at(s + j + 4u) & 15u) | ((byte_at(s + j - 4u) >> 6u) << 4u);
    let m = (byte_at(s + j + 4u) >> 4u) | ((byte_at(s + j) >> 6u) << 4u);
    return vec2<i32>(i32(sc), i32(m));
}

// Q4_K {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}, Q5_K the same with
// u8 qh[32] before qs: unit j is the nibble 4(j%2) of bytes 32(j/2)..+32,
// plus bit j of qh[k] as the fifth bit (Q5_K).
fn unit_q45_k(b: u32, j: u32, ty: u32) -> Unit {
    var u = unit_default();
    var qs = b + 16u;
    if ty == Q5_K {
        qs = b + 48u;
    }
    let shift = 4u * (j % 2u);
    for (var k = 0u; k < 8u; k++) {
        var v = (u32_at(qs + 32u * (j / 2u) + 4u * k) >> shift) & 0x0f0f0f0fu;
        if ty == Q5_K {
            v |= ((u32_at(b + 16u + 4u * k) >> j) & 0x01010101u) << 4u;
        }
        u.q[k] = v;
    }
    let sm = scale_min_k4(b + 4u, j);
    u.ka = sm.x;
    u.kb = sm.x;
    u.ma = sm.y;
    u.mb = sm.y;
    u.wd = f16_at(b);
    u.wmin = f16_at(b + 2u);
    return u;
}

// Q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}: unit j = 4h + g takes
// nibble 4(g/2) of ql[64h + 32(g%2) + k] and bits 2g of qh[32h + k], minus 32.
fn unit_q6_k(b: u32, j: u32) -> Unit {
    var u = unit_default();
    let h = j / 4u;
    let g = j % 4u;
    for (var k = 0u; k < 8u; k++) {
        let lo = (u32_at(b + 64u * h + 32u * (g % 2u) + 4u * k) >> (4u * (g / 2u))) & 0x0f0f0f0fu;
        let hi = (u32_at(b + 128u + 32u * h + 4u * k) >> (2u * g)) & 0x03030303u;
        u.q[k] = offset4(lo | (hi << 4u), 6u);
    }
    u.ka = sext8(byte_at(b + 192u + 2u * j));
    u.kb = sext8(byte_at(b + 192u + 2u * j + 1u));
    u.wd = f16_at(b + 208u);
    return u;
}

// Q8_K {f32 d; i8 qs[256]; i16 bsums[16]} (bsums unused).
fn unit_q8_k(b: u32, j: u32) -> Unit {
    var u = unit_default();
    for (var k = 0u; k < 8u; k++) {
        u.q[k] = u32_at(b + 4u + 32u * j + 4u * k);
    }
    u.wd = bitcast<f32>(u32_at(b));
    return u;
}

// The grid values (IQ4_GRID, or FP4_GRID where `fp4`) of the four nibbles
// `n` holds in bytes 0..3 (low bits), packed as four i8.
fn nibble_lookup4(n: u32, fp4: bool) -> u32 {
    var out = 0u;
    for (var k = 0u; k < 4u; k++) {
        let i = (n >> (8u * k)) & 0xfu;
        let v = select(IQ4_GRID[i], FP4_GRID[i], fp4);
        out |= (bitcast<u32>(v) & 0xffu) << (8u * k);
    }
    return out;
}

// The 32 grid values of 16 nibble bytes at `qs`: value j from the low
// nibble of byte j, value 16 + j from its high nibble.
fn nibble_quants(u: ptr<function, Unit>, qs: u32, fp4: bool) {
    for (var k = 0u; k < 4u; k++) {
        let qw = u32_at(qs + 4u * k);
        (*u).q[k] = nibble_lookup4(qw & 0x0f0f0f0fu, fp4);
        (*u).q[4u + k] = nibble_lookup4((qw >> 4u) & 0x0f0f0f0fu, fp4);
    }
}

// IQ4_NL {f16 d; u8 qs[16]}: value = d * grid[nibble].
fn unit_iq4_nl(b: u32) -> Unit {
    var u = unit_default();
    u.wd = f16_at(b);
    nibble_quants(&u, b + 2u, false);
    return u;
}

// IQ4_XS {f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]}: unit j has the
// 6-bit scale (nibble j % 2 of scales_l[j / 2]) | (bits 2j, 2j+1 of
// scales_h) << 4, minus 32, and value = d * scale * grid[nibble].
fn unit_iq4_xs(b: u32, j: u32) -> Unit {
    var u = unit_default();
    u.wd = f16_at(b);
    let h = (byte_at(b + 2u) | (byte_at(b + 3u) << 8u)) >> (2u * j);
    let lo = (byte_at(b + 4u + j / 2u) >> (4u * (j % 2u))) & 0xfu;
    let ls = i32(lo | ((h & 3u) << 4u)) - 32;
    u.ka = ls;
    u.kb = ls;
    nibble_quants(&u, b + 8u + 16u * j, false);
    return u;
}

// Per-byte sum of two words of four i8, wrapping within each byte (no
// carry crosses into the next).
fn add4(a: u32, b: u32) -> u32 {
    return ((a & 0x7f7f7f7fu) + (b & 0x7f7f7f7fu)) ^ ((a ^ b) & 0x80808080u);
}

// 0xff in byte k for bit k (0..3) of `bits`, else 0.
fn byte_mask4(bits: u32) -> u32 {
    return ((bits & 1u) | ((bits & 2u) << 7u) | ((bits & 4u) << 14u) | ((bits & 8u) << 21u)) * 0xffu;
}

// The four i8 of `v`, negated where `mask` has 0xff (two's complement:
// flip, then add 1).
fn negate4(v: u32, mask: u32) -> u32 {
    return add4(v ^ mask, mask & 0x01010101u);
}

// ggml's ksigns_iq2xs as `blockdraft_gguf::quants::grids::ksigns` defines
// it: 7 stored sign bits, the eighth making the count of negatives even.
fn ksigns(i: u32) -> u32 {
    let s = i & 127u;
    return s | ((countOneBits(s) & 1u) << 7u);
}

// Word index in `w` of the grid appended after rows ending at byte `end`.
fn grid_at(end: u32) -> u32 {
    return (end + 3u) / 4u;
}

// Row `idx` of an 8-value grid (IQ2, IQ1) at word `grid`: values 0..3, 4..7.
fn grid_row8(grid: u32, idx: u32) -> vec2<u32> {
    return vec2<u32>(w[grid + 2u * idx], w[grid + 2u * idx + 1u]);
}

// Eight grid magnitudes `row` as values 8l..8l+7 of the unit, negated where
// bit j of the sign byte `s` is set.
fn put_signed(u: ptr<function, Unit>, l: u32, row: vec2<u32>, s: u32) {
    (*u).q[2u * l] = negate4(row.x, byte_mask4(s));
    (*u).q[2u * l + 1u] = negate4(row.y, byte_mask4(s >> 4u));
}

// Both 4-bit scales of a byte as odd integers 2s + 1 (low nibble: values
// 0..15, high: 16..31).
fn odd_scales(u: ptr<function, Unit>, sc: u32) {
    (*u).ka = i32(2u * (sc & 15u) + 1u);
    (*u).kb = i32(2u * ((sc >> 4u) & 15u) + 1u);
}

// IQ2_XXS {f16 d; u16 qs[32]}: unit j is two words at 2 + 8j, four 8-bit
// grid indices, then four 7-bit sign indices and a 4-bit scale s on top;
// x = d (2s + 1) / 8 · grid · sign (the CPU's 0.125 folded into wd).
fn unit_iq2_xxs(b: u32, j: u32, grid: u32) -> Unit {
    var u = unit_default();
    let idx = u32_at(b + 2u + 8u * j);
    let aux = u32_at(b + 6u + 8u * j);
    for (var l = 0u; l < 4u; l++) {
        put_signed(&u, l, grid_row8(grid, (idx >> (8u * l)) & 0xffu), ksigns(aux >> (7u * l)));
    }
    u.ka = i32(2u * (aux >> 28u) + 1u);
    u.kb = u.ka;
    u.wd = f16_at(b) * 0.125;
    return u;
}

// IQ2_XS {f16 d; u16 qs[32]; u8 scales[8]}: each qs word a 9-bit grid index
// and a 7-bit sign index, words 4j..4j+3 in unit j; scales[j] holds its two
// 16-value scales; x = d (2s + 1) / 8 · grid · sign.
fn unit_iq2_xs(b: u32, j: u32, grid: u32) -> Unit {
    var u = unit_default();
    for (var l = 0u; l < 4u; l++) {
        let v = (u32_at(b + 2u + 8u * j + 4u * (l / 2u)) >> (16u * (l % 2u))) & 0xffffu;
        put_signed(&u, l, grid_row8(grid, v & 511u), ksigns(v >> 9u));
    }
    odd_scales(&u, byte_at(b + 66u + j));
    u.wd = f16_at(b) * 0.125;
    return u;
}

// IQ2_S {f16 d; u8 qs[32]; u8 signs[32]; u8 qh[8]; u8 scales[8]}: grid
// index qs[4j + l] | (bits 2l, 2l+1 of qh[j]) << 8, plain sign bytes;
// x = d (2s + 1) / 8 · grid · sign.
fn unit_iq2_s(b: u32, j: u32, grid: u32) -> Unit {
    var u = unit_default();
    let qs = u32_at(b + 2u + 4u * j);
    let signs = u32_at(b + 34u + 4u * j);
    let qh = byte_at(b + 66u + j);
    for (var l = 0u; l < 4u; l++) {
        let idx = ((qs >> (8u * l)) & 0xffu) | (((qh >> (2u * l)) & 3u) << 8u);
        put_signed(&u, l, grid_row8(grid, idx), signs >> (8u * l));
    }
    odd_scales(&u, byte_at(b + 74u + j));
    u.wd = f16_at(b) * 0.125;
    return u;
}

// Byte k (0..7) of the eight bytes in words `a`, `c`.
fn byte8(a: u32, c: u32, k: u32) -> u32 {
    return (select(c, a, k < 4u) >> (8u * (k % 4u))) & 0xffu;
}

// IQ3_XXS {f16 d; u8 qs[64]; u32 scales_signs[8]}: one 8-bit index per four
// values (qs[8j + k]), per unit a word of four 7-bit sign indices and a
// 4-bit scale on top; x = d (2s + 1) / 4 · grid · sign.
fn unit_iq3_xxs(b: u32, j: u32, grid: u32) -> Unit {
    var u = unit_default();
    let qa = u32_at(b + 2u + 8u * j);
    let qc = u32_at(b + 6u + 8u * j);
    let aux = u32_at(b + 66u + 4u * j);
    for (var l = 0u; l < 4u; l++) {
        let row = vec2<u32>(w[grid + byte8(qa, qc, 2u * l)], w[grid + byte8(qa, qc, 2u * l + 1u)]);
        put_signed(&u, l, row, ksigns(aux >> (7u * l)));
    }
    u.ka = i32(2u * (aux >> 28u) + 1u);
    u.kb = u.ka;
    u.wd = f16_at(b) * 0.25;
    return u;
}

// IQ3_S {f16 d; u8 qs[64]; u8 qh[8]; u8 signs[32]; u8 scales[4]}: index
// qs[8j + k] | (bit k of qh[j]) << 8 per four values, plain sign bytes,
// nibble j % 2 of scales[j / 2] the unit's scale; x = d (2s + 1) · grid · sign.
fn unit_iq3_s(b: u32, j: u32, grid: u32) -> Unit {
    var u = unit_default();
    let qa = u32_at(b + 2u + 8u * j);
    let qc = u32_at(b + 6u + 8u * j);
    let qh = byte_at(b + 66u + j);
    let signs = u32_at(b + 74u + 4u * j);
    for (var l = 0u; l < 4u; l++) {
        let k = 2u * l;
        let i0 = byte8(qa, qc, k) | (((qh >> k) & 1u) << 8u);
        let i1 = byte8(qa, qc, k + 1u) | (((qh >> (k + 1u)) & 1u) << 8u);
        put_signed(&u, l, vec2<u32>(w[grid + i0], w[grid + i1]), signs >> (8u * l));
    }
    u.ka = i32(2u * ((byte_at(b + 106u + j / 2u) >> (4u * (j % 2u))) & 15u) + 1u);
    u.kb = u.ka;
    u.wd = f16_at(b);
    return u;
}

// IQ1 values are dl (grid ± 1/8) with a signed {-1, 0, 1} grid: stored as
// the integers 8 grid ± 1 (within i8) with wd = d / 8, so the offset needs
// no activation sums of its own (IQ1_M's sign changes every 8 values).
// Group l of the unit from grid row `row`, the offset negative if `neg`.
fn put_iq1(u: ptr<function, Unit>, l: u32, row: vec2<u32>, neg: bool) {
    let delta = select(0x01010101u, 0xffffffffu, neg);
    (*u).q[2u * l] = add4((row.x << 3u) & 0xf8f8f8f8u, delta);
    (*u).q[2u * l + 1u] = add4((row.y << 3u) & 0xf8f8f8f8u, delta);
}

// IQ1_S {f16 d; u8 qs[32]; u16 qh[8]}: index qs[4j + l] | (bits 3l..3l+2
// of qh[j]) << 8; qh[j] bits 12..14 the scale s, bit 15 the offset's sign;
// x = d (2s + 1) (grid ± 1/8).
fn unit_iq1_s(b: u32, j: u32, grid: u32) -> Unit {
    var u = unit_default();
    let qs = u32_at(b + 2u + 4u * j);
    let qh = u32_at(b + 34u + 2u * j) & 0xffffu;
    for (var l = 0u; l < 4u; l++) {
        let idx = ((qs >> (8u * l)) & 0xffu) | (((qh >> (3u * l)) & 7u) << 8u);
        put_iq1(&u, l, grid_row8(grid, idx), (qh & 0x8000u) != 0u);
    }
    u.ka = i32(2u * ((qh >> 12u) & 7u) + 1u);
    u.kb = u.ka;
    u.wd = f16_at(b) * 0.125;
    return u;
}

// IQ1_M {u8 qs[32]; u8 qh[16]; u16 scales[4]}: group l's nibble of
// qh[2j..2j+2] gives three index bits (as IQ1_S) and the offset's sign;
// 3-bit scales per 16 values at bit 6(j % 2) of scales[j / 2]; the f16 d
// spread over the four words' top nibbles; x = d (2s + 1) (grid ± 1/8).
fn unit_iq1_m(b: u32, j: u32, grid: u32) -> Unit {
    var u = unit_default();
    let qs = u32_at(b + 4u * j);
    let qh = byte_at(b + 32u + 2u * j) | (byte_at(b + 33u + 2u * j) << 8u);
    for (var l = 0u; l < 4u; l++) {
        let nib = (qh >> (4u * l)) & 15u;
        let idx = ((qs >> (8u * l)) & 0xffu) | ((nib & 7u) << 8u);
        put_iq1(&u, l, grid_row8(grid, idx), (nib & 8u) != 0u);
    }
    let s01 = u32_at(b + 48u);
    let s23 = u32_at(b + 52u);
    let sc = (select(s23, s01, j < 4u) >> (16u * ((j / 2u) % 2u) + 6u * (j % 2u))) & 63u;
    u.ka = i32(2u * (sc & 7u) + 1u);
    u.kb = i32(2u * (sc >> 3u) + 1u);
    let d = ((s01 >> 12u) & 0xfu) | ((s01 >> 24u) & 0xf0u) | ((s23 >> 4u) & 0xf00u)
        | ((s23 >> 16u) & 0xf000u);
    u.wd = f16_bits(d) * 0.125;
    return u;
}

// The base-3 digits `n` (0 = most significant) of the four TQ1_0 bytes in
// `x` as four i8 -1, 0, 1: byte * 3^n, wrapped to a byte, times 3, top bits.
fn tq1_digits4(x: u32, n: u32) -> u32 {
    var m = 1u;
    for (var k = 0u; k < n; k++) {
        m *= 3u;
    }
    var out = 0u;
    for (var k = 0u; k < 4u; k++) {
        let q = (((x >> (8u * k)) & 0xffu) * m) & 0xffu;
        out |= ((q * 3u) >> 8u) << (8u * k);
    }
    return add4(out, 0xffffffffu);
}

// TQ1_0 {u8 qs[48]; u8 qh[4]; f16 d}: values 0..160 are digit i / 32 of
// qs[i % 32], 160..240 digit (i - 160) / 16 of qs[32 + i % 16], 240..256
// digit (i - 240) / 4 of qh[i % 4]; so each 4 values of a unit are one digit
// of 4 consecutive bytes. x = d · digit.
fn unit_tq1_0(b: u32, j: u32) -> Unit {
    var u = unit_default();
    for (var k = 0u; k < 8u; k++) {
        var at = 4u * k;
        var n = j;
        if j == 7u && k >= 4u {
            at = 48u;
            n = k - 4u;
        } else if j == 7u {
            at = 32u + 4u * k;
            n = 4u;
        } else if j >= 5u {
            at = 32u + 4u * (k % 4u);
            n = 2u * (j - 5u) + k / 4u;
        }
        u.q[k] = tq1_digits4(u32_at(b + at), n);
    }
    u.wd = f16_at(b + 52u);
    return u;
}

// TQ2_0 {u8 qs[64]; f16 d}: value 128h + 32l + m is bits 2l, 2l+1 of
// qs[32h + m], stored + 1; unit j = 4h + l. x = d · value.
fn unit_tq2_0(b: u32, j: u32) -> Unit {
    var u = unit_default();
    for (var k = 0u; k < 8u; k++) {
        let v = (u32_at(b + 32u * (j / 4u) + 4u * k) >> (2u * (j % 4u))) & 0x03030303u;
        u.q[k] = add4(v, 0xffffffffu);
    }
    u.wd = f16_at(b + 64u);
    return u;
}

// An E8M0 exponent byte as 2^(e - 127) / 2 (ggml_e8m0_to_fp32_half, bit for
// bit; the half undoes FP4_GRID's doubling).
fn e8m0_half(e: u32) -> f32 {
    if e < 2u {
        return bitcast<f32>(0x00200000u << e);
    }
    return bitcast<f32>((e - 1u) << 23u);
}

// An unsigned E4M3 scale byte, halved (ggml_ue4m3_to_fp32; 0 and 0x7f, its
// NaN, read as 0): (8 + m) 2^(e - 11), or m 2^-10 when e = 0, exactly.
fn ue4m3_half(x: u32) -> f32 {
    if x == 0u || x == 0x7fu {
        return 0.0;
    }
    let e = (x >> 3u) & 15u;
    let m = x & 7u;
    if e == 0u {
        return ldexp(f32(m), -10);
    }
    return ldexp(f32(8u + m), i32(e) - 11);
}

// MXFP4 {u8 e; u8 qs[16]}: nibbles as IQ4_NL's; x = e8m0_half(e) · FP4_GRID.
fn unit_mxfp4(b: u32) -> Unit {
    var u = unit_default();
    u.wd = e8m0_half(byte_at(b));
    nibble_quants(&u, b + 1u, true);
    return u;
}

// NVFP4 {u8 d[4]; u8 qs[32]}, 64 values: unit h holds parts 2h, 2h + 1;
// part s's value k is the low nibble of qs[8s + k], value 8 + k the high
// one; x = ue4m3_half(d[s]) · FP4_GRID.
fn unit_nvfp4(b: u32, h: u32) -> Unit {
    var u = unit_default();
    for (var t = 0u; t < 2u; t++) {
        let qa = u32_at(b + 4u + 8u * (2u * h + t));
        let qc = u32_at(b + 8u + 8u * (2u * h + t));
        u.q[4u * t] = nibble_lookup4(qa & 0x0f0f0f0fu, true);
        u.q[4u * t + 1u] = nibble_lookup4(qc & 0x0f0f0f0fu, true);
        u.q[4u * t + 2u] = nibble_lookup4((qa >> 4u) & 0x0f0f0f0fu, true);
        u.q[4u * t + 3u] = nibble_lookup4((qc >> 4u) & 0x0f0f0f0fu, true);
    }
    u.wd = ue4m3_half(byte_at(b + 2u * h));
    u.wdb = ue4m3_half(byte_at(b + 2u * h + 1u));
    return u;
}

// Unit `i` (32 values) of the row starting at byte `row`; `grid`: where the
// weight's lattice grid starts (`grid_at`), unused by other types.
fn decode_unit(ty: u32, row: u32, i: u32, grid: u32) -> Unit {
    if ty == NVFP4 {
        return unit_nvfp4(row + (i / 2u) * block_bytes(ty), i % 2u);
    }
    if !is_k_quant(ty) {
        let b = row + i * block_bytes(ty);
        switch ty {
            case 0u, 1u: { return unit_q4(b, ty); }
            case 2u, 3u: { return unit_q5(b, ty); }
            case 12u: { return unit_iq4_nl(b); }
            case 23u: { return unit_mxfp4(b); }
            default: { return unit_q8(b, ty); }
        }
    }
    let b = row + (i / 8u) * block_bytes(ty);
    let j = i % 8u;
    switch ty {
        case 6u: { return unit_q2_k(b, j); }
        case 7u: { return unit_q3_k(b, j); }
        case 8u, 9u: { return unit_q45_k(b, j, ty); }
        case 10u: { return unit_q6_k(b, j); }
        case 13u: { return unit_iq4_xs(b, j); }
        case 14u: { return unit_iq2_xxs(b, j, grid); }
        case 15u: { return unit_iq2_xs(b, j, grid); }
        case 16u: { return unit_iq2_s(b, j, grid); }
        case 17u: { return unit_iq3_xxs(b, j, grid); }
        case 18u: { return unit_iq3_s(b, j, grid); }
        case 19u: { return unit_iq1_s(b, j, grid); }
        case 20u: { return unit_iq1_m(b, j, grid); }
        case 21u: { return unit_tq1_0(b, j); }
        case 22u: { return unit_tq2_0(b, j); }
        default: { return unit_q8_k(b, j); }
    }
}

// Signed byte `k` (0..3) of a packed word.
fn lane(x: u32, k: u32) -> i32 {
    return extractBits(bitcast<i32>(x), 8u * k, 8u);
}

// Integer dot of two packed-i8 words.
#if DOT4
fn dot4(a: u32, b: u32) -> i32 {
    return dot4I8Packed(a, b);
}
#else
fn dot4(a: u32, b: u32) -> i32 {
    return lane(a, 0u) * lane(b, 0u) + lane(a, 1u) * lane(b, 1u)
        + lane(a, 2u) * lane(b, 2u) + lane(a, 3u) * lane(b, 3u);
}
#endif
