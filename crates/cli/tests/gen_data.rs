//! `blockdraft gen-data` on the real SmolLM2: the sequences are the greedy
//! chat answers `run --chat` gives, every tap row is the hidden state one
//! full forward pass over the finished sequence computes at that position,
//! an interrupted run resumes without touching finished shards, and a
//! mismatched or damaged directory is refused with its reason.

use blockdraft_core::backend::prelude::*;
use blockdraft_core::backend::KvType;
use blockdraft_core::model::{Decoder, LogitRows, Taps};
use blockdraft_core::testing::block_on;
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
    gen_data_with(model, prompts, out, taps, &[])
}

fn gen_data_with(model: &Path, prompts: &Path, out: &Path, taps: &str, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_blockdraft"))
        .args(["gen-data", "-m"])
        .arg(model)
        .arg("--prompts")
        .arg(prompts)
        .arg("-o")
        .arg(out)
        .args(["--taps", taps, "-n", "12", "--shard-size", "2", "-t", "2"])
        .args(extra)
        .output()
        .unwrap()
}

/// `check(name, a, b)` on shards 0..n of two data directories.
fn for_each_shard_pair(
    a: &Path,
    b: &Path,
    n: usize,
    check: impl Fn(&str, &SafeTensors, &SafeTensors),
) {
    for k in 0..n {
        let name = format!("shard-{k:05}.safetensors");
        let (x, y) = (
            std::fs::read(a.join(&name)).unwrap(),
            std::fs::read(b.join(&name)).unwrap(),
        );
        check(
            &name,
            &SafeTensors::deserialize(&x).unwrap(),
            &SafeTensors::deserialize(&y).unwrap(),
        );
    }
}

/// Every tensor of a shard but the taps.
const SEQUENCE_TENSORS: &[&str] = &[
    "input_ids",
    "seq_offsets",
    "prompt_lens",
    "prompt_index",
    "finished",
];

fn assert_same_tensors(shard: &str, a: &SafeTensors, b: &SafeTensors, names: &[&str]) {
    for &t in names {
        assert_eq!(
            a.tensor(t).unwrap().data(),
            b.tensor(t).unwrap().data(),
            "{shard} {t}"
        );
    }
}

/// A shard's f16 taps as f32.
fn taps_f32(st: &SafeTensors) -> Vec<f32> {
    st.tensor("taps")
        .unwrap()
        .data()
        .chunks_exact(2)
        .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect()
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
    // gen-data's KV cache: the command line's default.
    let dec = Decoder::load(&file, be.clone(), &mut |_| {})
        .unwrap()
        .with_kv_type(KvType::FRONT_END_DEFAULT);
    let layers: Vec<usize> = TAPS.split(',').map(|s| s.parse().unwrap()).collect();
    let mut taps = Taps::new(&*be, &dec.config, &layers, first.len()).unwrap();
    let mut state = dec.new_state(first.len(), first.len());
    dec.forward(&mut state, &first, LogitRows::Last, true, Some(&mut taps))
        .unwrap();
    let want = block_on(be.read(taps.output()));
    let got = &taps_f32(&st)[..want.len()];
    let width = layers.len() * dec.config.n_embd;
    for (pos, (g, w)) in got.chunks(width).zip(want.chunks(width)).enumerate() {
        let num: f32 = g.iter().zip(w).map(|(a, b)| (a - b).powi(2)).sum();
        let den: f32 = w.iter().map(|b| b * b).sum();
        let rel = (num / den).sqrt();
        assert!(rel < 0.02, "position {pos}: taps off by {rel}");
    }

    // One sequence at a time gives the same data as the default batch of
    // sequences decoded together (a row's values do not depend on its batch).
    let alone = dir.join("alone");
    let o = gen_data_with(&model, &prompts, &alone, TAPS, &["--parallel", "1"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for_each_shard_pair(&out, &alone, 2, |name, a, b| {
        assert_same_tensors(name, a, b, &[SEQUENCE_TENSORS, &["taps"]].concat());
    });

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

/// The file `training/sequences.py` exports from a data directory: its
/// manifest, then one sequence per line.
fn sequences_file(data: &Path, corrupt_first_response: bool) -> String {
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data.join("manifest.json")).unwrap()).unwrap();
    let mut lines = vec![serde_json::json!({ "manifest": manifest }).to_string()];
    let mut shards: Vec<_> = std::fs::read_dir(data)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    shards.sort();
    for shard in shards {
        let bytes = std::fs::read(shard).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let (ids, offsets) = (ints(&st, "input_ids", 4), ints(&st, "seq_offsets", 8));
        let (prompt_lens, index) = (ints(&st, "prompt_lens", 4), ints(&st, "prompt_index", 4));
        let finished = st.tensor("finished").unwrap().data().to_vec();
        for i in 0..prompt_lens.len() {
            let mut seq = ids[offsets[i] as usize..offsets[i + 1] as usize].to_vec();
            if corrupt_first_response && lines.len() == 1 {
                for t in &mut seq[prompt_lens[i] as usize..] {
                    *t = (*t + 7) % 49152;
                }
            }
            lines.push(
                serde_json::json!({
                    "prompt_index": index[i], "prompt_len": prompt_lens[i],
                    "finished": finished[i] == 1, "ids": seq,
                })
                .to_string(),
            );
        }
    }
    lines.join("\n") + "\n"
}

#[test]
fn replay_rebuilds_the_data_from_its_sequences_and_refuses_another_models() {
    let Some(model) = model() else {
        eprintln!("SKIPPED: SmolLM2 is not in the model cache (tests/fetch_models.sh)");
        return;
    };
    let dir = std::env::temp_dir().join(format!("bd-replay-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let prompts = dir.join("prompts.jsonl");
    std::fs::write(
        &prompts,
        "{\"prompt\": \"Name three colours.\"}\n{\"prompt\": \"Count to five.\"}\n\
         {\"prompt\": \"What is rust?\"}\n",
    )
    .unwrap();
    let generated = dir.join("generated");
    let o = gen_data(&model, &prompts, &generated, TAPS);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let seqs = dir.join("seqs.jsonl");
    std::fs::write(&seqs, sequences_file(&generated, false)).unwrap();
    let replay_with = |out: &Path, seqs: &Path, prompts: &Path, extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_blockdraft"))
            .args(["gen-data", "-m"])
            .arg(&model)
            .arg("--prompts")
            .arg(prompts)
            .arg("-o")
            .arg(out)
            .arg("--replay")
            .arg(seqs)
            .args(["--taps", TAPS, "-n", "12", "--shard-size", "2", "-t", "2"])
            .args(extra)
            .output()
            .unwrap()
    };
    let replay = |out: &Path, seqs: &Path, prompts: &Path| replay_with(out, seqs, prompts, &[]);

    // The replayed directory holds the same sequences, and the taps decoding
    // captured (batched passes give every row the same values here).
    let replayed = dir.join("replayed");
    let o = replay(&replayed, &seqs, &prompts);
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{log}");
    assert!(
        log.contains("; 0 differ from this target's greedy choice"),
        "{log}"
    );
    for_each_shard_pair(&generated, &replayed, 2, |name, a, b| {
        assert_same_tensors(name, a, b, SEQUENCE_TENSORS);
        let (ta, tb) = (taps_f32(a), taps_f32(b));
        let num: f32 = ta.iter().zip(&tb).map(|(x, y)| (x - y).powi(2)).sum();
        let den: f32 = ta.iter().map(|x| x * x).sum();
        assert!((num / den).sqrt() < 0.02, "{name}: taps differ");
    });

    // Another prompts file: refused by the file's manifest.
    let other = dir.join("other.jsonl");
    std::fs::write(&other, "{\"prompt\": \"Name three colours.\"}\n").unwrap();
    let o = replay(&dir.join("r2"), &seqs, &other);
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && log.contains("prompts_hash"), "{log}");
    // Answers depend on the KV cache type: another one is refused, and a
    // file from before the manifest recorded it counts as f32.
    let o = replay_with(&dir.join("r5"), &seqs, &prompts, &["--kv-type", "f32"]);
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && log.contains("kv_type = \"f16\""),
        "{log}"
    );
    let legacy = dir.join("legacy.jsonl");
    let text = sequences_file(&generated, false);
    let (head, rest) = text.split_once('\n').unwrap();
    let mut header: serde_json::Value = serde_json::from_str(head).unwrap();
    header["manifest"]
        .as_object_mut()
        .unwrap()
        .remove("kv_type");
    std::fs::write(&legacy, format!("{header}\n{rest}")).unwrap();
    let o = replay(&dir.join("r6"), &legacy, &prompts);
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && log.contains("kv_type = \"f32\""),
        "{log}"
    );
    // Responses this target would not give: refused before a shard is written.
    std::fs::write(&seqs, sequences_file(&generated, true)).unwrap();
    let o = replay(&dir.join("r3"), &seqs, &prompts);
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && log.contains("not this target's greedy choice"),
        "{log}"
    );
    assert!(!dir.join("r3").join("shard-00000.safetensors").exists());
    // Not a sequences file.
    std::fs::write(&seqs, "{\"prompt\": \"hi\"}\n").unwrap();
    let o = replay(&dir.join("r4"), &seqs, &prompts);
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && log.contains("training/sequences.py"),
        "{log}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
