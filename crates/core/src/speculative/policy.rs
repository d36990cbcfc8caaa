//! How many tokens to draft each round, from measured costs and
//! acceptance, so that speculation is used only where it pays.
//!
//! Expected tokens of a k-token draft: `E(k) = 1 + Σ_{j≤k} Π_{i≤j} a_i`,
//! with `a_i` the measured rate at which slot i is accepted once slots
//! before it were. Cost: `draft(k) + verify(k+1)`. The policy picks the k
//! with the best `E(k) / cost(k)`, and plain decoding (k = 0) when no k
//! beats one token per `verify(1)`. While speculation is off it still
//! probes now and then so it can turn back on.

/// User limits on draft length.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PolicyConfig {
    pub n_max: usize,
    /// Drafts shorter than this are not verified.
    pub n_min: usize,
    /// Choose the length from measurements; otherwise always `n_max`.
    pub adaptive: bool,
}

impl PolicyConfig {
    /// Always draft `n_max` tokens (no minimum, no adaptation): tests and
    /// benchmarks that need a known draft length.
    pub fn fixed(n_max: usize) -> Self {
        PolicyConfig {
            n_max,
            n_min: 1,
            adaptive: false,
        }
    }
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            n_max: 8,
            n_min: 1,
            adaptive: true,
        }
    }
}

/// Weight of a new measurement in the moving averages.
const EMA: f64 = 0.2;
/// Per-round decay of acceptance counts, so old behaviour fades.
const DECAY: f64 = 0.98;
/// Plain rounds before the first probe while speculation is off. Each
/// probe that does not turn speculation back on doubles the wait (up to
/// `MAX_PROBE_INTERVAL`): a probe costs a draft model its catch-up on every
/// token since the last one, so rare probes keep the loss bounded.
const PROBE_INTERVAL: usize = 32;
const MAX_PROBE_INTERVAL: usize = 1024;

pub struct DraftPolicy {
    pub config: PolicyConfig,
    /// Seconds of a target pass with m rows, at index m − 1.
    verify_time: Vec<Option<f64>>,
    /// Seconds of a drafter call for a k-token draft, at index k − 1.
    draft_time: Vec<Option<f64>>,
    /// Per slot: (accepted, tried), decayed.
    slots: Vec<(f64, f64)>,
    plain_since_probe: usize,
    probe_interval: usize,
}

fn ema(slot: &mut Option<f64>, x: f64) {
    *slot = Some(slot.map_or(x, |v| v + EMA * (x - v)));
}

impl DraftPolicy {
    pub fn new(config: PolicyConfig) -> Self {
        let n = config.n_max.max(1);
        DraftPolicy {
            config,
            verify_time: vec![None; n + 1],
            draft_time: vec![None; n],
            slots: vec![(0.0, 0.0); n],
            plain_since_probe: 0,
            probe_interval: PROBE_INTERVAL,
        }
    }

    /// Records a target pass of `rows` rows.
    pub fn record_verify(&mut self, rows: usize, seconds: f64) {
        if let Some(slot) = self.verify_time.get_mut(rows.wrapping_sub(1)) {
            ema(slot, seconds);
        }
    }

    /// Records a drafter call that was asked for `requested` tokens.
    pub fn record_draft(&mut self, requested: usize, seconds: f64) {
        if let Some(slot) = self.draft_time.get_mut(requested.wrapping_sub(1)) {
            ema(slot, seconds);
        }
    }

    /// Records that `accepted` of `drafted` tokens were accepted.
    pub fn record_acceptance(&mut self, drafted: usize, accepted: usize) {
        for s in self.slots.iter_mut() {
            s.0 *= DECAY;
            s.1 *= DECAY;
        }
        for (i, s) in self.slots.iter_mut().enumerate().take(drafted) {
            if i > accepted {
                break;
            }
            s.1 += 1.0;
            if i < accepted {
                s.0 += 1.0;
            }
        }
    }

    /// Estimated acceptance rate of slot `i` (0-based), Laplace-smoothed.
    pub fn slot_rate(&self, i: usize) -> f64 {
        let (a, t) = self.slots[i];
        (a + 1.0) / (t + 2.0)
    }

    pub fn expected_tokens(&self, k: usize) -> f64 {
        let mut e = 1.0;
        let mut p = 1.0;
        for i in 0..k.min(self.slots.len()) {
            p *= self.slot_rate(i);
            e += p;
        }
        e
    }

    /// Nearest measured value of `table` around index `i`, or `None`.
    fn nearest(table: &[Option<f64>], i: usize) -> Option<(usize, f64)> {
        (0..table.len())
            .filter_map(|j| table[j].map(|v| (j, v)))
            .min_by_key(|(j, _)| j.abs_diff(i))
    }

    fn verify_estimate(&self, rows: usize, t1: f64) -> f64 {
        match Self::nearest(&self.verify_time, rows - 1) {
            Some((j, v)) if j + 1 == rows => v,
            // Unmeasured: scale the nearest measurement, never below T(1).
            Some((j, v)) => (v * rows as f64 / (j + 1) as f64).max(t1),
            None => t1,
        }
    }

    fn draft_estimate(&self, k: usize) -> f64 {
        Self::nearest(&self.draft_time, k - 1).map_or(0.0, |(_, v)| v)
    }

    /// The draft length for the next round; 0 means a plain decoding step.
    pub fn next_len(&mut self, max_draft: usize) -> usize {
        let n_max = self.config.n_max.min(max_draft);
        if n_max == 0 || n_max < self.config.n_min {
            return 0;
        }
        if !self.config.adaptive {
            return n_max;
        }
        let Some(t1) = self.verify_time[0] else {
            // Try speculation first; after one round, take one plain step
            // to learn the cost it has to beat.
            let speculated = self.slots[0].1 > 0.0;
            return if speculated { 0 } else { n_max };
        };
        let mut best = (0, 1.0 / t1);
        for k in self.config.n_min.max(1)..=n_max {
            let rate = self.expected_tokens(k)
                / (self.draft_estimate(k) + self.verify_estimate(k + 1, t1));
            if rate > best.1 {
                best = (k, rate);
            }
        }
        if best.0 > 0 {
            self.plain_since_probe = 0;
            self.probe_interval = PROBE_INTERVAL;
            return best.0;
        }
        self.plain_since_probe += 1;
        if self.plain_since_probe >= self.probe_interval {
            self.plain_since_probe = 0;
            self.probe_interval = (self.probe_interval * 2).min(MAX_PROBE_INTERVAL);
            return self.config.n_min.max(1);
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speculates_when_cheap_and_accepted_and_stops_otherwise() {
        let mut p = DraftPolicy::new(PolicyConfig {
            n_max: 8,
            n_min: 1,
            adaptive: true,
        });
        assert_eq!(p.next_len(15), 8, "optimistic before any measurement");
        p.record_acceptance(8, 8);
        assert_eq!(p.next_len(15), 0, "one plain step to measure T(1)");
        for rows in 1..=9 {
            p.record_verify(rows, 0.010 + 0.001 * rows as f64);
        }
        p.record_draft(8, 0.002);
        for _ in 0..50 {
            p.record_acceptance(8, 8);
        }
        assert_eq!(p.next_len(15), 8);
        // Nothing ever accepted: plain decoding, with rare probes.
        for _ in 0..200 {
            p.record_acceptance(8, 0);
        }
        let lens: Vec<usize> = (0..PROBE_INTERVAL).map(|_| p.next_len(15)).collect();
        assert_eq!(lens.iter().filter(|&&k| k > 0).count(), 1, "{lens:?}");
        // A probe that changes nothing doubles the wait for the next one.
        let probes: Vec<usize> = (0..6 * PROBE_INTERVAL)
            .filter(|_| p.next_len(15) > 0)
            .collect();
        assert_eq!(probes.len(), 2, "probes after 64 and 128 more steps");
        // An expensive drafter is not worth it even at high acceptance.
        let mut p = DraftPolicy::new(PolicyConfig {
            n_max: 4,
            n_min: 1,
            adaptive: true,
        });
        p.record_verify(1, 0.010);
        for k in 1..=4 {
            p.record_draft(k, 0.010 * k as f64);
            p.record_verify(k + 1, 0.015);
        }
        for _ in 0..50 {
            p.record_acceptance(4, 2);
        }
        assert_eq!(p.next_len(8), 0);
    }

    #[test]
    fn the_block_size_clamps_the_length() {
        let mut p = DraftPolicy::new(PolicyConfig {
            n_max: 16,
            n_min: 1,
            adaptive: false,
        });
        assert_eq!(p.next_len(7), 7);
        let mut p = DraftPolicy::new(PolicyConfig {
            n_max: 16,
            n_min: 8,
            adaptive: false,
        });
        assert_eq!(p.next_len(7), 0, "n_min above the clamp disables drafting");
    }
}
