// Elementwise ops over `n` values (one thread each): residual add, scale,
// bias, the tap sanitiser, softcapping, DFly's weighted slice sum.

extern "C" __global__ void add(float *x, const float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] + y[i];
}

extern "C" __global__ void scale(float *x, float s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * s;
}

extern "C" __global__ void add_bias(float *x, const float *bias, int cols, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] + bias[i % cols];
}

// NaN becomes 0; beyond ±limit (infinities too) clamps.
extern "C" __global__ void clamp_finite(float *x, float limit, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        x[i] = isnan(v) ? 0.0f : fminf(fmaxf(v, -limit), limit);
    }
}

extern "C" __global__ void softcap(float *x, float cap, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = cap * tanhf(x[i] / cap);
}

// out[r][c] += Σ_j w[j] · x[r][j·d + c], in order of j; `n` = rows · d.
extern "C" __global__ void add_slices(const float *x, const float *w, int n_w, int d, int n,
                                      float *out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int r = i / d, c = i % d;
    const float *xr = x + (size_t)r * n_w * d + c;
    float o = out[i];
    for (int j = 0; j < n_w; j++) o = o + w[j] * xr[(size_t)j * d];
    out[i] = o;
}
