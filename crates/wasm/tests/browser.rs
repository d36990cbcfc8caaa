//! The wgpu backend inside a real browser: headless Chromium's WebGPU (on
//! SwiftShader in CI) through wasm-bindgen-test. The shared op conformance
//! suite against the CPU backend compiled to the same wasm module; greedy
//! generation of synthetic qwen2 and gemma3 models token-identical to the
//! CPU backend; and greedy DFlash speculative decoding, drafted on the
//! device, identical to plain decoding; a model streamed onto WebGPU
//! tensor by tensor, never whole in wasm memory; at most 9 dispatches per
//! decoder layer, one pass per submit and no bind group created per warm
//! decode step, as natively; a hybrid (`qwen35`) model streamed in, decoding
//! as the CPU backend and through DFlash rounds that roll its recurrent
//! state back. `tests/run.sh` runs it with
//! `wasm-bindgen-test-runner` and chromedriver (flags in webdriver.json).
#![cfg(target_arch = "wasm32")]

use blockdraft_core::backend::prelude::*;
use blockdraft_core::model::{Decoder, LogitRows, ModelConfig, StreamedModel, StreamingLoad};
use blockdraft_core::sampling::SamplingParams;
use blockdraft_core::speculative::{DFlashDrafter, DFlashModel, PolicyConfig};
use blockdraft_core::testing::{
    dispatches_per_layer, greedy_plain_async, greedy_speculative_async, plain_in_state,
    synthetic_decoder, synthetic_dflash, synthetic_qwen35, SyntheticDFlash, SyntheticDims,
    SyntheticHybrid,
};
use blockdraft_core::ModelError;
use blockdraft_cpu::CpuBackend;
use blockdraft_gguf::{GgmlType, GgufFile};
use blockdraft_wgpu::{Gpu, WgpuBackend};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use wasm_bindgen_test::{wasm_bindgen_test, wasm_bindgen_test_configure};

wasm_bindgen_test_configure!(run_in_browser);

async fn webgpu() -> WgpuBackend {
    let gpu = Gpu::request()
        .await
        .expect("WebGPU (Chromium needs --enable-unsafe-webgpu; see webdriver.json)");
    let backend = WgpuBackend::with_gpu(gpu);
    wasm_bindgen_test::console_log!("{}", backend.adapter_info());
    backend
}

/// Counts live heap bytes and their peak, to see what a load keeps in
/// wasm memory.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        System.dealloc(p, layout);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn load<B: Backend>(file: &GgufFile, be: B) -> Decoder<B> {
    Decoder::load(file, Arc::new(be), &mut |_| {}).expect("load")
}

/// Every op: a shader that Chrome's compiler rejects shows as wrong
/// results (the browser skips the dispatch), besides the kept error.
mod conformance {
    use super::*;
    blockdraft_core::backend_conformance_tests!(
        async wasm_bindgen_test,
        webgpu().await,
        CpuBackend::new(1)
    );
}

#[wasm_bindgen_test]
async fn synthetic_models_generate_what_the_cpu_backend_generates() {
    let prompt = [3u32, 14, 15, 9, 26, 5, 35, 8, 9, 7];
    // The two norm/rope families (SwiftShader is slow; the native tests
    // cover every architecture).
    for arch in ["qwen2", "gemma3"] {
        let m = synthetic_decoder(arch, SyntheticDims::default(), 21);
        let file = GgufFile::from_bytes(m.bytes).unwrap();
        let gpu = load(&file, webgpu().await);
        let cpu = load(&file, CpuBackend::new(1));
        assert_eq!(
            greedy_plain_async(&gpu, &prompt, 16).await,
            greedy_plain_async(&cpu, &prompt, 16).await,
            "{arch}"
        );
        assert_eq!(gpu.backend.take_device_error(), None, "{arch}");
    }
}

/// The command stream in the browser as natively: a decoder layer is at
/// most 9 dispatches for a decode step and for a verify of 8 rows (Gemma 3
/// with its head norms and post-norms too).
#[wasm_bindgen_test]
async fn a_decoder_layer_is_at_most_nine_dispatches() {
    let gpu = Arc::new(webgpu().await);
    for (arch, ty) in [
        ("qwen2", GgmlType::Q5_0),
        ("llama", GgmlType::Q4_K),
        ("gemma3", GgmlType::Q4_K),
    ] {
        for rows in [1, 8] {
            let per_layer = dispatches_per_layer(|| gpu.clone(), arch, ty, rows).await;
            wasm_bindgen_test::console_log!("{arch} {ty}, {rows} rows: {per_layer} per layer");
            assert!(
                per_layer <= 9,
                "{arch} {ty}, {rows} rows: {per_layer} per layer"
            );
        }
    }
    assert_eq!(gpu.take_device_error(), None);
}

/// What a decode step costs the host once warm, in the browser as
/// natively: at most one compute pass per submit, one readback, and no
/// bind group created.
#[wasm_bindgen_test]
async fn warm_decode_steps_keep_one_pass_per_submit_and_create_no_bind_groups() {
    let m = synthetic_decoder("qwen2", SyntheticDims::default(), 22);
    let file = GgufFile::from_bytes(m.bytes).unwrap();
    let dec = load(&file, webgpu().await);
    let be = dec.backend.clone();
    let mut state = dec.try_new_state(64, 16).unwrap();
    let mut next = 1;
    let mut counts = Vec::new();
    for step in 0..12 {
        let tokens = if step == 0 {
            vec![1, 2, 3, 4]
        } else {
            vec![next]
        };
        dec.forward(&mut state, &tokens, LogitRows::Last, true, None)
            .unwrap();
        next = be.argmax(state.logits()).await[0];
        counts.push(be.counters());
    }
    let (before, after) = (&counts[3], &counts[11]);
    assert_eq!(after.readbacks - before.readbacks, 8, "{after:?}");
    assert!(
        after.passes - before.passes <= after.submits - before.submits,
        "{after:?}"
    );
    assert_eq!(
        after.bind_groups, before.bind_groups,
        "bind groups created: {after:?}"
    );
    assert_eq!(be.take_device_error(), None);
}

/// Six greedy tokens after `prompt` in a state of the CLI's 256 rows.
async fn greedy_in<B: Backend>(dec: &Decoder<B>, prompt: &[u32]) -> Vec<u32> {
    let mut state = dec.try_new_state(prompt.len() + 8, 256).unwrap();
    plain_in_state(dec, &mut state, prompt, 6, &SamplingParams::greedy())
        .await
        .unwrap()
}

/// Qwen2.5's and Gemma 3's vocabulary sizes with the CLI's 256-row
/// states: 256 rows of logits would be 155 and 268 MB, beyond Chrome's
/// 128 MiB storage binding; the backend binds only the rows a pass uses
/// and caps the logit rows at what one binding holds.
#[wasm_bindgen_test]
async fn big_vocabularies_decode_within_the_browsers_binding_limit() {
    for (arch, n_vocab) in [("qwen2", 151_936), ("gemma3", 262_144)] {
        let dims = SyntheticDims {
            n_layer: 2,
            n_embd: 32,
            n_head: 2,
            n_head_kv: 1,
            head_dim: 16,
            n_ff: 64,
            n_vocab,
            window: 3,
        };
        let file = GgufFile::from_bytes(synthetic_decoder(arch, dims, 3).bytes).unwrap();
        let gpu = Gpu::request().await.unwrap();
        let limit = gpu.limits.max_storage_buffer_binding_size;
        let gpu = load(&file, WgpuBackend::with_gpu(gpu));
        let cpu = load(&file, CpuBackend::new(1));
        let prompt = [3u32, 140_000, 15, 9, 151_000];
        let mut sg = gpu.try_new_state(prompt.len() + 8, 256).unwrap();
        let want = greedy_in(&cpu, &prompt).await;
        let got = plain_in_state(&gpu, &mut sg, &prompt, 6, &SamplingParams::greedy()).await;
        assert_eq!(got.unwrap(), want, "{arch}");
        let largest = gpu.backend.counters().largest_binding;
        wasm_bindgen_test::console_log!(
            "{arch}: vocabulary {n_vocab}, logit rows {}, largest binding {largest} of {limit}",
            sg.logit_rows()
        );
        assert!(
            largest <= limit,
            "{arch}: bound {largest} bytes, limit {limit}"
        );
        assert_eq!(gpu.backend.take_device_error(), None, "{arch}");
    }
}

#[wasm_bindgen_test]
async fn dflash_speculative_decoding_is_identical_to_plain() {
    let m = synthetic_decoder("qwen3", SyntheticDims::default(), 11);
    let file = GgufFile::from_bytes(m.bytes).unwrap();
    let dec = load(&file, webgpu().await);
    let prompt = [3u32, 14, 15, 9, 26, 5, 3, 14, 15, 9];
    let n = 24;
    let want = greedy_plain_async(&dec, &prompt, n).await;
    let spec = SyntheticDFlash::small(48, vec![1, 4, 7], GgmlType::Q8_0);
    let drafter = GgufFile::from_bytes(synthetic_dflash(&spec, 5).bytes).unwrap();
    // The weights upload once; each request's drafter shares them.
    let model = Arc::new(DFlashModel::load(&drafter, &dec).unwrap());
    let uploaded = dec.backend.weight_bytes_loaded();
    for _ in 0..2 {
        let mut d = DFlashDrafter::new(model.clone(), prompt.len() + n + 32, 32);
        let before = dec.backend.counters();
        let (got, stats) =
            greedy_speculative_async(&dec, &mut d, &prompt, n, PolicyConfig::fixed(7)).await;
        let c = dec.backend.counters();
        assert_eq!(got, want);
        assert!(stats.rounds > 0);
        // Drafting on the device: one readback per pass, as natively.
        let passes = (1 + stats.rounds + stats.plain_steps) as u64;
        assert_eq!(c.readbacks - before.readbacks, passes, "{c:?}");
    }
    assert_eq!(
        dec.backend.weight_bytes_loaded(),
        uploaded,
        "drafters upload no weights"
    );
    assert_eq!(dec.backend.take_device_error(), None);
}

/// `bytes` streamed onto `gpu` in 64 KiB chunks, as the npm package feeds
/// a download.
fn stream_in(bytes: &[u8], gpu: Arc<WgpuBackend>) -> StreamedModel<WgpuBackend> {
    let mut stream = StreamingLoad::new(gpu);
    stream.begin_part(Some(bytes.len() as u64)).unwrap();
    for chunk in bytes.chunks(64 << 10) {
        stream.push(chunk).unwrap();
    }
    stream.end_part().unwrap();
    stream.finish().unwrap()
}

/// A hybrid model (gated DeltaNet and gated attention) streamed onto
/// WebGPU: plain greedy decoding as the CPU backend's, and DFlash rounds,
/// drafted on the device, whose rejected rows roll the recurrent state
/// back, identical to it.
#[wasm_bindgen_test]
async fn a_hybrid_model_streams_in_and_rolls_back_on_webgpu() {
    let mut h = SyntheticHybrid::default();
    h.dims.n_layer = 7;
    h.dims.n_embd = 48;
    let bytes = synthetic_qwen35(&h, 35).bytes;
    let gpu = Arc::new(webgpu().await);
    let mut model = stream_in(&bytes, gpu.clone());
    let config = ModelConfig::from_metadata(&model.metadata).unwrap();
    let dec = Decoder::load_with_config(config, &mut model, None, gpu, &mut |_| {}).unwrap();
    let cpu = load(&GgufFile::from_bytes(bytes).unwrap(), CpuBackend::new(1));
    let prompt = [3u32, 14, 15, 9, 26, 5, 3, 14, 15, 9];
    let n = 16;
    let want = greedy_plain_async(&dec, &prompt, n).await;
    assert_eq!(want, greedy_plain_async(&cpu, &prompt, n).await);
    let spec = SyntheticDFlash::small(48, vec![1, 4, 7], GgmlType::Q8_0);
    let drafter = GgufFile::from_bytes(synthetic_dflash(&spec, 5).bytes).unwrap();
    let mut d = DFlashDrafter::load(&drafter, &dec, prompt.len() + n + 32, 32).unwrap();
    let (got, stats) =
        greedy_speculative_async(&dec, &mut d, &prompt, n, PolicyConfig::fixed(5)).await;
    assert_eq!(got, want);
    assert!(
        stats.rounds > 0 && stats.accepted < stats.drafted,
        "{stats:?}"
    );
    assert_eq!(dec.backend.take_device_error(), None);
}

#[wasm_bindgen_test]
async fn a_model_streams_onto_webgpu_without_sitting_whole_in_wasm_memory() {
    // About 12 MB of F32 weights in tensors of at most 1 MiB.
    let dims = SyntheticDims {
        n_layer: 3,
        n_embd: 256,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_ff: 1024,
        n_vocab: 1024,
        window: 3,
    };
    let bytes = synthetic_decoder("qwen2", dims, 8).bytes;
    let file = GgufFile::from_bytes(bytes.clone()).unwrap();
    let largest = file.tensors().iter().map(|t| t.n_bytes).max().unwrap() as usize;

    let gpu = Arc::new(webgpu().await);
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let mut model = stream_in(&bytes, gpu.clone());
    let held = PEAK.load(Ordering::Relaxed) - before;
    wasm_bindgen_test::console_log!(
        "streaming a {}-byte model held at most {held} bytes in wasm memory",
        bytes.len()
    );
    // One tensor being assembled, plus the header and bookkeeping.
    assert!(
        held < largest + (1 << 20) && held < bytes.len() / 4,
        "streaming held {held} bytes of a {}-byte model (largest tensor {largest})",
        bytes.len()
    );

    let config = ModelConfig::from_metadata(&model.metadata).unwrap();
    let streamed = Decoder::load_with_config(config, &mut model, None, gpu, &mut |_| {}).unwrap();
    let cpu = load(&file, CpuBackend::new(1));
    let prompt = [3u32, 14, 15, 9, 26, 5, 35, 8];
    assert_eq!(
        greedy_plain_async(&streamed, &prompt, 8).await,
        greedy_plain_async(&cpu, &prompt, 8).await
    );
    assert_eq!(streamed.backend.take_device_error(), None);
}

#[wasm_bindgen_test]
async fn a_lost_device_is_reported_not_a_crash() {
    let m = synthetic_decoder("qwen2", SyntheticDims::default(), 3);
    let file = GgufFile::from_bytes(m.bytes).unwrap();
    let gpu = load(&file, webgpu().await);
    let prompt = [3u32, 14, 15, 9];
    let before = greedy_plain_async(&gpu, &prompt, 4).await;
    assert_eq!(before.len(), 4);
    assert!(!gpu.backend.has_device_error());
    gpu.backend.destroy_device();
    // Readbacks fail from here on: generation stops at its first one with
    // a typed error naming the loss, and the loss stays for the caller.
    let mut state = gpu.new_state(16, 8);
    match plain_in_state(&gpu, &mut state, &prompt, 2, &SamplingParams::greedy()).await {
        Err(ModelError::Backend(e)) => assert!(e.to_string().contains("lost"), "{e}"),
        other => panic!("a lost device: {other:?}"),
    }
    assert!(gpu.backend.has_device_error());
    let e = gpu.backend.take_device_error().unwrap();
    assert!(e.contains("lost"), "{e}");
}
