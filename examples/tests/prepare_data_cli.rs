//! `prepare-data` then `train-lm --data SHARDS` as a user runs them: a prepared folder
//! trains exactly as its text does, resumes exactly, keeps its tokenizer, and bad
//! input is one `error:` line before any work.

mod common;

use common::{
    TempDir, assert_clear_error, assert_resume_continues_exactly, assert_success, losses,
};

use std::path::Path;

const PREPARE: &str = env!("CARGO_BIN_EXE_prepare-data");
const TRAIN_LM: &str = env!("CARGO_BIN_EXE_train-lm");

/// A tiny model, a few steps, no sample.
fn tiny() -> Vec<&'static str> {
    let mut flags = common::TINY.to_vec();
    flags.extend([
        "--sample-tokens",
        "0",
        "--steps",
        "6",
        "--eval-interval",
        "2",
    ]);
    flags
}

/// A folder of two text files.
fn corpus(dir: &Path) -> String {
    let text = dir.join("text");
    std::fs::create_dir_all(&text).unwrap();
    std::fs::write(text.join("a.txt"), "naïve café, ab cab abc ba\n".repeat(40)).unwrap();
    std::fs::write(text.join("b.txt"), "the end, without a newline").unwrap();
    text.to_str().unwrap().to_string()
}

#[test]
fn prepared_shards_train_as_the_text_and_resume_exactly() {
    let dir = TempDir::with_prefix("prepare").unwrap();
    let text = corpus(dir.path());
    let shards = dir.path().join("shards");
    let shards = shards.to_str().unwrap();
    let output = common::run(
        PREPARE,
        &[
            "--data",
            &text,
            "--out",
            shards,
            "--tokenizer",
            "char",
            "--shard-tokens",
            "100",
        ],
    );
    let stdout = assert_success(&output);
    assert!(stdout.contains("train with train-lm --data"), "{stdout}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("100.0%") && stderr.contains("shards"),
        "{stderr}"
    );
    assert!(Path::new(shards).join("vocab.json").is_file());

    // The same run on the text and on its shards: the same losses.
    let on_text = dir.path().join("on-text");
    let on_shards = dir.path().join("on-shards");
    for (data, out) in [(text.as_str(), &on_text), (shards, &on_shards)] {
        let mut args = vec!["--data", data, "--out", out.to_str().unwrap()];
        args.extend(tiny());
        let stdout = assert_success(&common::run(TRAIN_LM, &args));
        if data == shards {
            assert!(stdout.contains("prepared:"), "{stdout}");
        }
    }
    assert_eq!(losses(&on_shards), losses(&on_text));
    assert_eq!(
        std::fs::read(on_shards.join("vocab.json")).unwrap(),
        std::fs::read(Path::new(shards).join("vocab.json")).unwrap(),
        "the run keeps the shards' tokenizer"
    );

    // Interrupted in its third round and resumed: the same losses.
    let resume_root = dir.path().join("resume");
    std::fs::create_dir_all(&resume_root).unwrap();
    let mut args = vec!["--data", shards];
    args.extend(tiny());
    assert_resume_continues_exactly(
        TRAIN_LM,
        &resume_root,
        &args,
        &["run.json", "vocab.json", "history.json"],
        &["--sample-tokens", "0", "--log-every", "0"],
        6,
    );
}

#[test]
fn bad_input_is_a_clear_message() {
    let dir = TempDir::with_prefix("prepare-bad").unwrap();
    let text = corpus(dir.path());
    let shards = dir.path().join("shards");
    let shards = shards.to_str().unwrap();
    let run = |args: &[&str]| common::run(PREPARE, args);

    let missing = dir.path().join("missing");
    let output = run(&["--data", missing.to_str().unwrap(), "--out", shards]);
    assert_clear_error(&output, "missing: no such file or directory");
    let output = run(&["--data", &text, "--out", shards, "--tokenizer", "bpe:x"]);
    assert_clear_error(&output, "expected bpe:VOCAB with a number");
    let output = run(&[
        "--data",
        &text,
        "--out",
        shards,
        "--validation-fraction",
        "1",
    ]);
    assert_clear_error(&output, "--validation-fraction must be between 0 and 1");
    assert!(!Path::new(shards).exists(), "nothing written");

    assert_success(&run(&[
        "--data",
        &text,
        "--out",
        shards,
        "--tokenizer",
        "bytes",
    ]));
    let output = run(&["--data", &text, "--out", shards, "--tokenizer", "bytes"]);
    assert_clear_error(&output, "already holds a prepared corpus");
    let output = run(&["--data", &text, "--out", &text]);
    assert_clear_error(&output, "which is not part of a prepared corpus");

    // A prepared folder keeps its tokenizer and split.
    let out = dir.path().join("run");
    let output = common::run(
        TRAIN_LM,
        &[
            "--data",
            shards,
            "--tokenizer",
            "char",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert_clear_error(&output, "--tokenizer does not apply");
    let output = common::run(
        TRAIN_LM,
        &[
            "--data",
            shards,
            "--validation-fraction",
            "0.2",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert_clear_error(&output, "--validation-fraction does not apply");
    assert!(!out.exists(), "nothing written");
}
