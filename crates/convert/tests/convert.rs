//! HF checkpoints written here (config.json + safetensors) for DFlash v1,
//! DFlash2 and DFly, converted and loaded with blockdraft's loaders: every
//! tensor round trips (ggml dims = torch shape reversed, same values), v1,
//! DFlash2 and DFly block logits equal those of the same weights written directly
//! as GGUF by `blockdraft_core::testing`, and every validation refuses.

use blockdraft_convert::{
    convert, convert_with_head, target_tokenizer, with_tokenizer, ConvertError, OutType,
    TargetGeometry, Variant,
};
use blockdraft_core::model::{Decoder, LogitRows, Taps};
use blockdraft_core::sampling::Rng;
use blockdraft_core::speculative::DFlashDrafter;
use blockdraft_core::testing::block_on;
use blockdraft_core::testing::{
    synthetic_decoder, synthetic_dflash, synthetic_dflash2, synthetic_dflash_d2t, synthetic_dfly,
    SyntheticDFlash, SyntheticDFlash2, SyntheticDims, SyntheticModel,
};
use blockdraft_cpu::CpuBackend;
use blockdraft_gguf::{quants, GgmlType, GgufFile, GgufWriter};
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Synthetic qwen3 target: 7 layers, n_embd 48, vocab 61.
const TARGET: TargetGeometry = TargetGeometry {
    n_layer: 7,
    n_embd: 48,
};

struct Target {
    dec: Decoder<CpuBackend>,
}

fn target() -> Target {
    let m = synthetic_decoder("qwen3", SyntheticDims::default(), 11);
    let file = GgufFile::from_bytes(m.bytes).unwrap();
    let dec = Decoder::load(&file, Arc::new(CpuBackend::new(2)), &mut |_| {}).unwrap();
    Target { dec }
}

fn spec() -> SyntheticDFlash {
    SyntheticDFlash::small(48, vec![1, 4, 7], GgmlType::F32)
}

/// The geometry fields of `spec()` as a Qwen3 config.json.
fn base_config() -> Value {
    json!({
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": 48,
        "num_hidden_layers": 2,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000.0,
        "max_position_embeddings": 256,
        "num_target_layers": 3,
        "dflash_config": {"target_layer_ids": [0, 3, 6], "mask_token_id": 0, "block_size": 8}
    })
}

struct HfTensor {
    name: String,
    shape: Vec<usize>,
    values: Vec<f32>,
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("blockdraft-convert-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn encode(values: &[f32], dtype: Dtype) -> Vec<u8> {
    match dtype {
        Dtype::F32 => values.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Dtype::F16 => values
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect(),
        Dtype::BF16 => values
            .iter()
            .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
            .collect(),
        _ => unreachable!("test dtypes"),
    }
}

fn write_checkpoint(dir: &Path, config: &Value, tensors: &[HfTensor], dtype: Dtype) {
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|t| encode(&t.values, dtype)).collect();
    let views = tensors.iter().zip(&bytes).map(|(t, b)| {
        (
            t.name.clone(),
            TensorView::new(dtype, t.shape.clone(), b).unwrap(),
        )
    });
    safetensors::serialize_to_file(views.clone(), None, &dir.join("model.safetensors")).unwrap();
}

/// HF name of a GGUF tensor (the inverse of the converter's renames).
fn hf_name(gguf: &str, dfly: bool) -> String {
    let fixed = match gguf {
        "fc.weight" if dfly => "context_proj.weight",
        "enc.output_norm.weight" => "hidden_norm.weight",
        "output_norm.weight" => "norm.weight",
        "layer_fusion" => "layer_fusion_weights",
        "selector_hidden.weight" => "candidate_selector.hidden_projection.weight",
        "selector_predecessor.weight" => "candidate_selector.predecessor_codebook",
        "selector_successor.weight" => "candidate_selector.successor_codebook.weight",
        "hidden_correction.gate.weight" => "hidden_correction.gate_proj.weight",
        "hidden_correction.up.weight" => "hidden_correction.up_proj.weight",
        "hidden_correction.down.weight" => "hidden_correction.down_proj.weight",
        other if !other.starts_with("blk.") => other,
        _ => "",
    };
    if !fixed.is_empty() {
        return fixed.into();
    }
    let rest = &gguf["blk.".len()..];
    let (layer, t) = rest.split_once('.').unwrap();
    for (g, hf) in [
        ("attn_conv_base", "attention_conv.base_kernel"),
        (
            "attn_conv_proj.weight",
            "attention_conv.kernel_projection.weight",
        ),
        ("ffn_conv_base", "mlp_conv.base_kernel"),
        ("ffn_conv_proj.weight", "mlp_conv.kernel_projection.weight"),
    ] {
        if t == g {
            return format!("layers.{layer}.{hf}");
        }
    }
    let t = t.strip_suffix(".weight").unwrap();
    let module = match t {
        "attn_norm" => "input_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_norm" => "post_attention_layernorm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        other => panic!("unmapped {other}"),
    };
    format!("layers.{layer}.{module}.weight")
}

/// The HF tensors holding exactly the weights of a synthetic GGUF drafter.
fn hf_tensors(m: &SyntheticModel, dfly: bool) -> Vec<HfTensor> {
    let file = GgufFile::from_bytes(m.bytes.clone()).unwrap();
    file.tensors()
        .iter()
        .map(|t| HfTensor {
            name: hf_name(&t.name, dfly),
            shape: t.dims.iter().rev().map(|&d| d as usize).collect(),
            values: m.weights[&t.name].clone(),
        })
        .collect()
}

fn run_convert(dir: &Path, out: OutType) -> Result<(Variant, GgufFile), ConvertError> {
    let c = convert(dir, TARGET, out, &mut |_, _| {})?;
    Ok((
        c.variant,
        GgufFile::from_bytes(c.writer.to_bytes().unwrap()).unwrap(),
    ))
}

/// Same tensors (names, dims, F32 values) and the same metadata.
fn assert_same_file(converted: &GgufFile, direct: &GgufFile) {
    let mut a: Vec<_> = converted.tensors().iter().map(|t| &t.name).collect();
    let mut b: Vec<_> = direct.tensors().iter().map(|t| &t.name).collect();
    a.sort();
    b.sort();
    assert_eq!(a, b);
    for t in direct.tensors() {
        let c = converted.tensor(&t.name).unwrap();
        assert_eq!(c.dims, t.dims, "{}", t.name);
        assert_eq!(
            converted.tensor_data(&t.name).unwrap().to_f32().unwrap(),
            direct.tensor_data(&t.name).unwrap().to_f32().unwrap(),
            "{}",
            t.name
        );
    }
    for (k, v) in direct.metadata().iter() {
        assert_eq!(converted.metadata().get(k), Some(v), "{k}");
    }
}

/// Block logits of a drafter after a prefill of the target.
fn block_logits(t: &Target, file: &GgufFile) -> Vec<f32> {
    let mut d = DFlashDrafter::load(file, &t.dec, 64, 16).unwrap();
    let be = &*t.dec.backend;
    let mut taps = Taps::new(be, &t.dec.config, &d.config().target_layers, 16).unwrap();
    let mut state = t.dec.new_state(64, 16);
    let prompt = [5u32, 17, 3, 42, 8];
    t.dec
        .forward(&mut state, &prompt, LogitRows::Last, true, Some(&mut taps))
        .unwrap();
    block_on(d.inject(taps.output(), 0, prompt.len())).unwrap();
    let logits = block_on(d.block_logits(9, 7)).unwrap();
    // Finite, but for ids outside a reduced vocabulary (-inf: never drafted).
    assert!(logits
        .iter()
        .all(|x| x.is_finite() || *x == f32::NEG_INFINITY));
    logits
}

#[test]
fn dflash_v1_equals_the_directly_written_gguf() {
    let t = target();
    let m = synthetic_dflash(&spec(), 3);
    let dir = scratch_dir("v1");
    write_checkpoint(&dir, &base_config(), &hf_tensors(&m, false), Dtype::F32);
    let (variant, converted) = run_convert(&dir, OutType::F32).unwrap();
    assert_eq!(variant, Variant::DFlash);
    let direct = GgufFile::from_bytes(m.bytes).unwrap();
    assert_same_file(&converted, &direct);
    assert_eq!(block_logits(&t, &converted), block_logits(&t, &direct));
}

/// A v1 checkpoint with a reduced vocabulary: its own `lm_head.weight`
/// over `d2t`'s rows and the I64 `d2t` map, as `training/train.py
/// --draft-vocab` exports them.
fn write_d2t_checkpoint(dir: &Path, d2t: &[i64], m: &SyntheticModel) {
    let mut config = base_config();
    config["vocab_size"] = json!(61);
    let tensors: Vec<HfTensor> = GgufFile::from_bytes(m.bytes.clone())
        .unwrap()
        .tensors()
        .iter()
        .filter(|t| t.name != "d2t")
        .map(|t| HfTensor {
            name: match t.name.as_str() {
                "output.weight" => "lm_head.weight".into(),
                other => hf_name(other, false),
            },
            shape: t.dims.iter().rev().map(|&d| d as usize).collect(),
            values: m.weights[&t.name].clone(),
        })
        .collect();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|t| encode(&t.values, Dtype::F32))
        .collect();
    bytes.push(d2t.iter().flat_map(|v| v.to_le_bytes()).collect());
    let mut views: Vec<(String, TensorView)> = tensors
        .iter()
        .zip(&bytes)
        .map(|(t, b)| {
            (
                t.name.clone(),
                TensorView::new(Dtype::F32, t.shape.clone(), b).unwrap(),
            )
        })
        .collect();
    let d2t_view = TensorView::new(Dtype::I64, vec![d2t.len()], bytes.last().unwrap()).unwrap();
    views.push(("d2t".into(), d2t_view));
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
}

#[test]
fn reduced_vocabulary_equals_the_directly_written_gguf_and_is_checked() {
    let t = target();
    let d2t = [0i64, 3, 5, 9, 17, 42, 60];
    let m = synthetic_dflash_d2t(&spec(), &d2t, 4);
    let dir = scratch_dir("d2t");
    write_d2t_checkpoint(&dir, &d2t, &m);
    let (variant, converted) = run_convert(&dir, OutType::F32).unwrap();
    assert_eq!(variant, Variant::DFlash);
    let direct = GgufFile::from_bytes(m.bytes.clone()).unwrap();
    let ids = |f: &GgufFile| f.tensor_data("d2t").unwrap().as_bytes().to_vec();
    assert_eq!(ids(&converted), ids(&direct));
    assert_eq!(block_logits(&t, &converted), block_logits(&t, &direct));
    // The head in its own type, the rest as asked: rows of 48 are not
    // whole blocks of 32, so the head falls back to F32 and the logits stay
    // the direct file's (the Q4_0 rule itself: the unit tests of OutType).
    let c = convert_with_head(&dir, TARGET, OutType::F16, OutType::Q4_0, &mut |_, _| {}).unwrap();
    let file = GgufFile::from_bytes(c.writer.to_bytes().unwrap()).unwrap();
    assert_eq!(file.tensor("output.weight").unwrap().ty, GgmlType::F32);
    assert_eq!(file.tensor("fc.weight").unwrap().ty, GgmlType::F16);
    assert_eq!(ids(&file), ids(&direct));
    block_logits(&t, &file);
    // A repeated id, one beyond the vocabulary: refused, naming d2t.
    for bad in [[0i64, 3, 3, 9, 17, 42, 60], [0, 3, 5, 9, 17, 42, 61]] {
        write_d2t_checkpoint(&dir, &bad, &m);
        let e = run_convert(&dir, OutType::F32).unwrap_err();
        assert!(
            matches!(&e, ConvertError::BadTensor { tensor, .. } if tensor == "d2t"),
            "{e}"
        );
    }
}

#[test]
fn dfly_with_and_without_hidden_correction_equals_the_directly_written_gguf() {
    let t = target();
    for correction in [true, false] {
        let m = synthetic_dfly(&spec(), correction, 4);
        let dir = scratch_dir(&format!("dfly-{correction}"));
        let mut config = base_config();
        // Top-level fields this time (schema drift).
        let nested = config["dflash_config"].take();
        config.as_object_mut().unwrap().remove("dflash_config");
        for (k, v) in nested.as_object().unwrap() {
            config[k] = v.clone();
        }
        config["enable_hidden_correction"] = json!(correction);
        config["hidden_correction_intermediate_size"] = json!(64);
        config["target_hidden_size"] = json!(48);
        config["target_num_hidden_layers"] = json!(7);
        let mut tensors = hf_tensors(&m, true);
        if !correction {
            // A disabled correction's (zero) tensors are left out of the GGUF.
            let rand = random_tensor(
                &mut Rng::new(1),
                "hidden_correction.down_proj.weight",
                &[48, 64],
            );
            tensors.push(rand);
        }
        write_checkpoint(&dir, &config, &tensors, Dtype::F32);
        let (variant, converted) = run_convert(&dir, OutType::F32).unwrap();
        assert_eq!(variant, Variant::DFly);
        let direct = GgufFile::from_bytes(m.bytes).unwrap();
        assert_same_file(&converted, &direct);
        assert_eq!(block_logits(&t, &converted), block_logits(&t, &direct));
    }
}

fn random_tensor(rng: &mut Rng, name: &str, shape: &[usize]) -> HfTensor {
    let n = shape.iter().product();
    HfTensor {
        name: name.into(),
        shape: shape.to_vec(),
        values: (0..n)
            .map(|_| (rng.next_f64() * 2.0 - 1.0) as f32 * 0.3)
            .collect(),
    }
}

const V2: SyntheticDFlash2 = SyntheticDFlash2 {
    conv_kernel_size: 2,
    conv_group_size: 16,
    selector_rank: 8,
    selector_top_k: 2,
};

/// A random DFlash2 drafter (K = 2 taps, groups of 16 (3 groups), rank 8,
/// top-2) and its HF checkpoint holding exactly the same weights.
fn dflash2_checkpoint() -> (Value, Vec<HfTensor>, SyntheticModel) {
    let mut config = base_config();
    config["architectures"] = json!(["DFlash2DraftModel"]);
    config["vocab_size"] = json!(61);
    let d = config["dflash_config"].as_object_mut().unwrap();
    d.insert("conv_kernel_size".into(), json!(2));
    d.insert("conv_group_size".into(), json!(16));
    d.insert("selector_rank".into(), json!(8));
    d.insert("selector_top_k".into(), json!(2));
    let mut s = spec();
    s.dims.n_vocab = 61;
    let m = synthetic_dflash2(&s, &V2, 5);
    let tensors = hf_tensors(&m, false);
    (config, tensors, m)
}

#[test]
fn dflash2_equals_the_directly_written_gguf() {
    let t = target();
    let (config, tensors, m) = dflash2_checkpoint();
    assert_eq!(tensors.len(), 11 * 2 + 4 * 2 + 3 + 3);
    let dir = scratch_dir("v2");
    write_checkpoint(&dir, &config, &tensors, Dtype::F32);
    let (variant, converted) = run_convert(&dir, OutType::F32).unwrap();
    assert_eq!(variant, Variant::DFlash2);
    let direct = GgufFile::from_bytes(m.bytes).unwrap();
    assert_same_file(&converted, &direct);
    let md = converted.metadata();
    assert_eq!(md.get_u32("dflash.conv_kernel_size").unwrap(), 2);
    assert_eq!(md.get_u32("dflash.conv_group_size").unwrap(), 16);
    assert_eq!(md.get_u32("dflash.selector_rank").unwrap(), 8);
    assert_eq!(md.get_u32("dflash.selector_top_k").unwrap(), 2);
    let d = DFlashDrafter::load(&converted, &t.dec, 64, 16).unwrap();
    assert!(d.config().variant.dflash2().is_some());
    assert_eq!(block_logits(&t, &converted), block_logits(&t, &direct));
}

/// `layers.N.<module>.weight` -> `blk.N.<qwen3 name>.weight`.
fn gguf_layer_name(hf: &str) -> String {
    let rest = hf.strip_prefix("layers.").unwrap();
    let (layer, module) = rest.split_once('.').unwrap();
    let module = module.strip_suffix(".weight").unwrap();
    let t = match module {
        "input_layernorm" => "attn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "post_attention_layernorm" => "ffn_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        other => panic!("unmapped {other}"),
    };
    format!("blk.{layer}.{t}.weight")
}

#[test]
fn half_sources_and_output_types() {
    let t = target();
    let m = synthetic_dflash(&spec(), 6);
    let tensors = hf_tensors(&m, false);
    for (dtype, out) in [
        (Dtype::BF16, OutType::F16),
        (Dtype::F16, OutType::Q8_0),
        (Dtype::F16, OutType::F32),
    ] {
        let dir = scratch_dir(&format!("{dtype:?}-{out:?}"));
        write_checkpoint(&dir, &base_config(), &tensors, dtype);
        let (_, gguf) = run_convert(&dir, out).unwrap();
        for h in &tensors {
            let name = ["fc.weight", "hidden_norm.weight", "norm.weight"]
                .iter()
                .zip(["fc.weight", "enc.output_norm.weight", "output_norm.weight"])
                .find(|(s, _)| **s == h.name)
                .map(|(_, g)| g.to_string())
                .unwrap_or_else(|| gguf_layer_name(&h.name));
            let info = gguf.tensor(&name).unwrap();
            let source: Vec<f32> = match dtype {
                Dtype::BF16 => h
                    .values
                    .iter()
                    .map(|&x| half::bf16::from_f32(x).to_f32())
                    .collect(),
                _ => h
                    .values
                    .iter()
                    .map(|&x| half::f16::from_f32(x).to_f32())
                    .collect(),
            };
            let expected_ty = match (h.shape.len(), out) {
                (1, _) | (_, OutType::F32) => GgmlType::F32,
                (_, OutType::F16) => GgmlType::F16,
                (_, OutType::Q8_0) if h.shape[1] % 32 == 0 => GgmlType::Q8_0,
                (_, OutType::Q4_0) if h.shape[1] % 32 == 0 => GgmlType::Q4_0,
                (_, OutType::Q8_0 | OutType::Q4_0) => GgmlType::F32,
            };
            assert_eq!(info.ty, expected_ty, "{name}");
            let expected = match expected_ty {
                GgmlType::F32 => source,
                ty => quants::dequantize_to_vec(ty, &quants::quantize_to_vec(ty, &source).unwrap())
                    .unwrap(),
            };
            assert_eq!(
                gguf.tensor_data(&name).unwrap().to_f32().unwrap(),
                expected,
                "{name}"
            );
        }
        block_logits(&t, &gguf);
    }
}

fn v1_dir(name: &str, edit: impl FnOnce(&mut Value, &mut Vec<HfTensor>)) -> PathBuf {
    let m = synthetic_dflash(&spec(), 8);
    let mut tensors = hf_tensors(&m, false);
    let mut config = base_config();
    edit(&mut config, &mut tensors);
    let dir = scratch_dir(name);
    write_checkpoint(&dir, &config, &tensors, Dtype::F32);
    dir
}

fn err(dir: &Path) -> ConvertError {
    run_convert(dir, OutType::F16).unwrap_err()
}

#[test]
fn validations_refuse_with_typed_errors() {
    let e = err(&v1_dir("tap", |c, _| {
        c["dflash_config"]["target_layer_ids"] = json!([0, 3, 7])
    }));
    assert!(
        matches!(e, ConvertError::TargetLayer { id: 7, depth: 7 }),
        "{e}"
    );
    let e = err(&v1_dir("neg", |c, _| {
        c["dflash_config"]["target_layer_ids"] = json!([-1, 3, 6])
    }));
    assert!(matches!(e, ConvertError::TargetLayer { id: -1, .. }), "{e}");
    let e = err(&v1_dir("ntl", |c, _| c["num_target_layers"] = json!(36)));
    assert!(
        matches!(
            e,
            ConvertError::NumTargetLayers {
                declared: 36,
                found: 3
            }
        ),
        "{e}"
    );
    let e = err(&v1_dir("tnl", |c, _| {
        c["target_num_hidden_layers"] = json!(80)
    }));
    assert!(
        matches!(
            e,
            ConvertError::TargetMismatch {
                field: "target_num_hidden_layers",
                declared: 80,
                actual: 7
            }
        ),
        "{e}"
    );
    let e = err(&v1_dir("ths", |c, _| {
        c["dflash_config"]["target_hidden_size"] = json!(64)
    }));
    assert!(
        matches!(
            e,
            ConvertError::TargetMismatch {
                field: "target_hidden_size",
                ..
            }
        ),
        "{e}"
    );
    let e = err(&v1_dir("hs", |c, _| c["hidden_size"] = json!(64)));
    assert!(
        matches!(
            e,
            ConvertError::HiddenSize {
                drafter: 64,
                target: 48
            }
        ),
        "{e}"
    );
    let e = err(&v1_dir("mask", |c, _| {
        c["dflash_config"]
            .as_object_mut()
            .unwrap()
            .remove("mask_token_id");
    }));
    assert!(
        matches!(&e, ConvertError::MissingField { field } if field == "mask_token_id"),
        "{e}"
    );
    let e = err(&v1_dir("ids", |c, _| {
        c["dflash_config"]["target_layer_ids"] = json!("0,3")
    }));
    assert!(
        matches!(&e, ConvertError::BadField { field, .. } if field == "target_layer_ids"),
        "{e}"
    );
    let e = err(&v1_dir("split", |c, _| {
        c["num_attention_heads"] = json!(5);
        c.as_object_mut().unwrap().remove("head_dim");
    }));
    assert!(
        matches!(&e, ConvertError::BadField { field, .. } if field == "num_attention_heads"),
        "{e}"
    );
    let e = err(&v1_dir("heads", |c, _| c["num_attention_heads"] = json!(0)));
    assert!(
        matches!(&e, ConvertError::BadField { field, .. } if field == "num_attention_heads"),
        "{e}"
    );
    let e = err(&v1_dir("missing", |_, t| {
        t.retain(|t| t.name != "layers.1.mlp.up_proj.weight")
    }));
    assert!(
        matches!(&e, ConvertError::MissingTensor { tensor } if tensor == "layers.1.mlp.up_proj.weight"),
        "{e}"
    );
    let e = err(&v1_dir("shape", |_, t| {
        let fc = t.iter_mut().find(|t| t.name == "fc.weight").unwrap();
        fc.shape = vec![96, 72];
    }));
    assert!(
        matches!(&e, ConvertError::Shape { tensor, expected, .. } if tensor == "fc.weight" && *expected == vec![48, 144]),
        "{e}"
    );
    let e = err(&v1_dir("extra", |_, t| {
        t.push(random_tensor(
            &mut Rng::new(2),
            "layers.2.mlp.up_proj.weight",
            &[64, 48],
        ))
    }));
    assert!(
        matches!(&e, ConvertError::UnexpectedTensor { tensor, .. } if tensor == "layers.2.mlp.up_proj.weight"),
        "{e}"
    );
    // Borrowed from the target: dropped without complaint.
    let dir = v1_dir("dropped", |_, t| {
        t.push(random_tensor(&mut Rng::new(2), "lm_head.weight", &[61, 48]))
    });
    assert_eq!(
        run_convert(&dir, OutType::F32).unwrap().1.tensors().len(),
        25
    );

    // The same tensor twice, then a non-float tensor.
    let dir = v1_dir("dtype", |_, _| {});
    let bytes = vec![0u8; 48 * 4];
    let views = || {
        [(
            "norm.weight",
            TensorView::new(Dtype::I32, vec![48], &bytes).unwrap(),
        )]
    };
    safetensors::serialize_to_file(views(), None, &dir.join("model-00002.safetensors")).unwrap();
    let e = err(&dir);
    assert!(
        matches!(&e, ConvertError::DuplicateTensor { tensor } if tensor == "norm.weight"),
        "{e}"
    );
    let dir = v1_dir("dtype2", |_, t| t.retain(|t| t.name != "norm.weight"));
    safetensors::serialize_to_file(views(), None, &dir.join("model-00002.safetensors")).unwrap();
    let e = err(&dir);
    assert!(
        matches!(&e, ConvertError::Dtype { tensor, .. } if tensor == "norm.weight"),
        "{e}"
    );

    let dir = scratch_dir("empty");
    std::fs::write(dir.join("config.json"), base_config().to_string()).unwrap();
    assert!(matches!(err(&dir), ConvertError::NoWeights { .. }));
    std::fs::write(dir.join("config.json"), "{not json").unwrap();
    assert!(matches!(err(&dir), ConvertError::Json { .. }));
    std::fs::remove_file(dir.join("config.json")).unwrap();
    assert!(matches!(err(&dir), ConvertError::Io { .. }));
    std::fs::write(dir.join("model.safetensors"), b"garbage").unwrap();
    std::fs::write(dir.join("config.json"), base_config().to_string()).unwrap();
    assert!(matches!(err(&dir), ConvertError::Safetensors { .. }));
}

#[test]
fn dflash2_and_dfly_validations() {
    let (config, tensors, _) = dflash2_checkpoint();
    for (field, value, missing) in [
        ("selector_rank", Value::Null, true),
        ("conv_group_size", json!(5), false),
        ("selector_top_k", json!(0), false),
    ] {
        let mut c = config.clone();
        c["dflash_config"][field] = value;
        let dir = scratch_dir(&format!("v2-{field}"));
        write_checkpoint(&dir, &c, &tensors, Dtype::F32);
        match err(&dir) {
            ConvertError::MissingField { field: f } if missing => assert_eq!(f, field),
            ConvertError::BadField { field: f, .. } if !missing => assert_eq!(f, field),
            e => panic!("{field}: {e}"),
        }
    }
    let dir = scratch_dir("v2-codebook");
    let mut t2: Vec<HfTensor> = dflash2_checkpoint().1;
    t2.retain(|t| !t.name.contains("successor"));
    write_checkpoint(&dir, &config, &t2, Dtype::F32);
    assert!(
        matches!(&err(&dir), ConvertError::MissingTensor { tensor } if tensor == "candidate_selector.successor_codebook")
    );

    // DFly: an enabled correction needs all five tensors.
    let m = synthetic_dfly(&spec(), true, 4);
    let mut tensors = hf_tensors(&m, true);
    tensors.retain(|t| t.name != "hidden_correction.up_proj.weight");
    let mut c = base_config();
    c["enable_hidden_correction"] = json!(true);
    c["hidden_correction_intermediate_size"] = json!(64);
    let dir = scratch_dir("dfly-partial");
    write_checkpoint(&dir, &c, &tensors, Dtype::F32);
    assert!(
        matches!(&err(&dir), ConvertError::MissingTensor { tensor } if tensor == "hidden_correction.up_proj.weight")
    );
}

#[test]
fn target_geometry_from_gguf_and_hf_dir() {
    let dir = scratch_dir("target");
    let m = synthetic_decoder("qwen3", SyntheticDims::default(), 11);
    std::fs::write(dir.join("t.gguf"), &m.bytes).unwrap();
    assert_eq!(TargetGeometry::read(&dir.join("t.gguf")).unwrap(), TARGET);
    std::fs::write(
        dir.join("config.json"),
        json!({"num_hidden_layers": 7, "hidden_size": 48}).to_string(),
    )
    .unwrap();
    assert_eq!(TargetGeometry::read(&dir).unwrap(), TARGET);
    std::fs::write(
        dir.join("config.json"),
        json!({"hidden_size": 48}).to_string(),
    )
    .unwrap();
    assert!(matches!(
        TargetGeometry::read(&dir),
        Err(ConvertError::Target { .. })
    ));
}

/// `m`'s file again with a tokenizer of `n_tokens` entries and a mask key
/// of its own (which a drafter's must not be replaced with).
fn with_vocabulary(m: &[u8], n_tokens: usize) -> Vec<u8> {
    let file = GgufFile::from_bytes(m.to_vec()).unwrap();
    let mut w = GgufWriter::new();
    w.add_all(file.metadata());
    w.add("tokenizer.ggml.model", "gpt2");
    let tokens: Vec<String> = (0..n_tokens).map(|i| format!("t{i}")).collect();
    w.add("tokenizer.ggml.tokens", tokens);
    w.add("tokenizer.ggml.eos_token_id", 2u32);
    w.add("tokenizer.ggml.mask_token_id", 60u32);
    for (i, info) in file.tensors().iter().enumerate() {
        let data = file.tensor_data_at(i).unwrap();
        w.add_tensor(info.name.clone(), data.dims(), data.ty(), data.as_bytes())
            .unwrap();
    }
    w.to_bytes().unwrap()
}

const MASK: &str = "tokenizer.ggml.mask_token_id";

/// llama.cpp reads a vocabulary from every model file, a drafter's too:
/// the target's tokenizer (bar the mask token, the drafter's own) goes
/// into the drafter, or comes out of it, its tensors copied byte for byte,
/// and blockdraft drafts the same from each; a tokenizer of another size
/// is refused at load.
#[test]
fn a_drafter_carries_the_targets_tokenizer_or_none() {
    let t = target();
    let dir = scratch_dir("tokenizer");
    let m = synthetic_decoder("qwen3", SyntheticDims::default(), 11);
    std::fs::write(dir.join("bare.gguf"), &m.bytes).unwrap();
    assert!(
        target_tokenizer(&dir.join("bare.gguf")).unwrap().is_none(),
        "a target without a tokenizer lends none"
    );
    std::fs::write(dir.join("t.gguf"), with_vocabulary(&m.bytes, 61)).unwrap();
    let tokenizer = target_tokenizer(&dir.join("t.gguf")).unwrap().unwrap();
    let keys: Vec<_> = tokenizer.keys().collect();
    assert_eq!(
        keys,
        [
            "tokenizer.ggml.model",
            "tokenizer.ggml.tokens",
            "tokenizer.ggml.eos_token_id"
        ]
    );
    assert!(target_tokenizer(&dir).unwrap().is_none(), "an HF directory");

    let drafter = GgufFile::from_bytes(synthetic_dflash(&spec(), 3).bytes).unwrap();
    let reopen = |w: GgufWriter| GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    let with = reopen(with_tokenizer(&drafter, Some(&tokenizer)).unwrap());
    let without = reopen(with_tokenizer(&with, None).unwrap());
    for file in [&with, &without] {
        assert_eq!(file.tensors().len(), drafter.tensors().len());
        for (i, info) in drafter.tensors().iter().enumerate() {
            assert_eq!(
                file.tensor_data(&info.name).unwrap().as_bytes(),
                drafter.tensor_data_at(i).unwrap().as_bytes(),
                "{}",
                info.name
            );
        }
        assert_eq!(file.metadata().get(MASK), drafter.metadata().get(MASK));
        for (k, v) in drafter.metadata().iter() {
            assert_eq!(file.metadata().get(k), Some(v), "{k}");
        }
    }
    for (k, v) in tokenizer.iter() {
        assert_eq!(with.metadata().get(k), Some(v), "{k}");
    }
    assert!(without
        .metadata()
        .keys()
        .all(|k| !k.starts_with("tokenizer.ggml.") || k == MASK));
    assert_eq!(block_logits(&t, &with), block_logits(&t, &drafter));
    assert_eq!(block_logits(&t, &without), block_logits(&t, &drafter));

    let other = target_tokenizer(&{
        std::fs::write(dir.join("t60.gguf"), with_vocabulary(&m.bytes, 60)).unwrap();
        dir.join("t60.gguf")
    })
    .unwrap()
    .unwrap();
    let mismatched = reopen(with_tokenizer(&drafter, Some(&other)).unwrap());
    let Err(err) = DFlashDrafter::load(&mismatched, &t.dec, 64, 16) else {
        panic!("a drafter with a tokenizer of 60 entries loaded for a target of 61");
    };
    assert!(err.to_string().contains("vocabulary 60"), "{err}");
    let not_a_drafter = GgufFile::from_bytes(m.bytes).unwrap();
    assert!(matches!(
        with_tokenizer(&not_a_drafter, None),
        Err(ConvertError::NotADrafter { arch, .. }) if arch == "qwen3"
    ));
}

/// HF → GGUF → load → the PyTorch reference's own logits: a golden drafter
/// (tests/fixtures/dflash, made by the PyPI `dflash` package) written back as
/// an HF checkpoint, converted, and run on the golden target; its block
/// logits must be the reference's.
fn golden_round_trip(gguf: &str, json_file: &str, v2_fields: Option<Value>) {
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/dflash");
    let golden: Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures.join(json_file)).unwrap()).unwrap();
    let drafter = GgufFile::open(fixtures.join(gguf)).unwrap();
    let tensors: Vec<HfTensor> = drafter
        .tensors()
        .iter()
        .map(|t| HfTensor {
            name: hf_name(&t.name, false),
            shape: t.dims.iter().rev().map(|&d| d as usize).collect(),
            values: drafter.tensor_data(&t.name).unwrap().to_f32().unwrap(),
        })
        .collect();
    let c = &golden["config"];
    let mut dflash_config = json!({
        "target_layer_ids": c["target_layer_ids_hf"],
        "mask_token_id": c["mask_token_id"],
        "block_size": c["block_size"],
    });
    if let Some(Value::Object(extra)) = v2_fields {
        dflash_config.as_object_mut().unwrap().extend(extra);
    }
    let config = json!({
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": c["hidden_size"],
        "num_hidden_layers": c["draft_layers"],
        "intermediate_size": c["intermediate_size"],
        "num_attention_heads": c["n_head"],
        "num_key_value_heads": c["n_head_kv"],
        "head_dim": c["head_dim"],
        "rms_norm_eps": c["rms_eps"],
        "rope_theta": c["rope_theta"],
        "max_position_embeddings": 256,
        "num_target_layers": 2,
        "dflash_config": dflash_config,
    });
    let dir = scratch_dir(json_file);
    write_checkpoint(&dir, &config, &tensors, Dtype::F32);
    let geometry = TargetGeometry {
        n_layer: 6,
        n_embd: 64,
    };
    let converted = convert(&dir, geometry, OutType::F32, &mut |_, _| {}).unwrap();
    let converted = GgufFile::from_bytes(converted.writer.to_bytes().unwrap()).unwrap();

    let tfile = GgufFile::open(fixtures.join("target-qwen3.gguf")).unwrap();
    let target = Decoder::load(&tfile, Arc::new(CpuBackend::new(1)), &mut |_| {}).unwrap();
    let mut d = DFlashDrafter::load(&converted, &target, 64, 16).unwrap();
    assert_eq!(
        d.config().variant.dflash2().is_some(),
        json_file.contains("v2")
    );
    let be = &*target.backend;
    let mut taps = Taps::new(be, &target.config, &d.config().target_layers, 16).unwrap();
    let mut state = target.new_state(64, 16);
    let prompt: Vec<u32> = golden["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    target
        .forward(&mut state, &prompt, LogitRows::Last, true, Some(&mut taps))
        .unwrap();
    block_on(d.inject(taps.output(), 0, prompt.len())).unwrap();
    let anchor = golden["target_next_token"].as_u64().unwrap() as u32;
    let logits = block_on(d.block_logits(anchor, 7)).unwrap();
    let n_vocab = target.config.n_vocab;
    let want: Vec<f32> = golden["draft_logits"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| {
            row.as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
        })
        .collect();
    let got = &logits[n_vocab..];
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let err = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max)
        / scale;
    assert!(
        err < 1e-4,
        "{gguf}: converted drafter's logits off the PyTorch reference by {err}"
    );
}

#[test]
fn converted_golden_checkpoints_reproduce_the_pytorch_logits() {
    golden_round_trip("dflash-v1.gguf", "golden-v1.json", None);
    golden_round_trip(
        "dflash2.gguf",
        "golden-v2.json",
        Some(json!({
            "conv_kernel_size": 2,
            "conv_group_size": 16,
            "selector_rank": 8,
            "selector_top_k": 4,
        })),
    );
}
