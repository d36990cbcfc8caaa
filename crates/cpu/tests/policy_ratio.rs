//! The policy's promise end to end (issue 26): with a drafter made to lose,
//! speculative decoding stays within a few percent of plain decoding over
//! 128 tokens. Measured side by side in this run, alternating which goes
//! first, as the median of each pair's ratio: a pair runs back to back, so
//! a shared machine that slows down for a while slows both of its halves
//! (a ratio of medians let a slow stretch of plain runs face fast
//! speculative ones). The only test of its binary, so no other test shares
//! the cores while it times.
//!
//! Two ways to lose, on Qwen2.5-Coder-0.5B as the target:
//! - a draft model slower than the target (Qwen2.5-Coder-1.5B): its drafts
//!   are mostly right, but each costs more than the target step it saves,
//!   and the first probe pays its catch-up on the prompt;
//! - drafts that are always wrong and cost nothing to make: every verify
//!   row beyond the first is wasted.

mod common;

use blockdraft_core::generate::generate;
use blockdraft_core::model::Decoder;
use blockdraft_core::sampling::{Sampler, SamplingParams};
use blockdraft_core::speculative::{
    generate_speculative, DraftModelDrafter, DraftPolicy, Drafter, OracleDrafter, PolicyConfig,
};
use blockdraft_core::testing::block_on;
use blockdraft_core::tokenizer::Tokenizer;
use blockdraft_cpu::CpuBackend;
use blockdraft_gguf::GgufFile;
use std::sync::Arc;

const QWEN05: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
const QWEN15: &str = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";
const TOKENS: usize = 128;
const RUNS: usize = 5;
/// The goal, 0.95x, less a generous margin for a shared CI machine
/// (single timings vary by 20 % there): a policy that let the draft model
/// catch up on the whole prompt before its first draft ran far below it,
/// one that kept drafting 4 wrong tokens a round at about 0.8x.
const FLOOR: f64 = 0.8;

fn load(path: &std::path::Path, be: &Arc<CpuBackend>) -> (Arc<Decoder<CpuBackend>>, GgufFile) {
    let file = GgufFile::open(path).unwrap();
    let dec = Arc::new(Decoder::load(&file, be.clone(), &mut |_| {}).unwrap());
    (dec, file)
}

/// Decode tokens per second of plain greedy decoding, and its tokens.
fn plain(target: &Decoder<CpuBackend>, prompt: &[u32]) -> (f64, Vec<u32>) {
    let mut state = target.new_state(prompt.len() + TOKENS + 16, 256);
    let mut sampler = Sampler::new(SamplingParams::greedy());
    let (tokens, _, stats) = block_on(generate(
        target,
        &mut state,
        prompt,
        TOKENS,
        &mut sampler,
        &|_| false,
        &mut |_| true,
    ))
    .unwrap();
    (stats.decode_tokens_per_second(), tokens)
}

/// Decode tokens per second with `drafter` under the default policy, and
/// its tokens.
fn speculative(
    target: &Decoder<CpuBackend>,
    drafter: &mut dyn Drafter<CpuBackend>,
    prompt: &[u32],
) -> (f64, Vec<u32>) {
    let mut state = target.new_state(prompt.len() + TOKENS + 16, 256);
    let mut sampler = Sampler::new(SamplingParams::greedy());
    let mut policy = DraftPolicy::new(PolicyConfig::default());
    let (tokens, _, stats) = block_on(generate_speculative(
        target,
        &mut state,
        drafter,
        &mut policy,
        prompt,
        TOKENS,
        &mut sampler,
        &|_| false,
        &mut |_| true,
        &mut |_| {},
    ))
    .unwrap();
    eprintln!(
        "  {}: {} rounds, {} plain steps, {}/{} accepted, catch-up {:.1} ms",
        stats.drafter,
        stats.rounds,
        stats.plain_steps,
        stats.accepted,
        stats.drafted,
        stats.catch_up_seconds * 1e3
    );
    (stats.decode_tokens_per_second(), tokens)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
fn losing_drafters_keep_speculation_within_5_percent_of_plain() {
    let (Some(p05), Some(p15)) = (common::model(QWEN05), common::model(QWEN15)) else {
        return;
    };
    let be = Arc::new(CpuBackend::new(2));
    let (target, file) = load(&p05, &be);
    let (slow_draft, _) = load(&p15, &be);
    block_on(target.warm_up()).unwrap();
    block_on(slow_draft.warm_up()).unwrap();
    let tokenizer = Tokenizer::from_gguf(&file).unwrap();
    // About 140 tokens: a draft model that caught up on all of them before
    // its first draft (as the policy once let it) would spend most of a
    // 128-token generation doing so.
    let code = "class Inventory:\n    \"\"\"Items and their counts.\"\"\"\n\n    \
        def __init__(self):\n        self.items = {}\n\n    \
        def add(self, name, count=1):\n        self.items[name] = self.items.get(name, 0) + count\n\n    \
        def remove(self, name, count=1):\n        if self.items.get(name, 0) < count:\n            \
        raise ValueError(f\"not enough {name}\")\n        self.items[name] -= count\n\n    \
        def total(self):\n        return sum(self.items.values())\n\n    \
        def report(self):\n        for name, count in sorted(self.items.items()):\n            \
        print(f\"{name}: {count}\")\n\n\ndef quicksort(arr):\n    \"\"\"Sort a list.\"\"\"\n";
    let prompt = tokenizer.encode(code, false, false).unwrap();
    assert!(prompt.len() > 120, "{} prompt tokens", prompt.len());
    let (_, want) = plain(&target, &prompt);
    let sequence: Vec<u32> = prompt.iter().chain(&want).copied().collect();
    let n_vocab = target.config.n_vocab;

    type Make = Box<dyn Fn() -> Box<dyn Drafter<CpuBackend>>>;
    let slow: Make = Box::new(move || {
        Box::new(DraftModelDrafter::new(slow_draft.clone(), n_vocab, 512).unwrap())
    });
    let wrong: Make =
        Box::new(move || Box::new(OracleDrafter::new(sequence.clone(), 1.0, n_vocab, 7)));
    let mut failures = Vec::new();
    for (name, make) in [
        ("a draft model slower than the target", slow),
        ("always-wrong drafts", wrong),
    ] {
        eprintln!("{name}:");
        let (mut plain_tps, mut spec_tps) = (Vec::new(), Vec::new());
        for run in 0..RUNS {
            let mut drafter = make();
            let mut time_spec = || {
                let (tps, got) = speculative(&target, drafter.as_mut(), &prompt);
                assert_eq!(got, want, "{name}: speculative output differs from plain");
                tps
            };
            if run % 2 == 0 {
                plain_tps.push(plain(&target, &prompt).0);
                spec_tps.push(time_spec());
            } else {
                spec_tps.push(time_spec());
                plain_tps.push(plain(&target, &prompt).0);
            }
        }
        let ratios: Vec<f64> = spec_tps
            .iter()
            .zip(&plain_tps)
            .map(|(s, p)| s / p)
            .collect();
        let ratio = median(ratios.clone());
        eprintln!(
            "  plain {plain_tps:.1?} tok/s, speculative {spec_tps:.1?} tok/s, \
             ratios {ratios:.3?}: median {ratio:.3}x (floor {FLOOR})"
        );
        if ratio < FLOOR {
            failures.push(format!("{name}: {ratio:.3}x plain"));
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}
