//! Token sampling: greedy, temperature, top-k, top-p, min-p, repetition
//! penalty. A seeded draw takes the number of `(seed, position)`
//! ([`seeded_uniform`]), so a seed gives the same text on every run, and
//! speculative decoding, whatever it drafts, the text plain decoding gives.

/// Sampling settings; `temperature <= 0` means greedy.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    /// 0 disables.
    pub top_k: usize,
    /// 1.0 disables.
    pub top_p: f32,
    /// 0.0 disables.
    pub min_p: f32,
    /// 1.0 disables.
    pub repeat_penalty: f32,
    /// Subtracted from the logit of every token of the window (OpenAI's
    /// `presence_penalty`; 0.0 disables).
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per occurrence in the window
    /// (OpenAI's `frequency_penalty`; 0.0 disables).
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub repeat_last_n: usize,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repeat_last_n: 64,
            seed: 0,
        }
    }
}

/// An accepted range of a numeric setting. Every front end (the CLI's
/// flags, the npm API's request fields) checks its values against the one
/// table below, so that they accept the same values with the same message.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bounds<T> {
    pub lo: T,
    pub hi: T,
}

impl Bounds<f32> {
    /// `v` if it is a finite number within the bounds, else why not (a
    /// phrase to follow the setting's name: "must be ...").
    pub fn check(&self, v: f32) -> Result<f32, String> {
        if v.is_finite() && (self.lo..=self.hi).contains(&v) {
            Ok(v)
        } else {
            Err(format!(
                "must be a number within {}..={}, got {v}",
                self.lo, self.hi
            ))
        }
    }
}

impl Bounds<f64> {
    pub fn check(&self, v: f64) -> Result<f64, String> {
        if v.is_finite() && (self.lo..=self.hi).contains(&v) {
            Ok(v)
        } else {
            Err(format!(
                "must be a number within {}..={}, got {v}",
                self.lo, self.hi
            ))
        }
    }
}

impl Bounds<usize> {
    pub fn check(&self, v: usize) -> Result<usize, String> {
        if (self.lo..=self.hi).contains(&v) {
            Ok(v)
        } else {
            Err(self.refusal(v))
        }
    }

    /// Why `got` (outside the bounds, perhaps not even a `usize`) is refused.
    pub fn refusal(&self, got: impl std::fmt::Display) -> String {
        if self.hi == usize::MAX {
            format!("must be at least {}, got {got}", self.lo)
        } else {
            format!(
                "must be an integer within {}..={}, got {got}",
                self.lo, self.hi
            )
        }
    }
}

/// The accepted ranges of [`SamplingParams`]' fields.
pub mod limits {
    use super::Bounds;

    /// 0 is greedy; beyond 2 the text is noise (OpenAI's bound too).
    pub const TEMPERATURE: Bounds<f32> = Bounds { lo: 0.0, hi: 2.0 };
    pub const TOP_P: Bounds<f32> = Bounds { lo: 0.0, hi: 1.0 };
    pub const MIN_P: Bounds<f32> = Bounds { lo: 0.0, hi: 1.0 };
    /// 1 disables; below 1 it rewards repeats (the text loops), far above
    /// it forbids every common word.
    pub const REPEAT_PENALTY: Bounds<f32> = Bounds { lo: 1.0, hi: 2.0 };
    /// OpenAI's bounds; negative values reward repeats.
    pub const PRESENCE_PENALTY: Bounds<f32> = Bounds { lo: -2.0, hi: 2.0 };
    pub const FREQUENCY_PENALTY: Bounds<f32> = Bounds { lo: -2.0, hi: 2.0 };
    /// Any window: one longer than the history is the whole history.
    pub const REPEAT_LAST_N: Bounds<usize> = Bounds {
        lo: 0,
        hi: usize::MAX,
    };
}

impl SamplingParams {
    /// Checks every field against [`limits`]; the error names the field as
    /// this struct does.
    pub fn check(&self) -> Result<(), String> {
        let named = |name: &str, r: Result<f32, String>| r.map_err(|e| format!("{name} {e}"));
        named("temperature", limits::TEMPERATURE.check(self.temperature))?;
        named("top_p", limits::TOP_P.check(self.top_p))?;
        named("min_p", limits::MIN_P.check(self.min_p))?;
        named(
            "repeat_penalty",
            limits::REPEAT_PENALTY.check(self.repeat_penalty),
        )?;
        named(
            "presence_penalty",
            limits::PRESENCE_PENALTY.check(self.presence_penalty),
        )?;
        named(
            "frequency_penalty",
            limits::FREQUENCY_PENALTY.check(self.frequency_penalty),
        )?;
        Ok(())
    }

    /// Whether any penalty changes logits (over a window of at least one
    /// token).
    pub fn penalizes(&self) -> bool {
        self.penalizes_additively() || (self.repeat_last_n > 0 && self.repeat_penalty != 1.0)
    }

    /// Whether the presence or frequency penalty changes logits.
    pub fn penalizes_additively(&self) -> bool {
        self.repeat_last_n > 0 && (self.presence_penalty != 0.0 || self.frequency_penalty != 0.0)
    }

    /// Whether the token is the row's argmax: greedy, without penalties.
    pub fn picks_argmax(&self) -> bool {
        self.is_greedy() && !self.penalizes()
    }

    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }
}

/// xoshiro256** seeded by splitmix64, for test data, benchmarks and
/// simulations. Hand-written rather than a crate so the stream is fixed
/// forever and identical on native and wasm32.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Index of the largest value (first on ties), or 0 for an empty slice.
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best as u32
}

/// A normalised distribution over a subset of the vocabulary, sorted by
/// probability (highest first).
#[derive(Clone, Debug, PartialEq)]
pub struct Distribution {
    pub candidates: Vec<(u32, f32)>,
}

impl Distribution {
    /// Probability of `id` (0 if filtered out).
    pub fn prob(&self, id: u32) -> f32 {
        self.candidates
            .iter()
            .find(|c| c.0 == id)
            .map_or(0.0, |c| c.1)
    }

    /// The token that uniform `u` in [0, 1) draws, by inverse CDF.
    pub fn sample(&self, u: f32) -> u32 {
        let mut acc = 0.0;
        for &(id, p) in &self.candidates {
            acc += p;
            if u < acc {
                return id;
            }
        }
        self.candidates.last().map_or(0, |c| c.0)
    }
}

/// The repetition penalty on `logits` for each distinct token of `recent`:
/// positive logits are divided by `penalty`, the others multiplied, as
/// llama.cpp does.
pub fn penalize(logits: &mut [f32], recent: &[u32], penalty: f32) {
    if penalty == 1.0 {
        return;
    }
    for_each_count(logits, recent, |l, _| {
        *l = if *l > 0.0 { *l / penalty } else { *l * penalty };
    });
}

/// Calls `f` with the logit of each distinct token of `recent` (ids beyond
/// `logits` are skipped) and how often the token occurs.
fn for_each_count(logits: &mut [f32], recent: &[u32], mut f: impl FnMut(&mut f32, usize)) {
    let mut sorted = recent.to_vec();
    sorted.sort_unstable();
    for run in sorted.chunk_by(|a, b| a == b) {
        if let Some(l) = logits.get_mut(run[0] as usize) {
            f(l, run.len());
        }
    }
}

/// OpenAI's additive penalties on `logits` for the tokens of `recent`:
/// `presence` once for each distinct token, `frequency` once per
/// occurrence (as llama.cpp applies them, after the repetition penalty).
pub fn penalize_additive(logits: &mut [f32], recent: &[u32], presence: f32, frequency: f32) {
    if presence == 0.0 && frequency == 0.0 {
        return;
    }
    for_each_count(logits, recent, |l, count| {
        *l -= presence + frequency * count as f32;
    });
}

/// Chooses tokens from rows of logits as [`SamplingParams`] say. It holds
/// no stream: the draw after `history` takes the number of
/// `(seed, history.len() − 1)`, the position of the token the row follows.
#[derive(Clone, Debug)]
pub struct Sampler {
    pub params: SamplingParams,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        Sampler { params }
    }

    /// The uniform a seeded draw of the row after the token at `position`
    /// takes.
    pub fn uniform(&self, position: usize) -> f32 {
        seeded_uniform(self.params.seed, position as u64)
    }

    /// Applies the penalties to `logits` for the last `repeat_last_n`
    /// tokens of `history`: the repetition penalty ([`penalize`]), then
    /// presence and frequency ([`penalize_additive`]).
    pub fn penalize(&self, logits: &mut [f32], history: &[u32]) {
        let p = &self.params;
        let window = &history[history.len().saturating_sub(p.repeat_last_n)..];
        penalize(logits, window, p.repeat_penalty);
        penalize_additive(logits, window, p.presence_penalty, p.frequency_penalty);
    }

    /// The distribution tokens are drawn from at temperature > 0, after
    /// top-k, top-p, min-p and temperature (llama.cpp's default order).
    pub fn distribution(&self, logits: &[f32]) -> Distribution {
        let p = &self.params;
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .filter(|c| c.1.is_finite())
            .collect();
        let k = if p.top_k == 0 {
            cand.len()
        } else {
            p.top_k.min(cand.len())
        };
        if k < cand.len() && k > 0 {
            cand.select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1));
            cand.truncate(k);
        }
        cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if cand.is_empty() {
            return Distribution {
                candidates: vec![(argmax(logits), 1.0)],
            };
        }
        softmax_in_place(&mut cand, 1.0);
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            let mut keep = cand.len();
            for (i, c) in cand.iter().enumerate() {
                acc += c.1;
                if acc >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
            cand.truncate(keep.max(1));
        }
        if p.min_p > 0.0 {
            let floor = cand[0].1 * p.min_p;
            let keep = cand.iter().take_while(|c| c.1 >= floor).count().max(1);
            cand.truncate(keep);
        }
        // Back to logits, then temperature.
        let max_logit = logits[cand[0].0 as usize];
        for c in cand.iter_mut() {
            c.1 = logits[c.0 as usize] - max_logit;
        }
        softmax_in_place(&mut cand, p.temperature.max(1e-6));
        Distribution { candidates: cand }
    }

    /// Picks the token after `history` from its row of logits.
    pub fn sample(&self, logits: &[f32], history: &[u32]) -> u32 {
        let penalized;
        let row = if self.params.penalizes() {
            let mut row = logits.to_vec();
            self.penalize(&mut row, history);
            penalized = row;
            &penalized
        } else {
            logits
        };
        if self.params.is_greedy() {
            return argmax(row);
        }
        let u = self.uniform(history.len().saturating_sub(1));
        self.distribution(row).sample(u)
    }
}

/// Most alternatives a token's log-probabilities list (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A chosen token's log-probability under the target's distribution (the
/// softmax of its raw logits: before penalties, temperature and
/// truncation, as OpenAI and llama-server report them), with the most
/// likely tokens of that row.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    pub token: u32,
    pub logprob: f32,
    /// Up to the requested count, most likely first (ties by id).
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprobs {
    /// From `logits` (one row, the vocabulary), for `token` and the `top`
    /// most likely tokens. Non-finite logits count as impossible.
    pub fn from_logits(logits: &[f32], token: u32, top: usize) -> Self {
        let max = logits
            .iter()
            .copied()
            .filter(|l| l.is_finite())
            .fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = logits
            .iter()
            .filter(|l| l.is_finite())
            .map(|&l| ((l - max) as f64).exp())
            .sum();
        let log_z = max as f64 + sum.ln();
        let logprob = |l: f32| {
            if l.is_finite() {
                (l as f64 - log_z) as f32
            } else {
                f32::NEG_INFINITY
            }
        };
        let mut best: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        let top = top.min(MAX_TOP_LOGPROBS).min(best.len());
        let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if top > 0 && top < best.len() {
            best.select_nth_unstable_by(top - 1, order);
        }
        best.truncate(top);
        best.sort_by(order);
        TokenLogprobs {
            token,
            logprob: logits
                .get(token as usize)
                .map_or(f32::NEG_INFINITY, |&l| logprob(l)),
            top: best.into_iter().map(|(i, l)| (i, logprob(l))).collect(),
        }
    }
}

/// The uniform in [0, 1) that seeded sampling draws for `(seed, counter)`,
/// on the host and on devices (`shaders/sample.wgsl` computes the same
/// bits): a counter-based generator, so a device draws each row's number
/// independently and a given seed and position always draw the same one.
pub fn seeded_uniform(seed: u64, counter: u64) -> f32 {
    fn pcg(v: u32) -> u32 {
        let state = v.wrapping_mul(747_796_405).wrapping_add(2_891_336_453);
        let word = ((state >> ((state >> 28) + 4)) ^ state).wrapping_mul(277_803_737);
        (word >> 22) ^ word
    }
    let (s_lo, s_hi) = (seed as u32, (seed >> 32) as u32);
    let (c_lo, c_hi) = (counter as u32, (counter >> 32) as u32);
    let h = pcg(s_lo ^ pcg(s_hi ^ pcg(c_lo ^ pcg(c_hi))));
    (h >> 8) as f32 * (1.0 / (1u32 << 24) as f32)
}

/// Whether a device chooses tokens exactly as [`Sampler::sample`] does
/// ([`crate::backend::SamplingOps::penalize`], then argmax or
/// [`crate::backend::SamplingOps::sample_to`]): at temperature > 0 top-p only over a
/// top-k (the nucleus needs the sorted candidates, which a device sorts
/// only for a top-k), and without presence or frequency penalties (a
/// device applies the repetition penalty only).
pub fn samples_on_device(p: &SamplingParams) -> bool {
    !p.penalizes_additively() && (p.is_greedy() || p.top_k > 0 || p.top_p >= 1.0)
}

/// Index among `values` (the candidates, in order) that seeded sampling
/// draws with uniform `u` (see [`crate::backend::SamplingOps::sample_to`]): non-finite
/// values are dropped, then with `sorted` (a top-k, best first) top-p keeps
/// the shortest prefix holding `top_p` of the mass at temperature 1, min-p
/// keeps `p ≥ min_p · p_max`, and the draw is by inverse CDF over
/// `softmax(values / T)` in candidate order. 0 when no value is finite.
pub fn sample_index(values: &[f32], sorted: bool, p: &SamplingParams, u: f32) -> usize {
    let Some(max) = values
        .iter()
        .copied()
        .filter(|v| v.is_finite())
        .reduce(f32::max)
    else {
        return 0;
    };
    let mut cut = values.len();
    if sorted && p.top_p < 1.0 {
        let total: f32 = values
            .iter()
            .filter(|v| v.is_finite())
            .map(|v| (v - max).exp())
            .sum();
        let mut acc = 0.0;
        for (i, v) in values.iter().enumerate() {
            if v.is_finite() {
                acc += (v - max).exp();
            }
            if acc >= p.top_p * total {
                cut = i + 1;
                break;
            }
        }
    }
    let t = p.temperature.max(1e-6);
    let weight = |v: f32| {
        if !v.is_finite() || (p.min_p > 0.0 && (v - max).exp() < p.min_p) {
            0.0
        } else {
            ((v - max) / t).exp()
        }
    };
    let total: f32 = values[..cut].iter().map(|&v| weight(v)).sum();
    let goal = u * total;
    let (mut acc, mut last) = (0.0, 0);
    for (i, &v) in values[..cut].iter().enumerate() {
        let w = weight(v);
        if w > 0.0 {
            acc += w;
            last = i;
            if goal < acc {
                return i;
            }
        }
    }
    last
}

fn softmax_in_place(cand: &mut [(u32, f32)], temperature: f32) {
    let max = cand.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for c in cand.iter_mut() {
        c.1 = ((c.1 - max) / temperature).exp();
        sum += c.1;
    }
    for c in cand.iter_mut() {
        c.1 /= sum;
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn penalty_rows_see_the_batch_before_them_once_per_token() {
        // Row r: window = last 3 of [5, 6, 5] ++ batch[1..=r].
        let batch = [6, 7, 7];
        let mut x = vec![2.0f32; 3 * 8];
        x[8 + 5] = -2.0;
        crate::host_ops::penalize_rows(&mut x, 8, &[5, 6, 5], &batch, 2.0, 3);
        let row = |r: usize| x[r * 8..(r + 1) * 8].to_vec();
        // Row 0: {5, 6}; 5 appears twice but is penalized once.
        assert_eq!(row(0), [2.0, 2.0, 2.0, 2.0, 2.0, 1.0, 1.0, 2.0]);
        // Row 1: {6, 5, 7}; a negative logit is multiplied.
        assert_eq!(row(1), [2.0, 2.0, 2.0, 2.0, 2.0, -4.0, 1.0, 1.0]);
        // Row 2: [5, 7, 7]: 6 has left the window.
        assert_eq!(row(2), [2.0, 2.0, 2.0, 2.0, 2.0, 1.0, 2.0, 1.0]);
    }

    use super::*;

    #[test]
    fn greedy_picks_first_maximum() {
        let s = Sampler::new(SamplingParams::greedy());
        assert_eq!(s.sample(&[0.1, 3.0, 3.0, -1.0], &[]), 1);
    }

    #[test]
    fn filters_cut_the_tail() {
        let logits = [4.0, 3.0, 2.0, -10.0, 1.0];
        let s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 3,
            top_p: 1.0,
            min_p: 0.0,
            ..Default::default()
        });
        let d = s.distribution(&logits);
        assert_eq!(
            d.candidates.iter().map(|c| c.0).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        let total: f32 = d.candidates.iter().map(|c| c.1).sum();
        assert!((total - 1.0).abs() < 1e-6);

        let s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.5,
            min_p: 0.0,
            ..Default::default()
        });
        assert_eq!(
            s.distribution(&logits).candidates.len(),
            1,
            "top-1 already holds > 50 %"
        );

        let s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.3,
            ..Default::default()
        });
        // p(1)/p(0) = e^-1 = 0.37 >= 0.3, p(2)/p(0) = e^-2 = 0.14 < 0.3
        assert_eq!(s.distribution(&logits).candidates.len(), 2);
    }

    #[test]
    fn sampling_follows_the_distribution_and_is_seeded() {
        let logits = [1.0f32, 0.0, 2.0];
        let params = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 7,
            ..Default::default()
        };
        let s = Sampler::new(params.clone());
        let n = 200_000;
        let mut counts = [0usize; 3];
        // Over positions: each draws its own number.
        let dist = s.distribution(&logits);
        for position in 0..n {
            counts[dist.sample(s.uniform(position)) as usize] += 1;
        }
        let z: f32 = logits.iter().map(|l| l.exp()).sum();
        for (i, &c) in counts.iter().enumerate() {
            let expected = logits[i].exp() / z;
            let got = c as f32 / n as f32;
            // 5 sigma of a binomial proportion.
            let sigma = (expected * (1.0 - expected) / n as f32).sqrt();
            assert!(
                (got - expected).abs() < 5.0 * sigma,
                "token {i}: {got} vs {expected}"
            );
        }
        // The draw after a history depends on the seed and its length only.
        let history = |n: usize| vec![1u32; n];
        let draws = |seed: u64| -> Vec<u32> {
            let s = Sampler::new(SamplingParams {
                seed,
                ..params.clone()
            });
            (1..60).map(|n| s.sample(&logits, &history(n))).collect()
        };
        assert_eq!(draws(7), draws(7));
        assert_ne!(draws(7), draws(8));
    }

    #[test]
    fn device_sampling_filters_like_the_host_distribution() {
        let p = SamplingParams {
            temperature: 1.0,
            top_k: 4,
            top_p: 0.7,
            min_p: 0.0,
            ..Default::default()
        };
        // Sorted top-4: exp-weights 1, e^-1, e^-2, e^-3; the first two hold
        // 0.845 ≥ 0.7 of the mass, the first alone 0.64 < 0.7.
        let top = [3.0, 2.0, 1.0, 0.0];
        let picks: Vec<usize> = (0..200)
            .map(|c| sample_index(&top, true, &p, seeded_uniform(5, c)))
            .collect();
        assert!(
            picks.iter().all(|&i| i < 2) && picks.contains(&1),
            "top-p cut"
        );
        // min-p 0.3 keeps e^-1 = 0.37 and drops e^-2; NaN and −∞ never drawn.
        let p = SamplingParams {
            top_k: 0,
            top_p: 1.0,
            min_p: 0.3,
            ..p
        };
        let row = [f32::NAN, 1.0, 2.0, f32::NEG_INFINITY, 0.0];
        let picks: Vec<usize> = (0..200)
            .map(|c| sample_index(&row, false, &p, seeded_uniform(6, c)))
            .collect();
        assert!(picks.iter().all(|&i| i == 1 || i == 2) && picks.contains(&1));
        assert_eq!(sample_index(&[f32::NAN; 3], false, &p, 0.5), 0);
        let u: Vec<f32> = (0..1000).map(|c| seeded_uniform(9, c)).collect();
        assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)));
        let mean = u.iter().sum::<f32>() / 1000.0;
        assert!((mean - 0.5).abs() < 0.05, "mean {mean}");
        assert_ne!(seeded_uniform(9, 0), seeded_uniform(10, 0), "seeded");
    }

    #[test]
    fn settings_are_checked_against_the_limits() {
        assert!(SamplingParams::default().check().is_ok());
        for bad in [
            SamplingParams {
                temperature: -1.0,
                ..Default::default()
            },
            SamplingParams {
                top_p: f32::NAN,
                ..Default::default()
            },
            SamplingParams {
                repeat_penalty: 0.0,
                ..Default::default()
            },
            SamplingParams {
                repeat_penalty: f32::INFINITY,
                ..Default::default()
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
        assert_eq!(
            limits::REPEAT_PENALTY.check(f32::NAN).unwrap_err(),
            "must be a number within 1..=2, got NaN"
        );
        let draft = Bounds { lo: 1, hi: 64 };
        assert!(draft.check(64).is_ok() && draft.check(0).is_err());
    }

    #[test]
    fn presence_and_frequency_penalties_subtract_per_token_and_per_occurrence() {
        let s = Sampler::new(SamplingParams {
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            repeat_penalty: 2.0,
            repeat_last_n: 4,
            ..SamplingParams::greedy()
        });
        let mut logits = [1.0f32, 4.0, -1.0, 3.0];
        // Window [1, 1, 2, 3]: token 0 is outside it (its occurrence is older).
        s.penalize(&mut logits, &[0, 1, 1, 2, 3]);
        // Token 1: 4 / 2 − 0.5 − 2 · 0.25; token 2: −1 · 2 − 0.5 − 0.25.
        assert_eq!(logits, [1.0, 1.0, -2.75, 0.75]);
        assert!(s.params.penalizes());
        assert!(
            !samples_on_device(&s.params),
            "a device has no additive penalty"
        );
        let off = SamplingParams {
            repeat_last_n: 0,
            ..s.params.clone()
        };
        assert!(!off.penalizes() && samples_on_device(&off));
    }

    #[test]
    fn repetition_penalty_changes_the_greedy_choice() {
        let s = Sampler::new(SamplingParams {
            repeat_penalty: 2.0,
            ..SamplingParams::greedy()
        });
        assert_eq!(s.sample(&[3.0, 2.0], &[0]), 1);
        assert_eq!(s.sample(&[3.0, 2.0], &[]), 0);
    }

    #[test]
    fn token_logprobs_are_the_raw_softmax() {
        let logits = [1.0, 3.0, f32::NEG_INFINITY, 2.0, 3.0];
        let lp = TokenLogprobs::from_logits(&logits, 3, 3);
        let z: f64 = [1.0f64, 3.0, 2.0, 3.0].iter().map(|l| l.exp()).sum();
        let want = |l: f64| (l - z.ln()) as f32;
        assert_eq!(lp.token, 3);
        assert!((lp.logprob - want(2.0)).abs() < 1e-6, "{lp:?}");
        // Most likely first, ties by id; the impossible token never listed
        // before a possible one.
        let ids: Vec<u32> = lp.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, [1, 4, 3]);
        assert!((lp.top[0].1 - want(3.0)).abs() < 1e-6);
        let none = TokenLogprobs::from_logits(&logits, 2, 0);
        assert_eq!(none.logprob, f32::NEG_INFINITY);
        assert!(none.top.is_empty());
        // At most the OpenAI limit, and no more than the vocabulary.
        assert_eq!(TokenLogprobs::from_logits(&logits, 0, 99).top.len(), 5);
        let wide: Vec<f32> = (0..100).map(|i| i as f32 * 0.01).collect();
        assert_eq!(
            TokenLogprobs::from_logits(&wide, 0, 99).top.len(),
            MAX_TOP_LOGPROBS
        );
    }
}
