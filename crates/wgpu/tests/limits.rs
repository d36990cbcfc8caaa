//! Real vocabularies within an adapter's limits: Qwen2.5 (151,936 entries)
//! and Gemma 3 (262,144) decode on wgpu with the CLI's 256-row states, under
//! the adapter's own storage-binding limit and under an artificial 16 MiB
//! one, and no kernel ever binds more than the limit. Splitting weights
//! into more parts and binding tensors by range change no arithmetic, so
//! both give the same tokens.

use blockdraft_core::model::{Decoder, LogitRows};
use blockdraft_core::sampling::{Sampler, SamplingParams};
use blockdraft_core::speculative::{generate_speculative, DraftPolicy, NgramDrafter, PolicyConfig};
use blockdraft_core::testing::{block_on, plain_in_state, real_model};
use blockdraft_core::tokenizer::Tokenizer;
use blockdraft_core::ModelError;
use blockdraft_gguf::GgufFile;
use blockdraft_wgpu::{Gpu, WgpuBackend};
use std::sync::Arc;

/// The rows `run` and `bench` ask of a state.
const CLI_BATCH: usize = 256;
const SMALL_LIMIT: u64 = 16 << 20;

/// A backend on the default adapter, its storage bindings capped at
/// `limit` where given; and the limit in force.
fn backend(limit: Option<u64>) -> (Arc<WgpuBackend>, u64) {
    let mut gpu = block_on(Gpu::request()).expect("a wgpu adapter (mesa-vulkan-drivers)");
    if let Some(l) = limit {
        gpu.limits.max_storage_buffer_binding_size = l;
    }
    let limit = gpu.limits.max_storage_buffer_binding_size;
    (Arc::new(WgpuBackend::with_gpu(gpu)), limit)
}

/// Greedy plain decoding and greedy n-gram speculation (drafts of 7, as
/// `run --draft ngram` may draft) of `n` tokens, with 256-row states.
fn decode(dec: &Decoder<WgpuBackend>, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<u32>) {
    let n_ctx = prompt.len() + n + 16;
    let mut state = dec.try_new_state(n_ctx, CLI_BATCH).expect("a state");
    let plain = block_on(plain_in_state(
        dec,
        &mut state,
        prompt,
        n,
        &SamplingParams::greedy(),
    ))
    .expect("plain decoding");
    let mut state = dec.try_new_state(n_ctx, CLI_BATCH).expect("a state");
    let mut s = Sampler::new(SamplingParams::greedy());
    let mut policy = DraftPolicy::new(PolicyConfig::fixed(7));
    let spec = block_on(generate_speculative(
        dec,
        &mut state,
        &mut NgramDrafter::default(),
        &mut policy,
        prompt,
        n,
        &mut s,
        &|_| false,
        &mut |_| true,
        &mut |_| {},
    ))
    .expect("speculative decoding")
    .0;
    (plain, spec)
}

#[test]
fn big_vocabularies_decode_within_the_binding_limit() {
    for name in [
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "gemma-3-270m-q4_k_m.gguf",
    ] {
        let Some(path) = real_model(name) else {
            return;
        };
        let file = GgufFile::open(&path).unwrap();
        let tok = Tokenizer::from_gguf(&file).unwrap();
        // Repetitive, so that n-gram drafts get accepted.
        let prompt = tok
            .encode(
                "one two three four, one two three four, one two",
                true,
                false,
            )
            .unwrap();
        let n = 12;
        let mut runs = Vec::new();
        for limit in [None, Some(SMALL_LIMIT)] {
            let (be, max) = backend(limit);
            let dec = Decoder::load(&file, be.clone(), &mut |_| {}).expect("load");
            let (plain, spec) = decode(&dec, &prompt, n);
            let largest = be.counters().largest_binding;
            eprintln!(
                "{name}, binding limit {} MiB: largest binding {:.1} MiB; {plain:?}",
                max >> 20,
                largest as f64 / (1 << 20) as f64
            );
            assert_eq!(spec, plain, "{name}: n-gram speculation equals plain");
            assert!(largest <= max, "{name}: bound {largest} bytes, limit {max}");

            // Logits for every row only as far as one binding holds them;
            // beyond that, a typed error instead of a validation panic.
            let vocab = dec.config.n_vocab_head as u64;
            let mut state = dec.try_new_state(64, CLI_BATCH).unwrap();
            let rows = (max / (vocab * 4)).min(CLI_BATCH as u64) as usize;
            assert_eq!(state.logit_rows(), rows, "{name}");
            if rows < 64 {
                let ids = vec![prompt[0]; rows + 1];
                let e = dec.forward(&mut state, &ids, LogitRows::All, true, None);
                assert!(matches!(e, Err(ModelError::Usage(_))), "{name}: {e:?}");
                dec.forward(&mut state, &ids[..rows], LogitRows::All, true, None)
                    .expect("a pass of as many rows as fit");
            }
            runs.push(plain);
        }
        assert_eq!(
            runs[0], runs[1],
            "{name}: the 16 MiB limit changes no token"
        );
    }
}

/// The GPU stack's errors come back as typed errors naming what failed,
/// never as wgpu's panic: a binding beyond the device's real limit (a
/// backend told the adapter allows 16 times more than it does), and a lost
/// device.
#[test]
fn device_errors_are_typed_errors_not_panics() {
    let Some(path) = real_model("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf") else {
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let prompt = [9707u32, 11, 1879, 0];

    let mut gpu = block_on(Gpu::request()).unwrap();
    gpu.limits.max_storage_buffer_binding_size *= 16;
    gpu.limits.max_buffer_size = gpu.limits.max_buffer_size.max(u64::from(u32::MAX));
    let be = Arc::new(WgpuBackend::with_gpu(gpu));
    let err = Decoder::load(&file, be.clone(), &mut |_| {})
        .and_then(|dec| {
            let mut state = dec.try_new_state(64, CLI_BATCH)?;
            block_on(plain_in_state(
                &dec,
                &mut state,
                &prompt,
                4,
                &SamplingParams::greedy(),
            ))
        })
        .expect_err("a binding beyond the device's limit");
    let text = err.to_string();
    eprintln!("validation: {text}");
    assert!(
        matches!(err, ModelError::Backend(_)) && text.contains("the GPU refused an operation"),
        "{text}"
    );

    let (be, _) = backend(None);
    let dec = Decoder::load(&file, be.clone(), &mut |_| {}).unwrap();
    let mut state = dec.try_new_state(64, 8).unwrap();
    be.destroy_device();
    let err = block_on(plain_in_state(
        &dec,
        &mut state,
        &prompt,
        4,
        &SamplingParams::greedy(),
    ))
    .expect_err("a lost device");
    eprintln!("lost device: {err}");
    assert!(err.to_string().contains("lost"), "{err}");
}
