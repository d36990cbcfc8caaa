//! The shared op conformance suite on the CPU backend: the SIMD kernels
//! against the portable scalar ones.

use blockdraft_cpu::CpuBackend;

blockdraft_core::backend_conformance_tests!(CpuBackend::new(2), CpuBackend::scalar(1));

/// The ops the CPU backend leaves to their default compositions: the
/// suite's report of what it overrides (only `argmax`, read straight from
/// its rows), checked so that it stays true.
#[test]
fn default_compositions() {
    let be = CpuBackend::new(2);
    let composed =
        blockdraft_core::testing::block_on(blockdraft_core::conformance::default_compositions(&be));
    eprintln!("cpu: default compositions {composed:?}");
    assert_eq!(
        composed,
        [
            "add_slices",
            "gated_projection",
            "matmul_accumulate",
            "matmul_many",
            "penalize",
            "rope_qk",
            "sample_to",
            "selector_walk",
            "top_k"
        ]
    );
}
