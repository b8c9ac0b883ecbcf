//! Helpers shared by the program tests.

// Each test file uses its own subset.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

/// A temporary folder removed when dropped.
pub use tempfile::TempDir;

/// Runs the program `exe` with `args` (and a runtime folder for Mesa's Vulkan loader).
pub fn run(exe: &str, args: &[&str]) -> Output {
    run_with(exe, args, None, &[])
}

/// Runs the program `exe` with `args` in the folder `cwd` (or this one), with the
/// environment variables `env` added.
pub fn run_with(exe: &str, args: &[&str], cwd: Option<&Path>, env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(exe);
    command
        .args(args)
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .envs(env.iter().copied());
    if let Some(cwd) = cwd {
        command.current_dir(cwd);
    }
    command.output().unwrap()
}

/// Asserts that `output` shows no panic: not exit status 101, no "panicked at".
pub fn assert_no_panic(output: &Output) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_ne!(output.status.code(), Some(101), "a panic: {stderr}");
    assert!(
        !stderr.contains("panicked at") && !stdout.contains("panicked at"),
        "a panic trace: {stderr}"
    );
}

/// Asserts that `output` succeeded; returns its stdout.
pub fn assert_success(output: &Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// Asserts that the program failed with a one-line message containing `expected`.
pub fn assert_clear_error(output: &Output, expected: &str) {
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

/// `(step, loss)` points of a loss curve.
pub type Curve = Vec<(u64, f64)>;

/// The training and validation losses of a run's `history.json`.
pub fn losses(run: &Path) -> (Curve, Curve) {
    let text = std::fs::read_to_string(run.join("history.json")).unwrap();
    let history: serde_json::Value = serde_json::from_str(&text).unwrap();
    let points = |key: &str| {
        history[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["step"].as_u64().unwrap(), p["loss"].as_f64().unwrap()))
            .collect::<Vec<_>>()
    };
    (points("train"), points("validation"))
}

/// Makes `crashed` look like `straight` interrupted during its third round: the run's
/// `files` and only round 2's checkpoint records and manifest.
pub fn interrupted_copy(straight: &Path, crashed: &Path, files: &[&str]) {
    std::fs::create_dir_all(crashed.join("checkpoint")).unwrap();
    for name in files {
        std::fs::copy(straight.join(name), crashed.join(name)).unwrap();
    }
    for name in ["model", "optim", "scheduler"] {
        let file = format!("{name}-2.bpk");
        std::fs::copy(
            straight.join("checkpoint").join(&file),
            crashed.join("checkpoint").join(&file),
        )
        .unwrap();
    }
    std::fs::copy(
        straight.join("checkpoint/manifest-2.json"),
        crashed.join("checkpoint/manifest-2.json"),
    )
    .unwrap();
}

/// Trains `straight` with `program` and `args`, copies it as if interrupted in its
/// third round (keeping `files`), resumes the copy with `resume_args` and asserts that
/// it ends with exactly the losses of the uninterrupted run, which had `steps` steps.
/// Returns the resumed run's stdout.
pub fn assert_resume_continues_exactly(
    program: &str,
    root: &Path,
    args: &[&str],
    files: &[&str],
    resume_args: &[&str],
    steps: usize,
) -> String {
    let straight = root.join("straight");
    let mut first = vec!["--out", straight.to_str().unwrap()];
    first.extend_from_slice(args);
    assert_success(&run(program, &first));

    // An interrupted run: the same folder without its last round's checkpoint.
    let crashed = root.join("crashed");
    interrupted_copy(&straight, &crashed, files);
    let mut resume = vec!["--resume", "--out", crashed.to_str().unwrap()];
    resume.extend_from_slice(resume_args);
    let stdout = assert_success(&run(program, &resume));
    let expected = losses(&straight);
    assert_eq!(expected.0.len(), steps);
    assert_eq!(losses(&crashed), expected);
    stdout
}

/// train-lm flags of a tiny model and a few steps: fast on any backend.
pub const TINY: &[&str] = &[
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
