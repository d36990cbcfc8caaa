//! `blockdraft gen-data`: drafter training data from the target itself.
//!
//! Each prompt is rendered with the model's chat template (exactly as
//! `run --chat` does; special-token text in a prompt stays plain text), the
//! target answers greedily, and the hidden states a
//! drafter reads (the taps) are captured during that same generation, so no
//! second pass is needed. Output: `shard.rs`'s format. A rerun of an
//! interrupted run keeps the finished shards and makes the missing ones.

mod shard;

use crate::args::at_least;
use crate::load::{with_backend, Job, Loaded, ModelArgs};
use anyhow::{bail, ensure, Context, Result};
use blockdraft_core::chat_template::ContentTokens;
use blockdraft_core::model::{Decoder, DecoderState, LogitRows, Taps};
use blockdraft_core::Backend;
use half::f16;
use indicatif::{ProgressBar, ProgressStyle};
use shard::{check_shard, fnv1a, shard_path, Manifest, Sequence, ShardBuilder, FORMAT};
use std::collections::HashMap;
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
    /// whole sequence, a fraction of decoding's cost. Each sequence's prompt
    /// must be this run's rendering of its prompt, and its response this
    /// target's greedy choice; prompts the file lacks are generated.
    #[arg(long = "replay")]
    pub replay: Option<PathBuf>,
}

/// One sequence of a `--replay` file.
#[derive(serde::Deserialize)]
struct Replayed {
    prompt_index: usize,
    prompt_len: usize,
    finished: bool,
    ids: Vec<u32>,
}

/// The first line of a `--replay` file: the manifest of the data it came from.
#[derive(serde::Deserialize)]
struct ReplayHeader {
    manifest: serde_json::Value,
}

/// The sequences of a `--replay` file, by prompt index, after checking that
/// they were made from this model, chat template, system message and prompts
/// file (the taps and limits may differ: that is what a replay is for).
fn read_replay(path: &Path, manifest: &Manifest) -> Result<HashMap<usize, Replayed>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read {} as UTF-8 text", path.display()))?;
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let header: ReplayHeader = lines
        .next()
        .and_then(|(_, l)| serde_json::from_str(l).ok())
        .with_context(|| {
            format!(
                "{}: the first line is not {{\"manifest\": ...}} (make the file with training/sequences.py)",
                path.display()
            )
        })?;
    let ours = serde_json::to_value(manifest)?;
    for key in [
        "model_name",
        "architecture",
        "n_vocab",
        "template_hash",
        "system",
        "prompts_hash",
    ] {
        if header.manifest.get(key) != ours.get(key) {
            bail!(
                "{} was made with {key} = {}, this run has {key} = {}",
                path.display(),
                header
                    .manifest
                    .get(key)
                    .map_or("nothing".into(), |v| v.to_string()),
                ours[key]
            );
        }
    }
    let mut out = HashMap::new();
    for (i, line) in lines {
        let r: Replayed = serde_json::from_str(line).with_context(|| {
            format!(
                "{} line {}: expected {{\"prompt_index\", \"prompt_len\", \"finished\", \"ids\"}}",
                path.display(),
                i + 1
            )
        })?;
        ensure!(
            r.prompt_len < r.ids.len() && r.ids.iter().all(|&t| (t as usize) < manifest.n_vocab),
            "{} line {}: no response after the prompt, or an id beyond the vocabulary",
            path.display(),
            i + 1
        );
        if out.insert(r.prompt_index, r).is_some() {
            bail!(
                "{} line {}: a second sequence for one prompt",
                path.display(),
                i + 1
            );
        }
    }
    Ok(out)
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
    let batch = 64;
    let mut state = dec.try_new_state(n_ctx, batch)?;
    let mut taps = Taps::new(&*dec.backend, cfg, &args.taps, batch)?;
    let started = Instant::now();
    let mut new_tokens = 0usize;
    let mut skipped = 0usize;
    for k in 0..n_shards {
        let path = shard_path(&args.out, k);
        if path.exists() {
            continue;
        }
        let mut shard = ShardBuilder::default();
        let range = k * args.shard_size..((k + 1) * args.shard_size).min(prompts.len());
        for i in range {
            let ids = crate::chat::user_turn_tokens(
                &template,
                &loaded.tokenizer,
                args.system.as_deref(),
                &prompts[i],
                ContentTokens::Plain,
            )
            .with_context(|| format!("prompt {} (line {})", i, i + 1))?;
            if ids.len() > args.max_prompt_tokens {
                skipped += 1;
            } else {
                state.truncate(0);
                let seq = match replay.get(&i) {
                    Some(r) => {
                        ensure!(
                            r.ids.len() <= n_ctx,
                            "{}: the sequence of prompt {i} has {} tokens, beyond this run's \
                             --max-prompt-tokens + --n-predict",
                            args.replay.as_ref().expect("replaying").display(),
                            r.ids.len()
                        );
                        ensure!(
                            r.ids[..r.prompt_len] == ids[..],
                            "{}: the sequence of prompt {i} does not start with this run's \
                             rendering of the prompt (another prompts file, system message or \
                             chat template?)",
                            args.replay.as_ref().expect("replaying").display()
                        );
                        replayed(&loaded, &mut state, &mut taps, i, r, &mut replay_stats)?
                    }
                    None => answer(&loaded, &mut state, &mut taps, i, ids, args.n_predict)?,
                };
                new_tokens += seq.ids.len() - seq.prompt_len;
                shard.push(seq);
            }
            bar.inc(1);
            let secs = started.elapsed().as_secs_f64().max(1e-9);
            bar.set_message(format!(
                "{new_tokens} response tokens, {:.1} tok/s, {skipped} skipped",
                new_tokens as f64 / secs
            ));
        }
        if let Some(replay) = &args.replay {
            replay_stats.check(replay)?;
        }
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

/// The target's greedy answer to `prompt`, with the taps of every position.
fn answer<B: Backend>(
    loaded: &Loaded<B>,
    state: &mut DecoderState<B>,
    taps: &mut Taps<B>,
    prompt_index: usize,
    mut ids: Vec<u32>,
    n_predict: usize,
) -> Result<Sequence> {
    let dec = &loaded.decoder;
    let be = &*dec.backend;
    let prompt_len = ids.len();
    let mut rows: Vec<f16> = Vec::new();
    let mut forward = |state: &mut DecoderState<B>, tokens: &[u32]| {
        forward_capturing(dec, state, tokens, LogitRows::Last, taps, &mut rows)
    };
    for chunk in ids.chunks(state.max_batch()) {
        forward(state, chunk)?;
    }
    let mut finished = false;
    for _ in 0..n_predict {
        let next = pollster::block_on(be.argmax(state.logits()))[0];
        ids.push(next);
        // The last token's taps are captured too, so row j of the taps is
        // always position j; the logits of that pass go unused.
        forward(state, &[next])?;
        if loaded.tokenizer.is_eog(next) {
            finished = true;
            break;
        }
    }
    Ok(Sequence {
        prompt_index,
        ids,
        prompt_len,
        finished,
        taps: rows,
    })
}

/// How far replayed responses follow this target's own greedy choices.
#[derive(Default)]
struct ReplayStats {
    tokens: usize,
    differing: usize,
}

impl ReplayStats {
    /// Near-ties may flip between machines whose kernels sum in another
    /// order; more than this share of differing tokens means the file was
    /// made by another model (or with sampling), and its taps would teach
    /// a drafter another target.
    const MAX_DIFFERING: f64 = 0.02;

    /// Fails where more than the tolerated share (and more than one token)
    /// differs; checked before each shard is written, so a shard of
    /// another model's answers is never written.
    fn check(&self, path: &Path) -> Result<()> {
        let tolerated = (Self::MAX_DIFFERING * self.tokens as f64).max(1.0);
        if self.differing as f64 > tolerated {
            bail!(
                "{}: {} of {} replayed response tokens are not this target's greedy choice; \
                 was it made by another model?",
                path.display(),
                self.differing,
                self.tokens
            );
        }
        Ok(())
    }
}

/// A sequence from a `--replay` file with the taps of every position,
/// captured by forward passes over it in batches; the logits of every row
/// check that the response is this target's greedy answer.
fn replayed<B: Backend>(
    loaded: &Loaded<B>,
    state: &mut DecoderState<B>,
    taps: &mut Taps<B>,
    prompt_index: usize,
    seq: &Replayed,
    stats: &mut ReplayStats,
) -> Result<Sequence> {
    let dec = &loaded.decoder;
    let be = &*dec.backend;
    let mut rows: Vec<f16> =
        Vec::with_capacity(seq.ids.len() * taps.layers().len() * dec.config.n_embd);
    let batch = state.logit_rows();
    for (c, chunk) in seq.ids.chunks(batch).enumerate() {
        forward_capturing(dec, state, chunk, LogitRows::All, taps, &mut rows)?;
        let greedy = pollster::block_on(be.argmax(state.logits()));
        let start = c * batch;
        for (j, &next) in greedy.iter().enumerate() {
            let pos = start + j + 1; // the token this row predicts
            if pos >= seq.prompt_len && pos < seq.ids.len() {
                stats.tokens += 1;
                stats.differing += (seq.ids[pos] != next) as usize;
            }
        }
    }
    Ok(Sequence {
        prompt_index,
        ids: seq.ids.clone(),
        prompt_len: seq.prompt_len,
        finished: seq.finished,
        taps: rows,
    })
}
