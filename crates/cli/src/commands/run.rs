//! `blockdraft run`: streamed generation.

use crate::load::{load, ModelArgs};
use anyhow::{bail, Context, Result};
use blockdraft_core::chat_template::{ChatMessage, ChatTemplate};
use blockdraft_core::generate::{generate, StopStrings};
use blockdraft_core::sampling::{Sampler, SamplingParams};
use blockdraft_core::tokenizer::StreamDecoder;
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
    /// Context size in tokens (default: prompt + n-predict, at most the trained context).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,
    /// Print one JSON object with tokens, text and statistics instead of streaming.
    #[arg(long = "json")]
    pub json: bool,
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
    let loaded = load(&args.model)?;
    let tok = &loaded.tokenizer;
    let text = if args.chat {
        let template = ChatTemplate::from_gguf(&loaded.file)?.context(
            "the model has no chat template (tokenizer.chat_template); run without --chat",
        )?;
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(ChatMessage::new("system", system));
        }
        messages.push(ChatMessage::new("user", &args.prompt));
        template.render(&messages, true)?
    } else {
        args.prompt.clone()
    };
    let prompt = tok.encode(&text, true, true)?;
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
    let mut sampler = Sampler::new(SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repeat_penalty: args.repeat_penalty,
        repeat_last_n: args.repeat_last_n,
        seed,
    });
    let mut state = loaded.decoder.new_state(n_ctx, 256);
    let mut detok = StreamDecoder::new(tok);
    let mut stops = StopStrings::new(args.stop.clone());
    let mut text_out = String::new();
    let mut stdout = std::io::stdout().lock();
    let mut failure: Option<anyhow::Error> = None;
    let (tokens, reason, stats) = generate(
        &loaded.decoder,
        &mut state,
        &prompt,
        args.n_predict,
        &mut sampler,
        &|t| tok.is_eog(t),
        &mut |t| {
            let piece = match detok.push(t) {
                Ok(p) => p,
                Err(e) => {
                    failure = Some(e.into());
                    return false;
                }
            };
            let (emit, stopped) = stops.push(&piece);
            text_out.push_str(&emit);
            if !args.json {
                if let Err(e) = stdout
                    .write_all(emit.as_bytes())
                    .and_then(|_| stdout.flush())
                {
                    failure = Some(anyhow::Error::new(e).context("cannot write to stdout"));
                    return false;
                }
            }
            !stopped
        },
    )?;
    if let Some(e) = failure {
        return Err(e);
    }
    let tail = stops.push(&detok.finish()).0 + &stops.finish();
    text_out.push_str(&tail);
    if args.json {
        let obj = json!({
            "prompt_tokens": prompt,
            "tokens": tokens,
            "text": text_out,
            "stats": {
                "prompt_tokens": stats.prompt_tokens,
                "generated_tokens": stats.generated_tokens,
                "prefill_seconds": stats.prefill_seconds,
                "decode_seconds": stats.decode_seconds,
                "prefill_tokens_per_second": stats.prefill_tokens_per_second(),
                "decode_tokens_per_second": stats.decode_tokens_per_second(),
                "stop_reason": reason.as_str(),
                "seed": seed,
                "backend": loaded.decoder.backend_name(),
            }
        });
        writeln!(stdout, "{obj}")?;
    } else {
        writeln!(stdout, "{tail}")?;
        eprintln!(
            "\n[{} prompt tokens at {:.1} tok/s, {} generated at {:.1} tok/s, stop: {}]",
            stats.prompt_tokens,
            stats.prefill_tokens_per_second(),
            stats.generated_tokens,
            stats.decode_tokens_per_second(),
            reason.as_str()
        );
    }
    Ok(())
}
