//! The `attention-plot` program: without a trained model, with an input outside the
//! digit tasks' alphabet, or with a damaged run folder, it exits with one clear
//! `error:` line (no panic) and writes nothing.

mod common;

use common::{TempDir, assert_clear_error};

#[test]
fn missing_model_and_bad_input_are_clear_messages() {
    let dir = TempDir::with_prefix("run").unwrap();
    let run = dir.path().join("missing");
    let run = run.to_str().unwrap();
    let attention_plot = |input: &str| {
        common::run(
            env!("CARGO_BIN_EXE_attention-plot"),
            &["--run", run, "--input", input],
        )
    };
    assert_clear_error(&attention_plot("123"), "model.json not found");
    assert_clear_error(&attention_plot("12a"), "`a` is not a digit");
    assert!(!dir.path().join("missing").exists(), "nothing is written");
}

/// A run folder with damaged files: a clear `error:` line each, never a panic.
#[test]
fn damaged_run_files_are_clear_messages() {
    let dir = TempDir::with_prefix("damaged").unwrap();
    let run = dir.path().join("run");
    let run_arg = run.to_str().unwrap();
    let args = [
        "--out",
        run_arg,
        "--steps",
        "2",
        "--eval-interval",
        "2",
        "--test-examples",
        "2",
        "--beams",
        "1",
        "--d-model",
        "16",
        "--d-ff",
        "32",
        "--layers",
        "1",
        "--max-len",
        "4",
        "--batch-size",
        "4",
        "--log-every",
        "0",
    ];
    common::assert_success(&common::run(env!("CARGO_BIN_EXE_train-seq2seq"), &args));
    let attention_plot = || {
        common::run(
            env!("CARGO_BIN_EXE_attention-plot"),
            &["--run", run_arg, "--input", "123"],
        )
    };
    let model = run.join("model.bpk");
    let bytes = std::fs::read(&model).unwrap();
    std::fs::write(&model, &bytes[..bytes.len() / 3]).unwrap();
    assert_clear_error(&attention_plot(), "model.bpk");
    std::fs::write(run.join("model.json"), "{\"d_model\": ").unwrap();
    assert_clear_error(&attention_plot(), "model.json");
}
