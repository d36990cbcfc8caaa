// `out = x · Wᵀ` for every GGUF weight type, read in place. One warp per
// weight row (four rows to a 128-thread block), each lane taking whole
// units (a 32-block, or a 16- or 32-value part of a larger block) in turn and
// decoding a unit once for up to MM_ROWS activation rows (grid.y tiles the
// rest). Quantized weights dot activations quantized by quantize.cu with
// integer dot products (`__dp4a`), as the CPU backend does; float weights
// dot the f32 activations. A row's result does not depend on how many rows
// share the launch, so verify rows equal decode rows bit for bit.

#define MM_ROWS 8

__device__ __forceinline__ int pack4(int a, int b, int c, int d) {
    return (a & 0xff) | ((b & 0xff) << 8) | ((c & 0xff) << 16) | ((d & 0xff) << 24);
}

// A unit's decoded form: UNIT/4 words of four signed 8-bit quants, integer
// scale and min (K-quants), and float factors `a` (the scale d) and `b`
// (the min term: m or dmin).
struct Unit16 { int q[4]; int sc, mn; float a, b; };
struct Unit32 { int q[8]; int sc, mn; float a, b; };

// Legacy 32-blocks (activations Q8_0). HAS_M: `+ m * s_x` (Q4_1, Q5_1).
struct Q4_0 { enum { BL = 32, BYTES = 18, UPB = 1, UNIT = 32, K = 0, HAS_M = 0 };
    static __device__ __forceinline__ void decode(const u8 *b, int, Unit32 &u) {
        u.a = ld_f16(b); u.b = 0.0f; u.sc = 1; u.mn = 0;
        const u8 *qs = b + 2;
        for (int w = 0; w < 4; w++) {
            u.q[w] = pack4((qs[4*w] & 15) - 8, (qs[4*w+1] & 15) - 8, (qs[4*w+2] & 15) - 8, (qs[4*w+3] & 15) - 8);
            u.q[w+4] = pack4((qs[4*w] >> 4) - 8, (qs[4*w+1] >> 4) - 8, (qs[4*w+2] >> 4) - 8, (qs[4*w+3] >> 4) - 8);
        }
    }
};
struct Q4_1 { enum { BL = 32, BYTES = 20, UPB = 1, UNIT = 32, K = 0, HAS_M = 1 };
    static __device__ __forceinline__ void decode(const u8 *b, int, Unit32 &u) {
        u.a = ld_f16(b); u.b = ld_f16(b + 2); u.sc = 1; u.mn = 0;
        const u8 *qs = b + 4;
        for (int w = 0; w < 4; w++) {
            u.q[w] = pack4(qs[4*w] & 15, qs[4*w+1] & 15, qs[4*w+2] & 15, qs[4*w+3] & 15);
            u.q[w+4] = pack4(qs[4*w] >> 4, qs[4*w+1] >> 4, qs[4*w+2] >> 4, qs[4*w+3] >> 4);
        }
    }
};
__device__ __forceinline__ void decode_q5(const u8 *qs, u32 qh, int offset, Unit32 &u) {
    for (int w = 0; w < 4; w++) {
        int lo[4], hi[4];
        for (int i = 0; i < 4; i++) {
            int j = 4 * w + i;
            lo[i] = ((qs[j] & 15) | (((qh >> j) & 1) << 4)) - offset;
            hi[i] = ((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - offset;
        }
        u.q[w] = pack4(lo[0], lo[1], lo[2], lo[3]);
        u.q[w+4] = pack4(hi[0], hi[1], hi[2], hi[3]);
    }
}
struct Q5_0 { enum { BL = 32, BYTES = 22, UPB = 1, UNIT = 32, K = 0, HAS_M = 0 };
    static __device__ __forceinline__ void decode(const u8 *b, int, Unit32 &u) {
        u.a = ld_f16(b); u.b = 0.0f; u.sc = 1; u.mn = 0;
        decode_q5(b + 6, ld_u32(b + 2), 16, u);
    }
};
struct Q5_1 { enum { BL = 32, BYTES = 24, UPB = 1, UNIT = 32, K = 0, HAS_M = 1 };
    static __device__ __forceinline__ void decode(const u8 *b, int, Unit32 &u) {
        u.a = ld_f16(b); u.b = ld_f16(b + 2); u.sc = 1; u.mn = 0;
        decode_q5(b + 8, ld_u32(b + 4), 0, u);
    }
};
__device__ __forceinline__ void decode_q8(const u8 *qs, Unit32 &u) {
    for (int w = 0; w < 8; w++) u.q[w] = (int)ld_u32(qs + 4 * w);
}
struct Q8_0 { enum { BL = 32, BYTES = 34, UPB = 1, UNIT = 32, K = 0, HAS_M = 0 };
    static __device__ __forceinline__ void decode(const u8 *b, int, Unit32 &u) {
        u.a = ld_f16(b); u.b = 0.0f; u.sc = 1; u.mn = 0;
        decode_q8(b + 2, u);
    }
};
struct Q8_1 { enum { BL = 32, BYTES = 36, UPB = 1, UNIT = 32, K = 0, HAS_M = 0 };
    static __device__ __forceinline__ void decode(const u8 *b, int, Unit32 &u) {
        u.a = ld_f16(b); u.b = 0.0f; u.sc = 1; u.mn = 0;
        decode_q8(b + 4, u);
    }
};

// K-quants: 256-super-blocks in 16 parts of 16 values (activations Q8_K);
// part `is` covers values 16·is .. 16·is + 15.
struct Q2_K { enum { BL = 256, BYTES = 84, UPB = 16, UNIT = 16, K = 1, HAS_M = 0 };
    static __device__ __forceinline__ void decode(const u8 *b, int is, Unit16 &u) {
        int h = is / 8, j = (is % 8) / 2, p = is % 2;
        const u8 *qs = b + 16 + 32 * h + 16 * p;
        u.sc = b[is] & 15; u.mn = b[is] >> 4;
        u.a = ld_f16(b + 80); u.b = ld_f16(b + 82);
        for (int w = 0; w < 4; w++)
            u.q[w] = pack4((qs[4*w] >> (2*j)) & 3, (qs[4*w+1] >> (2*j)) & 3,
                           (qs[4*w+2] >> (2*j)) & 3, (qs[4*w+3] >> (2*j)) & 3);
    }
};
struct Q3_K { enum { BL = 256, BYTES = 110, UPB = 16, UNIT = 16, K = 1, HAS_M = 0 };
    static __device__ __forceinline__ void decode(const u8 *b, int is, Unit16 &u) {
        int h = is / 8, j = (is % 8) / 2, p = is % 2;
        const u8 *hmask = b + 16 * p, *qs = b + 32 + 32 * h + 16 * p, *s = b + 96;
        int lo = is < 8 ? (s[is] & 15) : (s[is - 8] >> 4);
        int hi = (s[8 + is % 4] >> (2 * (is / 4))) & 3;
        u.sc = (lo | (hi << 4)) - 32; u.mn = 0;
        u.a = ld_f16(b + 108); u.b = 0.0f;
        int m = 1 << (4 * h + j);
        for (int w = 0; w < 4; w++) {
            int v[4];
            for (int i = 0; i < 4; i++) {
                int k = 4 * w + i;
                v[i] = ((qs[k] >> (2 * j)) & 3) - ((hmask[k] & m) ? 0 : 4);
            }
            u.q[w] = pack4(v[0], v[1], v[2], v[3]);
        }
    }
};
// The 6-bit (scale, min) pair `j` of Q4_K/Q5_K's 12 packed bytes.
__device__ __forceinline__ void scale_min_k4(int j, const u8 *q, int &sc, int &m) {
    if (j < 4) {
        sc = q[j] & 63; m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}
struct Q4_K { enum { BL = 256, BYTES = 144, UPB = 16, UNIT = 16, K = 1, HAS_M = 0 };
    static __device__ __forceinline__ void decode(const u8 *b, int is, Unit16 &u) {
        int j = is / 2, half = is % 2, shift = 4 * (j % 2);
        scale_min_k4(j, b + 4, u.sc, u.mn);
        u.a = ld_f16(b); u.b = ld_f16(b + 2);
        const u8 *qs = b + 16 + 32 * (j / 2) + 16 * half;
        for (int w = 0; w < 4; w++)
            u.q[w] = pack4((qs[4*w] >> shift) & 15, (qs[4*w+1] >> shift) & 15,
                           (qs[4*w+2] >> shift) & 15, (qs[4*w+3] >> shift) & 15);
    }
};
struct Q5_K { enum { BL = 256, BYTES = 176, UPB = 16, UNIT = 16, K = 1, HAS_M = 0 };
    static __device__ __forceinline__ void decode(const u8 *b, int is, Unit16 &u) {
        int j = is / 2, half = is % 2, shift = 4 * (j % 2);
        scale_min_k4(j, b + 4, u.sc, u.mn);
        u.a = ld_f16(b); u.b = ld_f16(b + 2);
        const u8 *qh = b + 16 + 16 * half, *qs = b + 48 + 32 * (j / 2) + 16 * half;
        for (int w = 0; w < 4; w++) {
            int v[4];
            for (int i = 0; i < 4; i++) {
                int l = 4 * w + i;
                v[i] = ((qs[l] >> shift) & 15) | (((qh[l] >> j) & 1) << 4);
            }
            u.q[w] = pack4(v[0], v[1], v[2], v[3]);
        }
    }
};
struct Q6_K { enum { BL = 256, BYTES = 210, UPB = 16, UNIT = 16, K = 1, HAS_M = 0 };
    static __device__ __forceinline__ void decode(const u8 *b, int is, Unit16 &u) {
        int h = is / 8, g = (is % 8) / 2, half = is % 2;
        const u8 *ql = b + 64 * h + 32 * (g & 1) + 16 * half;
        const u8 *qh = b + 128 + 32 * h + 16 * half;
        int nib = g >= 2 ? 4 : 0;
        u.sc = (int)(i8)b[192 + is]; u.mn = 0;
        u.a = ld_f16(b + 208); u.b = 0.0f;
        for (int w = 0; w < 4; w++) {
            int v[4];
            for (int i = 0; i < 4; i++) {
                int l = 4 * w + i;
                v[i] = (((ql[l] >> nib) & 15) | (((qh[l] >> (2 * g)) & 3) << 4)) - 32;
            }
            u.q[w] = pack4(v[0], v[1], v[2], v[3]);
        }
    }
};
struct Q8_K { enum { BL = 256, BYTES = 292, UPB = 16, UNIT = 16, K = 1, HAS_M = 0 };
    static __device__ __forceinline__ void decode(const u8 *b, int is, Unit16 &u) {
        u.a = ld_f32(b); u.b = 0.0f; u.sc = 1; u.mn = 0;
        for (int w = 0; w < 4; w++) u.q[w] = (int)ld_u32(b + 4 + 16 * is + 4 * w);
    }
};

// Non-linear 4-bit (iq4_value in common.cuh): value j of a 32-block from
// the low nibble of byte j, value 16 + j from its high nibble.
__device__ __forceinline__ void iq4_quants(const u8 *qs, Unit32 &u) {
    for (int w = 0; w < 4; w++) {
        u.q[w] = pack4(iq4_value(qs[4*w]), iq4_value(qs[4*w+1]), iq4_value(qs[4*w+2]), iq4_value(qs[4*w+3]));
        u.q[w+4] = pack4(iq4_value(qs[4*w] >> 4), iq4_value(qs[4*w+1] >> 4), iq4_value(qs[4*w+2] >> 4),
                         iq4_value(qs[4*w+3] >> 4));
    }
}
// IQ4_NL {f16 d; u8 qs[16]} (activations Q8_0).
struct IQ4_NL { enum { BL = 32, BYTES = 18, UPB = 1, UNIT = 32, K = 0, HAS_M = 0 };
    static __device__ __forceinline__ void decode(const u8 *b, int, Unit32 &u) {
        u.a = ld_f16(b); u.b = 0.0f; u.sc = 1; u.mn = 0;
        iq4_quants(b + 2, u);
    }
};
// IQ4_XS {f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]}: eight 32-value
// parts, part j scaled by its 6-bit scale minus 32 (activations Q8_K).
struct IQ4_XS { enum { BL = 256, BYTES = 136, UPB = 8, UNIT = 32, K = 1, HAS_M = 0 };
    static __device__ __forceinline__ void decode(const u8 *b, int j, Unit32 &u) {
        int lo = (b[4 + j / 2] >> (4 * (j % 2))) & 15;
        int hi = (ld_u16(b + 2) >> (2 * j)) & 3;
        u.a = ld_f16(b); u.b = 0.0f; u.sc = (lo | (hi << 4)) - 32; u.mn = 0;
        iq4_quants(b + 8 + 16 * j, u);
    }
};

// Lattice types (IQ2, IQ3, IQ1; activations Q8_K): a grid index gives a
// row of 8 (or 4) magnitudes, packed as bytes, byte j = value j (the
// generated tables before this file, compile.rs). Signs become a byte mask
// applied in place; the grid is never 0 there, so negating a byte as
// (g ^ 0xFF) + 1 never carries into the next (a test in compile.rs).

// Byte i of the result is 0xFF where bit i of `bits` (4 bits) is set: the
// multiply moves bit i to bit 8i (the four copies do not overlap).
__device__ __forceinline__ u32 sign_mask4(u32 bits) {
    return (((bits & 15) * 0x00204081u) & 0x01010101u) * 0xFFu;
}
__device__ __forceinline__ int negate_where(u32 g, u32 mask) {
    return (int)((g ^ mask) + (mask & 0x01010101u));
}
// Eight values: grid row `row` with sign byte `signs` into q[0], q[1].
__device__ __forceinline__ void signed_row8(u64 row, u32 signs, int *q) {
    q[0] = negate_where((u32)row, sign_mask4(signs));
    q[1] = negate_where((u32)(row >> 32), sign_mask4(signs >> 4));
}
// Byte-wise a + b mod 256 (no carry between bytes).
__device__ __forceinline__ u32 add_bytes(u32 a, u32 b) {
    return ((a & 0x7F7F7F7Fu) + (b & 0x7F7F7F7Fu)) ^ ((a ^ b) & 0x80808080u);
}
// IQ1: eight values 8·grid + δ (δ = ±1 as bytes 0x01 / 0xFF) into q[0],
// q[1]; the unit's factor carries the 1/8. This folds the ±1/8 offset into
// the integer dot, where the reference adds it through activation sums:
// the same integers, so no per-8 activation sums are needed.
__device__ __forceinline__ void iq1_row8(u64 row, u32 delta, int *q) {
    q[0] = (int)add_bytes(((u32)row << 3) & 0xF8F8F8F8u, delta);
    q[1] = (int)add_bytes(((u32)(row >> 32) << 3) & 0xF8F8F8F8u, delta);
}

// The reference's constant factors (×1/8 for IQ2 and IQ1, ×1/4 for
// IQ3_XXS) are folded into `a`: exact, being powers of two.

// IQ2_XXS {f16 d; u16 qs[32]}: per 32 values four grid bytes, then a word of
// four 7-bit sign indices and the 4-bit scale on top.
struct IQ2_XXS { enum { BL = 256, BYTES = 66, UPB = 8, UNIT = 32, K = 1, HAS_M = 0 };
    static __device__ __forceinline__ void decode(const u8 *b, int ib, Unit32 &u) {
        const u8 *q = b + 2 + 8 * ib;
        u32 aux = ld_u32(q + 4);
        u.a = ld_f16(b) * 0.125f; u.b = 0.0f; u.sc = 2 * (int)(aux >> 28) + 1; u.mn = 0;
        for (int l = 0; l < 4; l++) signed_row8(iq2xxs_grid[q[l]], ksigns(aux >> (7 * l)), u.q + 2 * l);
    }
};
// IQ2_XS {f16 d; u16 qs[32]; u8 scales[8]}: 9-bit index + 7-bit signs per
// word; a 4-bit scale per 16 values, so 16-value parts.
struct IQ2_XS { enum { BL = 256, BYTES = 74, UPB = 16, UNIT = 16, K = 1, HAS_M = 0 };
    static __device__ __forceinline__ void decode(const u8 *b, int is, Unit16 &u) {
        u.a = ld_f16(b) * 0.125f; u.b = 0.0f; u.mn = 0;
        u.sc = 2 * ((b[66 + is / 2] >> (4 * (is % 2))) & 15) + 1;
        for (int g = 0; g < 2; g++) {
            u32 w = ld_u16(b + 2 + 4 * is + 2 * g);
            signed_row8(iq2xs_grid[w & 511], ksigns(w >> 9), u.q + 2 * g);
        }
    }
};
// IQ2_S {f16 d; u8 qs[32]; u8 signs[32]; u8 qh[8]; u8 scales[8]}: 10-bit
// indices (2 bits per group from qh), plain sign bytes, scales per 16.
struct IQ2_S { enum { BL = 256, BYTES = 82, UPB = 16, UNIT = 16, K = 1, HAS_M = 0 };
    static __device__ __forceinline__ void decode(const u8 *b, int is, Unit16 &u) {
        int ib = is / 2, h = is % 2;
        u.a = ld_f16(b) * 0.125f; u.b = 0.0f; u.mn = 0;
        u.sc = 2 * ((b[74 + ib] >> (4 * h)) & 15) + 1;
        for (int g = 0; g < 2; g++) {
            int l = 2 * h + g;
            int idx = b[2 + 4 * ib + l] | ((b[66 + ib] << (8 - 2 * l)) & 0x300);
            signed_row8(iq2s_grid[idx], b[34 + 4 * ib + l], u.q + 2 * g);
        }
    }
};
// IQ3_XXS {f16 d; u8 qs[64]; u32 scales_signs[8]}: a grid byte per 4 values;
// per 32 values a word of four 7-bit sign indices and the scale on top.
struct IQ3_XXS { enum { BL = 256, BYTES = 98, UPB = 8, UNIT = 32, K = 1, HAS_M = 0 };
    static __device__ __forceinline__ void decode(const u8 *b, int ib, Unit32 &u) {
        const u8 *q = b + 2 + 8 * ib;
        u32 aux = ld_u32(b + 66 + 4 * ib);
        u.a = ld_f16(b) * 0.25f; u.b = 0.0f; u.sc = 2 * (int)(aux >> 28) + 1; u.mn = 0;
        for (int l = 0; l < 4; l++) {
            u32 m = ksigns(aux >> (7 * l));
            u.q[2 * l] = negate_where(iq3xxs_grid[q[2 * l]], sign_mask4(m));
            u.q[2 * l + 1] = negate_where(iq3xxs_grid[q[2 * l + 1]], sign_mask4(m >> 4));
        }
    }
};
// IQ3_S {f16 d; u8 qs[64]; u8 qh[8]; u8 signs[32]; u8 scales[4]}: 9-bit
// indices (the ninth from qh), plain sign bytes, 4-bit scales per 32.
struct IQ3_S { enum { BL = 256, BYTES = 110, UPB = 8, UNIT = 32, K = 1, HAS_M = 0 };
    static __device__ __forceinline__ void decode(const u8 *b, int ib, Unit32 &u) {
        const u8 *q = b + 2 + 8 * ib;
        int qh = b[66 + ib];
        u.a = ld_f16(b); u.b = 0.0f; u.mn = 0;
        u.sc = 2 * ((b[106 + ib / 2] >> (4 * (ib % 2))) & 15) + 1;
        for (int l = 0; l < 4; l++) {
            u32 m = b[74 + 4 * ib + l];
            u.q[2 * l] = negate_where(iq3s_grid[q[2 * l] | ((qh << (8 - 2 * l)) & 256)], sign_mask4(m));
            u.q[2 * l + 1] = negate_where(iq3s_grid[q[2 * l + 1] | ((qh << (7 - 2 * l)) & 256)], sign_mask4(m >> 4));
        }
    }
};
// IQ1_S {f16 d; u8 qs[32]; u16 qh[8]}: 11-bit indices into the signed grid
// (three bits per group from qh); per 32 values a 3-bit scale and the
// offset's sign in qh's top bits.
struct IQ1_S { enum { BL = 256, BYTES = 50, UPB = 8, UNIT = 32, K = 1, HAS_M = 0 };
    static __device__ __forceinline__ void decode(const u8 *b, int ib, Unit32 &u) {
        u32 qh = ld_u16(b + 34 + 2 * ib);
        u32 delta = (qh & 0x8000) ? 0xFFFFFFFFu : 0x01010101u;
        u.a = ld_f16(b) * 0.125f; u.b = 0.0f; u.sc = 2 * (int)((qh >> 12) & 7) + 1; u.mn = 0;
        for (int l = 0; l < 4; l++)
            iq1_row8(iq1s_grid[b[2 + 4 * ib + l] | (((qh >> (3 * l)) & 7) << 8)], delta, u.q + 2 * l);
    }
};
// IQ1_M {u8 qs[32]; u8 qh[16]; u16 scales[4]}: as IQ1_S with a qh nibble per
// group (three index bits, the offset's sign), 3-bit scales per 16 values
// and the f16 scale spread over the scales' top nibbles.
struct IQ1_M { enum { BL = 256, BYTES = 56, UPB = 16, UNIT = 16, K = 1, HAS_M = 0 };
    static __device__ __forceinline__ void decode(const u8 *b, int is, Unit16 &u) {
        int ib = is / 2, h = is % 2;
        int nibs = b[32 + 2 * ib + h];
        u.a = iq1m_d(b) * 0.125f; u.b = 0.0f; u.mn = 0;
        u.sc = 2 * ((ld_u16(b + 48 + 2 * (ib / 2)) >> (6 * (ib % 2) + 3 * h)) & 7) + 1;
        for (int g = 0; g < 2; g++) {
            int nib = (nibs >> (4 * g)) & 15;
            u64 row = iq1s_grid[b[4 * ib + 2 * h + g] | ((nib & 7) << 8)];
            iq1_row8(row, (nib & 8) ? 0xFFFFFFFFu : 0x01010101u, u.q + 2 * g);
        }
    }
};

// Ternary (activations Q8_K): values -1, 0, 1 times the f16 scale.

// Digit `n` (0 = most significant) of a TQ1_0 byte minus 1: the byte is
// the base-3 number in fixed point, so times 3^n the digit is the top of
// (byte · 3^n mod 256) · 3.
__device__ __forceinline__ int tq1_digit(int byte, int pow3) { return ((((byte * pow3) & 255) * 3) >> 8) - 1; }
// TQ1_0 {u8 qs[48]; u8 qh[4]; f16 d} in 16-value parts: part u < 10 is
// digit u/2 of qs[16(u%2) ..][16]; u < 15 digit u-10 of qs[32..48]; part 15
// is qh: value j is digit j/4 of qh[j%4].
struct TQ1_0 { enum { BL = 256, BYTES = 54, UPB = 16, UNIT = 16, K = 1, HAS_M = 0 };
    static __device__ __forceinline__ void decode(const u8 *b, int p, Unit16 &u) {
        u.a = ld_f16(b + 52); u.b = 0.0f; u.sc = 1; u.mn = 0;
        const u8 *qs = p < 10 ? b + 16 * (p % 2) : (p < 15 ? b + 32 : b + 48);
        int n = p < 10 ? p / 2 : (p < 15 ? p - 10 : 0);
        int stride = p < 15 ? 4 : 0, dn = p < 15 ? 0 : 1;
        for (int w = 0; w < 4; w++) {
            int k = n + dn * w;
            int pow3 = k == 0 ? 1 : (k == 1 ? 3 : (k == 2 ? 9 : (k == 3 ? 27 : 81)));
            const u8 *q = qs + stride * w;
            u.q[w] = pack4(tq1_digit(q[0], pow3), tq1_digit(q[1], pow3), tq1_digit(q[2], pow3),
                           tq1_digit(q[3], pow3));
        }
    }
};
// TQ2_0 {u8 qs[64]; f16 d}: 32-value part 4j + l is bits 2l of qs[32j..][32],
// stored + 1 (taken off per byte: the bytes are 0..3, so no borrow).
struct TQ2_0 { enum { BL = 256, BYTES = 66, UPB = 8, UNIT = 32, K = 1, HAS_M = 0 };
    static __device__ __forceinline__ void decode(const u8 *b, int p, Unit32 &u) {
        u.a = ld_f16(b + 64); u.b = 0.0f; u.sc = 1; u.mn = 0;
        const u8 *qs = b + 32 * (p / 4);
        int shift = 2 * (p % 4);
        for (int w = 0; w < 8; w++) {
            u32 v = (ld_u32(qs + 4 * w) >> shift) & 0x03030303u;
            u.q[w] = (int)(((v | 0x80808080u) - 0x01010101u) ^ 0x80808080u);
        }
    }
};

// 4-bit floats (activations Q8_0): E2M1 nibbles as doubled integers
// (fp4_value), the half in the block scale.
__device__ __forceinline__ void fp4_quants(const u8 *qs, int words, int *q) {
    for (int w = 0; w < words; w++) {
        q[w] = pack4(fp4_value(qs[4*w]), fp4_value(qs[4*w+1]), fp4_value(qs[4*w+2]), fp4_value(qs[4*w+3]));
        q[w + words] = pack4(fp4_value(qs[4*w] >> 4), fp4_value(qs[4*w+1] >> 4), fp4_value(qs[4*w+2] >> 4),
                             fp4_value(qs[4*w+3] >> 4));
    }
}
// MXFP4 {u8 e; u8 qs[16]}: value j the low nibble of qs[j], 16 + j the high.
struct MXFP4 { enum { BL = 32, BYTES = 17, UPB = 1, UNIT = 32, K = 0, HAS_M = 0 };
    static __device__ __forceinline__ void decode(const u8 *b, int, Unit32 &u) {
        u.a = e8m0_half(b[0]); u.b = 0.0f; u.sc = 1; u.mn = 0;
        fp4_quants(b + 1, 4, u.q);
    }
};
// NVFP4 {u8 d[4]; u8 qs[32]}: four 16-value parts, part s scaled by the
// E4M3 d[s], its value j the low nibble of qs[8s + j], 8 + j the high. Two
// parts share a Q8_0 activation block.
struct NVFP4 { enum { BL = 64, BYTES = 36, UPB = 4, UNIT = 16, K = 0, HAS_M = 0 };
    static __device__ __forceinline__ void decode(const u8 *b, int s, Unit16 &u) {
        u.a = ue4m3_half(b[s]); u.b = 0.0f; u.sc = 1; u.mn = 0;
        fp4_quants(b + 4 + 8 * s, 2, u.q);
    }
};

template <class T> struct UnitOf { typedef Unit32 type; };
template <> struct UnitOf<Q2_K> { typedef Unit16 type; };
template <> struct UnitOf<Q3_K> { typedef Unit16 type; };
template <> struct UnitOf<Q4_K> { typedef Unit16 type; };
template <> struct UnitOf<Q5_K> { typedef Unit16 type; };
template <> struct UnitOf<Q6_K> { typedef Unit16 type; };
template <> struct UnitOf<Q8_K> { typedef Unit16 type; };
template <> struct UnitOf<IQ2_XS> { typedef Unit16 type; };
template <> struct UnitOf<IQ2_S> { typedef Unit16 type; };
template <> struct UnitOf<IQ1_M> { typedef Unit16 type; };
template <> struct UnitOf<TQ1_0> { typedef Unit16 type; };
template <> struct UnitOf<NVFP4> { typedef Unit16 type; };

// One unit's contribution for one activation row: `x` its quants, `xd[ab]`
// the scale of the activation block holding it, `xs[ab]` that block's Q8_0
// sum term (read for HAS_M), `xbs[bi]` the Q8_K sum of its 16 values (read
// for min terms, which come only with 16-value units).
template <class T, class U>
__device__ __forceinline__ float unit_term(const U &u, const int *x, const float *xd, const float *xs,
                                           size_t ab, const i32 *xbs, size_t bi) {
    int s = 0;
#pragma unroll
    for (int k = 0; k < T::UNIT / 4; k++) s = __dp4a(u.q[k], x[k], s);
    float d = xd[ab];
    if (T::K) return d * (u.a * (float)(u.sc * s) - u.b * (float)(u.mn * xbs[bi]));
    if (T::HAS_M) return u.a * d * (float)s + u.b * xs[ab];
    return u.a * d * (float)s;
}

// `xq`: the activations' quants (n x cols); `xd`: a scale per activation
// block (32 values for Q8_0, 256 for Q8_K, whatever the weight's block);
// `xs`: Q8_0's `d * sum` per 32-block; `xbs`: Q8_K's sums per 16.
template <class T>
__device__ void matmul_quant(const u8 *w, int rows, int cols, int n, const i8 *xq,
                             const float *xd, const float *xs, const i32 *xbs, float *out) {
    typedef typename UnitOf<T>::type U;
    constexpr int ABL = T::K ? 256 : 32;
    static_assert(T::BL == T::UPB * T::UNIT && ABL % T::UNIT == 0, "units tile the blocks");
    int row = blockIdx.x * 4 + threadIdx.y;
    if (row >= rows) return;
    int lane = threadIdx.x;
    int r0 = blockIdx.y * MM_ROWS;
    int nr = min(MM_ROWS, n - r0);
    int nb = cols / T::BL;
    const u8 *wrow = w + (size_t)row * nb * T::BYTES;
    float acc[MM_ROWS];
#pragma unroll
    for (int r = 0; r < MM_ROWS; r++) acc[r] = 0.0f;
    for (int unit = lane; unit < nb * T::UPB; unit += 32) {
        int b = unit / T::UPB, part = unit % T::UPB;
        U u;
        T::decode(wrow + (size_t)b * T::BYTES, part, u);
#pragma unroll
        for (int r = 0; r < MM_ROWS; r++) {
            if (r < nr) {
                size_t xr = (size_t)(r0 + r);
                const int *x = (const int *)(xq + xr * cols + b * T::BL + part * T::UNIT);
                // The activation block: the weight's own where both are as
                // long, else the unit's (NVFP4: two to a weight block).
                size_t ab = xr * (cols / ABL) + (T::BL == ABL ? b : unit / (ABL / T::UNIT));
                size_t bi = xr * (cols / 16) + b * (T::BL / 16) + part * (T::UNIT / 16);
                acc[r] += unit_term<T>(u, x, xd, xs, ab, xbs, bi);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < MM_ROWS; r++) {
        float v = warp_sum(acc[r]);
        if (lane == 0 && r < nr) out[(size_t)(r0 + r) * rows + row] = v;
    }
}

#define MATMUL_QUANT(T)                                                                        \
    extern "C" __global__ void __launch_bounds__(128) matmul_##T(                              \
        const u8 *w, int rows, int cols, int n, const i8 *xq, const float *xd,                \
        const float *xs, const i32 *xbs, float *out) {                                         \
        matmul_quant<T>(w, rows, cols, n, xq, xd, xs, xbs, out);                               \
    }
MATMUL_QUANT(Q4_0)
MATMUL_QUANT(Q4_1)
MATMUL_QUANT(Q5_0)
MATMUL_QUANT(Q5_1)
MATMUL_QUANT(Q8_0)
MATMUL_QUANT(Q8_1)
MATMUL_QUANT(Q2_K)
MATMUL_QUANT(Q3_K)
MATMUL_QUANT(Q4_K)
MATMUL_QUANT(Q5_K)
MATMUL_QUANT(Q6_K)
MATMUL_QUANT(Q8_K)
MATMUL_QUANT(IQ4_NL)
MATMUL_QUANT(IQ4_XS)
MATMUL_QUANT(IQ2_XXS)
MATMUL_QUANT(IQ2_XS)
MATMUL_QUANT(IQ2_S)
MATMUL_QUANT(IQ3_XXS)
MATMUL_QUANT(IQ3_S)
MATMUL_QUANT(IQ1_S)
MATMUL_QUANT(IQ1_M)
MATMUL_QUANT(TQ1_0)
MATMUL_QUANT(TQ2_0)
MATMUL_QUANT(MXFP4)
MATMUL_QUANT(NVFP4)

// Float weights: lane k of a warp takes columns k, k + 32, ...
__device__ __forceinline__ float load_w(const float *w, size_t i) { return w[i]; }
__device__ __forceinline__ float load_w(const u16 *w, size_t i) { return f16_to_f32(w[i]); }
struct Bf16Ptr { const u16 *p; };
__device__ __forceinline__ float load_w(Bf16Ptr w, size_t i) { return bf16_to_f32(w.p[i]); }

template <class P>
__device__ void matmul_dense(P w, int rows, int cols, int n, const float *x, float *out) {
    int row = blockIdx.x * 4 + threadIdx.y;
    if (row >= rows) return;
    int lane = threadIdx.x;
    int r0 = blockIdx.y * MM_ROWS;
    int nr = min(MM_ROWS, n - r0);
    float acc[MM_ROWS];
#pragma unroll
    for (int r = 0; r < MM_ROWS; r++) acc[r] = 0.0f;
    for (int k = lane; k < cols; k += 32) {
        float wv = load_w(w, (size_t)row * cols + k);
#pragma unroll
        for (int r = 0; r < MM_ROWS; r++)
            if (r < nr) acc[r] += wv * x[(size_t)(r0 + r) * cols + k];
    }
#pragma unroll
    for (int r = 0; r < MM_ROWS; r++) {
        float v = warp_sum(acc[r]);
        if (lane == 0 && r < nr) out[(size_t)(r0 + r) * rows + row] = v;
    }
}

extern "C" __global__ void __launch_bounds__(128)
matmul_F32(const float *w, int rows, int cols, int n, const float *x, float *out) {
    matmul_dense(w, rows, cols, n, x, out);
}
extern "C" __global__ void __launch_bounds__(128)
matmul_F16(const u16 *w, int rows, int cols, int n, const float *x, float *out) {
    matmul_dense(w, rows, cols, n, x, out);
}
extern "C" __global__ void __launch_bounds__(128)
matmul_BF16(const u16 *w, int rows, int cols, int n, const float *x, float *out) {
    Bf16Ptr p = {w};
    matmul_dense(p, rows, cols, n, x, out);
}
