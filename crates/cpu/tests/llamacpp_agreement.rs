//! The CPU backend on the real models against llama.cpp's own outputs on the
//! same GGUF files (tests/fixtures/llamacpp/greedy-*.json, made by
//! tests/reference/make_llamacpp_fixtures.py):
//! - forced decoding of llama.cpp's greedy continuation: our argmax equals
//!   llama.cpp's top-1 at >= 99 % of positions (positions where llama.cpp's
//!   top-2 log-probs are within 0.05 are excluded as ties);
//! - free greedy generation reproduces llama.cpp's first 32 tokens, in the
//!   configurations meant to be bit-equal to llama.cpp's.
//!
//! Two sets of fixtures: llama.cpp's precise configuration (no flash
//! attention, f32 KV cache; `greedy-<model>.json`), which an f32 KV cache
//! follows bit for bit, and its defaults (`llama-server -m MODEL`: flash
//! attention on, f16 KV cache; `greedy-<model>-default.json`), which an f16
//! cache follows bit for bit (the CPU backend's f16 attention is llama.cpp's
//! flash attention, `crates/cpu/src/attention/flash.rs`). Across the two (the
//! f16 cache on the precise traces) only the forced-decoding metric is
//! held, at floors under what llama.cpp's own two configurations allow.
//! The precise traces in detail: llama.cpp quantizes activations
//! before every matmul, so a one-ulp difference in any f32 op grows into
//! ~1e-2 in log-probs and flips near-ties; the CPU backend therefore follows
//! llama.cpp's float sequences exactly (norms, rope, softmax, SiLU/GELU,
//! attention products, the quantized dot products), and its logits are
//! bit-equal to llama.cpp's for the same batch shape (checked against
//! llama.cpp's own logits through libllama, one token at a time and in one
//! batch). llama.cpp's sequences depend on the batch shape (it picks gemm or
//! gemv kernels by row count), so these tests use a backend made with
//! `CpuBackend::matching_llamacpp_batches`, and both forced decoding and
//! free generation replay llama-server's schedule that produced the
//! fixtures: its prompt batches (see `prompt_batches`), then one token per
//! forward pass. (Fed in 64-token batches
//! instead, llama.cpp itself agrees with its fixtures at only 98.75 % on
//! Gemma 3 and 99.05 % on SmolLM2, at the same positions and with the same
//! argmaxes as ours.)

mod common;

use blockdraft_core::testing::block_on;
use common::ids;

use blockdraft_core::backend::prelude::*;
use blockdraft_core::backend::KvType;
use blockdraft_core::generate::generate;
use blockdraft_core::model::{Decoder, LogitRows};
use blockdraft_core::sampling::{argmax, Sampler, SamplingParams};
use blockdraft_cpu::CpuBackend;
use blockdraft_gguf::GgufFile;
use std::sync::Arc;

fn log_softmax_at(row: &[f32], id: usize) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let z: f64 = row.iter().map(|&l| (l as f64 - max).exp()).sum();
    row[id] as f64 - max - z.ln()
}

/// The batches llama-server runs a prompt in: one, except that for a model
/// with sliding-window attention it runs the last 4 prompt tokens as a batch
/// of their own, to checkpoint the cache there (`checkpoint_offsets` in its
/// server-context.cpp; another split 4 + n_ubatch before the end only
/// matters for prompts over 516 tokens).
fn prompt_batches(prompt: &[u32], swa: bool) -> Vec<&[u32]> {
    if swa && prompt.len() > 4 {
        let (head, tail) = prompt.split_at(prompt.len() - 4);
        vec![head, tail]
    } else {
        vec![prompt]
    }
}

/// llama.cpp's configuration behind a set of traces.
#[derive(Clone, Copy, PartialEq)]
enum Traces {
    /// `-fa off -ctk f32 -ctv f32`: `greedy-<model>.json`.
    Precise,
    /// No flags: `greedy-<model>-default.json`.
    Default,
}

/// Which CPU backend runs the model.
#[derive(Clone, Copy, PartialEq)]
enum Kernels {
    /// `CpuBackend::matching_llamacpp_batches`: llama.cpp's float sequences.
    LlamaCpp,
    /// `CpuBackend::new`, what users run: llama.cpp's sequences for one
    /// row in every row of a pass (batch-invariant), and on x86 a packed
    /// Q6_K kernel with its own sequence.
    Default,
}

/// `key` with a `kv` cache against llama.cpp's `traces`: forced-decoding
/// agreement >= `floor`, and free generation equal to llama.cpp's where
/// the two are meant to be bit-equal (llama.cpp's kernels, and precise
/// traces with an f32 cache or default ones with an f16 cache).
fn check_model(key: &str, traces: Traces, kv: KvType, floor: f64) {
    check_model_on(Kernels::LlamaCpp, key, traces, kv, floor)
}

fn check_model_on(kernels: Kernels, key: &str, traces: Traces, kv: KvType, floor: f64) {
    let suffix = if traces == Traces::Default {
        "-default"
    } else {
        ""
    };
    let fx = common::fixture(&format!("llamacpp/greedy-{key}{suffix}.json"));
    let Some(path) = common::model(fx["model"].as_str().expect("model file name")) else {
        return;
    };
    let bit_equal = kernels == Kernels::LlamaCpp
        && matches!(
            (traces, kv),
            (Traces::Precise, KvType::F32) | (Traces::Default, KvType::F16)
        );
    let kernels_name = match kernels {
        Kernels::LlamaCpp => "",
        Kernels::Default => ", default kernels",
    };
    let key = &format!("{key}{suffix} ({} KV{kernels_name})", kv.name());
    let file = GgufFile::open(&path).unwrap();
    let backend = Arc::new(match kernels {
        Kernels::LlamaCpp => CpuBackend::matching_llamacpp_batches(2),
        Kernels::Default => CpuBackend::new(2),
    });
    let dec = Decoder::load(&file, backend.clone(), &mut |_| {})
        .unwrap()
        .with_kv_type(kv);
    let n_vocab = dec.config.n_vocab;
    let swa = dec.config.swa_layers.iter().any(|&s| s);

    let (mut agree, mut compared, mut excluded) = (0usize, 0usize, 0usize);
    let mut lp_err_sum = 0.0;
    let mut lp_err_max: f64 = 0.0;
    let mut free_mismatches: Vec<String> = Vec::new();
    for p in fx["prompts"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        let prompt = ids(&p["prompt_tokens"]);
        let tokens = ids(&p["tokens"]);
        let top = p["top_logprobs"].as_array().unwrap();

        // Forced decoding on llama-server's schedule (see the module docs):
        // its prompt batches, then llama.cpp's tokens one at a time; row i
        // predicts continuation token i.
        let batches = prompt_batches(&prompt, swa);
        let mut state = dec.new_state(prompt.len() + tokens.len(), prompt.len());
        let mut rows: Vec<Vec<f32>> = Vec::new();
        for (k, batch) in batches.iter().enumerate() {
            let last = k + 1 == batches.len();
            let logits = if last {
                LogitRows::Last
            } else {
                LogitRows::None
            };
            dec.forward(&mut state, batch, logits, true, None).unwrap();
        }
        rows.push(block_on(backend.read(state.logits())));
        for &t in &tokens[..tokens.len() - 1] {
            dec.forward(&mut state, &[t], LogitRows::Last, true, None)
                .unwrap();
            rows.push(block_on(backend.read(state.logits())));
        }
        for (i, ref_top) in top.iter().enumerate() {
            let row = &rows[i];
            assert_eq!(row.len(), n_vocab);
            let ref_top = ref_top.as_array().unwrap();
            let top1 = ref_top[0][0].as_u64().unwrap() as u32;
            let margin = ref_top[0][1].as_f64().unwrap() - ref_top[1][1].as_f64().unwrap();
            let ref_lp = ref_top[0][1].as_f64().unwrap();
            let err = (log_softmax_at(row, top1 as usize) - ref_lp).abs();
            lp_err_sum += err;
            lp_err_max = lp_err_max.max(err);
            if margin < 0.05 {
                excluded += 1;
                continue;
            }
            compared += 1;
            if argmax(row) == top1 {
                agree += 1;
            } else {
                eprintln!("{key}/{name}: position {i}: argmax {} vs llama.cpp {top1} (margin {margin:.3})", argmax(row));
            }
        }

        // Only where it is asserted: it costs a third of the test's time.
        if bit_equal {
            if let Some(at) = free_generation_mismatch(&dec, &batches, &tokens, top) {
                free_mismatches.push(format!("{name} at token {at}"));
            }
        }
    }
    let rate = agree as f64 / compared as f64;
    let n = (compared + excluded) as f64;
    eprintln!(
        "{key}: argmax agreement {agree}/{compared} = {:.2} % ({excluded} near-ties excluded); |logprob(top1) - llama.cpp| mean {:.4} max {:.4}",
        rate * 100.0,
        lp_err_sum / n,
        lp_err_max
    );
    assert!(
        rate >= floor,
        "{key}: agreement {:.2} % < {:.2} %",
        rate * 100.0,
        floor * 100.0
    );
    assert!(
        free_mismatches.is_empty(),
        "{key}: free greedy generation differs from llama.cpp: {free_mismatches:?}"
    );
}

/// Free greedy generation on llama-server's schedule: the first token
/// where it leaves llama.cpp's first 32 (up to an end-of-generation token
/// llama.cpp was told to ignore; its emitted token differs from its raw
/// top-1 only there), if any.
fn free_generation_mismatch(
    dec: &Decoder<CpuBackend>,
    batches: &[&[u32]],
    tokens: &[u32],
    top: &[serde_json::Value],
) -> Option<usize> {
    let eog_stop = top
        .iter()
        .zip(tokens)
        .position(|(t, &tok)| t[0][0].as_u64().unwrap() as u32 != tok)
        .unwrap_or(tokens.len());
    let n_free = 32.min(eog_stop);
    let prompt_len: usize = batches.iter().map(|b| b.len()).sum();
    let mut state = dec.new_state(prompt_len + n_free, 64);
    let (&last_batch, first_batches) = batches.split_last().unwrap();
    for batch in first_batches {
        dec.forward(&mut state, batch, LogitRows::None, true, None)
            .unwrap();
    }
    let mut sampler = Sampler::new(SamplingParams::greedy());
    let (gen, _, _) = block_on(generate(
        dec,
        &mut state,
        last_batch,
        n_free,
        &mut sampler,
        &|_| false,
        &mut |_| true,
    ))
    .unwrap();
    (gen != tokens[..n_free]).then(|| {
        gen.iter()
            .zip(tokens)
            .position(|(a, b)| a != b)
            .unwrap_or(n_free)
    })
}

// Floors: 99 % for a cache against the traces of its own configuration
// (measured: 100 % for every model, both ways, with log-probs within the
// fixtures' rounding). An f16 cache against the precise traces differs as
// llama.cpp's two configurations differ from each other (measured:
// SmolLM2 96.84 %, Qwen2.5-Coder-0.5B 99.68 %, 1.5B 99.05 %, Gemma 3 270M
// 98.75 %); those floors sit just under the figure, so a regression still
// fails. The default backend against llama-server's defaults, as a user
// compares them out of the box, is held to 99 %: it differs from
// llama.cpp's kernels only in the packed Q6_K kernel's rounding and in
// computing prompt rows as decode rows (measured on AVX2: SmolLM2 100 %,
// Qwen2.5-Coder-0.5B 100 %, 1.5B 99.37 %, Gemma 3 270M 99.37 %). Any other
// rounding difference costs about 2 points on SmolLM2: the tiled
// attention's own sequence alone measured 97.75 %, as did the packed Q4_1
// kernel with one float sum per block alone; both (`--fast-kernels`):
// SmolLM2 97.11 %, Qwen2.5-Coder-0.5B 100 %, 1.5B 99.05 %, Gemma 3 270M
// 98.11 %.

#[test]
fn smollm2_agrees_with_llamacpp() {
    check_model("smollm2", Traces::Precise, KvType::F32, 0.99);
    check_model("smollm2", Traces::Precise, KvType::F16, 0.965);
    check_model("smollm2", Traces::Default, KvType::F16, 0.99);
    check_model_on(
        Kernels::Default,
        "smollm2",
        Traces::Default,
        KvType::F16,
        0.99,
    );
}

#[test]
fn qwen2_5_coder_0_5b_agrees_with_llamacpp() {
    check_model("qwen05", Traces::Precise, KvType::F32, 0.99);
    check_model("qwen05", Traces::Precise, KvType::F16, 0.99);
    check_model("qwen05", Traces::Default, KvType::F16, 0.99);
    check_model_on(
        Kernels::Default,
        "qwen05",
        Traces::Default,
        KvType::F16,
        0.99,
    );
}

#[test]
fn qwen2_5_coder_1_5b_agrees_with_llamacpp() {
    check_model("qwen15", Traces::Precise, KvType::F32, 0.99);
    check_model("qwen15", Traces::Precise, KvType::F16, 0.99);
    check_model("qwen15", Traces::Default, KvType::F16, 0.99);
    check_model_on(
        Kernels::Default,
        "qwen15",
        Traces::Default,
        KvType::F16,
        0.99,
    );
}

#[test]
fn gemma3_270m_agrees_with_llamacpp() {
    check_model("gemma", Traces::Precise, KvType::F32, 0.99);
    check_model("gemma", Traces::Precise, KvType::F16, 0.985);
    check_model("gemma", Traces::Default, KvType::F16, 0.99);
    check_model_on(
        Kernels::Default,
        "gemma",
        Traces::Default,
        KvType::F16,
        0.99,
    );
}
