// `out = x · Wᵀ` for every GGUF weight type, read in place. One warp per
// weight row (four rows to a 128-thread block), each lane taking whole
// units (a 32-block, or a 16-value part of a 256-super-block) in turn and
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

template <class T> struct UnitOf { typedef Unit32 type; };
template <> struct UnitOf<Q2_K> { typedef Unit16 type; };
template <> struct UnitOf<Q3_K> { typedef Unit16 type; };
template <> struct UnitOf<Q4_K> { typedef Unit16 type; };
template <> struct UnitOf<Q5_K> { typedef Unit16 type; };
template <> struct UnitOf<Q6_K> { typedef Unit16 type; };
template <> struct UnitOf<Q8_K> { typedef Unit16 type; };

// `xq`: the activations' quants (n x cols); `xd`: a scale per block of BL;
// `xs`: Q8_0's `d * sum` per 32-block; `xbs`: Q8_K's sums per 16.
template <class T>
__device__ void matmul_quant(const u8 *w, int rows, int cols, int n, const i8 *xq,
                             const float *xd, const float *xs, const i32 *xbs, float *out) {
    typedef typename UnitOf<T>::type U;
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
                int s = 0;
#pragma unroll
                for (int k = 0; k < T::UNIT / 4; k++) s = __dp4a(u.q[k], x[k], s);
                float d = xd[xr * nb + b];
                if (T::K) {
                    int bs = xbs[xr * (cols / 16) + b * 16 + part];
                    acc[r] += d * (u.a * (float)(u.sc * s) - u.b * (float)(u.mn * bs));
                } else if (T::HAS_M) {
                    acc[r] += u.a * d * (float)s + u.b * xs[xr * nb + b];
                } else {
                    acc[r] += u.a * d * (float)s;
                }
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
