//! `blockdraft run`: streamed generation.

use crate::drafter::DraftArgs;
use crate::load::{with_backend, Job, Loaded, ModelArgs};
use anyhow::{bail, Result};
use blockdraft_core::chat_template::ContentTokens;
use blockdraft_core::generate::{generate, StopStrings};
use blockdraft_core::sampling::{Sampler, SamplingParams};
use blockdraft_core::speculative::{generate_speculative, DraftPolicy};
use blockdraft_core::tokenizer::StreamDecoder;
use blockdraft_core::Backend;
use serde_json::json;
use std::io::Write;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt (the user message with --chat).
    #[arg(short = 'p', long = "prompt")]
    pub prompt: String,
    /// Maximum number of tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    pub n_predict: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temperature: f32,
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
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
    #[arg(long = "system")]
    pub system: Option<String>,
    /// With --chat, parse special-token text (`<|im_end|>`...) in --prompt
    /// and --system as special tokens. By default it stays plain text and
    /// only the chat template's own markers are special: use this only for
    /// trusted, pre-formatted text.
    #[arg(long = "chat-special", requires = "chat")]
    pub chat_special: bool,
    /// Context size in tokens (default: prompt + n-predict, at most the trained context).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,
    /// Print one JSON object with tokens, text and statistics instead of streaming.
    #[arg(long = "json")]
    pub json: bool,
    #[command(flatten)]
    pub draft: DraftArgs,
    /// With --draft, also run plain decoding and report the speedup.
    #[arg(long = "compare")]
    pub compare: bool,
}

pub fn run(args: Args) -> Result<()> {
    if !(args.temperature >= 0.0 && args.temperature.is_finite()) {
        bail!(
            "--temp must be a finite number >= 0, got {}",
            args.temperature
        );
    }
    if !(0.0..=1.0).contains(&args.top_p) || !(0.0..=1.0).contains(&args.min_p) {
        bail!("--top-p and --min-p must be within 0..=1");
    }
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
    let n_ctx = args.ctx_size.unwrap_or(needed.min(cfg.n_ctx_train));
    if needed > n_ctx {
        bail!(
            "prompt ({} tokens) + n-predict ({}) exceed the context size {n_ctx}",
            prompt.len(),
            args.n_predict
        );
    }
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let params = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repeat_penalty: args.repeat_penalty,
        repeat_last_n: args.repeat_last_n,
        seed,
    };
    if args.compare && args.draft.draft.is_none() {
        bail!("--compare needs --draft");
    }
    let spec = match &args.draft.draft {
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
    let main = spec.as_ref().or(plain.as_ref()).expect("one of them ran");
    let mut stdout = std::io::stdout().lock();
    if args.json {
        let mut stats = main.stats.clone();
        stats["seed"] = json!(seed);
        stats["backend"] = json!(loaded.decoder.backend_name());
        if let (Some(s), Some(p)) = (&spec, &plain) {
            stats["compare"] = json!({
                "plain_decode_tokens_per_second": p.decode_tps,
                "speculative_decode_tokens_per_second": s.decode_tps,
                "speedup": s.decode_tps / p.decode_tps,
                "identical_output": s.tokens == p.tokens,
            });
        }
        let obj = json!({"prompt_tokens": prompt, "tokens": main.tokens, "text": main.text, "stats": stats});
        writeln!(stdout, "{obj}")?;
    } else {
        writeln!(stdout)?;
        eprintln!("\n[{}]", main.summary);
        if let (Some(s), Some(p)) = (&spec, &plain) {
            eprintln!(
                "[compare: plain {:.2} tok/s, speculative {:.2} tok/s, speedup {:.2}x, output {}]",
                p.decode_tps,
                s.decode_tps,
                s.decode_tps / p.decode_tps,
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

/// Generates with `draft` (speculative) or without (plain), streaming the
/// text to stdout when `stream` is set.
fn decode<B: Backend>(
    loaded: &Loaded<B>,
    args: &Args,
    prompt: &[u32],
    n_ctx: usize,
    params: &SamplingParams,
    draft: Option<&str>,
    stream: bool,
) -> Result<Outcome> {
    let tok = &loaded.tokenizer;
    let max_batch = 256;
    let mut state = loaded.decoder.new_state(n_ctx, max_batch);
    let mut sampler = Sampler::new(params.clone());
    let mut detok = StreamDecoder::new(tok);
    let mut stops = StopStrings::new(args.stop.clone());
    let mut text = String::new();
    let mut stdout = std::io::stdout();
    let mut failure: Option<anyhow::Error> = None;
    let mut on_token = |t: u32| {
        let piece = match detok.push(t) {
            Ok(p) => p,
            Err(e) => {
                failure = Some(e.into());
                return false;
            }
        };
        let (emit, stopped) = stops.push(&piece);
        text.push_str(&emit);
        if stream {
            if let Err(e) = stdout
                .write_all(emit.as_bytes())
                .and_then(|_| stdout.flush())
            {
                failure = Some(anyhow::Error::new(e).context("cannot write to stdout"));
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
        Some(spec) => {
            let mut drafter = crate::drafter::build(spec, &args.draft, loaded, n_ctx, max_batch)?;
            let mut policy = DraftPolicy::new(args.draft.policy());
            let mut draft_sampler = Sampler::new(SamplingParams {
                seed: params.seed ^ 0x5eed_d4af,
                ..params.clone()
            });
            let (tokens, reason, st) = pollster::block_on(generate_speculative(
                &loaded.decoder,
                &mut state,
                drafter.as_mut(),
                &mut policy,
                prompt,
                args.n_predict,
                &mut sampler,
                &mut draft_sampler,
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
    let tail = stops.push(&detok.finish()).0 + &stops.finish();
    text.push_str(&tail);
    if stream {
        stdout.write_all(tail.as_bytes())?;
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
