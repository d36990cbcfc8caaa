//! `Decoder::forward_batch`: several sequences in one pass give each row
//! exactly the logits and taps of a pass over its sequence alone (the CPU
//! kernels never mix rows), for every architecture (Gemma 3's sliding
//! window included), with sequences of different lengths and parts of
//! different sizes; malformed batches are typed errors.

use blockdraft_core::backend::prelude::*;
use blockdraft_core::model::{Decoder, LogitRows, Taps};
use blockdraft_core::testing::{block_on, synthetic_decoder, SyntheticDims};
use blockdraft_core::ModelError;
use blockdraft_cpu::CpuBackend;
use blockdraft_gguf::GgufFile;
use std::sync::Arc;

/// The usual synthetic shapes, three layers deep.
fn dims() -> SyntheticDims {
    SyntheticDims {
        n_layer: 3,
        ..SyntheticDims::default()
    }
}

fn check_arch(arch: &str) {
    let d = dims();
    let model = synthetic_decoder(arch, d, 7);
    let file = GgufFile::from_bytes(model.bytes).unwrap();
    let be = Arc::new(CpuBackend::new(2));
    let dec = Decoder::load(&file, be.clone(), &mut |_| {}).unwrap();
    let taps_at = [1, d.n_layer];
    let prompts: [&[u32]; 3] = [
        &[1, 2, 3, 4, 5],
        &[9, 8, 7, 6, 5, 4, 3, 2, 1],
        &[30, 31, 32],
    ];
    // The same sequences, one state each, for the batch and for reference.
    let mut batched: Vec<_> = prompts.iter().map(|_| dec.new_state(32, 9)).collect();
    let mut alone: Vec<_> = prompts.iter().map(|_| dec.new_state(32, 9)).collect();
    for (i, p) in prompts.iter().enumerate() {
        for s in [&mut batched[i], &mut alone[i]] {
            dec.forward(s, p, LogitRows::Last, true, None).unwrap();
        }
    }
    let mut batch = dec.new_batch(16, 4);
    let steps: [[&[u32]; 3]; 3] = [
        [&[10], &[11, 12], &[13]],
        [&[14, 15, 16], &[17], &[18]],
        [&[19], &[20], &[21, 22, 23, 24]],
    ];
    for step in steps {
        let rows: usize = step.iter().map(|t| t.len()).sum();
        let mut taps = Taps::new(&*be, &dec.config, &taps_at, rows).unwrap();
        let mut parts: Vec<_> = batched.iter_mut().zip(step).collect();
        dec.forward_batch(&mut batch, &mut parts, Some(&mut taps))
            .unwrap();
        let logits = block_on(be.read(batch.logits()));
        let stacked_taps = block_on(be.read(taps.output()));
        let width = taps_at.len() * d.n_embd;
        let mut row = 0;
        for (i, tokens) in step.iter().enumerate() {
            let mut own = Taps::new(&*be, &dec.config, &taps_at, tokens.len()).unwrap();
            dec.forward(&mut alone[i], tokens, LogitRows::Last, true, Some(&mut own))
                .unwrap();
            let want = block_on(be.read(alone[i].logits()));
            let got = &logits[i * d.n_vocab..][..d.n_vocab];
            assert_eq!(got, &want[..], "{arch}: logits of sequence {i}");
            let want_taps = block_on(be.read(own.output()));
            let got_taps = &stacked_taps[row * width..][..tokens.len() * width];
            assert_eq!(got_taps, &want_taps[..], "{arch}: taps of sequence {i}");
            assert_eq!(batched[i].len(), alone[i].len());
            row += tokens.len();
        }
    }

    // Malformed batches are refused before anything runs.
    let before: Vec<usize> = batched.iter().map(|s| s.len()).collect();
    let long = [0u32; 17];
    let (a, rest) = batched.split_at_mut(1);
    let too_many_rows = dec.forward_batch(&mut batch, &mut [(&mut a[0], &long[..])], None);
    assert!(
        matches!(too_many_rows, Err(ModelError::Usage(_))),
        "{too_many_rows:?}"
    );
    let out_of_range = dec.forward_batch(
        &mut batch,
        &mut [(&mut a[0], &[1][..]), (&mut rest[0], &[61][..])],
        None,
    );
    assert!(
        matches!(
            out_of_range,
            Err(ModelError::TokenOutOfRange { id: 61, .. })
        ),
        "{out_of_range:?}"
    );
    let empty = dec.forward_batch(&mut batch, &mut [(&mut a[0], &[][..])], None);
    assert!(matches!(empty, Err(ModelError::Usage(_))), "{empty:?}");
    let after: Vec<usize> = batched.iter().map(|s| s.len()).collect();
    assert_eq!(
        before, after,
        "a refused batch leaves every sequence as it was"
    );
}

#[test]
fn batched_rows_equal_their_sequences_alone_llama() {
    check_arch("llama");
}

#[test]
fn batched_rows_equal_their_sequences_alone_qwen2() {
    check_arch("qwen2");
}

#[test]
fn batched_rows_equal_their_sequences_alone_qwen3() {
    check_arch("qwen3");
}

#[test]
fn batched_rows_equal_their_sequences_alone_gemma3() {
    check_arch("gemma3");
}
