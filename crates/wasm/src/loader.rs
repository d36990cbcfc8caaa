//! Building an [`Engine`] from files that arrive in chunks. The model's
//! tensors go to the backend one by one as their bytes come in
//! ([`StreamingLoad`]), so the model is never whole in wasm memory: on
//! WebGPU it can be larger than wasm32's 4 GiB. A drafter is small and is
//! kept whole (a DFlash drafter's weights load once; each request gets its own caches).
//! Either may be a split set (`-00001-of-0000N.gguf`), given part by part.

use crate::bytes::GgufBytes;
use crate::error::{ApiError, Code};
use crate::session::{DrafterSource, Session};
use crate::yielding::yield_to_event_loop;
use crate::{Engine, Loaded};
use blockdraft_core::backend::prelude::*;
use blockdraft_core::backend::KvType;
use blockdraft_core::model::{ModelConfig, StreamingLoad};
use blockdraft_cpu::CpuBackend;
use blockdraft_gguf::GgufFile;
use blockdraft_wgpu::{Gpu, WgpuBackend};
use std::sync::Arc;
use wasm_bindgen::prelude::*;

/// The model streaming onto one backend.
struct Building<B: Backend> {
    backend: Arc<B>,
    model: StreamingLoad<B>,
    /// Whether the model's metadata was checked (done once its header is in).
    checked: bool,
}

enum Target {
    Cpu(Building<CpuBackend>),
    WebGpu(Building<WgpuBackend>),
}

/// Runs `$body` with `$b` bound to the [`Building`], whatever its backend.
macro_rules! with_building {
    ($target:expr, $b:ident => $body:expr) => {
        match $target {
            Target::Cpu($b) => $body,
            Target::WebGpu($b) => $body,
        }
    };
}

/// Which file the bytes being pushed belong to.
enum Receiving {
    Nothing,
    Model,
    Drafter(Box<GgufBytes>),
}

/// Loads a model (and optionally a drafter) from chunks:
/// `begin("model", size)`, `push(chunk)`…, `end()` per file (per part of a
/// split set, in order), the same for a drafter, then `build()`.
#[wasm_bindgen]
pub struct EngineBuilder {
    target: Target,
    receiving: Receiving,
    drafter_parts: Vec<GgufFile>,
    started: web_time::Instant,
}

fn parse_backend(s: &str) -> Result<Option<bool>, ApiError> {
    // Some(true): WebGPU required; Some(false): CPU; None: WebGPU, else CPU.
    match s {
        "auto" => Ok(None),
        "webgpu" => Ok(Some(true)),
        "cpu" => Ok(Some(false)),
        _ => Err(ApiError::invalid(format!(
            "backend must be \"auto\", \"webgpu\" or \"cpu\", got {s:?}"
        ))),
    }
}

async fn request_gpu() -> Result<Gpu, ApiError> {
    Gpu::request().await.map_err(|e| {
        ApiError::new(
            Code::NoWebGpu,
            format!(
                "WebGPU is not available here ({e}); use backend \"cpu\" or \"auto\", \
                 or a browser with WebGPU enabled"
            ),
        )
    })
}

fn building<B: Backend>(backend: B) -> Building<B> {
    let backend = Arc::new(backend);
    Building {
        model: StreamingLoad::new(backend.clone()),
        backend,
        checked: false,
    }
}

impl<B: Backend> Building<B> {
    fn push(&mut self, chunk: &[u8]) -> Result<(), ApiError> {
        self.model
            .push(chunk)
            .map_err(|e| ApiError::model("model", e))?;
        if !self.checked {
            if let Some(md) = self.model.metadata() {
                // A model this engine cannot run fails before the rest downloads.
                ModelConfig::from_metadata(md).map_err(|e| ApiError::model("model", e))?;
                self.checked = true;
            }
        }
        Ok(())
    }

    fn build(self, drafter: DrafterSource, kv_type: KvType) -> Result<Session<B>, ApiError> {
        let model = self
            .model
            .finish()
            .map_err(|e| ApiError::model("model", e))?;
        Session::load(self.backend, model, drafter, kv_type)
    }
}

pub(crate) fn total_len(total: Option<f64>) -> Result<Option<u64>, ApiError> {
    match total {
        None => Ok(None),
        Some(n) if n.is_finite() && n >= 0.0 && n.fract() == 0.0 => Ok(Some(n as u64)),
        Some(n) => Err(ApiError::invalid(format!(
            "the size must be a whole number of bytes, got {n}"
        ))),
    }
}

#[wasm_bindgen]
impl EngineBuilder {
    /// Picks the backend: "webgpu", "cpu", or "auto" (WebGPU, else CPU).
    pub async fn create(backend: String) -> Result<EngineBuilder, JsValue> {
        let started = web_time::Instant::now();
        let target = match parse_backend(&backend)? {
            Some(false) => None,
            Some(true) => Some(request_gpu().await?),
            None => request_gpu().await.ok(),
        };
        let target = match target {
            Some(gpu) => Target::WebGpu(building(WgpuBackend::with_gpu(gpu))),
            None => Target::Cpu(building(
                CpuBackend::new(1).with_readback_hook(yield_to_event_loop),
            )),
        };
        Ok(EngineBuilder {
            target,
            receiving: Receiving::Nothing,
            drafter_parts: Vec::new(),
            started,
        })
    }

    /// "cpu" or "webgpu".
    pub fn backend(&self) -> String {
        match self.target {
            Target::Cpu(_) => "cpu".into(),
            Target::WebGpu(_) => "webgpu".into(),
        }
    }

    /// Starts a file (or the next part of a split set) of `what`: "model"
    /// or "drafter". `total_len`, when known, is checked at its end.
    pub fn begin(&mut self, what: &str, total_len: Option<f64>) -> Result<(), JsValue> {
        if !matches!(self.receiving, Receiving::Nothing) {
            return Err(ApiError::invalid("begin() before the previous file's end()").into());
        }
        let total = self::total_len(total_len)?;
        self.receiving = match what {
            "model" => {
                with_building!(&mut self.target, b => b.model.begin_part(total))
                    .map_err(|e| ApiError::model("model", e))?;
                Receiving::Model
            }
            "drafter" => Receiving::Drafter(Box::new(GgufBytes::new(total)?)),
            _ => {
                return Err(ApiError::invalid(format!(
                    "begin() takes \"model\" or \"drafter\", got {what:?}"
                ))
                .into())
            }
        };
        Ok(())
    }

    /// The next bytes of the file begun last.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), JsValue> {
        match &mut self.receiving {
            Receiving::Nothing => Err(ApiError::invalid("push() outside begin() … end()").into()),
            Receiving::Model => Ok(with_building!(&mut self.target, b => b.push(chunk))?),
            Receiving::Drafter(bytes) => Ok(bytes.push(chunk)?),
        }
    }

    /// Ends the file begun last: checks that it arrived whole.
    pub fn end(&mut self) -> Result<(), JsValue> {
        match std::mem::replace(&mut self.receiving, Receiving::Nothing) {
            Receiving::Nothing => Err(ApiError::invalid("end() without begin()").into()),
            Receiving::Model => Ok(with_building!(&mut self.target, b => b.model.end_part())
                .map_err(|e| ApiError::model("model", e))?),
            Receiving::Drafter(bytes) => {
                self.drafter_parts.push(bytes.into_file()?);
                Ok(())
            }
        }
    }

    /// Weight bytes of the model made resident so far.
    pub fn loaded_bytes(&self) -> f64 {
        with_building!(&self.target, b => b.model.loaded_bytes()) as f64
    }

    /// The engine. `ngram` selects prompt-lookup drafting (then no drafter
    /// file may have been given); `kv_type` is the KV cache's element type,
    /// "f16" (llama.cpp's default, as the CLI's) or "f32".
    pub fn build(self, ngram: bool, kv_type: &str) -> Result<Engine, JsValue> {
        if !matches!(self.receiving, Receiving::Nothing) {
            return Err(ApiError::invalid("build() before the last file's end()").into());
        }
        let kv_type = KvType::from_name(kv_type).ok_or_else(|| {
            ApiError::invalid(format!(
                "kvType must be \"f16\" or \"f32\", got {kv_type:?}"
            ))
        })?;
        let drafter = match (self.drafter_parts.is_empty(), ngram) {
            (false, true) => {
                return Err(ApiError::invalid("give a drafter file or ngram, not both").into())
            }
            (true, true) => DrafterSource::Ngram,
            (true, false) => DrafterSource::None,
            (false, false) => {
                DrafterSource::Gguf(GgufFile::from_parts(self.drafter_parts).map_err(|e| {
                    ApiError::new(Code::BadGguf, format!("cannot load the drafter: {e}"))
                })?)
            }
        };
        let loaded = match self.target {
            Target::Cpu(b) => Loaded::Cpu(b.build(drafter, kv_type)?),
            Target::WebGpu(b) => Loaded::WebGpu(b.build(drafter, kv_type)?),
        };
        Ok(Engine::new(loaded, self.started.elapsed().as_secs_f64()))
    }
}
