//! CPU backend: quantized kernels on the weights' own blocks, SIMD, a persistent thread pool.

pub mod kernels;
