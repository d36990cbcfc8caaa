// Index of the largest value of each row, the first on ties, written as f32
// down column `col` of `out` from row `row0` (ids are exact in f32 below
// 2^24). As the reference's sequential scan: NaN never wins, except that a
// NaN in column 0 is never beaten. One 256-thread block per row.
__device__ __forceinline__ void better(float &v, int &i, float ov, int oi) {
    bool take = (i < 0) || (oi >= 0 && (ov > v || (ov == v && oi < i)));
    if (take) { v = ov; i = oi; }
}

extern "C" __global__ void __launch_bounds__(256)
argmax_rows(const float *x, int cols, float *out, int out_cols, int row0, int col) {
    __shared__ float sv[8];
    __shared__ int si[8];
    const float *xr = x + (size_t)blockIdx.x * cols;
    float v = 0.0f;
    int idx = -1;
    for (int c = threadIdx.x; c < cols; c += 256) {
        float xv = xr[c];
        if (!isnan(xv)) better(v, idx, xv, c);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(FULL_MASK, v, o);
        int oi = __shfl_xor_sync(FULL_MASK, idx, o);
        better(v, idx, ov, oi);
    }
    if ((threadIdx.x & 31) == 0) { sv[threadIdx.x / 32] = v; si[threadIdx.x / 32] = idx; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < 8; w++) better(v, idx, sv[w], si[w]);
        if (idx < 0 || isnan(xr[0])) idx = 0;
        out[(size_t)(row0 + blockIdx.x) * out_cols + col] = (float)idx;
    }
}
