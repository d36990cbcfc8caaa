//! `/metrics`: counters the worker and handlers update, in Prometheus'
//! text format.

use blockdraft_core::speculative::SpecStats;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds (seconds) of the latency histograms' buckets.
const BUCKETS: [f64; 12] = [
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        for (c, &b) in self.counts.iter_mut().zip(&BUCKETS) {
            if seconds <= b {
                *c += 1;
            }
        }
        self.sum += seconds;
        self.count += 1;
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (c, b) in self.counts.iter().zip(BUCKETS) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}\n{name}_count {}", self.sum, self.count);
    }
}

#[derive(Default)]
pub struct Metrics {
    requests: AtomicU64,
    rejected: AtomicU64,
    queue_full: AtomicU64,
    finished: AtomicU64,
    failed: AtomicU64,
    cancelled: AtomicU64,
    queued: AtomicU64,
    running: AtomicU64,
    prompt_tokens: AtomicU64,
    prompt_tokens_reused: AtomicU64,
    completion_tokens: AtomicU64,
    drafted: AtomicU64,
    accepted: AtomicU64,
    rounds: AtomicU64,
    latency: Mutex<Histogram>,
    first_token: Mutex<Histogram>,
}

impl Metrics {
    /// A request came in (before it is checked).
    pub fn request(&self) {
        self.requests.fetch_add(1, Relaxed);
    }

    /// A request was refused with a 4xx error.
    pub fn rejected(&self) {
        self.rejected.fetch_add(1, Relaxed);
    }

    pub fn queue_full(&self) {
        self.queue_full.fetch_add(1, Relaxed);
    }

    pub fn enqueued(&self) {
        self.queued.fetch_add(1, Relaxed);
    }

    pub fn dequeued(&self) {
        self.queued.fetch_sub(1, Relaxed);
    }

    pub fn set_running(&self, n: usize) {
        self.running.store(n as u64, Relaxed);
    }

    pub fn failed(&self) {
        self.failed.fetch_add(1, Relaxed);
    }

    pub fn cancelled(&self) {
        self.cancelled.fetch_add(1, Relaxed);
    }

    pub fn first_token(&self, since_queued: Duration) {
        let mut h = self.first_token.lock().unwrap_or_else(|e| e.into_inner());
        h.observe(since_queued.as_secs_f64());
    }

    /// A finished request: `reused` of its prompt tokens came from a cached
    /// memory (not run again), the rest are in `st`.
    pub fn finished(
        &self,
        st: &SpecStats,
        reused: usize,
        completion_tokens: usize,
        since_queued: Duration,
    ) {
        self.finished.fetch_add(1, Relaxed);
        self.prompt_tokens
            .fetch_add((st.prompt_tokens + reused) as u64, Relaxed);
        self.prompt_tokens_reused.fetch_add(reused as u64, Relaxed);
        self.completion_tokens
            .fetch_add(completion_tokens as u64, Relaxed);
        self.drafted.fetch_add(st.drafted as u64, Relaxed);
        self.accepted.fetch_add(st.accepted as u64, Relaxed);
        self.rounds.fetch_add(st.rounds as u64, Relaxed);
        let mut h = self.latency.lock().unwrap_or_else(|e| e.into_inner());
        h.observe(since_queued.as_secs_f64());
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let counters = [
            (
                "blockdraft_requests_total",
                "Requests received",
                &self.requests,
            ),
            (
                "blockdraft_requests_rejected_total",
                "Requests refused as invalid (4xx)",
                &self.rejected,
            ),
            (
                "blockdraft_requests_queue_full_total",
                "Requests refused with 503 (queue full)",
                &self.queue_full,
            ),
            (
                "blockdraft_requests_finished_total",
                "Requests that finished",
                &self.finished,
            ),
            (
                "blockdraft_requests_failed_total",
                "Requests that failed while generating",
                &self.failed,
            ),
            (
                "blockdraft_requests_cancelled_total",
                "Requests whose client went away",
                &self.cancelled,
            ),
            (
                "blockdraft_prompt_tokens_total",
                "Prompt tokens of finished requests",
                &self.prompt_tokens,
            ),
            (
                "blockdraft_prompt_tokens_reused_total",
                "Prompt tokens a cached memory already held (not run again)",
                &self.prompt_tokens_reused,
            ),
            (
                "blockdraft_completion_tokens_total",
                "Generated tokens of finished requests",
                &self.completion_tokens,
            ),
            (
                "blockdraft_draft_tokens_total",
                "Draft tokens verified",
                &self.drafted,
            ),
            (
                "blockdraft_draft_tokens_accepted_total",
                "Draft tokens accepted",
                &self.accepted,
            ),
            (
                "blockdraft_speculative_rounds_total",
                "Speculative rounds",
                &self.rounds,
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                v.load(Relaxed)
            );
        }
        let rounds = self.rounds.load(Relaxed);
        let tau = if rounds > 0 {
            (self.accepted.load(Relaxed) + rounds) as f64 / rounds as f64
        } else {
            0.0
        };
        let gauges = [
            (
                "blockdraft_queue_depth",
                "Requests waiting for a sequence",
                self.queued.load(Relaxed) as f64,
            ),
            (
                "blockdraft_sequences_running",
                "Requests in the engine",
                self.running.load(Relaxed) as f64,
            ),
            (
                "blockdraft_tau",
                "Tokens per speculative round (accepted + 1), all requests",
                tau,
            ),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        let lock = |m: &Mutex<Histogram>| {
            let h = m.lock().unwrap_or_else(|e| e.into_inner());
            (h.counts, h.sum, h.count)
        };
        for (m, name, help) in [
            (
                &self.latency,
                "blockdraft_request_seconds",
                "Time from queueing to the last token",
            ),
            (
                &self.first_token,
                "blockdraft_time_to_first_token_seconds",
                "Time from queueing to the first token",
            ),
        ] {
            let (counts, sum, count) = lock(m);
            Histogram { counts, sum, count }.write(&mut out, name, help);
        }
        out
    }
}
