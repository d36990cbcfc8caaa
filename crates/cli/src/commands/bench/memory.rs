//! Memory measurements for `bench`: the weight bytes a decoded token reads,
//! how fast this machine reads memory right now, and peak RSS.

use blockdraft_cpu::WeightBuffer;
use std::time::Instant;

/// Bytes of weights one decoded token reads: every matrix except the
/// embedding table (a one-row gather) — unless the head is tied to it.
pub fn weight_bytes_per_token(file: &blockdraft_gguf::GgufFile) -> u64 {
    let tied = file.tensor("output.weight").is_none();
    file.tensors()
        .iter()
        .filter(|t| t.dims.len() == 2 && (tied || t.name != "token_embd.weight"))
        .map(|t| t.n_bytes)
        .sum()
}

/// Bytes the read-bandwidth probe streams per pass: 8x a large L3, so that
/// every pass comes from DRAM.
const PROBE_BYTES: usize = 256 << 20;

/// GB/s of reading memory with `threads` threads (the best of three passes
/// over a fresh buffer, each thread summing its share): the bandwidth
/// limit that decoding, which streams every weight once per token, is
/// measured against. Timed beside each decode repetition, so that both see
/// the same machine (shared hosts vary by tens of percent from minute to
/// minute).
pub fn read_bandwidth(threads: usize) -> f64 {
    // The memory the CPU backend streams weights from (huge pages where
    // the OS gives them), so that the limit is the one decoding faces.
    let mut buf = WeightBuffer::zeroed(PROBE_BYTES);
    // Written, so that every page is really there.
    buf.as_mut_slice().fill(1);
    let share = (buf.len() / 8).div_ceil(threads.max(1)) * 8;
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        let total: u64 = std::thread::scope(|s| {
            let sums: Vec<_> = buf
                .as_slice()
                .chunks(share)
                .map(|c| s.spawn(move || sum_words(c)))
                .collect();
            sums.into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0, u64::wrapping_add)
        });
        best = best.min(t.elapsed().as_secs_f64());
        std::hint::black_box(total);
    }
    PROBE_BYTES as f64 / best / 1e9
}

/// A wrapping sum over `bytes`, as fast as the loads go: the aligned middle
/// is summed as `u64` words, which the compiler turns into vector adds.
fn sum_words(bytes: &[u8]) -> u64 {
    // SAFETY: every bit pattern is a valid u64.
    let (head, middle, tail) = unsafe { bytes.align_to::<u64>() };
    let edges = head.iter().chain(tail).map(|&b| u64::from(b));
    middle
        .iter()
        .copied()
        .chain(edges)
        .fold(0, u64::wrapping_add)
}

/// Peak resident set size of the benchmark itself, leaving out the
/// bandwidth probe's buffer: [`PeakRss::around`] records the peak before a
/// probe and resets the kernel's high-water mark after it.
#[derive(Default)]
pub struct PeakRss {
    before_probes: Option<u64>,
}

impl PeakRss {
    /// Runs `probe` without counting its memory in the peak.
    pub fn around<T>(&mut self, probe: impl FnOnce() -> T) -> T {
        self.before_probes = self.before_probes.max(vm_hwm());
        let result = probe();
        // Linux: writing 5 to clear_refs resets VmHWM to the current RSS
        // (the probe's buffer is freed by now).
        let _ = std::fs::write("/proc/self/clear_refs", "5");
        result
    }

    /// Peak RSS in bytes (Linux), if known.
    pub fn get(&self) -> Option<u64> {
        self.before_probes.max(vm_hwm())
    }
}

fn vm_hwm() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_memory_is_left_out_of_the_peak() {
        let mut peak = PeakRss::default();
        let before = peak.get();
        let gbps = peak.around(|| read_bandwidth(2));
        assert!(gbps.is_finite() && gbps > 0.0, "bandwidth {gbps}");
        if let (Some(before), Some(after)) = (before, peak.get()) {
            // The probe touched PROBE_BYTES; the peak must not include them.
            assert!(
                after < before + PROBE_BYTES as u64 / 2,
                "peak went from {before} to {after}"
            );
        }
    }
}
