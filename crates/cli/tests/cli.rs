//! The `blockdraft` binary end to end: `run --json` on a real model gives
//! the greedy text and its statistics; a bad path is a clean error; `split`
//! writes a set that reads as the file. (This
//! also builds the binary that the browser test compares against.)

use std::process::Command;

fn blockdraft() -> Command {
    Command::new(env!("CARGO_BIN_EXE_blockdraft"))
}

#[test]
fn run_json_gives_the_greedy_text_and_stats() {
    let Some(model) = blockdraft_core::testing::real_model("smollm2-135m-instruct-q4_1.gguf")
    else {
        return;
    };
    let out = blockdraft()
        .arg("run")
        .arg("-m")
        .arg(&model)
        .args([
            "-p",
            "The capital of France is",
            "-n",
            "8",
            "--temp",
            "0",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let text = v["text"].as_str().unwrap();
    assert!(text.starts_with(" Paris"), "{text:?}");
    assert!(v.to_string().contains("tokens_per_second"), "{v}");
}

#[test]
fn a_missing_model_is_an_error_not_a_panic() {
    let out = blockdraft()
        .args(["run", "-m", "/nonexistent/model.gguf", "-p", "x"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/model.gguf"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn split_writes_a_set_that_reads_as_the_file() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    let model = fixtures.join("dflash/target-qwen3.gguf");
    let dir = std::env::temp_dir().join(format!("blockdraft-cli-split-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = blockdraft()
        .arg("split")
        .arg(&model)
        .args(["--max-size", "300K", "-o"])
        .arg(dir.join("t"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // 940 KB of tensors, at most 300 KiB per part.
    let first = dir.join("t-00001-of-00004.gguf");
    let whole = blockdraft_gguf::GgufFile::open(&model).unwrap();
    let set = blockdraft_gguf::GgufFile::open(&first).unwrap();
    assert_eq!(set.n_parts(), 4);
    for t in whole.tensors() {
        assert_eq!(
            &*set.tensor_data(&t.name).unwrap(),
            &*whole.tensor_data(&t.name).unwrap()
        );
    }
    for (key, value) in whole.metadata().iter() {
        assert_eq!(set.metadata().get(key), Some(value), "{key}");
    }
    let bad = blockdraft()
        .args(["split", "--max-size", "12Q"])
        .arg(&model)
        .output()
        .unwrap();
    assert!(!bad.status.success());
    std::fs::remove_dir_all(&dir).unwrap();
}
