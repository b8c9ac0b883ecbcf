//! Runs the `generate` program on a tiny llama with a byte-level BPE tokenizer and on
//! a model trained by `train-lm`; bad flags and damaged model folders end in one
//! `error:` line before anything is printed.

mod common;
mod lm_run;

use std::path::{Path, PathBuf};
use std::process::Output;

use burn::tensor::Device;
use burn_transformer::generate::{GenerationConfig, generate};
use common::{TempDir, assert_clear_error, assert_success};

const GENERATE: &str = env!("CARGO_BIN_EXE_generate");

fn model_dir() -> PathBuf {
    examples::manifest_dir().join("../burn-transformer/tests/fixtures/hf/tokenizer")
}

/// `generate` on `model` with `args`.
fn generate_in(model: &Path, args: &[&str]) -> Output {
    let mut all = vec!["--model", model.to_str().unwrap()];
    all.extend_from_slice(args);
    common::run(GENERATE, &all)
}

/// `generate` on the BPE fixture, 8 new tokens of "Hello, world!".
fn generate_hf(extra: &[&str]) -> Output {
    let mut args = vec!["--prompt", "Hello, world!", "--max-new-tokens", "8"];
    args.extend_from_slice(extra);
    generate_in(&model_dir(), &args)
}

#[test]
fn streams_a_continuation_of_the_prompt() {
    let greedy = assert_success(&generate_hf(&[]));
    assert!(greedy.starts_with("Hello, world!"), "{greedy}");
    assert!(
        greedy.trim_end().len() > "Hello, world!".len(),
        "nothing generated: {greedy}"
    );
    assert_eq!(
        assert_success(&generate_hf(&[])),
        greedy,
        "greedy decoding is deterministic"
    );

    let sampling = ["--temperature", "1.5", "--top-k", "50", "--seed", "3"];
    let sampled = assert_success(&generate_hf(&sampling));
    assert_eq!(
        assert_success(&generate_hf(&sampling)),
        sampled,
        "a seed reproduces the sample"
    );

    let beams = assert_success(&generate_hf(&["--num-beams", "3"]));
    assert!(beams.starts_with("Hello, world!"), "{beams}");
}

/// The greedy continuation of `prompt` by the run in `run`, as the library computes
/// it: `new_tokens` tokens, each predicted from the run's training window.
fn library_greedy(run: &Path, prompt: &str, new_tokens: usize) -> String {
    let device = Device::flex();
    let (model, tokenizer) = lm_run::load_run(run, &device);
    let config = GenerationConfig::greedy(new_tokens).with_max_context(Some(lm_run::CONTEXT));
    let generated = generate(
        &model,
        &[tokenizer.encode(prompt).unwrap()],
        &config,
        |_| {},
    )
    .unwrap()
    .remove(0);
    assert_eq!(generated.tokens.len(), new_tokens, "no end-of-text token");
    tokenizer.decode(&generated.tokens)
}

/// `generate --model RUN` continues text as the library's greedy decoding of the
/// run's model does, each token predicted from the run's training window.
#[test]
fn continues_text_with_a_model_trained_by_train_lm() {
    let scratch = TempDir::with_prefix("generate-run").unwrap();
    let run = lm_run::train_tiny_run(scratch.path());
    let prompt = "the quick ";
    let new_tokens = 3 * lm_run::CONTEXT;
    let stdout = assert_success(&generate_in(
        &run,
        &[
            "--prompt",
            prompt,
            "--max-new-tokens",
            &new_tokens.to_string(),
            "--temperature",
            "0",
        ],
    ));
    let continuation = library_greedy(&run, prompt, new_tokens);
    assert_eq!(stdout, format!("{prompt}{continuation}\n"));
    // A character vocabulary has no end-of-text token: every token is generated.
    assert_eq!(continuation.chars().count(), new_tokens);

    // Half precision runs the same model (its tokens may differ from f32's).
    let half = assert_success(&generate_in(
        &run,
        &[
            "--prompt",
            prompt,
            "--max-new-tokens",
            "5",
            "--dtype",
            "f16",
        ],
    ));
    assert_eq!(half.strip_prefix(prompt).unwrap().chars().count(), 5 + 1);

    // Beam search over the run's tokenizer.
    let beams = assert_success(&generate_in(
        &run,
        &[
            "--prompt",
            prompt,
            "--max-new-tokens",
            "4",
            "--num-beams",
            "2",
        ],
    ));
    assert_eq!(beams.strip_prefix(prompt).unwrap().chars().count(), 4 + 1);
}

/// A run trained with `--tokenizer` reads and writes text with that tokenizer.
#[test]
fn continues_text_with_a_run_trained_with_a_tokenizer_json() {
    let scratch = TempDir::with_prefix("generate-bpe-run").unwrap();
    let tokenizer = scratch.path().join("bpe.json");
    std::fs::write(&tokenizer, lm_run::bpe_tokenizer()).unwrap();
    let run = lm_run::train_tiny_run_with(
        scratch.path(),
        &["--tokenizer", tokenizer.to_str().unwrap()],
    );
    assert!(!run.join("vocab.json").exists());
    let prompt = "the wizards ";
    let stdout = assert_success(&generate_in(
        &run,
        &["--prompt", prompt, "--max-new-tokens", "40"],
    ));
    assert_eq!(
        stdout,
        format!("{prompt}{}\n", library_greedy(&run, prompt, 40))
    );
}

/// Asserts a clear error that printed nothing on stdout (not even the prompt).
fn assert_refused(output: &Output, expected: &str) {
    assert_clear_error(output, expected);
    assert!(
        output.stdout.is_empty(),
        "printed before the error: {}",
        String::from_utf8_lossy(&output.stdout)
    );
}

#[test]
fn bad_flags_are_refused_before_anything_is_printed() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--top-k", "5"],
            "--top-k applies to sampling: add --temperature",
        ),
        (
            &["--top-p", "0.9"],
            "--top-p applies to sampling: add --temperature",
        ),
        (&["--seed", "3"], "--seed applies to sampling"),
        (&["--temperature", "-1"], "--temperature must be 0"),
        (&["--temperature", "NaN"], "--temperature must be 0"),
        (&["--temperature", "inf"], "--temperature must be 0"),
        (&["--min-p", "0.1"], "--min-p applies to sampling"),
        (
            &["--temperature", "0", "--top-k", "5"],
            "--temperature 0 decodes greedily",
        ),
        (
            &["--temperature", "1", "--min-p", "1.5"],
            "--min-p must be in [0, 1]",
        ),
        (
            &["--temperature", "1", "--top-p", "1.5"],
            "--top-p must be in (0, 1]",
        ),
        (
            &["--temperature", "1", "--top-p", "0"],
            "--top-p must be in (0, 1]",
        ),
        (
            &["--temperature", "1", "--top-p", "-0.5"],
            "--top-p must be in (0, 1]",
        ),
        (
            &["--repetition-penalty", "0"],
            "--repetition-penalty must be",
        ),
        (
            &["--repetition-penalty", "-2"],
            "--repetition-penalty must be",
        ),
        (
            &["--repetition-penalty", "nan"],
            "--repetition-penalty must be",
        ),
        (&["--num-beams", "0"], "--num-beams must be at least 1"),
        (
            &["--num-beams", "2", "--length-penalty", "nan"],
            "--length-penalty must be finite",
        ),
        (
            &["--num-beams", "2", "--length-penalty", "inf"],
            "--length-penalty must be finite",
        ),
        (&["--length-penalty", "0.5"], "add --num-beams"),
        (
            &["--num-beams", "2", "--temperature", "0.7"],
            "--num-beams searches deterministically",
        ),
        (&["--dtype", "f8"], "unknown dtype `f8`"),
        (&["--device", "tpu"], "unknown device `tpu`"),
        (
            &["--tokenizer", "/nonexistent/tokenizer.json"],
            "/nonexistent/tokenizer.json",
        ),
    ];
    for (flags, expected) in cases {
        assert_refused(&generate_hf(flags), expected);
    }
    assert_refused(
        &generate_in(&model_dir(), &["--prompt", "Hi", "--max-new-tokens", "0"]),
        "--max-new-tokens must be at least 1",
    );
}

/// With a `generation_config.json` in the model folder and no decoding flag, the
/// program continues the prompt as transformers' `generate` does with that file
/// (`tools/make_hf_models.py generation_files`): its repetition penalty and end-of-text
/// tokens, its beams and length penalty.
#[test]
fn decodes_as_transformers_does_with_the_models_generation_config() {
    #[derive(serde::Deserialize)]
    struct Case {
        generation_config: serde_json::Value,
        prompt: String,
        tokens: Vec<u32>,
    }
    let text = std::fs::read_to_string(model_dir().join("generation.json")).unwrap();
    let cases: Vec<Case> = serde_json::from_str(&text).unwrap();
    let tokenizer = tokenizers::Tokenizer::from_file(model_dir().join("tokenizer.json")).unwrap();
    let scratch = TempDir::with_prefix("generate-generation-config").unwrap();
    let expected_decoding = [
        "greedy, repetition penalty 1.4",
        "beam search, 3 beams, length penalty 0.7",
    ];
    assert_eq!(cases.len(), expected_decoding.len());
    for (index, (case, decoding)) in cases.iter().zip(expected_decoding).enumerate() {
        let model = scratch.path().join(index.to_string());
        copy_model(&model);
        std::fs::write(
            model.join("generation_config.json"),
            case.generation_config.to_string(),
        )
        .unwrap();
        let output = generate_in(
            &model,
            &["--prompt", &case.prompt, "--max-new-tokens", "10"],
        );
        let stdout = assert_success(&output);
        let continuation = tokenizer.decode(&case.tokens, false).unwrap();
        assert_eq!(
            stdout.trim_end_matches('\n'),
            format!("{}{continuation}", case.prompt),
            "{}",
            case.generation_config
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.starts_with(&format!(
                "decoding (the model's generation_config.json and the flags): {decoding}"
            )),
            "{stderr}"
        );
    }
    assert!(
        cases[0].tokens.len() < 10,
        "the file's second end-of-text token ends it"
    );

    // A flag replaces one setting of the file, and a greedy file's sampling flags are
    // refused as without a file.
    let model = scratch.path().join("0");
    let output = generate_in(
        &model,
        &[
            "--prompt",
            &cases[0].prompt,
            "--max-new-tokens",
            "10",
            "--repetition-penalty",
            "1",
        ],
    );
    assert_success(&output);
    assert!(
        String::from_utf8_lossy(&output.stderr)
            .starts_with("decoding (the model's generation_config.json and the flags): greedy\n")
    );
    assert_refused(
        &generate_in(&model, &["--prompt", "the", "--top-p", "0.5"]),
        "--top-p applies to sampling",
    );

    // --temperature on a file that asks for beams samples one sequence, and says so.
    let beams = scratch.path().join("1");
    let output = generate_in(
        &beams,
        &[
            "--prompt",
            "the",
            "--max-new-tokens",
            "3",
            "--temperature",
            "0.7",
        ],
    );
    assert_success(&output);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("sampling, temperature 0.7, top-k 50"),
        "{stderr}"
    );
    assert!(stderr.contains("asks for 3 beams"), "{stderr}");
}

/// Copies every file of the fixture model into `dir`.
fn copy_model(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for entry in std::fs::read_dir(model_dir()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
}

/// Cuts `path` to half its length.
fn truncate(path: &Path) {
    let bytes = std::fs::read(path).unwrap();
    std::fs::write(path, &bytes[..bytes.len() / 2]).unwrap();
}

#[test]
fn damaged_model_folders_are_clear_errors() {
    let scratch = TempDir::with_prefix("generate-damaged").unwrap();
    let root = scratch.path();
    let prompt = ["--prompt", "the quick"];

    let truncated = root.join("truncated");
    copy_model(&truncated);
    truncate(&truncated.join("model.safetensors"));
    assert_refused(&generate_in(&truncated, &prompt), "model.safetensors");

    let garbage = root.join("garbage");
    copy_model(&garbage);
    std::fs::write(garbage.join("config.json"), "model_type: llama").unwrap();
    assert_refused(&generate_in(&garbage, &prompt), "config.json: invalid JSON");

    let no_tokenizer = root.join("no-tokenizer");
    copy_model(&no_tokenizer);
    std::fs::remove_file(no_tokenizer.join("tokenizer.json")).unwrap();
    assert_refused(
        &generate_in(&no_tokenizer, &prompt),
        "tokenizer.json: no such file",
    );

    let not_a_tokenizer = root.join("not-a-tokenizer");
    copy_model(&not_a_tokenizer);
    std::fs::write(not_a_tokenizer.join("tokenizer.json"), "{}").unwrap();
    assert_refused(
        &generate_in(&not_a_tokenizer, &prompt),
        "not a tokenizer.json",
    );

    let bad_generation_config = root.join("bad-generation-config");
    copy_model(&bad_generation_config);
    std::fs::write(
        bad_generation_config.join("generation_config.json"),
        r#"{"do_sample": true, "temperature": 0}"#,
    )
    .unwrap();
    assert_refused(
        &generate_in(&bad_generation_config, &prompt),
        "generation_config.json: field `temperature`: must be > 0 to sample",
    );

    let empty = root.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    assert_refused(
        &generate_in(&empty, &prompt),
        "is not a model folder: expected a Hugging Face model (config.json",
    );
    assert_refused(
        &generate_in(&root.join("missing"), &prompt),
        "no such model folder",
    );

    // The folders of train-lm runs.
    let run = lm_run::train_tiny_run(root);
    assert_refused(
        &generate_in(&run, &["--prompt", "the quiZ"]),
        "--prompt: character 'Z' is not in the vocabulary",
    );
    assert_refused(
        &generate_in(
            &run,
            &[
                "--prompt",
                "the",
                "--tokenizer",
                model_dir().join("tokenizer.json").to_str().unwrap(),
            ],
        ),
        "a train-lm run uses the tokenizer it was trained with",
    );

    let copy = |name: &str| {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        for file in ["run.json", "model.bpk", "vocab.json"] {
            std::fs::copy(run.join(file), dir.join(file)).unwrap();
        }
        dir
    };
    let truncated_run = copy("truncated-run");
    truncate(&truncated_run.join("model.bpk"));
    assert_refused(&generate_in(&truncated_run, &prompt), "model.bpk");

    let unfinished = copy("unfinished");
    std::fs::remove_file(unfinished.join("model.bpk")).unwrap();
    assert_refused(
        &generate_in(&unfinished, &prompt),
        "the run has not finished training (`train-lm --resume",
    );

    let no_vocabulary = copy("no-vocabulary");
    std::fs::remove_file(no_vocabulary.join("vocab.json")).unwrap();
    assert_refused(&generate_in(&no_vocabulary, &prompt), "no tokenizer");

    let bad_settings = copy("bad-settings");
    std::fs::write(
        bad_settings.join("run.json"),
        r#"{"model": {"d_model": "wide"}}"#,
    )
    .unwrap();
    assert_refused(
        &generate_in(&bad_settings, &prompt),
        "`model` is not a language model's configuration",
    );

    // A train-seq2seq run: an encoder-decoder.
    let seq2seq = root.join("seq2seq");
    assert_success(&common::run(
        env!("CARGO_BIN_EXE_train-seq2seq"),
        &[
            "--out",
            seq2seq.to_str().unwrap(),
            "--steps",
            "2",
            "--d-model",
            "16",
            "--heads",
            "2",
            "--layers",
            "1",
            "--d-ff",
            "32",
            "--log-every",
            "0",
        ],
    ));
    assert_refused(
        &generate_in(&seq2seq, &prompt),
        "holds a train-seq2seq run, an encoder-decoder: not a language model",
    );
}
