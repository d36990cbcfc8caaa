//! The `blockdraft` binary end to end: `run --json` on a real model gives
//! the greedy text and its statistics; a bad path is a clean error. (This
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
