// The gated feed-forward's activations, act(gate) * up: shared by the
// activation kernels and the up-projection's epilogue (matmul_rows.wgsl),
// so the fused path computes exactly what the separate op does.

fn swiglu_of(g: f32, up: f32) -> f32 {
    return g / (1.0 + exp(-g)) * up;
}

// GELU, tanh approximation, as ggml's table has it (and the CPU backend):
// of the input rounded to f16, the result rounded to f16, identity beyond
// ±10. The tanh argument is clamped: some implementations return NaN for
// huge arguments.
fn gelu(g: f32) -> f32 {
    if g <= -10.0 {
        return 0.0;
    }
    if g >= 10.0 {
        return g;
    }
    let x = round_f16(g);
    let t = tanh(clamp(0.7978846 * x * (0.044715 * x * x + 1.0), -10.0, 10.0));
    return round_f16(0.5 * x * (1.0 + t));
}

fn geglu_of(g: f32, up: f32) -> f32 {
    return gelu(g) * up;
}
