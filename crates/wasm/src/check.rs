//! [`GgufCheck`]: whether a download is a whole GGUF file, checked as its
//! chunks arrive and without keeping them. The model cache
//! (`modelCache.add` in www/) stores a file only when this passes, so a
//! failed download (an empty or cut-off body, an error page) never becomes
//! an entry.

use crate::bytes::bad_gguf;
use crate::loader;
use blockdraft_gguf::GgufStreamReader;
use wasm_bindgen::prelude::*;

/// Checks a GGUF file chunk by chunk: `push(chunk)`…, then `finish()`.
/// Failures are `BlockdraftError`s with code `bad_gguf`.
#[wasm_bindgen]
pub struct GgufCheck {
    reader: Option<GgufStreamReader>,
}

#[wasm_bindgen]
impl GgufCheck {
    /// `total_len`: the announced size (Content-Length), when known; the
    /// file must have exactly that many bytes.
    #[wasm_bindgen(constructor)]
    pub fn new(total_len: Option<f64>) -> Result<GgufCheck, JsValue> {
        let mut reader = GgufStreamReader::new();
        if let Some(n) = loader::total_len(total_len)? {
            reader = reader.with_total_len(n);
        }
        Ok(GgufCheck {
            reader: Some(reader),
        })
    }

    /// The next bytes of the file.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), JsValue> {
        let reader = self.reader.as_mut().ok_or_else(finished)?;
        // Only the header is kept; the tensor pieces are dropped.
        reader.push(chunk).map_err(bad_gguf)?;
        Ok(())
    }

    /// Ends the file: fails unless a complete GGUF file (header, every
    /// tensor's bytes, the announced length) arrived.
    pub fn finish(&mut self) -> Result<(), JsValue> {
        let reader = self.reader.take().ok_or_else(finished)?;
        reader.finish().map_err(bad_gguf)?;
        Ok(())
    }
}

fn finished() -> JsValue {
    crate::error::ApiError::invalid("the GGUF check has already finished").into()
}
