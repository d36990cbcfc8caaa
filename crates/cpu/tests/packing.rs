//! Packing Q4_K weights (`kernels::pack`, on x86 AVX2) and copying the
//! other matrices into huge pages change nothing but speed: a real Q4_K_M
//! model (with no Q4_0 matrices, whose packed kernel follows llama.cpp's
//! repacked sequence instead) gives bit-identical logits with and without
//! them, for a prompt pass and for verify-shaped passes of several rows.

mod common;
use blockdraft_core::backend::prelude::*;
use blockdraft_core::model::{Decoder, LogitRows};
use blockdraft_core::testing::block_on;
use blockdraft_cpu::CpuBackend;
use blockdraft_gguf::GgufFile;
use std::sync::Arc;

/// Logits of every row: a 9-token prompt, then passes of 1, 5 and 8 rows.
fn logits(file: &GgufFile, backend: Arc<CpuBackend>) -> Vec<Vec<f32>> {
    let dec = Decoder::load(file, backend.clone(), &mut |_| {}).unwrap();
    let mut state = dec.new_state(64, 16);
    let mut out = Vec::new();
    let passes: [&[u32]; 4] = [
        &[785, 3974, 13876, 15, 1, 5, 2, 330, 11],
        &[264],
        &[17, 2290, 6133, 311, 279],
        &[1140, 340, 220, 16, 17, 18, 19, 20],
    ];
    for tokens in passes {
        dec.forward(&mut state, tokens, LogitRows::All, true, None)
            .unwrap();
        out.push(block_on(backend.read(state.logits())));
    }
    out
}

#[test]
fn packed_weights_give_bit_identical_logits() {
    let Some(path) = common::model("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf") else {
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let packed = Arc::new(CpuBackend::new(2));
    let want = logits(&file, Arc::new(CpuBackend::new(2).without_packing()));
    let got = logits(&file, packed.clone());
    let x86_avx2 =
        cfg!(target_arch = "x86_64") && blockdraft_cpu::kernels::simd_level().starts_with("avx");
    if x86_avx2 {
        // Every Q4_K matrix (all have whole groups of 8 rows), each super-
        // block of 8 rows in 1184 bytes instead of 8 x 144.
        let q4_k: u64 = file
            .tensors()
            .iter()
            .filter(|t| t.ty == blockdraft_gguf::GgmlType::Q4_K)
            .map(|t| t.n_bytes / 1152 * 1184)
            .sum();
        assert!(q4_k > 0);
        assert_eq!(packed.packed_bytes() as u64, q4_k);
    } else {
        assert_eq!(packed.packed_bytes(), 0);
    }
    // Every other matrix a forward pass multiplies by, of at least one
    // huge page, is copied into huge pages (Linux only).
    let tied_head = file.tensor("output.weight").is_none();
    let copied: u64 = file
        .tensors()
        .iter()
        .filter(|t| t.dims.len() == 2 && (tied_head || t.name != "token_embd.weight"))
        .filter(|t| !(x86_avx2 && t.ty == blockdraft_gguf::GgmlType::Q4_K))
        .filter(|t| t.n_bytes >= 2 << 20)
        .map(|t| t.n_bytes)
        .sum();
    assert!(copied > 0);
    let want_copied = if cfg!(target_os = "linux") { copied } else { 0 };
    assert_eq!(packed.copied_bytes() as u64, want_copied);
    for (pass, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.len(), w.len());
        for (i, (a, b)) in g.iter().zip(w).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "pass {pass} logit {i}: {a} vs {b}"
            );
        }
    }
}
