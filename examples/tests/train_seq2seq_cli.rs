//! The `train-seq2seq` program: bad settings give one `error:` line (no panic
//! trace), a short run trains, decodes and reports exact-match accuracy, and a resumed
//! run with dropout continues with exactly the losses of an uninterrupted one.

mod common;

use common::{interrupted_copy, losses};

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

/// With dropout on, a resumed run replays the same dropout masks: its losses equal
/// the uninterrupted run's. (In a process of its own: the device's random generator
/// is shared by everything running in a process, so this cannot be a library unit
/// test next to other tests drawing random numbers in parallel.)
#[test]
fn resume_with_dropout_continues_exactly() {
    let root = out_dir("resume");
    let straight = root.join("straight");
    let settings = [
        "--steps",
        "6",
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
        "--dropout",
        "0.1",
        "--test-examples",
        "4",
        "--log-every",
        "0",
    ];
    let mut args = vec!["--out", straight.to_str().unwrap()];
    args.extend_from_slice(&settings);
    let output = train_seq2seq(&args);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // An interrupted run: the same folder without its last round's checkpoint.
    let crashed = root.join("crashed");
    interrupted_copy(&straight, &crashed, &["run.json", "history.json"]);
    let output = train_seq2seq(&[
        "--resume",
        "--out",
        crashed.to_str().unwrap(),
        "--log-every",
        "0",
    ]);
    let expected = losses(&straight);
    let resumed = losses(&crashed);
    let _ = std::fs::remove_dir_all(&root);
    assert!(
        output.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(expected.0.len(), 6);
    assert_eq!(resumed, expected);
}
