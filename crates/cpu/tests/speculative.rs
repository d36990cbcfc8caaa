//! Speculative decoding on the CPU backend: for every drafter kind, greedy
//! speculative output is token-identical to plain greedy decoding on real
//! models (rounds where every draft is accepted and where none is
//! included); DFlash loading rejects every mismatch and every tensor its
//! variant would not read; at temperature > 0 the output follows the
//! target's distribution.

mod common;

use blockdraft_core::model::Decoder;
use blockdraft_core::sampling::{Sampler, SamplingParams};
use blockdraft_core::speculative::{
    generate_speculative, DFlashDrafter, DraftModelDrafter, DraftPolicy, Drafter, NgramDrafter,
    OracleDrafter, PolicyConfig, CATCH_UP_WINDOW,
};
use blockdraft_core::testing::block_on;
use blockdraft_core::testing::{
    device_draft, greedy_plain, greedy_speculative, observed_block_drafters, sampled_plain,
    sampled_speculative, synthetic_decoder, synthetic_dflash, synthetic_dflash2,
    synthetic_dflash2_d2t, synthetic_dfly, SyntheticDFlash, SyntheticDFlash2, SyntheticDims,
};
use blockdraft_core::ModelError;
use blockdraft_cpu::CpuBackend;
use blockdraft_gguf::{GgmlType, GgufFile, GgufWriter};
use std::sync::Arc;

const SMOLLM2: &str = "smollm2-135m-instruct-q4_1.gguf";
const QWEN05: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
const QWEN15: &str = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";

struct Target {
    dec: Arc<Decoder<CpuBackend>>,
}

fn load(path: &std::path::Path) -> Target {
    let file = GgufFile::open(path).unwrap();
    let dec = Arc::new(Decoder::load(&file, Arc::new(CpuBackend::new(2)), &mut |_| {}).unwrap());
    Target { dec }
}

/// Prompts as token ids; some repetitive so n-gram lookup has something to find.
fn prompts(n_vocab: usize) -> Vec<Vec<u32>> {
    let m = n_vocab as u32;
    vec![
        vec![1 % m, 504 % m, 3458 % m, 282 % m, 4649 % m, 314 % m],
        (0..24)
            .map(|i| [578u32, 1215, 902, 281, 1115, 284][i % 6] % m)
            .collect(),
        vec![9 % m, 1006 % m, 9 % m, 1006 % m, 9 % m, 1006 % m, 42 % m],
    ]
}

#[test]
fn ngram_greedy_is_identical_to_plain() {
    let Some(path) = common::model(SMOLLM2) else {
        return;
    };
    let t = load(&path);
    let mut any_accepted = false;
    for prompt in prompts(t.dec.config.n_vocab) {
        let want = greedy_plain(&t.dec, &prompt, 40);
        for n_max in [2, 5, 8] {
            let (got, stats) = greedy_speculative(
                &t.dec,
                &mut NgramDrafter::default(),
                &prompt,
                40,
                PolicyConfig::fixed(n_max),
            );
            assert_eq!(got, want, "n-gram, n_max {n_max}");
            any_accepted |= stats.accepted > 0;
        }
    }
    assert!(
        any_accepted,
        "the repetitive prompts should let n-gram drafts through"
    );
}

/// Every penalty (repetition, presence, frequency) applies to each verify
/// row with the drafts before it as context: greedy and seeded sampling
/// give plain decoding's tokens with drafts that are all accepted.
#[test]
fn penalized_speculative_decoding_equals_plain() {
    let Some(path) = common::model(SMOLLM2) else {
        return;
    };
    let t = load(&path);
    let n_vocab = t.dec.config.n_vocab;
    let prompt = &prompts(n_vocab)[1];
    let penalized = SamplingParams {
        repeat_penalty: 1.2,
        presence_penalty: 0.7,
        frequency_penalty: 0.4,
        repeat_last_n: 32,
        ..SamplingParams::greedy()
    };
    let sampled = SamplingParams {
        temperature: 0.8,
        seed: 3,
        ..penalized.clone()
    };
    for params in [penalized, sampled] {
        let want = sampled_plain(&t.dec, prompt, 32, &params);
        let unpenalized = SamplingParams {
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            ..params.clone()
        };
        assert_ne!(
            want,
            sampled_plain(&t.dec, prompt, 32, &unpenalized),
            "{params:?}"
        );
        let sequence: Vec<u32> = prompt.iter().chain(&want).copied().collect();
        let mut oracle = OracleDrafter::new(sequence, 0.0, n_vocab, 1);
        let (got, stats) = sampled_speculative(
            &t.dec,
            &mut oracle,
            prompt,
            32,
            &params,
            PolicyConfig::fixed(5),
        );
        assert_eq!(got, want, "{params:?}");
        assert!(stats.accepted > 20, "{params:?}: {stats:?}");
    }
}

#[test]
fn oracle_drafts_all_accepted_or_all_rejected_stay_identical() {
    let Some(path) = common::model(SMOLLM2) else {
        return;
    };
    let t = load(&path);
    let n_vocab = t.dec.config.n_vocab;
    for prompt in prompts(n_vocab).iter().take(2) {
        let want = greedy_plain(&t.dec, prompt, 32);
        let sequence: Vec<u32> = prompt.iter().chain(&want).copied().collect();
        for n_max in [3, 8] {
            let mut all = OracleDrafter::new(sequence.clone(), 0.0, n_vocab, 1);
            let (got, stats) =
                greedy_speculative(&t.dec, &mut all, prompt, 32, PolicyConfig::fixed(n_max));
            assert_eq!(got, want);
            assert_eq!(
                stats.accepted, stats.drafted,
                "every oracle draft is accepted"
            );
            assert!(stats.tau() > n_max as f64 * 0.8, "tau {}", stats.tau());
            let mut none = OracleDrafter::new(sequence.clone(), 1.0, n_vocab, 1);
            let (got, stats) =
                greedy_speculative(&t.dec, &mut none, prompt, 32, PolicyConfig::fixed(n_max));
            assert_eq!(got, want);
            assert_eq!(stats.accepted, 0, "every corrupted draft is rejected");
            assert!(stats.drafted > 0);
        }
    }
}

#[test]
fn draft_model_greedy_is_identical_to_plain() {
    let Some(path) = common::model(SMOLLM2) else {
        return;
    };
    let t = load(&path);
    // A model drafting for itself: every draft is accepted.
    for prompt in prompts(t.dec.config.n_vocab).iter().take(2) {
        let want = greedy_plain(&t.dec, prompt, 24);
        let mut d = DraftModelDrafter::new(t.dec.clone(), t.dec.config.n_vocab, 128).unwrap();
        let (got, stats) = greedy_speculative(&t.dec, &mut d, prompt, 24, PolicyConfig::fixed(4));
        assert_eq!(got, want);
        assert_eq!(stats.accepted, stats.drafted);
    }
    // The real pair: Qwen2.5-Coder 0.5B drafting for 1.5B.
    let (Some(p05), Some(p15)) = (common::model(QWEN05), common::model(QWEN15)) else {
        return;
    };
    let (small, big) = (load(&p05), load(&p15));
    let prompt = vec![750u32, 15801, 2075, 1445, 982, 262, 470];
    let want = greedy_plain(&big.dec, &prompt, 20);
    let mut d = DraftModelDrafter::new(small.dec.clone(), big.dec.config.n_vocab, 128).unwrap();
    let (got, stats) = greedy_speculative(&big.dec, &mut d, &prompt, 20, PolicyConfig::fixed(5));
    assert_eq!(got, want);
    assert!(
        stats.accepted > 0,
        "0.5B should agree with 1.5B somewhere: {stats:?}"
    );
}

#[test]
fn a_losing_draft_model_catches_up_on_bounded_windows_and_stays_identical() {
    // Two unrelated random models: the draft (as big as the target) is
    // slower than plain decoding and nearly never right.
    let dims = SyntheticDims {
        n_layer: 2,
        ..SyntheticDims::default()
    };
    let tfile = GgufFile::from_bytes(synthetic_decoder("qwen3", dims, 31).bytes).unwrap();
    let dfile = GgufFile::from_bytes(synthetic_decoder("qwen3", dims, 32).bytes).unwrap();
    let be = Arc::new(CpuBackend::new(1));
    let target = Decoder::load(&tfile, be.clone(), &mut |_| {}).unwrap();
    let draft = Arc::new(Decoder::load(&dfile, be, &mut |_| {}).unwrap());
    let prompt: Vec<u32> = (0..48).map(|i| (i * 7 % dims.n_vocab) as u32).collect();
    let n = 128;
    let want = greedy_plain(&target, &prompt, n);
    let mut d = DraftModelDrafter::new(draft, dims.n_vocab, 256).unwrap();
    let (got, stats) = greedy_speculative(&target, &mut d, &prompt, n, PolicyConfig::default());
    assert_eq!(got, want, "catch-ups that skip tokens change nothing");
    // The first catch-up reads what is committed by then (up to one batch
    // of 256: the prompt, or more when the policy first decodes plainly, as
    // it does when timings are noisy), then every gap on one window at
    // most. (How often it speculates is not asserted: passes this small
    // time as noise.)
    let first = (prompt.len() + n).min(256);
    assert!(
        stats.caught_up <= first + stats.rounds * CATCH_UP_WINDOW,
        "{stats:?}"
    );
}

#[test]
fn a_draft_model_caught_up_in_parts_drafts_as_one_caught_up_at_once() {
    let Some(path) = common::model(SMOLLM2) else {
        return;
    };
    let t = load(&path);
    let history: Vec<u32> = prompts(t.dec.config.n_vocab).concat();
    let n_vocab = t.dec.config.n_vocab;
    let mut whole = DraftModelDrafter::new(t.dec.clone(), n_vocab, 128).unwrap();
    let mut parts = DraftModelDrafter::new(t.dec.clone(), n_vocab, 128).unwrap();
    let lag = Drafter::<CpuBackend>::lag(&whole, &history);
    assert_eq!(
        lag,
        history.len() - 2,
        "the first catch-up reads the prompt"
    );
    assert_eq!(whole.catch_up(&history, usize::MAX).unwrap(), lag);
    let mut fed = 0;
    while Drafter::<CpuBackend>::lag(&parts, &history) > 0 {
        let n = parts.catch_up(&history, 3).unwrap();
        assert!((1..=3).contains(&n), "a part of at most 3, got {n}");
        fed += n;
    }
    assert_eq!(fed, lag);
    assert_eq!(Drafter::<CpuBackend>::lag(&whole, &history), 0);
    let draft = |d: &mut DraftModelDrafter<CpuBackend>| block_on(d.propose(&history, 5)).unwrap();
    assert_eq!(draft(&mut parts), draft(&mut whole));
}

fn dflash_spec(target: &Decoder<CpuBackend>, layers: Vec<i32>, block_size: u32) -> SyntheticDFlash {
    SyntheticDFlash {
        dims: SyntheticDims {
            n_layer: 1,
            n_embd: target.config.n_embd,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 32,
            n_ff: 128,
            n_vocab: 0,
            window: 0,
        },
        target_layers: layers,
        block_size,
        mask_token: 0,
        matrix_type: GgmlType::Q8_0,
    }
}

#[test]
fn dflash_greedy_is_identical_to_plain_on_llama_and_qwen2_targets() {
    for (model, depth) in [(SMOLLM2, 30), (QWEN05, 24)] {
        let Some(path) = common::model(model) else {
            return;
        };
        let t = load(&path);
        for (block, layers) in [(4u32, vec![1, depth / 2, depth]), (8, vec![2, depth - 1])] {
            let drafter_file = GgufFile::from_bytes(
                synthetic_dflash(&dflash_spec(&t.dec, layers, block), 5).bytes,
            )
            .unwrap();
            for prompt in prompts(t.dec.config.n_vocab)
                .iter()
                .skip(block as usize / 8)
                .take(1)
            {
                let want = greedy_plain(&t.dec, prompt, 16);
                let mut d =
                    DFlashDrafter::load(&drafter_file, &t.dec, prompt.len() + 64, 32).unwrap();
                let (got, stats) =
                    greedy_speculative(&t.dec, &mut d, prompt, 16, PolicyConfig::fixed(16));
                assert_eq!(got, want, "{model}, block {block}");
                assert!(stats.rounds > 0);
                assert!(
                    stats.slot_tried.len() < block as usize,
                    "drafts are clamped to the block"
                );
            }
        }
    }
}

#[test]
fn dflash2_greedy_is_identical_to_plain_on_smollm2_with_full_and_reduced_heads() {
    let Some(path) = common::model(SMOLLM2) else {
        return;
    };
    let t = load(&path);
    let mut spec = dflash_spec(&t.dec, vec![2, 29], 8);
    spec.dims.n_vocab = t.dec.config.n_vocab;
    let v2 = SyntheticDFlash2 {
        conv_kernel_size: 2,
        conv_group_size: 16,
        selector_rank: 8,
        selector_top_k: 4,
    };
    // Full head, and a reduced head of 4096 target ids (a d2t map).
    let d2t: Vec<i64> = (0..4096)
        .map(|i| (i * 7) % t.dec.config.n_vocab as i64)
        .collect();
    let files = [
        GgufFile::from_bytes(synthetic_dflash2(&spec, &v2, 6).bytes).unwrap(),
        GgufFile::from_bytes(synthetic_dflash2_d2t(&spec, &v2, &d2t, 6).bytes).unwrap(),
    ];
    for (drafter_file, prompt) in files.iter().zip(prompts(t.dec.config.n_vocab).iter()) {
        let want = greedy_plain(&t.dec, prompt, 16);
        let mut d = DFlashDrafter::load(drafter_file, &t.dec, prompt.len() + 64, 32).unwrap();
        assert!(d.config().variant.dflash2().is_some());
        let reduced = std::ptr::eq(drafter_file, &files[1]);
        assert_eq!(
            d.config().d2t.as_ref().map(Vec::len),
            reduced.then_some(4096)
        );
        let (got, stats) = greedy_speculative(&t.dec, &mut d, prompt, 16, PolicyConfig::fixed(16));
        assert_eq!(got, want);
        assert!(stats.rounds > 0);
        assert!(
            stats.slot_tried.len() < 8,
            "drafts are clamped to the block"
        );
    }
}

#[test]
fn dflash_loading_rejects_mismatches() {
    let target = synthetic_decoder("qwen3", SyntheticDims::default(), 1);
    let tfile = GgufFile::from_bytes(target.bytes).unwrap();
    let tdec = Decoder::load(&tfile, Arc::new(CpuBackend::new(1)), &mut |_| {}).unwrap();
    let good = SyntheticDFlash {
        dims: SyntheticDims {
            n_layer: 2,
            ..SyntheticDims::default()
        },
        target_layers: vec![1, 7],
        block_size: 8,
        mask_token: 60,
        matrix_type: GgmlType::F32,
    };
    let load = |bytes: Vec<u8>| {
        DFlashDrafter::load(&GgufFile::from_bytes(bytes).unwrap(), &tdec, 64, 16)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    assert_eq!(load(synthetic_dflash(&good, 2).bytes), Ok(()));

    let expect = |spec: SyntheticDFlash, needle: &str| {
        let err = load(synthetic_dflash(&spec, 2).bytes).unwrap_err();
        assert!(err.contains(needle), "expected `{needle}` in `{err}`");
    };
    expect(
        SyntheticDFlash {
            target_layers: vec![1, 8],
            ..good.clone()
        },
        "target layer 8",
    );
    expect(
        SyntheticDFlash {
            target_layers: vec![-1],
            ..good.clone()
        },
        "target layer -1",
    );
    expect(
        SyntheticDFlash {
            mask_token: 61,
            ..good.clone()
        },
        "mask token 61",
    );
    expect(
        SyntheticDFlash {
            dims: SyntheticDims {
                n_embd: 32,
                ..good.dims
            },
            ..good.clone()
        },
        "n_embd 32",
    );
    expect(
        SyntheticDFlash {
            block_size: 1,
            ..good.clone()
        },
        "block size 1",
    );

    // Keys and tensors removed or added after the fact.
    let base = GgufFile::from_bytes(synthetic_dflash(&good, 2).bytes).unwrap();
    let rewrite = |drop_key: Option<&str>, extra_tensor: Option<&str>| {
        let mut w = GgufWriter::new();
        for (k, v) in base.metadata().iter() {
            if Some(k) != drop_key {
                w.add(k, v.clone());
            }
        }
        for t in base.tensors() {
            w.add_tensor(
                t.name.clone(),
                &t.dims,
                t.ty,
                base.tensor_data(&t.name).unwrap().to_vec(),
            )
            .unwrap();
        }
        if let Some(name) = extra_tensor {
            w.add_f32_tensor(name, &[4], &[0.0; 4]).unwrap();
        }
        load(w.to_bytes().unwrap()).unwrap_err()
    };
    assert!(rewrite(Some("dflash.target_layers"), None).contains("requires 'target_layers'"));
    assert!(rewrite(Some("tokenizer.ggml.mask_token_id"), None).contains("no mask token"));
    // Log-SNR conditioning (PrismML DSpark) is refused, naming what is wrong.
    let with_keys = |extra: &[(&str, blockdraft_gguf::Value)]| {
        let mut w = GgufWriter::new();
        w.add_all(base.metadata());
        for (k, v) in extra {
            w.add(*k, v.clone());
        }
        for t in base.tensors() {
            w.add_tensor(
                t.name.clone(),
                &t.dims,
                t.ty,
                base.tensor_data(&t.name).unwrap().to_vec(),
            )
            .unwrap();
        }
        load(w.to_bytes().unwrap()).unwrap_err()
    };
    use blockdraft_gguf::Value as V;
    let snr = ("dflash.log_snr_conditioning", V::Bool(true));
    assert!(
        with_keys(std::slice::from_ref(&snr)).contains("requires finite min_log_snr < max_log_snr")
    );
    let bad = [
        snr.clone(),
        ("dflash.min_log_snr", V::F32(2.0)),
        ("dflash.max_log_snr", V::F32(1.0)),
    ];
    assert!(with_keys(&bad).contains("requires finite min_log_snr < max_log_snr"));
    let ok = [
        snr,
        ("dflash.min_log_snr", V::F32(-5.0)),
        ("dflash.max_log_snr", V::F32(5.0)),
    ];
    assert!(with_keys(&ok).contains("log-SNR conditioned DSpark drafters"));
    // A bare `layer_fusion` makes a DFly file, which lacks its context norm.
    assert!(rewrite(None, Some("layer_fusion"))
        .contains("DFly drafter (tensor `layer_fusion`) lacks `context_norm.weight`"));
    // A bare marker makes a DSpark or reduced-vocabulary file, which then
    // fails on its own checks (tests/dspark.rs covers them in full).
    for (tensor, needle) in [
        ("markov_w1.weight", "`markov_w1.weight` has shape [4]"),
        ("d2t", "needs the drafter's own `output.weight`"),
    ] {
        let err = rewrite(None, Some(tensor));
        assert!(err.contains(needle), "{tensor}: {err}");
    }
    // DFlash2 is supported, but the selector tensor alone is not a DFlash2 file.
    assert!(rewrite(None, Some("selector_hidden.weight"))
        .contains("DFlash2 model is missing conv/selector metadata"));
}

/// `base` without the tensors `drop` picks, plus those of `donor` that
/// `take` picks (or F32 zeros of the given dims).
fn splice(
    base: &GgufFile,
    drop: impl Fn(&str) -> bool,
    donor: Option<&GgufFile>,
    take: impl Fn(&str) -> bool,
    zeros: &[(&str, &[u64])],
) -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add_all(base.metadata());
    let kept = base
        .tensors()
        .iter()
        .filter(|t| !drop(&t.name))
        .map(|t| (base, t));
    let taken = donor.into_iter().flat_map(|d| {
        d.tensors()
            .iter()
            .filter(|t| take(&t.name))
            .map(move |t| (d, t))
    });
    for (f, t) in kept.chain(taken) {
        let data = f.tensor_data(&t.name).unwrap().to_vec();
        w.add_tensor(t.name.clone(), &t.dims, t.ty, data).unwrap();
    }
    for (name, dims) in zeros {
        let n = dims.iter().product::<u64>() as usize;
        w.add_f32_tensor(*name, dims, &vec![0.0; n]).unwrap();
    }
    w.to_bytes().unwrap()
}

#[test]
fn drafter_files_account_for_every_tensor() {
    let target = synthetic_decoder("qwen3", SyntheticDims::default(), 1);
    let tfile = GgufFile::from_bytes(target.bytes).unwrap();
    let tdec = Decoder::load(&tfile, Arc::new(CpuBackend::new(1)), &mut |_| {}).unwrap();
    // A target may hold what the decoder does not run (an MTP layer).
    let mtp = splice(
        &tfile,
        |_| false,
        None,
        |_| false,
        &[("blk.7.nextn.eh_proj.weight", &[96, 48])],
    );
    let mtp = GgufFile::from_bytes(mtp).unwrap();
    assert!(Decoder::load(&mtp, Arc::new(CpuBackend::new(1)), &mut |_| {}).is_ok());

    let mut spec = SyntheticDFlash::small(48, vec![1, 4, 7], GgmlType::F32);
    spec.dims.n_vocab = 61;
    let v2 = SyntheticDFlash2 {
        conv_kernel_size: 2,
        conv_group_size: 16,
        selector_rank: 8,
        selector_top_k: 4,
    };
    let file = |bytes: Vec<u8>| GgufFile::from_bytes(bytes).unwrap();
    let v1 = file(synthetic_dflash(&spec, 2).bytes);
    let dflash2 = file(synthetic_dflash2(&spec, &v2, 2).bytes);
    let dfly = file(synthetic_dfly(&spec, true, 2).bytes);
    let load = |bytes: Vec<u8>| {
        DFlashDrafter::load(&GgufFile::from_bytes(bytes).unwrap(), &tdec, 64, 16).map(|_| ())
    };
    let none = |_: &str| false;
    for (bytes, variant, names, more) in [
        // DFlash2 that lost its selector: the convolutions would be skipped.
        (
            splice(&dflash2, |n| n.starts_with("selector_"), None, none, &[]),
            "DFlash v1",
            vec!["blk.0.attn_conv_base", "blk.1.ffn_conv_proj.weight"],
            "",
        ),
        // A predecessor correction without DFly's fusion.
        (
            splice(
                &v1,
                none,
                Some(&dfly),
                |n| n.starts_with("hidden_correction."),
                &[],
            ),
            "DFlash v1",
            vec![
                "hidden_correction.hidden_norm.weight",
                "hidden_correction.down.weight",
            ],
            "",
        ),
        // A typo'd optional tensor, and one of llama.cpp's this port never reads.
        (
            splice(
                &v1,
                none,
                None,
                none,
                &[("blk.0.attn_q.bais", &[64]), ("fc.scale", &[1])],
            ),
            "DFlash v1",
            vec!["blk.0.attn_q.bais", "fc.scale"],
            "",
        ),
        // DFly reads `context_norm`, never a leftover `enc.output_norm`.
        (
            splice(
                &dfly,
                none,
                Some(&v1),
                |n| n == "enc.output_norm.weight",
                &[],
            ),
            "DFly",
            vec!["enc.output_norm.weight"],
            "",
        ),
        // Every tensor is named in the error, eight in its message.
        (
            splice(
                &dflash2,
                |n| n.starts_with("selector_"),
                Some(&dfly),
                |n| n.starts_with("hidden_correction."),
                &[],
            ),
            "DFlash v1",
            vec!["blk.0.attn_conv_base", "hidden_correction.down.weight"],
            " and 5 more",
        ),
    ] {
        let err = load(bytes).unwrap_err();
        let msg = err.to_string();
        let ModelError::UnusedTensors {
            variant: v,
            names: all,
        } = err
        else {
            panic!("{variant} {names:?}: {msg}")
        };
        assert_eq!(v, variant, "{msg}");
        for n in &names {
            assert!(all.iter().any(|a| a == n), "{n} in {all:?}");
        }
        assert!(
            msg.contains(&format!("a {variant} drafter does not use")),
            "{msg}"
        );
        assert!(msg.contains(&format!("`{}`", names[0])), "{msg}");
        assert_eq!(msg.contains(" more"), !more.is_empty(), "{msg}");
        assert!(msg.contains(more), "{msg}");
    }
    // The valid files load.
    for f in [&v1, &dflash2, &dfly] {
        assert!(DFlashDrafter::load(f, &tdec, 64, 16).is_ok());
    }
}

/// At temperature > 0 speculative decoding gives, for every seed, the
/// tokens plain decoding samples with that seed (each position draws its
/// own number, whatever was drafted), with a draft model and n-gram lookup;
/// and over seeds the joint distribution of the first two tokens (the
/// second decided by a verify round) is the target's.
#[test]
fn speculative_sampling_gives_plain_sampling_tokens_for_every_seed() {
    let dims = SyntheticDims {
        n_layer: 2,
        ..SyntheticDims::default()
    };
    let tfile = GgufFile::from_bytes(synthetic_decoder("qwen3", dims, 21).bytes).unwrap();
    let dfile = GgufFile::from_bytes(synthetic_decoder("qwen3", dims, 22).bytes).unwrap();
    let be = Arc::new(CpuBackend::new(1));
    let target = Decoder::load(&tfile, be.clone(), &mut |_| {}).unwrap();
    let draft = Arc::new(Decoder::load(&dfile, be.clone(), &mut |_| {}).unwrap());
    let params = SamplingParams {
        temperature: 1.0,
        top_k: 3,
        top_p: 1.0,
        min_p: 0.0,
        ..Default::default()
    };
    // Every token occurs in the prompt, so n-gram lookup always finds a match.
    let prompt: Vec<u32> = (0..dims.n_vocab as u32).collect();

    // Exact joint distribution of (t1, t2) from the target alone.
    let dist_after = |ctx: &[u32]| {
        let mut state = target.new_state(80, 8);
        blockdraft_core::generate::prefill(&target, &mut state, ctx).unwrap();
        Sampler::new(params.clone()).distribution(&block_on(
            blockdraft_core::backend::Device::read(&*be, state.logits()),
        ))
    };
    let mut exact = std::collections::HashMap::new();
    for &(t1, p1) in &dist_after(&prompt).candidates {
        let ctx: Vec<u32> = prompt.iter().copied().chain([t1]).collect();
        for &(t2, p2) in &dist_after(&ctx).candidates {
            exact.insert((t1, t2), (p1 * p2) as f64);
        }
    }

    let runs = 3000;
    let sampler = |seed| {
        Sampler::new(SamplingParams {
            seed,
            ..params.clone()
        })
    };
    let plain: Vec<Vec<u32>> = (0..runs)
        .map(|seed| {
            let mut state = target.new_state(80, 8);
            let eog = |_| false;
            block_on(blockdraft_core::generate::generate(
                &target,
                &mut state,
                &prompt,
                3,
                &mut sampler(seed),
                &eog,
                &mut |_| true,
            ))
            .unwrap()
            .0
        })
        .collect();
    for kind in ["draft-model", "ngram"] {
        let mut counts = std::collections::HashMap::new();
        let mut drafted = 0;
        for seed in 0..runs {
            let mut drafter: Box<dyn Drafter<CpuBackend>> = match kind {
                "ngram" => Box::new(NgramDrafter::default()),
                _ => Box::new(DraftModelDrafter::new(draft.clone(), dims.n_vocab, 80).unwrap()),
            };
            let mut state = target.new_state(80, 8);
            let mut policy = DraftPolicy::new(PolicyConfig::fixed(3));
            let (out, _, stats) = block_on(generate_speculative(
                &target,
                &mut state,
                drafter.as_mut(),
                &mut policy,
                &prompt,
                3,
                &mut sampler(seed),
                &|_| false,
                &mut |_| true,
                &mut |_| {},
            ))
            .unwrap();
            drafted += stats.drafted;
            assert_eq!(out, plain[seed as usize], "{kind}: seed {seed}");
            *counts.entry((out[0], out[1])).or_insert(0usize) += 1;
        }
        assert!(drafted > 0, "{kind}: the drafter must be exercised");
        for (pair, &p) in &exact {
            let got = *counts.get(pair).unwrap_or(&0) as f64 / runs as f64;
            let sigma = (p * (1.0 - p) / runs as f64).sqrt();
            assert!(
                (got - p).abs() < 5.0 * sigma + 1e-3,
                "{kind}: pair {pair:?}: {got:.4} vs exact {p:.4}"
            );
        }
        let outside: usize = counts
            .iter()
            .filter(|(k, _)| !exact.contains_key(k))
            .map(|(_, c)| c)
            .sum();
        assert_eq!(outside, 0, "{kind}: tokens outside the target's top-k");
    }
}

/// Every block variant runs its whole trained block whatever the draft's
/// length (its masks attend to each other as in training), so a draft of
/// k tokens is the first k of the whole block's draft, on the host and on
/// the device path alike. Before, a k-token draft ran a (k + 1)-row block
/// and its rows saw a different block.
#[test]
fn a_short_draft_is_the_start_of_the_whole_blocks_draft_for_every_variant() {
    let be = Arc::new(CpuBackend::new(2));
    let m = synthetic_decoder("qwen3", SyntheticDims::default(), 11);
    let dec = Decoder::load(
        &GgufFile::from_bytes(m.bytes).unwrap(),
        be.clone(),
        &mut |_| {},
    )
    .unwrap();
    let mut history = vec![3u32, 14, 15, 9, 26, 5];
    let drafters = observed_block_drafters(&dec, &history);
    history.push(40);
    for (kind, mut d) in drafters {
        let whole = block_on(d.propose(&history, 7)).unwrap().tokens;
        assert_eq!(whole.len(), 7, "{kind}");
        for k in 1..7 {
            let short = block_on(d.propose(&history, k)).unwrap().tokens;
            assert_eq!(short, whole[..k], "{kind}: a draft of {k}");
            let device = device_draft(&*be, &mut d, &history, k).expect("drafts on the device");
            assert_eq!(
                device,
                whole[..k],
                "{kind}: a draft of {k} on the device path"
            );
        }
    }
}
