//! `blockdraft gen-data`: drafter training data from the target itself.
//!
//! Each prompt is rendered with the model's chat template (exactly as
//! `run --chat` does; special-token text in a prompt stays plain text), the
//! target answers greedily, and the hidden states a
//! drafter reads (the taps) are captured during that same generation, so no
//! second pass is needed. Output: `shard.rs`'s format. A rerun of an
//! interrupted run keeps the finished shards and makes the missing ones.

mod parallel;
mod replay;
mod shard;

use crate::args::at_least;
use crate::load::{with_backend, Job, Loaded, ModelArgs};
use anyhow::{bail, ensure, Context, Result};
use blockdraft_core::backend::prelude::*;
use blockdraft_core::chat_template::ContentTokens;
use blockdraft_core::model::{Decoder, DecoderState, LogitRows, Taps};
use half::f16;
use indicatif::{ProgressBar, ProgressStyle};
use parallel::Generator;
use replay::{read_replay, replayed, ReplayStats};
use shard::{check_shard, fnv1a, shard_path, Manifest, Sequence, ShardBuilder, FORMAT};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// JSON Lines file, one `{"prompt": "..."}` object per line (the user turn).
    #[arg(long = "prompts")]
    pub prompts: PathBuf,
    /// Output directory (created; resumed when it holds a matching run).
    #[arg(short = 'o', long = "out")]
    pub out: PathBuf,
    /// GGUF tap layers the drafter reads, comma-separated (HF layer id + 1;
    /// the number of layers means the last block's output).
    #[arg(long = "taps", value_delimiter = ',', required = true)]
    pub taps: Vec<usize>,
    /// Most response tokens per prompt.
    #[arg(short = 'n', long = "n-predict", default_value_t = 384, value_parser = at_least(1))]
    pub n_predict: usize,
    /// Prompts longer than this (in tokens, template included) are skipped.
    #[arg(long = "max-prompt-tokens", default_value_t = 512, value_parser = at_least(1))]
    pub max_prompt_tokens: usize,
    /// Prompts per shard: what an interruption can lose at most.
    #[arg(long = "shard-size", default_value_t = 16, value_parser = at_least(1))]
    pub shard_size: usize,
    /// System message for every prompt.
    #[arg(long = "system")]
    pub system: Option<String>,
    /// Stop after this many prompts of the file (default: all).
    #[arg(long = "limit", value_parser = at_least(1))]
    pub limit: Option<usize>,
    /// Take the responses from this sequences file (JSON Lines, as
    /// `training/sequences.py` exports from gen-data output) instead of
    /// generating them: their taps are captured by forward passes over the
    /// whole sequence (about twice generation's speed). Each sequence's prompt
    /// must be this run's rendering of its prompt, and its response this
    /// target's greedy choice; prompts the file lacks are generated.
    #[arg(long = "replay")]
    pub replay: Option<PathBuf>,
    /// Sequences generated together, one batched pass per token for all of
    /// them (each weight read once for all): several times the throughput
    /// of one at a time on a CPU, with the same answers and taps.
    #[arg(long = "parallel", default_value_t = 8, value_parser = at_least(1))]
    pub parallel: usize,
}

pub fn run(args: Args) -> Result<()> {
    let model = args.model.clone();
    with_backend(&model, args)
}

impl Job for Args {
    fn run<B: Backend>(self, loaded: Loaded<B>) -> Result<()> {
        generate_data(self, loaded)
    }
}

#[derive(serde::Deserialize)]
struct PromptLine {
    prompt: String,
}

fn read_prompts(path: &Path, limit: Option<usize>) -> Result<(Vec<String>, String)> {
    let raw = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let text =
        std::str::from_utf8(&raw).with_context(|| format!("{} is not UTF-8", path.display()))?;
    let mut prompts = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let p: PromptLine = serde_json::from_str(line).with_context(|| {
            format!(
                "{} line {}: expected {{\"prompt\": \"...\"}}",
                path.display(),
                i + 1
            )
        })?;
        prompts.push(p.prompt);
    }
    if let Some(n) = limit {
        prompts.truncate(n);
    }
    ensure!(!prompts.is_empty(), "{} holds no prompts", path.display());
    Ok((prompts, fnv1a(&raw)))
}

fn generate_data<B: Backend>(args: Args, loaded: Loaded<B>) -> Result<()> {
    let dec = &loaded.decoder;
    let cfg = &dec.config;
    if let Some(&l) = args.taps.iter().find(|&&l| l > cfg.n_layer) {
        bail!(
            "tap layer {l} is beyond the model's {} layers (taps are GGUF block inputs, 0..={})",
            cfg.n_layer,
            cfg.n_layer
        );
    }
    let n_ctx = cfg
        .context_size(args.max_prompt_tokens + args.n_predict + 1, None)
        .context("--max-prompt-tokens + --n-predict")?;
    let md = loaded.file.metadata();
    let template_src = md
        .get_str("tokenizer.chat_template")
        .context("the model has no chat template; gen-data needs one")?;
    let template = crate::chat::template(&loaded.file)?;
    let (prompts, prompts_hash) = read_prompts(&args.prompts, args.limit)?;
    let manifest = Manifest {
        format: FORMAT.into(),
        model_name: md.get_str("general.name").unwrap_or("").to_string(),
        architecture: md.get_str("general.architecture")?.to_string(),
        n_layer: cfg.n_layer,
        n_embd: cfg.n_embd,
        n_vocab: cfg.n_vocab,
        tap_layers: args.taps.clone(),
        template_hash: fnv1a(template_src.as_bytes()),
        system: args.system.clone(),
        prompts_hash,
        n_prompts: prompts.len(),
        shard_size: args.shard_size,
        max_new_tokens: args.n_predict,
        max_prompt_tokens: args.max_prompt_tokens,
        kv_type: loaded.decoder.kv_type().name().into(),
    };
    let manifest_path = args.out.join("manifest.json");
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    if manifest_path.exists() {
        let stored: Manifest = serde_json::from_slice(&std::fs::read(&manifest_path)?)
            .with_context(|| format!("{} is not a gen-data manifest", manifest_path.display()))?;
        manifest.check_resumable(&stored, &args.out)?;
    } else {
        std::fs::write(&manifest_path, serde_json::to_string_pretty(&manifest)?)?;
    }

    // Shards already written are kept (and checked); the missing ones are
    // generated.
    let n_shards = manifest.n_shards();
    let mut done = Vec::new();
    for k in 0..n_shards {
        let path = shard_path(&args.out, k);
        if path.exists() {
            done.push(check_shard(&path, &manifest)?);
        }
    }
    let done_prompts = (done.len() * args.shard_size).min(prompts.len());
    let bar = ProgressBar::new(prompts.len() as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:40} {pos}/{len} prompts, {msg} [{elapsed_precise}, ETA {eta_precise}]",
        )
        .expect("static template"),
    );
    bar.set_position(done_prompts as u64);
    if !done.is_empty() {
        eprintln!(
            "resuming: {} of {n_shards} shards present ({} response tokens)",
            done.len(),
            done.iter().map(|s| s.response_tokens).sum::<usize>()
        );
    }

    let replay = match &args.replay {
        Some(path) => read_replay(path, &manifest)?,
        None => HashMap::new(),
    };
    let mut replay_stats = ReplayStats::default();
    let mut replay_state = None;
    let mut generator = Generator::new(&loaded, &args.taps, args.parallel, n_ctx, args.n_predict)?;
    let started = Instant::now();
    let mut new_tokens = 0usize;
    let mut skipped = 0usize;
    // Sequences of the shards being made, by shard, until each is whole.
    let mut open: BTreeMap<usize, Vec<Option<Sequence>>> = BTreeMap::new();
    let todo: Vec<usize> = (0..prompts.len())
        .filter(|&i| !shard_path(&args.out, i / args.shard_size).exists())
        .collect();
    let mut resolve = |i: usize, seq: Option<Sequence>, stats: &ReplayStats| -> Result<()> {
        let k = i / args.shard_size;
        let range = k * args.shard_size..((k + 1) * args.shard_size).min(prompts.len());
        let entries = open.entry(k).or_default();
        if let Some(seq) = &seq {
            new_tokens += seq.ids.len() - seq.prompt_len;
        } else {
            skipped += 1;
        }
        entries.push(seq);
        bar.inc(1);
        let secs = started.elapsed().as_secs_f64().max(1e-9);
        bar.set_message(format!(
            "{new_tokens} response tokens, {:.1} tok/s, {skipped} skipped",
            new_tokens as f64 / secs
        ));
        if entries.len() < range.len() {
            return Ok(());
        }
        if let Some(replay) = &args.replay {
            stats.check(replay)?;
        }
        let mut seqs: Vec<Sequence> = open.remove(&k).into_iter().flatten().flatten().collect();
        seqs.sort_by_key(|s| s.prompt_index);
        let mut shard = ShardBuilder::default();
        for seq in seqs {
            shard.push(seq);
        }
        let path = shard_path(&args.out, k);
        shard.write(&path, &manifest)?;
        if bar.is_hidden() {
            // No terminal (a log file): one line per shard instead of the bar.
            eprintln!(
                "{}: {}/{} prompts, {}",
                path.display(),
                bar.position(),
                prompts.len(),
                bar.message()
            );
        }
        Ok(())
    };
    for i in todo {
        let ids = crate::chat::user_turn_tokens(
            &template,
            &loaded.tokenizer,
            args.system.as_deref(),
            &prompts[i],
            ContentTokens::Plain,
        )
        .with_context(|| format!("prompt {} (line {})", i, i + 1))?;
        if ids.len() > args.max_prompt_tokens {
            resolve(i, None, &replay_stats)?;
        } else if let Some(r) = replay.get(&i) {
            let path = args.replay.as_ref().expect("replaying").display();
            ensure!(
                r.ids.len() <= n_ctx,
                "{path}: the sequence of prompt {i} has {} tokens, beyond this run's \
                 --max-prompt-tokens + --n-predict",
                r.ids.len()
            );
            ensure!(
                r.ids[..r.prompt_len] == ids[..],
                "{path}: the sequence of prompt {i} does not start with this run's rendering \
                 of the prompt (another prompts file, system message or chat template?)"
            );
            let (state, taps) = match &mut replay_state {
                Some(st) => st,
                None => replay_state.insert((
                    dec.try_new_state(n_ctx, 64)?,
                    Taps::new(&*dec.backend, cfg, &args.taps, 64)?,
                )),
            };
            state.truncate(0)?;
            let seq = replayed(&loaded, state, taps, i, r, &mut replay_stats)?;
            resolve(i, Some(seq), &replay_stats)?;
        } else {
            while !generator.has_room() {
                for seq in generator.step()? {
                    resolve(seq.prompt_index, Some(seq), &replay_stats)?;
                }
            }
            generator.start(i, ids)?;
        }
    }
    while !generator.is_idle() {
        for seq in generator.step()? {
            resolve(seq.prompt_index, Some(seq), &replay_stats)?;
        }
    }
    bar.finish();
    if args.replay.is_some() {
        eprintln!(
            "replayed {} response tokens; {} differ from this target's greedy choice",
            replay_stats.tokens, replay_stats.differing
        );
    }
    let all: Vec<_> = (0..n_shards)
        .map(|k| check_shard(&shard_path(&args.out, k), &manifest))
        .collect::<Result<_>>()?;
    eprintln!(
        "{}: {} shards, {} sequences, {} tokens ({} response)",
        args.out.display(),
        all.len(),
        all.iter().map(|s| s.sequences).sum::<usize>(),
        all.iter().map(|s| s.tokens).sum::<usize>(),
        all.iter().map(|s| s.response_tokens).sum::<usize>()
    );
    Ok(())
}

/// One forward pass over `tokens`, its taps appended to `rows` (f16).
fn forward_capturing<B: Backend>(
    dec: &Decoder<B>,
    state: &mut DecoderState<B>,
    tokens: &[u32],
    logits: LogitRows,
    taps: &mut Taps<B>,
    rows: &mut Vec<f16>,
) -> Result<()> {
    dec.forward(state, tokens, logits, true, Some(&mut *taps))?;
    let captured = pollster::block_on(dec.backend.read(taps.output()));
    rows.extend(captured.iter().map(|&v| f16::from_f32(v)));
    Ok(())
}
