//! Packing weights (`kernels::pack`, on x86) and copying the other matrices
//! into huge pages, on a real Q4_K_M model (Q4_K, Q6_K, Q5_0 and Q8_0
//! matrices, no Q4_0): where the packed layouts keep llama.cpp's float
//! sequence, bit-identical logits with and without them, for a prompt pass
//! and for verify-shaped passes of several rows; where they have their own
//! (Q6_K), logits within rounding and the same argmax.

mod common;
use blockdraft_core::backend::prelude::*;
use blockdraft_core::backend::{KvType, WeightRole};
use blockdraft_core::model::{Decoder, LogitRows};
use blockdraft_core::sampling::argmax;
use blockdraft_core::testing::block_on;
use blockdraft_cpu::CpuBackend;
use blockdraft_gguf::{GgmlType, GgufFile};
use std::sync::Arc;

/// Logits of every row: a 9-token prompt, then passes of 1, 5 and 8 rows.
fn logits(file: &GgufFile, backend: Arc<CpuBackend>) -> Vec<Vec<f32>> {
    let dec = Decoder::load(file, backend.clone(), &mut |_| {}).unwrap();
    passes(&dec, backend)
}

/// [`logits`] of a decoder already loaded.
fn passes(dec: &Decoder<CpuBackend>, backend: Arc<CpuBackend>) -> Vec<Vec<f32>> {
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

/// Bytes the default backend packs and copies for `file` on this CPU:
/// packed, every matrix of a type with a packed kernel here (all have whole
/// groups of 8 rows; a separate output head's token table is only embedded
/// from); copied into huge pages, every other such matrix of at least one
/// huge page (Linux only).
fn expected_resident_bytes(file: &GgufFile, packed_types: &[GgmlType]) -> (u64, u64) {
    let tied_head = file.tensor("output.weight").is_none();
    let (mut packed, mut copied) = (0, 0);
    for t in file.tensors() {
        if t.dims.len() != 2 || !(tied_head || t.name != "token_embd.weight") {
            continue;
        }
        if packed_types.contains(&t.ty) {
            // Q4_K: each super-block of 8 rows in 1184 bytes, not 8 x 144;
            // the others keep their size.
            packed += match t.ty {
                GgmlType::Q4_K => t.n_bytes / 1152 * 1184,
                _ => t.n_bytes,
            };
        } else if t.n_bytes >= 2 << 20 && cfg!(target_os = "linux") {
            copied += t.n_bytes;
        }
    }
    (packed, copied)
}

/// The packed types of this CPU: `(llama.cpp's sequence, their own)`.
fn packed_types() -> (Vec<GgmlType>, Vec<GgmlType>) {
    use GgmlType::*;
    let level = blockdraft_cpu::kernels::simd_level();
    match (cfg!(target_arch = "x86_64"), level) {
        (true, l) if l.starts_with("avx") => (vec![Q4_K, Q4_0, Q4_1, Q5_0, Q8_0], vec![Q6_K]),
        _ => (vec![], vec![]),
    }
}

/// Where the packed layouts keep llama.cpp's sequence (the backend that
/// matches llama.cpp packs only those), packing changes nothing but speed:
/// bit-identical logits with and without it.
#[test]
fn packing_in_llamacpps_sequence_gives_bit_identical_logits() {
    let Some(path) = common::model("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf") else {
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let packed = Arc::new(CpuBackend::matching_llamacpp_batches(2));
    let want = logits(
        &file,
        Arc::new(CpuBackend::matching_llamacpp_batches(2).without_packing()),
    );
    let got = logits(&file, packed.clone());
    let (exact, _) = packed_types();
    let (packed_bytes, copied_bytes) = expected_resident_bytes(&file, &exact);
    assert_eq!(packed.packed_bytes() as u64, packed_bytes);
    assert_eq!(packed.copied_bytes() as u64, copied_bytes);
    assert!(copied_bytes > 0 || !cfg!(target_os = "linux"));
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

/// The default backend packs every type it has a kernel for, and the fast
/// kernels (`with_fast_kernels`) pack Q5_0 and Q8_0 in their own sequence
/// too; where a layout has its own float sequence its logits are as close
/// to the scalar reference's as the unpacked kernels' are (a model that
/// quantizes activations before every matmul turns any rounding difference
/// into ~0.3-0.6 in logits: the unpacked AVX2 kernels against the scalar
/// ones measured 0.26-0.65 here, the packed 0.29-0.62), and give the same
/// next token outside near ties.
#[test]
fn default_packing_covers_every_packed_type_within_rounding() {
    let Some(path) = common::model("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf") else {
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let unpacked = logits(&file, Arc::new(CpuBackend::new(2).without_packing()));
    let reference = logits(&file, Arc::new(CpuBackend::scalar(2)));
    let (exact, own) = packed_types();
    if own.is_empty() {
        eprintln!(
            "skipped the own-sequence layouts: none on this CPU ({})",
            blockdraft_cpu::kernels::simd_level()
        );
    }
    let all: Vec<GgmlType> = exact.iter().chain(&own).copied().collect();
    let (packed_bytes, copied_bytes) = expected_resident_bytes(&file, &all);
    let max_diff =
        |a: &[f32], b: &[f32]| a.iter().zip(b).fold(0f32, |m, (p, q)| m.max((p - q).abs()));
    let n_vocab = 151936;
    for backend in [CpuBackend::new(2), CpuBackend::new(2).with_fast_kernels()] {
        let packed = Arc::new(backend);
        let name = packed.name();
        let got = logits(&file, packed.clone());
        assert_eq!(packed.packed_bytes() as u64, packed_bytes, "{name}");
        assert_eq!(packed.copied_bytes() as u64, copied_bytes, "{name}");
        for (pass, ((g, u), r)) in got.iter().zip(&unpacked).zip(&reference).enumerate() {
            let (packed_err, unpacked_err) = (max_diff(g, r), max_diff(u, r));
            eprintln!("{name}, pass {pass}: against the scalar kernels, packed {packed_err:.3}, unpacked {unpacked_err:.3}");
            assert!(
                packed_err <= 2.0 * unpacked_err + 1e-3,
                "{name}, pass {pass}"
            );
            for (row_g, row_u) in g.chunks_exact(n_vocab).zip(u.chunks_exact(n_vocab)) {
                let top = argmax(row_u) as usize;
                let second = row_u
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| i != top)
                    .fold(f32::MIN, |m, (_, &v)| m.max(v));
                if row_u[top] - second > 2.0 * max_diff(row_g, row_u) {
                    assert_eq!(argmax(row_g), top as u32, "{name}, pass {pass}");
                }
            }
        }
    }
}

/// A drafter's weights ([`WeightRole::Proposer`]) run the fast kernels
/// whatever the backend's setting: a draft model on the default backend
/// gives the fast backend's logits bit for bit, and (where the fast
/// layouts exist) not the default's. An f32 cache, so that the attention
/// is the same on both backends.
#[test]
fn proposer_weights_run_the_fast_kernels_on_the_default_backend() {
    let Some(path) = common::model("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf") else {
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let run = |backend: CpuBackend, role| {
        let backend = Arc::new(backend);
        let dec = Decoder::load_as(&file, backend.clone(), role, &mut |_| {})
            .unwrap()
            .with_kv_type(KvType::F32);
        passes(&dec, backend)
    };
    let proposer = run(CpuBackend::new(2), WeightRole::Proposer);
    let fast = run(CpuBackend::new(2).with_fast_kernels(), WeightRole::Target);
    let target = run(CpuBackend::new(2), WeightRole::Target);
    let bits = |l: &[Vec<f32>]| -> Vec<u32> { l.concat().iter().map(|v| v.to_bits()).collect() };
    assert!(
        bits(&proposer) == bits(&fast),
        "proposer logits differ from the fast kernels'"
    );
    // Q5_0 and Q8_0 matrices have a fast layout of their own on x86 AVX2.
    let (exact, _) = packed_types();
    if exact.contains(&GgmlType::Q5_0) {
        assert!(bits(&proposer) != bits(&target), "the default kernels ran");
    } else {
        eprintln!("no fast layouts on this CPU: only the equality was checked");
    }
}
