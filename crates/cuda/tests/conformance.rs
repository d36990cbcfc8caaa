//! The shared op conformance suite on the CUDA backend, against the CPU
//! backend. Each test skips (printing SKIPPED) without a CUDA device.

mod common;

use blockdraft_cpu::CpuBackend;

blockdraft_core::backend_conformance_tests!(
    match common::cuda() {
        Some(backend) => backend,
        None => return,
    },
    CpuBackend::new(1)
);

/// The ops the CUDA backend leaves to their default compositions (all but
/// `add_slices` so far: the sampling ones on the host): the suite's report
/// of what it overrides, checked so that it stays true.
#[test]
fn default_compositions() {
    let Some(be) = common::cuda() else {
        return;
    };
    blockdraft_core::conformance::check_default_compositions(
        &be,
        &[
            "add_normed",
            "argmax",
            "attention_step",
            "gated_projection",
            "matmul_accumulate",
            "matmul_many",
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
