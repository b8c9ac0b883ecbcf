//! The `train-lm` program as a user runs it: bad input gives one `error:` line (no
//! panic trace) before any work, a `tokenizer.json` works end to end, `--resume`
//! after an interrupted run writes the same history as the run that was not
//! interrupted, extends a finished run, refuses changed settings and survives
//! damaged checkpoints.

mod common;

use common::{
    TempDir, assert_clear_error, assert_no_panic, assert_resume_continues_exactly, assert_success,
    losses, run_with,
};

use std::path::{Path, PathBuf};
use std::process::Output;

const TRAIN_LM: &str = env!("CARGO_BIN_EXE_train-lm");

fn train_lm(args: &[&str]) -> Output {
    common::run(TRAIN_LM, args)
}

use common::TINY;

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

    let output = train_lm(&["--grad-accum", "0", "--out", out]);
    assert_clear_error(&output, "--grad-accum must be at least 1");

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
fn trains_on_bytes_or_a_bpe_it_trains_and_resumes_with_them() {
    let dir = TempDir::with_prefix("tokenizers").unwrap();
    // Non-ASCII text: bytes and the byte-level BPE take any text.
    std::fs::write(
        dir.path().join("corpus.txt"),
        "naïve café, 東京 ab cab\n".repeat(60),
    )
    .unwrap();
    let bytes = tiny_run(dir.path(), "bytes", &["--tokenizer", "bytes"]);
    let settings = std::fs::read_to_string(bytes.join("run.json")).unwrap();
    assert!(settings.contains(r#""tokenizer": "bytes""#), "{settings}");
    assert!(!bytes.join("vocab.json").exists() && !bytes.join("tokenizer.json").exists());
    let resumed = run_with(
        TRAIN_LM,
        &[
            "--resume",
            "--out",
            "bytes",
            "--steps",
            "6",
            "--sample-tokens",
            "0",
        ],
        Some(dir.path()),
        &[],
    );
    assert!(assert_success(&resumed).contains("bytes (256 ids)"));

    let bpe = tiny_run(dir.path(), "bpe", &["--tokenizer", "bpe:300"]);
    let saved = std::fs::read_to_string(bpe.join("tokenizer.json")).unwrap();
    let resumed = run_with(
        TRAIN_LM,
        &[
            "--resume",
            "--out",
            "bpe",
            "--steps",
            "6",
            "--sample-tokens",
            "0",
        ],
        Some(dir.path()),
        &[],
    );
    let stdout = assert_success(&resumed);
    assert!(
        !stdout.contains("trained a byte-level BPE"),
        "a resumed run reuses it: {stdout}"
    );
    assert_eq!(
        std::fs::read_to_string(bpe.join("tokenizer.json")).unwrap(),
        saved
    );
    let again = tiny_run(dir.path(), "bpe-again", &["--tokenizer", "bpe:300"]);
    assert_eq!(
        std::fs::read_to_string(again.join("tokenizer.json")).unwrap(),
        saved,
        "training the BPE is deterministic"
    );
    let output = run_with(
        TRAIN_LM,
        &[
            "--data",
            "corpus.txt",
            "--tokenizer",
            "bpe:12",
            "--out",
            "small",
        ],
        Some(dir.path()),
        &[],
    );
    assert_clear_error(&output, "give bpe:N with N >= 256");
    assert!(!dir.path().join("small").exists());
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

#[test]
fn bad_flags_are_refused_before_anything_is_written() {
    let dir = TempDir::with_prefix("flags").unwrap();
    let text = corpus(dir.path());
    let out = dir.path().join("run");
    let cases: &[(&[&str], &str)] = &[
        (&["--heads", "0"], "--heads must be at least 1"),
        (&["--d-model", "0"], "--d-model must be at least 1"),
        (&["--layers", "0"], "--layers must be at least 1"),
        (&["--steps", "0"], "--steps must be at least 1"),
        (&["--kv-heads", "3"], "not a multiple of --kv-heads 3"),
        (
            &["--d-model", "18"],
            "--d-model 18 is not a multiple of --heads 4",
        ),
        (&["--grad-clip", "-1"], "--grad-clip must be a non-negative"),
        (
            &["--grad-clip", "nan"],
            "--grad-clip must be a non-negative",
        ),
        (
            &["--temperature", "-1"],
            "--temperature must be a non-negative",
        ),
        (
            &["--temperature", "nan"],
            "--temperature must be a non-negative",
        ),
        (
            &["--temperature", "0", "--top-k", "5"],
            "--top-k applies to sampling",
        ),
        (&["--validation-fraction", "1"], "--validation-fraction"),
        (&["--lr", "nan"], "lr"),
        (&["--weight-decay", "-0.5"], "weight-decay"),
        (&["--label-smoothing", "1"], "label"),
        (&["--device", "wgpu:7"], "takes no index"),
        (&["--prompt", "zebra"], "--prompt: tokenizer: character 'z'"),
    ];
    for (flags, expected) in cases {
        let mut args = vec![
            "--data",
            text.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(flags);
        let output = common::run(TRAIN_LM, &args);
        assert_clear_error(&output, expected);
        assert!(!out.exists(), "{flags:?} wrote into --out before failing");
    }
}

/// The run folder of a tiny 4-step run on `corpus.txt`, given by a path relative to
/// `dir` (the program runs there).
fn tiny_run(dir: &Path, out: &str, extra: &[&str]) -> PathBuf {
    corpus(dir);
    let mut args = vec![
        "--data",
        "corpus.txt",
        "--out",
        out,
        "--steps",
        "4",
        "--eval-interval",
        "2",
        "--sample-tokens",
        "0",
    ];
    args.extend_from_slice(TINY);
    args.extend_from_slice(extra);
    assert_success(&run_with(TRAIN_LM, &args, Some(dir), &[]));
    dir.join(out)
}

#[test]
fn resume_extends_the_run_and_refuses_other_changes() {
    let dir = TempDir::with_prefix("extend").unwrap();
    let run = tiny_run(dir.path(), "run", &[]);
    let out = run.to_str().unwrap();
    let resume = |flags: &[&str]| {
        let mut args = vec!["--resume", "--out", out, "--sample-tokens", "0"];
        args.extend_from_slice(flags);
        // From another folder (the data path was relative), and a Vulkan loader that
        // reports itself: a run on flex must not start it.
        run_with(
            TRAIN_LM,
            &args,
            Some(std::path::Path::new("/")),
            &[("VK_LOADER_DEBUG", "info")],
        )
    };

    let output = resume(&["--d-model", "32", "--data", "other.txt", "--heads", "2"]);
    assert_clear_error(&output, "--d-model: the run has 16, given 32");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--data"), "{stderr}");
    assert!(
        !stderr.contains("--heads"),
        "--heads is unchanged: {stderr}"
    );

    let stdout = assert_success(&resume(&["--steps", "6"]));
    assert!(
        stdout.contains("extending the run from 4 to 6 steps"),
        "{stdout}"
    );
    let (train, validation) = losses(&run);
    assert_eq!(
        train.iter().map(|p| p.0).collect::<Vec<_>>(),
        (1..=6).collect::<Vec<_>>()
    );
    assert_eq!(validation.last().map(|p| p.0), Some(6));

    // The new end is the run's: resumed again, there is nothing left to train.
    let output = resume(&[]);
    let stdout = assert_success(&output);
    assert!(stdout.contains("taken all its 6 steps"), "{stdout}");
    let everything = format!("{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(
        !everything.contains("Vulkan Loader"),
        "a flex run started the Vulkan driver: {everything}"
    );
}

#[test]
fn damaged_or_foreign_checkpoints_never_panic() {
    let dir = TempDir::with_prefix("damaged").unwrap();
    let run = tiny_run(dir.path(), "run", &[]);
    let out = run.to_str().unwrap();
    let checkpoints = run.join("checkpoint");
    let resume = |steps: &str| {
        common::run(
            TRAIN_LM,
            &[
                "--resume",
                "--out",
                out,
                "--sample-tokens",
                "0",
                "--steps",
                steps,
            ],
        )
    };

    // Bytes overwritten inside the newest model: its manifest catches it, the run
    // resumes from the round before with a warning.
    let model = checkpoints.join("model-2.bpk");
    let mut bytes = std::fs::read(&model).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle..middle + 8].copy_from_slice(&[0xff; 8]);
    std::fs::write(&model, bytes).unwrap();
    let output = resume("6");
    let stdout = assert_success(&output);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("warning:") && stderr.contains("model-2.bpk"),
        "{stderr}"
    );
    assert!(stdout.contains("resuming after step 2"), "{stdout}");

    // Every checkpoint truncated: a clear error.
    for entry in std::fs::read_dir(&checkpoints).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "bpk") {
            let bytes = std::fs::read(&path).unwrap();
            std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        }
    }
    let output = resume("8");
    assert_clear_error(&output, "no intact checkpoint");

    // Manifests garbage, checkpoints of another run, a run.json that is not one.
    let other = tiny_run(dir.path(), "other", &[]);
    std::fs::remove_dir_all(&checkpoints).unwrap();
    std::fs::create_dir_all(&checkpoints).unwrap();
    for entry in std::fs::read_dir(other.join("checkpoint")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, checkpoints.join(path.file_name().unwrap())).unwrap();
    }
    assert_clear_error(&resume("8"), "belongs to run");
    std::fs::write(checkpoints.join("manifest-2.json"), "{ garbage").unwrap();
    let output = resume("8");
    assert_no_panic(&output);
    assert_eq!(output.status.code(), Some(1));
    std::fs::write(run.join("run.json"), "[1, 2").unwrap();
    assert_clear_error(&resume("8"), "not a run file");
}

/// Per-layer embeddings and layers reusing keys and values (Gemma-4 E2B's layout on
/// any block design) train, and the run generates through its caches; a layer with no
/// earlier one to reuse from is refused by name, before anything is written, and so is
/// the export of such a LLaMA-style run.
#[test]
fn per_layer_inputs_and_shared_keys_and_values_learn() {
    let dir = TempDir::with_prefix("e2b").unwrap();
    let text = corpus(dir.path());
    let out = dir.path().join("run");
    let run = |layers: &str, shared: &str| {
        let mut args = vec![
            "--data",
            text.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--arch",
            "qwen3",
            "--layers",
            layers,
            "--per-layer-inputs",
            "8",
            "--kv-shared-layers",
            shared,
            "--steps",
            "40",
            "--eval-interval",
            "20",
            "--lr",
            "1e-2",
        ];
        // TINY's other flags (its flags come in pairs).
        args.extend(
            TINY.chunks(2)
                .filter(|flag| flag[0] != "--layers")
                .flatten(),
        );
        common::run(TRAIN_LM, &args)
    };
    let refused = run("2", "2");
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("kv_shared_layers"), "{stderr}");
    assert!(!out.exists(), "a refused run writes nothing");

    let stdout = assert_success(&run("3", "1"));
    assert!(
        stdout.contains("the last 1 reusing keys and values")
            && stdout.contains("per-layer inputs 8"),
        "{stdout}"
    );
    assert_learned_and_sampled(&out);
    // transformers has no LLaMA-style class with per-layer inputs: refused by name.
    let exported = dir.path().join("hf");
    let flags = [
        "--checkpoint",
        out.to_str().unwrap(),
        "--out",
        exported.to_str().unwrap(),
    ];
    let refused = common::run(env!("CARGO_BIN_EXE_export-hf"), &flags);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("per-layer embeddings"),
        "{stderr}"
    );
    assert!(!exported.exists(), "a refused export writes nothing");
}

/// The run in `out` ended with a lower validation loss than it began with, and wrote
/// a sample.
fn assert_learned_and_sampled(out: &Path) {
    let (_, validation) = losses(out);
    let (first, last) = (validation[0].1, validation[validation.len() - 1].1);
    assert!(last < first, "validation loss {first} -> {last}");
    let sample = std::fs::read_to_string(out.join("sample.txt")).unwrap();
    assert!(!sample.trim().is_empty(), "the run generates a sample");
}

/// Chunked attention (Llama 4's) trains and generates through its caches past a chunk
/// boundary; a chunk of 0 is refused before anything is written.
#[test]
fn chunked_attention_learns() {
    let dir = TempDir::with_prefix("chunked").unwrap();
    let text = corpus(dir.path());
    let out = dir.path().join("run");
    let run = |chunk: &str| {
        let mut args = vec![
            "--data",
            text.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--attention-chunk",
            chunk,
            "--steps",
            "40",
            "--eval-interval",
            "20",
            "--lr",
            "1e-2",
        ];
        args.extend_from_slice(TINY);
        common::run(TRAIN_LM, &args)
    };
    let refused = run("0");
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("attention_chunk"), "{stderr}");
    assert!(!out.exists(), "a refused run writes nothing");

    let stdout = assert_success(&run("3"));
    assert!(stdout.contains("attention in chunks of 3"), "{stdout}");
    assert_learned_and_sampled(&out);
}

/// Every `--arch` builds a model whose validation loss falls in a few steps; a GPT-2
/// run exports as transformers' `gpt2`, a Gemma-4 one as its `gemma4_text`, a Qwen3.5
/// one as its `qwen3_5_text`.
#[test]
fn every_arch_learns() {
    let dir = TempDir::with_prefix("arch").unwrap();
    let text = corpus(dir.path());
    for arch in [
        "qwen3", "olmo2", "gemma", "gemma4", "qwen3_5", "gpt-oss", "gpt2",
    ] {
        let out = dir.path().join(arch);
        let mut args = vec![
            "--data",
            text.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--arch",
            arch,
            "--steps",
            "40",
            "--eval-interval",
            "20",
            "--sample-tokens",
            "0",
            "--lr",
            "1e-2",
        ];
        args.extend_from_slice(TINY);
        // Qwen3.5's design makes the last layer attention: with a second layer, the
        // first is a linear one.
        if arch == "qwen3_5" {
            let layers = args.iter().position(|&flag| flag == "--layers").unwrap();
            args[layers + 1] = "2";
        }
        let stdout = assert_success(&common::run(TRAIN_LM, &args));
        assert!(stdout.contains(&format!("model ({arch})")), "{stdout}");
        let (_, validation) = losses(&out);
        let (first, last) = (validation[0].1, validation[validation.len() - 1].1);
        assert!(last < first, "{arch}: validation loss {first} -> {last}");
    }
    let export = |arch: &str| {
        let exported = dir.path().join(format!("{arch}-hf"));
        let run = dir.path().join(arch);
        let flags = [
            "--checkpoint",
            run.to_str().unwrap(),
            "--out",
            exported.to_str().unwrap(),
        ];
        assert_success(&common::run(env!("CARGO_BIN_EXE_export-hf"), &flags));
        let config = std::fs::read_to_string(exported.join("config.json")).unwrap();
        serde_json::from_str::<serde_json::Value>(&config).unwrap()
    };
    let config = export("gpt2");
    assert_eq!(config["model_type"], "gpt2", "{config}");
    assert_eq!(config["n_positions"], 8, "the context of TINY: {config}");
    let config = export("gemma4");
    assert_eq!(config["model_type"], "gemma4_text", "{config}");
    assert_eq!(
        config["sliding_window"], 2,
        "a quarter of the context of TINY: {config}"
    );
    let config = export("qwen3_5");
    assert_eq!(config["model_type"], "qwen3_5_text", "{config}");
}

/// `--mtp-depth 1` trains a multi-token-prediction module: its validation loss falls
/// (printed before and after), and `generate --speculative` drafts with it, giving the
/// run's greedy text.
#[test]
fn multi_token_prediction_learns_and_drafts() {
    let dir = TempDir::with_prefix("mtp").unwrap();
    let text = corpus(dir.path());
    let out = dir.path().join("mtp");
    let mut args = vec![
        "--data",
        text.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--mtp-depth",
        "1",
        "--steps",
        "40",
        "--eval-interval",
        "20",
        "--sample-tokens",
        "0",
        "--lr",
        "1e-2",
    ];
    args.extend_from_slice(TINY);
    let stdout = assert_success(&common::run(TRAIN_LM, &args));
    let line = stdout
        .lines()
        .find(|line| line.starts_with("multi-token prediction (1 modules): validation loss"))
        .unwrap_or_else(|| panic!("no multi-token prediction line in: {stdout}"));
    let numbers: Vec<f64> = line
        .rsplit(": validation loss ")
        .next()
        .unwrap()
        .split(" -> ")
        .map(|n| n.trim().parse().unwrap())
        .collect();
    assert!(numbers[1] < numbers[0], "{line}");

    let generate = env!("CARGO_BIN_EXE_generate");
    let model = out.to_str().unwrap();
    let flags = ["--model", model, "--prompt", "ab", "--max-new-tokens", "6"];
    let greedy = assert_success(&common::run(generate, &flags));
    let mut speculative_flags = flags.to_vec();
    speculative_flags.push("--speculative");
    let output = common::run(generate, &speculative_flags);
    let speculative = assert_success(&output);
    assert_eq!(speculative, greedy);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("drafts accepted"), "{stderr}");
    // A model without the module, or greedy-only flags, are refused clearly.
    assert_clear_error(
        &common::run(
            generate,
            &[&flags[..], &["--speculative", "--temperature", "0.5"]].concat(),
        ),
        "--speculative decodes greedily",
    );
}
