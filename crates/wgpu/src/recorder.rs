//! Command recording: ops append dispatches to one pending command encoder;
//! nothing reaches the GPU until a readback (or an explicit flush) submits
//! it. Kernel parameters and small host data (token ids, tensor writes) go
//! through an upload arena that is copied to the GPU once per submit.
//!
//! What each dispatch costs the host is kept small, since small models are
//! bound by it, not by the GPU (`../shared/notes/webgpu-perf.md`): one
//! compute pass stays open across dispatches (WebGPU orders the dispatches
//! inside a pass as it orders passes) and ends only for a copy or a submit;
//! bind groups are cached by what they bind (the arena restarts at every
//! submit, so a round of the same shape binds the same slots again and
//! creates none); readback buffers are pooled.

use crate::device::{DeviceErrors, Tuning};
use crate::params::Uniform;
use crate::profile::Profiler;
use crate::shaders::{Kernel, Pipelines, ShaderFeatures};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

/// Bytes per arena chunk; a dispatch's parameters take one 256-byte slot.
const CHUNK_BYTES: u64 = 1 << 20;
/// Uniform and storage offsets must be multiples of this (WebGPU's default
/// and the most any adapter asks for).
pub const ALIGN: u64 = 256;

/// What crossed the host/device boundary; tests assert on it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Compute dispatches recorded.
    pub dispatches: u64,
    /// Command buffers submitted.
    pub submits: u64,
    /// Buffers mapped and read back to the host.
    pub readbacks: u64,
    /// Bytes of the largest buffer range bound to a kernel so far: tests
    /// check it against the adapter's `max_storage_buffer_binding_size`.
    pub largest_binding: u64,
    /// Compute passes begun.
    pub passes: u64,
    /// Bind groups created (a cached one is not counted again).
    pub bind_groups: u64,
    /// Readback (staging) buffers created (a pooled one is reused).
    pub staging_buffers: u64,
}

#[derive(Default)]
pub(crate) struct AtomicCounters {
    dispatches: AtomicU64,
    submits: AtomicU64,
    readbacks: AtomicU64,
    largest_binding: AtomicU64,
    passes: AtomicU64,
    bind_groups: AtomicU64,
    staging_buffers: AtomicU64,
}

impl AtomicCounters {
    pub fn snapshot(&self) -> Counters {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Counters {
            dispatches: get(&self.dispatches),
            submits: get(&self.submits),
            readbacks: get(&self.readbacks),
            largest_binding: get(&self.largest_binding),
            passes: get(&self.passes),
            bind_groups: get(&self.bind_groups),
            staging_buffers: get(&self.staging_buffers),
        }
    }

    fn add(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Buffers whose owners (tensors, weights, tables) were dropped: the bind
/// groups that hold them are evicted at the next dispatch, so a dropped
/// sequence or model does not stay in GPU memory through the cache.
#[derive(Clone, Default)]
pub(crate) struct Retired(Arc<Mutex<Vec<wgpu::Buffer>>>);

impl Retired {
    pub fn retire(&self, buffer: &wgpu::Buffer) {
        self.0.lock().unwrap().push(buffer.clone());
    }

    fn take(&self) -> Vec<wgpu::Buffer> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// Bind groups kept at most; past it the cache starts over (a model of the
/// same round shape needs a few per dispatch of a round, far fewer).
const MAX_BIND_GROUPS: usize = 16384;

/// What a bind group binds: the kernel, its parameter slot and its buffer
/// ranges.
#[derive(PartialEq, Eq, Hash)]
struct BindKey {
    kernel: Kernel,
    params: (wgpu::Buffer, u64),
    buffers: Vec<(wgpu::Buffer, u64, Option<u64>)>,
}

impl BindKey {
    /// (`dead` is short: the buffers dropped since the last dispatch.)
    fn uses_any(&self, dead: &[wgpu::Buffer]) -> bool {
        dead.contains(&self.params.0) || self.buffers.iter().any(|(b, ..)| dead.contains(b))
    }
}

/// A buffer range bound to a kernel.
#[derive(Clone, Copy)]
pub struct Binding<'a> {
    pub buffer: &'a wgpu::Buffer,
    pub offset: u64,
    /// `None`: to the end of the buffer.
    pub size: Option<u64>,
}

impl<'a> Binding<'a> {
    pub fn whole(buffer: &'a wgpu::Buffer) -> Self {
        Binding {
            buffer,
            offset: 0,
            size: None,
        }
    }

    /// The first `bytes` of `buffer` (at least one word): a tensor binds
    /// only what it holds, so a buffer sized for the largest pass never
    /// binds more than the adapter allows for a small one.
    pub fn head(buffer: &'a wgpu::Buffer, bytes: u64) -> Self {
        let size = bytes.max(4).next_multiple_of(4).min(buffer.size());
        Binding {
            buffer,
            offset: 0,
            size: Some(size),
        }
    }

    fn bytes(&self) -> u64 {
        self.size.unwrap_or(self.buffer.size() - self.offset)
    }
}

struct Chunk {
    buffer: wgpu::Buffer,
    /// Bytes staged for the next submit.
    host: Vec<u8>,
}

#[derive(Default)]
pub(crate) struct Recorder {
    encoder: Option<wgpu::CommandEncoder>,
    /// The open compute pass of `encoder`, if any.
    pass: Option<wgpu::ComputePass<'static>>,
    /// The pipeline the open pass has set last.
    pass_kernel: Option<Kernel>,
    chunks: Vec<Chunk>,
    current: usize,
    bind_groups: HashMap<BindKey, wgpu::BindGroup>,
    /// Readback buffers not in use.
    staging: Vec<wgpu::Buffer>,
    /// Dispatches recorded since the last submit.
    since_submit: usize,
}

/// The device side shared by every op.
pub(crate) struct Device {
    pub device: wgpu::Device,
    /// Where a failed readback (a lost device) is reported in the browser.
    pub errors: DeviceErrors,
    pub queue: wgpu::Queue,
    pub pipelines: Pipelines,
    pub counters: AtomicCounters,
    pub recorder: Mutex<Recorder>,
    pub retired: Retired,
    /// Kernel timestamps, when profiling (locked after `recorder`).
    pub profiler: Option<Mutex<Profiler>>,
    /// Output features per workgroup of the matmuls (64 / LANES of
    /// matmul_rows.wgsl).
    pub matmul_features_per_group: usize,
    /// A small buffer for a writable binding a pass never writes: WebGPU
    /// refuses two writable bindings of one buffer in a bind group.
    pub unused_output: wgpu::Buffer,
    /// [`Tuning::submit_every`] (`usize::MAX` for 0).
    submit_every: usize,
}

impl Device {
    pub fn new(
        device: wgpu::Device,
        queue: wgpu::Queue,
        errors: DeviceErrors,
        tuning: Tuning,
        device_features: wgpu::Features,
    ) -> Self {
        let lanes = tuning.matmul_lanes;
        let constants = ["matmul_quant.wgsl", "matmul_float.wgsl"]
            .map(|file| (file, vec![("LANES", lanes as f64)]));
        let features = ShaderFeatures {
            subgroups: tuning.subgroups,
            f16: tuning.f16,
            dot4: tuning.dot4,
        };
        let unused_output = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("unused output"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        Device {
            submit_every: match tuning.submit_every {
                0 => usize::MAX,
                n => n as usize,
            },
            unused_output,
            errors,
            pipelines: Pipelines::new(features, constants.into_iter().collect()),
            matmul_features_per_group: 64 / lanes as usize,
            counters: AtomicCounters::default(),
            recorder: Mutex::new(Recorder::default()),
            retired: Retired::default(),
            profiler: device_features
                .contains(crate::profile::FEATURES)
                .then(|| Mutex::new(Profiler::new(&device, &queue))),
            device,
            queue,
        }
    }

    /// A storage buffer of `size` bytes (rounded up to 4), zeroed.
    pub fn storage(&self, label: &str, size: u64) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: size.max(4).next_multiple_of(4),
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// A storage buffer holding `bytes` (padded to 4).
    pub fn storage_init(&self, label: &str, bytes: &[u8]) -> wgpu::Buffer {
        self.storage_init_with_tail(label, bytes, &[])
    }

    /// A storage buffer holding `bytes`, then `tail` from the next 4-byte
    /// boundary (both padded to 4): a weight part and its lattice grid,
    /// written without first joining them in a copy.
    pub fn storage_init_with_tail(&self, label: &str, bytes: &[u8], tail: &[u8]) -> wgpu::Buffer {
        let at = bytes.len().next_multiple_of(4);
        let size = ((at + tail.len()) as u64).max(4).next_multiple_of(4);
        // Natively a buffer mapped at creation is written in place. On the
        // web its mapped range is a copy in wasm memory, which would double
        // what a streamed model holds there; `writeBuffer` reads the bytes
        // where they are.
        let on_web = cfg!(target_arch = "wasm32");
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: !on_web,
        });
        let pieces = [(0, bytes), (at, tail)];
        if on_web {
            for (offset, piece) in pieces {
                // writeBuffer takes whole 4-byte words: the last one goes
                // padded.
                let whole = piece.len() / 4 * 4;
                if whole > 0 {
                    self.queue
                        .write_buffer(&buffer, offset as u64, &piece[..whole]);
                }
                if whole < piece.len() {
                    let mut last = [0u8; 4];
                    last[..piece.len() - whole].copy_from_slice(&piece[whole..]);
                    self.queue
                        .write_buffer(&buffer, (offset + whole) as u64, &last);
                }
            }
            return buffer;
        }
        write_mapped(&buffer, &pieces, &self.errors);
        buffer
    }

    /// Records one dispatch of `kernel` with `params` (its uniform block,
    /// binding 0) and `buffers` (bindings 1..).
    pub fn dispatch<P: Uniform>(
        &self,
        kernel: Kernel,
        params: &P,
        buffers: &[Binding],
        groups: [u32; 3],
    ) {
        debug_assert!(
            P::LAYOUT.shaders.contains(&kernel.file),
            "params::{} is not the uniform block of {}",
            P::LAYOUT.name,
            kernel.file
        );
        let pipeline = self.pipelines.get(&self.device, kernel);
        let mut rec = self.recorder.lock().unwrap();
        let dead = self.retired.take();
        if !dead.is_empty() {
            rec.bind_groups.retain(|k, _| !k.uses_any(&dead));
        }
        let (pbuf, poff) = rec.stage(&self.device, &self.errors, bytemuck::bytes_of(params));
        for b in buffers {
            self.counters
                .largest_binding
                .fetch_max(b.bytes(), Ordering::Relaxed);
        }
        let key = BindKey {
            kernel,
            params: (pbuf, poff),
            buffers: buffers
                .iter()
                .map(|b| (b.buffer.clone(), b.offset, b.size))
                .collect(),
        };
        let bind_group = match rec.bind_groups.get(&key) {
            Some(bg) => bg.clone(),
            None => {
                let bg = self.create_bind_group(&pipeline, &key);
                if rec.bind_groups.len() >= MAX_BIND_GROUPS {
                    rec.bind_groups.clear();
                }
                rec.bind_groups.insert(key, bg.clone());
                bg
            }
        };
        let same_pipeline = rec.pass.is_some() && rec.pass_kernel == Some(kernel);
        let pass = rec.pass(&self.device, &self.counters);
        if !same_pipeline {
            pass.set_pipeline(&pipeline);
        }
        pass.set_bind_group(0, &bind_group, &[]);
        let dispatch = |pass: &mut wgpu::ComputePass| {
            pass.dispatch_workgroups(groups[0], groups[1], groups[2])
        };
        match &self.profiler {
            Some(p) => {
                let bytes = buffers.iter().map(Binding::bytes).sum();
                p.lock().unwrap().around(pass, kernel, bytes, dispatch)
            }
            None => dispatch(pass),
        }
        rec.pass_kernel = Some(kernel);
        AtomicCounters::add(&self.counters.dispatches);
        rec.since_submit += 1;
        if rec.since_submit >= self.submit_every {
            self.submit(&mut rec);
        }
    }

    fn create_bind_group(
        &self,
        pipeline: &wgpu::ComputePipeline,
        key: &BindKey,
    ) -> wgpu::BindGroup {
        let mut entries = Vec::with_capacity(key.buffers.len() + 1);
        entries.push(wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &key.params.0,
                offset: key.params.1,
                size: wgpu::BufferSize::new(ALIGN),
            }),
        });
        for (i, (buffer, offset, size)) in key.buffers.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: i as u32 + 1,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer,
                    offset: *offset,
                    size: size.and_then(wgpu::BufferSize::new),
                }),
            });
        }
        AtomicCounters::add(&self.counters.bind_groups);
        self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(key.kernel.entry),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        })
    }

    /// Records a copy of `bytes` into `dst` at `offset`, ordered with the
    /// dispatches around it. With nothing recorded since the last submit,
    /// the queue writes it directly (ordered the same way, and the pass of
    /// the next dispatches need not be split for a copy).
    pub fn upload(&self, dst: &wgpu::Buffer, offset: u64, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let mut rec = self.recorder.lock().unwrap();
        if rec.encoder.is_none() {
            if bytes.len() % 4 == 0 {
                self.queue.write_buffer(dst, offset, bytes);
            } else {
                let mut padded = bytes.to_vec();
                padded.resize(bytes.len().next_multiple_of(4), 0);
                self.queue.write_buffer(dst, offset, &padded);
            }
            return;
        }
        let (src, soff) = rec.stage(&self.device, &self.errors, bytes);
        let len = (bytes.len() as u64).next_multiple_of(4);
        rec.end_pass();
        rec.encoder(&self.device)
            .copy_buffer_to_buffer(&src, soff, dst, offset, len);
    }

    /// Records a copy of `bytes` (a multiple of 4) from `src` to `dst`,
    /// ordered with the dispatches around it.
    pub fn copy(
        &self,
        src: &wgpu::Buffer,
        src_offset: u64,
        dst: &wgpu::Buffer,
        dst_offset: u64,
        bytes: u64,
    ) {
        let mut rec = self.recorder.lock().unwrap();
        rec.end_pass();
        rec.encoder(&self.device)
            .copy_buffer_to_buffer(src, src_offset, dst, dst_offset, bytes);
    }

    #[cfg(test)]
    pub fn cached_bind_groups(&self) -> usize {
        self.recorder.lock().unwrap().bind_groups.len()
    }

    /// Submits everything recorded so far.
    pub fn flush(&self) {
        let mut rec = self.recorder.lock().unwrap();
        self.submit(&mut rec);
    }

    fn submit(&self, rec: &mut Recorder) {
        for c in &mut rec.chunks[..] {
            if !c.host.is_empty() {
                self.queue.write_buffer(&c.buffer, 0, &c.host);
                c.host.clear();
            }
        }
        rec.current = 0;
        rec.since_submit = 0;
        rec.end_pass();
        if let Some(mut enc) = rec.encoder.take() {
            if let Some(p) = &self.profiler {
                p.lock().unwrap().resolve(&mut enc);
            }
            self.queue.submit([enc.finish()]);
            AtomicCounters::add(&self.counters.submits);
            if let Some(p) = &self.profiler {
                p.lock().unwrap().collect(&self.device);
            }
        }
    }

    /// Submits the pending work plus a copy of `len` bytes of `src` from
    /// `offset`, waits for it, and returns them.
    pub async fn read_bytes(&self, src: &wgpu::Buffer, offset: u64, len: u64) -> Vec<u8> {
        let padded = len.max(4).next_multiple_of(4);
        let staging = {
            let mut rec = self.recorder.lock().unwrap();
            let staging = rec.staging_buffer(&self.device, &self.counters, padded);
            rec.end_pass();
            rec.encoder(&self.device)
                .copy_buffer_to_buffer(src, offset, &staging, 0, padded);
            self.submit(&mut rec);
            staging
        };
        let slice = staging.slice(..);
        let mapped = MapFuture::default();
        let done = mapped.clone();
        slice.map_async(wgpu::MapMode::Read, move |r| done.complete(r));
        // Natively this blocks until the map callback has run; in the
        // browser it returns at once and the callback comes from the event
        // loop, which the await below yields to.
        if let Err(e) = self.device.poll(wgpu::PollType::wait_indefinitely()) {
            self.errors.record(format!(
                "waiting for the GPU failed ({e}): the device was lost"
            ));
        }
        if let Err(e) = mapped.await {
            // Only a lost device fails a map. Nobody may die of it: the
            // error is kept for the caller, and the zeros returned mean
            // nothing.
            self.errors.record(format!(
                "reading back from the GPU failed ({e}): the device was lost"
            ));
            return vec![0; len as usize];
        }
        let bytes = slice.get_mapped_range().expect("mapped")[..len as usize].to_vec();
        staging.unmap();
        self.recorder.lock().unwrap().staging.push(staging);
        AtomicCounters::add(&self.counters.readbacks);
        bytes
    }
}

/// Copies `bytes` into `buffer`, created mapped, and unmaps it. A buffer
/// of a lost device cannot be mapped: that is kept as the device's error
/// (its contents no longer matter).
/// Writes each `(offset, bytes)` piece into a buffer mapped at creation,
/// then unmaps it.
fn write_mapped(buffer: &wgpu::Buffer, pieces: &[(usize, &[u8])], errors: &DeviceErrors) {
    match buffer.slice(..).get_mapped_range_mut() {
        Ok(mut view) => {
            for &(offset, bytes) in pieces {
                view.slice(offset..offset + bytes.len())
                    .copy_from_slice(bytes);
            }
        }
        Err(e) => {
            errors.record(format!(
                "writing to the GPU failed ({e}): the device was lost"
            ));
            return;
        }
    }
    buffer.unmap();
}

/// Resolves when `map_async`'s callback has delivered its result.
#[derive(Clone, Default)]
struct MapFuture(Arc<Mutex<MapState>>);

#[derive(Default)]
struct MapState {
    result: Option<Result<(), wgpu::BufferAsyncError>>,
    waker: Option<Waker>,
}

impl MapFuture {
    fn complete(&self, r: Result<(), wgpu::BufferAsyncError>) {
        let mut st = self.0.lock().unwrap();
        st.result = Some(r);
        if let Some(w) = st.waker.take() {
            w.wake();
        }
    }
}

impl Future for MapFuture {
    type Output = Result<(), wgpu::BufferAsyncError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut st = self.0.lock().unwrap();
        match st.result.take() {
            Some(r) => Poll::Ready(r),
            None => {
                st.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl Recorder {
    /// The open compute pass, begun if there is none.
    fn pass(
        &mut self,
        device: &wgpu::Device,
        counters: &AtomicCounters,
    ) -> &mut wgpu::ComputePass<'static> {
        if self.pass.is_none() {
            let pass = self
                .encoder(device)
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("blockdraft"),
                    timestamp_writes: None,
                })
                // Held beside its encoder, which stays locked until the
                // pass ends (`end_pass`).
                .forget_lifetime();
            self.pass = Some(pass);
            self.pass_kernel = None;
            AtomicCounters::add(&counters.passes);
        }
        self.pass.as_mut().expect("just begun")
    }

    /// Ends the open pass, so the encoder can record a copy or finish.
    fn end_pass(&mut self) {
        self.pass = None;
        self.pass_kernel = None;
    }

    /// A readback buffer of at least `size` bytes: a pooled one (no more
    /// than four times the size) or a new one.
    fn staging_buffer(
        &mut self,
        device: &wgpu::Device,
        counters: &AtomicCounters,
        size: u64,
    ) -> wgpu::Buffer {
        let most = size.max(256).saturating_mul(4);
        let fits = |b: &wgpu::Buffer| b.size() >= size && b.size() <= most;
        if let Some(i) = self.staging.iter().position(fits) {
            return self.staging.swap_remove(i);
        }
        AtomicCounters::add(&counters.staging_buffers);
        device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: size.max(256),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    fn encoder(&mut self, device: &wgpu::Device) -> &mut wgpu::CommandEncoder {
        self.encoder.get_or_insert_with(|| {
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("blockdraft"),
            })
        })
    }

    /// Reserves an aligned slot for `bytes` in the arena; returns the
    /// buffer and offset it will have on the GPU once submitted. Data too
    /// large for a chunk gets a buffer of its own.
    fn stage(
        &mut self,
        device: &wgpu::Device,
        errors: &DeviceErrors,
        bytes: &[u8],
    ) -> (wgpu::Buffer, u64) {
        let len = (bytes.len() as u64).max(ALIGN).next_multiple_of(ALIGN);
        if len > CHUNK_BYTES {
            let buffer = device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("upload"),
                size: len,
                usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::UNIFORM,
                mapped_at_creation: true,
            });
            write_mapped(&buffer, &[(0, bytes)], errors);
            return (buffer, 0);
        }
        if let Some(c) = self.chunks.get(self.current) {
            if c.host.len() as u64 + len > CHUNK_BYTES {
                self.current += 1;
            }
        }
        if self.current == self.chunks.len() {
            self.chunks.push(Chunk {
                buffer: device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("arena"),
                    size: CHUNK_BYTES,
                    usage: wgpu::BufferUsages::UNIFORM
                        | wgpu::BufferUsages::COPY_SRC
                        | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }),
                host: Vec::new(),
            });
        }
        let c = &mut self.chunks[self.current];
        let off = c.host.len() as u64;
        c.host.extend_from_slice(bytes);
        c.host.resize((off + len) as usize, 0);
        (c.buffer.clone(), off)
    }
}
