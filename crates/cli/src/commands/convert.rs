//! `blockdraft convert`: an HF DFlash/DFlash2/DFly drafter checkpoint to GGUF,
//! with the target's tokenizer; or a drafter GGUF again with or without it.

use anyhow::{bail, Context, Result};
use blockdraft_convert::{
    convert_with_head, target_tokenizer, with_tokenizer, OutType, TargetGeometry,
};
use blockdraft_gguf::GgufFile;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Type {
    F32,
    F16,
    #[value(name = "q8_0")]
    Q8_0,
    #[value(name = "q4_0")]
    Q4_0,
}

impl From<Type> for OutType {
    fn from(t: Type) -> OutType {
        match t {
            Type::F32 => OutType::F32,
            Type::F16 => OutType::F16,
            Type::Q8_0 => OutType::Q8_0,
            Type::Q4_0 => OutType::Q4_0,
        }
    }
}

#[derive(clap::Args)]
pub struct Args {
    /// Drafter checkpoint directory (config.json and *.safetensors), or a
    /// drafter GGUF to write again with the target's tokenizer (or, with
    /// --no-tokenizer, without one), its tensors unchanged.
    #[arg(value_name = "HF_DIR|DRAFTER.gguf")]
    pub input: PathBuf,
    /// The target model (a GGUF file or an HF directory), checked against
    /// the drafter's declared geometry; a GGUF lends its tokenizer.
    #[arg(long)]
    pub target: PathBuf,
    /// Output GGUF path.
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
    /// Type of the matrices (norms, conv bases and layer_fusion stay F32)
    /// [default: f16].
    #[arg(long = "type", value_enum)]
    pub ty: Option<Type>,
    /// Type of a reduced vocabulary's head (default: --type). Its rows are
    /// the target's; q4_0 halves what a wide head adds to the file.
    #[arg(long = "head-type", value_enum)]
    pub head_ty: Option<Type>,
    /// Leave the target's tokenizer out. blockdraft reads the target's
    /// anyway; llama.cpp does not load a drafter without one (it adds
    /// 1.8 MB for SmolLM2's vocabulary, 5.9 MB for Qwen2.5's).
    #[arg(long)]
    pub no_tokenizer: bool,
}

pub fn run(args: Args) -> Result<()> {
    let tokenizer = if args.no_tokenizer {
        None
    } else {
        let tokenizer = target_tokenizer(&args.target).context("cannot read the target")?;
        if tokenizer.is_none() {
            eprintln!(
                "note: the target has no GGUF tokenizer to copy; the drafter loads in blockdraft, \
                 not in llama.cpp (pass a target GGUF that has one for that)"
            );
        }
        tokenizer
    };
    if args.input.is_file() {
        if args.ty.is_some() || args.head_ty.is_some() {
            bail!("--type and --head-type convert checkpoints; a drafter GGUF is copied as it is");
        }
        let drafter = GgufFile::open(&args.input)
            .with_context(|| format!("cannot read {}", args.input.display()))?;
        with_tokenizer(&drafter, tokenizer.as_ref())
            .with_context(|| format!("cannot copy {}", args.input.display()))?
            .write_file(&args.output)
            .context("cannot write the drafter")?;
        eprintln!(
            "wrote {} ({} tensors, {} tokenizer)",
            args.output.display(),
            drafter.tensors().len(),
            if tokenizer.is_some() {
                "with the target's"
            } else {
                "no"
            }
        );
        return Ok(());
    }
    let target = TargetGeometry::read(&args.target).context("cannot read the target")?;
    let out = OutType::from(args.ty.unwrap_or(Type::F16));
    let head = args.head_ty.map_or(out, OutType::from);
    let bar = if std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template("converting {bar:40} {pos}/{len} tensors")
                .expect("static template"),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    let mut converted = convert_with_head(&args.input, target, out, head, &mut |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })
    .with_context(|| format!("cannot convert {}", args.input.display()))?;
    bar.finish_and_clear();
    if let Some(tokenizer) = &tokenizer {
        converted.writer.add_all(tokenizer);
    }
    converted
        .writer
        .write_file(&args.output)
        .context("cannot write the drafter")?;
    eprintln!(
        "wrote {} ({:?}, {} tensors)",
        args.output.display(),
        converted.variant,
        converted.n_tensors
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockdraft_gguf::GgufFile;
    use safetensors::tensor::TensorView;
    use safetensors::Dtype;

    /// A one-layer v1 checkpoint (hidden 32) against an HF target directory.
    #[test]
    fn converts_a_checkpoint_to_a_loadable_file() {
        let dir =
            std::env::temp_dir().join(format!("blockdraft-cli-convert-{}", std::process::id()));
        let (hf, target) = (dir.join("draft"), dir.join("target"));
        std::fs::create_dir_all(&hf).unwrap();
        std::fs::create_dir_all(&target).unwrap();
        let target_config = serde_json::json!({"num_hidden_layers": 4, "hidden_size": 32});
        std::fs::write(target.join("config.json"), target_config.to_string()).unwrap();
        let config = serde_json::json!({
            "hidden_size": 32, "num_hidden_layers": 1, "intermediate_size": 64,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
            "block_size": 4, "mask_token_id": 3, "target_layer_ids": [1, 2]
        });
        std::fs::write(hf.join("config.json"), config.to_string()).unwrap();
        let shapes: [(&str, Vec<usize>); 14] = [
            ("fc.weight", vec![32, 64]),
            ("hidden_norm.weight", vec![32]),
            ("norm.weight", vec![32]),
            ("layers.0.input_layernorm.weight", vec![32]),
            ("layers.0.self_attn.q_proj.weight", vec![32, 32]),
            ("layers.0.self_attn.k_proj.weight", vec![16, 32]),
            ("layers.0.self_attn.v_proj.weight", vec![16, 32]),
            ("layers.0.self_attn.o_proj.weight", vec![32, 32]),
            ("layers.0.self_attn.q_norm.weight", vec![16]),
            ("layers.0.self_attn.k_norm.weight", vec![16]),
            ("layers.0.post_attention_layernorm.weight", vec![32]),
            ("layers.0.mlp.gate_proj.weight", vec![64, 32]),
            ("layers.0.mlp.up_proj.weight", vec![64, 32]),
            ("layers.0.mlp.down_proj.weight", vec![32, 64]),
        ];
        let bytes: Vec<Vec<u8>> = shapes
            .iter()
            .map(|(_, s)| {
                (0..s.iter().product::<usize>())
                    .flat_map(|i| (i as f32 * 0.01).to_le_bytes())
                    .collect()
            })
            .collect();
        let views = shapes
            .iter()
            .zip(&bytes)
            .map(|((n, s), b)| (*n, TensorView::new(Dtype::F32, s.clone(), b).unwrap()));
        safetensors::serialize_to_file(views, None, &hf.join("model.safetensors")).unwrap();
        let output = dir.join("draft.gguf");
        run(Args {
            input: hf,
            target,
            output: output.clone(),
            ty: Some(Type::Q8_0),
            head_ty: None,
            no_tokenizer: false,
        })
        .unwrap();
        let file = GgufFile::open(&output).unwrap();
        assert_eq!(file.architecture().unwrap(), "dflash");
        assert_eq!(file.tensors().len(), 14);
        assert_eq!(
            file.metadata()
                .get_i32_array("dflash.target_layers")
                .unwrap(),
            vec![2, 3]
        );
        assert_eq!(
            file.tensor("blk.0.attn_q.weight").unwrap().ty,
            blockdraft_gguf::GgmlType::Q8_0
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
