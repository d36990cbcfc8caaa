// Scaled-dot-product attention of query rows over the KV cache (f32 or f16),
// grouped-query, causal or not, with an optional sliding window: the keys
// row i sees are lo..hi (as the CPU backend's `visible_keys`). One block of
// ATT_WARPS warps per (head, row): each warp takes every ATT_WARPS-th key
// with an online softmax (a lane holds head dims lane, lane + 32, ...), then
// the warps' partial sums are merged. A row that sees no key gives zeros.
// Each row is computed alone, so verify rows equal decode rows.

#define ATT_WARPS 4
#define ATT_MAX_DIM 256

__device__ __forceinline__ float kv_load(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float kv_load(const u16 *p, size_t i) { return f16_to_f32(p[i]); }

template <class KV>
__device__ void attention_row(const float *q, const KV *k, const KV *v, float *out, int q_pos0,
                              int kv_len, int causal, int window, int n_head, int n_head_kv,
                              int head_dim, float scale) {
    __shared__ float s_m[ATT_WARPS], s_l[ATT_WARPS];
    __shared__ float s_acc[ATT_WARPS][ATT_MAX_DIM];
    int head = blockIdx.x, row = blockIdx.y;
    int warp = threadIdx.y, lane = threadIdx.x;
    int pos = q_pos0 + row;
    int hi = causal ? min(pos + 1, kv_len) : kv_len;
    int lo = window >= 0 ? max(pos + 1 - window, 0) : 0;
    lo = min(lo, hi);
    int kv_cols = n_head_kv * head_dim;
    int kv_head = head / (n_head / n_head_kv);
    const float *qh = q + (size_t)row * n_head * head_dim + (size_t)head * head_dim;
    int dims = (head_dim + 31) / 32;
    float qv[ATT_MAX_DIM / 32], acc[ATT_MAX_DIM / 32];
#pragma unroll
    for (int i = 0; i < ATT_MAX_DIM / 32; i++) {
        int d = lane + 32 * i;
        qv[i] = (i < dims && d < head_dim) ? qh[d] : 0.0f;
        acc[i] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    for (int j = lo + warp; j < hi; j += ATT_WARPS) {
        const KV *kr = k + (size_t)j * kv_cols + (size_t)kv_head * head_dim;
        const KV *vr = v + (size_t)j * kv_cols + (size_t)kv_head * head_dim;
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < ATT_MAX_DIM / 32; i++) {
            int d = lane + 32 * i;
            if (i < dims && d < head_dim) dot += qv[i] * kv_load(kr, d);
        }
        float s = warp_sum(dot) * scale;
        float m_new = fmaxf(m, s);
        float corr = m == NEG_INF ? 0.0f : expf(m - m_new);
        float p = expf(s - m_new);
        l = l * corr + p;
#pragma unroll
        for (int i = 0; i < ATT_MAX_DIM / 32; i++) {
            int d = lane + 32 * i;
            if (i < dims && d < head_dim) acc[i] = acc[i] * corr + p * kv_load(vr, d);
        }
        m = m_new;
    }
    if (lane == 0) { s_m[warp] = m; s_l[warp] = l; }
#pragma unroll
    for (int i = 0; i < ATT_MAX_DIM / 32; i++) {
        int d = lane + 32 * i;
        if (i < dims && d < head_dim) s_acc[warp][d] = acc[i];
    }
    __syncthreads();
    float big = NEG_INF;
#pragma unroll
    for (int w = 0; w < ATT_WARPS; w++) big = fmaxf(big, s_m[w]);
    float total = 0.0f, weight[ATT_WARPS];
#pragma unroll
    for (int w = 0; w < ATT_WARPS; w++) {
        weight[w] = s_m[w] == NEG_INF ? 0.0f : expf(s_m[w] - big);
        total += s_l[w] * weight[w];
    }
    float *oh = out + (size_t)row * n_head * head_dim + (size_t)head * head_dim;
    for (int d = warp * 32 + lane; d < head_dim; d += 32 * ATT_WARPS) {
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++) o += s_acc[w][d] * weight[w];
        oh[d] = total > 0.0f ? o / total : 0.0f;
    }
}

#define ATTENTION(NAME, KV)                                                                    \
    extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) NAME(                         \
        const float *q, const KV *k, const KV *v, float *out, int q_pos0, int kv_len,         \
        int causal, int window, int n_head, int n_head_kv, int head_dim, float scale) {       \
        attention_row<KV>(q, k, v, out, q_pos0, kv_len, causal, window, n_head, n_head_kv,    \
                          head_dim, scale);                                                    \
    }
ATTENTION(attention_f32, float)
ATTENTION(attention_f16, u16)
