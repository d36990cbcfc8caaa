// Host stand-ins for what the kernels take from CUDA and common.cuh, so that
// their pure block-decoding functions compile as C++ (tests/host_decode.rs).
// f16 conversions use the compiler's _Float16 (round to nearest even, as the
// PTX cvt.rn the device uses). The kernels compile but are never called:
// a warp reduction here would be a harness bug.
#include <cstdint>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cstdlib>
using std::min; using std::max;
#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(x)
#define __shared__ static
struct Dim3 { unsigned x, y, z; };
static Dim3 threadIdx, blockIdx, blockDim;
typedef signed char i8; typedef unsigned char u8; typedef unsigned short u16;
typedef int i32; typedef unsigned int u32; typedef unsigned long long u64;
#define FULL_MASK 0xffffffffu
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
#define NEG_INF (__int_as_float(0xff800000))
static inline float f16_to_f32(u16 h) { _Float16 x; memcpy(&x, &h, 2); return (float)x; }
static inline u16 f32_to_f16(float f) { _Float16 x = (_Float16)f; u16 h; memcpy(&h, &x, 2); return h; }
static inline float round_f16(float f) { return f16_to_f32(f32_to_f16(f)); }
static inline float bf16_to_f32(u16 h) { return __int_as_float(((u32)h) << 16); }
static inline u16 ld_u16(const u8 *p) { return (u16)(p[0] | (p[1] << 8)); }
static inline u32 ld_u32(const u8 *p) { return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24); }
static inline float ld_f16(const u8 *p) { return f16_to_f32(ld_u16(p)); }
static inline float ld_f32(const u8 *p) { return __int_as_float((int)ld_u32(p)); }
static inline int __dp4a(int a, int b, int c) {
  for (int i = 0; i < 4; i++) c += (int)(i8)(a >> (8*i)) * (int)(i8)(b >> (8*i));
  return c;
}
static inline float warp_sum(float) { abort(); }
