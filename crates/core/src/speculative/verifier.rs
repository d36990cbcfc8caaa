//! Acceptance of a drafted block against the target's verify pass.
//!
//! Row `i` of the verify pass holds the target's prediction after the
//! anchor and the first `i` drafted tokens. Every rule here commits the
//! accepted prefix plus one token taken from the target, so each round
//! yields at least one token and the output follows the target exactly.

use super::Draft;
use crate::sampling::{argmax, Distribution, Sampler};

/// Outcome of one round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Drafted tokens accepted.
    pub accepted: usize,
    /// The accepted drafts followed by the target's own next token.
    pub tokens: Vec<u32>,
}

/// Greedy: accept while the target's argmax equals the draft.
/// `target_argmax` has one entry per verify row (drafts + 1).
pub fn verify_greedy(target_argmax: &[u32], draft: &[u32]) -> Verdict {
    debug_assert_eq!(target_argmax.len(), draft.len() + 1);
    let accepted = draft
        .iter()
        .zip(target_argmax)
        .take_while(|(d, t)| d == t)
        .count();
    let mut tokens = draft[..accepted].to_vec();
    tokens.push(target_argmax[accepted]);
    Verdict { accepted, tokens }
}

/// Target-sample matching: draw the target's token at each row and accept
/// while it equals the draft. Row `i` draws the number of `first + i`, the
/// position of the token it follows, as plain decoding would there: the
/// committed tokens are exactly plain decoding's samples, so a seed gives
/// the same text with or without a drafter, and the distribution is the
/// target's. (Rejection sampling with the draft's probabilities accepts
/// more often where drafter and target disagree mildly, but what it commits
/// depends on how long the policy made each draft, which differs from run
/// to run: a seed would no longer fix the text.)
pub fn verify_by_matching(
    target: &[Distribution],
    draft: &[u32],
    sampler: &Sampler,
    first: usize,
) -> Verdict {
    debug_assert_eq!(target.len(), draft.len() + 1);
    let mut tokens = Vec::with_capacity(draft.len() + 1);
    for (i, dist) in target.iter().enumerate() {
        let t = dist.sample(sampler.uniform(first + i));
        tokens.push(t);
        if draft.get(i) != Some(&t) {
            return Verdict {
                accepted: i,
                tokens,
            };
        }
    }
    unreachable!("the row after the last draft never matches a draft")
}

/// The verdict on `draft` from the target's verify rows read back to the
/// host (`rows`: one row of `n_vocab` logits per draft token, and one
/// more), chosen as `sampler` says after `history`: each row penalized with
/// the drafts before it as context, then greedy or target-sample matching.
pub fn verdict_from_rows(
    rows: &[f32],
    n_vocab: usize,
    history: &[u32],
    draft: &Draft,
    sampler: &Sampler,
) -> Verdict {
    let mut ctx = history.to_vec();
    let mut choices = Vec::new();
    let mut dists: Vec<Distribution> = Vec::new();
    for (i, row) in rows.chunks_exact(n_vocab).enumerate() {
        let mut row = row.to_vec();
        sampler.penalize(&mut row, &ctx);
        if sampler.params.is_greedy() {
            choices.push(argmax(&row));
        } else {
            dists.push(sampler.distribution(&row));
        }
        if let Some(&d) = draft.tokens.get(i) {
            ctx.push(d);
        }
    }
    if sampler.params.is_greedy() {
        return verify_greedy(&choices, &draft.tokens);
    }
    verify_by_matching(
        &dists,
        &draft.tokens,
        sampler,
        history.len().saturating_sub(1),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::SamplingParams;

    fn dist(pairs: &[(u32, f32)]) -> Distribution {
        Distribution {
            candidates: pairs.to_vec(),
        }
    }

    #[test]
    fn greedy_accepts_the_matching_prefix_plus_one() {
        assert_eq!(
            verify_greedy(&[5, 6, 9, 1], &[5, 6, 7]),
            Verdict {
                accepted: 2,
                tokens: vec![5, 6, 9]
            }
        );
        assert_eq!(
            verify_greedy(&[5, 6, 7, 1], &[5, 6, 7]),
            Verdict {
                accepted: 3,
                tokens: vec![5, 6, 7, 1]
            }
        );
        assert_eq!(
            verify_greedy(&[2, 6, 7, 1], &[5, 6, 7]),
            Verdict {
                accepted: 0,
                tokens: vec![2]
            }
        );
        assert_eq!(
            verify_greedy(&[4], &[]),
            Verdict {
                accepted: 0,
                tokens: vec![4]
            }
        );
    }

    const TARGET: [f64; 3] = [0.5, 0.3, 0.2];
    const DRAWS: u64 = 200_000;

    fn sampler(seed: u64) -> Sampler {
        Sampler::new(SamplingParams {
            temperature: 1.0,
            seed,
            ..Default::default()
        })
    }

    /// The first committed token must be distributed as the target's first
    /// row (`TARGET`) over seeds, whatever the drafter proposes: checked by
    /// counting within 5 sigma of a binomial proportion.
    #[test]
    fn matching_preserves_the_target_distribution() {
        let p = dist(&[(0, 0.5), (1, 0.3), (2, 0.2)]);
        let after = dist(&[(0, 1.0)]);
        let mut counts = [0usize; 3];
        for seed in 0..DRAWS {
            let verdict = verify_by_matching(&[p.clone(), after.clone()], &[2], &sampler(seed), 7);
            counts[verdict.tokens[0] as usize] += 1;
        }
        for (i, want) in TARGET.iter().enumerate() {
            let got = counts[i] as f64 / DRAWS as f64;
            let sigma = (want * (1.0 - want) / DRAWS as f64).sqrt();
            assert!(
                (got - want).abs() < 5.0 * sigma,
                "token {i}: {got} vs {want}"
            );
        }
    }

    /// Each row draws the number of its own position, so the committed
    /// tokens are those plain sampling draws, however the rows are split
    /// into drafts.
    #[test]
    fn matching_commits_what_plain_sampling_draws() {
        let rows = [
            dist(&[(0, 0.4), (1, 0.35), (2, 0.25)]),
            dist(&[(2, 0.5), (0, 0.3), (1, 0.2)]),
            dist(&[(1, 0.6), (2, 0.4)]),
        ];
        for seed in 0..200 {
            let s = sampler(seed);
            let plain: Vec<u32> = (0..3).map(|i| rows[i].sample(s.uniform(10 + i))).collect();
            // A draft that holds the plain tokens is accepted whole.
            let whole = verify_by_matching(&rows, &plain[..2], &s, 10);
            assert_eq!(whole.tokens, plain);
            // A wrong second draft stops at plain's second token.
            let wrong = (plain[1] + 1) % 3;
            let cut = verify_by_matching(&rows, &[plain[0], wrong], &s, 10);
            assert_eq!(cut.tokens, plain[..2]);
            assert_eq!(cut.accepted, 1);
        }
    }
}
