//! Chunk-stream reader: parse a GGUF file as it arrives (e.g. from `fetch`
//! in a browser) without ever holding the whole file.
//!
//! Only the header is buffered. Once it has arrived, every later byte is
//! handed back as [`TensorChunk`]s that say which tensor and which offset
//! inside it the bytes belong to, so a consumer can upload them straight
//! into GPU buffers.

use std::borrow::Cow;
use std::ops::Deref;

use crate::error::{GgufError, Result};
use crate::parse::{parse_header, validate_layout, GgufHeader, Halt};

/// Default cap on the header size when the total length is unknown.
pub const DEFAULT_MAX_HEADER_BYTES: u64 = 256 << 20;
/// Header re-parse attempts grow the buffer by at most this much beyond what
/// the parser asked for, bounding both re-parse work and copied overshoot.
const MAX_OVERSHOOT: u64 = 1 << 20;

/// A piece of one tensor's data.
#[derive(Clone, PartialEq)]
pub struct TensorChunk<'a> {
    /// Index into [`GgufHeader::tensors`].
    pub tensor_index: usize,
    /// Where `bytes` go inside the tensor.
    pub offset_in_tensor: u64,
    /// Total size of the tensor, so `offset_in_tensor + len == tensor_len`
    /// tells the consumer the tensor is complete.
    pub tensor_len: u64,
    /// Borrowed from the pushed chunk, or owned for the few data bytes that
    /// arrived together with the end of the header.
    pub bytes: Cow<'a, [u8]>,
}

impl std::fmt::Debug for TensorChunk<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorChunk")
            .field("tensor_index", &self.tensor_index)
            .field("offset_in_tensor", &self.offset_in_tensor)
            .field("tensor_len", &self.tensor_len)
            .field("len", &self.bytes.len())
            .finish()
    }
}

impl TensorChunk<'_> {
    /// Whether this chunk ends its tensor.
    pub fn completes_tensor(&self) -> bool {
        self.offset_in_tensor + self.bytes.len() as u64 == self.tensor_len
    }
}

impl Deref for TensorChunk<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

/// Incremental GGUF reader fed with [`GgufStreamReader::push`].
///
/// ```
/// # use blockdraft_gguf::{GgufStreamReader, GgufWriter};
/// # let file = { let mut w = GgufWriter::new(); w.add_f32_tensor("t", &[2], &[1.0, 2.0]).unwrap(); w.to_bytes().unwrap() };
/// let mut r = GgufStreamReader::new().with_total_len(file.len() as u64);
/// let mut got = Vec::new();
/// for chunk in file.chunks(5) {
///     for piece in r.push(chunk)? {
///         got.extend_from_slice(&piece); // upload(piece.tensor_index, piece.offset_in_tensor, &piece)
///     }
/// }
/// let header = r.finish()?.header;
/// assert_eq!(header.tensors[0].name, "t");
/// assert_eq!(got.len(), 8);
/// # Ok::<(), blockdraft_gguf::GgufError>(())
/// ```
#[derive(Debug)]
pub struct GgufStreamReader {
    total_len: Option<u64>,
    max_header: u64,
    /// File prefix while the header is incomplete.
    header_buf: Vec<u8>,
    /// Do not re-parse before `header_buf` has this many bytes.
    next_attempt: u64,
    header: Option<GgufHeader>,
    /// Tensor indices sorted by offset, and the first not yet fully passed.
    order: Vec<usize>,
    next: usize,
    /// File bytes consumed so far.
    pos: u64,
    failed: bool,
}

impl Default for GgufStreamReader {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufStreamReader {
    pub fn new() -> GgufStreamReader {
        GgufStreamReader {
            total_len: None,
            max_header: DEFAULT_MAX_HEADER_BYTES,
            header_buf: Vec::new(),
            next_attempt: 0,
            header: None,
            order: Vec::new(),
            next: 0,
            pos: 0,
            failed: false,
        }
    }

    /// The file's total length (e.g. `Content-Length`): lets lengths and
    /// tensor bounds be checked as strictly as for a whole file.
    pub fn with_total_len(mut self, len: u64) -> Self {
        self.total_len = Some(len);
        self
    }

    /// Largest header accepted (default 256 MiB).
    pub fn with_max_header_bytes(mut self, n: u64) -> Self {
        self.max_header = n;
        self
    }

    /// The header, once it has been parsed.
    pub fn header(&self) -> Option<&GgufHeader> {
        self.header.as_ref()
    }

    /// Bytes consumed so far.
    pub fn position(&self) -> u64 {
        self.pos
    }

    fn limit(&self) -> u64 {
        match self.total_len {
            Some(t) => t.min(self.max_header),
            None => self.max_header,
        }
    }

    /// Feeds the next chunk; returns the tensor pieces it carries.
    pub fn push<'a>(&mut self, chunk: &'a [u8]) -> Result<Vec<TensorChunk<'a>>> {
        if self.failed {
            return Err(GgufError::Stream("push after an earlier error".to_string()));
        }
        let r = self.push_inner(chunk);
        if r.is_err() {
            self.failed = true;
        }
        r
    }

    fn push_inner<'a>(&mut self, mut chunk: &'a [u8]) -> Result<Vec<TensorChunk<'a>>> {
        if let Some(total) = self.total_len {
            let end = self.pos.checked_add(chunk.len() as u64);
            if end.is_none_or(|e| e > total) {
                return Err(GgufError::Stream(format!(
                    "received more than the announced {total} bytes"
                )));
            }
        }
        let mut out = Vec::new();
        while self.header.is_none() && !chunk.is_empty() {
            // Append up to the next parse attempt point.
            let want = self
                .next_attempt
                .saturating_sub(self.header_buf.len() as u64);
            let take = (want.max(1)).min(chunk.len() as u64) as usize;
            self.header_buf.extend_from_slice(&chunk[..take]);
            self.pos += take as u64;
            chunk = &chunk[take..];
            if (self.header_buf.len() as u64) < self.next_attempt {
                continue;
            }
            match parse_header(&self.header_buf, self.limit(), false) {
                Ok(h) => self.start_data(h, &mut out)?,
                Err(Halt::Need(n)) => {
                    let len = self.header_buf.len() as u64;
                    if n > self.max_header {
                        return Err(GgufError::LengthTooLarge {
                            what: "header".to_string(),
                            len: n,
                            remaining: self.max_header,
                        });
                    }
                    // Grow geometrically (bounded) so a header arriving in
                    // tiny chunks is not re-parsed once per chunk.
                    let mut next = n.max(len + len.min(MAX_OVERSHOOT));
                    if let Some(total) = self.total_len {
                        // Always attempt a parse once the whole file is in.
                        next = next.min(total);
                    }
                    self.next_attempt = next;
                }
                Err(Halt::Err(e)) => return Err(e),
            }
        }
        if self.header.is_some() && !chunk.is_empty() {
            let start = self.pos;
            self.pos += chunk.len() as u64;
            self.emit(start, Cow::Borrowed(chunk), &mut out);
        }
        Ok(out)
    }

    fn start_data<'a>(&mut self, h: GgufHeader, out: &mut Vec<TensorChunk<'a>>) -> Result<()> {
        let data_len = self.total_len.map(|t| t.saturating_sub(h.data_offset));
        validate_layout(&h.tensors, h.alignment, data_len)?;
        let mut order: Vec<usize> = (0..h.tensors.len()).collect();
        order.sort_by_key(|&i| h.tensors[i].offset);
        self.order = order;
        self.header = Some(h);
        // Bytes already buffered past the header belong to the data section.
        let buf = std::mem::take(&mut self.header_buf);
        let data_offset = self.header.as_ref().map_or(0, |h| h.data_offset);
        if (buf.len() as u64) > data_offset {
            let extra = buf[data_offset as usize..].to_vec();
            self.emit(data_offset, Cow::Owned(extra), out);
        }
        Ok(())
    }

    /// Splits the file bytes starting at absolute offset `start` into
    /// per-tensor pieces (bytes in padding or gaps are skipped).
    fn emit<'a>(&mut self, start: u64, bytes: Cow<'a, [u8]>, out: &mut Vec<TensorChunk<'a>>) {
        let Some(h) = &self.header else { return };
        let end = start + bytes.len() as u64;
        let mut i = self.next;
        while i < self.order.len() {
            let idx = self.order[i];
            let t = &h.tensors[idx];
            // Layout validation made these sums overflow-free.
            let t_start = h.data_offset.saturating_add(t.offset);
            let t_end = t_start.saturating_add(t.n_bytes);
            if t_end <= start {
                i += 1;
                self.next = i;
                continue;
            }
            if t_start >= end {
                break;
            }
            let s = t_start.max(start);
            let e = t_end.min(end);
            let piece = match &bytes {
                Cow::Borrowed(b) => Cow::Borrowed(&b[(s - start) as usize..(e - start) as usize]),
                Cow::Owned(b) => Cow::Owned(b[(s - start) as usize..(e - start) as usize].to_vec()),
            };
            out.push(TensorChunk {
                tensor_index: idx,
                offset_in_tensor: s - t_start,
                tensor_len: t.n_bytes,
                bytes: piece,
            });
            if t_end <= end {
                i += 1;
                self.next = i;
            } else {
                break;
            }
        }
    }

    /// Ends the stream: checks that the header and every tensor arrived in
    /// full. `tail` holds data bytes that were still buffered with the
    /// header; it is always empty when the total length was given.
    pub fn finish(mut self) -> Result<StreamEnd> {
        if self.failed {
            return Err(GgufError::Stream(
                "finish after an earlier error".to_string(),
            ));
        }
        let mut tail = Vec::new();
        if self.header.is_none() {
            // Last attempt, now knowing the buffer is the whole file; a
            // failure gives the same error as reading the file whole.
            let len = self.header_buf.len() as u64;
            match parse_header(&self.header_buf, len, true) {
                Ok(h) => {
                    let mut pieces = Vec::new();
                    self.start_data(h, &mut pieces)?;
                    tail = pieces
                        .into_iter()
                        .map(|p| TensorChunk {
                            bytes: Cow::Owned(p.bytes.into_owned()),
                            ..p
                        })
                        .collect();
                }
                Err(Halt::Err(e)) => return Err(e),
                Err(Halt::Need(needed)) => {
                    return Err(GgufError::Truncated {
                        what: "header".to_string(),
                        needed,
                        len,
                    })
                }
            }
        }
        let Some(header) = self.header else {
            return Err(GgufError::Stream("no header".to_string()));
        };
        if let Some(total) = self.total_len {
            if self.pos != total {
                return Err(GgufError::Truncated {
                    what: "stream".to_string(),
                    needed: total,
                    len: self.pos,
                });
            }
        }
        let data_len = self.pos.saturating_sub(header.data_offset);
        validate_layout(&header.tensors, header.alignment, Some(data_len))?;
        Ok(StreamEnd { header, tail })
    }
}

/// What [`GgufStreamReader::finish`] returns.
#[derive(Debug)]
pub struct StreamEnd {
    pub header: GgufHeader,
    /// Tensor pieces not yet returned by `push` (only possible when the
    /// total length was not given and the file ended right after the header).
    pub tail: Vec<TensorChunk<'static>>,
}
