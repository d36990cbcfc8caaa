//! A model or a context that does not fit is refused before anything is
//! loaded or allocated, with an error naming what and by how much (here
//! with a budget below the host's memory, as a machine shared with other
//! work would set).

mod common;

use blockdraft_core::backend::KvType;
use blockdraft_core::model::Decoder;
use blockdraft_core::ModelError;
use blockdraft_cpu::CpuBackend;
use blockdraft_gguf::GgufFile;
use std::sync::Arc;

#[test]
fn what_does_not_fit_is_refused_before_it_is_loaded() {
    let Some(path) = common::model("smollm2-135m-instruct-q4_1.gguf") else {
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let weights: u64 = file.tensors().iter().map(|t| t.n_bytes).sum();

    let tight = Arc::new(CpuBackend::new(1).with_memory_budget(weights / 2));
    let mut progress = 0u64;
    let Err(err) = Decoder::load(&file, tight, &mut |b| progress = b) else {
        panic!("weights of {weights} bytes loaded within half of that");
    };
    let text = err.to_string();
    assert!(matches!(err, ModelError::MemoryLimit { .. }), "{text}");
    assert!(text.contains("the model's weights"), "{text}");
    assert_eq!(progress, 0, "nothing was loaded");

    // Room for the weights, not for a full 8192-position context.
    let budget = weights + (64 << 20);
    let be = Arc::new(CpuBackend::new(1).with_memory_budget(budget));
    let dec = Decoder::load(&file, be, &mut |_| {}).unwrap();
    assert!(dec.try_new_state(256, 64).is_ok());
    let err = dec.try_new_state(8192, 256).map(|_| ()).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("a context of 8192 positions"), "{text}");
}

#[test]
fn an_f16_cache_takes_half_the_memory_of_an_f32_one() {
    let Some(path) = common::model("smollm2-135m-instruct-q4_1.gguf") else {
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let weights: u64 = file.tensors().iter().map(|t| t.n_bytes).sum();
    // SmolLM2: 30 layers of 192-wide keys and values, 46 KB per position
    // in f32: 8192 positions take 377 MB in f32, 189 MB in f16. The budget
    // leaves 235 MB before the first matmul moves any weight.
    let budget = weights + (150 << 20);
    let be = Arc::new(CpuBackend::new(1).with_memory_budget(budget));
    let dec = Decoder::load(&file, be, &mut |_| {}).unwrap();
    let text = dec
        .try_new_state(8192, 16)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(text.contains("a context of 8192 positions"), "{text}");
    let dec = dec.with_kv_type(KvType::F16);
    let state = dec.try_new_state(8192, 16).unwrap();
    assert_eq!(state.kv.kv_type(), KvType::F16);
}
