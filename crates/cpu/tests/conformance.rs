//! The shared op conformance suite on the CPU backend: the SIMD kernels
//! against the portable scalar ones.

use blockdraft_cpu::CpuBackend;

blockdraft_core::backend_conformance_tests!(CpuBackend::new(2), CpuBackend::scalar(1));

/// The ops the CPU backend leaves to their default compositions: the
/// suite's report of what it overrides (`argmax`, read straight from its
/// rows; `matmul_many` and `gated_projection`, which quantize their input
/// once and run as one parallel section), checked so that it stays true.
#[test]
fn default_compositions() {
    blockdraft_core::conformance::check_default_compositions(
        &CpuBackend::new(2),
        &[
            "add_normed",
            "add_slices",
            "attention_step",
            "matmul_accumulate",
            "normed_gated_projection",
            "normed_matmul_many",
            "penalize",
            "rope_qk",
            "sample_to",
            "selector_walk",
            "top_k",
        ],
    );
}
