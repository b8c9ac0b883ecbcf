//! Runs the `hf-logits` program on the tiny Hugging Face fixtures and compares its
//! output with transformers' reference logits and greedy tokens.

mod common;

use common::TempDir;

use std::path::{Path, PathBuf};
use std::process::Command;

/// transformers vs us, f32.
const TOLERANCE: f32 = 1e-4;

fn fixtures() -> PathBuf {
    examples::manifest_dir()
        .join("..")
        .join("burn-transformer")
        .join("tests")
        .join("fixtures")
        .join("hf")
}

fn hf_logits(model: &Path, input: &Path, out: &Path, device: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_hf-logits"))
        .arg("--model")
        .arg(model)
        .arg("--input")
        .arg(input)
        .arg("--out")
        .arg(out)
        .arg("--device")
        .arg(device)
        .output()
        .expect("hf-logits runs")
}

/// (shape, f32 values) of a float tensor or (shape, i64 values) of an int tensor.
fn read(path: &Path, key: &str) -> (Vec<usize>, Vec<f64>) {
    let bytes = std::fs::read(path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let view = file.tensor(key).unwrap();
    let values = match view.dtype() {
        safetensors::Dtype::F32 => view
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()) as f64)
            .collect(),
        safetensors::Dtype::I64 => view
            .data()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as f64)
            .collect(),
        other => panic!("{key}: unexpected dtype {other:?}"),
    };
    (view.shape().to_vec(), values)
}

fn check_family(name: &str, device: &str) {
    let model = fixtures().join(name);
    let scratch = TempDir::with_prefix(format!("{name}-{device}")).unwrap();
    let out = scratch.path().join("out.safetensors");
    let output = hf_logits(&model, &model.join("input.json"), &out, device);
    assert!(
        output.status.success(),
        "{name} on {device}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let reference = model.join("reference.safetensors");
    let (shape, logits) = read(&out, "logits");
    let (expected_shape, expected) = read(&reference, "logits");
    assert_eq!(shape, expected_shape);
    let error = logits
        .iter()
        .zip(&expected)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    assert!(
        error <= TOLERANCE as f64,
        "{name} on {device}: logits differ by {error:e}"
    );
    assert_eq!(
        read(&out, "greedy"),
        read(&reference, "greedy"),
        "{name} greedy on {device}"
    );
}

#[test]
fn matches_transformers_for_every_family_on_flex() {
    for name in [
        "llama",
        "llama_sharded",
        "mistral",
        "qwen2",
        "qwen2_bf16",
        "mixtral",
        "deepseek_v2",
        "deepseek_v3",
    ] {
        check_family(name, "flex");
    }
}

#[test]
fn matches_transformers_on_ndarray_and_wgpu() {
    for device in ["ndarray", "wgpu"] {
        check_family("mistral", device);
    }
}

#[test]
fn bad_input_exits_with_a_message_and_writes_nothing() {
    let model = fixtures().join("llama");
    let scratch = TempDir::with_prefix("bad").unwrap();
    let dir = scratch.path();
    let out = dir.join("out.safetensors");
    let cases = [
        (
            "ragged.json",
            r#"{"tokens": [[1, 2, 3], [4, 5]], "max_new_tokens": 2}"#,
            "equal lengths",
        ),
        (
            "empty.json",
            r#"{"tokens": [], "max_new_tokens": 2}"#,
            "no rows",
        ),
        (
            "vocab.json",
            r#"{"tokens": [[1, 2, 96]], "max_new_tokens": 2}"#,
            "outside the model's vocabulary",
        ),
        ("syntax.json", r#"{"tokens": [[1, 2]"#, "invalid input"),
        (
            "field.json",
            r#"{"tokens": [[1, 2]], "max_new_tokens": -1}"#,
            "invalid input",
        ),
    ];
    for (file, text, message) in cases {
        let input = dir.join(file);
        std::fs::write(&input, text).unwrap();
        let output = hf_logits(&model, &input, &out, "flex");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{file}: {stderr}");
        assert!(
            stderr.contains(message),
            "{file}: `{stderr}` should say `{message}`"
        );
        assert!(!out.exists(), "{file}: no output on failure");
    }
    let output = hf_logits(dir, &model.join("input.json"), &out, "flex");
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("config.json"));
    let output = hf_logits(&model, &model.join("input.json"), &out, "tpu");
    assert!(String::from_utf8_lossy(&output.stderr).contains("unknown device"));
    let leftovers: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}
