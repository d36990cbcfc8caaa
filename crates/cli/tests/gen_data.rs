//! `blockdraft gen-data` on the real SmolLM2: the sequences are the greedy
//! chat answers `run --chat` gives, every tap row is the hidden state one
//! full forward pass over the finished sequence computes at that position,
//! an interrupted run resumes without touching finished shards, and a
//! mismatched or damaged directory is refused with its reason.

use blockdraft_core::model::{Decoder, LogitRows, Taps};
use blockdraft_core::testing::block_on;
use blockdraft_core::Backend;
use blockdraft_cpu::CpuBackend;
use blockdraft_gguf::GgufFile;
use half::f16;
use safetensors::SafeTensors;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

const TAPS: &str = "2,15,30";

fn model() -> Option<PathBuf> {
    blockdraft_core::testing::real_model("smollm2-135m-instruct-q4_1.gguf")
}

fn gen_data(model: &Path, prompts: &Path, out: &Path, taps: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_blockdraft"))
        .args(["gen-data", "-m"])
        .arg(model)
        .arg("--prompts")
        .arg(prompts)
        .arg("-o")
        .arg(out)
        .args(["--taps", taps, "-n", "12", "--shard-size", "2", "-t", "2"])
        .output()
        .unwrap()
}

fn ints(st: &SafeTensors, name: &str, width: usize) -> Vec<i64> {
    st.tensor(name)
        .unwrap()
        .data()
        .chunks_exact(width)
        .map(|b| match width {
            4 => i32::from_le_bytes(b.try_into().unwrap()) as i64,
            _ => i64::from_le_bytes(b.try_into().unwrap()),
        })
        .collect()
}

#[test]
fn gen_data_captures_the_taps_of_the_greedy_answer_and_resumes() {
    let Some(model) = model() else {
        eprintln!("SKIPPED: SmolLM2 is not in the model cache (tests/fetch_models.sh)");
        return;
    };
    let dir = std::env::temp_dir().join(format!("bd-gen-data-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let prompts = dir.join("prompts.jsonl");
    std::fs::write(
        &prompts,
        "{\"prompt\": \"What is the capital of France?\"}\n\
         {\"prompt\": \"Name a prime number.\"}\n\
         {\"prompt\": \"Say hello.\"}\n",
    )
    .unwrap();
    let out = dir.join("data");
    let o = gen_data(&model, &prompts, &out, TAPS);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let shard0 = out.join("shard-00000.safetensors");
    let bytes = std::fs::read(&shard0).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let ids = ints(&st, "input_ids", 4);
    let offsets = ints(&st, "seq_offsets", 8);
    let prompt_lens = ints(&st, "prompt_lens", 4);
    assert_eq!(offsets.len(), 3, "two sequences in the first shard");
    let first: Vec<u32> = ids[..offsets[1] as usize]
        .iter()
        .map(|&t| t as u32)
        .collect();

    // The sequence is what `run --chat --temp 0` answers.
    let run = Command::new(env!("CARGO_BIN_EXE_blockdraft"))
        .args(["run", "-m"])
        .arg(&model)
        .args([
            "-p",
            "What is the capital of France?",
            "--chat",
            "--temp",
            "0",
        ])
        .args(["-n", "12", "-t", "2", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    let from_run: Vec<u32> = v["prompt_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .chain(v["tokens"].as_array().unwrap())
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(
        prompt_lens[0] as usize,
        v["prompt_tokens"].as_array().unwrap().len()
    );
    // gen-data keeps the end-of-generation token (a label the drafter
    // learns); `run` does not print it.
    assert_eq!(&first[..from_run.len()], &from_run[..]);

    // Every tap row equals one forward pass over the whole sequence.
    let be = Arc::new(CpuBackend::new(2));
    let file = GgufFile::open(&model).unwrap();
    let dec = Decoder::load(&file, be.clone(), &mut |_| {}).unwrap();
    let layers: Vec<usize> = TAPS.split(',').map(|s| s.parse().unwrap()).collect();
    let mut taps = Taps::new(&*be, &dec.config, &layers, first.len()).unwrap();
    let mut state = dec.new_state(first.len(), first.len());
    dec.forward(&mut state, &first, LogitRows::Last, true, Some(&mut taps))
        .unwrap();
    let want = block_on(be.read(taps.output()));
    let got: Vec<f32> = st.tensor("taps").unwrap().data()[..want.len() * 2]
        .chunks_exact(2)
        .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect();
    let width = layers.len() * dec.config.n_embd;
    for (pos, (g, w)) in got.chunks(width).zip(want.chunks(width)).enumerate() {
        let num: f32 = g.iter().zip(w).map(|(a, b)| (a - b).powi(2)).sum();
        let den: f32 = w.iter().map(|b| b * b).sum();
        let rel = (num / den).sqrt();
        assert!(rel < 0.02, "position {pos}: taps off by {rel}");
    }

    // Interrupted after the first shard: the rerun makes only the missing one.
    let shard1 = out.join("shard-00001.safetensors");
    std::fs::remove_file(&shard1).unwrap();
    let mtime = std::fs::metadata(&shard0).unwrap().modified().unwrap();
    let o = gen_data(&model, &prompts, &out, TAPS);
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{log}");
    assert!(log.contains("resuming: 1 of 2 shards"), "{log}");
    assert!(shard1.exists());
    assert_eq!(
        std::fs::metadata(&shard0).unwrap().modified().unwrap(),
        mtime
    );

    // Other taps into the same directory: refused, naming the field.
    let o = gen_data(&model, &prompts, &out, "2,15");
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && log.contains("tap_layers"), "{log}");
    // Taps beyond the depth: refused.
    let o = gen_data(&model, &prompts, &dir.join("other"), "2,31");
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && log.contains("beyond the model's 30 layers"),
        "{log}"
    );
    // A damaged shard: refused with its path, never overwritten.
    std::fs::write(&shard1, &bytes[..100]).unwrap();
    let o = gen_data(&model, &prompts, &out, TAPS);
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && log.contains("corrupt or truncated"),
        "{log}"
    );
    assert_eq!(std::fs::read(&shard1).unwrap().len(), 100);
    std::fs::remove_dir_all(&dir).unwrap();
}
