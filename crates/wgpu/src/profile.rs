//! Per-kernel GPU time, for `bench` (`BLOCKDRAFT_WGPU_PROFILE=1`, native
//! adapters with timestamp queries inside passes): a timestamp before and
//! after every dispatch, resolved and read back at each submit (which then
//! waits for the GPU: profiled runs time the kernels, not the pipeline).

use crate::shaders::Kernel;
use blockdraft_core::backend::KernelTiming;
use std::collections::HashMap;

/// Dispatches timed per submit (a query set holds at most 4096 queries);
/// later ones in the same submit are not.
const MAX_DISPATCHES: u32 = 2048;

/// The device features profiling needs.
pub const FEATURES: wgpu::Features =
    wgpu::Features::TIMESTAMP_QUERY.union(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES);

/// Whether this process asked for profiling.
pub fn requested() -> bool {
    std::env::var_os("BLOCKDRAFT_WGPU_PROFILE").is_some_and(|v| v != "0")
}

pub(crate) struct Profiler {
    queries: wgpu::QuerySet,
    resolved: wgpu::Buffer,
    readback: wgpu::Buffer,
    /// Kernel and bytes bound of each timed dispatch of the pending submit.
    pending: Vec<(Kernel, u64)>,
    totals: HashMap<Kernel, KernelTiming>,
    period_ns: f32,
}

impl Profiler {
    pub fn new(device: &wgpu::Device, queue: &wgpu::Queue) -> Profiler {
        let bytes = 2 * MAX_DISPATCHES as u64 * 8;
        let buffer = |label, usage| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes,
                usage,
                mapped_at_creation: false,
            })
        };
        Profiler {
            queries: device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("kernel timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: 2 * MAX_DISPATCHES,
            }),
            resolved: buffer(
                "timestamps",
                wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            ),
            readback: buffer(
                "timestamps readback",
                wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            ),
            pending: Vec::new(),
            totals: HashMap::new(),
            period_ns: queue.get_timestamp_period(),
        }
    }

    /// Records `dispatch` between two timestamps when there is room.
    pub fn around(
        &mut self,
        pass: &mut wgpu::ComputePass<'static>,
        kernel: Kernel,
        bytes: u64,
        dispatch: impl FnOnce(&mut wgpu::ComputePass<'static>),
    ) {
        let i = self.pending.len() as u32;
        if i == MAX_DISPATCHES {
            return dispatch(pass);
        }
        pass.write_timestamp(&self.queries, 2 * i);
        dispatch(pass);
        pass.write_timestamp(&self.queries, 2 * i + 1);
        self.pending.push((kernel, bytes));
    }

    /// Before the encoder is finished: copies the pending timestamps out.
    pub fn resolve(&self, encoder: &mut wgpu::CommandEncoder) {
        let n = 2 * self.pending.len() as u32;
        if n > 0 {
            encoder.resolve_query_set(&self.queries, 0..n, &self.resolved, 0);
            encoder.copy_buffer_to_buffer(&self.resolved, 0, &self.readback, 0, n as u64 * 8);
        }
    }

    /// After the submit: waits for it and adds its kernels' times.
    pub fn collect(&mut self, device: &wgpu::Device) {
        if self.pending.is_empty() {
            return;
        }
        let slice = self.readback.slice(..self.pending.len() as u64 * 16);
        slice.map_async(wgpu::MapMode::Read, |_| {});
        if device.poll(wgpu::PollType::wait_indefinitely()).is_err() {
            self.pending.clear();
            return;
        }
        if let Ok(view) = slice.get_mapped_range() {
            let stamps: &[u64] = bytemuck::cast_slice(&view);
            for (i, (kernel, bytes)) in self.pending.iter().enumerate() {
                let ticks = stamps[2 * i + 1].saturating_sub(stamps[2 * i]);
                let t = self.totals.entry(*kernel).or_insert_with(|| KernelTiming {
                    kernel: format!("{}:{}", kernel.file.trim_end_matches(".wgsl"), kernel.entry),
                    ..KernelTiming::default()
                });
                t.dispatches += 1;
                t.gpu_ns += (ticks as f64 * self.period_ns as f64) as u64;
                t.bytes_bound += bytes;
            }
        }
        self.readback.unmap();
        self.pending.clear();
    }

    /// The totals since the last call, longest first.
    pub fn take(&mut self) -> Vec<KernelTiming> {
        let mut all: Vec<_> = self.totals.drain().map(|(_, t)| t).collect();
        all.sort_by_key(|t| std::cmp::Reverse(t.gpu_ns));
        all
    }
}
