//! Plain (non-speculative) generation: prefill in chunks, then one token
//! per forward pass.

use crate::backend::Backend;
use crate::error::ModelError;
use crate::model::{Decoder, DecoderState, LogitRows};
use crate::sampling::{samples_on_device, Sampler, SamplingParams};

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// An end-of-generation token was produced (it is not emitted).
    EndOfGeneration,
    /// `max_tokens` were produced.
    Length,
    /// The caller's callback asked to stop (stop string, abort).
    Caller,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::EndOfGeneration => "eog",
            StopReason::Length => "length",
            StopReason::Caller => "stop",
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
}

impl GenerationStats {
    pub fn prefill_tokens_per_second(&self) -> f64 {
        rate(self.prompt_tokens, self.prefill_seconds)
    }

    /// Tokens per second after the first token (which comes from prefill).
    pub fn decode_tokens_per_second(&self) -> f64 {
        rate(self.generated_tokens.saturating_sub(1), self.decode_seconds)
    }
}

fn rate(n: usize, seconds: f64) -> f64 {
    if seconds > 0.0 {
        n as f64 / seconds
    } else {
        0.0
    }
}

/// Whether `tokens` end in a loop: a block of up to 64 tokens repeated
/// back to back, at least three times and over at least 16 tokens (" of of
/// of ...", the same sentence again and again), which small models fall
/// into without a repetition penalty. Front ends flag it in their stats.
pub fn ends_in_a_loop(tokens: &[u32]) -> bool {
    (1..=64usize).any(|period| {
        let need = (2 * period).max(16);
        tokens.len() >= need + period
            && (tokens.len() - need..tokens.len()).all(|i| tokens[i] == tokens[i - period])
    })
}

/// Runs `tokens` through the decoder in chunks of the state's batch size;
/// the last chunk leaves the logits of the final row in `state`.
pub fn prefill<B: Backend>(
    decoder: &Decoder<B>,
    state: &mut DecoderState<B>,
    tokens: &[u32],
) -> Result<(), ModelError> {
    if tokens.is_empty() {
        return Err(ModelError::Usage("the prompt is empty".into()));
    }
    let chunks: Vec<&[u32]> = tokens.chunks(state.max_batch()).collect();
    for (i, chunk) in chunks.iter().enumerate() {
        let logits = if i + 1 == chunks.len() {
            LogitRows::Last
        } else {
            LogitRows::None
        };
        decoder.forward(state, chunk, logits, true, None)?;
    }
    Ok(())
}

/// Generates up to `max_tokens` tokens after `prompt`: one
/// [`Sequence`](crate::engine::Sequence) without a drafter, driven alone
/// on the caller's state and sampler. `on_token` receives each token and
/// returns `false` to stop.
pub async fn generate<B: Backend>(
    decoder: &Decoder<B>,
    state: &mut DecoderState<B>,
    prompt: &[u32],
    max_tokens: usize,
    sampler: &mut Sampler,
    is_eog: &dyn Fn(u32) -> bool,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<(Vec<u32>, StopReason, GenerationStats), ModelError> {
    use crate::engine::{Held, Sequence};
    let mut seq = Sequence::new(
        Held::Borrowed(state),
        prompt,
        max_tokens,
        Held::Borrowed(sampler),
        is_eog,
    );
    let (tokens, reason) = seq.run_alone(decoder, on_token, &mut |_| {}).await?;
    Ok((tokens, reason, seq.plain_stats()))
}

/// The token after the last row of `state`'s logits, chosen as `sampler`
/// says after `history`. Where a device samples exactly as the host would
/// ([`samples_on_device`]), the penalty, argmax and seeded sampling run
/// there and one id comes back instead of a row of logits. The draw's
/// number is the position of the token the logits follow: the speculative
/// engine's device rounds draw that position with the same number, so plain
/// and speculative decoding give the same tokens.
pub(crate) async fn next_token<B: Backend>(
    be: &B,
    state: &mut DecoderState<B>,
    sampler: &Sampler,
    history: &[u32],
    picked: &mut B::Tensor,
) -> u32 {
    let p = &sampler.params;
    if !be.host_memory() && samples_on_device(p) {
        penalize(be, state.logits_mut(), history, None, p);
        if p.is_greedy() {
            return be.argmax(state.logits()).await[0];
        }
        let counter = (state.len() - 1) as u64;
        be.sample_to(state.logits(), p, counter, picked, 0, 0);
        return be.read(picked).await[0] as u32;
    }
    if p.picks_argmax() {
        return be.argmax(state.logits()).await[0];
    }
    sampler.sample(&be.read(state.logits()).await, history)
}

/// [`crate::backend::SamplingOps::penalize`] with `p`'s penalty, when it has one.
pub(crate) fn penalize<B: Backend>(
    be: &B,
    logits: &mut B::Tensor,
    history: &[u32],
    batch: Option<(&B::Tensor, usize)>,
    p: &SamplingParams,
) {
    if p.repeat_penalty != 1.0 && p.repeat_last_n > 0 {
        be.penalize(logits, history, batch, p.repeat_penalty, p.repeat_last_n);
    }
}

/// Finds stop strings in streamed text, holding back any tail that could
/// still become one.
#[derive(Clone, Debug, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    pending: String,
}

impl StopStrings {
    pub fn new(stops: Vec<String>) -> Self {
        StopStrings {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            pending: String::new(),
        }
    }

    /// Feeds new text; returns the text safe to emit and whether a stop
    /// string was found (the stop string itself is not emitted).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.pending.push_str(text);
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min()
        {
            let emit = self.pending[..at].to_string();
            self.pending.clear();
            return (emit, true);
        }
        // Keep the longest suffix that is a prefix of some stop string.
        let mut keep = 0;
        for s in &self.stops {
            for (i, _) in s
                .char_indices()
                .skip(1)
                .chain(std::iter::once((s.len(), ' ')))
            {
                if i <= self.pending.len()
                    && i > keep
                    && self.pending.ends_with(&s[..i])
                    && i < s.len()
                {
                    keep = i;
                }
            }
        }
        let cut = self.pending.len() - keep;
        let emit = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        (emit, false)
    }

    /// Text still held back at the end of generation.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

/// The text of a token stream as it is generated: tokens detokenized
/// (a character split across tokens is held until complete) and stop
/// strings held back and cut. The CLI's `run`, the browser session and the
/// server show text through it, so they show the same text.
pub struct TextStream<'t> {
    detok: crate::tokenizer::StreamDecoder<'t>,
    stops: StopStrings,
    stopped: bool,
}

impl<'t> TextStream<'t> {
    pub fn new(tokenizer: &'t crate::tokenizer::Tokenizer, stops: Vec<String>) -> Self {
        TextStream {
            detok: crate::tokenizer::StreamDecoder::new(tokenizer),
            stops: StopStrings::new(stops),
            stopped: false,
        }
    }

    /// The text safe to show after `token`, and whether a stop string
    /// ended the text there (nothing more is shown after it).
    pub fn push(&mut self, token: u32) -> Result<(String, bool), crate::tokenizer::TokenizerError> {
        if self.stopped {
            return Ok((String::new(), true));
        }
        let piece = self.detok.push(token)?;
        let (emit, stopped) = self.stops.push(&piece);
        self.stopped = stopped;
        Ok((emit, stopped))
    }

    /// The text held back at the end (none after a stop string).
    pub fn finish(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        let tail = self.stops.push(&self.detok.finish()).0;
        tail + &self.stops.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loops_at_the_end_are_found() {
        assert!(ends_in_a_loop(&[7; 20]), "of of of ...");
        let sentence: Vec<u32> = (1..=10).collect();
        let thrice: Vec<u32> = [5, 6].into_iter().chain(sentence.repeat(3)).collect();
        assert!(ends_in_a_loop(&thrice));
        assert!(
            !ends_in_a_loop(&sentence.repeat(2)),
            "twice is not a loop yet"
        );
        assert!(!ends_in_a_loop(&(0..200).collect::<Vec<u32>>()));
        assert!(!ends_in_a_loop(&[7; 15]), "too short to tell");
        let mut recovered = vec![7; 20];
        recovered.extend(100..120);
        assert!(!ends_in_a_loop(&recovered), "only the end counts");
    }

    #[test]
    fn stop_strings_hold_back_partial_matches() {
        let mut s = StopStrings::new(vec!["</end>".into()]);
        assert_eq!(s.push("hello </"), ("hello ".to_string(), false));
        assert_eq!(s.push("en"), (String::new(), false));
        assert_eq!(s.push("x"), ("</enx".to_string(), false));
        assert_eq!(s.push(" a</end> tail"), (" a".to_string(), true));
        let mut s = StopStrings::new(vec!["ab".into()]);
        assert_eq!(s.push("xa"), ("x".to_string(), false));
        assert_eq!(s.finish(), "a");
    }
}
