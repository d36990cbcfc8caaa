//! Whole-file reader over a memory map or an owned byte buffer.

use std::collections::HashMap;
use std::fmt;
use std::ops::{Deref, Range};
use std::path::Path;
use std::sync::Arc;

use crate::error::{GgufError, Result};
use crate::parse::{parse_header, validate_layout, GgufHeader, Halt, TensorInfo};
use crate::value::Metadata;
use crate::GgmlType;

/// Backing storage of a file. Tensor data borrows from it through an `Arc`,
/// so weights can stay in the page cache instead of being copied.
enum Backing {
    Mmap(memmap2::Mmap),
    Bytes(Arc<[u8]>),
    Vec(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Bytes(b) => b,
            Backing::Vec(v) => v,
        }
    }
}

struct Inner {
    backing: Arc<Backing>,
    path: Option<Arc<Path>>,
    header: GgufHeader,
    /// Tensor name → index in `header.tensors`.
    by_name: HashMap<String, usize>,
}

/// A parsed GGUF file (v2 or v3, little-endian).
///
/// Cloning is cheap (one `Arc`). The header is parsed and every tensor's
/// placement validated up front, so [`GgufFile::tensor_data`] only slices.
#[derive(Clone)]
pub struct GgufFile {
    inner: Arc<Inner>,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.inner.path)
            .field("version", &self.inner.header.version)
            .field("n_metadata", &self.inner.header.metadata.len())
            .field("n_tensors", &self.inner.header.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps and parses the file at `path`.
    ///
    /// The map is read-only; as with any mmap, the file must not be truncated
    /// or rewritten while this value (or any [`TensorData`]) is alive.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        let wrap = |e: GgufError| e.in_file(Some(path));
        let file = std::fs::File::open(path).map_err(|e| wrap(e.into()))?;
        // SAFETY: the map is read-only and we never hand out `&mut`; the
        // caller is told not to modify the file while it is open.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| wrap(e.into()))?;
        Self::from_backing(Backing::Mmap(map), Some(Arc::from(path)))
    }

    /// Parses a file held in memory (e.g. fetched over the network).
    pub fn from_bytes(bytes: impl Into<Arc<[u8]>>) -> Result<GgufFile> {
        Self::from_backing(Backing::Bytes(bytes.into()), None)
    }

    /// [`Self::from_bytes`] without the copy into an `Arc` (a browser
    /// assembles a model from chunks into one `Vec`; copying it would
    /// double the peak memory).
    pub fn from_vec(bytes: Vec<u8>) -> Result<GgufFile> {
        Self::from_backing(Backing::Vec(bytes), None)
    }

    fn from_backing(backing: Backing, path: Option<Arc<Path>>) -> Result<GgufFile> {
        let wrap = |e: GgufError| e.in_file(path.as_deref());
        let bytes = backing.bytes();
        let len = bytes.len() as u64;
        let mut header = match parse_header(bytes, len, true) {
            Ok(h) => h,
            Err(Halt::Err(e)) => return Err(wrap(e)),
            // Cannot happen with `complete = true`; map it anyway.
            Err(Halt::Need(needed)) => {
                return Err(wrap(GgufError::Truncated {
                    what: "header".to_string(),
                    needed,
                    len,
                }))
            }
        };
        let data_len = len.saturating_sub(header.data_offset);
        validate_layout(&header.tensors, header.alignment, Some(data_len)).map_err(wrap)?;
        // Tensor ranges were checked against the file length, which fits in
        // usize because the file is in memory; so all slicing is in bounds.
        header.metadata.set_path(path.clone());
        let by_name = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(GgufFile {
            inner: Arc::new(Inner {
                backing: Arc::new(backing),
                path,
                header,
                by_name,
            }),
        })
    }

    /// The path given to [`GgufFile::open`], if any.
    pub fn path(&self) -> Option<&Path> {
        self.inner.path.as_deref()
    }

    pub fn version(&self) -> u32 {
        self.inner.header.version
    }

    /// Data alignment (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.inner.header.alignment
    }

    pub fn metadata(&self) -> &Metadata {
        &self.inner.header.metadata
    }

    /// Tensors in header order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.inner.header.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.inner
            .by_name
            .get(name)
            .map(|&i| &self.inner.header.tensors[i])
    }

    /// Index of tensor `name` in [`GgufFile::tensors`].
    pub fn tensor_index(&self, name: &str) -> Option<usize> {
        self.inner.by_name.get(name).copied()
    }

    /// `general.architecture` (e.g. `llama`, `qwen2`, `dflash`).
    pub fn architecture(&self) -> Result<&str> {
        self.metadata().get_str("general.architecture")
    }

    /// The parsed header (version, alignment, metadata, tensors).
    pub fn header(&self) -> &GgufHeader {
        &self.inner.header
    }

    /// Absolute file offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.inner.header.data_offset
    }

    /// The whole file's bytes (mapped or owned).
    pub fn bytes(&self) -> &[u8] {
        self.inner.backing.bytes()
    }

    fn err(&self, e: GgufError) -> GgufError {
        e.in_file(self.path())
    }

    /// The bytes of tensor `name`, without copying.
    pub fn tensor_data(&self, name: &str) -> Result<TensorData> {
        let info = self.tensor(name).ok_or_else(|| {
            self.err(GgufError::MissingTensor {
                tensor: name.to_string(),
            })
        })?;
        self.data_for(info)
    }

    /// The bytes of the tensor at `index` in [`GgufFile::tensors`].
    pub fn tensor_data_at(&self, index: usize) -> Result<TensorData> {
        let info = self.tensors().get(index).ok_or_else(|| {
            self.err(GgufError::MissingTensor {
                tensor: format!("#{index}"),
            })
        })?;
        self.data_for(info)
    }

    fn data_for(&self, info: &TensorInfo) -> Result<TensorData> {
        // Layout was validated at open; recheck with checked ops anyway so a
        // hand-edited TensorInfo can never slice out of bounds.
        let len = self.bytes().len() as u64;
        if info.n_bytes == 0 {
            // A zero-size tensor may sit past the end of a file that has no
            // data section at all; it is an empty slice either way.
            let at = self.data_offset().saturating_add(info.offset).min(len) as usize;
            return Ok(TensorData {
                backing: self.inner.backing.clone(),
                range: at..at,
                ty: info.ty,
                dims: info.dims.clone(),
            });
        }
        let range = self
            .data_offset()
            .checked_add(info.offset)
            .and_then(|s| s.checked_add(info.n_bytes).map(|e| s..e))
            .filter(|r| r.end <= len)
            .ok_or_else(|| {
                self.err(GgufError::TensorOutOfBounds {
                    tensor: info.name.clone(),
                    offset: info.offset,
                    end: info.offset.saturating_add(info.n_bytes),
                    data_len: len.saturating_sub(self.data_offset()),
                })
            })?;
        Ok(TensorData {
            backing: self.inner.backing.clone(),
            range: range.start as usize..range.end as usize,
            ty: info.ty,
            dims: info.dims.clone(),
        })
    }
}

/// A tensor's raw bytes, borrowed from the file's storage through an `Arc`.
///
/// Derefs to `[u8]`; also carries the ggml type and dims so it can be
/// decoded on its own (e.g. [`TensorData::to_f32`]).
#[derive(Clone)]
pub struct TensorData {
    backing: Arc<Backing>,
    range: Range<usize>,
    ty: GgmlType,
    dims: Vec<u64>,
}

impl fmt::Debug for TensorData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorData")
            .field("ty", &self.ty)
            .field("dims", &self.dims)
            .field("file_range", &self.range)
            .finish()
    }
}

impl TensorData {
    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    /// ggml order: `dims()[0]` is the contiguous row length.
    pub fn dims(&self) -> &[u64] {
        &self.dims
    }

    pub fn n_elements(&self) -> u64 {
        // Validated at parse time; saturate rather than trust it blindly.
        self.dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .unwrap_or(u64::MAX)
    }

    /// Absolute byte range in the file (useful for zero-copy uploads).
    pub fn file_range(&self) -> Range<usize> {
        self.range.clone()
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.backing.bytes()[self.range.clone()]
    }

    /// Dequantizes / converts the whole tensor to f32.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let n = usize::try_from(self.n_elements()).map_err(|_| GgufError::Overflow {
            what: "tensor element count".to_string(),
        })?;
        let mut out = vec![0f32; n];
        crate::quants::dequantize(self.ty, self.as_bytes(), &mut out)?;
        Ok(out)
    }
}

impl Deref for TensorData {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl AsRef<[u8]> for TensorData {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn is<T: Send + Sync + Clone>() {}
    is::<GgufFile>();
    is::<TensorData>();
}
