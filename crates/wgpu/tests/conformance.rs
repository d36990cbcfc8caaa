//! The shared op conformance suite on the wgpu backend (natively; on a
//! machine without a GPU, Mesa's lavapipe), against the CPU backend, with
//! the kernel shapes chosen for the adapter and with those for GPUs.

use blockdraft_cpu::CpuBackend;
use blockdraft_wgpu::{Gpu, Tuning, WgpuBackend};

fn gpu() -> WgpuBackend {
    WgpuBackend::new().expect("a wgpu adapter (install mesa-vulkan-drivers for lavapipe)")
}

blockdraft_core::backend_conformance_tests!(gpu(), CpuBackend::new(1));

mod gpu_tuning {
    use super::*;

    fn gpu_tuned() -> WgpuBackend {
        let gpu = pollster::block_on(Gpu::request()).expect("a wgpu adapter");
        WgpuBackend::with_tuning(gpu, Tuning::Gpu)
    }

    blockdraft_core::backend_conformance_tests!(gpu_tuned(), CpuBackend::new(1));
}
