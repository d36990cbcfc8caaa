//! The shared op conformance suite on the wgpu backend (natively; on a
//! machine without a GPU, Mesa's lavapipe), against the CPU backend, with
//! the kernel shapes chosen for the adapter (with its fast paths), and with
//! the portable shapes for GPUs and for CPU adapters.

use blockdraft_cpu::CpuBackend;
use blockdraft_wgpu::{Gpu, Tuning, WgpuBackend};

fn gpu() -> WgpuBackend {
    let backend =
        WgpuBackend::new().expect("a wgpu adapter (install mesa-vulkan-drivers for lavapipe)");
    // lavapipe has both fast paths: make sure this suite runs them.
    if backend.adapter_info().contains("llvmpipe") {
        let t = backend.tuning();
        assert!(t.subgroups && t.f16, "lavapipe's fast paths are off: {t:?}");
    }
    backend
}

blockdraft_core::backend_conformance_tests!(gpu(), CpuBackend::new(1));

mod gpu_tuning {
    use super::*;

    fn gpu_tuned() -> WgpuBackend {
        let gpu = pollster::block_on(Gpu::request()).expect("a wgpu adapter");
        WgpuBackend::with_tuning(gpu, Tuning::GPU)
    }

    blockdraft_core::backend_conformance_tests!(gpu_tuned(), CpuBackend::new(1));

    /// GPU shapes with the fast paths: the quantized matmul sums a
    /// feature's lanes by subgroup shuffles.
    mod fast {
        use super::*;

        fn gpu_fast() -> WgpuBackend {
            let gpu = pollster::block_on(Gpu::request()).expect("a wgpu adapter");
            let fast = Tuning {
                subgroups: true,
                f16: true,
                dot4: true,
                ..Tuning::GPU
            };
            let backend = WgpuBackend::with_tuning(gpu, fast);
            if backend.adapter_info().contains("llvmpipe") {
                let t = backend.tuning();
                assert!(t.subgroups && t.dot4 && t.matmul_lanes > 1, "{t:?}");
            }
            backend
        }

        blockdraft_core::backend_conformance_tests!(gpu_fast(), CpuBackend::new(1));
    }
}

/// The portable kernels alone, as on a device without optional features.
mod portable {
    use super::*;

    fn portable() -> WgpuBackend {
        let gpu = pollster::block_on(Gpu::request()).expect("a wgpu adapter");
        WgpuBackend::with_tuning(gpu, Tuning::CPU_ADAPTER)
    }

    blockdraft_core::backend_conformance_tests!(portable(), CpuBackend::new(1));
}

/// The wgpu backend overrides every default composition with its own
/// kernels (the suite's report, checked so that it stays true).
#[test]
fn default_compositions() {
    blockdraft_core::conformance::check_default_compositions(&gpu(), &[]);
}
