//! Fine-tuning and export as a user runs them: `train-lm --init-from` a Hugging Face
//! checkpoint (with LoRA, or with frozen weights) lowers the validation loss on the
//! default corpus, `export-hf` writes a folder that loads back to the run's logits,
//! frozen weights leave training bit for bit, and bad flags are one `error:` line.

mod common;

use common::{TempDir, assert_clear_error, assert_success, losses};

use std::path::{Path, PathBuf};
use std::process::Output;

const TRAIN_LM: &str = env!("CARGO_BIN_EXE_train-lm");
const EXPORT_HF: &str = env!("CARGO_BIN_EXE_export-hf");
const HF_LOGITS: &str = env!("CARGO_BIN_EXE_hf-logits");

/// A tiny LLaMA checkpoint with a byte-level BPE tokenizer.json (300 tokens).
fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../burn-transformer/tests/fixtures/hf")
        .join(name)
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A short fine-tuning run on the default corpus (this checkout's text).
fn fine_tune(out: &Path, steps: &str, extra: &[&str]) -> Output {
    let base = fixture("tokenizer");
    let interval = (steps.parse::<usize>().unwrap() / 2).to_string();
    let mut args = vec![
        "--init-from",
        path(&base),
        "--out",
        path(out),
        "--steps",
        steps,
        "--eval-interval",
        &interval,
        "--eval-batches",
        "4",
        "--warmup",
        "5",
        "--log-every",
        "0",
        "--sample-tokens",
        "0",
    ];
    args.extend_from_slice(extra);
    common::run(TRAIN_LM, &args)
}

/// The logits `hf-logits` computes for a fixed input with the model in `dir`.
fn logits(dir: &Path, scratch: &Path) -> Vec<f32> {
    let input = scratch.join("input.json");
    std::fs::write(&input, r#"{"tokens": [[24, 5, 23, 26, 89, 35, 59, 12], [49, 61, 78, 38, 10, 88, 70, 54]], "max_new_tokens": 2}"#).unwrap();
    let out = scratch.join(format!(
        "logits-{}.safetensors",
        dir.file_name().unwrap().to_string_lossy()
    ));
    let output = common::run(
        HF_LOGITS,
        &[
            "--model",
            path(dir),
            "--input",
            path(&input),
            "--out",
            path(&out),
        ],
    );
    assert_success(&output);
    tensor(&out, "logits")
}

/// A tensor of a safetensors file as f32.
fn tensor(file: &Path, key: &str) -> Vec<f32> {
    let bytes = std::fs::read(file).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let view = tensors.tensor(key).unwrap();
    view.data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn lora_fine_tuning_lowers_the_loss_and_exports_a_model_with_the_runs_logits() {
    let dir = TempDir::with_prefix("lora").unwrap();
    let run = dir.path().join("run");
    let stdout = assert_success(&fine_tune(
        &run,
        "40",
        &["--lora-rank", "4", "--lr", "3e-3"],
    ));
    assert!(
        stdout.contains("LoRA: rank 4, alpha 8 (scale 2.000)"),
        "{stdout}"
    );
    assert!(stdout.contains("on 14 linear layers"), "{stdout}");
    let loaded: f64 = stdout
        .split("validation loss of the loaded model: ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no loss of the loaded model in {stdout}"));
    let (_, validation) = losses(&run);
    let (first, last) = (validation[0].1, validation.last().unwrap().1);
    assert!(
        last < first && first < loaded,
        "validation loss {loaded} -> {first} -> {last}"
    );

    let export = dir.path().join("export");
    let stdout = assert_success(&common::run(
        EXPORT_HF,
        &["--checkpoint", path(&run), "--out", path(&export)],
    ));
    assert!(stdout.contains("LoRA adapters merged"), "{stdout}");
    for file in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert!(export.join(file).is_file(), "{file}");
    }
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(export.join("config.json")).unwrap())
            .unwrap();
    assert_eq!(config["model_type"], "llama");
    let (ours, exported) = (logits(&run, dir.path()), logits(&export, dir.path()));
    assert!(max_diff(&ours, &exported) < 1e-5);
    let base = logits(&fixture("tokenizer"), dir.path());
    assert!(
        max_diff(&ours, &base) > 1e-3,
        "the adapters changed the model"
    );

    let adapters = dir.path().join("adapters");
    assert_success(&common::run(
        EXPORT_HF,
        &[
            "--checkpoint",
            path(&run),
            "--out",
            path(&adapters),
            "--adapters-only",
        ],
    ));
    let adapter_config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(adapters.join("adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        (
            adapter_config["r"].as_u64(),
            adapter_config["peft_type"].as_str()
        ),
        (Some(4), Some("LORA"))
    );
    assert!(adapters.join("adapter_model.safetensors").is_file());

    let again = common::run(
        EXPORT_HF,
        &["--checkpoint", path(&run), "--out", path(&export)],
    );
    assert_clear_error(&again, "exists and is not empty");
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains("partial"))
        .collect();
    assert!(leftovers.is_empty(), "no staging folder is left behind");
}

#[test]
fn frozen_weights_leave_training_and_export_bit_for_bit() {
    let dir = TempDir::with_prefix("freeze").unwrap();
    let run = dir.path().join("run");
    let stdout = assert_success(&fine_tune(
        &run,
        "10",
        &["--freeze", "model.embed_tokens.weight,model.layers.0.*"],
    ));
    assert!(stdout.contains("frozen: 10 weights"), "{stdout}");
    let export = dir.path().join("export");
    assert_success(&common::run(
        EXPORT_HF,
        &["--checkpoint", path(&run), "--out", path(&export)],
    ));
    let (trained, base) = (
        export.join("model.safetensors"),
        fixture("tokenizer").join("model.safetensors"),
    );
    for key in [
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
    ] {
        assert_eq!(tensor(&trained, key), tensor(&base, key), "{key} is frozen");
    }
    for key in ["lm_head.weight", "model.layers.1.self_attn.q_proj.weight"] {
        assert!(
            max_diff(&tensor(&trained, key), &tensor(&base, key)) > 0.0,
            "{key} trains"
        );
    }
}

#[test]
fn fine_tuning_and_export_flags_are_clear_errors() {
    let dir = TempDir::with_prefix("flags").unwrap();
    let run = dir.path().join("run");
    assert_clear_error(
        &fine_tune(&run, "40", &["--layers", "2"]),
        "--layers does not apply with --init-from",
    );
    assert_clear_error(
        &fine_tune(
            &run,
            "40",
            &["--lora-rank", "4", "--freeze", "lm_head.weight"],
        ),
        "--freeze applies to training the model's weights",
    );
    assert_clear_error(
        &fine_tune(&run, "40", &["--lora-rank", "4", "--lora-targets", "qproj"]),
        "`qproj`",
    );
    assert_clear_error(&fine_tune(&run, "40", &["--lora-rank", "0"]), "rank");
    assert_clear_error(
        &fine_tune(&run, "40", &["--freeze", "model.layer.0.*"]),
        "`model.layer.0.*` matches no parameter",
    );
    let no_tokenizer = common::run(
        TRAIN_LM,
        &["--init-from", path(&fixture("llama")), "--out", path(&run)],
    );
    assert_clear_error(&no_tokenizer, "no tokenizer.json in the model folder");
    let missing = dir.path().join("missing");
    let output = common::run(
        TRAIN_LM,
        &["--init-from", path(&missing), "--out", path(&run)],
    );
    assert_clear_error(&output, "config.json");
    assert!(!run.join("run.json").exists(), "nothing written");

    let output = common::run(
        EXPORT_HF,
        &["--checkpoint", path(&missing), "--out", path(&run)],
    );
    assert_clear_error(&output, "no such model folder");
    let output = common::run(
        EXPORT_HF,
        &[
            "--checkpoint",
            path(&fixture("llama")),
            "--out",
            path(&run),
            "--max-shard-size",
            "lots",
        ],
    );
    assert_clear_error(&output, "--max-shard-size lots");
    let output = common::run(
        EXPORT_HF,
        &[
            "--checkpoint",
            path(&fixture("llama")),
            "--out",
            path(&run),
            "--adapters-only",
        ],
    );
    assert_clear_error(&output, "holds no LoRA adapters");
}
