//! The `train-lm` program as a user runs it: bad input gives one `error:` line (no
//! panic trace), a `tokenizer.json` works end to end, and `--resume` after an
//! interrupted run writes the same history as the run that was not interrupted.

mod common;

use common::{TempDir, assert_clear_error, assert_resume_continues_exactly, assert_success};

use std::path::{Path, PathBuf};
use std::process::Output;

const TRAIN_LM: &str = env!("CARGO_BIN_EXE_train-lm");

fn train_lm(args: &[&str]) -> Output {
    common::run(TRAIN_LM, args)
}

/// A tiny model, a few steps: fast on any backend.
const TINY: &[&str] = &[
    "--layers",
    "1",
    "--heads",
    "2",
    "--d-model",
    "16",
    "--d-ff",
    "32",
    "--context",
    "8",
    "--batch-size",
    "2",
    "--eval-batches",
    "1",
    "--warmup",
    "1",
    "--log-every",
    "0",
];

fn corpus(dir: &Path) -> PathBuf {
    let path = dir.join("corpus.txt");
    std::fs::write(&path, "ab cab abc ba\n".repeat(40)).unwrap();
    path
}

#[test]
fn bad_input_is_a_clear_message() {
    let dir = TempDir::with_prefix("bad").unwrap();
    let out = dir.path().join("run");
    let out = out.to_str().unwrap();

    let missing = dir.path().join("missing.txt");
    let output = train_lm(&["--data", missing.to_str().unwrap(), "--out", out]);
    assert_clear_error(&output, "missing.txt: no such file or directory");

    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    let output = train_lm(&["--data", empty.to_str().unwrap(), "--out", out]);
    assert_clear_error(&output, "empty.txt: the corpus is empty");

    let short = dir.path().join("short.txt");
    std::fs::write(&short, "hello world, hello world\n").unwrap();
    let output = train_lm(&["--data", short.to_str().unwrap(), "--out", out]);
    assert_clear_error(&output, "too few for a context of 64");

    let output = train_lm(&["--device", "tpu", "--out", out]);
    assert_clear_error(&output, "unknown device `tpu`");

    let output = train_lm(&["--resume", "--out", out]);
    assert_clear_error(&output, "run.json");

    let not_a_tokenizer = dir.path().join("tokenizer.json");
    std::fs::write(&not_a_tokenizer, "{}").unwrap();
    let text = corpus(dir.path());
    let output = train_lm(&[
        "--data",
        text.to_str().unwrap(),
        "--tokenizer",
        not_a_tokenizer.to_str().unwrap(),
        "--out",
        out,
    ]);
    assert_clear_error(&output, "not a tokenizer.json");
}

/// A byte-pair-encoding `tokenizer.json` over the corpus' characters, with two
/// merges.
const BPE_TOKENIZER: &str = r#"{
  "version": "1.0",
  "truncation": null,
  "padding": null,
  "added_tokens": [],
  "normalizer": null,
  "pre_tokenizer": null,
  "post_processor": null,
  "decoder": null,
  "model": {
    "type": "BPE",
    "dropout": null,
    "unk_token": null,
    "continuing_subword_prefix": null,
    "end_of_word_suffix": null,
    "fuse_unk": false,
    "byte_fallback": false,
    "vocab": {"a": 0, "b": 1, "c": 2, " ": 3, "\n": 4, "ab": 5, "abc": 6},
    "merges": ["a b", "ab c"]
  }
}"#;

#[test]
fn trains_with_a_tokenizer_json() {
    let dir = TempDir::with_prefix("bpe").unwrap();
    let text = corpus(dir.path());
    let tokenizer = dir.path().join("tokenizer.json");
    std::fs::write(&tokenizer, BPE_TOKENIZER).unwrap();
    let out = dir.path().join("run");
    let mut args = vec![
        "--data",
        text.to_str().unwrap(),
        "--tokenizer",
        tokenizer.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--steps",
        "4",
        "--eval-interval",
        "2",
        "--sample-tokens",
        "6",
        "--prompt",
        "ab",
    ];
    args.extend_from_slice(TINY);
    let stdout = assert_success(&train_lm(&args));
    assert!(
        stdout.contains("(7 tokens)"),
        "the BPE vocabulary: {stdout}"
    );
    assert!(stdout.contains("validation loss"), "{stdout}");
    // The run keeps its tokenizer (for --resume), its plot and its sample.
    assert_eq!(
        std::fs::read_to_string(out.join("tokenizer.json")).unwrap(),
        BPE_TOKENIZER
    );
    assert!(out.join("loss.png").is_file());
    assert!(out.join("sample.txt").is_file());

    // A new run into the folder of this one is refused before anything is written;
    // with --overwrite it replaces it (here with a char-level run: no tokenizer.json).
    let output = train_lm(&args);
    assert_clear_error(&output, "--overwrite");
    let mut char_level: Vec<&str> = args
        .iter()
        .copied()
        .filter(|arg| !arg.ends_with("tokenizer.json") && *arg != "--tokenizer")
        .collect();
    char_level.push("--overwrite");
    assert_success(&train_lm(&char_level));
    assert!(!out.join("tokenizer.json").exists());
    assert!(out.join("vocab.json").is_file());
}

#[test]
fn resume_continues_exactly() {
    let dir = TempDir::with_prefix("resume").unwrap();
    let text = corpus(dir.path());
    let mut args = vec![
        "--data",
        text.to_str().unwrap(),
        "--steps",
        "6",
        "--eval-interval",
        "2",
        "--sample-tokens",
        "0",
        "--label-smoothing",
        "0.1",
    ];
    args.extend_from_slice(TINY);
    let stdout = assert_resume_continues_exactly(
        TRAIN_LM,
        dir.path(),
        &args,
        &["run.json", "vocab.json", "history.json"],
        &["--sample-tokens", "0", "--log-every", "0"],
        6,
    );
    assert!(stdout.contains("starting with round 3"), "{stdout}");
}
