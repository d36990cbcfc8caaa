// Shared by every kernel file (prepended to each before NVRTC compiles it).
// NVRTC ships no headers: fixed-width types and the f16 conversions are
// declared here, the latter as single PTX instructions, so no CUDA include
// directory is needed at run time. tests/host compiles the same files as
// C++ on the host (tests/host/emulator.h stands in for CUDA).

typedef signed char i8;
typedef unsigned char u8;
typedef unsigned short u16;
typedef int i32;
typedef unsigned int u32;
typedef unsigned long long u64;

#define FULL_MASK 0xffffffffu
#define NEG_INF (__int_as_float(0xff800000))

#if defined(__CUDACC_RTC__)
// f16 bits -> f32 (exact, subnormals included).
__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// f32 -> f16 bits, round to nearest even (overflow to infinity), as the
// `half` crate rounds.
__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#else
// Host build of the kernels (tests/host): the compiler's _Float16 converts
// with the same rounding.
__device__ __forceinline__ float f16_to_f32(u16 h) {
    _Float16 x;
    memcpy(&x, &h, 2);
    return (float)x;
}
__device__ __forceinline__ u16 f32_to_f16(float f) {
    _Float16 x = (_Float16)f;
    u16 h;
    memcpy(&h, &x, 2);
    return h;
}
#endif

__device__ __forceinline__ float round_f16(float f) { return f16_to_f32(f32_to_f16(f)); }

__device__ __forceinline__ float bf16_to_f32(u16 h) { return __int_as_float(((u32)h) << 16); }

// Little-endian loads at any byte offset (GGUF blocks are not aligned).
__device__ __forceinline__ u16 ld_u16(const u8 *p) { return (u16)(p[0] | (p[1] << 8)); }
__device__ __forceinline__ u32 ld_u32(const u8 *p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}
__device__ __forceinline__ float ld_f16(const u8 *p) { return f16_to_f32(ld_u16(p)); }

// The value an IQ4_NL / IQ4_XS nibble indexes (ggml's kvalues_iq4nl).
__device__ __forceinline__ int iq4_value(int nibble) {
    const signed char grid[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                  1, 13, 25, 38, 53, 69, 89, 113};
    return grid[nibble & 15];
}
__device__ __forceinline__ float ld_f32(const u8 *p) { return __int_as_float((int)ld_u32(p)); }

// The 8 signs of a 7-bit index (IQ2_XXS, IQ2_XS, IQ3_XXS): bit j set means
// value j is negative; bit 7 makes the count of negatives even (ggml's
// ksigns_iq2xs, blockdraft_gguf's `ksigns`).
__device__ __forceinline__ u32 ksigns(u32 i) {
    i &= 127;
    return i | ((__popc(i) & 1) << 7);
}

// IQ1_M's f16 super-block scale, one nibble in the top of each scales word
// (the block's bytes 48..55).
__device__ __forceinline__ float iq1m_d(const u8 *b) {
    u32 bits = (ld_u16(b + 48) >> 12) | ((ld_u16(b + 50) >> 8) & 0x00F0) |
               ((ld_u16(b + 52) >> 4) & 0x0F00) | (ld_u16(b + 54) & 0xF000);
    return f16_to_f32((u16)bits);
}

// An E2M1 nibble (MXFP4, NVFP4) doubled, as an integer (ggml's
// kvalues_mxfp4: 0 1 2 3 4 6 8 12, bit 3 the sign); the block scales below
// carry the half. The magnitudes are packed in a word's nibbles, so no
// table goes to local memory.
__device__ __forceinline__ int fp4_value(int nibble) {
    int m = (0xC8643210u >> (4 * (nibble & 7))) & 15;
    return (nibble & 8) ? -m : m;
}

// An E8M0 exponent as 2^(e - 127) / 2, built from its bits (ggml's
// ggml_e8m0_to_fp32_half; e < 2 gives the subnormals).
__device__ __forceinline__ float e8m0_half(u32 e) {
    return __int_as_float((int)(e < 2 ? 0x00200000u << e : (e - 1) << 23));
}

// An unsigned E4M3 scale, halved (ggml's ggml_ue4m3_to_fp32 times 0.5; 0
// and 0x7F, its NaN, read as 0). Every value is a small integer times a
// power of two, so the product is exact and equals the reference's.
__device__ __forceinline__ float ue4m3_half(u32 x) {
    if (x == 0 || x == 0x7F) return 0.0f;
    int exp = (x >> 3) & 15, man = x & 7;
    if (exp == 0) return (float)man * 0.0009765625f; // man * 2^-10
    return (float)(8 + man) * __int_as_float((exp - 11 + 127) << 23);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ int warp_sum_int(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}
