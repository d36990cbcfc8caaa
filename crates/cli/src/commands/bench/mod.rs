//! `blockdraft bench`: prefill and decode speed (medians of repetitions,
//! like llama-bench), the verify cost curve T(k)/T(1), memory bandwidth
//! achieved and peak RSS. Progress goes to stderr as it is measured; Ctrl-C
//! stops the measuring and prints what was measured so far (`--json` stays
//! one valid object, with `"interrupted": true`), then exits with 130.

mod gpu_model;
mod memory;
mod paired;

use super::median;
use crate::args::{at_least, f64_in, usize_in};
use crate::drafter::DraftArgs;
use crate::interrupt::{self, Interrupted};
use crate::load::{with_backend, Job, Loaded, ModelArgs};
use anyhow::{Context, Result};
use blockdraft_core::backend::prelude::*;
use blockdraft_core::backend::KernelTiming;
use blockdraft_core::engine::SequenceMemory;
use blockdraft_core::model::{Decoder, DecoderState, LogitRows};
use blockdraft_core::sampling::{Bounds, Rng};
use blockdraft_core::speculative::MAX_DRAFT;
use memory::{read_bandwidth, weight_bytes_per_token, PeakRss};
use serde_json::json;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

/// Rows of one forward pass (prefill chunks, verify batches).
const MAX_BATCH: usize = 512;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens to prefill (0 skips prefill).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512,
          value_parser = at_least(0), conflicts_with = "draft")]
    pub n_prompt: usize,
    /// Tokens to decode (0 skips decode).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128, value_parser = at_least(0))]
    pub n_gen: usize,
    /// Repetitions; the median is reported.
    #[arg(short = 'r', long = "repetitions", default_value_t = 3, value_parser = at_least(1))]
    pub reps: usize,
    /// Largest verify batch of the T(k)/T(1) curve (0 skips it).
    #[arg(long = "verify-max", default_value_t = 16, conflicts_with = "draft",
          value_parser = usize_in(Bounds { lo: 0, hi: MAX_BATCH }))]
    pub verify_max: usize,
    /// Context length before each verify batch.
    #[arg(long = "verify-ctx", default_value_t = 64, value_parser = at_least(1),
          conflicts_with = "draft")]
    pub verify_ctx: usize,
    /// Aggregate decode speed of this many sequences decoded together (one
    /// batched pass per token for all of them), e.g. `1,2,4,8`.
    #[arg(long = "parallel", value_delimiter = ',', conflicts_with = "draft",
          value_parser = usize_in(Bounds { lo: 1, hi: 256 }))]
    pub parallel: Vec<usize>,
    /// Decode speed and the verify curve again after this many tokens of
    /// context each (as `llama-bench -d`), e.g. `512,4096`.
    #[arg(long = "depth", value_delimiter = ',', conflicts_with = "draft",
          value_parser = at_least(0))]
    pub depth: Vec<usize>,
    #[arg(long = "json")]
    pub json: bool,
    /// With a device backend: also the decode speed its command stream
    /// would have on this GPU class (weight bytes at its bandwidth plus a
    /// floor per dispatch and per readback; see bench/gpu_model.rs).
    #[arg(long = "gpu-profile", value_enum)]
    pub gpu_profile: Option<gpu_model::GpuProfile>,
    /// Benchmark speculative against plain decoding with this drafter
    /// (see `run --draft`), side by side on --prompt-text.
    #[command(flatten)]
    pub draft: DraftArgs,
    /// With --draft: propose the target's own greedy continuation, corrupted
    /// at the rate that gives this expected tau for drafts of --draft-max
    /// tokens, while still running the drafter for its cost (measures the
    /// engine apart from drafter quality). With --draft-max = tau - 1 there
    /// are no errors and every round realises tau; with longer drafts the
    /// policy may stop them early, which realises less (the output says).
    /// From 1 to --draft-max + 1.
    #[arg(long = "forced-tau", requires = "draft",
          value_parser = f64_in(Bounds { lo: 1.0, hi: (MAX_DRAFT + 1) as f64 }))]
    pub forced_tau: Option<f64>,
    /// Also benchmark this model, on the same backend and in the same run,
    /// each decode repetition and each verify pass of -m's beside one of
    /// its (the order alternating), and print its figures beside -m's
    /// with the ratio of each: a comparison that drift in the machine's
    /// speed does not skew. Measures decode and the verify curve only (no
    /// prefill: -p is refused).
    #[arg(long = "against",
          conflicts_with_all = ["n_prompt", "draft", "depth", "parallel", "gpu_profile"])]
    pub against: Option<std::path::PathBuf>,
    /// With --draft: the prompt to generate from.
    #[arg(
        long = "prompt-text",
        requires = "draft",
        default_value = "def quicksort(items):\n    \"\"\"Sort a list of numbers.\"\"\"\n"
    )]
    pub prompt_text: String,
}

fn random_tokens(n: usize, n_vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| (rng.next_u64() % n_vocab as u64) as u32)
        .collect()
}

fn time_forward<B: Backend>(
    dec: &Decoder<B>,
    state: &mut DecoderState<B>,
    tokens: &[u32],
    logits: LogitRows,
) -> Result<f64> {
    let t = Instant::now();
    for chunk in tokens.chunks(state.max_batch()) {
        dec.forward(state, chunk, logits, true, None)?;
    }
    pollster::block_on(dec.backend.argmax(state.logits()));
    Ok(t.elapsed().as_secs_f64())
}

/// A line of progress on stderr.
fn progress(line: impl std::fmt::Display) {
    eprintln!("bench: {line}");
}

pub fn run(args: Args) -> Result<()> {
    args.draft.check()?;
    if let Some(tau) = args.forced_tau {
        if tau > (args.draft.draft_max + 1) as f64 {
            anyhow::bail!(
                "--forced-tau {tau} needs drafts of at least {} tokens (--draft-max {})",
                tau.ceil() as usize - 1,
                args.draft.draft_max
            );
        }
    }
    let model = args.model.clone();
    with_backend(&model, args)
}

impl Job for Args {
    fn run<B: Backend>(self, loaded: Loaded<B>) -> Result<()> {
        interrupt::catch();
        let interrupted = match (&self.draft.draft, &self.against) {
            (Some(spec), _) => speculative_bench(&self, &loaded, spec)?,
            (None, Some(other)) => paired::bench(&self, &loaded, other)?,
            (None, None) => bench(&self, &loaded)?,
        };
        if interrupted {
            return Err(Interrupted.into());
        }
        Ok(())
    }
}

/// A sequence of room for `needed` positions (`what` names the options
/// that asked for them) and as many random tokens, after one warm-up pass:
/// the weights paged in (the CPU backend packs them then), the pool awake.
fn warmed_up<B: Backend>(
    dec: &Decoder<B>,
    needed: usize,
    what: &str,
) -> Result<(DecoderState<B>, Vec<u32>)> {
    let n_ctx = dec
        .config
        .context_size(needed, None)
        .with_context(|| what.to_string())?;
    let mut state = dec.try_new_state(n_ctx, MAX_BATCH)?;
    let tokens = random_tokens(n_ctx, dec.config.n_vocab, 42);
    time_forward(dec, &mut state, &tokens[..1], LogitRows::Last)?;
    Ok((state, tokens))
}

/// The plain benchmark; returns whether Ctrl-C cut it short (what was
/// measured is printed either way).
fn bench<B: Backend>(args: &Args, loaded: &Loaded<B>) -> Result<bool> {
    let dec = &loaded.decoder;
    let cfg = &dec.config;
    let deepest = args.depth.iter().copied().max().unwrap_or(0);
    let needed = (args.n_prompt.max(args.n_gen + 1))
        .max(args.verify_ctx + args.verify_max)
        .max(deepest + (args.n_gen + 1).max(args.verify_max));
    progress("warming up (the first pass pages the weights in)");
    let (mut state, tokens) = warmed_up(
        dec,
        needed,
        "the benchmark's -p, -n, --verify-ctx + --verify-max or --depth",
    )?;

    // Decoding on the host streams the weights from memory: each decode
    // repetition is paired with a read-bandwidth probe, so the fraction of
    // the machine's bandwidth it achieves compares like with like.
    let probe_bandwidth = args.n_gen > 0 && dec.backend.host_memory();
    let mut peak_rss = PeakRss::default();
    let mut prefill = Vec::new();
    let mut decode = Vec::new();
    let mut bandwidth = Vec::new();
    // Device commands and kernel times per token of the last decode
    // repetition.
    let mut commands = None;
    let mut kernels = None;
    for rep in 1..=args.reps {
        if interrupt::requested() {
            break;
        }
        let mut line = format!("repetition {rep}/{}:", args.reps);
        if probe_bandwidth {
            let threads = args.model.threads();
            let gbps = peak_rss.around(|| read_bandwidth(threads));
            bandwidth.push(gbps);
            let _ = write!(line, " memory reads {gbps:.2} GB/s,");
        }
        if args.n_prompt > 0 {
            state.truncate(0)?;
            let tps = args.n_prompt as f64
                / time_forward(dec, &mut state, &tokens[..args.n_prompt], LogitRows::Last)?;
            prefill.push(tps);
            let _ = write!(line, " prefill {tps:.2} tok/s,");
        }
        if args.n_gen > 0 {
            state.truncate(0)?;
            let before = dec.backend.command_counts();
            dec.backend.take_kernel_timings();
            if let Some(tps) = decode_rate(dec, &mut state, tokens[0], args.n_gen)? {
                decode.push(tps);
                let _ = write!(line, " decode {tps:.2} tok/s");
                let after = dec.backend.command_counts();
                commands = after.zip(before).map(|(a, b)| a.since(&b));
                kernels = dec.backend.take_kernel_timings().map(|k| (k, tps));
            }
        }
        progress(line.trim_end_matches(','));
    }
    let n_prefill = prefill.len();
    let n_decode = decode.len();
    let prefill_tps = (!prefill.is_empty()).then(|| median(&prefill));
    let decode_tps = (!decode.is_empty()).then(|| median(&decode));
    let read_gbps = (!bandwidth.is_empty()).then(|| median(&bandwidth));

    let mut verify = Vec::new();
    if args.verify_max > 0 && !interrupt::requested() {
        progress(format!(
            "verify passes of k = 1..={} rows at context {}",
            args.verify_max, args.verify_ctx
        ));
        state.truncate(0)?;
        time_forward(dec, &mut state, &tokens[..args.verify_ctx], LogitRows::None)?;
        verify = verify_curve(dec, &mut state, &tokens, args.verify_max, args.reps)?;
    }
    // (depth, median decode tok/s, verify curve) for each --depth.
    let mut at_depth = Vec::new();
    for &depth in &args.depth {
        if interrupt::requested() {
            break;
        }
        progress(format!("filling {depth} tokens of context"));
        state.truncate(0)?;
        if depth > 0 {
            time_forward(dec, &mut state, &tokens[..depth], LogitRows::None)?;
        }
        let mut rates = Vec::new();
        // -n 0 measures no decode here either (nor at depth 0 above).
        let reps = if args.n_gen > 0 { args.reps } else { 0 };
        for _ in 0..reps {
            rewind(dec, &mut state, &tokens[..depth])?;
            match decode_rate(dec, &mut state, tokens[depth], args.n_gen)? {
                Some(tps) => rates.push(tps),
                None => break,
            }
        }
        let rate = (reps > 0 && rates.len() == reps).then(|| median(&rates));
        rewind(dec, &mut state, &tokens[..depth])?;
        let curve = verify_curve(dec, &mut state, &tokens, args.verify_max, args.reps)?;
        progress(format!(
            "depth {depth}: decode {}",
            rate.map_or("-".into(), |r| format!("{r:.2} tok/s"))
        ));
        at_depth.push((depth, rate, curve));
    }
    let mut parallel = Vec::new();
    for &n in &args.parallel {
        if interrupt::requested() || args.n_gen == 0 {
            break;
        }
        progress(format!("{n} sequences decoding together"));
        let mut times = Vec::new();
        for _ in 0..args.reps {
            times.push(time_parallel(dec, n, args.n_gen)?);
            if interrupt::requested() {
                break;
            }
        }
        if times.len() == args.reps {
            parallel.push((n, (n * args.n_gen) as f64 / median(&times)));
        }
    }
    let interrupted = interrupt::requested();
    let bytes = weight_bytes_per_token(&loaded.file);
    let gbps = decode_tps.map(|t| t * bytes as f64 / 1e9);
    let bandwidth_fraction = gbps.zip(read_gbps).map(|(d, r)| d / r);
    let rss = peak_rss.get();
    let modelled = args
        .gpu_profile
        .zip(commands)
        .map(|(p, c)| (p, gpu_model::predict(p, &c, args.n_gen as u64, bytes)));

    if args.json {
        crate::out::println(json!({
            "model": args.model.model.display().to_string(),
            "backend": dec.backend.name(),
            "threads": args.model.threads(),
            "n_prompt": args.n_prompt,
            "n_gen": args.n_gen,
            "repetitions": args.reps,
            "prefill_repetitions": n_prefill,
            "decode_repetitions": n_decode,
            "interrupted": interrupted,
            "prefill_tokens_per_second": prefill_tps,
            "decode_tokens_per_second": decode_tps,
            "weight_bytes_per_token": bytes,
            "decode_gb_per_second": gbps,
            "memory_read_gb_per_second": read_gbps,
            "decode_bandwidth_fraction": bandwidth_fraction,
            "commands_per_decoded_token": commands.map(|c| json!({
                "dispatches": c.dispatches as f64 / args.n_gen as f64,
                "passes": c.passes as f64 / args.n_gen as f64,
                "submits": c.submits as f64 / args.n_gen as f64,
                "bind_groups_created": c.bind_groups as f64 / args.n_gen as f64,
                "readbacks": c.readbacks as f64 / args.n_gen as f64,
            })),
            "gpu_model": modelled.map(|(p, m)| json!({
                "profile": p.describe(),
                "decode_tokens_per_second": m.tokens_per_second,
                "overhead_fraction": m.overhead_fraction,
            })),
            "verify": curve_json(&verify),
            "parallel": parallel
                .iter()
                .map(|&(n, tps)| json!({"sequences": n, "decode_tokens_per_second": tps}))
                .collect::<Vec<_>>(),
            "depth": at_depth
                .iter()
                .map(|(depth, tps, curve)| json!({
                    "depth": depth,
                    "decode_tokens_per_second": tps,
                    "verify": curve_json(curve),
                }))
                .collect::<Vec<_>>(),
            "peak_rss_bytes": rss,
        }))?;
        return Ok(interrupted);
    }
    let mut out = String::new();
    if interrupted {
        let _ = writeln!(out, "(interrupted: what was measured before Ctrl-C)");
    }
    let _ = writeln!(out, "model    {}", args.model.model.display());
    let _ = writeln!(out, "backend  {}", dec.backend.name());
    if let Some(t) = prefill_tps {
        let _ = writeln!(
            out,
            "prefill  pp{:<5} {t:>9.2} tok/s (median of {n_prefill})",
            args.n_prompt
        );
    }
    if let Some(t) = decode_tps {
        let _ = writeln!(
            out,
            "decode   tg{:<5} {t:>9.2} tok/s (median of {n_decode})",
            args.n_gen
        );
        let _ = writeln!(
            out,
            "weights  {:.1} MB/token -> {:.2} GB/s",
            bytes as f64 / 1e6,
            gbps.unwrap_or(0.0)
        );
        if let (Some(r), Some(f)) = (read_gbps, bandwidth_fraction) {
            let _ = writeln!(
                out,
                "memory   reads at {r:.2} GB/s with {} threads (beside each repetition): decode at {:.0} % of it",
                args.model.threads(),
                f * 100.0
            );
        }
    }
    if let Some(c) = commands {
        let per = |x: u64| x as f64 / args.n_gen as f64;
        let _ = writeln!(
            out,
            "commands per decoded token: {:.1} dispatches ({:.1} per layer), {:.2} passes, {:.2} submits, {:.2} bind groups created, {:.2} readbacks",
            per(c.dispatches),
            per(c.dispatches) / cfg.n_layer as f64,
            per(c.passes),
            per(c.submits),
            per(c.bind_groups),
            per(c.readbacks)
        );
    }
    if let Some((p, m)) = modelled {
        let _ = writeln!(
            out,
            "modelled on {}: decode {:.1} tok/s, {:.0} % of it dispatch and readback overhead",
            p.describe(),
            m.tokens_per_second,
            m.overhead_fraction * 100.0
        );
    }
    if let Some((timings, tps)) = &kernels {
        write_kernel_timings(&mut out, timings, *tps, args.n_gen);
    }
    if !verify.is_empty() {
        let _ = writeln!(
            out,
            "verify   T(k)/T(1) at context {} (ratios: medians over sweeps of every k):",
            args.verify_ctx
        );
        for p in &verify {
            let _ = writeln!(
                out,
                "  k={:<3} {:>8.2} ms  {:>5.2}x",
                p.k,
                p.seconds * 1e3,
                p.ratio
            );
        }
    }
    if let Some(&(_, one)) = parallel.first() {
        let _ = writeln!(
            out,
            "parallel aggregate decode tg{}, sequences decoded together:",
            args.n_gen
        );
        for &(n, tps) in &parallel {
            let _ = writeln!(
                out,
                "  {n:<3} seq {tps:>9.2} tok/s  {:>5.2}x the first",
                tps / one
            );
        }
    }
    if !at_depth.is_empty() {
        let _ = writeln!(
            out,
            "depth    decode tg{} and T(k)/T(1) after that many tokens of context:",
            args.n_gen
        );
        for (depth, tps, curve) in &at_depth {
            let _ = write!(
                out,
                "  {depth:<6} {:>9} tok/s",
                tps.map_or("-".into(), |t| format!("{t:.2}"))
            );
            for p in curve.iter().filter(|p| p.k.is_power_of_two() && p.k > 1) {
                let _ = write!(out, "  T({})/T(1) {:.2}", p.k, p.ratio);
            }
            let _ = writeln!(out);
        }
    }
    if let Some(r) = rss {
        let _ = writeln!(out, "peak RSS {:.1} MB", r as f64 / 1e6);
    }
    crate::out::print(&out)?;
    Ok(interrupted)
}

/// Tokens per second of `n_gen` greedy decode steps from `first` on, or
/// `None` when Ctrl-C cut the repetition short (it is then not one).
/// The kernels' GPU time per decoded token beside the wall time, and what
/// each kernel's time is in bytes bound per second.
fn write_kernel_timings(out: &mut String, timings: &[KernelTiming], tps: f64, n_gen: usize) {
    let per_token = |x: u64| x as f64 / n_gen as f64;
    let gpu_us: f64 = timings.iter().map(|t| per_token(t.gpu_ns)).sum::<f64>() / 1e3;
    let wall_us = 1e6 / tps;
    let _ = writeln!(
        out,
        "kernels  GPU time per decoded token {gpu_us:.0} us of {wall_us:.0} us wall ({:.0} %; \
         the rest is the host and the gaps between kernels; profiled run, so slower):",
        100.0 * gpu_us / wall_us
    );
    let _ = writeln!(
        out,
        "  {:<40} {:>9} {:>9} {:>10}",
        "kernel", "calls/tok", "us/tok", "GB/s bound"
    );
    for t in timings {
        let us = per_token(t.gpu_ns) / 1e3;
        let gbps = if t.gpu_ns > 0 {
            t.bytes_bound as f64 / t.gpu_ns as f64
        } else {
            0.0
        };
        let _ = writeln!(
            out,
            "  {:<40} {:>9.1} {:>9.1} {:>10.1}",
            t.kernel,
            per_token(t.dispatches),
            us,
            gbps
        );
    }
}

fn decode_rate<B: Backend>(
    dec: &Decoder<B>,
    state: &mut DecoderState<B>,
    first: u32,
    n_gen: usize,
) -> Result<Option<f64>> {
    let t = Instant::now();
    let mut next = first;
    for _ in 0..n_gen {
        if interrupt::requested() {
            return Ok(None);
        }
        dec.forward(state, &[next], LogitRows::Last, true, None)?;
        next = pollster::block_on(dec.backend.argmax(state.logits()))[0];
    }
    Ok(Some(n_gen as f64 / t.elapsed().as_secs_f64()))
}

/// Goes back to holding `held`: a truncation, or for a hybrid model's
/// state, which goes back only within a checkpoint's rows, a fresh fill.
fn rewind<B: Backend>(dec: &Decoder<B>, state: &mut DecoderState<B>, held: &[u32]) -> Result<()> {
    if state.can_truncate(held.len()) {
        state.truncate(held.len())?;
    } else {
        state.truncate(0)?;
        if !held.is_empty() {
            time_forward(dec, state, held, LogitRows::None)?;
        }
    }
    Ok(())
}

/// A point of the verify curve.
struct VerifyPoint {
    /// Rows of the pass.
    k: usize,
    /// Median seconds of a pass.
    seconds: f64,
    /// Median over the sweeps of the pass's time over the same sweep's
    /// one-row pass: T(k)/T(1).
    ratio: f64,
}

/// The verify curve for k = 1..=`verify_max` rows (fewer where the state's
/// passes are smaller) after the state's current context, which each pass
/// leaves as it was. Measured in sweeps, each timing every k back to back,
/// so that a ratio compares passes well under a second apart: measured k
/// by k, T(1) and T(16) would be minutes apart on a machine whose speed
/// drifts by 10–20 % in that time.
fn verify_curve<B: Backend>(
    dec: &Decoder<B>,
    state: &mut DecoderState<B>,
    tokens: &[u32],
    verify_max: usize,
    reps: usize,
) -> Result<Vec<VerifyPoint>> {
    let base = state.len();
    let k_max = verify_max.min(state.logit_rows());
    let mut sweeps: Vec<Vec<f64>> = Vec::new();
    for _ in 0..reps.max(3) {
        let sweep = (1..=k_max)
            .map(|k| time_verify(dec, state, &tokens[base..base + k]))
            .collect::<Result<Vec<_>>>()?;
        sweeps.push(sweep);
        if interrupt::requested() {
            break;
        }
    }
    let of = |f: &dyn Fn(&[f64]) -> f64| median(&sweeps.iter().map(|s| f(s)).collect::<Vec<_>>());
    Ok((0..k_max)
        .map(|i| VerifyPoint {
            k: i + 1,
            seconds: of(&|s| s[i]),
            ratio: of(&|s| s[i] / s[0]),
        })
        .collect())
}

/// Seconds of one verify pass of `rows` after the state's context, which
/// it leaves as it was.
fn time_verify<B: Backend>(
    dec: &Decoder<B>,
    state: &mut DecoderState<B>,
    rows: &[u32],
) -> Result<f64> {
    // As a speculative round does: a hybrid model's state is checkpointed,
    // and restored at the commit.
    let at = state.checkpoint();
    let t = time_forward(dec, state, rows, LogitRows::All)?;
    state.commit(at, 0)?;
    Ok(t)
}

fn curve_json(curve: &[VerifyPoint]) -> Vec<serde_json::Value> {
    curve
        .iter()
        .map(|p| json!({"k": p.k, "seconds": p.seconds, "ratio": p.ratio}))
        .collect()
}

/// Seconds for `n` sequences, each after a short prompt of its own, to
/// decode `n_gen` tokens each, driven together by the engine's step
/// machine (one batched pass per token for all of them).
fn time_parallel<B: Backend>(dec: &Arc<Decoder<B>>, n: usize, n_gen: usize) -> Result<f64> {
    use blockdraft_core::engine::{Engine, Event, Held, Sequence};
    use blockdraft_core::sampling::{Sampler, SamplingParams};
    const PROMPT: usize = 16;
    let n_ctx = dec
        .config
        .context_size(PROMPT + n_gen + 1, None)
        .context("-n with --parallel's 16-token prompts")?;
    let mut seqs = Vec::with_capacity(n);
    for i in 0..n {
        let state = dec.try_new_state(n_ctx, PROMPT)?;
        let prompt = random_tokens(PROMPT, dec.config.n_vocab, i as u64);
        let sampler = Sampler::new(SamplingParams::greedy());
        // The first token comes from the prefill, then n_gen timed ones.
        seqs.push(Sequence::new(
            Held::owned(state),
            &prompt,
            n_gen + 1,
            Held::owned(sampler),
            |_| false,
        ));
    }
    let mut engine = Engine::new(dec.clone());
    let mut step = |seqs: &mut [Sequence<'_, B>]| -> Result<()> {
        for (i, event) in pollster::block_on(engine.step(seqs))? {
            if let Event::Failed(e) = event {
                return Err(anyhow::Error::new(e).context(format!("sequence {i}")));
            }
        }
        Ok(())
    };
    step(&mut seqs)?;
    let t = Instant::now();
    while seqs.iter().any(|s| !s.is_finished()) {
        step(&mut seqs)?;
    }
    Ok(t.elapsed().as_secs_f64())
}

/// Plain and speculative greedy decoding of the same prompt, repeated,
/// medians side by side; plus the speedup that the measured draft costs and
/// isolated target passes of each round's size predict, to expose overhead
/// outside them. Returns whether Ctrl-C cut it short.
fn speculative_bench<B: Backend>(args: &Args, loaded: &Loaded<B>, spec: &str) -> Result<bool> {
    use blockdraft_core::generate::generate;
    use blockdraft_core::sampling::{Sampler, SamplingParams};
    use blockdraft_core::speculative::{
        error_rate_for_tau, generate_speculative, DraftPolicy, ForcedDrafter, OracleDrafter,
        RoundStats, SpecStats,
    };

    let dec = &loaded.decoder;
    let prompt = loaded.tokenizer.encode(&args.prompt_text, true, true)?;
    let n = args.n_gen.max(1);
    let n_ctx = dec
        .config
        .context_size(prompt.len() + n + args.draft.draft_max + 2, None)
        .context("the benchmark's --prompt-text, -n and --draft-max")?;
    let max_batch = 256;
    let greedy = || Sampler::new(SamplingParams::greedy());

    // Weights loaded and warmed up once; each run gets a fresh sequence.
    let shared = crate::drafter::shared(&args.draft, loaded)?;
    // Plain and speculative runs alternate, so that drift in the machine's
    // speed (frequency, neighbours) weighs on both sides of the ratio.
    let mut plain_runs = Vec::new();
    // Each speculative run: tokens/s, totals and its rounds.
    let mut spec_runs: Vec<(f64, SpecStats, Vec<RoundStats>)> = Vec::new();
    // (Generation stops at the next token once Ctrl-C is pressed.)
    let mut sequence = Vec::new();
    let mut identical = true;
    for rep in 0..args.reps {
        if interrupt::requested() {
            break;
        }
        let mut state = dec.try_new_state(n_ctx, max_batch)?;
        let (plain_tokens, _, plain) = pollster::block_on(generate(
            dec,
            &mut state,
            &prompt,
            n,
            &mut greedy(),
            &|_| false,
            &mut |_| !interrupt::requested(),
        ))?;
        if interrupt::requested() {
            break;
        }
        sequence = prompt.iter().chain(&plain_tokens).copied().collect();

        let mut drafter = shared
            .for_sequence(dec.config.n_vocab, n_ctx, max_batch)?
            .context("no --draft given")?;
        if let Some(tau) = args.forced_tau {
            let e = error_rate_for_tau(tau, args.draft.draft_max);
            let oracle = OracleDrafter::new(sequence.clone(), e, dec.config.n_vocab, rep as u64);
            drafter = Box::new(ForcedDrafter {
                inner: drafter,
                oracle,
            });
        }
        let mut state = dec.try_new_state(n_ctx, max_batch)?;
        let mut policy = DraftPolicy::new(args.draft.policy());
        let mut rounds = Vec::new();
        let (tokens, _, st) = pollster::block_on(generate_speculative(
            dec,
            &mut state,
            drafter.as_mut(),
            &mut policy,
            &prompt,
            n,
            &mut greedy(),
            &|_| false,
            &mut |_| !interrupt::requested(),
            &mut |r| rounds.push(r.clone()),
        ))?;
        // A repetition cut short is not one (on either side).
        if interrupt::requested() {
            break;
        }
        identical &= tokens == plain_tokens;
        progress(format!(
            "repetition {}/{}: plain {:.2} tok/s, speculative {:.2} tok/s (tau {:.2})",
            rep + 1,
            args.reps,
            plain.decode_tokens_per_second(),
            st.decode_tokens_per_second(),
            st.tau()
        ));
        plain_runs.push(plain.decode_tokens_per_second());
        spec_runs.push((st.decode_tokens_per_second(), st, rounds));
    }
    let interrupted = interrupt::requested();
    let done = spec_runs.len();
    if done == 0 {
        // Interrupted before a whole repetition: nothing to report.
        if args.json {
            crate::out::println(json!({
                "model": args.model.model.display().to_string(),
                "drafter": spec,
                "repetitions": args.reps,
                "completed_repetitions": 0,
                "interrupted": true,
            }))?;
        } else {
            crate::out::println("(interrupted before the first repetition ended)")?;
        }
        return Ok(true);
    }
    let plain_tps = median(&plain_runs);
    spec_runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (spec_tps, st, rounds) = spec_runs.swap_remove(spec_runs.len() / 2);
    let passes = (st.rounds + st.plain_steps).max(1) as f64;

    // What the run should have cost: each round's draft time plus an
    // isolated target pass of its row count, timed mid-generation. Time
    // the engine spends outside both shows up as efficiency below 100 %.
    // (Not measured once interrupted.)
    let predicted_tps = if interrupted {
        None
    } else {
        progress("timing isolated target passes of each round's size");
        let max_rows = rounds.iter().map(|r| r.drafted + 1).max().unwrap_or(1);
        let context = prompt.len() + n.saturating_sub(max_rows) / 2;
        let mut timing_tokens = sequence.clone();
        timing_tokens.resize(context + max_rows, *sequence.last().unwrap_or(&0));
        let mut state = dec.try_new_state(n_ctx, max_batch)?;
        time_forward(dec, &mut state, &timing_tokens[..context], LogitRows::None)?;
        let mut pass_seconds = Vec::with_capacity(max_rows);
        for rows in 1..=max_rows {
            let mut times = Vec::new();
            for _ in 0..3 {
                let at = state.checkpoint();
                times.push(time_forward(
                    dec,
                    &mut state,
                    &timing_tokens[context..context + rows],
                    LogitRows::All,
                )?);
                state.commit(at, 0)?;
            }
            pass_seconds.push(median(&times));
        }
        let predicted_seconds: f64 = rounds
            .iter()
            .map(|r| pass_seconds[r.drafted] + r.catch_up_seconds + r.draft_seconds)
            .sum();
        Some(st.generated_tokens.saturating_sub(1) as f64 / predicted_seconds.max(1e-9))
    };
    let achieved = spec_tps / plain_tps;
    let predicted = predicted_tps.map(|p| p / plain_tps);
    let efficiency = predicted.map(|p| achieved / p);
    if args.json {
        crate::out::println(json!({
            "model": args.model.model.display().to_string(),
            "drafter": spec,
            "forced_tau": args.forced_tau,
            "threads": args.model.threads(),
            "prompt_tokens": prompt.len(),
            "n_gen": n,
            "repetitions": args.reps,
            "completed_repetitions": done,
            "interrupted": interrupted,
            "plain_tokens_per_second": plain_tps,
            "speculative_tokens_per_second": spec_tps,
            "speedup": achieved,
            "predicted_speedup": predicted,
            "efficiency": efficiency,
            "tau": st.tau(),
            "acceptance_rate": st.acceptance_rate(),
            "rounds": st.rounds,
            "plain_steps": st.plain_steps,
            "draft_ms_per_pass": st.draft_seconds / passes * 1e3,
            "verify_ms_per_pass": st.verify_seconds / passes * 1e3,
            "caught_up_tokens": st.caught_up,
            "catch_up_ms": st.catch_up_seconds * 1e3,
            "probes": st.probes,
            "probe_loss_ms": st.probe_loss_seconds(1.0 / plain_tps) * 1e3,
            "identical_to_plain": identical,
        }))?;
        return Ok(interrupted);
    }
    let mut out = String::new();
    if interrupted {
        let _ = writeln!(out, "(interrupted: what was measured before Ctrl-C)");
    }
    let _ = writeln!(out, "model     {}", args.model.model.display());
    let _ = writeln!(
        out,
        "drafter   {spec}{}",
        args.forced_tau
            .map_or(String::new(), |t| format!(" (forced tau {t})"))
    );
    let _ = writeln!(out, "plain     {plain_tps:>8.2} tok/s   (median of {done})");
    let _ = match (predicted, efficiency) {
        (Some(p), Some(e)) => writeln!(
            out,
            "spec      {spec_tps:>8.2} tok/s   speedup {achieved:.2}x, predicted from draft costs and isolated target passes {p:.2}x (efficiency {:.0} %)",
            e * 100.0
        ),
        _ => writeln!(out, "spec      {spec_tps:>8.2} tok/s   speedup {achieved:.2}x"),
    };
    let _ = writeln!(
        out,
        "rounds    {} speculative, {} plain; tau {:.2}; {}/{} drafts accepted",
        st.rounds,
        st.plain_steps,
        st.tau(),
        st.accepted,
        st.drafted
    );
    let _ = writeln!(
        out,
        "per pass  draft {:.2} ms, verify {:.2} ms (plain step {:.2} ms)",
        st.draft_seconds / passes * 1e3,
        st.verify_seconds / passes * 1e3,
        1e3 / plain_tps
    );
    let _ = writeln!(
        out,
        "lost      catch-up {:.1} ms ({} tokens); {} probes {:.1} ms against plain steps",
        st.catch_up_seconds * 1e3,
        st.caught_up,
        st.probes,
        st.probe_loss_seconds(1.0 / plain_tps) * 1e3
    );
    let _ = writeln!(
        out,
        "output    {}",
        if identical {
            "identical to plain decoding"
        } else {
            "DIFFERENT from plain decoding"
        }
    );
    crate::out::print(&out)?;
    Ok(interrupted)
}
