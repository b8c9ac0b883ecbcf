//! The benchmark programs given bad flags or damaged files: a clear message on stderr,
//! a failing exit status, nothing measured first, and never a panic.

use std::process::{Command, Output};

fn run(exe: &str, args: &[&str]) -> Output {
    Command::new(exe)
        .args(args)
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .output()
        .unwrap()
}

/// Asserts a failure whose stderr names `expected`, with no panic and nothing printed
/// on stdout (no measurement ran).
fn assert_refused(output: &Output, expected: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "succeeded: {stdout}");
    assert_ne!(output.status.code(), Some(101), "a panic: {stderr}");
    assert!(!stderr.contains("panicked"), "a panic trace: {stderr}");
    assert!(
        stderr.contains(expected),
        "expected `{expected}` in: {stderr}"
    );
    assert!(stdout.trim().is_empty(), "printed before failing: {stdout}");
}

#[test]
fn moe_mla_refuses_bad_flags_before_measuring() {
    let exe = env!("CARGO_BIN_EXE_moe_mla");
    assert_refused(&run(exe, &["--iters", "0"]), "--iters must be at least 1");
    assert_refused(&run(exe, &["--iters", "many"]), "--iters expects a number");
    assert_refused(
        &run(exe, &["--only", "attention"]),
        "--only takes moe or mla",
    );
    assert_refused(&run(exe, &["--backends", "tpu"]), "unknown device `tpu`");
    assert_refused(&run(exe, &["--bogus"]), "unknown flag --bogus");
}

#[test]
fn nanogpt_refuses_bad_flags_before_printing() {
    let exe = env!("CARGO_BIN_EXE_nanogpt");
    assert_refused(
        &run(exe, &["--steps", "0"]),
        "`steps`: must be greater than 0",
    );
    assert_refused(&run(exe, &["--eval-interval", "0"]), "`eval-interval`");
    assert_refused(&run(exe, &["--devices", "tpu"]), "unknown device `tpu`");
    assert_refused(&run(exe, &["--steps", "-3"]), "--steps");
    let dir = tempfile::TempDir::with_prefix("nanogpt-bad").unwrap();
    let missing = dir.path().join("missing.txt");
    assert_refused(
        &run(exe, &["--data", missing.to_str().unwrap()]),
        "no such file or directory",
    );
}

#[test]
fn speculative_refuses_bad_flags_before_training() {
    let exe = env!("CARGO_BIN_EXE_speculative");
    assert_refused(&run(exe, &["--steps", "0"]), "--steps must be at least 1");
    assert_refused(
        &run(exe, &["--new-tokens", "500"]),
        "--new-tokens must be at most",
    );
    assert_refused(&run(exe, &["--backends", "tpu"]), "unknown device `tpu`");
    assert_refused(&run(exe, &["--bogus"]), "unknown flag `--bogus`");
    let dir = tempfile::TempDir::with_prefix("speculative-bad").unwrap();
    let missing = dir.path().join("missing.txt");
    assert_refused(
        &run(exe, &["--data", missing.to_str().unwrap()]),
        "no such file or directory",
    );
}

#[test]
fn bench_report_of_damaged_results_is_a_clear_error() {
    let exe = env!("CARGO_BIN_EXE_bench");
    let dir = tempfile::TempDir::with_prefix("bench-bad").unwrap();
    let out = dir.path().to_str().unwrap();
    let docs = dir.path().join("page.md");
    let docs = docs.to_str().unwrap();
    let report = |results: &str| {
        std::fs::write(dir.path().join("results.jsonl"), results).unwrap();
        run(exe, &["--report-only", "--out", out, "--docs", docs])
    };
    assert_refused(&report("garbage{\n"), "results.jsonl: line 1");
    assert_refused(
        &report("{\"bench\": \"attention\", \"backe"),
        "results.jsonl: line 1",
    );
    std::fs::remove_file(dir.path().join("results.jsonl")).unwrap();
    assert_refused(
        &run(exe, &["--report-only", "--out", out, "--docs", docs]),
        "results.jsonl",
    );
    let output = run(exe, &["--backends", "tpu"]);
    assert_ne!(output.status.code(), Some(101));
    assert!(!output.status.success());
}
