//! Converts a Hugging Face DFlash, DFlash2 or DFly drafter checkpoint
//! (`config.json` + `*.safetensors`) to a GGUF with llama.cpp's names and
//! keys (spec: shared/spec/dflash-family.md §1.2, §1.3, §5).
//!
//! A torch `[out, in]` tensor becomes ggml `{in, out}` with the same bytes:
//! ggml dims are the torch shape reversed, the data is never transposed.

use blockdraft_gguf::{quants, GgmlType, GgufError, GgufFile, GgufWriter, Metadata};
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    // The causes are named `error`, not `source`: the message holds them,
    // and a `source` would print them a second time in an error chain.
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{path}: {error}")]
    Json {
        path: PathBuf,
        error: serde_json::Error,
    },
    #[error("{path}: {message}")]
    Safetensors { path: PathBuf, message: String },
    #[error("{path}: no *.safetensors file")]
    NoWeights { path: PathBuf },
    #[error("config field `{field}` is missing")]
    MissingField { field: String },
    #[error("config field `{field}`: {reason}")]
    BadField { field: String, reason: String },
    #[error("target_layer_ids contains {id}, but the target has {depth} layers")]
    TargetLayer { id: i64, depth: usize },
    #[error("num_target_layers is {declared}, but target_layer_ids lists {found} layers")]
    NumTargetLayers { declared: u64, found: usize },
    #[error("config declares {field} = {declared}, but the target has {actual}")]
    TargetMismatch {
        field: &'static str,
        declared: u64,
        actual: usize,
    },
    #[error("drafter hidden_size {drafter} differs from the target's {target}")]
    HiddenSize { drafter: usize, target: usize },
    #[error("tensor `{tensor}` is missing")]
    MissingTensor { tensor: String },
    #[error("tensor `{tensor}` appears in more than one safetensors file")]
    DuplicateTensor { tensor: String },
    #[error("tensor `{tensor}` is not part of a {variant} drafter")]
    UnexpectedTensor {
        tensor: String,
        variant: &'static str,
    },
    #[error("tensor `{tensor}` has shape {found:?}, expected {expected:?}")]
    Shape {
        tensor: String,
        found: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("tensor `{tensor}` has unsupported dtype {dtype} (F32, F16 or BF16)")]
    Dtype { tensor: String, dtype: String },
    #[error("tensor `{tensor}`: {reason}")]
    BadTensor { tensor: String, reason: String },
    #[error("{path}: {message}")]
    Target { path: PathBuf, message: String },
    #[error("{path}: a `{arch}` model, not a `dflash` drafter")]
    NotADrafter { path: PathBuf, arch: String },
    #[error(transparent)]
    Gguf(#[from] GgufError),
}

pub type Result<T> = std::result::Result<T, ConvertError>;

/// Output type of the matrices (norms, conv bases and `layer_fusion` stay F32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutType {
    F32,
    F16,
    /// Q8_0 for 2-D matrices whose rows are a multiple of 32 long, F32 otherwise.
    Q8_0,
    /// Q4_0 likewise: for a reduced vocabulary's head, whose rows are the
    /// target's (a file of many rows then stays small).
    Q4_0,
}

impl OutType {
    /// The GGUF type of a matrix of ggml `dims` (innermost first).
    fn matrix(self, dims: &[u64]) -> GgmlType {
        let blocks = dims.len() == 2 && dims[0].is_multiple_of(32);
        match self {
            OutType::F32 => GgmlType::F32,
            OutType::F16 => GgmlType::F16,
            OutType::Q8_0 if blocks => GgmlType::Q8_0,
            OutType::Q4_0 if blocks => GgmlType::Q4_0,
            OutType::Q8_0 | OutType::Q4_0 => GgmlType::F32,
        }
    }
}

/// The target's geometry, from its GGUF or its HF `config.json`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TargetGeometry {
    pub n_layer: usize,
    pub n_embd: usize,
}

impl TargetGeometry {
    /// Reads a GGUF file (`{arch}.block_count`, `{arch}.embedding_length`) or
    /// an HF directory (`config.json`: `num_hidden_layers`, `hidden_size`).
    pub fn read(path: &Path) -> Result<Self> {
        if path.is_dir() {
            let config = read_json(&path.join("config.json"))?;
            let get = |k: &str| {
                config
                    .get(k)
                    .and_then(Value::as_u64)
                    .map(|v| v as usize)
                    .ok_or_else(|| ConvertError::Target {
                        path: path.join("config.json"),
                        message: format!("lacks `{k}`"),
                    })
            };
            return Ok(TargetGeometry {
                n_layer: get("num_hidden_layers")?,
                n_embd: get("hidden_size")?,
            });
        }
        let file = GgufFile::open(path)?;
        let arch = file.architecture()?.to_string();
        let get = |k: &str| {
            let key = format!("{arch}.{k}");
            file.metadata()
                .get_usize(&key)
                .map_err(|e| ConvertError::Target {
                    path: path.into(),
                    message: format!("`{key}`: {e}"),
                })
        };
        Ok(TargetGeometry {
            n_layer: get("block_count")?,
            n_embd: get("embedding_length")?,
        })
    }
}

/// The drafter's own key among the tokenizer's: the token its blocks fill
/// their draft slots with.
const MASK_TOKEN_KEY: &str = "tokenizer.ggml.mask_token_id";

/// The target's tokenizer (`tokenizer.ggml.*`, bar the mask token, which is
/// the drafter's) for a drafter file to carry: llama.cpp loads a vocabulary
/// from every model file, a drafter's included, and refuses one without
/// `tokenizer.ggml.model`; blockdraft reads the target's and checks the
/// size. `None` for an HF directory target, and for a GGUF without a
/// tokenizer (synthetic test models): nothing to copy.
pub fn target_tokenizer(target: &Path) -> Result<Option<Metadata>> {
    if target.is_dir() {
        return Ok(None);
    }
    let file = GgufFile::open(target)?;
    let mut tokenizer = Metadata::new();
    for (key, value) in file.metadata().iter() {
        if key.starts_with("tokenizer.ggml.") && key != MASK_TOKEN_KEY {
            tokenizer.set(key, value.clone());
        }
    }
    Ok(tokenizer
        .contains_key("tokenizer.ggml.model")
        .then_some(tokenizer))
}

/// A drafter GGUF written again with `tokenizer` in place of the tokenizer
/// keys it had (none to drop them), its tensors and other metadata copied
/// byte for byte: a shipped drafter made loadable by llama.cpp, or slimmed.
pub fn with_tokenizer(drafter: &GgufFile, tokenizer: Option<&Metadata>) -> Result<GgufWriter> {
    let arch = drafter.architecture()?;
    if arch != "dflash" {
        return Err(ConvertError::NotADrafter {
            path: drafter.path().map(Into::into).unwrap_or_default(),
            arch: arch.into(),
        });
    }
    let mut writer = GgufWriter::new();
    for (key, value) in drafter.metadata().iter() {
        if !key.starts_with("tokenizer.ggml.") || key == MASK_TOKEN_KEY {
            writer.add(key, value.clone());
        }
    }
    if let Some(tokenizer) = tokenizer {
        writer.add_all(tokenizer);
    }
    for (i, info) in drafter.tensors().iter().enumerate() {
        let data = drafter.tensor_data_at(i)?;
        writer.add_tensor(info.name.clone(), data.dims(), data.ty(), data.as_bytes())?;
    }
    Ok(writer)
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|error| ConvertError::Io {
        path: path.into(),
        error,
    })?;
    serde_json::from_str(&text).map_err(|error| ConvertError::Json {
        path: path.into(),
        error,
    })
}

/// `config.json` with `dflash_config` fields looked up nested first, then top-level.
struct Config(Value);

impl Config {
    fn get(&self, field: &str) -> Option<&Value> {
        self.0
            .get("dflash_config")
            .and_then(|d| d.get(field))
            .or_else(|| self.0.get(field))
            .filter(|v| !v.is_null())
    }

    fn uint_opt(&self, field: &str) -> Result<Option<u64>> {
        self.get(field)
            .map(|v| {
                v.as_u64().ok_or_else(|| ConvertError::BadField {
                    field: field.into(),
                    reason: format!("expected a non-negative integer, found {v}"),
                })
            })
            .transpose()
    }

    fn uint(&self, field: &str) -> Result<u64> {
        self.uint_opt(field)?
            .ok_or_else(|| ConvertError::MissingField {
                field: field.into(),
            })
    }

    /// A positive integer that fits a u32 (a GGUF key).
    fn positive(&self, field: &str) -> Result<u32> {
        let v = self.uint(field)?;
        u32::try_from(v)
            .ok()
            .filter(|&v| v > 0)
            .ok_or_else(|| ConvertError::BadField {
                field: field.into(),
                reason: format!("must be in 1..=u32::MAX, found {v}"),
            })
    }

    fn float_opt(&self, field: &str) -> Result<Option<f32>> {
        self.get(field)
            .map(|v| {
                v.as_f64()
                    .map(|x| x as f32)
                    .ok_or_else(|| ConvertError::BadField {
                        field: field.into(),
                        reason: format!("expected a number, found {v}"),
                    })
            })
            .transpose()
    }

    fn bool_opt(&self, field: &str) -> Result<Option<bool>> {
        self.get(field)
            .map(|v| {
                v.as_bool().ok_or_else(|| ConvertError::BadField {
                    field: field.into(),
                    reason: format!("expected a boolean, found {v}"),
                })
            })
            .transpose()
    }
}

/// How a tensor is stored in the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Always F32 (norms, conv bases, `layer_fusion`).
    Exact,
    /// A matrix in the requested output type.
    Matrix,
    /// A reduced vocabulary's head, in the head's output type.
    Head,
}

struct Planned {
    src: String,
    dst: String,
    /// Torch shape (ggml dims reversed).
    shape: Vec<usize>,
    kind: Kind,
}

/// Which family member the checkpoint is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    DFlash,
    DFlash2,
    DFly,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::DFlash => "DFlash",
            Variant::DFlash2 => "DFlash2",
            Variant::DFly => "DFly",
        }
    }
}

/// The memory-mapped safetensors files of a checkpoint.
struct Weights {
    maps: Vec<(PathBuf, memmap2::Mmap)>,
    /// Tensor name -> index into `maps`.
    index: HashMap<String, usize>,
}

impl Weights {
    fn open(dir: &Path) -> Result<Self> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |error| ConvertError::Io { path, error }
        };
        let mut paths = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io(dir))? {
            let path = entry.map_err(io(dir))?.path();
            if path.extension().is_some_and(|e| e == "safetensors") {
                paths.push(path);
            }
        }
        if paths.is_empty() {
            return Err(ConvertError::NoWeights { path: dir.into() });
        }
        paths.sort();
        let mut maps = Vec::new();
        let mut index = HashMap::new();
        for path in paths {
            let file = std::fs::File::open(&path).map_err(io(&path))?;
            // SAFETY: the checkpoint is read-only input; a concurrent writer
            // would be a user error, as for any memory-mapped model file.
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io(&path))?;
            let names = SafeTensors::read_metadata(&map)
                .map_err(|e| ConvertError::Safetensors {
                    path: path.clone(),
                    message: e.to_string(),
                })?
                .1
                .tensors()
                .into_keys()
                .collect::<Vec<_>>();
            for name in names {
                if index.insert(name.clone(), maps.len()).is_some() {
                    return Err(ConvertError::DuplicateTensor { tensor: name });
                }
            }
            maps.push((path, map));
        }
        Ok(Weights { maps, index })
    }

    fn has(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    fn shape(&self, name: &str) -> Result<Vec<usize>> {
        Ok(self.view(name)?.shape().to_vec())
    }

    fn view(&self, name: &str) -> Result<safetensors::tensor::TensorView<'_>> {
        let &i = self
            .index
            .get(name)
            .ok_or_else(|| ConvertError::MissingTensor {
                tensor: name.into(),
            })?;
        let (path, map) = &self.maps[i];
        let bad = |e: safetensors::SafeTensorError| ConvertError::Safetensors {
            path: path.clone(),
            message: e.to_string(),
        };
        SafeTensors::deserialize(map)
            .map_err(bad)?
            .tensor(name)
            .map_err(bad)
    }

    /// A 1-D I64 tensor's values (a reduced vocabulary's `d2t`).
    fn i64(&self, name: &str) -> Result<Vec<i64>> {
        let view = self.view(name)?;
        if view.dtype() != Dtype::I64 || view.shape().len() != 1 {
            return Err(ConvertError::BadTensor {
                tensor: name.into(),
                reason: format!(
                    "expected a 1-D I64 tensor, found {:?} {:?}",
                    view.dtype(),
                    view.shape()
                ),
            });
        }
        Ok(view
            .data()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect())
    }

    /// The tensor's values as F32.
    fn f32(&self, name: &str) -> Result<Vec<f32>> {
        let view = self.view(name)?;
        let data = view.data();
        Ok(match view.dtype() {
            Dtype::F32 => data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::F16 => data
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::BF16 => data
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            other => {
                return Err(ConvertError::Dtype {
                    tensor: name.into(),
                    dtype: format!("{other:?}"),
                })
            }
        })
    }
}

/// What was converted, for reporting.
#[derive(Debug)]
pub struct Converted {
    pub writer: GgufWriter,
    pub variant: Variant,
    pub n_tensors: usize,
}

/// Converts the checkpoint in `hf_dir` for `target`, its matrices as
/// `out`. `progress(done, total)` is called after each tensor.
pub fn convert(
    hf_dir: &Path,
    target: TargetGeometry,
    out: OutType,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Converted> {
    convert_with_head(hf_dir, target, out, out, progress)
}

/// [`convert`], with a reduced vocabulary's head (`output.weight`) as
/// `head`.
pub fn convert_with_head(
    hf_dir: &Path,
    target: TargetGeometry,
    out: OutType,
    head: OutType,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Converted> {
    let config = Config(read_json(&hf_dir.join("config.json"))?);
    let weights = Weights::open(hf_dir)?;
    let mut writer = GgufWriter::new();
    let (variant, plan) = metadata_and_plan(&config, &weights, target, &mut writer)?;
    let mut used: Vec<&str> = plan.iter().map(|p| p.src.as_str()).collect();
    used.extend(DROPPED);
    let d2t = reduced_vocabulary(&config, &weights, variant)?;
    if let Some(ids) = &d2t {
        used.push(D2T);
        let bytes: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
        writer.add_tensor(D2T.to_string(), &[ids.len() as u64], GgmlType::I64, bytes)?;
    }
    if let Some(extra) = weights
        .index
        .keys()
        .filter(|k| !used.contains(&k.as_str()) && !ignored(variant, &config, k))
        .min()
    {
        return Err(ConvertError::UnexpectedTensor {
            tensor: extra.clone(),
            variant: variant.name(),
        });
    }
    for p in &plan {
        let found = weights.shape(&p.src)?;
        if found != p.shape {
            return Err(ConvertError::Shape {
                tensor: p.src.clone(),
                found,
                expected: p.shape.clone(),
            });
        }
    }
    for (i, p) in plan.iter().enumerate() {
        let values = weights.f32(&p.src)?;
        let dims: Vec<u64> = p.shape.iter().rev().map(|&d| d as u64).collect();
        let ty = match p.kind {
            Kind::Exact => GgmlType::F32,
            Kind::Matrix => out.matrix(&dims),
            Kind::Head => head.matrix(&dims),
        };
        match ty {
            GgmlType::F32 => writer.add_f32_tensor(p.dst.clone(), &dims, &values)?,
            _ => writer.add_tensor(
                p.dst.clone(),
                &dims,
                ty,
                quants::quantize_to_vec(ty, &values)?,
            )?,
        };
        progress(i + 1, plan.len());
    }
    Ok(Converted {
        writer,
        variant,
        n_tensors: plan.len(),
    })
}

/// The drafter borrows the target's embeddings and head (except a reduced
/// vocabulary's head, which `metadata_and_plan` keeps).
const DROPPED: [&str; 2] = ["embed_tokens.weight", "lm_head.weight"];

/// A reduced draft vocabulary: draft row -> target token id.
const D2T: &str = "d2t";

/// The checkpoint's `d2t`, checked: distinct ids within the vocabulary, one
/// per row of its own `lm_head.weight`; refused for DFly (whose correction
/// chain runs the full target head).
fn reduced_vocabulary(c: &Config, w: &Weights, variant: Variant) -> Result<Option<Vec<i64>>> {
    if !w.has(D2T) {
        return Ok(None);
    }
    let bad = |reason: String| ConvertError::BadTensor {
        tensor: D2T.into(),
        reason,
    };
    if variant == Variant::DFly {
        return Err(bad("DFly with a reduced draft vocabulary is not supported (its correction chain runs the full target head)".into()));
    }
    let ids = w.i64(D2T)?;
    let vocab = c.positive("vocab_size")?;
    let mut seen = std::collections::HashSet::new();
    if let Some(&id) = ids
        .iter()
        .find(|&&id| id < 0 || id as u64 >= u64::from(vocab) || !seen.insert(id))
    {
        return Err(bad(format!(
            "id {id} is outside the vocabulary of {vocab} or repeated"
        )));
    }
    if ids.is_empty() {
        return Err(bad("no ids".into()));
    }
    Ok(Some(ids))
}

/// `hidden_correction.*` of a DFly checkpoint whose correction is disabled.
fn ignored(variant: Variant, config: &Config, name: &str) -> bool {
    variant == Variant::DFly
        && name.starts_with("hidden_correction.")
        && !matches!(config.bool_opt("enable_hidden_correction"), Ok(Some(true)))
}

fn metadata_and_plan(
    c: &Config,
    w: &Weights,
    target: TargetGeometry,
    gguf: &mut GgufWriter,
) -> Result<(Variant, Vec<Planned>)> {
    let variant = if w.has("layer_fusion_weights") {
        Variant::DFly
    } else if c.get("conv_kernel_size").is_some() {
        Variant::DFlash2
    } else {
        Variant::DFlash
    };
    let h = c.positive("hidden_size")? as usize;
    let n_layer = c.positive("num_hidden_layers")? as usize;
    let n_ff = c.positive("intermediate_size")? as usize;
    let n_head = c.positive("num_attention_heads")? as usize;
    let n_head_kv = match c.uint_opt("num_key_value_heads")? {
        Some(_) => c.positive("num_key_value_heads")? as usize,
        None => n_head,
    };
    let head_dim = match c.uint_opt("head_dim")? {
        Some(_) => c.positive("head_dim")? as usize,
        None if h.is_multiple_of(n_head) => h / n_head,
        None => {
            return Err(ConvertError::BadField {
                field: "num_attention_heads".into(),
                reason: format!("{n_head} does not divide hidden_size {h} (and no head_dim)"),
            })
        }
    };
    if h != target.n_embd {
        return Err(ConvertError::HiddenSize {
            drafter: h,
            target: target.n_embd,
        });
    }

    // Taps: validated against the target, written +1-shifted.
    let ids = c
        .get("target_layer_ids")
        .ok_or_else(|| ConvertError::MissingField {
            field: "target_layer_ids".into(),
        })?;
    let bad_ids = || ConvertError::BadField {
        field: "target_layer_ids".into(),
        reason: "expected a non-empty array of integers".into(),
    };
    let ids: Vec<i64> = ids
        .as_array()
        .filter(|a| !a.is_empty())
        .ok_or_else(bad_ids)?
        .iter()
        .map(|v| v.as_i64().ok_or_else(bad_ids))
        .collect::<Result<_>>()?;
    for &id in &ids {
        if id < 0 || id >= i32::MAX as i64 || id as u64 >= target.n_layer as u64 {
            return Err(ConvertError::TargetLayer {
                id,
                depth: target.n_layer,
            });
        }
    }
    if let Some(declared) = c.uint_opt("num_target_layers")? {
        if declared != ids.len() as u64 {
            return Err(ConvertError::NumTargetLayers {
                declared,
                found: ids.len(),
            });
        }
    }
    for (field, actual) in [
        ("target_hidden_size", target.n_embd),
        ("target_num_hidden_layers", target.n_layer),
    ] {
        if let Some(declared) = c.uint_opt(field)? {
            if declared != actual as u64 {
                return Err(ConvertError::TargetMismatch {
                    field,
                    declared,
                    actual,
                });
            }
        }
    }

    let block_size = match c.uint_opt("block_size")? {
        Some(_) => c.positive("block_size")?,
        None => 16,
    };
    let mask = c.uint("mask_token_id")?;
    let mask = u32::try_from(mask).map_err(|_| ConvertError::BadField {
        field: "mask_token_id".into(),
        reason: format!("{mask} does not fit a u32"),
    })?;
    let key = |k: &str| format!("dflash.{k}");
    gguf.add("general.architecture", "dflash");
    gguf.add(key("block_count"), n_layer as u32);
    gguf.add(key("embedding_length"), h as u32);
    gguf.add(key("feed_forward_length"), n_ff as u32);
    gguf.add(key("attention.head_count"), n_head as u32);
    gguf.add(key("attention.head_count_kv"), n_head_kv as u32);
    gguf.add(key("attention.key_length"), head_dim as u32);
    gguf.add(key("attention.value_length"), head_dim as u32);
    gguf.add(
        key("attention.layer_norm_rms_epsilon"),
        c.float_opt("rms_norm_eps")?.unwrap_or(1e-6),
    );
    gguf.add(
        key("rope.freq_base"),
        c.float_opt("rope_theta")?.unwrap_or(1e6),
    );
    let n_ctx = match c.uint_opt("max_position_embeddings")? {
        Some(_) => c.positive("max_position_embeddings")?,
        None => 40960,
    };
    gguf.add(key("context_length"), n_ctx);
    gguf.add(key("block_size"), block_size);
    let shifted: Vec<i32> = ids.iter().map(|&id| id as i32 + 1).collect();
    gguf.add(key("target_layers"), shifted);
    gguf.add(MASK_TOKEN_KEY, mask);
    for (field, k) in [
        ("logit_scale", "logit_scale"),
        ("final_logit_softcapping", "final_logit_softcapping"),
    ] {
        if let Some(v) = c.float_opt(field)? {
            gguf.add(key(k), v);
        }
    }

    let (q, kv) = (n_head * head_dim, n_head_kv * head_dim);
    let mut plan = Vec::new();
    let mut add = |src: String, dst: String, shape: &[usize], kind| {
        plan.push(Planned {
            src,
            dst,
            shape: shape.to_vec(),
            kind,
        })
    };
    let width = ids.len() * h;
    let fc = if variant == Variant::DFly && w.has("context_proj.weight") {
        "context_proj.weight"
    } else {
        "fc.weight"
    };
    add(fc.into(), "fc.weight".into(), &[h, width], Kind::Matrix);
    let norm = if variant == Variant::DFly && w.has("final_norm.weight") {
        "final_norm.weight"
    } else {
        "norm.weight"
    };
    add(norm.into(), "output_norm.weight".into(), &[h], Kind::Exact);
    if variant == Variant::DFly {
        add(
            "context_norm.weight".into(),
            "context_norm.weight".into(),
            &[h],
            Kind::Exact,
        );
    } else {
        add(
            "hidden_norm.weight".into(),
            "enc.output_norm.weight".into(),
            &[h],
            Kind::Exact,
        );
    }
    if w.has(D2T) && variant != Variant::DFly {
        let rows = *w.shape(D2T)?.first().unwrap_or(&0);
        add(
            "lm_head.weight".into(),
            "output.weight".into(),
            &[rows, h],
            Kind::Head,
        );
    }
    for i in 0..n_layer {
        for (src, dst, shape, kind) in [
            ("input_layernorm", "attn_norm", vec![h], Kind::Exact),
            ("self_attn.q_proj", "attn_q", vec![q, h], Kind::Matrix),
            ("self_attn.k_proj", "attn_k", vec![kv, h], Kind::Matrix),
            ("self_attn.v_proj", "attn_v", vec![kv, h], Kind::Matrix),
            ("self_attn.o_proj", "attn_output", vec![h, q], Kind::Matrix),
            (
                "self_attn.q_norm",
                "attn_q_norm",
                vec![head_dim],
                Kind::Exact,
            ),
            (
                "self_attn.k_norm",
                "attn_k_norm",
                vec![head_dim],
                Kind::Exact,
            ),
            ("post_attention_layernorm", "ffn_norm", vec![h], Kind::Exact),
            ("mlp.gate_proj", "ffn_gate", vec![n_ff, h], Kind::Matrix),
            ("mlp.up_proj", "ffn_up", vec![n_ff, h], Kind::Matrix),
            ("mlp.down_proj", "ffn_down", vec![h, n_ff], Kind::Matrix),
        ] {
            add(
                format!("layers.{i}.{src}.weight"),
                format!("blk.{i}.{dst}.weight"),
                &shape,
                kind,
            );
        }
    }

    match variant {
        Variant::DFlash => {}
        Variant::DFlash2 => {
            let taps = c.positive("conv_kernel_size")?;
            let group = c.positive("conv_group_size")?;
            let rank = c.positive("selector_rank")?;
            let top_k = c.positive("selector_top_k")?;
            if !h.is_multiple_of(group as usize) {
                return Err(ConvertError::BadField {
                    field: "conv_group_size".into(),
                    reason: format!("{group} does not divide hidden_size {h}"),
                });
            }
            gguf.add(key("conv_kernel_size"), taps);
            gguf.add(key("conv_group_size"), group);
            gguf.add(key("selector_rank"), rank);
            gguf.add(key("selector_top_k"), top_k);
            let (t, r) = (taps as usize, rank as usize);
            let delta = 2 * t * (h / group as usize);
            for i in 0..n_layer {
                for (src, dst) in [("attention_conv", "attn"), ("mlp_conv", "ffn")] {
                    add(
                        format!("layers.{i}.{src}.base_kernel"),
                        format!("blk.{i}.{dst}_conv_base"),
                        &[2, t, h],
                        Kind::Exact,
                    );
                    add(
                        format!("layers.{i}.{src}.kernel_projection.weight"),
                        format!("blk.{i}.{dst}_conv_proj.weight"),
                        &[delta, h],
                        Kind::Matrix,
                    );
                }
            }
            add(
                "candidate_selector.hidden_projection.weight".into(),
                "selector_hidden.weight".into(),
                &[r, h],
                Kind::Matrix,
            );
            let pre = codebook(w, "candidate_selector.predecessor_codebook");
            let vocab = match c.uint_opt("vocab_size")? {
                Some(v) => v as usize,
                None => *w.shape(&pre)?.first().unwrap_or(&0),
            };
            add(
                pre,
                "selector_predecessor.weight".into(),
                &[vocab, r],
                Kind::Matrix,
            );
            add(
                codebook(w, "candidate_selector.successor_codebook"),
                "selector_successor.weight".into(),
                &[vocab, r],
                Kind::Matrix,
            );
        }
        Variant::DFly => {
            add(
                "layer_fusion_weights".into(),
                "layer_fusion".into(),
                &[n_layer, ids.len()],
                Kind::Exact,
            );
            if c.bool_opt("enable_hidden_correction")?.unwrap_or(false) {
                let hc = match c.uint_opt("hidden_correction_intermediate_size")? {
                    Some(_) => c.positive("hidden_correction_intermediate_size")? as usize,
                    None => h,
                };
                let p = "hidden_correction";
                for n in ["hidden_norm", "embed_norm"] {
                    add(
                        format!("{p}.{n}.weight"),
                        format!("{p}.{n}.weight"),
                        &[h],
                        Kind::Exact,
                    );
                }
                for (src, dst, shape) in [
                    ("gate_proj", "gate", [hc, 2 * h]),
                    ("up_proj", "up", [hc, 2 * h]),
                    ("down_proj", "down", [h, hc]),
                ] {
                    add(
                        format!("{p}.{src}.weight"),
                        format!("{p}.{dst}.weight"),
                        &shape,
                        Kind::Matrix,
                    );
                }
            }
        }
    }
    Ok((variant, plan))
}

/// Codebooks ship without a `.weight` suffix; accept both spellings.
fn codebook(w: &Weights, base: &str) -> String {
    let suffixed = format!("{base}.weight");
    if w.has(&suffixed) {
        suffixed
    } else {
        base.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_types_need_rows_of_whole_blocks() {
        for (out, ty) in [
            (OutType::F32, GgmlType::F32),
            (OutType::F16, GgmlType::F16),
            (OutType::Q8_0, GgmlType::Q8_0),
            (OutType::Q4_0, GgmlType::Q4_0),
        ] {
            assert_eq!(out.matrix(&[896, 12288]), ty);
        }
        // Rows of 48 and vectors: no blocks.
        assert_eq!(OutType::Q4_0.matrix(&[48, 61]), GgmlType::F32);
        assert_eq!(OutType::Q8_0.matrix(&[896]), GgmlType::F32);
    }
}
