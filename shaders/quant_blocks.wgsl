// GGUF quantized blocks, read in place from the weight binding (which the
// including file declares as `w: array<u32>`). Pulled in with
// `#include "quant_blocks.wgsl"` after common.wgsl.
//
// Block sizes are not multiples of 4 bytes (Q4_0 is 18, Q3_K 110, ...), so
// every read is by byte offset, assembled from the surrounding words.
//
// Every type is decoded in units of 32 values: one block of the legacy
// types, one eighth of a K-quant super-block. A unit's quants fit in i8 for
// every type (offsets such as -8 or -32 already applied, the non-linear
// types' grid values looked up), so they come out
// packed four per u32 like the quantized activations, with the scales that
// turn integer dots into floats. The formulas mirror the CPU backend's
// (crates/cpu/src/kernels/scalar.rs) and `blockdraft_gguf::quants`.

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

// The signed values IQ4_NL / IQ4_XS nibbles index (ggml's kvalues_iq4nl).
var<private> IQ4_GRID: array<i32, 16> = array<i32, 16>(
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);

// 32 decoded values and their scales: value k is
//   (wd * (k < 16 ? ka : kb)) * q[k] - wmin * (k < 16 ? ma : mb) + wm.
// Integer sub-block scales (ka, kb) and mins (ma, mb) are 1 and 0 for the
// legacy types; wmin is 0 without a min, wm is 0 without an offset.
struct Unit {
    q: array<u32, 8>,
    ka: i32,
    kb: i32,
    ma: i32,
    mb: i32,
    wd: f32,
    wmin: f32,
    wm: f32,
}

// Types of 256-value super-blocks (eight units each), whose activations are
// Q8_K: the K-quants and IQ4_XS.
fn is_k_quant(ty: u32) -> bool {
    return (ty >= Q2_K && ty <= Q8_K) || ty == IQ4_XS;
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

// The grid values of the four nibbles `n` holds in bytes 0..3 (low bits),
// packed as four i8.
fn iq4_lookup4(n: u32) -> u32 {
    var out = 0u;
    for (var k = 0u; k < 4u; k++) {
        let v = IQ4_GRID[(n >> (8u * k)) & 0xfu];
        out |= (bitcast<u32>(v) & 0xffu) << (8u * k);
    }
    return out;
}

// The 32 grid values of 16 nibble bytes at `qs`: value j from the low
// nibble of byte j, value 16 + j from its high nibble.
fn iq4_quants(u: ptr<function, Unit>, qs: u32) {
    for (var k = 0u; k < 4u; k++) {
        let qw = u32_at(qs + 4u * k);
        (*u).q[k] = iq4_lookup4(qw & 0x0f0f0f0fu);
        (*u).q[4u + k] = iq4_lookup4((qw >> 4u) & 0x0f0f0f0fu);
    }
}

// IQ4_NL {f16 d; u8 qs[16]}: value = d * grid[nibble].
fn unit_iq4_nl(b: u32) -> Unit {
    var u = unit_default();
    u.wd = f16_at(b);
    iq4_quants(&u, b + 2u);
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
    iq4_quants(&u, b + 8u + 16u * j);
    return u;
}

// Unit `i` (32 values) of the row starting at byte `row`.
fn decode_unit(ty: u32, row: u32, i: u32) -> Unit {
    if !is_k_quant(ty) {
        let b = row + i * block_bytes(ty);
        switch ty {
            case 0u, 1u: { return unit_q4(b, ty); }
            case 2u, 3u: { return unit_q5(b, ty); }
            case 12u: { return unit_iq4_nl(b); }
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
