//! `blockdraft run`: streamed generation.

use super::median;
use crate::args::{at_least, f32_in, PenaltyArgs};
use crate::drafter::DraftArgs;
use crate::load::{with_backend, Job, Loaded, ModelArgs};
use anyhow::{bail, Context, Result};
use blockdraft_core::backend::prelude::*;
use blockdraft_core::chat_template::ContentTokens;
use blockdraft_core::generate::{ends_in_a_loop, generate, TextStream};
use blockdraft_core::sampling::limits;
use blockdraft_core::sampling::{Sampler, SamplingParams};
use blockdraft_core::speculative::{generate_speculative, DraftPolicy, SharedDrafter};
use blockdraft_core::ModelError;
use serde_json::json;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt (the user message with --chat).
    #[arg(short = 'p', long = "prompt")]
    pub prompt: String,
    /// Maximum number of tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128, value_parser = at_least(1))]
    pub n_predict: usize,
    /// Sampling temperature, 0..=2; 0 is greedy.
    #[arg(long = "temp", default_value_t = 0.8, value_parser = f32_in(limits::TEMPERATURE))]
    pub temperature: f32,
    /// Sample among the k likeliest tokens; 0 disables.
    #[arg(long = "top-k", default_value_t = 40, value_parser = at_least(0))]
    pub top_k: usize,
    /// Nucleus sampling, 0..=1; 1 disables.
    #[arg(long = "top-p", default_value_t = 0.95, value_parser = f32_in(limits::TOP_P))]
    pub top_p: f32,
    /// Drop tokens less likely than this fraction of the likeliest, 0..=1.
    #[arg(long = "min-p", default_value_t = 0.05, value_parser = f32_in(limits::MIN_P))]
    pub min_p: f32,
    #[command(flatten)]
    pub penalties: PenaltyArgs,
    /// RNG seed (default: from the clock; printed in --json stats).
    #[arg(long = "seed")]
    pub seed: Option<u64>,
    /// Stop when this string is generated (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Wrap the prompt with the model's chat template.
    #[arg(long = "chat")]
    pub chat: bool,
    /// System message for --chat.
    #[arg(long = "system", requires = "chat")]
    pub system: Option<String>,
    /// With --chat, parse special-token text (`<|im_end|>`...) in --prompt
    /// and --system as special tokens. By default it stays plain text and
    /// only the chat template's own markers are special: use this only for
    /// trusted, pre-formatted text.
    #[arg(long = "chat-special", requires = "chat")]
    pub chat_special: bool,
    /// Context size in tokens (default: prompt + n-predict; never beyond
    /// the model's trained context).
    #[arg(short = 'c', long = "ctx-size", value_parser = at_least(1))]
    pub ctx_size: Option<usize>,
    /// Print one JSON object with tokens, text and statistics instead of streaming.
    #[arg(long = "json")]
    pub json: bool,
    #[command(flatten)]
    pub draft: DraftArgs,
    /// With --draft, also run plain decoding and report the speedup.
    #[arg(long = "compare", requires = "draft")]
    pub compare: bool,
    /// With --compare, decode this many times each way, alternating which
    /// goes first, and compare the medians (short outputs take a fraction
    /// of a second, where one timing is mostly noise).
    #[arg(long = "compare-runs", default_value_t = 1, requires = "compare",
          value_parser = clap::value_parser!(u16).range(1..=20))]
    pub compare_runs: u16,
}

pub fn run(args: Args) -> Result<()> {
    // Each number is range-checked as clap parses it; what is left are the
    // combinations.
    args.draft.check()?;
    let model = args.model.clone();
    with_backend(&model, args)
}

impl Job for Args {
    fn run<B: Backend>(self, loaded: Loaded<B>) -> Result<()> {
        generate_text(self, loaded)
    }
}

fn generate_text<B: Backend>(args: Args, loaded: Loaded<B>) -> Result<()> {
    let tok = &loaded.tokenizer;
    let prompt = if args.chat {
        let template = crate::chat::template(&loaded.file)?;
        let content = if args.chat_special {
            ContentTokens::ParseSpecial
        } else {
            ContentTokens::Plain
        };
        crate::chat::user_turn_tokens(
            &template,
            tok,
            args.system.as_deref(),
            &args.prompt,
            content,
        )?
    } else {
        tok.encode(&args.prompt, true, true)?
    };
    if prompt.is_empty() {
        bail!("the prompt tokenizes to nothing");
    }
    let cfg = &loaded.decoder.config;
    let needed = prompt.len() + args.n_predict;
    let n_ctx = match (cfg.context_size(needed, args.ctx_size), args.ctx_size) {
        (Ok(n), _) => n,
        (Err(e @ ModelError::ContextTooLong { .. }), Some(c)) => {
            return Err(anyhow::Error::new(e).context(format!("--ctx-size {c}")))
        }
        (Err(e), _) => {
            return Err(anyhow::Error::new(e).context(format!(
                "prompt ({} tokens) + --n-predict ({})",
                prompt.len(),
                args.n_predict
            )))
        }
    };
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let params = args.penalties.apply(SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        seed,
        ..SamplingParams::default()
    });
    // Loaded and warmed up once: every timed run gets a fresh sequence.
    let drafter = match &args.draft.draft {
        Some(_) => Some(crate::drafter::shared(&args.draft, &loaded)?),
        None => None,
    };
    let spec = match &drafter {
        Some(d) => Some(decode(
            &loaded,
            &args,
            &prompt,
            n_ctx,
            &params,
            Some(d),
            !args.json,
        )?),
        None => None,
    };
    let plain = if spec.is_none() || args.compare {
        Some(decode(
            &loaded,
            &args,
            &prompt,
            n_ctx,
            &params,
            None,
            spec.is_none() && !args.json,
        )?)
    } else {
        None
    };
    // Further timings of both, alternating which goes first; their outputs
    // are the first runs' (greedy or seeded: the same tokens).
    let (mut spec_tps, mut plain_tps) = (Vec::new(), Vec::new());
    if let (Some(s), Some(p)) = (&spec, &plain) {
        spec_tps.push(s.decode_tps);
        plain_tps.push(p.decode_tps);
        for i in 1..args.compare_runs {
            let draft = drafter.as_ref();
            let time = |d| decode(&loaded, &args, &prompt, n_ctx, &params, d, false);
            if i % 2 == 1 {
                plain_tps.push(time(None)?.decode_tps);
                spec_tps.push(time(draft)?.decode_tps);
            } else {
                spec_tps.push(time(draft)?.decode_tps);
                plain_tps.push(time(None)?.decode_tps);
            }
        }
    }
    let main = spec.as_ref().or(plain.as_ref()).expect("one of them ran");
    // Small models loop without a repeat penalty: said, not guessed at.
    let looping = ends_in_a_loop(&main.tokens);
    if args.json {
        let mut stats = main.stats.clone();
        stats["seed"] = json!(seed);
        stats["backend"] = json!(loaded.decoder.backend_name());
        stats["load_seconds"] = json!(loaded.load_seconds);
        stats["warmup_seconds"] = json!(loaded.warmup_seconds);
        stats["looping"] = json!(looping);
        if let (Some(s), Some(p)) = (&spec, &plain) {
            let (catch_up, probing) = s.losses(p);
            stats["compare"] = json!({
                "runs": spec_tps.len(),
                "plain_decode_tokens_per_second": median(&plain_tps),
                "speculative_decode_tokens_per_second": median(&spec_tps),
                "speedup": median(&spec_tps) / median(&plain_tps),
                "catch_up_seconds": catch_up,
                "probe_loss_seconds": probing,
                "identical_output": s.tokens == p.tokens,
            });
        }
        let obj = json!({"prompt_tokens": prompt, "tokens": main.tokens, "text": main.text, "stats": stats});
        crate::out::println(obj)?;
    } else {
        crate::out::println("")?;
        eprintln!(
            "\n[loaded in {:.2} s + warm-up {:.2} s; {}]",
            loaded.load_seconds, loaded.warmup_seconds, main.summary
        );
        if looping {
            eprintln!("[the output ends in a loop; --repeat-penalty 1.1 usually prevents it]");
        }
        if let (Some(s), Some(p)) = (&spec, &plain) {
            let (catch_up, probing) = s.losses(p);
            eprintln!(
                "[compare{}: plain {:.2} tok/s, speculative {:.2} tok/s, speedup {:.2}x; lost to catch-up {:.1} ms, to probes {:.1} ms; output {}]",
                if spec_tps.len() > 1 {
                    format!(" (medians of {})", spec_tps.len())
                } else {
                    String::new()
                },
                median(&plain_tps),
                median(&spec_tps),
                median(&spec_tps) / median(&plain_tps),
                catch_up * 1e3,
                probing * 1e3,
                if s.tokens == p.tokens {
                    "identical"
                } else {
                    "different"
                }
            );
        }
    }
    Ok(())
}

/// What one decoding run produced.
struct Outcome {
    tokens: Vec<u32>,
    text: String,
    decode_tps: f64,
    stats: serde_json::Value,
    summary: String,
}

impl Outcome {
    /// Of a speculative run beside the plain one: seconds of catch-up, and
    /// seconds its probes lost against the plain run's steps.
    fn losses(&self, plain: &Outcome) -> (f64, f64) {
        let get = |k: &str| self.stats[k].as_f64().unwrap_or(0.0);
        let plain_step = 1.0 / plain.decode_tps.max(1e-9);
        let probing = get("probe_seconds") - get("probe_tokens") * plain_step;
        (get("catch_up_seconds"), probing)
    }
}

/// Generates with `draft` (speculative) or without (plain), streaming the
/// text to stdout when `stream` is set.
fn decode<B: Backend>(
    loaded: &Loaded<B>,
    args: &Args,
    prompt: &[u32],
    n_ctx: usize,
    params: &SamplingParams,
    draft: Option<&SharedDrafter<B>>,
    stream: bool,
) -> Result<Outcome> {
    let tok = &loaded.tokenizer;
    let max_batch = 256;
    let mut state = loaded.decoder.try_new_state(n_ctx, max_batch)?;
    let mut sampler = Sampler::new(params.clone());
    let mut stream_text = TextStream::new(tok, args.stop.clone());
    let mut text = String::new();
    let mut failure: Option<anyhow::Error> = None;
    let mut on_token = |t: u32| {
        let (emit, stopped) = match stream_text.push(t) {
            Ok(p) => p,
            Err(e) => {
                failure = Some(e.into());
                return false;
            }
        };
        text.push_str(&emit);
        if stream {
            if let Err(e) = crate::out::print(&emit) {
                failure = Some(e);
                return false;
            }
        }
        !stopped
    };
    let is_eog = |t| tok.is_eog(t);
    let outcome = match draft {
        None => {
            let (tokens, reason, st) = pollster::block_on(generate(
                &loaded.decoder,
                &mut state,
                prompt,
                args.n_predict,
                &mut sampler,
                &is_eog,
                &mut on_token,
            ))?;
            let stats = json!({
                "prompt_tokens": st.prompt_tokens,
                "generated_tokens": st.generated_tokens,
                "prefill_seconds": st.prefill_seconds,
                "decode_seconds": st.decode_seconds,
                "prefill_tokens_per_second": st.prefill_tokens_per_second(),
                "decode_tokens_per_second": st.decode_tokens_per_second(),
                "stop_reason": reason.as_str(),
            });
            let summary = format!(
                "{} prompt tokens at {:.1} tok/s, {} generated at {:.1} tok/s, stop: {}",
                st.prompt_tokens,
                st.prefill_tokens_per_second(),
                st.generated_tokens,
                st.decode_tokens_per_second(),
                reason.as_str()
            );
            (tokens, st.decode_tokens_per_second(), stats, summary)
        }
        Some(shared) => {
            let mut drafter = shared
                .for_sequence(loaded.decoder.config.n_vocab, n_ctx, max_batch)?
                .context("no --draft given")?;
            let mut policy = DraftPolicy::new(args.draft.policy());
            let (tokens, reason, st) = pollster::block_on(generate_speculative(
                &loaded.decoder,
                &mut state,
                drafter.as_mut(),
                &mut policy,
                prompt,
                args.n_predict,
                &mut sampler,
                &is_eog,
                &mut on_token,
                &mut |_| {},
            ))?;
            let per_slot: Vec<f64> = st
                .slot_tried
                .iter()
                .zip(&st.slot_accepted)
                .map(|(&t, &a)| a as f64 / t.max(1) as f64)
                .collect();
            let stats = json!({
                "prompt_tokens": st.prompt_tokens,
                "generated_tokens": st.generated_tokens,
                "prefill_seconds": st.prefill_seconds,
                "decode_seconds": st.decode_seconds,
                "decode_tokens_per_second": st.decode_tokens_per_second(),
                "stop_reason": reason.as_str(),
                "drafter": st.drafter,
                "rounds": st.rounds,
                "plain_steps": st.plain_steps,
                "drafted": st.drafted,
                "accepted": st.accepted,
                "acceptance_rate": st.acceptance_rate(),
                "tau": st.tau(),
                "per_slot_acceptance": per_slot,
                "draft_seconds": st.draft_seconds,
                "verify_seconds": st.verify_seconds,
                "caught_up": st.caught_up,
                "catch_up_seconds": st.catch_up_seconds,
                "probes": st.probes,
                "probe_tokens": st.probe_tokens,
                "probe_seconds": st.probe_seconds,
            });
            let summary = format!(
                "{}: {} generated at {:.1} tok/s; {} rounds, {} plain steps, {}/{} drafts accepted, tau {:.2}, stop: {}",
                st.drafter,
                st.generated_tokens,
                st.decode_tokens_per_second(),
                st.rounds,
                st.plain_steps,
                st.accepted,
                st.drafted,
                st.tau(),
                reason.as_str()
            );
            (tokens, st.decode_tokens_per_second(), stats, summary)
        }
    };
    if let Some(e) = failure {
        return Err(e);
    }
    let tail = stream_text.finish();
    text.push_str(&tail);
    if stream {
        crate::out::print(&tail)?;
    }
    let (tokens, decode_tps, stats, summary) = outcome;
    Ok(Outcome {
        tokens,
        text,
        decode_tps,
        stats,
        summary,
    })
}
