//! The engine thread: takes queued requests while fewer than `parallel`
//! run, steps all of them together ([`Engine::step`]), and sends each
//! request's text and final figures down its own channel. A request whose
//! channel is closed (the client went away) is dropped at the next step.

use crate::api::GenRequest;
use crate::metrics::Metrics;
use blockdraft_core::backend::prelude::*;
use blockdraft_core::engine::{Engine, Event, Held, Sequence};
use blockdraft_core::generate::{StopReason, TextStream};
use blockdraft_core::model::{Decoder, DecoderState};
use blockdraft_core::sampling::Sampler;
use blockdraft_core::speculative::{DraftPolicy, PolicyConfig, SharedDrafter, SpecStats};
use blockdraft_core::tokenizer::Tokenizer;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Rows per target pass (prefill chunk, verify batch), as the CLI uses.
const MAX_BATCH: usize = 256;

/// Shortest shared prompt prefix worth reusing a finished request's memory
/// for (a chat template's system turn is longer).
const MIN_REUSE: usize = 16;

/// A finished request's target memory, kept for a later prompt that starts
/// the same way (llama-server's prompt cache): the memory holds the first
/// `state.len()` of `tokens`.
struct CachedPrefix<B: Backend> {
    tokens: Vec<u32>,
    state: DecoderState<B>,
}

/// Takes the cached memory sharing the longest prefix (at least
/// [`MIN_REUSE`] tokens, and at least one prompt token left to run) with
/// `prompt` and room for `n_ctx` positions, cut back to that prefix.
fn reuse_prefix<B: Backend>(
    cache: &mut Vec<CachedPrefix<B>>,
    prompt: &[u32],
    n_ctx: usize,
) -> Option<(DecoderState<B>, usize)> {
    let shared = |c: &CachedPrefix<B>| {
        let held = &c.tokens[..c.state.len().min(c.tokens.len())];
        let n = held.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        let n = n.min(prompt.len().saturating_sub(1));
        // A hybrid model's state goes back only so far.
        if c.state.can_truncate(n) {
            n
        } else {
            0
        }
    };
    let (i, n) = (cache.iter().enumerate())
        .filter(|(_, c)| c.state.kv.capacity() >= n_ctx)
        .map(|(i, c)| (i, shared(c)))
        .max_by_key(|&(_, n)| n)?;
    if n < MIN_REUSE {
        return None;
    }
    let mut state = cache.swap_remove(i).state;
    state.truncate(n).ok()?;
    Some((state, n))
}

/// What a request hears from the worker.
#[derive(Debug)]
pub enum Output {
    /// Text as it is generated (stop strings held back and cut), with the
    /// log-probabilities of the tokens it completes, when asked.
    Text(String, Vec<Scored>),
    Done(Done),
    Failed(String),
}

/// A token as a client sees it: its text (invalid UTF-8, as in a
/// character split across tokens, replaced) and its bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct Piece {
    pub text: String,
    pub bytes: Vec<u8>,
}

impl Piece {
    fn of(tokenizer: &Tokenizer, id: u32) -> Piece {
        let bytes = tokenizer.token_to_piece(id);
        Piece {
            text: String::from_utf8_lossy(&bytes).into_owned(),
            bytes,
        }
    }
}

/// A generated token's log-probability and the most likely tokens of its
/// row.
#[derive(Clone, Debug, PartialEq)]
pub struct Scored {
    pub token: Piece,
    pub logprob: f32,
    pub top: Vec<(Piece, f32)>,
}

/// A request's end: why, and its figures.
#[derive(Clone, Debug)]
pub struct Done {
    pub finish_reason: &'static str,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Speculative figures, when the request had a drafter.
    pub speculative: Option<SpecStats>,
}

/// A queued request.
pub struct Job {
    pub request: GenRequest,
    pub out: mpsc::UnboundedSender<Output>,
    pub queued: Instant,
}

/// A running request besides its sequence: its text stream, where to send.
struct Running<'t> {
    text: TextStream<'t>,
    out: mpsc::UnboundedSender<Output>,
    deadline: Instant,
    queued: Instant,
    first_token: bool,
    /// A stop string ended the text.
    stopped: bool,
    timed_out: bool,
    failed: bool,
    /// Log-probabilities of tokens whose text is not sent yet.
    scored: Vec<Scored>,
    /// The prompt prefix a cached memory already held (not run again), when
    /// the request may reuse and leave its memory (see `Worker::start`).
    reused: Option<Vec<u32>>,
}

pub struct Worker<B: Backend> {
    pub decoder: Arc<Decoder<B>>,
    pub tokenizer: Arc<Tokenizer>,
    pub drafter: SharedDrafter<B>,
    pub policy: PolicyConfig,
    pub parallel: usize,
    pub timeout: Duration,
    pub metrics: Arc<Metrics>,
}

impl<B: Backend> Worker<B> {
    /// Runs until the queue is closed and every request has finished.
    pub fn run(self, mut queue: mpsc::Receiver<Job>) {
        let tokenizer = self.tokenizer.clone();
        let mut engine = Engine::new(self.decoder.clone());
        // Parallel vectors: the engine steps a slice of sequences.
        let mut seqs: Vec<Sequence<'static, B>> = Vec::new();
        let mut running: Vec<Running<'_>> = Vec::new();
        let mut cache: Vec<CachedPrefix<B>> = Vec::new();
        let mut open = true;
        loop {
            while open && seqs.len() < self.parallel {
                let job = if seqs.is_empty() {
                    queue.blocking_recv()
                } else {
                    match queue.try_recv() {
                        Ok(job) => Some(job),
                        Err(mpsc::error::TryRecvError::Empty) => break,
                        Err(mpsc::error::TryRecvError::Disconnected) => None,
                    }
                };
                let Some(job) = job else {
                    open = false;
                    break;
                };
                self.metrics.dequeued();
                if job.out.is_closed() {
                    self.metrics.cancelled();
                    continue;
                }
                match self.start(job, &tokenizer, &mut cache) {
                    Ok((seq, r)) => {
                        seqs.push(seq);
                        running.push(r);
                    }
                    Err((out, e)) => {
                        self.metrics.failed();
                        let _ = out.send(Output::Failed(e));
                    }
                }
            }
            if seqs.is_empty() {
                if open {
                    continue;
                }
                return;
            }
            self.metrics.set_running(seqs.len());
            self.step(&mut engine, &mut seqs, &mut running);
            let mut i = 0;
            while i < seqs.len() {
                if seqs[i].is_finished() || running[i].failed || running[i].out.is_closed() {
                    let seq = seqs.swap_remove(i);
                    let r = running.swap_remove(i);
                    self.finish(seq, r, &mut cache);
                } else {
                    i += 1;
                }
            }
            self.metrics.set_running(seqs.len());
        }
    }

    #[allow(clippy::type_complexity)]
    /// A sequence for `job`. Without a drafter and without penalties, on a
    /// backend whose rows do not depend on how a sequence is split into
    /// passes (the CPU), it may start from a cached memory holding a prefix
    /// of its prompt and run only the rest: the same tokens, sooner. (A
    /// drafter's context and a penalty's history would need the prefix
    /// too.)
    #[allow(clippy::type_complexity)]
    fn start<'t>(
        &self,
        job: Job,
        tokenizer: &'t Tokenizer,
        cache: &mut Vec<CachedPrefix<B>>,
    ) -> Result<(Sequence<'static, B>, Running<'t>), (mpsc::UnboundedSender<Output>, String)> {
        let req = job.request;
        let n_ctx = req.prompt.len() + req.max_tokens;
        let fail = |e: String| (job.out.clone(), e);
        let drafter = match req.speculative {
            Some(false) => None,
            _ => (self.drafter)
                .for_sequence(self.decoder.config.n_vocab, n_ctx, MAX_BATCH)
                .map_err(|e| fail(e.to_string()))?,
        };
        let p = &req.sampling;
        let reusable = drafter.is_none()
            && p.repeat_penalty == 1.0
            && p.presence_penalty == 0.0
            && p.frequency_penalty == 0.0
            && self.decoder.backend.host_memory();
        let cached = match reusable {
            true => reuse_prefix(cache, &req.prompt, n_ctx),
            false => None,
        };
        let (state, skip) = match cached {
            Some(c) => c,
            None => (
                self.decoder
                    .try_new_state(n_ctx, MAX_BATCH)
                    .map_err(|e| fail(format!("cannot allocate the request's memory: {e}")))?,
                0,
            ),
        };
        let eog = self.tokenizer.clone();
        let mut seq = Sequence::new(
            Held::owned(state),
            &req.prompt[skip..],
            req.max_tokens,
            Held::owned(Sampler::new(req.sampling.clone())),
            move |t| eog.is_eog(t),
        );
        if let Some(top) = req.logprobs {
            seq = seq.with_logprobs(top);
        }
        if let Some(drafter) = drafter {
            seq = seq.with_drafter(
                Held::Owned(drafter),
                Held::owned(DraftPolicy::new(self.policy)),
            );
        }
        let running = Running {
            text: TextStream::new(tokenizer, req.stop),
            out: job.out,
            deadline: Instant::now() + self.timeout,
            queued: job.queued,
            first_token: false,
            stopped: false,
            timed_out: false,
            failed: false,
            scored: Vec::new(),
            reused: reusable.then(|| req.prompt[..skip].to_vec()),
        };
        Ok((seq, running))
    }

    /// One engine step for every running request; tokens become text.
    fn step(
        &self,
        engine: &mut Engine<B>,
        seqs: &mut [Sequence<'static, B>],
        running: &mut [Running<'_>],
    ) {
        let events = match pollster::block_on(engine.step(seqs)) {
            Ok(events) => events,
            Err(e) => {
                // A batched pass failed: every request in it is lost.
                for r in running.iter_mut() {
                    r.failed = true;
                    let _ = r
                        .out
                        .send(Output::Failed(format!("generation failed: {e}")));
                }
                return;
            }
        };
        for (i, event) in events {
            let r = &mut running[i];
            match event {
                Event::Token(t) if !r.stopped && !r.failed => {
                    if !r.first_token {
                        r.first_token = true;
                        self.metrics.first_token(r.queued.elapsed());
                    }
                    match r.text.push(t) {
                        Ok((text, hit)) => {
                            if !text.is_empty() {
                                let scored = std::mem::take(&mut r.scored);
                                let _ = r.out.send(Output::Text(text, scored));
                            }
                            r.stopped = hit;
                        }
                        Err(e) => {
                            r.failed = true;
                            let _ = r
                                .out
                                .send(Output::Failed(format!("cannot decode token {t}: {e}")));
                        }
                    }
                }
                Event::Failed(e) => {
                    r.failed = true;
                    let _ = r
                        .out
                        .send(Output::Failed(format!("generation failed: {e}")));
                }
                Event::Logprobs(lp) if !r.stopped && !r.failed => {
                    let tk = &*self.tokenizer;
                    r.scored.push(Scored {
                        token: Piece::of(tk, lp.token),
                        logprob: lp.logprob,
                        top: lp
                            .top
                            .iter()
                            .map(|&(id, l)| (Piece::of(tk, id), l))
                            .collect(),
                    });
                }
                Event::Token(_) | Event::Logprobs(_) | Event::Round(_) | Event::Finished(_) => {}
            }
        }
        let now = Instant::now();
        for (seq, r) in seqs.iter_mut().zip(running.iter_mut()) {
            if !seq.is_finished() && now >= r.deadline {
                r.timed_out = true;
            }
            if r.stopped || r.timed_out {
                seq.stop();
            }
        }
    }

    /// Sends a request that left the engine its last text and figures.
    fn finish(
        &self,
        seq: Sequence<'static, B>,
        mut r: Running<'_>,
        cache: &mut Vec<CachedPrefix<B>>,
    ) {
        if r.failed {
            self.metrics.failed();
            return;
        }
        if !seq.is_finished() {
            // The client went away.
            self.metrics.cancelled();
            return;
        }
        if !r.stopped {
            let tail = r.text.finish();
            if !tail.is_empty() || !r.scored.is_empty() {
                let _ = r
                    .out
                    .send(Output::Text(tail, std::mem::take(&mut r.scored)));
            }
        }
        let finish_reason = match seq.finish_reason() {
            _ if r.stopped => "stop",
            Some(StopReason::EndOfGeneration) => "stop",
            _ => "length",
        };
        let stats = seq.stats().clone();
        let completion_tokens = seq.tokens().len();
        let reused = r.reused.take();
        let n_reused = reused.as_ref().map_or(0, Vec::len);
        self.metrics
            .finished(&stats, n_reused, completion_tokens, r.queued.elapsed());
        let done = Done {
            finish_reason,
            prompt_tokens: stats.prompt_tokens + n_reused,
            completion_tokens,
            speculative: (!stats.drafter.is_empty()).then_some(stats),
        };
        let _ = r.out.send(Output::Done(done));
        // Keep its memory for a later prompt that starts the same way: at
        // most one per sequence slot, the oldest dropped first.
        if let (Some(mut tokens), (Held::Owned(state), history)) = (reused, seq.into_memory()) {
            tokens.extend(history);
            if cache.len() >= self.parallel {
                cache.remove(0);
            }
            cache.push(CachedPrefix {
                tokens,
                state: *state,
            });
        }
    }
}
