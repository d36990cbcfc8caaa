// Gated activations `out = act(gate) · up` with the CPU backend's float
// sequences: SwiGLU's exp is ggml's vectorised `expf` (crates/cpu/src/ops.rs
// `expf_ggml`) on each row's whole groups of 8 and the library `expf` on the
// rest; GeGLU is ggml's f16 lookup table (input and result rounded to f16).

__device__ float expf_ggml(float x) {
    const float r = __int_as_float(0x4b400000);
    float z = fmaf(x, __int_as_float(0x3fb8aa3b), r);
    float n = z - r;
    float b = fmaf(-n, __int_as_float(0x35bfbe8e), fmaf(-n, __int_as_float(0x3f317200), x));
    u32 e = ((u32)__float_as_int(z)) << 23;
    float k = __int_as_float((int)(e + (u32)__float_as_int(1.0f)));
    float u = b * b;
    float j = fmaf(fmaf(__int_as_float(0x3c072010), b, __int_as_float(0x3d2b9f17)), u,
                   fmaf(__int_as_float(0x3e2aaf33), b, __int_as_float(0x3efffedb)));
    j = fmaf(j, u, __int_as_float(0x3f7ffff6) * b);
    if (fabsf(n) <= 126.0f || isnan(n)) return fmaf(k, j, k);
    u32 g = n <= 0.0f ? 0x82000000u : 0u;
    float s1 = __int_as_float((int)(g + 0x7f000000u));
    float s2 = __int_as_float((int)(e - g));
    if (fabsf(n) > 192.0f) return s1 * s1;
    return fmaf(s2, j, s2) * s1;
}

extern "C" __global__ void swiglu(const float *gate, const float *up, int cols, int n, float *out) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * cols) return;
    int c = (int)(i % cols);
    float g = gate[i];
    float e = c < cols - cols % 8 ? expf_ggml(-g) : expf(-g);
    out[i] = g / (1.0f + e) * up[i];
}

extern "C" __global__ void geglu(const float *gate, const float *up, int cols, int n, float *out) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * cols) return;
    float g = gate[i], u = up[i];
    float v;
    if (g <= -10.0f) {
        v = 0.0f;
    } else if (g >= 10.0f) {
        v = g * u;
    } else {
        float x = round_f16(g);
        float inner = fmaf(0.044715f * x, x, 1.0f);
        // tanh in f64 rounds to the f32 a correctly rounded tanhf gives (glibc's
        // is within an ulp): CUDA's tanhf (2 ulp) could tip the f16 rounding.
        float t = (float)tanh((double)(0.7978846f * x * inner));
        float y = 0.5f * x * (1.0f + t);
        v = round_f16(y) * u;
    }
    out[i] = v;
}
