//! The `train-seq2seq` program: bad settings give one `error:` line (no panic
//! trace), and a short run trains, decodes and reports exact-match accuracy.

use std::path::PathBuf;
use std::process::{Command, Output};

fn train_seq2seq(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_train-seq2seq"))
        .args(args)
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .output()
        .unwrap()
}

fn out_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("train-seq2seq-cli-{name}-{}", std::process::id()))
}

fn assert_clear_error(output: &Output, expected: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(1),
        "exit status; stderr: {stderr}"
    );
    assert!(
        stderr.starts_with("error: ") && stderr.contains(expected),
        "expected an error naming `{expected}`, got: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "a panic trace: {stderr}");
}

#[test]
fn bad_settings_are_clear_messages() {
    let out = out_dir("bad");
    let out = out.to_str().unwrap();
    assert_clear_error(
        &train_seq2seq(&["--task", "multiply", "--out", out]),
        "unknown task `multiply`",
    );
    assert_clear_error(
        &train_seq2seq(&["--device", "tpu", "--out", out]),
        "unknown device `tpu`",
    );
    assert_clear_error(
        &train_seq2seq(&["--norm", "middle", "--out", out]),
        "unknown --norm `middle`",
    );
    assert_clear_error(&train_seq2seq(&["--resume", "--out", out]), "run.json");
    let _ = std::fs::remove_dir_all(out);
}

#[test]
fn a_short_run_reports_exact_match() {
    let out = out_dir("short");
    let output = train_seq2seq(&[
        "--out",
        out.to_str().unwrap(),
        "--steps",
        "4",
        "--eval-interval",
        "2",
        "--batch-size",
        "8",
        "--d-model",
        "16",
        "--d-ff",
        "32",
        "--layers",
        "1",
        "--max-len",
        "4",
        "--test-examples",
        "8",
        "--log-every",
        "0",
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let _ = std::fs::remove_dir_all(&out);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("held-out exact match on 8 examples: greedy"),
        "{stdout}"
    );
    assert!(stdout.contains("beam search (4 beams)"), "{stdout}");
}
