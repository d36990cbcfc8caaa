//! Adapter and device selection: limits are requested explicitly from the
//! adapter (a browser device otherwise gets the small WebGPU defaults), and
//! optional features only where the adapter offers them.

use blockdraft_core::backend::BackendError;

/// The device and what it can do.
pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    /// WGSL's `dot4I8Packed` is available (a language extension: naga
    /// always has it, browsers since Chrome 123).
    pub dot4: bool,
    pub limits: wgpu::Limits,
    pub features: wgpu::Features,
    pub errors: DeviceErrors,
}

/// The first error the device reported outside any error scope (a shader
/// the browser's compiler rejects, a validation failure); later ones
/// usually follow from it.
#[derive(Clone, Default)]
pub struct DeviceErrors(std::sync::Arc<std::sync::Mutex<Option<String>>>);

impl DeviceErrors {
    pub(crate) fn record(&self, message: String) {
        self.0.lock().unwrap().get_or_insert(message);
    }

    /// A lost device: the cause of whatever was refused before the loss
    /// was noticed (a destroyed device's pipelines are invalid first), so
    /// it replaces that.
    pub(crate) fn record_loss(&self, message: String) {
        *self.0.lock().unwrap() = Some(message);
    }

    pub(crate) fn pending(&self) -> bool {
        self.0.lock().unwrap().is_some()
    }

    /// The first error since the last call, if any.
    pub fn take(&self) -> Option<String> {
        self.0.lock().unwrap().take()
    }

    /// The first error, left in place.
    pub(crate) fn peek(&self) -> Option<String> {
        self.0.lock().unwrap().clone()
    }
}

/// One line for a device error: what failed and what to try instead.
fn describe_error(e: &wgpu::Error) -> String {
    match e {
        wgpu::Error::OutOfMemory { .. } => format!(
            "the GPU ran out of memory ({e}); use a smaller context (-c), \
             a smaller model, or the CPU backend"
        ),
        _ => {
            // wgpu's text spans lines (the call, its label, the cause).
            let text = e
                .to_string()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            format!(
                "the GPU refused an operation ({text}); this is a blockdraft bug worth \
                 reporting, and the CPU backend avoids it"
            )
        }
    }
}

/// Kernel shapes and fast paths for an adapter: what suits a GPU and what
/// suits an adapter that emulates one on the CPU differ, and the fast paths
/// need optional features.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// Invocations per output feature of the matmuls (a power of
    /// two dividing 64).
    pub matmul_lanes: u32,
    /// Reductions by subgroup operations (needs `subgroups`).
    pub subgroups: bool,
    /// f16 decoded by the shader's f16 type (needs `shader-f16`).
    pub f16: bool,
    /// Int8 dots by `dot4I8Packed` (needs WGSL's
    /// `packed_4x8_integer_dot_product`).
    pub dot4: bool,
    /// Dispatches per submit at most (0: none before a readback). A GPU
    /// starts on a submitted piece while the host records the rest (as
    /// llama.cpp's WebGPU backend submits every 64); an emulated adapter
    /// has no such overlap to gain and runs fastest with one.
    pub submit_every: u32,
}

impl Tuning {
    /// Portable shapes for GPUs: neighbouring invocations read neighbouring
    /// blocks.
    pub const GPU: Tuning = Tuning {
        matmul_lanes: 16,
        subgroups: false,
        f16: false,
        dot4: false,
        submit_every: 64,
    };

    /// Portable shapes for CPU-emulated adapters (lavapipe, SwiftShader),
    /// where barriers and tiny workgroups cost more than the arithmetic.
    pub const CPU_ADAPTER: Tuning = Tuning {
        matmul_lanes: 1,
        subgroups: false,
        f16: false,
        dot4: false,
        submit_every: 0,
    };

    /// The shapes for `gpu`'s kind of adapter, with every fast path it has.
    pub fn for_gpu(gpu: &Gpu) -> Tuning {
        let emulated = gpu.info.device_type == wgpu::DeviceType::Cpu;
        let base = if emulated {
            Self::CPU_ADAPTER
        } else {
            Self::GPU
        };
        Tuning {
            subgroups: true,
            f16: true,
            // DP4A helps NVIDIA, AMD and Intel GPUs. Apple's have none and
            // run the builtin slower than four products (llama.cpp keeps
            // it off there), and so does lavapipe (SmolLM2 decode 9 %).
            dot4: !emulated && gpu.info.vendor != APPLE,
            ..base
        }
        .supported_by(gpu)
    }

    /// `self` without the fast paths `gpu` lacks. With subgroups a
    /// feature's lanes must share one, so `matmul_lanes` is capped at the
    /// smallest subgroup size.
    pub fn supported_by(self, gpu: &Gpu) -> Tuning {
        let subgroups = self.subgroups && gpu.features.contains(wgpu::Features::SUBGROUP);
        Tuning {
            matmul_lanes: if subgroups {
                self.matmul_lanes.min(gpu.info.subgroup_min_size.max(1))
            } else {
                self.matmul_lanes
            },
            subgroups,
            f16: self.f16 && gpu.features.contains(wgpu::Features::SHADER_F16),
            dot4: self.dot4 && gpu.dot4,
            submit_every: self.submit_every,
        }
    }
}

/// Apple's PCI vendor id.
const APPLE: u32 = 0x106b;

impl Gpu {
    /// The default adapter of this platform (natively Vulkan, Metal or DX12;
    /// a software Vulkan such as lavapipe counts).
    pub async fn request() -> Result<Gpu, BackendError> {
        let instance =
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                ..Default::default()
            })
            .await
            .map_err(|e| {
                BackendError::Device(format!(
                    "no WebGPU adapter ({e}); natively install a Vulkan driver \
                     (e.g. Debian's mesa-vulkan-drivers for a software one)"
                ))
            })?;
        let dot4 = instance
            .wgsl_language_features()
            .contains(wgpu::WgslLanguageFeatures::Packed4x8IntegerDotProduct);
        Self::from_adapter(adapter, dot4).await
    }

    /// A device of `adapter`, `dot4` telling whether its WGSL has
    /// `dot4I8Packed`.
    pub async fn from_adapter(adapter: wgpu::Adapter, dot4: bool) -> Result<Gpu, BackendError> {
        let info = adapter.get_info();
        let limits = adapter.limits();
        // Fast paths are chosen at run time; no kernel requires these.
        let mut wanted = wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP;
        if crate::profile::requested() && adapter.features().contains(crate::profile::FEATURES) {
            wanted |= crate::profile::FEATURES;
        }
        let features = adapter.features() & wanted;
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("blockdraft"),
                required_features: features,
                required_limits: limits.clone(),
                ..Default::default()
            })
            .await
            .map_err(|e| BackendError::Device(format!("requesting a device: {e}")))?;
        let errors = DeviceErrors::default();
        // wgpu's default handler panics at the faulty call. Neither a page
        // nor a CLI may die: the first error is kept, and generation turns
        // it into a typed error at its next readback
        // (`Device::device_error`).
        let first = errors.clone();
        device.on_uncaptured_error(std::sync::Arc::new(move |e| {
            first.record(describe_error(&e))
        }));
        let lost = errors.clone();
        device.set_device_lost_callback(move |reason, message| {
            lost.record_loss(format!(
                "the GPU device was lost ({reason:?}: {message}); load the model again, \
                 or use the CPU backend"
            ))
        });
        Ok(Gpu {
            device,
            queue,
            info,
            dot4,
            limits,
            features,
            errors,
        })
    }

    /// One line: adapter, driver and the limits that shape the kernels.
    pub fn describe(&self) -> String {
        let l = &self.limits;
        format!(
            "{} ({:?}, {:?}, driver {} {}); max storage binding {} MiB, max buffer {} MiB, \
             {} invocations/workgroup, {} storage buffers/stage; f16 {}, subgroups {} (size {}..{}), \
             dot4I8Packed {}",
            self.info.name,
            self.info.backend,
            self.info.device_type,
            self.info.driver,
            self.info.driver_info,
            l.max_storage_buffer_binding_size >> 20,
            l.max_buffer_size >> 20,
            l.max_compute_invocations_per_workgroup,
            l.max_storage_buffers_per_shader_stage,
            self.features.contains(wgpu::Features::SHADER_F16),
            self.features.contains(wgpu::Features::SUBGROUP),
            self.info.subgroup_min_size,
            self.info.subgroup_max_size,
            self.dot4,
        )
    }
}
