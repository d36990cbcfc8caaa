// Activation quantization for the quantized matmuls, bit for bit the CPU
// backend's rules (crates/cpu/src/kernels/scalar.rs): the matmuls then agree
// with it up to summation order.

// Q8_0 rule over 32-blocks, one warp per block: quants `q`, scale `d`
// (rounded to f16) and `s` (`d * sum`, or llama.cpp's block_q8_1 sum
// `f16(amax / 127 * sum)` with `q8_1_sums`), for `n_blocks` blocks.
extern "C" __global__ void quantize_q8_0(const float *x, int n_blocks, int q8_1_sums, i8 *q,
                                         float *d, float *s) {
    int blk = blockIdx.x * 4 + threadIdx.y;
    if (blk >= n_blocks) return;
    int lane = threadIdx.x;
    float v = x[(size_t)blk * 32 + lane];
    float amax = warp_max(fabsf(v));
    float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    int qi = (int)rintf(v * id);
    q[(size_t)blk * 32 + lane] = (i8)qi;
    int sum = warp_sum_int(qi);
    if (lane == 0) {
        float db = round_f16(amax / 127.0f);
        d[blk] = db;
        s[blk] = q8_1_sums ? round_f16(amax / 127.0f * (float)sum) : db * (float)sum;
    }
}

// Q8_K rule over 256-blocks, one warp per block (8 values a lane): the scale
// from the signed value of largest magnitude (the first one on ties), quants
// clamped to 127, and the sum of every 16 quants.
extern "C" __global__ void quantize_q8_k(const float *x, int n_blocks, i8 *q, float *d, i32 *bs) {
    int blk = blockIdx.x * 4 + threadIdx.y;
    if (blk >= n_blocks) return;
    int lane = threadIdx.x;
    const float *xb = x + (size_t)blk * 256 + lane * 8;
    float v[8];
    float best = 0.0f;
    int best_i = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        v[i] = xb[i];
        if (fabsf(v[i]) > fabsf(best)) {
            best = v[i];
            best_i = lane * 8 + i;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ob = __shfl_xor_sync(FULL_MASK, best, o);
        int oi = __shfl_xor_sync(FULL_MASK, best_i, o);
        if (fabsf(ob) > fabsf(best) || (fabsf(ob) == fabsf(best) && oi < best_i)) {
            best = ob;
            best_i = oi;
        }
    }
    i8 *qb = q + (size_t)blk * 256 + lane * 8;
    int part = 0;
    if (best == 0.0f) {
#pragma unroll
        for (int i = 0; i < 8; i++) qb[i] = 0;
    } else {
        float iscale = -127.0f / best;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int qi = (int)fminf(rintf(iscale * v[i]), 127.0f);
            qb[i] = (i8)qi;
            part += qi;
        }
    }
    // Lanes 2g and 2g + 1 hold group g's 16 quants.
    part += __shfl_down_sync(FULL_MASK, part, 1);
    if ((lane & 1) == 0) bs[(size_t)blk * 16 + lane / 2] = part;
    if (lane == 0) d[blk] = best == 0.0f ? 0.0f : 1.0f / (-127.0f / best);
}
