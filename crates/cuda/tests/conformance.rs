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
