//! Typed errors for JS: every failure reaches JS as an `Error` whose `name`
//! is `BlockdraftError` and whose `code` says what went wrong, with a
//! message that says what to do about it.

use blockdraft_core::backend::BackendError;
use blockdraft_core::ModelError;
use wasm_bindgen::JsValue;

/// The `code` of a `BlockdraftError` (the strings are part of the JS API).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// A JS argument is missing, of the wrong type or out of range.
    InvalidArgument,
    /// The bytes are not a valid GGUF file.
    BadGguf,
    /// A valid GGUF that this engine cannot run (architecture, tensors, tokenizer, template).
    UnsupportedModel,
    /// `backend: "webgpu"` was asked for and the browser offers no adapter.
    NoWebGpu,
    /// The GPU device failed or was lost.
    Device,
    /// An allocation that the input asked for does not fit in memory.
    OutOfMemory,
    /// The engine is already generating (one request at a time).
    Busy,
    /// Generation failed (context full, bad token).
    Generation,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::InvalidArgument => "invalid_argument",
            Code::BadGguf => "bad_gguf",
            Code::UnsupportedModel => "unsupported_model",
            Code::NoWebGpu => "no_webgpu",
            Code::Device => "device",
            Code::OutOfMemory => "out_of_memory",
            Code::Busy => "busy",
            Code::Generation => "generation",
        }
    }
}

#[derive(Debug)]
pub struct ApiError {
    pub code: Code,
    pub message: String,
}

impl ApiError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }

    /// A model-loading failure of `what` ("model", "drafter").
    pub fn model(what: &str, e: ModelError) -> Self {
        let code = match &e {
            ModelError::Gguf(_) => Code::BadGguf,
            ModelError::Backend(BackendError::Device(_)) => Code::Device,
            ModelError::OutOfMemory { .. } | ModelError::MemoryLimit { .. } => Code::OutOfMemory,
            _ => Code::UnsupportedModel,
        };
        ApiError::new(code, format!("cannot load the {what}: {e}"))
    }

    pub fn generation(e: ModelError) -> Self {
        let code = match &e {
            ModelError::Backend(BackendError::Device(_)) => Code::Device,
            ModelError::OutOfMemory { .. } | ModelError::MemoryLimit { .. } => Code::OutOfMemory,
            _ => Code::Generation,
        };
        ApiError::new(code, format!("generation failed: {e}"))
    }
}

impl From<ApiError> for JsValue {
    fn from(e: ApiError) -> JsValue {
        let err = js_sys::Error::new(&e.message);
        err.set_name("BlockdraftError");
        // Reflect::set only fails on frozen or non-objects; an Error is neither.
        let _ = js_sys::Reflect::set(&err, &"code".into(), &e.code.as_str().into());
        err.into()
    }
}
