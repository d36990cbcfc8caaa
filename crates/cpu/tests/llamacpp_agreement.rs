//! The CPU backend on the real models against llama.cpp's own outputs on the
//! same GGUF files (tests/fixtures/llamacpp/greedy-*.json, made by
//! tests/reference/make_llamacpp_fixtures.py):
//! - forced decoding of llama.cpp's greedy continuation: our argmax equals
//!   llama.cpp's top-1 at >= 99 % of positions (positions where llama.cpp's
//!   top-2 log-probs are within 0.05 are excluded as ties);
//! - free greedy generation reproduces llama.cpp's first 32 tokens.
//!
//! Not yet met (hence `#[ignore]`; `cargo test -- --ignored` runs them and
//! prints the measured agreement): blockdraft's log-probs differ from
//! llama.cpp's by 0.015-0.034 on average, enough to flip near-ties. The
//! fixtures come from llama.cpp's precise configuration (no flash
//! attention, f32 KV cache); its default configuration is itself 0.3-0.7
//! away from that on SmolLM2. Cause, found with llama.cpp's eval callback:
//! activations are quantized before every matmul, so a one-ulp difference
//! in an f32 op before it (norm, softmax, SiLU) can flip a rounding and
//! grow into ~1e-3. With all matrices dequantized to F32 the two agree to
//! 7e-5, and isolated ggml matmuls equal ours to 3e-5. Making rms_norm
//! bit-equal to ggml's fixed the first divergent row; attention softmax,
//! SiLU/GELU and the f32 dot orders remain to be made bit-equal.

mod common;

use common::ids;

use blockdraft_core::generate::generate;
use blockdraft_core::model::{Decoder, LogitRows};
use blockdraft_core::sampling::{argmax, Sampler, SamplingParams};
use blockdraft_core::Backend;
use blockdraft_cpu::CpuBackend;
use blockdraft_gguf::GgufFile;
use std::sync::Arc;

fn log_softmax_at(row: &[f32], id: usize) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let z: f64 = row.iter().map(|&l| (l as f64 - max).exp()).sum();
    row[id] as f64 - max - z.ln()
}

fn check_model(key: &str) {
    let fx = common::fixture(&format!("llamacpp/greedy-{key}.json"));
    let Some(path) = common::model(fx["model"].as_str().expect("model file name")) else {
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let backend = Arc::new(CpuBackend::new(2));
    let dec = Decoder::load(&file, backend.clone(), &mut |_| {}).unwrap();
    let n_vocab = dec.config.n_vocab;

    let (mut agree, mut compared, mut excluded) = (0usize, 0usize, 0usize);
    let mut lp_err_sum = 0.0;
    let mut lp_err_max: f64 = 0.0;
    let mut free_mismatches: Vec<String> = Vec::new();
    for p in fx["prompts"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        let prompt = ids(&p["prompt_tokens"]);
        let tokens = ids(&p["tokens"]);
        let top = p["top_logprobs"].as_array().unwrap();

        // Forced decoding: row r predicts sequence position r + 1.
        let seq: Vec<u32> = prompt
            .iter()
            .chain(&tokens[..tokens.len() - 1])
            .copied()
            .collect();
        let mut state = dec.new_state(seq.len(), 64);
        let mut rows: Vec<Vec<f32>> = Vec::new();
        for chunk in seq.chunks(64) {
            dec.forward(&mut state, chunk, LogitRows::All, true, None)
                .unwrap();
            rows.extend(
                backend
                    .read(state.logits())
                    .chunks_exact(n_vocab)
                    .map(<[f32]>::to_vec),
            );
        }
        for (i, ref_top) in top.iter().enumerate() {
            let row = &rows[prompt.len() - 1 + i];
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

        // Free greedy generation: the first 32 tokens (up to an end-of-
        // generation token llama.cpp was told to ignore).
        // llama.cpp's emitted token differs from its raw top-1 only where it
        // banned an end-of-generation token (ignore_eos).
        let eog_stop = top
            .iter()
            .zip(&tokens)
            .position(|(t, &tok)| t[0][0].as_u64().unwrap() as u32 != tok)
            .unwrap_or(tokens.len());
        let n_free = 32.min(eog_stop);
        let mut state = dec.new_state(prompt.len() + n_free, 64);
        let mut sampler = Sampler::new(SamplingParams::greedy());
        let (gen, _, _) = generate(
            &dec,
            &mut state,
            &prompt,
            n_free,
            &mut sampler,
            &|_| false,
            &mut |_| true,
        )
        .unwrap();
        if gen != tokens[..n_free] {
            let at = gen
                .iter()
                .zip(&tokens)
                .position(|(a, b)| a != b)
                .unwrap_or(n_free);
            free_mismatches.push(format!("{name} at token {at}"));
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
        rate >= 0.99,
        "{key}: agreement {:.2} % < 99 %",
        rate * 100.0
    );
    assert!(
        free_mismatches.is_empty(),
        "{key}: free greedy generation differs from llama.cpp: {free_mismatches:?}"
    );
}

#[test]
#[ignore = "open: 98.1-100 % argmax agreement, free greedy diverging at near-ties (see module docs); run with --ignored"]
fn smollm2_agrees_with_llamacpp() {
    check_model("smollm2");
}

#[test]
#[ignore = "open: 98.1-100 % argmax agreement, free greedy diverging at near-ties (see module docs); run with --ignored"]
fn qwen2_5_coder_0_5b_agrees_with_llamacpp() {
    check_model("qwen05");
}

#[test]
#[ignore = "open: 98.1-100 % argmax agreement, free greedy diverging at near-ties (see module docs); run with --ignored"]
fn qwen2_5_coder_1_5b_agrees_with_llamacpp() {
    check_model("qwen15");
}

#[test]
#[ignore = "open: 98.1-100 % argmax agreement, free greedy diverging at near-ties (see module docs); run with --ignored"]
fn gemma3_270m_agrees_with_llamacpp() {
    check_model("gemma");
}
