//! The shared op conformance suite on the CPU backend: the SIMD kernels
//! against the portable scalar ones.

use blockdraft_cpu::CpuBackend;

blockdraft_core::backend_conformance_tests!(CpuBackend::new(2), CpuBackend::scalar(1));
