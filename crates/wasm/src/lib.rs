//! The JS API of blockdraft (wasm-bindgen): load a GGUF model, optionally
//! with a drafter, on WebGPU or the CPU ([`EngineBuilder`], fed the files
//! in chunks), and generate with streamed text ([`Engine`]); check that a
//! download is a whole GGUF file ([`GgufCheck`]). `www/` wraps
//! it in the npm package; its `.d.ts` documents the JS side.
//!
//! Every failure reaches JS as a typed error (see [`error`]). A panic is a
//! bug: the hook keeps its message for [`take_panic_message`] so the JS
//! wrapper can report it as an error instead of a bare `unreachable` trap.

mod bytes;
mod check;
mod error;
mod loader;
mod request;
mod session;
mod yielding;

pub use check::GgufCheck;
pub use loader::EngineBuilder;

use blockdraft_cpu::CpuBackend;
use blockdraft_wgpu::WgpuBackend;
use error::{ApiError, Code};
use request::Request;
use serde::Serialize;
use session::Session;
use std::cell::Cell;
use std::rc::Rc;
use std::sync::Mutex;
use wasm_bindgen::prelude::*;

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

pub(crate) enum Loaded {
    Cpu(Session<CpuBackend>),
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
    kv_type: &'static str,
    has_chat_template: bool,
    n_ctx_train: usize,
    load_seconds: f64,
}

impl Engine {
    pub(crate) fn new(loaded: Loaded, load_seconds: f64) -> Engine {
        Engine {
            inner: Rc::new(Inner {
                loaded,
                busy: Cell::new(false),
                load_seconds,
            }),
        }
    }
}

#[wasm_bindgen]
impl Engine {
    /// JSON: backend, device, drafter, kv_type, has_chat_template, n_ctx_train, load_seconds.
    pub fn info(&self) -> String {
        let backend = match &self.inner.loaded {
            Loaded::Cpu(_) => "cpu",
            Loaded::WebGpu(_) => "webgpu",
        };
        let info = with_session!(&self.inner.loaded, s => Info {
            backend,
            device: s.backend_name(),
            drafter: s.drafter_kind(),
            kv_type: s.kv_type().name(),
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
                // A lost device makes the rest meaningless: stop there.
                if let Loaded::WebGpu(s) = &inner.loaded {
                    if s.backend().has_device_error() {
                        return false;
                    }
                }
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
                        format!(
                            "the GPU reported an error ({e}); this engine is unusable now: \
                             create a new one, or use backend \"cpu\""
                        ),
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
