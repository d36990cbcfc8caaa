// Runs the CUDA kernels on the host for tests/host_*.rs: what they take from
// CUDA (thread and block indices, warp shuffles, __syncthreads, __dp4a) for
// g++/clang, included before kernels/common.cuh. A launch runs its blocks
// one after another and a block's threads as host threads, in step at every
// shuffle (per warp) and every __syncthreads (per block); `__shared__`
// becomes `static`, which is right with one block at a time.
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>
using std::isnan;
using std::max;
using std::min;

#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(...)
#define __shared__ static

struct Dim3 {
    unsigned x = 1, y = 1, z = 1;
};
thread_local Dim3 threadIdx, blockIdx;
Dim3 blockDim, gridDim;

static inline float __int_as_float(int i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
static inline int __float_as_int(float f) {
    int i;
    memcpy(&i, &f, 4);
    return i;
}
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
    return c;
}

// The running block: its barriers and each warp's shuffle slots.
struct BlockState {
    std::barrier<> *block;
    std::barrier<> *warp[32];
    uint64_t slot[32][32];
};
static BlockState *g_block;
thread_local int t_warp, t_lane;

template <class T> T shuffle(T v, int src, bool valid) {
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof(T));
    g_block->slot[t_warp][t_lane] = bits;
    g_block->warp[t_warp]->arrive_and_wait();
    T r = v;
    if (valid) memcpy(&r, &g_block->slot[t_warp][src], sizeof(T));
    g_block->warp[t_warp]->arrive_and_wait();
    return r;
}
template <class T> T __shfl_xor_sync(unsigned, T v, int mask) { return shuffle(v, t_lane ^ mask, true); }
template <class T> T __shfl_down_sync(unsigned, T v, int d) { return shuffle(v, t_lane + d, t_lane + d < 32); }
static inline void __syncthreads() { g_block->block->arrive_and_wait(); }

// Runs `kernel` (a callable making the kernel call) over grid x block.
template <class F> void launch(Dim3 grid, Dim3 block, F kernel) {
    gridDim = grid;
    blockDim = block;
    int threads = block.x * block.y;
    for (unsigned by = 0; by < grid.y; by++)
        for (unsigned bx = 0; bx < grid.x; bx++) {
            BlockState state;
            std::barrier<> all(threads);
            state.block = &all;
            std::vector<std::barrier<> *> warps;
            for (int w = 0; w < (threads + 31) / 32; w++) {
                warps.push_back(new std::barrier<>(32));
                state.warp[w] = warps.back();
            }
            g_block = &state;
            std::vector<std::thread> pool;
            for (int t = 0; t < threads; t++)
                pool.emplace_back([=]() {
                    blockIdx = {bx, by, 0};
                    threadIdx = {(unsigned)(t % block.x), (unsigned)(t / block.x), 0};
                    t_warp = t / 32;
                    t_lane = t % 32;
                    kernel();
                });
            for (auto &t : pool) t.join();
            for (auto *w : warps) delete w;
        }
}
