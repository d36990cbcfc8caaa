//! The shared op conformance suite on the wgpu backend (natively; on a
//! machine without a GPU, Mesa's lavapipe), against the CPU backend.

use blockdraft_cpu::CpuBackend;
use blockdraft_wgpu::WgpuBackend;

fn gpu() -> WgpuBackend {
    WgpuBackend::new().expect("a wgpu adapter (install mesa-vulkan-drivers for lavapipe)")
}

blockdraft_core::backend_conformance_tests!(gpu(), CpuBackend::new(1));
