//! Loading a model as its bytes arrive (a download, slices of a local
//! file): each tensor is made resident on the backend as soon as its last
//! byte is in, so at most one tensor is ever held in host memory. In the
//! browser this is what lets a model larger than wasm32's 4 GiB address
//! space load onto WebGPU.

use super::weights::TensorSource;
use crate::backend::{Backend, WeightRole, WeightSource};
use crate::error::ModelError;
use blockdraft_gguf::{
    check_split_set, GgufError, GgufStreamReader, Metadata, SplitInfo, TensorChunk, TensorData,
    TensorInfo,
};
use std::collections::HashMap;
use std::sync::Arc;

/// A model file, or the parts of a split set in order, fed in chunks:
/// `begin_part`, `push`…, `end_part` for each file, then `finish`.
pub struct StreamingLoad<B: Backend> {
    /// The file being read.
    part: Option<GgufStreamReader>,
    /// The tensor being assembled: its index in the part's header, bytes.
    pending: Option<(usize, Vec<u8>)>,
    resident: Resident<B>,
    /// Split keys and tensor count of each finished part.
    parts: Vec<(Option<SplitInfo>, usize)>,
    metadata: Option<Metadata>,
}

struct Resident<B: Backend> {
    backend: Arc<B>,
    infos: HashMap<String, TensorInfo>,
    weights: HashMap<String, B::Weight>,
    loaded_bytes: u64,
}

/// What [`StreamingLoad::finish`] returns: the metadata of the model and
/// its resident weights, a [`TensorSource`] for `Decoder::load_with_config`.
pub struct StreamedModel<B: Backend> {
    pub metadata: Metadata,
    infos: HashMap<String, TensorInfo>,
    weights: HashMap<String, B::Weight>,
}

fn stream_err(m: impl Into<String>) -> ModelError {
    ModelError::Gguf(GgufError::Stream(m.into()))
}

impl<B: Backend> StreamingLoad<B> {
    pub fn new(backend: Arc<B>) -> Self {
        StreamingLoad {
            part: None,
            pending: None,
            resident: Resident {
                backend,
                infos: HashMap::new(),
                weights: HashMap::new(),
                loaded_bytes: 0,
            },
            parts: Vec::new(),
            metadata: None,
        }
    }

    /// Starts the next file; `total_len` (when known) is checked at its end.
    pub fn begin_part(&mut self, total_len: Option<u64>) -> Result<(), ModelError> {
        if self.part.is_some() {
            return Err(stream_err("begin_part before the previous part ended"));
        }
        let reader = GgufStreamReader::new();
        self.part = Some(match total_len {
            Some(n) => reader.with_total_len(n),
            None => reader,
        });
        Ok(())
    }

    /// The model's metadata, as soon as the first part's header is in (so
    /// a wrong model fails before the rest of it downloads).
    pub fn metadata(&self) -> Option<&Metadata> {
        match (&self.metadata, &self.part) {
            (Some(m), _) => Some(m),
            (None, Some(r)) => r.header().map(|h| &h.metadata),
            (None, None) => None,
        }
    }

    /// Weight bytes made resident so far.
    pub fn loaded_bytes(&self) -> u64 {
        self.resident.loaded_bytes
    }

    /// Feeds the next bytes of the current part.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), ModelError> {
        let reader = self
            .part
            .as_mut()
            .ok_or_else(|| stream_err("push outside a part"))?;
        let pieces = reader.push(chunk)?;
        if pieces.is_empty() {
            return Ok(());
        }
        let header = reader.header().expect("pieces come after the header");
        self.resident
            .assemble(&mut self.pending, &header.tensors, pieces)
    }

    /// Ends the current part: checks it arrived whole.
    pub fn end_part(&mut self) -> Result<(), ModelError> {
        let reader = self
            .part
            .take()
            .ok_or_else(|| stream_err("end_part outside a part"))?;
        let end = reader.finish()?;
        let header = end.header;
        self.resident
            .assemble(&mut self.pending, &header.tensors, end.tail)?;
        // Tensors of zero bytes come in no piece.
        for t in header.tensors.iter().filter(|t| t.n_bytes == 0) {
            self.resident.upload(t, Vec::new())?;
        }
        if let Some(t) = header
            .tensors
            .iter()
            .find(|t| !self.resident.weights.contains_key(&t.name))
        {
            return Err(stream_err(format!(
                "tensor {} did not arrive whole",
                t.name
            )));
        }
        let info = SplitInfo::from_metadata(&header.metadata)?;
        self.parts.push((info, header.tensors.len()));
        if self.metadata.is_none() {
            self.metadata = Some(header.metadata);
        }
        Ok(())
    }

    /// The whole model, once every part has ended.
    pub fn finish(self) -> Result<StreamedModel<B>, ModelError> {
        if self.part.is_some() {
            return Err(stream_err("finish before the last part ended"));
        }
        check_split_set(&self.parts)?;
        Ok(StreamedModel {
            metadata: self.metadata.expect("check_split_set needs a part"),
            infos: self.resident.infos,
            weights: self.resident.weights,
        })
    }
}

impl<B: Backend> Resident<B> {
    /// Appends `pieces` to the pending tensor, uploading each one completed.
    fn assemble(
        &mut self,
        pending: &mut Option<(usize, Vec<u8>)>,
        tensors: &[TensorInfo],
        pieces: Vec<TensorChunk<'_>>,
    ) -> Result<(), ModelError> {
        for p in pieces {
            let info = &tensors[p.tensor_index];
            if p.offset_in_tensor == 0 {
                let oom = || ModelError::OutOfMemory {
                    what: format!("tensor {}", info.name),
                    bytes: p.tensor_len,
                };
                // (A tensor beyond wasm32's address space fails here, not by wrapping.)
                let len = usize::try_from(p.tensor_len).map_err(|_| oom())?;
                let mut bytes = Vec::new();
                bytes.try_reserve_exact(len).map_err(|_| oom())?;
                *pending = Some((p.tensor_index, bytes));
            }
            let Some((index, bytes)) = pending.as_mut() else {
                return Err(stream_err("a tensor's bytes arrived without its start"));
            };
            if *index != p.tensor_index || bytes.len() as u64 != p.offset_in_tensor {
                return Err(stream_err("tensor bytes arrived out of order"));
            }
            bytes.extend_from_slice(&p.bytes);
            if p.completes_tensor() {
                let (_, bytes) = pending.take().expect("checked above");
                self.upload(info, bytes)?;
            }
        }
        Ok(())
    }

    fn upload(&mut self, t: &TensorInfo, bytes: Vec<u8>) -> Result<(), ModelError> {
        if self.infos.contains_key(&t.name) {
            return Err(ModelError::Gguf(GgufError::DuplicateTensor {
                tensor: t.name.clone(),
            }));
        }
        let data = TensorData::from_vec(t.ty, t.dims.clone(), bytes)?;
        let w = self.backend.load_weight(WeightSource {
            name: &t.name,
            ty: t.ty,
            dims: &t.dims,
            data,
            role: WeightRole::Target,
        })?;
        self.loaded_bytes += t.n_bytes;
        self.weights.insert(t.name.clone(), w);
        self.infos.insert(t.name.clone(), t.clone());
        Ok(())
    }
}

impl<B: Backend> TensorSource<B> for StreamedModel<B> {
    fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.infos.get(name)
    }

    fn load(&mut self, name: &str, _backend: &B) -> Result<B::Weight, ModelError> {
        self.weights
            .remove(name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_string(),
            })
    }
}
