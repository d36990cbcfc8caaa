//! DFlash v1 against golden tensors of the PyTorch reference (PyPI `dflash`,
//! tests/golden/make_dflash_golden.py): a tiny Qwen3 target and a 2-layer
//! drafter written as llama.cpp's converter writes them. Checked: target
//! logits and tapped context features, the drafter's block logits, and the
//! reference's end-to-end greedy run (tokens and per-round acceptance).

mod common;

use blockdraft_core::testing::block_on;
use common::{fixture_file, flat, ids, rel_err};

use blockdraft_core::backend::prelude::*;
use blockdraft_core::model::{Decoder, LogitRows, Taps};
use blockdraft_core::sampling::{argmax, Sampler, SamplingParams};
use blockdraft_core::speculative::{
    generate_speculative, DFlashDrafter, DraftPolicy, PolicyConfig,
};
use blockdraft_cpu::CpuBackend;
use std::sync::Arc;

#[test]
fn dflash_v1_matches_the_pytorch_reference() {
    let g = common::fixture("dflash/golden-v1.json");
    let tfile = fixture_file("target-qwen3.gguf");
    let dfile = fixture_file("dflash-v1.gguf");
    let be = Arc::new(CpuBackend::new(2));
    let target = Decoder::load(&tfile, be.clone(), &mut |_| {}).unwrap();
    let prompt = ids(&g["prompt_ids"]);
    let p = prompt.len();

    // Target prefill with taps at the drafter's layers.
    let mut drafter = DFlashDrafter::load(&dfile, &target, 64, 16).unwrap();
    assert_eq!(drafter.config().target_layers, vec![2, 4]);
    let mut taps = Taps::new(&*be, &target.config, &drafter.config().target_layers, 16).unwrap();
    let mut state = target.new_state(64, 16);
    target
        .forward(&mut state, &prompt, LogitRows::All, true, Some(&mut taps))
        .unwrap();
    let err = rel_err(
        &block_on(be.read(state.logits())),
        &flat(&g["target_logits"]),
    );
    assert!(err < 1e-4, "target logits off by {err}");
    let err = rel_err(&block_on(be.read(taps.output())), &flat(&g["ctx_features"]));
    assert!(err < 1e-4, "tapped context features off by {err}");

    // Context injection, then one block.
    block_on(drafter.inject(taps.output(), 0, p)).unwrap();
    let anchor = g["target_next_token"].as_u64().unwrap() as u32;
    let n_vocab = target.config.n_vocab;
    let logits = block_on(drafter.block_logits(anchor, 7)).unwrap();
    let want = flat(&g["draft_logits"]);
    let err = rel_err(&logits[n_vocab..], &want);
    assert!(err < 1e-4, "draft logits off by {err}");
    let got_argmax: Vec<u32> = logits.chunks_exact(n_vocab).skip(1).map(argmax).collect();
    assert_eq!(got_argmax, ids(&g["draft_argmax"]));

    // The reference's end-to-end greedy run, round by round.
    let e2e = &g["e2e"];
    let n_new = e2e["max_new_tokens"].as_u64().unwrap() as usize;
    let mut drafter = DFlashDrafter::load(&dfile, &target, 64, 16).unwrap();
    let mut state = target.new_state(64, 16);
    let mut policy = DraftPolicy::new(PolicyConfig::fixed(7));
    let mut rounds = Vec::new();
    let (tokens, _, _) = block_on(generate_speculative(
        &target,
        &mut state,
        &mut drafter,
        &mut policy,
        &prompt,
        n_new,
        &mut Sampler::new(SamplingParams::greedy()),
        &|_| false,
        &mut |_| true,
        &mut |r| rounds.push(r.accepted as u64 + 1),
    ))
    .unwrap();
    assert_eq!(tokens, ids(&e2e["new_ids"]));
    assert_eq!(
        rounds,
        e2e["acceptance_lengths"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect::<Vec<_>>()
    );
}
