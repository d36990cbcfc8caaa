//! The WGSL sources (one op family per file in `shaders/`), their
//! preprocessing, and the compiled pipelines.
//!
//! Preprocessing: `#include "file.wgsl"` lines pull in shared helpers (WGSL
//! has no modules), and `#if FEATURE` / `#else` / `#endif` blocks choose
//! between a portable kernel and a fast path that needs an optional device
//! feature ([`ShaderFeatures`]), whose `enable` directive is then added.

use std::collections::HashMap;
use std::sync::Mutex;

/// Every shader file, by name, as compiled into the binary (without its
/// comments and indentation: see `build.rs`).
pub const SOURCES: &[(&str, &str)] = &[
    (
        "common.wgsl",
        include_str!(concat!(env!("OUT_DIR"), "/shaders/common.wgsl")),
    ),
    (
        "gating.wgsl",
        include_str!(concat!(env!("OUT_DIR"), "/shaders/gating.wgsl")),
    ),
    (
        "elementwise.wgsl",
        include_str!(concat!(env!("OUT_DIR"), "/shaders/elementwise.wgsl")),
    ),
    (
        "activation.wgsl",
        include_str!(concat!(env!("OUT_DIR"), "/shaders/activation.wgsl")),
    ),
    (
        "norm.wgsl",
        include_str!(concat!(env!("OUT_DIR"), "/shaders/norm.wgsl")),
    ),
    (
        "rope.wgsl",
        include_str!(concat!(env!("OUT_DIR"), "/shaders/rope.wgsl")),
    ),
    (
        "copy.wgsl",
        include_str!(concat!(env!("OUT_DIR"), "/shaders/copy.wgsl")),
    ),
    (
        "copy_f16.wgsl",
        include_str!(concat!(env!("OUT_DIR"), "/shaders/copy_f16.wgsl")),
    ),
    (
        "attention_core.wgsl",
        include_str!(concat!(env!("OUT_DIR"), "/shaders/attention_core.wgsl")),
    ),
    (
        "attention.wgsl",
        include_str!(concat!(env!("OUT_DIR"), "/shaders/attention.wgsl")),
    ),
    (
        "attention_f16.wgsl",
        include_str!(concat!(env!("OUT_DIR"), "/shaders/attention_f16.wgsl")),
    ),
    (
        "best.wgsl",
        include_str!(concat!(env!("OUT_DIR"), "/shaders/best.wgsl")),
    ),
    (
        "subgroup.wgsl",
        include_str!(concat!(env!("OUT_DIR"), "/shaders/subgroup.wgsl")),
    ),
    (
        "matmul_rows.wgsl",
        include_str!(concat!(env!("OUT_DIR"), "/shaders/matmul_rows.wgsl")),
    ),
    (
        "argmax.wgsl",
        include_str!(concat!(env!("OUT_DIR"), "/shaders/argmax.wgsl")),
    ),
    (
        "conv.wgsl",
        include_str!(concat!(env!("OUT_DIR"), "/shaders/conv.wgsl")),
    ),
    (
        "delta_net.wgsl",
        include_str!(concat!(env!("OUT_DIR"), "/shaders/delta_net.wgsl")),
    ),
    (
        "gated_attention.wgsl",
        include_str!(concat!(env!("OUT_DIR"), "/shaders/gated_attention.wgsl")),
    ),
    (
        "topk.wgsl",
        include_str!(concat!(env!("OUT_DIR"), "/shaders/topk.wgsl")),
    ),
    (
        "selector.wgsl",
        include_str!(concat!(env!("OUT_DIR"), "/shaders/selector.wgsl")),
    ),
    (
        "fusion.wgsl",
        include_str!(concat!(env!("OUT_DIR"), "/shaders/fusion.wgsl")),
    ),
    (
        "sample.wgsl",
        include_str!(concat!(env!("OUT_DIR"), "/shaders/sample.wgsl")),
    ),
    (
        "penalty.wgsl",
        include_str!(concat!(env!("OUT_DIR"), "/shaders/penalty.wgsl")),
    ),
    (
        "embed.wgsl",
        include_str!(concat!(env!("OUT_DIR"), "/shaders/embed.wgsl")),
    ),
    (
        "matmul_float.wgsl",
        include_str!(concat!(env!("OUT_DIR"), "/shaders/matmul_float.wgsl")),
    ),
    (
        "quant_blocks.wgsl",
        include_str!(concat!(env!("OUT_DIR"), "/shaders/quant_blocks.wgsl")),
    ),
    (
        "quantize_rows.wgsl",
        include_str!(concat!(env!("OUT_DIR"), "/shaders/quantize_rows.wgsl")),
    ),
    (
        "quantize.wgsl",
        include_str!(concat!(env!("OUT_DIR"), "/shaders/quantize.wgsl")),
    ),
    (
        "matmul_quant.wgsl",
        include_str!(concat!(env!("OUT_DIR"), "/shaders/matmul_quant.wgsl")),
    ),
];

/// Files that are only included by others, never compiled alone.
const LIBRARIES: &[&str] = &[
    "common.wgsl",
    "gating.wgsl",
    "attention_core.wgsl",
    "best.wgsl",
    "quant_blocks.wgsl",
    "subgroup.wgsl",
    "matmul_rows.wgsl",
    "quantize_rows.wgsl",
];

/// Optional device features the kernels have fast paths for (`#if SUBGROUPS`
/// and `#if F16` blocks); none is required.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ShaderFeatures {
    /// Reductions with subgroup operations instead of workgroup memory and
    /// barriers (WebGPU's `subgroups`).
    pub subgroups: bool,
    /// f16 weights read as the device's f16 type instead of decoded bit by
    /// bit (WebGPU's `shader-f16`).
    pub f16: bool,
    /// Integer dots of four packed i8 by WGSL's `dot4I8Packed` (DP4A where
    /// the GPU has it) instead of four products (the language extension
    /// `packed_4x8_integer_dot_product`).
    pub dot4: bool,
}

impl ShaderFeatures {
    /// Every combination, for tests that validate each variant.
    pub fn all() -> [ShaderFeatures; 8] {
        std::array::from_fn(|bits| ShaderFeatures {
            subgroups: bits & 1 != 0,
            f16: bits & 2 != 0,
            dot4: bits & 4 != 0,
        })
    }

    fn has(self, name: &str) -> Option<bool> {
        match name {
            "SUBGROUPS" => Some(self.subgroups),
            "F16" => Some(self.f16),
            "DOT4" => Some(self.dot4),
            _ => None,
        }
    }
}

/// The source of `file` with its includes expanded and the blocks of
/// `features` chosen, ready for naga or a browser's compiler. `None` for an
/// unknown file or a malformed `#if` (unknown name, nesting, no `#endif`).
pub fn preprocessed(file: &str, features: ShaderFeatures) -> Option<String> {
    let mut out = String::new();
    if features.f16 {
        out.push_str("enable f16;\n");
    }
    // Browsers require the directive; naga rejects it and takes the
    // capability from the device feature instead.
    if features.subgroups && cfg!(target_arch = "wasm32") {
        out.push_str("enable subgroups;\n");
    }
    if features.dot4 {
        out.push_str("requires packed_4x8_integer_dot_product;\n");
    }
    expand(file, features, &mut out)?;
    Some(out)
}

fn expand(file: &str, features: ShaderFeatures, out: &mut String) -> Option<()> {
    let src = SOURCES.iter().find(|(n, _)| *n == file)?.1;
    expand_source(src, features, out)
}

fn expand_source(src: &str, features: ShaderFeatures, out: &mut String) -> Option<()> {
    // Inside an `#if`: whether its lines are kept.
    let mut block: Option<bool> = None;
    for line in src.lines() {
        let t = line.trim();
        if let Some(name) = t.strip_prefix("#if ") {
            if block.is_some() {
                return None;
            }
            block = Some(features.has(name.trim())?);
            continue;
        }
        if t == "#else" {
            block = Some(!block?);
            continue;
        }
        if t == "#endif" {
            block.take()?;
            continue;
        }
        if block == Some(false) {
            continue;
        }
        if let Some(inc) = t.strip_prefix("#include ") {
            expand(inc.trim_matches('"'), features, out)?;
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    block.is_none().then_some(())
}

/// Compilable files (those not only included).
pub fn compiled_files() -> impl Iterator<Item = &'static str> {
    SOURCES
        .iter()
        .map(|(n, _)| *n)
        .filter(|n| !LIBRARIES.contains(n))
}

/// A kernel: an entry point of a shader file, perhaps specialized.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Kernel {
    pub file: &'static str,
    pub entry: &'static str,
    /// Values of the file's `TY0`..`TY2` overrides (the weight types of a
    /// stacked matmul's segments): the compiler then drops the decoders of
    /// every other type, which a type read from the uniform would keep.
    pub types: Option<[u32; 3]>,
}

impl Kernel {
    pub const fn new(file: &'static str, entry: &'static str) -> Self {
        Kernel {
            file,
            entry,
            types: None,
        }
    }
}

/// Pipelines compiled on first use (startup stays fast and only the kernels
/// a model needs are built), with the device's fast paths and per-adapter
/// values of the shaders' `override` constants.
pub struct Pipelines {
    features: ShaderFeatures,
    modules: Mutex<HashMap<&'static str, wgpu::ShaderModule>>,
    pipelines: Mutex<HashMap<Kernel, wgpu::ComputePipeline>>,
    constants: HashMap<&'static str, Vec<(&'static str, f64)>>,
}

impl Pipelines {
    /// Pipelines built with `features`, whose shader `file` gets the
    /// override `constants`.
    pub fn new(
        features: ShaderFeatures,
        constants: HashMap<&'static str, Vec<(&'static str, f64)>>,
    ) -> Self {
        Pipelines {
            features,
            modules: Mutex::default(),
            pipelines: Mutex::default(),
            constants,
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
                    let src = preprocessed(k.file, self.features)
                        .unwrap_or_else(|| panic!("shader {} is not in SOURCES", k.file));
                    device.create_shader_module(wgpu::ShaderModuleDescriptor {
                        label: Some(k.file),
                        source: wgpu::ShaderSource::Wgsl(src.into()),
                    })
                })
                .clone()
        };
        let mut constants = self.constants.get(k.file).cloned().unwrap_or_default();
        if let Some(types) = k.types {
            constants.extend(["TY0", "TY1", "TY2"].into_iter().zip(types.map(f64::from)));
        }
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(k.entry),
            layout: None,
            module: &module,
            entry_point: Some(k.entry),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: &constants,
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
    /// front end) in each variant, with only the capabilities it enables.
    #[test]
    fn every_shader_validates_with_naga() {
        use naga::valid::{Capabilities, ShaderStages, SubgroupOperationSet, Validator};
        for features in ShaderFeatures::all() {
            let mut caps = Capabilities::empty();
            caps.set(Capabilities::SUBGROUP, features.subgroups);
            caps.set(Capabilities::SHADER_FLOAT16, features.f16);
            for file in compiled_files() {
                let src = preprocessed(file, features).unwrap();
                let module = naga::front::wgsl::parse_str(&src)
                    .unwrap_or_else(|e| panic!("{file} {features:?}: {}", e.emit_to_string(&src)));
                let mut validator = Validator::new(naga::valid::ValidationFlags::all(), caps);
                if features.subgroups {
                    validator
                        .subgroup_stages(ShaderStages::COMPUTE)
                        .subgroup_operations(SubgroupOperationSet::all());
                }
                validator
                    .validate(&module)
                    .unwrap_or_else(|e| panic!("{file} {features:?}: {}", e.emit_to_string(&src)));
            }
        }
    }

    /// The fast paths exist: each feature changes the kernels that have one.
    #[test]
    fn features_choose_the_fast_paths() {
        let plain = ShaderFeatures::default();
        for (file, features) in [
            (
                "matmul_quant.wgsl",
                ShaderFeatures {
                    subgroups: true,
                    f16: false,
                    dot4: false,
                },
            ),
            (
                "matmul_float.wgsl",
                ShaderFeatures {
                    subgroups: true,
                    f16: false,
                    dot4: false,
                },
            ),
            (
                "matmul_float.wgsl",
                ShaderFeatures {
                    subgroups: false,
                    f16: true,
                    dot4: false,
                },
            ),
            (
                "matmul_quant.wgsl",
                ShaderFeatures {
                    subgroups: false,
                    f16: false,
                    dot4: true,
                },
            ),
        ] {
            let fast = preprocessed(file, features).unwrap();
            assert_ne!(
                fast,
                preprocessed(file, plain).unwrap(),
                "{file} {features:?}"
            );
        }
        let f16 = preprocessed(
            "embed.wgsl",
            ShaderFeatures {
                subgroups: false,
                f16: true,
                dot4: false,
            },
        );
        assert!(f16.unwrap().starts_with("enable f16;"));
    }

    #[test]
    fn includes_are_expanded() {
        let src = preprocessed("matmul_float.wgsl", ShaderFeatures::default()).unwrap();
        assert!(!src.lines().any(|l| l.trim_start().starts_with('#')));
        assert!(src.contains("fn f16_bits"), "common helpers pulled in");
    }

    #[test]
    fn malformed_conditionals_are_refused() {
        let features = ShaderFeatures::default();
        let mut out = String::new();
        for bad in [
            "#if NOPE\n#endif",
            "#if F16\n",
            "#endif",
            "#if F16\n#if F16\n#endif\n#endif",
        ] {
            assert_eq!(expand_source(bad, features, &mut out), None, "{bad:?}");
        }
    }
}
