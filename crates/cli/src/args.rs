//! Value parsers of the numeric flags: each flag is checked against the
//! ranges that core shares with the npm API (`sampling::limits`,
//! `PolicyConfig::LENGTHS`), as clap parses it, so that a bad value is one
//! message naming the flag, before any model loads. The subcommands allow
//! negative numbers as values, so that `--temp -1` reaches this check
//! instead of clap reading `-1` as a flag.

use blockdraft_core::sampling::{limits, Bounds, SamplingParams};

/// A parser of `f32` values within `b`.
pub fn f32_in(b: Bounds<f32>) -> impl Fn(&str) -> Result<f32, String> + Clone + Send + Sync {
    move |s| b.check(s.trim().parse().map_err(|_| not_a_number(s))?)
}

/// A parser of `f64` values within `b`.
pub fn f64_in(b: Bounds<f64>) -> impl Fn(&str) -> Result<f64, String> + Clone + Send + Sync {
    move |s| b.check(s.trim().parse().map_err(|_| not_a_number(s))?)
}

/// A parser of integers within `b`; a negative one is out of range rather
/// than "not a number".
pub fn usize_in(b: Bounds<usize>) -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync {
    move |s| match s.trim().parse::<i128>() {
        Ok(v) => usize::try_from(v)
            .map_err(|_| b.refusal(v))
            .and_then(|v| b.check(v)),
        Err(_) => Err(format!("{s:?} is not an integer")),
    }
}

/// A parser of integers of at least `lo`.
pub fn at_least(lo: usize) -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync {
    usize_in(Bounds { lo, hi: usize::MAX })
}

fn not_a_number(s: &str) -> String {
    format!("{s:?} is not a number")
}

/// The penalties on recent tokens, as `run` samples with them and `score`
/// scores under them.
#[derive(clap::Args, Clone, Debug)]
pub struct PenaltyArgs {
    /// Penalty of tokens among the last --repeat-last-n, 1..=2; 1 disables
    /// (1.1 keeps small models from looping).
    #[arg(long = "repeat-penalty", default_value_t = 1.0,
          value_parser = f32_in(limits::REPEAT_PENALTY))]
    pub repeat_penalty: f32,
    /// Subtracted once from the logit of every token among the last
    /// --repeat-last-n, -2..=2 (OpenAI's presence penalty); 0 disables.
    #[arg(long = "presence-penalty", default_value_t = 0.0,
          value_parser = f32_in(limits::PRESENCE_PENALTY), allow_hyphen_values = true)]
    pub presence_penalty: f32,
    /// Subtracted from a token's logit per occurrence among the last
    /// --repeat-last-n, -2..=2 (OpenAI's frequency penalty); 0 disables.
    #[arg(long = "frequency-penalty", default_value_t = 0.0,
          value_parser = f32_in(limits::FREQUENCY_PENALTY), allow_hyphen_values = true)]
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at.
    #[arg(long = "repeat-last-n", default_value_t = 64,
          value_parser = usize_in(limits::REPEAT_LAST_N))]
    pub repeat_last_n: usize,
}

impl PenaltyArgs {
    /// `base` with these penalties.
    pub fn apply(&self, base: SamplingParams) -> SamplingParams {
        SamplingParams {
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repeat_last_n: self.repeat_last_n,
            ..base
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_checked_against_their_bounds() {
        let temp = f32_in(Bounds { lo: 0.0, hi: 2.0 });
        assert_eq!(temp("0.7"), Ok(0.7));
        for bad in ["-1", "nan", "inf", "2.5", "x", ""] {
            assert!(temp(bad).is_err(), "{bad}");
        }
        let draft = usize_in(Bounds { lo: 1, hi: 64 });
        assert_eq!(draft("64"), Ok(64));
        assert_eq!(
            draft("-3").unwrap_err(),
            "must be an integer within 1..=64, got -3"
        );
        assert!(draft("30000").is_err() && draft("0").is_err() && draft("1.5").is_err());
        let threads = at_least(1);
        assert_eq!(threads("0").unwrap_err(), "must be at least 1, got 0");
        assert_eq!(threads("-2").unwrap_err(), "must be at least 1, got -2");
        assert!(threads("99999999999999999999999999999999999999999").is_err());
        let never_negative = at_least(0);
        assert_eq!(
            never_negative("-1").unwrap_err(),
            "must be at least 0, got -1"
        );
    }
}
