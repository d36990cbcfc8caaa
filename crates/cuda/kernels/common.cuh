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
