//! DFlash2 against golden tensors of the PyTorch reference (PyPI `dflash`,
//! tests/golden/make_dflash_golden.py): block logits through the
//! convolutions, the selector's candidates, gates and greedy path, and the
//! reference's end-to-end greedy run; layer 0's four convolutions on their
//! recorded inputs. Also: every DFlash2 load rejection.

mod common;

use blockdraft_core::testing::block_on;
use common::{fixture_file, flat, ids, rel_err};

use blockdraft_core::backend::prelude::*;
use blockdraft_core::backend::{ConvParams, WeightRole, WeightSource};
use blockdraft_core::model::{Decoder, LogitRows, Taps};
use blockdraft_core::sampling::{Sampler, SamplingParams};
use blockdraft_core::speculative::{
    generate_speculative, DFlashDrafter, DraftPolicy, PolicyConfig,
};
use blockdraft_cpu::CpuBackend;
use blockdraft_gguf::{GgufFile, GgufWriter, Value};
use std::sync::Arc;

#[test]
fn dflash2_matches_the_pytorch_reference() {
    let g = common::fixture("dflash/golden-v2.json");
    let tfile = fixture_file("target-qwen3.gguf");
    let dfile = fixture_file("dflash2.gguf");
    let be = Arc::new(CpuBackend::new(2));
    let target = Decoder::load(&tfile, be.clone(), &mut |_| {}).unwrap();
    let prompt = ids(&g["prompt_ids"]);

    let mut drafter = DFlashDrafter::load(&dfile, &target, 64, 16).unwrap();
    let v2 = drafter
        .config()
        .variant
        .dflash2()
        .cloned()
        .expect("detected as DFlash2");
    assert_eq!(
        (
            v2.conv_kernel_size,
            v2.conv_group_size,
            v2.selector_rank,
            v2.selector_top_k
        ),
        (2, 16, 8, 4)
    );
    let mut taps = Taps::new(&*be, &target.config, &drafter.config().target_layers, 16).unwrap();
    let mut state = target.new_state(64, 16);
    target
        .forward(&mut state, &prompt, LogitRows::All, true, Some(&mut taps))
        .unwrap();
    block_on(drafter.inject(taps.output(), 0, prompt.len())).unwrap();

    // Block logits (the convolutions run inside every layer).
    let anchor = g["target_next_token"].as_u64().unwrap() as u32;
    let n_vocab = target.config.n_vocab;
    let logits = block_on(drafter.block_logits(anchor, 7)).unwrap();
    let err = rel_err(&logits[n_vocab..], &flat(&g["draft_logits"]));
    assert!(err < 1e-4, "draft logits off by {err}");

    // Selector: candidates as sets, their logits, gates, greedy path.
    let sel = &g["selector"];
    let lattice = block_on(drafter.block_lattice(anchor, 7)).unwrap().unwrap();
    let want_cands: Vec<Vec<u32>> = sel["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(ids)
        .collect();
    let want_unary: Vec<Vec<f32>> = sel["unary"].as_array().unwrap().iter().map(flat).collect();
    assert_eq!(lattice.candidates.len(), want_cands.len());
    for (r, (got, want)) in lattice.candidates.iter().zip(&want_cands).enumerate() {
        let mut sorted = want.clone();
        sorted.sort_unstable();
        let mut got_sorted = got.clone();
        got_sorted.sort_unstable();
        assert_eq!(got_sorted, sorted, "row {r} candidates");
        for (c, id) in got.iter().enumerate() {
            let k = want.iter().position(|w| w == id).unwrap();
            let (a, b) = (lattice.unary[r][c], want_unary[r][k]);
            assert!(
                (a - b).abs() <= 1e-4 * b.abs().max(1.0),
                "row {r} unary {a} vs {b}"
            );
        }
    }
    let gates: Vec<f32> = lattice.gates.concat();
    let err = rel_err(&gates, &flat(&sel["hidden_projection"]));
    assert!(err < 1e-4, "selector gates off by {err}");
    let path = drafter.walk(&lattice, anchor, 0.0);
    assert_eq!(path, ids(&sel["path"]));
    // The lattice walk is not per-row argmax here, so it is really exercised.
    assert_ne!(path, ids(&g["draft_argmax"]));
    // A p_min no pick can reach stops the walk at once.
    assert!(drafter.walk(&lattice, anchor, 1.01).is_empty());

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

/// The four convolutions of layer 0 on the reference's recorded inputs:
/// base layout, dynamic projection layout (pre sides) and the conv op.
#[test]
fn dflash2_layer0_convolutions_match_the_reference() {
    let g = common::fixture("dflash/golden-v2.json");
    let dfile = fixture_file("dflash2.gguf");
    let be = CpuBackend::new(1);
    let (b, d, taps, groups) = (8, 64, 2, 4);
    let tensor = |rows, cols, data: &[f32]| {
        let mut t = be.tensor(rows, cols);
        be.write(&mut t, data);
        t
    };
    for (case, prefix, side) in [
        ("attn_pre", "attn", 0),
        ("attn_post", "attn", 1),
        ("ffn_pre", "ffn", 0),
        ("ffn_post", "ffn", 1),
    ] {
        let c = &g["conv_layer0"][case];
        let base_bytes = dfile
            .tensor_data(&format!("blk.0.{prefix}_conv_base"))
            .unwrap();
        let base: Vec<f32> = base_bytes
            .chunks_exact(4)
            .map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]]))
            .collect();
        let base = tensor(2 * taps, d, &base);
        let x = tensor(b, d, &flat(&c["input"]));
        // The side's half of the deltas, placed at its columns.
        let half = flat(&c["dynamic"]);
        let mut full = vec![0.0; b * 2 * taps * groups];
        for (i, row) in half.chunks_exact(taps * groups).enumerate() {
            full[i * 2 * taps * groups + side * taps * groups..][..taps * groups]
                .copy_from_slice(row);
        }
        if side == 0 {
            let name = format!("blk.0.{prefix}_conv_proj.weight");
            let info = dfile.tensor(&name).unwrap();
            let proj = be
                .load_weight(WeightSource {
                    name: &name,
                    ty: info.ty,
                    dims: &info.dims,
                    data: dfile.tensor_data(&name).unwrap(),
                    role: WeightRole::Proposer,
                })
                .unwrap();
            let mut dynamic = be.tensor(b, 2 * taps * groups);
            be.matmul(&proj, &x, &mut dynamic);
            let got: Vec<f32> = block_on(be.read(&dynamic))
                .chunks_exact(2 * taps * groups)
                .flat_map(|r| r[..taps * groups].to_vec())
                .collect();
            let err = rel_err(&got, &half);
            assert!(err < 1e-4, "{case} dynamic off by {err}");
        }
        let dynamic = tensor(b, 2 * taps * groups, &full);
        let mut out = be.tensor(b, d);
        let p = ConvParams {
            taps,
            group: 16,
            side,
        };
        be.grouped_conv(&x, &base, &dynamic, p, &mut out);
        let err = rel_err(&block_on(be.read(&out)), &flat(&c["output"]));
        assert!(err < 1e-5, "{case} output off by {err}");
    }
}

#[test]
fn dflash2_loading_rejects_bad_conv_and_selector_metadata() {
    let tfile = fixture_file("target-qwen3.gguf");
    let dfile = fixture_file("dflash2.gguf");
    let target = Decoder::load(&tfile, Arc::new(CpuBackend::new(1)), &mut |_| {}).unwrap();
    // The fixture with `key` replaced by `value` (removed when `None`).
    let load_with = |key: &str, value: Option<Value>| {
        let mut w = GgufWriter::new();
        for (k, v) in dfile.metadata().iter() {
            if k != key {
                w.add(k, v.clone());
            }
        }
        if let Some(v) = value {
            w.add(key, v);
        }
        for t in dfile.tensors() {
            let data = dfile.tensor_data(&t.name).unwrap().to_vec();
            w.add_tensor(t.name.clone(), &t.dims, t.ty, data).unwrap();
        }
        let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
        DFlashDrafter::load(&file, &target, 64, 16)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    assert_eq!(
        load_with("dflash.logit_scale", Some(Value::F32(1.0))),
        Ok(())
    );
    let expect = |key: &str, value: Option<Value>, needle: &str| {
        let err = load_with(key, value).unwrap_err();
        assert!(
            err.contains(needle),
            "{key}: expected `{needle}` in `{err}`"
        );
    };
    for key in [
        "dflash.selector_rank",
        "dflash.block_size",
        "dflash.selector_top_k",
        "dflash.conv_kernel_size",
        "dflash.conv_group_size",
    ] {
        let missing = "DFlash2 model is missing conv/selector metadata";
        expect(key, None, missing);
        expect(key, Some(Value::U32(0)), missing);
        expect(key, Some(Value::I32(-1)), missing);
    }
    expect(
        "dflash.conv_group_size",
        Some(Value::U32(24)),
        "divisible by conv_group_size",
    );
    // 8 · 9 = 72 > 64.
    expect(
        "dflash.selector_top_k",
        Some(Value::U32(8)),
        "too small for the selector lattice",
    );
}
