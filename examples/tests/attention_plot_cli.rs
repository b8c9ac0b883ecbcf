//! The `attention-plot` program: without a trained model, or with an input outside the
//! digit tasks' alphabet, it exits with one clear `error:` line and writes nothing.

use std::process::Command;

#[test]
fn missing_model_and_bad_input_are_clear_messages() {
    let run = std::env::temp_dir().join(format!("attention-plot-cli-{}", std::process::id()));
    let output = Command::new(env!("CARGO_BIN_EXE_attention-plot"))
        .args(["--run", run.to_str().unwrap(), "--input", "123"])
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("error: ") && stderr.contains("model.json not found"),
        "{stderr}"
    );
    assert!(!run.exists(), "nothing is written");

    let output = Command::new(env!("CARGO_BIN_EXE_attention-plot"))
        .args(["--run", run.to_str().unwrap(), "--input", "12a"])
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("`a` is not a digit"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
