// Row copies (KV appends, tap capture, row selection) between f32 tensors
// and f16 KV caches: `n_rows` rows of `src` from `src_row` into `dst` at
// row `dst_row`, column `dst_col`; f32 -> f16 rounds to nearest even.
#define COPY(NAME, S, D, CONV)                                                                 \
    extern "C" __global__ void NAME(const S *src, int src_cols, int src_row, D *dst,          \
                                    int dst_cols, int dst_row, int dst_col, int n_rows) {      \
        int i = blockIdx.x * blockDim.x + threadIdx.x;                                         \
        if (i >= n_rows * src_cols) return;                                                    \
        int r = i / src_cols, c = i % src_cols;                                                \
        dst[(size_t)(dst_row + r) * dst_cols + dst_col + c] =                                  \
            CONV(src[(size_t)(src_row + r) * src_cols + c]);                                   \
    }
#define SAME(v) (v)
COPY(copy_f32_f32, float, float, SAME)
COPY(copy_f32_f16, float, u16, f32_to_f16)
COPY(copy_f16_f16, u16, u16, SAME)
COPY(copy_f16_f32, u16, float, f16_to_f32)
