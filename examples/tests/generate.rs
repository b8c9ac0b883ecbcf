//! Runs the `generate` program on a tiny llama with a byte-level BPE tokenizer.

use std::path::PathBuf;
use std::process::Command;

fn model_dir() -> PathBuf {
    examples::manifest_dir().join("../burn-transformer/tests/fixtures/hf/tokenizer")
}

fn generate(extra: &[&str]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_generate"))
        .arg("--model")
        .arg(model_dir())
        .args(["--prompt", "Hello, world!", "--max-new-tokens", "8"])
        .args(extra)
        .output()
        .expect("generate runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn streams_a_continuation_of_the_prompt() {
    let (ok, greedy, stderr) = generate(&[]);
    assert!(ok, "{stderr}");
    assert!(greedy.starts_with("Hello, world!"), "{greedy}");
    assert!(
        greedy.trim_end().len() > "Hello, world!".len(),
        "nothing generated: {greedy}"
    );
    assert_eq!(generate(&[]).1, greedy, "greedy decoding is deterministic");

    let sampled = generate(&["--temperature", "1.5", "--top-k", "50", "--seed", "3"]);
    assert!(sampled.0, "{}", sampled.2);
    assert_eq!(
        generate(&["--temperature", "1.5", "--top-k", "50", "--seed", "3"]).1,
        sampled.1,
        "a seed reproduces the sample"
    );

    let (ok, beams, stderr) = generate(&["--num-beams", "3"]);
    assert!(ok, "{stderr}");
    assert!(beams.starts_with("Hello, world!"), "{beams}");
}

#[test]
fn bad_flags_fail_with_a_message() {
    let (ok, _, stderr) = generate(&["--top-p", "1.5", "--temperature", "1"]);
    assert!(!ok);
    assert!(stderr.contains("top_p"), "{stderr}");
    let (ok, _, stderr) = generate(&["--tokenizer", "/nonexistent/tokenizer.json"]);
    assert!(!ok);
    assert!(stderr.contains("/nonexistent/tokenizer.json"), "{stderr}");
}
