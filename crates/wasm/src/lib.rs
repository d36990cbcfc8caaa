//! The JS API of blockdraft (wasm-bindgen): load a GGUF model, optionally
//! with a drafter, on WebGPU or the CPU, and generate with streamed text.
//! `www/` wraps it in the npm package; its `.d.ts` documents the JS side.
//!
//! Every failure reaches JS as a typed error (see [`error`]). A panic is a
//! bug: the hook keeps its message for [`take_panic_message`] so the JS
//! wrapper can report it as an error instead of a bare `unreachable` trap.

mod bytes;
mod error;
mod request;
mod session;
mod yielding;

pub use bytes::GgufBytes;

use blockdraft_cpu::CpuBackend;
use blockdraft_wgpu::{Gpu, WgpuBackend};
use error::{ApiError, Code};
use request::Request;
use serde::Serialize;
use session::{DrafterSource, Session};
use std::cell::Cell;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use wasm_bindgen::prelude::*;
use yielding::Yielding;

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_namespace = console, js_name = error)]
    fn console_error(s: &str);
}

static PANIC_MESSAGE: Mutex<Option<String>> = Mutex::new(None);

#[wasm_bindgen(start)]
pub fn start() {
    std::panic::set_hook(Box::new(|info| {
        let msg = format!("blockdraft bug (please report): {info}");
        console_error(&msg);
        if let Ok(mut m) = PANIC_MESSAGE.lock() {
            *m = Some(msg);
        }
    }));
}

/// The message of the last panic, if any. After a panic the module's
/// state is unusable: the JS side must create a new engine (new module).
#[wasm_bindgen]
pub fn take_panic_message() -> Option<String> {
    PANIC_MESSAGE.lock().ok().and_then(|mut m| m.take())
}

enum Loaded {
    Cpu(Session<Yielding<CpuBackend>>),
    WebGpu(Session<WgpuBackend>),
}

/// Runs `$body` with `$s` bound to the session, whatever its backend.
macro_rules! with_session {
    ($loaded:expr, $s:ident => $body:expr) => {
        match $loaded {
            Loaded::Cpu($s) => $body,
            Loaded::WebGpu($s) => $body,
        }
    };
}

struct Inner {
    loaded: Loaded,
    busy: Cell<bool>,
    load_seconds: f64,
}

/// A loaded model. One request runs at a time.
#[wasm_bindgen]
pub struct Engine {
    inner: Rc<Inner>,
}

#[derive(Serialize)]
struct Info {
    backend: &'static str,
    device: String,
    drafter: &'static str,
    has_chat_template: bool,
    n_ctx_train: usize,
    load_seconds: f64,
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

#[wasm_bindgen]
impl Engine {
    /// Loads `model` on `backend` ("auto", "webgpu" or "cpu"). `drafter`
    /// is a GGUF drafter, or none; `ngram` selects prompt-lookup drafting
    /// instead. `on_progress(done, total)` sees the weight bytes loaded.
    pub async fn load(
        model: GgufBytes,
        backend: String,
        drafter: Option<GgufBytes>,
        ngram: bool,
        on_progress: Option<js_sys::Function>,
    ) -> Result<Engine, JsValue> {
        let t0 = web_time::Instant::now();
        let want_gpu = parse_backend(&backend)?;
        let drafter = match (drafter, ngram) {
            (Some(_), true) => {
                return Err(ApiError::invalid("give a drafter file or ngram, not both").into())
            }
            (Some(d), false) => DrafterSource::Gguf(d.into_file()?),
            (None, true) => DrafterSource::Ngram,
            (None, false) => DrafterSource::None,
        };
        let file = model.into_file()?;
        let mut progress = |done: u64, total: u64| {
            if let Some(f) = &on_progress {
                // A throwing progress callback must not fail the load.
                let _ = f.call2(
                    &JsValue::NULL,
                    &(done as f64).into(),
                    &(total as f64).into(),
                );
            }
        };
        let gpu = match want_gpu {
            Some(false) => None,
            Some(true) => Some(request_gpu().await?),
            None => request_gpu().await.ok(),
        };
        let loaded = match gpu {
            Some(gpu) => Loaded::WebGpu(Session::load(
                Arc::new(WgpuBackend::with_gpu(gpu)),
                file,
                drafter,
                &mut progress,
            )?),
            None => Loaded::Cpu(Session::load(
                Arc::new(Yielding(CpuBackend::new(1))),
                file,
                drafter,
                &mut progress,
            )?),
        };
        Ok(Engine {
            inner: Rc::new(Inner {
                loaded,
                busy: Cell::new(false),
                load_seconds: t0.elapsed().as_secs_f64(),
            }),
        })
    }

    /// JSON: backend, device, drafter, has_chat_template, n_ctx_train, load_seconds.
    pub fn info(&self) -> String {
        let backend = match &self.inner.loaded {
            Loaded::Cpu(_) => "cpu",
            Loaded::WebGpu(_) => "webgpu",
        };
        let info = with_session!(&self.inner.loaded, s => Info {
            backend,
            device: s.backend_name(),
            drafter: s.drafter_kind(),
            has_chat_template: s.has_chat_template(),
            n_ctx_train: s.n_ctx_train(),
            load_seconds: self.inner.load_seconds,
        });
        serde_json::to_string(&info).expect("plain data serializes")
    }

    /// Generates for `request` (JSON, see `request.rs`). `on_text(text)` is
    /// called with each piece of text and returns `false` to abort. Resolves
    /// to the usage as JSON.
    pub fn generate(&self, request: &str, on_text: js_sys::Function) -> js_sys::Promise {
        let inner = self.inner.clone();
        let request = Request::from_json(request);
        wasm_bindgen_futures::future_to_promise(async move {
            let request = request?;
            if inner.busy.replace(true) {
                return Err(ApiError::new(
                    Code::Busy,
                    "the engine is already generating; wait for that request or abort it",
                )
                .into());
            }
            let mut emit = |text: &str| {
                // Anything but an explicit `false` (or a throw) continues.
                match on_text.call1(&JsValue::NULL, &text.into()) {
                    Ok(v) => v.as_bool() != Some(false),
                    Err(_) => false,
                }
            };
            let result = with_session!(&inner.loaded, s => s.generate(&request, &mut emit).await);
            inner.busy.set(false);
            // A device error leaves the output meaningless even when the
            // run itself went through.
            if let Loaded::WebGpu(s) = &inner.loaded {
                if let Some(e) = s.backend().take_device_error() {
                    return Err(ApiError::new(
                        Code::Device,
                        format!("the GPU reported an error ({e}); reload, or use backend \"cpu\""),
                    )
                    .into());
                }
            }
            let usage = result?;
            Ok(serde_json::to_string(&usage)
                .expect("plain data serializes")
                .into())
        })
    }
}
