// Embedding rows: `out[r] = dequantize(table[ids[(id0 + r)·stride]])`, with
// the float sequences of the reference dequantizers (blockdraft_gguf::quants,
// compiled without FMA contraction) so rows equal the CPU backend's bit for
// bit. Ids are f32 (as argmax_to writes them); an id beyond the table gives
// a zero row. Grid: (column tiles of 256, rows).

// Value `e` (0..BL) of the block at `b`.
__device__ __forceinline__ float deq_q4_0(const u8 *b, int e) {
    int q = b[2 + e % 16];
    q = e < 16 ? (q & 15) : (q >> 4);
    return (float)(q - 8) * ld_f16(b);
}
__device__ __forceinline__ float deq_q4_1(const u8 *b, int e) {
    int q = b[4 + e % 16];
    q = e < 16 ? (q & 15) : (q >> 4);
    return (float)q * ld_f16(b) + ld_f16(b + 2);
}
__device__ __forceinline__ int q5_value(const u8 *qs, u32 qh, int e) {
    int j = e % 16;
    u32 q = qs[j];
    return e < 16 ? (int)((q & 15) | (((qh >> j) << 4) & 0x10))
                  : (int)((q >> 4) | ((qh >> (j + 12)) & 0x10));
}
__device__ __forceinline__ float deq_q5_0(const u8 *b, int e) {
    return (float)(q5_value(b + 6, ld_u32(b + 2), e) - 16) * ld_f16(b);
}
__device__ __forceinline__ float deq_q5_1(const u8 *b, int e) {
    return (float)q5_value(b + 8, ld_u32(b + 4), e) * ld_f16(b) + ld_f16(b + 2);
}
__device__ __forceinline__ float deq_q8_0(const u8 *b, int e) { return (float)(i8)b[2 + e] * ld_f16(b); }
__device__ __forceinline__ float deq_q8_1(const u8 *b, int e) { return (float)(i8)b[4 + e] * ld_f16(b); }
__device__ __forceinline__ float deq_q2_k(const u8 *b, int e) {
    int n = e / 128, r = e % 128, shift = 2 * (r / 32), half = (r % 32) / 16, l = r % 16;
    int s = b[n * 8 + (r / 32) * 2 + half];
    float dl = ld_f16(b + 80) * (float)(s & 15);
    float ml = ld_f16(b + 82) * (float)(s >> 4);
    return dl * (float)((b[16 + 32 * n + 16 * half + l] >> shift) & 3) - ml;
}
__device__ __forceinline__ float deq_q3_k(const u8 *b, int e) {
    int n = e / 128, r = e % 128, shift = 2 * (r / 32), half = (r % 32) / 16, l = r % 16;
    int is = n * 8 + (r / 32) * 2 + half, i = 16 * half + l;
    const u8 *s = b + 96;
    int lo = is < 8 ? (s[is] & 15) : (s[is - 8] >> 4);
    int hi = (s[8 + is % 4] >> (2 * (is / 4))) & 3;
    float dl = ld_f16(b + 108) * (float)((lo | (hi << 4)) - 32);
    int m = 1 << (4 * n + r / 32);
    int v = ((b[32 + 32 * n + i] >> shift) & 3) - ((b[i] & m) ? 0 : 4);
    return dl * (float)v;
}
__device__ __forceinline__ void scale_min_k4(int j, const u8 *q, int &sc, int &m) {
    if (j < 4) {
        sc = q[j] & 63; m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}
__device__ __forceinline__ float deq_q4_k(const u8 *b, int e) {
    int j = e / 64, w = e % 64, l = w % 32, sc, m;
    scale_min_k4(2 * j + w / 32, b + 4, sc, m);
    float d1 = ld_f16(b) * (float)sc, m1 = ld_f16(b + 2) * (float)m;
    int q = b[16 + 32 * j + l];
    return d1 * (float)(w < 32 ? (q & 15) : (q >> 4)) - m1;
}
__device__ __forceinline__ float deq_q5_k(const u8 *b, int e) {
    int j = e / 64, w = e % 64, l = w % 32, sc, m;
    scale_min_k4(2 * j + w / 32, b + 4, sc, m);
    float d1 = ld_f16(b) * (float)sc, m1 = ld_f16(b + 2) * (float)m;
    int q = b[48 + 32 * j + l];
    int u = (w < 32 ? 1 : 2) << (2 * j);
    int h = (b[16 + l] & u) ? 16 : 0;
    return d1 * (float)((w < 32 ? (q & 15) : (q >> 4)) + h) - m1;
}
__device__ __forceinline__ float deq_q6_k(const u8 *b, int e) {
    int n = e / 128, r = e % 128, g = r / 32, l = r % 32;
    int ql = b[64 * n + l + 32 * (g & 1)];
    int qh = b[128 + 32 * n + l];
    int q = (((g >= 2 ? ql >> 4 : ql) & 15) | (((qh >> (2 * g)) & 3) << 4)) - 32;
    float sc = (float)(i8)b[192 + 8 * n + l / 16 + 2 * g];
    return ld_f16(b + 208) * sc * (float)q;
}
__device__ __forceinline__ float deq_q8_k(const u8 *b, int e) { return ld_f32(b) * (float)(i8)b[4 + e]; }
__device__ __forceinline__ float deq_iq4_nl(const u8 *b, int e) {
    int q = b[2 + e % 16];
    return ld_f16(b) * (float)iq4_value(e < 16 ? q : q >> 4);
}
__device__ __forceinline__ float deq_iq4_xs(const u8 *b, int e) {
    int j = e / 32, l = e % 32;
    int lo = (b[4 + j / 2] >> (4 * (j % 2))) & 15;
    int hi = (ld_u16(b + 2) >> (2 * j)) & 3;
    float dl = ld_f16(b) * (float)((lo | (hi << 4)) - 32);
    int q = b[8 + 16 * j + l % 16];
    return dl * (float)iq4_value(l < 16 ? q : q >> 4);
}

// Lattice types: value j of the 8-value group `l` of 32-block `ib`, in the
// reference's order: db · grid · (±1) (IQ2, IQ3), dl · (grid ± 1/8) (IQ1).
__device__ __forceinline__ float signed_value(float db, u32 g, u32 signs, int j) {
    float v = db * (float)g;
    return (signs >> j) & 1 ? v * -1.0f : v;
}
__device__ __forceinline__ u32 grid_byte(u64 row, int j) { return (u32)(row >> (8 * j)) & 255; }
__device__ __forceinline__ float deq_iq2_xxs(const u8 *b, int e) {
    int ib = e / 32, l = (e % 32) / 8, j = e % 8;
    const u8 *q = b + 2 + 8 * ib;
    u32 aux = ld_u32(q + 4);
    float db = ld_f16(b) * (0.5f + (float)(aux >> 28)) * 0.25f;
    return signed_value(db, grid_byte(iq2xxs_grid[q[l]], j), ksigns(aux >> (7 * l)), j);
}
__device__ __forceinline__ float deq_iq2_xs(const u8 *b, int e) {
    int ib = e / 32, l = (e % 32) / 8, j = e % 8;
    u32 w = ld_u16(b + 2 + 2 * (4 * ib + l));
    float db = ld_f16(b) * (0.5f + (float)((b[66 + ib] >> (4 * (l / 2))) & 15)) * 0.25f;
    return signed_value(db, grid_byte(iq2xs_grid[w & 511], j), ksigns(w >> 9), j);
}
__device__ __forceinline__ float deq_iq2_s(const u8 *b, int e) {
    int ib = e / 32, l = (e % 32) / 8, j = e % 8;
    int idx = b[2 + 4 * ib + l] | ((b[66 + ib] << (8 - 2 * l)) & 0x300);
    float db = ld_f16(b) * (0.5f + (float)((b[74 + ib] >> (4 * (l / 2))) & 15)) * 0.25f;
    return signed_value(db, grid_byte(iq2s_grid[idx], j), b[34 + 4 * ib + l], j);
}
__device__ __forceinline__ float deq_iq3_xxs(const u8 *b, int e) {
    int ib = e / 32, l = (e % 32) / 8, j = e % 8;
    u32 aux = ld_u32(b + 66 + 4 * ib);
    float db = ld_f16(b) * (0.5f + (float)(aux >> 28)) * 0.5f;
    u32 row = iq3xxs_grid[b[2 + 8 * ib + 2 * l + j / 4]];
    return signed_value(db, grid_byte(row, j % 4), ksigns(aux >> (7 * l)), j);
}
__device__ __forceinline__ float deq_iq3_s(const u8 *b, int e) {
    int ib = e / 32, l = (e % 32) / 8, j = e % 8, h = j / 4;
    int qh = b[66 + ib];
    int idx = b[2 + 8 * ib + 2 * l + h] | ((qh << (8 - 2 * l - h)) & 256);
    float db = ld_f16(b) * (float)(1 + 2 * ((b[106 + ib / 2] >> (4 * (ib % 2))) & 15));
    return signed_value(db, grid_byte(iq3s_grid[idx], j % 4), b[74 + 4 * ib + l], j);
}
__device__ __forceinline__ float deq_iq1_s(const u8 *b, int e) {
    int ib = e / 32, l = (e % 32) / 8, j = e % 8;
    u32 qh = ld_u16(b + 34 + 2 * ib);
    float dl = ld_f16(b) * (float)(2 * ((qh >> 12) & 7) + 1);
    float delta = (qh & 0x8000) ? -0.125f : 0.125f;
    u64 row = iq1s_grid[b[2 + 4 * ib + l] | (((qh >> (3 * l)) & 7) << 8)];
    return dl * ((float)(i8)grid_byte(row, j) + delta);
}
__device__ __forceinline__ float deq_iq1_m(const u8 *b, int e) {
    int ib = e / 32, l = (e % 32) / 8, j = e % 8;
    int sc = (ld_u16(b + 48 + 2 * (ib / 2)) >> (6 * (ib % 2) + 3 * (l / 2))) & 7;
    float dl = iq1m_d(b) * (float)(2 * sc + 1);
    int nib = (b[32 + 2 * ib + l / 2] >> (4 * (l % 2))) & 15;
    float delta = (nib & 8) ? -0.125f : 0.125f;
    u64 row = iq1s_grid[b[4 * ib + l] | ((nib & 7) << 8)];
    return dl * ((float)(i8)grid_byte(row, j) + delta);
}
// TQ1_0: value e is a base-3 digit of qs (e < 240) or qh (see matmul.cu).
__device__ __forceinline__ float deq_tq1_0(const u8 *b, int e) {
    int at, n;
    if (e < 160) { at = e % 32; n = e / 32; }
    else if (e < 240) { at = 32 + (e - 160) % 16; n = (e - 160) / 16; }
    else { at = 48 + (e - 240) % 4; n = (e - 240) / 4; }
    int pow3 = n == 0 ? 1 : (n == 1 ? 3 : (n == 2 ? 9 : (n == 3 ? 27 : 81)));
    int digit = ((((b[at] * pow3) & 255) * 3) >> 8) - 1;
    return (float)digit * ld_f16(b + 52);
}
__device__ __forceinline__ float deq_tq2_0(const u8 *b, int e) {
    int q = (b[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
    return (float)(q - 1) * ld_f16(b + 64);
}
__device__ __forceinline__ float deq_mxfp4(const u8 *b, int e) {
    int q = b[1 + e % 16];
    return (float)fp4_value(e < 16 ? q : q >> 4) * e8m0_half(b[0]);
}
__device__ __forceinline__ float deq_nvfp4(const u8 *b, int e) {
    int s = e / 16, j = e % 16;
    int q = b[4 + 8 * s + j % 8];
    return (float)fp4_value(j < 8 ? q : q >> 4) * ue4m3_half(b[s]);
}
__device__ __forceinline__ float deq_f32(const u8 *b, int) { return ld_f32(b); }
__device__ __forceinline__ float deq_f16(const u8 *b, int) { return ld_f16(b); }
__device__ __forceinline__ float deq_bf16(const u8 *b, int) { return bf16_to_f32(ld_u16(b)); }

#define EMBED(NAME, DEQ, BL, BYTES)                                                            \
    extern "C" __global__ void embed_##NAME(const u8 *table, int table_rows, int cols,        \
                                            const float *ids, int id_stride, int id0,         \
                                            float *out) {                                      \
        int c = blockIdx.x * 256 + threadIdx.x;                                                \
        if (c >= cols) return;                                                                 \
        int r = blockIdx.y;                                                                    \
        float idf = ids[(size_t)(id0 + r) * id_stride];                                        \
        float v = 0.0f;                                                                        \
        if (idf >= 0.0f && idf < (float)table_rows) {                                          \
            size_t row_bytes = (size_t)(cols / (BL)) * (BYTES);                                \
            const u8 *b = table + (size_t)idf * row_bytes + (size_t)(c / (BL)) * (BYTES);     \
            v = DEQ(b, c % (BL));                                                              \
        }                                                                                      \
        out[(size_t)r * cols + c] = v;                                                         \
    }
EMBED(F32, deq_f32, 1, 4)
EMBED(F16, deq_f16, 1, 2)
EMBED(BF16, deq_bf16, 1, 2)
EMBED(Q4_0, deq_q4_0, 32, 18)
EMBED(Q4_1, deq_q4_1, 32, 20)
EMBED(Q5_0, deq_q5_0, 32, 22)
EMBED(Q5_1, deq_q5_1, 32, 24)
EMBED(Q8_0, deq_q8_0, 32, 34)
EMBED(Q8_1, deq_q8_1, 32, 36)
EMBED(Q2_K, deq_q2_k, 256, 84)
EMBED(Q3_K, deq_q3_k, 256, 110)
EMBED(Q4_K, deq_q4_k, 256, 144)
EMBED(Q5_K, deq_q5_k, 256, 176)
EMBED(Q6_K, deq_q6_k, 256, 210)
EMBED(Q8_K, deq_q8_k, 256, 292)
EMBED(IQ4_NL, deq_iq4_nl, 32, 18)
EMBED(IQ4_XS, deq_iq4_xs, 256, 136)
EMBED(IQ2_XXS, deq_iq2_xxs, 256, 66)
EMBED(IQ2_XS, deq_iq2_xs, 256, 74)
EMBED(IQ2_S, deq_iq2_s, 256, 82)
EMBED(IQ3_XXS, deq_iq3_xxs, 256, 98)
EMBED(IQ3_S, deq_iq3_s, 256, 110)
EMBED(IQ1_S, deq_iq1_s, 256, 50)
EMBED(IQ1_M, deq_iq1_m, 256, 56)
EMBED(TQ1_0, deq_tq1_0, 256, 54)
EMBED(TQ2_0, deq_tq2_0, 256, 66)
EMBED(MXFP4, deq_mxfp4, 32, 17)
EMBED(NVFP4, deq_nvfp4, 64, 36)
