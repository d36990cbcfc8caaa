//! `blockdraft bench`: prefill and decode speed (medians of repetitions,
//! like llama-bench), the verify cost curve T(k)/T(1), memory bandwidth
//! achieved and peak RSS.

use crate::load::{load, ModelArgs};
use anyhow::{bail, Result};
use blockdraft_core::model::{Decoder, DecoderState, LogitRows};
use blockdraft_core::sampling::Rng;
use blockdraft_core::Backend;
use blockdraft_cpu::CpuBackend;
use serde_json::json;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens to prefill (0 skips prefill).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    pub n_prompt: usize,
    /// Tokens to decode (0 skips decode).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    pub n_gen: usize,
    /// Repetitions; the median is reported.
    #[arg(short = 'r', long = "repetitions", default_value_t = 3)]
    pub reps: usize,
    /// Largest verify batch of the T(k)/T(1) curve (0 skips it).
    #[arg(long = "verify-max", default_value_t = 16)]
    pub verify_max: usize,
    /// Context length before each verify batch.
    #[arg(long = "verify-ctx", default_value_t = 64)]
    pub verify_ctx: usize,
    #[arg(long = "json")]
    pub json: bool,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn random_tokens(n: usize, n_vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| (rng.next_u64() % n_vocab as u64) as u32)
        .collect()
}

/// Peak resident set size in bytes (Linux), if known.
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Bytes of weights one decoded token reads: every matrix except the
/// embedding table (a one-row gather) — unless the head is tied to it.
fn weight_bytes_per_token(file: &blockdraft_gguf::GgufFile) -> u64 {
    let tied = file.tensor("output.weight").is_none();
    file.tensors()
        .iter()
        .filter(|t| t.dims.len() == 2 && (tied || t.name != "token_embd.weight"))
        .map(|t| t.n_bytes)
        .sum()
}

fn time_forward(
    dec: &Decoder<CpuBackend>,
    state: &mut DecoderState<CpuBackend>,
    tokens: &[u32],
    logits: LogitRows,
) -> Result<f64> {
    let t = Instant::now();
    for chunk in tokens.chunks(state.max_batch()) {
        dec.forward(state, chunk, logits, true, None)?;
    }
    dec.backend.argmax(state.logits());
    Ok(t.elapsed().as_secs_f64())
}

pub fn run(args: Args) -> Result<()> {
    if args.reps == 0 {
        bail!("--repetitions must be at least 1");
    }
    let loaded = load(&args.model)?;
    let dec = &loaded.decoder;
    let cfg = &dec.config;
    let n_ctx = (args.n_prompt.max(args.n_gen + 1))
        .max(args.verify_ctx + args.verify_max)
        .max(1);
    if n_ctx > cfg.n_ctx_train {
        bail!(
            "the benchmark needs {n_ctx} positions, the model was trained for {}",
            cfg.n_ctx_train
        );
    }
    let mut state = dec.new_state(n_ctx, 512);
    let tokens = random_tokens(n_ctx, cfg.n_vocab, 42);

    // Warm-up: page the weights in and spin up the pool.
    time_forward(dec, &mut state, &tokens[..1], LogitRows::Last)?;

    let mut prefill = Vec::new();
    let mut decode = Vec::new();
    for _ in 0..args.reps {
        if args.n_prompt > 0 {
            state.truncate(0);
            prefill.push(
                args.n_prompt as f64
                    / time_forward(dec, &mut state, &tokens[..args.n_prompt], LogitRows::Last)?,
            );
        }
        if args.n_gen > 0 {
            state.truncate(0);
            let t = Instant::now();
            let mut next = tokens[0];
            for _ in 0..args.n_gen {
                dec.forward(&mut state, &[next], LogitRows::Last, true, None)?;
                next = dec.backend.argmax(state.logits())[0];
            }
            decode.push(args.n_gen as f64 / t.elapsed().as_secs_f64());
        }
    }
    let prefill_tps = (!prefill.is_empty()).then(|| median(prefill));
    let decode_tps = (!decode.is_empty()).then(|| median(decode));

    let mut verify = Vec::new();
    if args.verify_max > 0 {
        state.truncate(0);
        time_forward(
            dec,
            &mut state,
            &tokens[..args.verify_ctx.max(1)],
            LogitRows::None,
        )?;
        let base = state.len();
        for k in 1..=args.verify_max.min(state.max_batch()) {
            let mut times = Vec::new();
            for _ in 0..args.reps.max(3) {
                times.push(time_forward(
                    dec,
                    &mut state,
                    &tokens[base..base + k],
                    LogitRows::All,
                )?);
                state.truncate(base);
            }
            verify.push((k, median(times)));
        }
    }
    let t1 = verify.first().map(|v| v.1);
    let bytes = weight_bytes_per_token(&loaded.file);
    let gbps = decode_tps.map(|t| t * bytes as f64 / 1e9);
    let rss = peak_rss();

    if args.json {
        let curve: Vec<_> = verify
            .iter()
            .map(|&(k, t)| json!({"k": k, "seconds": t, "ratio": t / t1.unwrap_or(t)}))
            .collect();
        println!(
            "{}",
            json!({
                "model": args.model.model.display().to_string(),
                "backend": dec.backend.name(),
                "threads": args.model.threads(),
                "n_prompt": args.n_prompt,
                "n_gen": args.n_gen,
                "repetitions": args.reps,
                "prefill_tokens_per_second": prefill_tps,
                "decode_tokens_per_second": decode_tps,
                "weight_bytes_per_token": bytes,
                "decode_gb_per_second": gbps,
                "verify": curve,
                "peak_rss_bytes": rss,
            })
        );
        return Ok(());
    }
    println!("model    {}", args.model.model.display());
    println!("backend  {}", dec.backend.name());
    if let Some(t) = prefill_tps {
        println!(
            "prefill  pp{:<5} {t:>9.2} tok/s (median of {})",
            args.n_prompt, args.reps
        );
    }
    if let Some(t) = decode_tps {
        println!(
            "decode   tg{:<5} {t:>9.2} tok/s (median of {})",
            args.n_gen, args.reps
        );
        println!(
            "weights  {:.1} MB/token -> {:.2} GB/s",
            bytes as f64 / 1e6,
            gbps.unwrap_or(0.0)
        );
    }
    if let Some(t1) = t1 {
        println!("verify   T(k)/T(1) at context {}:", args.verify_ctx);
        for (k, t) in &verify {
            println!("  k={k:<3} {:>8.2} ms  {:>5.2}x", t * 1e3, t / t1);
        }
    }
    if let Some(r) = rss {
        println!("peak RSS {:.1} MB", r as f64 / 1e6);
    }
    Ok(())
}
