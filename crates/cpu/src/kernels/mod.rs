//! Quantized matmul kernels.
