//! How many tokens to draft each round, from measured costs and
//! acceptance, so that speculation is used only where it pays.
//!
//! Expected tokens of a k-token draft: `E(k) = 1 + Σ_{j≤k} Π_{i≤j} a_i`,
//! with `a_i` the measured rate at which slot i is accepted once slots
//! before it were. Cost: `draft(k) + verify(k+1)`. The policy picks the k
//! with the best `E(k) / cost(k)`, and plain decoding (k = 0) when no k
//! beats one token per `verify(1)`. While speculation is off it still
//! probes now and then so it can turn back on.
//!
//! Unmeasured quantities are taken optimistically, so that a few unlucky
//! early rounds do not switch a good drafter off for long: acceptance rates
//! are taken half a standard deviation above their mean (thin evidence
//! favours trying; the bonus shrinks as rounds accumulate), and an
//! unmeasured length is estimated from the nearest measured one without
//! scaling it up. Draft costs exclude a drafter's catch-up on tokens it
//! missed while speculation was off ([`super::Drafter::catch_up`]): that
//! is paid once per gap, not per round.

use super::RoundStats;

/// User limits on draft length.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PolicyConfig {
    pub n_max: usize,
    /// Drafts shorter than this are not verified.
    pub n_min: usize,
    /// Choose the length from measurements; otherwise always `n_max`.
    pub adaptive: bool,
}

/// Longest draft any front end accepts: block drafters draft at most
/// their block (16 for the DFlash family), and verifying more rows than
/// this costs more than the tokens it could win.
pub const MAX_DRAFT: usize = 64;

impl PolicyConfig {
    /// Accepted lengths of `n_max` and `n_min` (shared by the CLI and the
    /// npm API).
    pub const LENGTHS: crate::sampling::Bounds<usize> = crate::sampling::Bounds {
        lo: 1,
        hi: MAX_DRAFT,
    };

    /// Checks the lengths: each within [`Self::LENGTHS`], and `n_min` at
    /// most `n_max` (otherwise no draft would ever be verified).
    pub fn check(&self) -> Result<(), String> {
        Self::LENGTHS
            .check(self.n_max)
            .map_err(|e| format!("the longest draft {e}"))?;
        Self::LENGTHS
            .check(self.n_min)
            .map_err(|e| format!("the shortest draft {e}"))?;
        if self.n_min > self.n_max {
            return Err(format!(
                "the shortest draft ({}) is longer than the longest ({}), which turns speculation off",
                self.n_min, self.n_max
            ));
        }
        Ok(())
    }

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
/// A drafter whose catch-up costs more than this fraction of a plain step
/// per missed token is not probed: the catch-up alone would cost more than
/// that fraction of all decoding time, whatever the probe interval.
const PROBE_BUDGET: f64 = 0.02;
/// Standard deviations above the mean at which acceptance is estimated.
const OPTIMISM: f64 = 0.5;
/// Length of the first draft, before anything is measured: long enough to
/// show a good drafter's worth, short enough that a bad one costs little.
const FIRST_LEN: usize = 4;

pub struct DraftPolicy {
    pub config: PolicyConfig,
    /// Seconds of a target pass with m rows, at index m − 1.
    verify_time: Vec<Option<f64>>,
    /// Seconds of a drafter call for a k-token draft, at index k − 1.
    draft_time: Vec<Option<f64>>,
    /// Seconds per token of the drafter's catch-up.
    catch_up_time: Option<f64>,
    /// Per slot: (accepted, tried), decayed.
    slots: Vec<(f64, f64)>,
    plain_since_probe: usize,
    probe_interval: usize,
    /// Whether a pass was recorded yet: the first one runs on cold caches
    /// and would leave a cost that no later pass of its length corrects.
    warm: bool,
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
            catch_up_time: None,
            slots: vec![(0.0, 0.0); n],
            plain_since_probe: 0,
            probe_interval: PROBE_INTERVAL,
            warm: false,
        }
    }

    /// Records a pass that asked the drafter for `requested` tokens (0 for
    /// a plain step) and went as `round` says.
    pub fn record(&mut self, requested: usize, round: &RoundStats) {
        if std::mem::replace(&mut self.warm, true) {
            self.record_verify(round.drafted + 1, round.verify_seconds);
            if requested > 0 {
                self.record_draft(requested, round.draft_seconds);
            }
        }
        if requested > 0 {
            self.record_acceptance(round.drafted, round.accepted);
        }
        if round.caught_up > 0 {
            ema(
                &mut self.catch_up_time,
                round.catch_up_seconds / round.caught_up as f64,
            );
        }
    }

    fn record_verify(&mut self, rows: usize, seconds: f64) {
        if let Some(slot) = self.verify_time.get_mut(rows.wrapping_sub(1)) {
            ema(slot, seconds);
        }
    }

    fn record_draft(&mut self, requested: usize, seconds: f64) {
        if let Some(slot) = self.draft_time.get_mut(requested.wrapping_sub(1)) {
            ema(slot, seconds);
        }
    }

    fn record_acceptance(&mut self, drafted: usize, accepted: usize) {
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

    /// Estimated acceptance rate of slot `i` (0-based): the Laplace-smoothed
    /// mean plus `OPTIMISM` standard deviations of its Beta posterior.
    fn optimistic_slot_rate(&self, i: usize) -> f64 {
        let (a, t) = self.slots[i];
        let p = (a + 1.0) / (t + 2.0);
        (p + OPTIMISM * (p * (1.0 - p) / (t + 3.0)).sqrt()).min(1.0)
    }

    /// For every index `i` of `table`, the nearest measured value and its
    /// index (the lower one on ties), or `None`: two passes, so that a
    /// round's cost stays linear in the longest draft.
    fn nearest_each(table: &[Option<f64>]) -> Vec<Option<(usize, f64)>> {
        let mut left = Vec::with_capacity(table.len());
        let mut last = None;
        for (j, v) in table.iter().enumerate() {
            if let Some(v) = v {
                last = Some((j, *v));
            }
            left.push(last);
        }
        let mut next = None;
        for i in (0..table.len()).rev() {
            if let Some(v) = table[i] {
                next = Some((i, v));
            }
            left[i] = match (left[i], next) {
                (Some(l), Some(r)) if r.0 - i < i - l.0 => Some(r),
                (None, r) => r,
                (l, _) => l,
            };
        }
        left
    }

    /// Unmeasured costs are estimated optimistically from the nearest
    /// measurement (`nearest`, from [`Self::nearest_each`]; scaled down for
    /// fewer rows or tokens, not scaled up for more), so that a length is
    /// tried once rather than ruled out on a guess; its real cost then
    /// replaces the guess.
    fn verify_estimate(nearest: Option<(usize, f64)>, rows: usize, t1: f64) -> f64 {
        match nearest {
            Some((j, v)) if rows < j + 1 => (v * rows as f64 / (j + 1) as f64).max(t1),
            Some((_, v)) => v,
            None => t1,
        }
    }

    fn draft_estimate(nearest: Option<(usize, f64)>, k: usize) -> f64 {
        match nearest {
            Some((j, v)) if k < j + 1 => v * k as f64 / (j + 1) as f64,
            Some((_, v)) => v,
            None => 0.0,
        }
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
        let first_len = FIRST_LEN.clamp(self.config.n_min.max(1), n_max);
        // Try speculation first (a cold round, not timed); then one plain
        // step to learn the cost to beat; then a timed round.
        let Some(t1) = self.verify_time[0] else {
            let speculated = self.slots[0].1 > 0.0;
            return if speculated { 0 } else { first_len };
        };
        if self.verify_time[1..].iter().all(Option::is_none) {
            return first_len;
        }
        // One pass over the lengths: E(k) grows by one product per k, and
        // the nearest measurements are looked up, not searched for.
        let verify_near = Self::nearest_each(&self.verify_time);
        let draft_near = Self::nearest_each(&self.draft_time);
        let mut best = (0, 1.0 / t1);
        let (mut expected, mut p) = (1.0, 1.0);
        for k in 1..=n_max {
            if k <= self.slots.len() {
                p *= self.optimistic_slot_rate(k - 1);
                expected += p;
            }
            if k < self.config.n_min {
                continue;
            }
            let cost = Self::draft_estimate(draft_near[k - 1], k)
                + Self::verify_estimate(verify_near[k], k + 1, t1);
            let rate = expected / cost;
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
        let affordable = self.catch_up_time.is_none_or(|c| c <= PROBE_BUDGET * t1);
        if affordable && self.plain_since_probe >= self.probe_interval {
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
    use crate::sampling::Rng;

    /// A drafter and target for [`simulate`], costs in plain-step units.
    struct Sim {
        /// Chance that each drafted token is right, given the ones before.
        accept: f64,
        /// Drafting cost of a k-token draft.
        draft: fn(usize) -> f64,
        /// Extra drafting cost per committed token the drafter missed while
        /// speculation was off (a draft model's catch-up).
        catch_up: f64,
    }

    /// A target pass over `m` rows, shaped like Qwen2.5-1.5B's measured
    /// verify curve on this machine (T(8) ≈ 2.4 T(1)).
    fn verify(m: usize) -> f64 {
        if m <= 8 {
            1.0 + 0.2 * (m - 1) as f64
        } else {
            2.4 + 0.4 * (m - 8) as f64
        }
    }

    /// Drives the policy the way the engine does for `tokens` tokens and
    /// returns tokens per plain-step time.
    fn simulate(sim: &Sim, config: PolicyConfig, tokens: usize, seed: u64) -> f64 {
        let mut p = DraftPolicy::new(config);
        let mut rng = Rng::new(seed);
        let (mut produced, mut time, mut missed) = (0, 0.0, 0);
        while produced < tokens {
            let k = p.next_len(15);
            let round = if k == 0 {
                missed += 1;
                RoundStats {
                    verify_seconds: verify(1),
                    ..Default::default()
                }
            } else {
                let caught_up = std::mem::take(&mut missed);
                RoundStats {
                    drafted: k,
                    accepted: (0..k).take_while(|_| rng.next_f64() < sim.accept).count(),
                    caught_up,
                    catch_up_seconds: sim.catch_up * caught_up as f64,
                    draft_seconds: (sim.draft)(k),
                    verify_seconds: verify(k + 1),
                }
            };
            p.record(k, &round);
            time += round.catch_up_seconds + round.draft_seconds + round.verify_seconds;
            produced += round.accepted + 1;
        }
        produced as f64 / time
    }

    /// Tokens per plain-step time of always drafting `k`, in expectation.
    fn fixed_rate(sim: &Sim, k: usize) -> f64 {
        let expected: f64 = (0..=k).map(|j| sim.accept.powi(j as i32)).sum();
        expected / ((sim.draft)(k) + verify(k + 1))
    }

    fn adaptive(n_max: usize) -> PolicyConfig {
        PolicyConfig {
            n_max,
            n_min: 1,
            adaptive: true,
        }
    }

    /// The policy's speed over several seeds, the worst and the median.
    fn speeds(sim: &Sim, config: PolicyConfig, tokens: usize) -> (f64, f64) {
        let mut v: Vec<f64> = (0..31).map(|s| simulate(sim, config, tokens, s)).collect();
        v.sort_by(f64::total_cmp);
        eprintln!(
            "DBG accept {} tokens {tokens}: {v:?} best {}",
            sim.accept,
            (1..=8).map(|k| fixed_rate(sim, k)).fold(0.0, f64::max)
        );
        (v[0], v[15])
    }

    #[test]
    fn a_good_block_drafter_gets_close_to_the_best_fixed_length() {
        // Forced tau 4 at k = 4 on a one-layer DFlash drafter.
        let sim = Sim {
            accept: 0.86,
            draft: |_| 0.3,
            catch_up: 0.0,
        };
        let best = (1..=8).map(|k| fixed_rate(&sim, k)).fold(0.0, f64::max);
        for tokens in [48, 256] {
            let (worst, median) = speeds(&sim, adaptive(8), tokens);
            assert!(median > 0.85 * best, "{tokens}: {median} vs {best}");
            assert!(worst > 1.2, "{tokens}: worst {worst}");
        }
    }

    #[test]
    fn a_draft_model_that_pays_is_kept_on_despite_its_catch_up() {
        // Qwen 0.5B for 1.5B: a draft step costs 0.43 plain steps, and
        // catching up costs 0.05 per missed token (a prefill).
        let sim = Sim {
            accept: 0.86,
            draft: |k| 0.43 * k as f64,
            catch_up: 0.05,
        };
        let best = (1..=8).map(|k| fixed_rate(&sim, k)).fold(0.0, f64::max);
        assert!(best > 1.1, "the setting must favour speculation: {best}");
        let (worst, median) = speeds(&sim, adaptive(8), 256);
        assert!(median > 0.9 * best, "{median} vs {best}");
        assert!(worst > 0.95, "worst {worst}");
    }

    #[test]
    fn a_drafter_that_does_not_pay_costs_little() {
        let useless = Sim {
            accept: 0.05,
            draft: |_| 0.1,
            catch_up: 0.0,
        };
        let too_dear = Sim {
            accept: 0.5,
            draft: |k| 0.6 * k as f64,
            catch_up: 0.05,
        };
        for sim in [useless, too_dear] {
            assert!((1..=8).all(|k| fixed_rate(&sim, k) < 1.0));
            // Finding out costs a few passes: up to a tenth of a short
            // generation, under 5 % from a few hundred tokens on.
            for (tokens, floor) in [(64, 0.88), (256, 0.95), (1024, 0.98)] {
                let (worst, _) = speeds(&sim, adaptive(8), tokens);
                assert!(worst > floor, "{tokens} tokens: {worst}");
            }
        }
    }

    #[test]
    fn rare_probes_while_off_and_backing_off() {
        let mut p = DraftPolicy::new(adaptive(8));
        assert_eq!(
            p.next_len(15),
            FIRST_LEN,
            "optimistic before any measurement"
        );
        p.record_acceptance(8, 8);
        assert_eq!(p.next_len(15), 0, "one plain step to measure T(1)");
        for rows in 1..=9 {
            p.record_verify(rows, 0.010 + 0.002 * rows as f64);
        }
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
    }

    #[test]
    fn the_first_pass_is_not_timed() {
        let mut p = DraftPolicy::new(adaptive(4));
        let round = |drafted, seconds| RoundStats {
            drafted,
            accepted: drafted,
            draft_seconds: seconds,
            verify_seconds: seconds,
            ..Default::default()
        };
        p.record(4, &round(4, 9.0));
        assert!(p
            .verify_time
            .iter()
            .chain(&p.draft_time)
            .all(Option::is_none));
        assert!(p.slots[3].1 > 0.0, "its acceptance counts");
        p.record(4, &round(4, 0.01));
        assert_eq!(
            (p.verify_time[4], p.draft_time[3]),
            (Some(0.01), Some(0.01))
        );
    }

    #[test]
    fn nearest_measurements_prefer_the_lower_index_on_ties() {
        let table = [None, Some(1.0), None, None, Some(4.0), None];
        let brute = |i: usize| {
            (0..table.len())
                .filter_map(|j| table[j].map(|v| (j, v)))
                .min_by_key(|(j, _)| j.abs_diff(i))
        };
        let fast = DraftPolicy::nearest_each(&table);
        for (i, got) in fast.iter().enumerate() {
            assert_eq!(*got, brute(i), "index {i}");
        }
        assert_eq!(fast[2], Some((1, 1.0)));
        assert_eq!(DraftPolicy::nearest_each(&[None, None]), [None, None]);
    }

    #[test]
    fn a_round_costs_linear_time_in_the_longest_draft() {
        // 200 000 lengths: a quadratic search would take minutes per round.
        let n = 200_000;
        let mut p = DraftPolicy::new(adaptive(n));
        let round = |drafted| RoundStats {
            drafted,
            accepted: drafted,
            draft_seconds: 0.001,
            verify_seconds: 0.01,
            ..Default::default()
        };
        let started = std::time::Instant::now();
        for _ in 0..20 {
            let k = p.next_len(n);
            p.record(k, &round(k.min(8)));
        }
        assert!(started.elapsed().as_secs_f64() < 10.0);
    }

    #[test]
    fn lengths_are_checked() {
        assert!(PolicyConfig::default().check().is_ok());
        for (n_max, n_min) in [(0, 1), (65, 1), (4, 0), (4, 5), (30_000, 1)] {
            let c = PolicyConfig {
                n_max,
                n_min,
                adaptive: true,
            };
            assert!(c.check().is_err(), "{c:?}");
        }
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
