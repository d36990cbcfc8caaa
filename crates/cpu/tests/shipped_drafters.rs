//! The drafters shipped in `drafters/` against the PyTorch reference: the
//! PyPI `dflash` DFlashDraftModel (for DFly, the trainer's DFlyDrafter),
//! built from each shipped GGUF's own weights, gave the block logits in
//! tests/fixtures/drafters/*-golden.json (tests/golden/make_drafter_golden.py)
//! for taps of the real target, each slot after the reference's argmax of
//! the one before (DFly's correction reads it). blockdraft must draft the
//! same tokens from the same context.

mod common;

use blockdraft_core::backend::prelude::*;
use blockdraft_core::model::Decoder;
use blockdraft_core::sampling::argmax;
use blockdraft_core::speculative::DFlashDrafter;
use blockdraft_core::testing::block_on;
use blockdraft_cpu::CpuBackend;
use blockdraft_gguf::GgufFile;
use common::{flat, ids};
use std::path::PathBuf;
use std::sync::Arc;

fn repo(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

fn check(drafter: &str, target: &str) {
    let Some(target_path) = common::model(target) else {
        eprintln!("SKIPPED: {target} is not in the model cache (tests/fetch_models.sh)");
        return;
    };
    let golden_name = drafter.replace(".gguf", "-golden.json");
    let g = common::fixture(&format!("drafters/{golden_name}"));
    let be = Arc::new(CpuBackend::new(2));
    let tfile = GgufFile::open(&target_path).unwrap();
    let target = Decoder::load(&tfile, be.clone(), &mut |_| {}).unwrap();
    let dfile = GgufFile::open(repo("drafters").join(drafter)).unwrap();
    // The CLI's sizes: the golden's context is one prompt long.
    let mut d = DFlashDrafter::load(&dfile, &target, 1024, 256).unwrap();
    let c = g["context"].as_u64().unwrap() as usize;
    let taps = flat(&g["taps"]);
    let mut t = be.tensor(c, taps.len() / c);
    be.write(&mut t, &taps);
    block_on(d.inject(&t, 0, c)).unwrap();
    let anchor = g["anchor"].as_u64().unwrap() as u32;
    let slots = g["argmax"].as_array().unwrap().len();
    let (drafted, logits) =
        block_on(d.draft_block(anchor, slots, &mut |row| Some(argmax(row)))).unwrap();
    assert_eq!(drafted.len(), slots);
    let n_vocab = target.config.n_vocab;
    let want_argmax = ids(&g["argmax"]);
    let mut worst = 0f32;
    for (k, row) in logits.chunks_exact(n_vocab).skip(1).enumerate() {
        let top_ids = ids(&g["top_ids"][k]);
        let top = flat(&g["top_logits"][k]);
        // blockdraft quantizes activations for its int8 kernels: logits
        // agree to a small fraction of their spread, not bit for bit.
        let spread = top[0] - top[top.len() - 1];
        for (&id, &v) in top_ids.iter().zip(&top) {
            let err = (row[id as usize] - v).abs();
            worst = worst.max(err / spread.max(1.0));
            assert!(
                err < 0.05 * spread.max(1.0),
                "slot {}: logit of {id} is {} vs {v}",
                k + 1,
                row[id as usize]
            );
        }
        let ours = drafted[k];
        // The same draft token, unless the reference's top two are a near
        // tie; after another token a chained slot reads another predecessor.
        if ours != want_argmax[k] {
            let second = top[1];
            assert!(
                top[0] - second < 0.02 * spread.max(1.0),
                "slot {}: drafted {ours}, the reference {}",
                k + 1,
                want_argmax[k]
            );
            break;
        }
    }
    eprintln!("{drafter}: logits within {worst:.4} of the reference's top-64 spread");
}

#[test]
fn smollm2_drafter_matches_the_pytorch_reference() {
    check("smollm2-dflash.gguf", "smollm2-135m-instruct-q4_1.gguf");
}

#[test]
fn qwen05_drafter_matches_the_pytorch_reference() {
    check(
        "qwen05-dflash.gguf",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    );
}

#[test]
fn qwen05_dfly_drafter_matches_the_pytorch_reference() {
    check(
        "qwen05-dfly.gguf",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    );
}
