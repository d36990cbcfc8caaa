//! Whole-file reader over a memory map or an owned byte buffer.

use std::collections::HashMap;
use std::fmt;
use std::ops::{Deref, Range};
use std::path::Path;
use std::sync::Arc;

use crate::error::{GgufError, Result};
use crate::parse::{parse_header, validate_layout, GgufHeader, Halt, TensorInfo};
use crate::split::{check_split_set, split_paths, SplitInfo};
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

/// One file of a model: the whole model, or one part of a split set.
#[derive(Clone)]
struct Part {
    backing: Arc<Backing>,
    path: Option<Arc<Path>>,
    data_offset: u64,
}

#[derive(Clone)]
struct Inner {
    parts: Vec<Part>,
    /// The first part's header, with the tensors of every part.
    header: GgufHeader,
    /// Index in `parts` of each tensor in `header.tensors`.
    tensor_part: Vec<usize>,
    /// Tensor name → index in `header.tensors`.
    by_name: HashMap<String, usize>,
}

/// A parsed GGUF file (v2 or v3, little-endian), or a split set of them
/// read as one.
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
            .field("path", &self.path())
            .field("n_parts", &self.inner.parts.len())
            .field("version", &self.inner.header.version)
            .field("n_metadata", &self.inner.header.metadata.len())
            .field("n_tensors", &self.inner.header.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps and parses the file at `path`. For the first part of a
    /// split set (`model-00001-of-00003.gguf`) the other parts, named the
    /// same way beside it, are opened too and read as one file.
    ///
    /// The map is read-only; as with any mmap, the file must not be truncated
    /// or rewritten while this value (or any [`TensorData`]) is alive.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        let first = Self::open_one(path)?;
        let Some(info) = SplitInfo::from_metadata(first.metadata()).map_err(|e| first.err(e))?
        else {
            return Ok(first);
        };
        let wrap = |m: String| GgufError::Split(m).in_file(Some(path));
        if info.no != 0 {
            return Err(wrap(format!(
                "this is part {} of {}; open the first part (…-00001-of-{:05}.gguf)",
                info.no + 1,
                info.count,
                info.count
            )));
        }
        let paths = split_paths(path).ok_or_else(|| {
            wrap("the file name does not follow the split naming (name-00001-of-0000N.gguf), so the other parts cannot be found".into())
        })?;
        let mut parts = vec![first];
        for p in &paths[1..] {
            parts.push(Self::open_one(p)?);
        }
        Self::from_parts(parts)
    }

    fn open_one(path: &Path) -> Result<GgufFile> {
        let wrap = |e: GgufError| e.in_file(Some(path));
        let file = std::fs::File::open(path).map_err(|e| wrap(e.into()))?;
        // A directory opens on Unix, then fails to map with a cryptic
        // "No such device".
        if file.metadata().is_ok_and(|m| m.is_dir()) {
            let e = std::io::Error::new(
                std::io::ErrorKind::IsADirectory,
                "is a directory, not a GGUF file",
            );
            return Err(wrap(e.into()));
        }
        // SAFETY: the map is read-only and we never hand out `&mut`; the
        // caller is told not to modify the file while it is open.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| wrap(e.into()))?;
        Self::from_backing(Backing::Mmap(map), Some(Arc::from(path)))
    }

    /// Reads the parts of a split set, in order, as one file.
    pub fn from_parts(parts: Vec<GgufFile>) -> Result<GgufFile> {
        let mut keys = Vec::with_capacity(parts.len());
        for p in &parts {
            if p.inner.parts.len() != 1 {
                return Err(GgufError::Split("a part is itself a split set".into()));
            }
            let info = SplitInfo::from_metadata(p.metadata()).map_err(|e| p.err(e))?;
            keys.push((info, p.tensors().len()));
        }
        check_split_set(&keys)?;
        let mut parts = parts.into_iter();
        let Some(first) = parts.next() else {
            return Err(GgufError::Split("no files".into()));
        };
        let mut merged = Arc::unwrap_or_clone(first.inner);
        for part in parts {
            let inner = Arc::unwrap_or_clone(part.inner);
            let at = merged.parts.len();
            for t in inner.header.tensors {
                let index = merged.header.tensors.len();
                if merged.by_name.insert(t.name.clone(), index).is_some() {
                    return Err(GgufError::DuplicateTensor { tensor: t.name });
                }
                merged.header.tensors.push(t);
                merged.tensor_part.push(at);
            }
            merged.parts.extend(inner.parts);
        }
        Ok(GgufFile {
            inner: Arc::new(merged),
        })
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
        let data_offset = header.data_offset;
        Ok(GgufFile {
            inner: Arc::new(Inner {
                parts: vec![Part {
                    backing: Arc::new(backing),
                    path,
                    data_offset,
                }],
                tensor_part: vec![0; header.tensors.len()],
                header,
                by_name,
            }),
        })
    }

    /// The path given to [`GgufFile::open`], if any.
    pub fn path(&self) -> Option<&Path> {
        self.inner.parts[0].path.as_deref()
    }

    /// Files read as this one: 1, or the parts of a split set.
    pub fn n_parts(&self) -> usize {
        self.inner.parts.len()
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

    /// Absolute file offset of the data section (of the first part).
    pub fn data_offset(&self) -> u64 {
        self.inner.header.data_offset
    }

    /// The whole file's bytes, mapped or owned (the first part's).
    pub fn bytes(&self) -> &[u8] {
        self.inner.parts[0].backing.bytes()
    }

    fn err(&self, e: GgufError) -> GgufError {
        e.in_file(self.path())
    }

    /// The bytes of tensor `name`, without copying.
    pub fn tensor_data(&self, name: &str) -> Result<TensorData> {
        let index = self.tensor_index(name).ok_or_else(|| {
            self.err(GgufError::MissingTensor {
                tensor: name.to_string(),
            })
        })?;
        self.tensor_data_at(index)
    }

    /// The bytes of the tensor at `index` in [`GgufFile::tensors`].
    pub fn tensor_data_at(&self, index: usize) -> Result<TensorData> {
        let (Some(info), Some(&part)) =
            (self.tensors().get(index), self.inner.tensor_part.get(index))
        else {
            return Err(self.err(GgufError::MissingTensor {
                tensor: format!("#{index}"),
            }));
        };
        let part = &self.inner.parts[part];
        let err = |e: GgufError| e.in_file(part.path.as_deref());
        // Layout was validated at open; recheck with checked ops anyway so a
        // hand-edited TensorInfo can never slice out of bounds.
        let len = part.backing.bytes().len() as u64;
        if info.n_bytes == 0 {
            // A zero-size tensor may sit past the end of a file that has no
            // data section at all; it is an empty slice either way.
            let at = part.data_offset.saturating_add(info.offset).min(len) as usize;
            return Ok(TensorData {
                backing: part.backing.clone(),
                range: at..at,
                ty: info.ty,
                dims: info.dims.clone(),
            });
        }
        let range = part
            .data_offset
            .checked_add(info.offset)
            .and_then(|s| s.checked_add(info.n_bytes).map(|e| s..e))
            .filter(|r| r.end <= len)
            .ok_or_else(|| {
                err(GgufError::TensorOutOfBounds {
                    tensor: info.name.clone(),
                    offset: info.offset,
                    end: info.offset.saturating_add(info.n_bytes),
                    data_len: len.saturating_sub(part.data_offset),
                })
            })?;
        Ok(TensorData {
            backing: part.backing.clone(),
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
    /// A tensor held on its own, e.g. assembled from a stream: `bytes` must
    /// be exactly the size that `ty` and `dims` imply.
    pub fn from_vec(ty: GgmlType, dims: Vec<u64>, bytes: Vec<u8>) -> Result<TensorData> {
        let n = dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .and_then(|n| ty.bytes_for(n));
        if n != Some(bytes.len() as u64) {
            return Err(GgufError::BadLength {
                what: format!("{ty} tensor of dims {dims:?}"),
                expected: n.unwrap_or(u64::MAX),
                found: bytes.len() as u64,
            });
        }
        Ok(TensorData {
            range: 0..bytes.len(),
            backing: Arc::new(Backing::Vec(bytes)),
            ty,
            dims,
        })
    }

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

    /// Tells the OS these bytes will not be read again soon (a backend keeps
    /// its own copy): a memory-mapped tensor's whole pages leave this
    /// process's resident memory. They stay in the page cache and fault back
    /// in, unchanged, if read. Does nothing for tensors held in memory.
    pub fn release_pages(&self) {
        self.release_pages_in(0..self.range.len());
    }

    /// [`Self::release_pages`] for the bytes `within` the tensor (clamped to
    /// it): lets a copy release its source as it goes, so that the source
    /// and the copy are never both resident whole.
    pub fn release_pages_in(&self, within: std::ops::Range<usize>) {
        #[cfg(not(unix))]
        let _ = within;
        #[cfg(unix)]
        if let Backing::Mmap(map) = &*self.backing {
            // Whole 4 KiB pages inside the range; with larger pages the
            // kernel rounds down, which only drops bytes that fault back in.
            const PAGE: usize = 4096;
            let len = self.range.len();
            let (from, to) = (within.start.min(len), within.end.min(len));
            let start = (self.range.start + from).next_multiple_of(PAGE);
            let end = (self.range.start + to) / PAGE * PAGE;
            if end > start {
                // SAFETY: the map is read-only and file-backed, so dropping
                // its pages loses nothing: later reads see the same bytes.
                // Failure only means the pages stay resident.
                let _ = unsafe {
                    map.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        start,
                        end - start,
                    )
                };
            }
        }
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
