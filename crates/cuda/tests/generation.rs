//! Whole synthetic models on the CUDA backend: every architecture's prefill
//! logits agree with the CPU backend's and greedy decoding picks the same
//! tokens; greedy speculative decoding with every drafter kind is identical
//! to plain decoding, on a hybrid (`qwen35`) target too; sampled rounds do
//! not depend on the drafter. Each test skips (printing SKIPPED) without a
//! CUDA device.

mod common;

use blockdraft_core::backend::prelude::*;
use blockdraft_core::model::{Decoder, LogitRows};
use blockdraft_core::sampling::SamplingParams;
use blockdraft_core::speculative::{
    DFlashDrafter, DraftModelDrafter, Drafter, NgramDrafter, OracleDrafter, PolicyConfig,
};
use blockdraft_core::testing::{
    block_on, check_hybrid_target, greedy_plain, greedy_speculative, rel_err, sampled_plain,
    sampled_speculative, synthetic_block_drafters, synthetic_decoder, SyntheticDims,
};
use blockdraft_cpu::CpuBackend;
use blockdraft_cuda::CudaBackend;
use blockdraft_gguf::GgufFile;
use std::sync::Arc;

fn load<B: Backend>(file: &GgufFile, be: Arc<B>) -> Arc<Decoder<B>> {
    Arc::new(Decoder::load(file, be, &mut |_| {}).expect("load"))
}

#[test]
fn every_architecture_decodes_like_the_cpu_backend() {
    let Some(cuda) = common::cuda() else { return };
    let be = Arc::new(cuda);
    let prompt = [3u32, 14, 15, 9, 26, 5, 35, 8, 9, 7];
    for arch in ["llama", "qwen2", "qwen3", "gemma3"] {
        let m = synthetic_decoder(arch, SyntheticDims::default(), 21);
        let file = GgufFile::from_bytes(m.bytes).unwrap();
        let (g, c) = (
            load(&file, be.clone()),
            load(&file, Arc::new(CpuBackend::new(2))),
        );
        let mut sg = g.new_state(64, 16);
        let mut sc = c.new_state(64, 16);
        g.forward(&mut sg, &prompt, LogitRows::All, true, None)
            .unwrap();
        c.forward(&mut sc, &prompt, LogitRows::All, true, None)
            .unwrap();
        let err = rel_err(
            &block_on(g.backend.read(sg.logits())),
            &block_on(c.backend.read(sc.logits())),
        );
        assert!(
            be.device_error().is_none(),
            "{arch}: {:?}",
            be.device_error()
        );
        assert!(err < 1e-3, "{arch}: prefill logits differ by {err}");
        assert_eq!(
            greedy_plain(&g, &prompt, 40),
            greedy_plain(&c, &prompt, 40),
            "{arch}: greedy continuation"
        );
    }
}

/// Every block-drafter variant on a synthetic target, and the drafters
/// that need no DFlash weights: greedy speculative output equals plain.
#[test]
fn every_drafter_kind_is_identical_to_plain_on_a_synthetic_target() {
    let Some(cuda) = common::cuda() else { return };
    let m = synthetic_decoder("qwen3", SyntheticDims::default(), 11);
    let file = GgufFile::from_bytes(m.bytes).unwrap();
    let dec = load(&file, Arc::new(cuda));
    let n_vocab = dec.config.n_vocab;
    let prompt = [3u32, 14, 15, 9, 26, 5, 3, 14, 15, 9];
    let n = 24;
    let want = greedy_plain(&dec, &prompt, n);
    let ctx = prompt.len() + n + 32;
    for (kind, bytes) in synthetic_block_drafters(n_vocab) {
        let f = GgufFile::from_bytes(bytes).unwrap();
        let mut d = DFlashDrafter::load(&f, &dec, ctx, 32).unwrap();
        let (got, stats) = greedy_speculative(&dec, &mut d, &prompt, n, PolicyConfig::fixed(7));
        assert_eq!(got, want, "{kind}");
        assert!(stats.rounds > 0, "{kind} drafted");
    }
    let sequence: Vec<u32> = prompt.iter().chain(&want).copied().collect();
    let mut others: Vec<(&str, Box<dyn Drafter<CudaBackend>>)> = vec![
        ("ngram", Box::new(NgramDrafter::default())),
        (
            "draft model",
            Box::new(DraftModelDrafter::new(dec.clone(), n_vocab, ctx).unwrap()),
        ),
        (
            "oracle, all accepted",
            Box::new(OracleDrafter::new(sequence.clone(), 0.0, n_vocab, 1)),
        ),
        (
            "oracle, none accepted",
            Box::new(OracleDrafter::new(sequence, 1.0, n_vocab, 1)),
        ),
    ];
    for (kind, d) in others.iter_mut() {
        let (got, stats) = greedy_speculative(&dec, d.as_mut(), &prompt, n, PolicyConfig::fixed(5));
        assert_eq!(got, want, "{kind}");
        match *kind {
            "oracle, all accepted" | "draft model" => {
                assert_eq!(stats.accepted, stats.drafted, "{kind}: {stats:?}")
            }
            "oracle, none accepted" => assert_eq!(stats.accepted, 0, "{kind}"),
            _ => {}
        }
    }
    assert!(
        dec.backend.device_error().is_none(),
        "{:?}",
        dec.backend.device_error()
    );
}

/// At temperature > 0 every committed token is the target's seeded draw
/// for its position, so the output does not depend on the drafter and
/// equals plain sampling.
#[test]
fn sampled_speculative_equals_sampled_plain() {
    let Some(cuda) = common::cuda() else { return };
    let m = synthetic_decoder("qwen3", SyntheticDims::default(), 11);
    let file = GgufFile::from_bytes(m.bytes).unwrap();
    let dec = load(&file, Arc::new(cuda));
    let prompt = [3u32, 14, 15, 9, 26, 5, 3, 14, 15, 9];
    let n = 24;
    let params = SamplingParams {
        temperature: 0.8,
        top_k: 20,
        top_p: 0.95,
        min_p: 0.02,
        seed: 42,
        ..Default::default()
    };
    let plain = sampled_plain(&dec, &prompt, n, &params);
    for (kind, bytes) in synthetic_block_drafters(dec.config.n_vocab) {
        let f = GgufFile::from_bytes(bytes).unwrap();
        let mut d = DFlashDrafter::load(&f, &dec, prompt.len() + n + 32, 32).unwrap();
        let (got, _) =
            sampled_speculative(&dec, &mut d, &prompt, n, &params, PolicyConfig::fixed(7));
        assert_eq!(got, plain, "{kind}");
    }
    assert!(
        dec.backend.device_error().is_none(),
        "{:?}",
        dec.backend.device_error()
    );
}

/// A hybrid (`qwen35`) target on CUDA as on the CPU backend, speculative
/// rollbacks of its recurrent state included (`testing::check_hybrid_target`).
#[test]
fn a_hybrid_target_decodes_like_the_cpu_backend_and_rolls_back() {
    let Some(cuda) = common::cuda() else { return };
    let cuda = Arc::new(cuda);
    check_hybrid_target(cuda.clone(), Arc::new(CpuBackend::new(2)));
    assert_eq!(cuda.device_error().map(|e| e.to_string()), None);
}
