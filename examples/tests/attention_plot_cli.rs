//! The `attention-plot` program: without a trained model, or with an input outside the
//! digit tasks' alphabet, it exits with one clear `error:` line and writes nothing.

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
