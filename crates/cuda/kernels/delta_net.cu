// A hybrid model's gated-DeltaNet block (HybridOps): the causal depthwise
// convolution over rows with its rolling state, then SiLU, one thread per
// channel; and the gated delta rule over rows in order, a block per value
// head and 128 of its value columns, one column per thread, the head's query
// and key in shared memory. The state is key-major (row i: key index i over
// the value columns), so a warp's reads of a row are coalesced.

// Row `r` of the convolution's window: the state's rows, then the new ones.
__device__ __forceinline__ float conv_window(const float *state, const float *x, int c, int history,
                                             int r, int ch) {
    return r < history ? state[(size_t)r * c + ch] : x[(size_t)(r - history) * c + ch];
}

// `w` is the `{taps, c}` F32 tensor: channel ch's taps at ch·taps.., the last
// on the newest row; sums in tap order, as the CPU backend's.
extern "C" __global__ void causal_conv_silu(const float *x, const unsigned char *w_bytes, int n, int c,
                                            int taps, float *state, float *out) {
    int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= c) return;
    const float *w = (const float *)w_bytes + (size_t)ch * taps;
    int history = taps - 1;
    for (int t = 0; t < n; t++) {
        float sum = 0.0f;
        for (int tap = 0; tap < taps; tap++) sum = sum + conv_window(state, x, c, history, t + tap, ch) * w[tap];
        out[(size_t)t * c + ch] = sum / (1.0f + expf(-sum));
    }
    // Row j of the new state is window row n + j, at or after row j.
    for (int j = 0; j < history; j++) state[(size_t)j * c + ch] = conv_window(state, x, c, history, n + j, ch);
}

#define DN_THREADS 128
// Widest key head (Qwen3.5's are 128).
#define DN_MAX_K 256

// `v` summed over the block, returned to every thread.
__device__ __forceinline__ float dn_block_sum(float *red, float v) {
    red[threadIdx.x] = v;
    __syncthreads();
    for (int s = DN_THREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }
    float total = red[0];
    __syncthreads();
    return total;
}

// Block (h, b): value head h, columns b·128 ..; see Backend::gated_delta_rule.
// (A minimum of blocks per SM lets ptxas take the registers it needs: without
// one, sm_90's ptxas holds this kernel to 32 registers and spills.)
extern "C" __global__ void __launch_bounds__(DN_THREADS, 4)
gated_delta_rule(const float *x, const float *alpha, const float *beta, const float *dt_bias, const float *a,
                 int n, int hk, int hv, int dk, int dv, float eps, float *state, float *out) {
    __shared__ float q_s[DN_MAX_K];
    __shared__ float k_s[DN_MAX_K];
    __shared__ float red[DN_THREADS];
    int h = blockIdx.x, j = blockIdx.y * DN_THREADS + threadIdx.x, kh = h % hk;
    bool owns = j < dv;
    int width = 2 * hk * dk + hv * dv;
    float q_scale = 1.0f / sqrtf((float)dk);
    float *s = state + (size_t)h * dk * dv + j;
    for (int t = 0; t < n; t++) {
        const float *row = x + (size_t)t * width;
        float qq = 0.0f, kk = 0.0f;
        for (int i = threadIdx.x; i < dk; i += DN_THREADS) {
            float qv = row[kh * dk + i], kv = row[(hk + kh) * dk + i];
            q_s[i] = qv;
            k_s[i] = kv;
            qq = qq + qv * qv;
            kk = kk + kv * kv;
        }
        // L2 norms with a floor; the sums' barriers publish q_s and k_s.
        float qs = q_scale / fmaxf(sqrtf(dn_block_sum(red, qq)), eps);
        float ks = 1.0f / fmaxf(sqrtf(dn_block_sum(red, kk)), eps);
        if (owns) {
            float u = alpha[(size_t)t * hv + h] + dt_bias[h];
            float g = expf((u > 20.0f ? u : logf(1.0f + expf(u))) * a[h]);
            float b = 1.0f / (1.0f + expf(-beta[(size_t)t * hv + h]));
            float sk = 0.0f;
            for (int i = 0; i < dk; i++) {
                float e = s[(size_t)i * dv] * g;
                s[(size_t)i * dv] = e;
                sk = sk + e * (k_s[i] * ks);
            }
            float d = (row[2 * hk * dk + h * dv + j] - sk) * b;
            float o = 0.0f;
            for (int i = 0; i < dk; i++) {
                float e = s[(size_t)i * dv] + (k_s[i] * ks) * d;
                s[(size_t)i * dv] = e;
                o = o + e * (q_s[i] * qs);
            }
            out[((size_t)t * hv + h) * dv + j] = o;
        }
        // q_s and k_s are rewritten for the next row.
        __syncthreads();
    }
}
