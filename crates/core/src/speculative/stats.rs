//! What speculative rounds report: one round's figures, and a sequence's
//! totals.

/// One round, as reported to the caller.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RoundStats {
    pub drafted: usize,
    pub accepted: usize,
    /// Tokens the drafter caught up on before drafting, and the time it
    /// took ([`super::Drafter::catch_up`]).
    pub caught_up: usize,
    pub catch_up_seconds: f64,
    pub draft_seconds: f64,
    pub verify_seconds: f64,
    /// Whether the policy drafted to explore ([`DraftPolicy::probing`]).
    pub probe: bool,
}

/// Totals of a speculative generation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpecStats {
    pub drafter: String,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    /// Verify passes that carried a draft.
    pub rounds: usize,
    /// Target passes without a draft (policy off, or nothing proposed).
    pub plain_steps: usize,
    pub drafted: usize,
    pub accepted: usize,
    /// Per draft slot: how often it was verified and accepted.
    pub slot_tried: Vec<usize>,
    pub slot_accepted: Vec<usize>,
    /// Drafting, catch-up excluded.
    pub draft_seconds: f64,
    pub verify_seconds: f64,
    /// Tokens the drafter caught up on, and the time it took.
    pub caught_up: usize,
    pub catch_up_seconds: f64,
    /// Rounds the policy drafted to explore, the tokens they committed and
    /// their draft and verify time (catch-up excluded).
    pub probes: usize,
    pub probe_tokens: usize,
    pub probe_seconds: f64,
}

impl SpecStats {
    /// τ: tokens committed per speculative round (accepted + 1).
    pub fn tau(&self) -> f64 {
        if self.rounds == 0 {
            return 0.0;
        }
        (self.accepted + self.rounds) as f64 / self.rounds as f64
    }

    pub fn acceptance_rate(&self) -> f64 {
        if self.drafted == 0 {
            return 0.0;
        }
        self.accepted as f64 / self.drafted as f64
    }

    /// Tokens per second after the first token.
    pub fn decode_tokens_per_second(&self) -> f64 {
        if self.decode_seconds > 0.0 {
            self.generated_tokens.saturating_sub(1) as f64 / self.decode_seconds
        } else {
            0.0
        }
    }

    /// Seconds the probes lost against plain steps of `plain_step` seconds
    /// (negative where they won), catch-up excluded.
    pub fn probe_loss_seconds(&self, plain_step: f64) -> f64 {
        self.probe_seconds - self.probe_tokens as f64 * plain_step
    }

    pub(crate) fn record_round(&mut self, r: &RoundStats) {
        if r.drafted == 0 {
            self.plain_steps += 1;
        } else {
            self.rounds += 1;
        }
        self.drafted += r.drafted;
        self.accepted += r.accepted;
        self.draft_seconds += r.draft_seconds;
        self.verify_seconds += r.verify_seconds;
        self.caught_up += r.caught_up;
        self.catch_up_seconds += r.catch_up_seconds;
        if r.probe {
            self.probes += 1;
            self.probe_tokens += r.accepted + 1;
            self.probe_seconds += r.draft_seconds + r.verify_seconds;
        }
        if self.slot_tried.len() < r.drafted {
            self.slot_tried.resize(r.drafted, 0);
            self.slot_accepted.resize(r.drafted, 0);
        }
        for i in 0..r.drafted.min(r.accepted + 1) {
            self.slot_tried[i] += 1;
            if i < r.accepted {
                self.slot_accepted[i] += 1;
            }
        }
    }
}
