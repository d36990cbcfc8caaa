//! DFly on the CPU backend: random drafters with L = 2 draft layers over
//! T = 3 taps, checked against a scalar f64 reference written here (the
//! per-layer fused contexts and the predecessor-correction chain), every
//! load-time rejection, and greedy speculative output identical to plain
//! decoding on a synthetic and a real target.

mod common;

use blockdraft_core::backend::prelude::*;
use blockdraft_core::model::{Decoder, LogitRows, Taps};
use blockdraft_core::sampling::argmax;
use blockdraft_core::speculative::{DFlashDrafter, PolicyConfig};
use blockdraft_core::testing::block_on;
use blockdraft_core::testing::{
    greedy_plain, greedy_speculative, synthetic_decoder, synthetic_dfly, SyntheticDFlash,
    SyntheticDims, SyntheticModel,
};
use blockdraft_cpu::CpuBackend;
use blockdraft_gguf::{GgmlType, GgufFile, GgufWriter};
use std::sync::Arc;

const EPS: f64 = 1e-6;

struct Target {
    dec: Decoder<CpuBackend>,
}

fn synthetic_target() -> (Target, SyntheticModel) {
    let m = synthetic_decoder("qwen3", SyntheticDims::default(), 11);
    let file = GgufFile::from_bytes(m.bytes.clone()).unwrap();
    let dec = Decoder::load(&file, Arc::new(CpuBackend::new(2)), &mut |_| {}).unwrap();
    (Target { dec }, m)
}

fn rms(x: &[f64], w: &[f32]) -> Vec<f64> {
    let s = (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + EPS).sqrt();
    x.iter().zip(w).map(|(v, &w)| v / s * w as f64).collect()
}

/// `W · x` for a ggml `{cols, rows}` weight stored row-major.
fn matvec(w: &[f32], x: &[f64]) -> Vec<f64> {
    w.chunks_exact(x.len())
        .map(|r| r.iter().zip(x).map(|(&a, b)| a as f64 * b).sum())
        .collect()
}

fn max_err(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(1e-6f64, |m, v| m.max(v.abs()));
    a.iter()
        .zip(b)
        .map(|(&x, y)| (x as f64 - y).abs())
        .fold(0.0, f64::max)
        / scale
}

/// Prefills the target with taps and injects them into a fresh drafter.
fn prefill(t: &Target, file: &GgufFile, prompt: &[u32]) -> (DFlashDrafter<CpuBackend>, Vec<f32>) {
    let mut d = DFlashDrafter::load(file, &t.dec, 64, 16).unwrap();
    let be = &*t.dec.backend;
    let mut taps = Taps::new(be, &t.dec.config, &d.config().target_layers, 16).unwrap();
    let mut state = t.dec.new_state(64, 16);
    t.dec
        .forward(&mut state, prompt, LogitRows::Last, true, Some(&mut taps))
        .unwrap();
    block_on(d.inject(taps.output(), 0, prompt.len())).unwrap();
    (d, block_on(be.read(taps.output())))
}

#[test]
fn fused_contexts_follow_layer_fusion_per_draft_layer() {
    let (t, _) = synthetic_target();
    let s = SyntheticDFlash::small(48, vec![1, 4, 7], GgmlType::F32);
    let m = synthetic_dfly(&s, false, 3);
    let file = GgufFile::from_bytes(m.bytes).unwrap();
    let prompt = [5u32, 17, 3, 42, 8];
    let (d, x) = prefill(&t, &file, &prompt);
    let (n, dd, nt, nl) = (prompt.len(), 48, 3, 2);
    let w = &m.weights;
    let mut want = Vec::new();
    for r in 0..n {
        let xr: Vec<f64> = x[r * nt * dd..(r + 1) * nt * dd]
            .iter()
            .map(|&v| v as f64)
            .collect();
        let base = matvec(&w["fc.weight"], &xr);
        for l in 0..nl {
            // ggml {T, L}: layer l's T logits are contiguous.
            let logits = &w["layer_fusion"][l * nt..(l + 1) * nt];
            let mx = logits.iter().fold(f32::MIN, |a, &b| a.max(b)) as f64;
            let e: Vec<f64> = logits.iter().map(|&v| (v as f64 - mx).exp()).collect();
            let sum: f64 = e.iter().sum();
            let mixed: Vec<f64> = (0..dd)
                .map(|c| base[c] + (0..nt).map(|j| e[j] / sum * xr[j * dd + c]).sum::<f64>())
                .collect();
            want.extend(rms(&mixed, &w["context_norm.weight"]));
        }
    }
    let got = block_on(d.contexts());
    assert_eq!(
        got.len(),
        n * nl * dd,
        "one context per draft layer, layer-major"
    );
    let err = max_err(&got, &want);
    assert!(err < 1e-5, "contexts off by {err}");
    let (c0, c1) = (&got[..dd], &got[dd..2 * dd]);
    let diff = c0
        .iter()
        .zip(c1)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(
        diff > 1e-2,
        "the two draft layers must see different contexts"
    );
}

#[test]
fn correction_chain_matches_the_reference() {
    let (t, tm) = synthetic_target();
    let s = SyntheticDFlash::small(48, vec![1, 4, 7], GgmlType::F32);
    let m = synthetic_dfly(&s, true, 4);
    let file = GgufFile::from_bytes(m.bytes).unwrap();
    let prompt = [9u32, 2, 33, 14];
    let (mut d, _) = prefill(&t, &file, &prompt);
    let anchor = 21;
    let (tokens, logits) =
        block_on(d.draft_block(anchor, 6, &mut |row| Some(argmax(row)))).unwrap();
    assert_eq!(tokens.len(), 6);
    let z = block_on(d.block_hidden());
    let (dd, v) = (48, t.dec.config.n_vocab);
    let w = &m.weights;
    // Embeddings and head are the target's (the drafter has none).
    let (embd, head) = (
        &tm.weights["token_embd.weight"],
        &tm.weights["output.weight"],
    );
    let hc = |n: &str| &w[&format!("hidden_correction.{n}.weight")];
    // Row 0 keeps its plain logits.
    let z0: Vec<f64> = z[..dd].iter().map(|&x| x as f64).collect();
    let err = max_err(&logits[..v], &matvec(head, &z0));
    assert!(err < 1e-5, "row 0 off by {err}");
    let mut plain_differs = false;
    let mut prev = anchor;
    for i in 1..=6 {
        let zi: Vec<f64> = z[i * dd..(i + 1) * dd].iter().map(|&x| x as f64).collect();
        let e: Vec<f64> = embd[prev as usize * dd..(prev as usize + 1) * dd]
            .iter()
            .map(|&x| x as f64)
            .collect();
        let mut u = rms(&zi, hc("hidden_norm"));
        u.extend(rms(&e, hc("embed_norm")));
        let g = matvec(hc("gate"), &u);
        let up = matvec(hc("up"), &u);
        let act: Vec<f64> = g
            .iter()
            .zip(&up)
            .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
            .collect();
        let delta = matvec(hc("down"), &act);
        let corrected: Vec<f64> = zi.iter().zip(&delta).map(|(a, b)| a + b).collect();
        let want = matvec(head, &corrected);
        let got = &logits[i * v..(i + 1) * v];
        let err = max_err(got, &want);
        assert!(err < 1e-5, "row {i} off by {err}");
        let best = (0..v)
            .max_by(|&a, &b| want[a].total_cmp(&want[b]).then(b.cmp(&a)))
            .unwrap();
        assert_eq!(tokens[i - 1], best as u32, "row {i}");
        plain_differs |= argmax(
            &matvec(head, &zi)
                .iter()
                .map(|&x| x as f32)
                .collect::<Vec<_>>(),
        ) != tokens[i - 1];
        prev = tokens[i - 1];
    }
    assert!(
        plain_differs,
        "the correction must change at least one draft"
    );
}

/// `base` with tensors dropped and F32 tensors added or replaced.
fn rewrite(base: &GgufFile, drop: &[&str], add: &[(&str, Vec<u64>)]) -> Vec<u8> {
    let mut w = GgufWriter::new();
    for (k, v) in base.metadata().iter() {
        w.add(k, v.clone());
    }
    for t in base.tensors() {
        if drop.contains(&t.name.as_str()) || add.iter().any(|(n, _)| *n == t.name) {
            continue;
        }
        w.add_tensor(
            t.name.clone(),
            &t.dims,
            t.ty,
            base.tensor_data(&t.name).unwrap().to_vec(),
        )
        .unwrap();
    }
    for (name, dims) in add {
        let n = dims.iter().product::<u64>() as usize;
        w.add_f32_tensor(*name, dims, &vec![0.0; n]).unwrap();
    }
    w.to_bytes().unwrap()
}

#[test]
fn dfly_loading_rejects_broken_exports() {
    let (t, _) = synthetic_target();
    let load = |bytes: Vec<u8>| {
        DFlashDrafter::load(&GgufFile::from_bytes(bytes).unwrap(), &t.dec, 64, 16)
            .map(|d| d.config().variant.dfly().unwrap().hidden_correction)
            .map_err(|e| e.to_string())
    };
    let s = SyntheticDFlash::small(48, vec![1, 4, 7], GgmlType::F32);
    let with = synthetic_dfly(&s, true, 5).bytes;
    assert_eq!(load(with.clone()), Ok(true));
    assert_eq!(load(synthetic_dfly(&s, false, 5).bytes), Ok(false));
    let base = GgufFile::from_bytes(with).unwrap();
    for (drop, add, needle) in [
        (
            vec![],
            vec![("d2t", vec![4])],
            "reduced draft vocabulary (d2t)",
        ),
        (
            vec![],
            vec![("markov_w1.weight", vec![4, 61])],
            "mutually exclusive",
        ),
        (
            vec!["context_norm.weight"],
            vec![],
            "lacks `context_norm.weight`",
        ),
        // Exactly one context norm: DFly never reads `enc.output_norm`.
        (
            vec![],
            vec![("enc.output_norm.weight", vec![48])],
            "holds tensor `enc.output_norm.weight` that a DFly drafter does not use",
        ),
        (vec!["hidden_correction.up.weight"], vec![], "partial set"),
        (vec!["hidden_correction.down.weight"], vec![], "partial set"),
        // Transposed {L, T}.
        (
            vec![],
            vec![("layer_fusion", vec![2, 3])],
            "expected {T, L} = [3, 2]",
        ),
    ] {
        let err = load(rewrite(&base, &drop, &add)).unwrap_err();
        assert!(err.contains(needle), "expected `{needle}` in `{err}`");
    }
}

fn greedy_matches_plain(t: &Target, drafter: &GgufFile, prompt: &[u32], n: usize) {
    let want = greedy_plain(&t.dec, prompt, n);
    let mut d = DFlashDrafter::load(drafter, &t.dec, prompt.len() + n + 32, 32).unwrap();
    let (got, stats) = greedy_speculative(&t.dec, &mut d, prompt, n, PolicyConfig::fixed(16));
    assert_eq!(got, want);
    assert!(stats.rounds > 0);
}

#[test]
fn dfly_greedy_is_identical_to_plain_on_a_synthetic_target() {
    let (t, _) = synthetic_target();
    for correction in [false, true] {
        let s = SyntheticDFlash::small(48, vec![1, 4, 7], GgmlType::F32);
        let file = GgufFile::from_bytes(synthetic_dfly(&s, correction, 6).bytes).unwrap();
        greedy_matches_plain(&t, &file, &[3, 14, 15, 9, 26, 5], 20);
    }
}

#[test]
fn dfly_greedy_is_identical_to_plain_on_smollm2() {
    let Some(path) = common::model("smollm2-135m-instruct-q4_1.gguf") else {
        return;
    };
    let file = GgufFile::open(path).unwrap();
    let dec = Decoder::load(&file, Arc::new(CpuBackend::new(2)), &mut |_| {}).unwrap();
    let t = Target { dec };
    let s = SyntheticDFlash::small(576, vec![1, 15, 30], GgmlType::Q8_0);
    let drafter = GgufFile::from_bytes(synthetic_dfly(&s, true, 7).bytes).unwrap();
    greedy_matches_plain(&t, &drafter, &[1, 504, 3458, 282, 4649, 314], 16);
}
