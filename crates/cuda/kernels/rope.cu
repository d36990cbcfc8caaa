// In-place rotary embedding with the CPU backend's float sequence: angles
// `pos · theta_scale^i` by repeated f32 multiplication, the rotation as
// `fma(x0, cos, -(x1·sin))`, `fma(x0, sin, x1·cos)`. One thread per
// (head, pair); grid.y: rows. `neox`: pairs (i, i + n_rot/2), else (2i, 2i+1).
extern "C" __global__ void rope(float *x, int cols, int pos0, int n_head, int head_dim,
                                int n_rot, float theta_scale, int neox) {
    int half = n_rot / 2;
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_head * half) return;
    int head = t / half, i = t % half;
    float theta = (float)(pos0 + (int)blockIdx.y);
    for (int k = 0; k < i; k++) theta *= theta_scale;
    float s, c;
    sincosf(theta, &s, &c);
    float *h = x + (size_t)blockIdx.y * cols + (size_t)head * head_dim;
    int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    float x0 = h[a], x1 = h[b];
    h[a] = fmaf(x0, c, -(x1 * s));
    h[b] = fmaf(x0, s, x1 * c);
}
