// Gated attention (Qwen3.5, HybridOps): `attn_q` yields each head's queries
// then its gate; split_heads separates them, sigmoid_mul gates the attention
// output. One thread per output value.

// `n` output values (rows × heads × d), each head of `src` 2·d wide.
extern "C" __global__ void split_heads(const float *src, int n, int d, float *first, float *second) {
    int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    size_t at = (size_t)(e / d) * 2 * d + e % d;
    first[e] = src[at];
    second[e] = src[at + d];
}

// x *= sigmoid(gate), `n` values.
extern "C" __global__ void sigmoid_mul(const float *gate, int n, float *x) {
    int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    x[e] = x[e] / (1.0f + expf(-gate[e]));
}
