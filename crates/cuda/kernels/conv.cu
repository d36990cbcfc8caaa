// DFlash2's grouped dynamic depthwise convolution (Backend::grouped_conv):
// out[i][c] = Σ_{t < min(T, i+1)} (base[k][c] + dynamic[i][k·G' + c/group]) ·
// x[i − t][c] with k = side·T + t and G' = d / group, summed in order of t
// as the CPU backend does. One thread per output value.
extern "C" __global__ void grouped_conv(const float *x, const float *base, const float *dyn,
                                        int n, int d, int taps, int group, int side, float *out) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n * d) return;
    int i = idx / d, c = idx % d, groups = d / group;
    int dyn_cols = 2 * taps * groups;
    float o = 0.0f;
    for (int t = 0; t < taps && t <= i; t++) {
        int k = side * taps + t;
        float bv = base[(size_t)k * d + c];
        float dg = dyn[(size_t)i * dyn_cols + k * groups + c / group];
        o = o + (bv + dg) * x[(size_t)(i - t) * d + c];
    }
    out[idx] = o;
}
