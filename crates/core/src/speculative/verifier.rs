//! Acceptance of a drafted block against the target's verify pass.
//!
//! Row `i` of the verify pass holds the target's prediction after the
//! anchor and the first `i` drafted tokens. Every rule here commits the
//! accepted prefix plus one token taken from the target, so each round
//! yields at least one token and the output follows the target exactly.

use super::Draft;
use crate::sampling::{argmax, Distribution, Rng, Sampler};

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

/// Target-sample matching, for drafters without probabilities: draw the
/// target's token at each row and accept while it equals the draft. The
/// committed tokens are exactly target samples, so the distribution is the
/// target's.
pub fn verify_by_matching(target: &[Distribution], draft: &[u32], rng: &mut Rng) -> Verdict {
    debug_assert_eq!(target.len(), draft.len() + 1);
    let mut tokens = Vec::with_capacity(draft.len() + 1);
    for (i, dist) in target.iter().enumerate() {
        let t = dist.sample(rng);
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
/// the drafts before it as context, then greedy matching, rejection
/// sampling (a draft with its probabilities) or target-sample matching.
pub fn verdict_from_rows(
    rows: &[f32],
    n_vocab: usize,
    history: &[u32],
    draft: &Draft,
    sampler: &mut Sampler,
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
    match &draft.probs {
        Some(q) => verify_rejection(&dists, &draft.tokens, q, &mut sampler.rng),
        None => verify_by_matching(&dists, &draft.tokens, &mut sampler.rng),
    }
}

/// Speculative (rejection) sampling: accept draft `x ~ q` with probability
/// `min(1, p(x)/q(x))`; on rejection draw from `norm(max(0, p − q))`; after
/// a fully accepted draft draw the bonus token from the last row's `p`.
pub fn verify_rejection(
    target: &[Distribution],
    draft: &[u32],
    draft_probs: &[Distribution],
    rng: &mut Rng,
) -> Verdict {
    debug_assert_eq!(target.len(), draft.len() + 1);
    debug_assert_eq!(draft_probs.len(), draft.len());
    let mut tokens = Vec::with_capacity(draft.len() + 1);
    for (i, (&x, q)) in draft.iter().zip(draft_probs).enumerate() {
        let p = &target[i];
        let (px, qx) = (p.prob(x), q.prob(x));
        if qx > 0.0 && (rng.next_f64() as f32) < (px / qx).min(1.0) {
            tokens.push(x);
            continue;
        }
        tokens.push(residual(p, q).sample(rng));
        return Verdict {
            accepted: i,
            tokens,
        };
    }
    tokens.push(target[draft.len()].sample(rng));
    Verdict {
        accepted: draft.len(),
        tokens,
    }
}

/// `norm(max(0, p − q))`, or `p` itself when the difference vanishes
/// (p ≤ q everywhere only if p = q, where rejection has probability 0).
fn residual(p: &Distribution, q: &Distribution) -> Distribution {
    let mut cand: Vec<(u32, f32)> = p
        .candidates
        .iter()
        .map(|&(id, pp)| (id, (pp - q.prob(id)).max(0.0)))
        .filter(|c| c.1 > 0.0)
        .collect();
    let total: f32 = cand.iter().map(|c| c.1).sum();
    if total <= 0.0 {
        return p.clone();
    }
    cand.iter_mut().for_each(|c| c.1 /= total);
    cand.sort_by(|a, b| b.1.total_cmp(&a.1));
    Distribution { candidates: cand }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    const DRAWS: usize = 200_000;

    /// The first committed token must be distributed as the target's first
    /// row (`TARGET`), whatever the drafter proposes: checked by counting
    /// within 5 sigma of a binomial proportion.
    fn assert_first_token_follows_target(f: impl Fn(&mut Rng) -> Verdict) {
        let mut rng = Rng::new(1);
        let mut counts = [0usize; 3];
        for _ in 0..DRAWS {
            counts[f(&mut rng).tokens[0] as usize] += 1;
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

    #[test]
    fn rejection_sampling_preserves_the_target_distribution() {
        let p = dist(&[(0, 0.5), (1, 0.3), (2, 0.2)]);
        let q = dist(&[(2, 0.6), (1, 0.3), (0, 0.1)]);
        let after = dist(&[(0, 1.0)]);
        // Draft tokens drawn from q, as a sampling drafter would.
        assert_first_token_follows_target(|rng| {
            let x = q.sample(rng);
            verify_rejection(
                &[p.clone(), after.clone()],
                &[x],
                std::slice::from_ref(&q),
                rng,
            )
        });
    }

    #[test]
    fn matching_preserves_the_target_distribution() {
        let p = dist(&[(0, 0.5), (1, 0.3), (2, 0.2)]);
        let after = dist(&[(0, 1.0)]);
        assert_first_token_follows_target(|rng| {
            verify_by_matching(&[p.clone(), after.clone()], &[2], rng)
        });
    }
}
