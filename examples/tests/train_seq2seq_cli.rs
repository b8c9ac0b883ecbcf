//! The `train-seq2seq` program: bad settings give one `error:` line (no panic
//! trace), a short run trains, decodes and reports exact-match accuracy, and a resumed
//! run with dropout continues with exactly the losses of an uninterrupted one.

mod common;

use common::{TempDir, assert_clear_error, assert_resume_continues_exactly, assert_success};

use std::process::Output;

const TRAIN_SEQ2SEQ: &str = env!("CARGO_BIN_EXE_train-seq2seq");

fn train_seq2seq(args: &[&str]) -> Output {
    common::run(TRAIN_SEQ2SEQ, args)
}

/// A tiny model on short numbers: fast on any backend.
const TINY: &[&str] = &[
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
    "--log-every",
    "0",
];

#[test]
fn bad_settings_are_clear_messages() {
    let dir = TempDir::with_prefix("bad").unwrap();
    let out = dir.path().join("run");
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
    for (flags, expected) in [
        (&["--heads", "0"][..], "--heads must be at least 1"),
        (
            &["--d-model", "30"],
            "--d-model 30 is not a multiple of --heads 4",
        ),
        (&["--beams", "0"], "--beams must be at least 1"),
        (&["--steps", "0"], "--steps must be at least 1"),
        (&["--device", "flex:2"], "takes no index"),
    ] {
        let mut args = vec!["--out", out];
        args.extend_from_slice(flags);
        assert_clear_error(&train_seq2seq(&args), expected);
        assert!(!std::path::Path::new(out).exists(), "{flags:?} wrote a run");
    }
}

#[test]
fn resume_refuses_another_task_and_extends_the_run() {
    let dir = TempDir::with_prefix("extend").unwrap();
    let out = dir.path().join("run");
    let out = out.to_str().unwrap();
    let mut args = vec![
        "--out",
        out,
        "--steps",
        "2",
        "--eval-interval",
        "2",
        "--test-examples",
        "4",
        "--beams",
        "1",
    ];
    args.extend_from_slice(TINY);
    assert_success(&train_seq2seq(&args));
    let resume = |flags: &[&str]| {
        let mut args = vec!["--resume", "--out", out, "--test-examples", "4"];
        args.extend_from_slice(flags);
        train_seq2seq(&args)
    };
    assert_clear_error(
        &resume(&["--task", "sort"]),
        "--task: the run has \"reverse\", given \"sort\"",
    );
    let stdout = assert_success(&resume(&["--steps", "4"]));
    assert!(
        stdout.contains("extending the run from 2 to 4 steps"),
        "{stdout}"
    );
    let (train, _) = common::losses(std::path::Path::new(out));
    assert_eq!(train.len(), 4);

    // Damaged files end in one clear line, never a panic: every checkpoint
    // truncated, then a run.json that is not one.
    let checkpoints = std::path::Path::new(out).join("checkpoint");
    for entry in std::fs::read_dir(&checkpoints).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "bpk") {
            let bytes = std::fs::read(&path).unwrap();
            std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        }
    }
    assert_clear_error(&resume(&["--steps", "6"]), "no intact checkpoint");
    std::fs::write(std::path::Path::new(out).join("run.json"), "{}").unwrap();
    assert_clear_error(&resume(&[]), "not a run file");
}

#[test]
fn a_short_run_reports_exact_match() {
    let dir = TempDir::with_prefix("short").unwrap();
    let out = dir.path().join("run");
    let mut args = vec![
        "--out",
        out.to_str().unwrap(),
        "--steps",
        "4",
        "--eval-interval",
        "2",
        "--test-examples",
        "8",
    ];
    args.extend_from_slice(TINY);
    let stdout = assert_success(&train_seq2seq(&args));
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
    let dir = TempDir::with_prefix("resume").unwrap();
    let mut args = vec![
        "--steps",
        "6",
        "--eval-interval",
        "2",
        "--dropout",
        "0.1",
        "--test-examples",
        "4",
    ];
    args.extend_from_slice(TINY);
    assert_resume_continues_exactly(
        TRAIN_SEQ2SEQ,
        dir.path(),
        &args,
        &["run.json", "history.json"],
        &["--log-every", "0"],
        6,
    );
}
