//! A GGUF file kept whole in wasm memory (a drafter), arriving from JS in
//! chunks (a `fetch` body stream, slices of a `File`), so no single JS
//! buffer has to hold it. The stream reader checks the header as soon as
//! it is complete, so a wrong file fails before the rest of it downloads.

use crate::error::{ApiError, Code};
use blockdraft_gguf::{GgufFile, GgufStreamReader};

pub struct GgufBytes {
    reader: GgufStreamReader,
    bytes: Vec<u8>,
    total_len: Option<usize>,
}

pub(crate) fn bad_gguf(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        Code::BadGguf,
        format!(
            "not a usable GGUF file: {e}; check that the URL or file is a complete .gguf model"
        ),
    )
}

fn too_big(len: usize) -> ApiError {
    ApiError::new(
        Code::OutOfMemory,
        format!(
            "a model of {} MiB does not fit in this page's WebAssembly memory \
             (at most 4 GiB, less in practice); use a smaller or more quantized model",
            len >> 20
        ),
    )
}

impl GgufBytes {
    /// `total_len`: the file's size when known (Blob.size, Content-Length);
    /// the memory is then reserved once and the stream checked against it.
    pub fn new(total_len: Option<u64>) -> Result<GgufBytes, ApiError> {
        let total_len = total_len
            .map(|n| usize::try_from(n).map_err(|_| too_big(usize::MAX)))
            .transpose()?;
        let mut bytes = Vec::new();
        let mut reader = GgufStreamReader::new();
        if let Some(n) = total_len {
            bytes.try_reserve_exact(n).map_err(|_| too_big(n))?;
            reader = reader.with_total_len(n as u64);
        }
        Ok(GgufBytes {
            reader,
            bytes,
            total_len,
        })
    }

    /// Appends the next chunk of the file.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), ApiError> {
        // The reader's pieces are these same bytes, kept whole below.
        self.reader.push(chunk).map_err(bad_gguf)?;
        let len = self.bytes.len() + chunk.len();
        self.bytes
            .try_reserve(chunk.len())
            .map_err(|_| too_big(len))?;
        self.bytes.extend_from_slice(chunk);
        Ok(())
    }

    /// The complete, validated file.
    pub fn into_file(self) -> Result<GgufFile, ApiError> {
        if let Some(n) = self.total_len {
            if self.bytes.len() != n {
                return Err(bad_gguf(format!(
                    "only {} of {n} bytes arrived (interrupted download?)",
                    self.bytes.len()
                )));
            }
        }
        self.reader.finish().map_err(bad_gguf)?;
        GgufFile::from_vec(self.bytes).map_err(bad_gguf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockdraft_gguf::GgufWriter;

    fn file() -> Vec<u8> {
        let mut w = GgufWriter::new();
        w.add_f32_tensor("t", &[3], &[1.0, 2.0, 3.0]).unwrap();
        w.to_bytes().unwrap()
    }

    #[test]
    fn chunks_assemble_the_file_and_bad_streams_are_typed_errors() {
        let bytes = file();
        for total in [Some(bytes.len() as u64), None] {
            let mut b = GgufBytes::new(total).unwrap();
            for c in bytes.chunks(7) {
                b.push(c).unwrap();
            }
            let f = b.into_file().unwrap();
            assert_eq!(
                f.tensor_data("t").unwrap().to_f32().unwrap(),
                [1.0, 2.0, 3.0]
            );
        }
        let mut b = GgufBytes::new(Some(bytes.len() as u64)).unwrap();
        b.push(&bytes[..bytes.len() - 1]).unwrap();
        assert_eq!(b.into_file().unwrap_err().code, Code::BadGguf);
        let mut b = GgufBytes::new(None).unwrap();
        assert_eq!(b.push(&[0u8; 64]).unwrap_err().code, Code::BadGguf);
        let mut b = GgufBytes::new(Some(4)).unwrap();
        assert_eq!(b.push(&bytes).unwrap_err().code, Code::BadGguf);
    }
}
