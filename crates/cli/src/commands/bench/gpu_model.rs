//! What a decode step's command stream would cost on a real GPU, from the
//! counts a device backend records (issue 24: no GPU is on the machines
//! that develop and test blockdraft, so a change to the command stream is
//! judged by this model, and measured by `crates/wgpu/gpu-check.sh` when a
//! GPU is lent). Each token costs its weight bytes at the GPU's bandwidth
//! plus a floor per dispatch (the API's cost of recording and launching
//! one, which bounds small models: `../shared/notes/webgpu-perf.md`) and
//! the latency of each readback.

use blockdraft_core::backend::CommandCounts;

/// A GPU and API class: public figures, not measurements of blockdraft.
#[derive(Clone, Copy, Debug, PartialEq, clap::ValueEnum)]
pub enum GpuProfile {
    /// An RTX 4090-class desktop GPU on Vulkan natively: 1008 GB/s, 25 µs
    /// of API cost per dispatch (24–36 µs measured on Vulkan), 0.1 ms per
    /// readback.
    DesktopVulkan,
    /// The same GPU in Chrome: 35 µs per dispatch, 0.47 ms per submit +
    /// `mapAsync` readback.
    DesktopChrome,
    /// An Apple M-series laptop (base chip) on Metal: 100 GB/s, 45 µs per
    /// dispatch (32–71 µs measured on Metal), 0.1 ms per readback.
    LaptopMetal,
}

impl GpuProfile {
    /// (bandwidth in bytes/s, seconds per dispatch, seconds per readback).
    fn costs(self) -> (f64, f64, f64) {
        match self {
            GpuProfile::DesktopVulkan => (1008e9, 25e-6, 0.1e-3),
            GpuProfile::DesktopChrome => (1008e9, 35e-6, 0.47e-3),
            GpuProfile::LaptopMetal => (100e9, 45e-6, 0.1e-3),
        }
    }

    /// One line on what the profile assumes.
    pub fn describe(self) -> String {
        let (bw, dispatch, readback) = self.costs();
        format!(
            "{self:?}: {:.0} GB/s, {:.0} us per dispatch, {:.2} ms per readback",
            bw / 1e9,
            dispatch * 1e6,
            readback * 1e3
        )
    }
}

/// A token's modelled time and where it goes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prediction {
    pub tokens_per_second: f64,
    /// Fraction of the token spent on dispatch floors and readbacks.
    pub overhead_fraction: f64,
}

/// The modelled decode speed of `per_token` commands (each count divided
/// by the tokens decoded) reading `weight_bytes` per token on `profile`.
pub fn predict(
    profile: GpuProfile,
    per_token: &CommandCounts,
    tokens: u64,
    weight_bytes: u64,
) -> Prediction {
    let (bandwidth, dispatch, readback) = profile.costs();
    let n = tokens.max(1) as f64;
    let memory = weight_bytes as f64 / bandwidth;
    let overhead =
        per_token.dispatches as f64 / n * dispatch + per_token.readbacks as f64 / n * readback;
    let seconds = memory + overhead;
    Prediction {
        tokens_per_second: 1.0 / seconds,
        overhead_fraction: overhead / seconds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(dispatches: u64, readbacks: u64) -> CommandCounts {
        CommandCounts {
            dispatches,
            readbacks,
            ..CommandCounts::default()
        }
    }

    /// Qwen2.5-0.5B Q4_K_M: ~392 MB of weights a token. 391 dispatches at
    /// 25 µs are 9.8 ms beside 0.39 ms of bandwidth; 223 are 5.6 ms.
    #[test]
    fn fewer_dispatches_predict_proportionally_faster_small_models() {
        let bytes = 391_600_000;
        let before = predict(GpuProfile::DesktopVulkan, &counts(391 * 16, 16), 16, bytes);
        let after = predict(GpuProfile::DesktopVulkan, &counts(223 * 16, 16), 16, bytes);
        let t = |d: f64| 1.0 / (bytes as f64 / 1008e9 + d * 25e-6 + 0.1e-3);
        assert!((before.tokens_per_second - t(391.0)).abs() < 1e-6 * t(391.0));
        assert!((after.tokens_per_second - t(223.0)).abs() < 1e-6 * t(223.0));
        assert!(after.tokens_per_second / before.tokens_per_second > 1.6);
        assert!(before.overhead_fraction > 0.9, "{before:?}");
    }

    /// An 8 GB model on 100 GB/s: bandwidth takes 80 ms of a token, its 300
    /// dispatches 13.5 ms.
    #[test]
    fn bandwidth_bounds_large_models() {
        let p = predict(GpuProfile::LaptopMetal, &counts(300, 1), 1, 8_000_000_000);
        let want = 1.0 / (0.08 + 300.0 * 45e-6 + 0.1e-3);
        assert!((p.tokens_per_second - want).abs() < 1e-9 * want, "{p:?}");
        assert!(p.overhead_fraction < 0.15, "{p:?}");
    }
}
