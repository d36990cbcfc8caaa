// RMS norm of every `group`-wide slice of a row, times `weight`: the CPU
// backend's float sequence (f32 squares summed in f64, f32 mean, scale and
// products), so only the f64 summation order differs. One 256-thread block
// per (group, row).
extern "C" __global__ void __launch_bounds__(256)
rms_norm(const float *x, const float *weight, int cols, int group, float eps, float *out) {
    __shared__ double partial[8];
    const float *xs = x + (size_t)blockIdx.y * cols + (size_t)blockIdx.x * group;
    float *os = out + (size_t)blockIdx.y * cols + (size_t)blockIdx.x * group;
    double sum = 0.0;
    for (int i = threadIdx.x; i < group; i += 256) {
        float v = xs[i];
        sum += (double)(v * v);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(FULL_MASK, sum, o);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x / 32] = sum;
    __syncthreads();
    double total = 0.0;
#pragma unroll
    for (int w = 0; w < 8; w++) total += partial[w];
    float mean = (float)(total / (double)group);
    float scale = 1.0f / sqrtf(mean + eps);
    for (int i = threadIdx.x; i < group; i += 256) os[i] = (xs[i] * scale) * weight[i];
}
