//! DSpark (Markov head, confidence head, `sample_from_anchor`) and reduced
//! draft vocabularies (`d2t`) on the CPU backend: the Markov chain and the
//! confidences against a scalar f64 reference, the row convention, every
//! rejection (a predecessor correction and unused tensors included), the
//! d2t scatter and its validation, and greedy speculative output identical
//! to plain decoding on a synthetic and a real target.

mod common;

use blockdraft_core::model::{Decoder, LogitRows, Taps};
use blockdraft_core::sampling::argmax;
use blockdraft_core::speculative::{DFlashDrafter, Drafter, PolicyConfig};
use blockdraft_core::testing::block_on;
use blockdraft_core::testing::{
    greedy_plain, greedy_speculative, synthetic_decoder, synthetic_dflash_d2t, synthetic_dspark,
    SyntheticDFlash, SyntheticDSpark, SyntheticDims, SyntheticModel,
};
use blockdraft_core::ModelError;
use blockdraft_cpu::CpuBackend;
use blockdraft_gguf::{GgmlType, GgufFile, GgufWriter};
use std::sync::Arc;

const N_VOCAB: usize = 61;

struct Target {
    dec: Decoder<CpuBackend>,
}

fn synthetic_target() -> Target {
    let m = synthetic_decoder("qwen3", SyntheticDims::default(), 11);
    let file = GgufFile::from_bytes(m.bytes).unwrap();
    let dec = Decoder::load(&file, Arc::new(CpuBackend::new(2)), &mut |_| {}).unwrap();
    Target { dec }
}

fn spec(n_embd: usize, n_vocab: usize, target_layers: Vec<i32>, ty: GgmlType) -> SyntheticDFlash {
    let mut spec = SyntheticDFlash::small(n_embd, target_layers, ty);
    spec.dims.n_vocab = n_vocab;
    spec
}

fn dspark(sample_from_anchor: bool, d2t: Option<Vec<i64>>) -> SyntheticDSpark {
    SyntheticDSpark {
        rank: 8,
        sample_from_anchor: Some(sample_from_anchor),
        has_confidence_head: Some(true),
        confidence_tensors: true,
        markov_scale: Some(0.7),
        d2t,
    }
}

/// Target ids of a `n`-row draft head: a stride through a vocabulary of
/// prime or power-of-two size, so the ids are distinct and scattered.
fn stride_map(n: usize, n_vocab: usize) -> Vec<i64> {
    (0..n).map(|i| ((i * 7) % n_vocab) as i64).collect()
}

fn matvec(w: &[f32], x: &[f64]) -> Vec<f64> {
    w.chunks_exact(x.len())
        .map(|r| r.iter().zip(x).map(|(&a, b)| a as f64 * b).sum())
        .collect()
}

fn close(a: f32, b: f64) -> bool {
    (a as f64 - b).abs() <= 1e-4 * (1.0 + b.abs())
}

fn load(t: &Target, bytes: Vec<u8>) -> Result<DFlashDrafter<CpuBackend>, String> {
    load_typed(t, bytes).map_err(|e| e.to_string())
}

fn load_typed(t: &Target, bytes: Vec<u8>) -> Result<DFlashDrafter<CpuBackend>, ModelError> {
    DFlashDrafter::load(&GgufFile::from_bytes(bytes).unwrap(), &t.dec, 64, 16)
}

fn load_err(t: &Target, bytes: Vec<u8>) -> ModelError {
    load_typed(t, bytes).err().expect("must be rejected")
}

/// DFly's five `hidden_correction.*` tensors for width `d` (intermediate 64).
fn correction(d: u64) -> Vec<(&'static str, Vec<u64>)> {
    vec![
        ("hidden_correction.hidden_norm.weight", vec![d]),
        ("hidden_correction.embed_norm.weight", vec![d]),
        ("hidden_correction.gate.weight", vec![2 * d, 64]),
        ("hidden_correction.up.weight", vec![2 * d, 64]),
        ("hidden_correction.down.weight", vec![64, d]),
    ]
}

/// Prefills the target with taps and injects them into `d`.
fn prefill(t: &Target, d: &mut DFlashDrafter<CpuBackend>, prompt: &[u32]) {
    let be = &*t.dec.backend;
    let mut taps = Taps::new(be, &t.dec.config, &d.config().target_layers, 16).unwrap();
    let mut state = t.dec.new_state(64, 16);
    t.dec
        .forward(&mut state, prompt, LogitRows::Last, true, Some(&mut taps))
        .unwrap();
    block_on(d.inject(taps.output(), 0, prompt.len())).unwrap();
}

#[test]
fn markov_chain_and_confidence_match_the_reference() {
    let t = synthetic_target();
    for (anchor_first, d2t) in [
        (true, None),
        (false, None),
        (true, Some(stride_map(40, N_VOCAB))),
    ] {
        let ds = dspark(anchor_first, d2t.clone());
        let m = synthetic_dspark(&spec(48, N_VOCAB, vec![1, 4, 7], GgmlType::F32), &ds, 3);
        let mut d = load(&t, m.bytes).unwrap();
        prefill(&t, &mut d, &[5, 17, 3, 42, 8]);
        let anchor = 21;
        let base = block_on(d.block_logits(anchor, 16)).unwrap();
        let h = block_on(d.block_hidden());
        let (tokens, logits) =
            block_on(d.draft_block(anchor, 16, &mut |r| Some(argmax(r)))).unwrap();
        // Anchor-first: B rows, all predictions; else B rows, row 0 not one.
        let first = if anchor_first { 0 } else { 1 };
        assert_eq!(base.len(), 8 * N_VOCAB);
        assert_eq!(tokens.len(), 8 - first);
        assert_eq!(d.max_draft(), 8 - first);
        let w = &m.weights;
        let (w1, w2) = (&w["markov_w1.weight"], &w["markov_w2.weight"]);
        let (wc, bc) = (&w["conf_proj.weight"], w["conf_proj.bias"][0] as f64);
        let map: Vec<usize> = match &d2t {
            Some(m) => m.iter().map(|&t| t as usize).collect(),
            None => (0..N_VOCAB).collect(),
        };
        let mut prev = anchor as usize;
        let mut markov_changes = false;
        for (k, i) in (first..8).enumerate() {
            let e: Vec<f64> = w1[prev * 8..(prev + 1) * 8]
                .iter()
                .map(|&x| x as f64)
                .collect();
            let mut want: Vec<f64> = base[i * N_VOCAB..(i + 1) * N_VOCAB]
                .iter()
                .map(|&x| x as f64)
                .collect();
            for (j, b) in matvec(w2, &e).into_iter().enumerate() {
                want[map[j]] += 0.7 * b;
            }
            let got = &logits[i * N_VOCAB..(i + 1) * N_VOCAB];
            for (v, (&g, &x)) in got.iter().zip(&want).enumerate() {
                assert!(
                    g == x as f32 || close(g, x),
                    "row {i} logit {v}: {g} vs {x}"
                );
            }
            let best = (0..N_VOCAB)
                .max_by(|&a, &b| want[a].total_cmp(&want[b]).then(b.cmp(&a)))
                .unwrap();
            assert_eq!(tokens[k] as usize, best, "row {i}");
            markov_changes |= argmax(&base[i * N_VOCAB..(i + 1) * N_VOCAB]) as usize != best;
            let x: Vec<f64> = h[i * 48..(i + 1) * 48]
                .iter()
                .chain(&w1[prev * 8..(prev + 1) * 8])
                .map(|&x| x as f64)
                .collect();
            let conf = 1.0 / (1.0 + (-(matvec(wc, &x)[0] + bc)).exp());
            let got = block_on(d.confidence(i, prev as u32)).unwrap();
            assert!(close(got, conf), "row {i} confidence {got} vs {conf}");
            prev = best;
        }
        assert!(markov_changes, "the Markov bias must change some draft");
    }
}

#[test]
fn p_min_stops_at_the_first_unconfident_row() {
    let t = synthetic_target();
    let m = synthetic_dspark(
        &spec(48, N_VOCAB, vec![1, 4, 7], GgmlType::F32),
        &dspark(true, None),
        4,
    );
    let mut d = load(&t, m.bytes).unwrap();
    prefill(&t, &mut d, &[9, 2, 33, 14]);
    let (tokens, _) = block_on(d.draft_block(12, 8, &mut |r| Some(argmax(r)))).unwrap();
    let mut prev = 12;
    let confs: Vec<f32> = tokens
        .iter()
        .enumerate()
        .map(|(i, &tok)| {
            let c = block_on(d.confidence(i, prev)).unwrap();
            prev = tok;
            c
        })
        .collect();
    let p_min = confs[2] + 1e-6;
    let stop = confs.iter().position(|&c| c < p_min).unwrap();
    d.p_min = p_min;
    let draft = block_on(d.propose(&[9, 2, 33, 14, 12], 16)).unwrap();
    assert_eq!(draft.tokens, tokens[..stop]);
}

/// `base` with tensors dropped and F32 tensors (zeros) added or replaced.
fn rewrite(base: &[u8], drop: &[&str], add: &[(&str, Vec<u64>)]) -> Vec<u8> {
    let base = GgufFile::from_bytes(base.to_vec()).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in base.metadata().iter() {
        w.add(k, v.clone());
    }
    for t in base.tensors() {
        if drop.contains(&t.name.as_str()) || add.iter().any(|(n, _)| *n == t.name) {
            continue;
        }
        let data = base.tensor_data(&t.name).unwrap().to_vec();
        w.add_tensor(t.name.clone(), &t.dims, t.ty, data).unwrap();
    }
    for (name, dims) in add {
        let n = dims.iter().product::<u64>() as usize;
        w.add_f32_tensor(*name, dims, &vec![0.0; n]).unwrap();
    }
    w.to_bytes().unwrap()
}

#[test]
fn dspark_and_d2t_rejections() {
    let t = synthetic_target();
    let s = spec(48, N_VOCAB, vec![1, 4, 7], GgmlType::F32);
    let full = synthetic_dspark(&s, &dspark(true, None), 5).bytes;
    let expect = |bytes: Vec<u8>, needle: &str| {
        let err = load(&t, bytes).err().expect("must be rejected");
        assert!(err.contains(needle), "expected `{needle}` in `{err}`");
    };
    // A declared confidence head without markov_w1 would load as v1.
    expect(
        rewrite(&full, &["markov_w1.weight", "markov_w2.weight"], &[]),
        "declares a confidence head, but markov_w1.weight is missing",
    );
    expect(
        rewrite(&full, &["conf_proj.weight"], &[]),
        "conf_proj.weight",
    );
    expect(
        rewrite(&full, &[], &[("markov_w2.weight", vec![8, 60])]),
        "markov_w2.weight",
    );
    // A predecessor correction needs DFly's fusion; on a Markov head its
    // meaning is undefined, so the file is refused rather than half-run.
    expect(
        rewrite(&full, &[], &correction(48)),
        "carries a predecessor correction (`hidden_correction.*`), which needs DFly's fusion",
    );
    // DFlash2's selector is not read by a DSpark drafter.
    match load_err(
        &t,
        rewrite(&full, &[], &[("selector_hidden.weight", vec![48, 8])]),
    ) {
        ModelError::UnusedTensors { variant, names } => {
            assert_eq!(
                (variant, names),
                ("DSpark", vec!["selector_hidden.weight".to_string()])
            )
        }
        e => panic!("{e}"),
    }
    // `conf_proj` is known optional only while the metadata declares no head.
    let declared_absent = SyntheticDSpark {
        has_confidence_head: Some(false),
        ..dspark(true, None)
    };
    assert!(load(&t, synthetic_dspark(&s, &declared_absent, 5).bytes).is_ok());
    let undeclared = SyntheticDSpark {
        has_confidence_head: None,
        confidence_tensors: false,
        ..dspark(true, None)
    };
    let bias_only = rewrite(
        &synthetic_dspark(&s, &undeclared, 5).bytes,
        &[],
        &[("conf_proj.bias", vec![1])],
    );
    expect(
        bias_only,
        "holds tensor `conf_proj.bias` that a DSpark drafter does not use",
    );
    // No confidence head: p_min must be 0.
    let no_head = SyntheticDSpark {
        has_confidence_head: Some(false),
        confidence_tensors: false,
        ..dspark(true, None)
    };
    let mut d = load(&t, synthetic_dspark(&s, &no_head, 5).bytes).unwrap();
    prefill(&t, &mut d, &[1, 2, 3]);
    assert_eq!(block_on(d.propose(&[1, 2, 3], 4)).unwrap().tokens.len(), 4);
    d.p_min = 0.5;
    let err = block_on(d.propose(&[1, 2, 3], 4)).unwrap_err().to_string();
    assert!(err.contains("set p_min 0"), "{err}");
    // d2t validation.
    let v1 = |map: Vec<i64>| synthetic_dflash_d2t(&s, &map, 6).bytes;
    expect(
        v1(vec![3, 9, N_VOCAB as i64]),
        "maps draft row 2 to 61, outside",
    );
    expect(v1(vec![3, -1]), "maps draft row 1 to -1");
    expect(v1(vec![3, 9, 3]), "maps two draft rows to target id 3");
    let ok = v1(vec![3, 9, 4]);
    expect(rewrite(&ok, &[], &[("output.weight", vec![48, 4])]), "d2t");
    expect(rewrite(&ok, &[], &[("d2t", vec![3])]), "expected I64");
    expect(rewrite(&ok, &["output.weight"], &[]), "own `output.weight`");
    assert!(load(&t, ok).is_ok());
}

#[test]
fn d2t_scatters_draft_rows_to_target_ids() {
    let t = synthetic_target();
    let s = spec(48, N_VOCAB, vec![1, 4, 7], GgmlType::F32);
    let map = stride_map(40, N_VOCAB);
    let m = synthetic_dflash_d2t(&s, &map, 7);
    let mut d = load(&t, m.bytes).unwrap();
    prefill(&t, &mut d, &[4, 8, 15, 16]);
    let (tokens, logits) = block_on(d.draft_block(23, 7, &mut |r| Some(argmax(r)))).unwrap();
    let z = block_on(d.block_hidden());
    let head = &m.weights["output.weight"];
    for i in 1..=7 {
        let zi: Vec<f64> = z[i * 48..(i + 1) * 48].iter().map(|&x| x as f64).collect();
        let draft = matvec(head, &zi);
        let row = &logits[i * N_VOCAB..(i + 1) * N_VOCAB];
        for (v, &l) in row.iter().enumerate() {
            match map.iter().position(|&t| t as usize == v) {
                Some(j) => assert!(close(l, draft[j]), "row {i} id {v}"),
                None => assert_eq!(l, f32::NEG_INFINITY, "row {i} id {v} is not drafted"),
            }
        }
        let best = (0..draft.len())
            .max_by(|&a, &b| draft[a].total_cmp(&draft[b]).then(b.cmp(&a)))
            .unwrap();
        assert_eq!(tokens[i - 1] as i64, map[best], "row {i}");
    }
}

fn greedy_matches_plain(t: &Target, drafter: SyntheticModel, prompt: &[u32], n: usize) {
    let drafter = GgufFile::from_bytes(drafter.bytes).unwrap();
    let want = greedy_plain(&t.dec, prompt, n);
    let mut d = DFlashDrafter::load(&drafter, &t.dec, prompt.len() + n + 32, 32).unwrap();
    let (got, stats) = greedy_speculative(&t.dec, &mut d, prompt, n, PolicyConfig::fixed(16));
    assert_eq!(got, want);
    assert!(stats.rounds > 0);
}

#[test]
fn greedy_is_identical_to_plain_on_a_synthetic_target() {
    let t = synthetic_target();
    let s = spec(48, N_VOCAB, vec![1, 4, 7], GgmlType::F32);
    let prompt = [3, 14, 15, 9, 26, 5];
    for anchor_first in [true, false] {
        let m = synthetic_dspark(&s, &dspark(anchor_first, None), 8);
        greedy_matches_plain(&t, m, &prompt, 20);
    }
    let m = synthetic_dspark(&s, &dspark(true, Some(stride_map(40, N_VOCAB))), 9);
    greedy_matches_plain(&t, m, &prompt, 20);
    let m = synthetic_dflash_d2t(&s, &stride_map(40, N_VOCAB), 10);
    greedy_matches_plain(&t, m, &prompt, 20);
}

#[test]
fn greedy_is_identical_to_plain_on_smollm2() {
    let Some(path) = common::model("smollm2-135m-instruct-q4_1.gguf") else {
        return;
    };
    let file = GgufFile::open(path).unwrap();
    let dec = Decoder::load(&file, Arc::new(CpuBackend::new(2)), &mut |_| {}).unwrap();
    let n_vocab = dec.config.n_vocab;
    let t = Target { dec };
    let s = spec(576, n_vocab, vec![1, 15, 30], GgmlType::Q8_0);
    let prompt = [1, 504, 3458, 282, 4649, 314];
    let m = synthetic_dspark(&s, &dspark(true, None), 11);
    // The file: this drafter plus a predecessor correction.
    let err = load(&t, rewrite(&m.bytes, &[], &correction(576)))
        .err()
        .unwrap();
    assert!(err.contains("which needs DFly's fusion"), "{err}");
    greedy_matches_plain(&t, m, &prompt, 12);
    let m = synthetic_dflash_d2t(&s, &stride_map(4096, n_vocab), 12);
    greedy_matches_plain(&t, m, &prompt, 12);
}
