//! The WGSL sources (one op family per file in `shaders/`), their
//! preprocessing, and the compiled pipelines.
//!
//! Preprocessing: `#include "file.wgsl"` lines pull in shared helpers (WGSL
//! has no modules), and `enable subgroups;` is dropped for naga, which
//! rejects it while browsers require it.

use std::collections::HashMap;
use std::sync::Mutex;

/// Every shader file, by name, as compiled into the binary.
pub const SOURCES: &[(&str, &str)] = &[
    ("common.wgsl", include_str!("../../../shaders/common.wgsl")),
    (
        "elementwise.wgsl",
        include_str!("../../../shaders/elementwise.wgsl"),
    ),
    (
        "activation.wgsl",
        include_str!("../../../shaders/activation.wgsl"),
    ),
    ("norm.wgsl", include_str!("../../../shaders/norm.wgsl")),
    ("rope.wgsl", include_str!("../../../shaders/rope.wgsl")),
    ("copy.wgsl", include_str!("../../../shaders/copy.wgsl")),
    (
        "attention.wgsl",
        include_str!("../../../shaders/attention.wgsl"),
    ),
    ("best.wgsl", include_str!("../../../shaders/best.wgsl")),
    ("argmax.wgsl", include_str!("../../../shaders/argmax.wgsl")),
    ("conv.wgsl", include_str!("../../../shaders/conv.wgsl")),
    ("topk.wgsl", include_str!("../../../shaders/topk.wgsl")),
    (
        "selector.wgsl",
        include_str!("../../../shaders/selector.wgsl"),
    ),
    ("fusion.wgsl", include_str!("../../../shaders/fusion.wgsl")),
    ("sample.wgsl", include_str!("../../../shaders/sample.wgsl")),
    ("embed.wgsl", include_str!("../../../shaders/embed.wgsl")),
    (
        "matmul_float.wgsl",
        include_str!("../../../shaders/matmul_float.wgsl"),
    ),
    (
        "quant_blocks.wgsl",
        include_str!("../../../shaders/quant_blocks.wgsl"),
    ),
    (
        "quantize.wgsl",
        include_str!("../../../shaders/quantize.wgsl"),
    ),
    (
        "matmul_quant.wgsl",
        include_str!("../../../shaders/matmul_quant.wgsl"),
    ),
];

/// Files that are only included by others, never compiled alone.
const LIBRARIES: &[&str] = &["common.wgsl", "best.wgsl", "quant_blocks.wgsl"];

/// The source of `file` with its includes expanded, ready for naga or a
/// browser's compiler. `None` for an unknown file.
pub fn preprocessed(file: &str) -> Option<String> {
    let src = SOURCES.iter().find(|(n, _)| *n == file)?.1;
    let mut out = String::with_capacity(src.len());
    for line in src.lines() {
        let t = line.trim();
        if let Some(inc) = t.strip_prefix("#include ") {
            let name = inc.trim_matches('"');
            out.push_str(&preprocessed(name)?);
        } else if t == "enable subgroups;" && !cfg!(target_arch = "wasm32") {
            // naga enables subgroup builtins through the device feature.
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    Some(out)
}

/// Compilable files (those not only included).
pub fn compiled_files() -> impl Iterator<Item = &'static str> {
    SOURCES
        .iter()
        .map(|(n, _)| *n)
        .filter(|n| !LIBRARIES.contains(n))
}

/// A kernel: an entry point of a shader file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Kernel {
    pub file: &'static str,
    pub entry: &'static str,
}

/// Pipelines compiled on first use (startup stays fast and only the kernels
/// a model needs are built), with per-adapter values of the shaders'
/// `override` constants.
#[derive(Default)]
pub struct Pipelines {
    modules: Mutex<HashMap<&'static str, wgpu::ShaderModule>>,
    pipelines: Mutex<HashMap<Kernel, wgpu::ComputePipeline>>,
    constants: HashMap<&'static str, Vec<(&'static str, f64)>>,
}

impl Pipelines {
    /// Pipelines whose shader `file` gets the override `constants`.
    pub fn with_constants(constants: HashMap<&'static str, Vec<(&'static str, f64)>>) -> Self {
        Pipelines {
            constants,
            ..Default::default()
        }
    }

    pub fn get(&self, device: &wgpu::Device, k: Kernel) -> wgpu::ComputePipeline {
        if let Some(p) = self.pipelines.lock().unwrap().get(&k) {
            return p.clone();
        }
        let module = {
            let mut modules = self.modules.lock().unwrap();
            modules
                .entry(k.file)
                .or_insert_with(|| {
                    let src = preprocessed(k.file)
                        .unwrap_or_else(|| panic!("shader {} is not in SOURCES", k.file));
                    device.create_shader_module(wgpu::ShaderModuleDescriptor {
                        label: Some(k.file),
                        source: wgpu::ShaderSource::Wgsl(src.into()),
                    })
                })
                .clone()
        };
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(k.entry),
            layout: None,
            module: &module,
            entry_point: Some(k.entry),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: self.constants.get(k.file).map_or(&[], |c| c.as_slice()),
                ..Default::default()
            },
            cache: None,
        });
        self.pipelines.lock().unwrap().insert(k, pipeline.clone());
        pipeline
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every shader file parses and validates with naga (wgpu's own WGSL
    /// front end), with the capabilities a portable device has.
    #[test]
    fn every_shader_validates_with_naga() {
        for file in compiled_files() {
            let src = preprocessed(file).unwrap();
            let module = naga::front::wgsl::parse_str(&src)
                .unwrap_or_else(|e| panic!("{file}: {}", e.emit_to_string(&src)));
            naga::valid::Validator::new(
                naga::valid::ValidationFlags::all(),
                naga::valid::Capabilities::empty(),
            )
            .validate(&module)
            .unwrap_or_else(|e| panic!("{file}: {}", e.emit_to_string(&src)));
        }
    }

    #[test]
    fn includes_are_expanded() {
        let src = preprocessed("matmul_float.wgsl").unwrap();
        assert!(!src.lines().any(|l| l.trim_start().starts_with("#include")));
        assert!(src.contains("fn f16_bits"), "common helpers pulled in");
    }
}
