//! Runs the `hf-logits` program on the tiny Hugging Face fixtures and compares its
//! output with transformers' reference logits and greedy tokens; on a model trained
//! by `train-lm`; and on bad flags and damaged files, which end in one `error:` line.

mod common;
mod lm_run;

use common::{TempDir, assert_clear_error, assert_success};

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
    // The output has the permissions of any file created here, not the safetensors
    // writer's private 0600.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let plain = scratch.path().join("plain");
        std::fs::File::create(&plain).unwrap();
        let mode =
            |path: &std::path::Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&out), mode(&plain), "{name}: output permissions");
    }
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
        "qwen3",
        "qwen3_mqa",
        "olmo2",
        "olmo2_mqa",
        "olmo3",
        "smollm3",
        "phi3",
        "glm4",
        "seed_oss",
        "ernie4_5",
        "exaone4",
        "cohere",
        "cohere_qk_norm",
        "cohere2",
        "granite",
        "ministral3",
        "arcee",
        "helium",
        "ministral",
        "starcoder2",
        "hunyuan_v1_dense",
        "hunyuan_v1_moe",
        "gemma",
        "gemma2",
        "gemma3_text",
        "gemma4_text",
        "gemma4_moe",
        "gemma4_e2b",
        "gemma3_vision",
        "mistral3_vision",
        "llama4_vision",
        "qwen3_5_vision",
        "mistral4_vision",
        "mixtral",
        "olmoe",
        "qwen2_moe",
        "qwen3_moe",
        "llama4_text",
        "qwen3_5_text",
        "qwen3_next",
        "qwen3_5_moe",
        "glm4_moe",
        "glm4_moe_lite",
        "dots1",
        "ernie4_5_moe",
        "cwm",
        "gpt2",
        "gpt_bigcode",
        "gpt_bigcode_mha",
        "gptj",
        "gpt_neo",
        "codegen",
        "gpt_neox",
        "gpt_neox_sequential",
        "opt",
        "opt_post_norm",
        "biogpt",
        "falcon",
        "falcon_7b",
        "falcon_sequential",
        "bloom",
        "mpt",
        "phi",
        "phi_qk_layernorm",
        "stablelm",
        "stablelm_qk_layernorm",
        "persimmon",
        "apertus",
        "nanochat",
        "mistral4",
        "nemotron",
        "olmo",
        "hyperclovax",
        "internlm3",
        "minicpm3",
        "granite_swa",
        "glm",
        "jais2",
        "vaultgemma",
        "youtu",
        "flex_olmo",
        "solar_open",
        "exaone_moe",
        "minimax_m2",
        "granitemoe",
        "granitemoeshared",
        "gpt_oss",
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
    // GPT-2's 64 learned positions.
    let long = dir.join("long.json");
    let row: Vec<String> = (0..65).map(|i| (3 + i % 90).to_string()).collect();
    let text = format!(
        r#"{{"tokens": [[{}]], "max_new_tokens": 2}}"#,
        row.join(", ")
    );
    std::fs::write(&long, text).unwrap();
    let output = hf_logits(&fixtures().join("gpt2"), &long, &out, "flex");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("64 learned positions"), "{stderr}");
    assert!(!out.exists());
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

/// `hf-logits` on a `train-lm` run writes the logits and greedy tokens the library
/// computes with the run's model.
#[test]
fn runs_a_model_trained_by_train_lm() {
    use burn::tensor::{Device, Int, Tensor, TensorData};
    use burn_transformer::generate::{GenerationConfig, generate};

    let scratch = TempDir::with_prefix("hf-logits-run").unwrap();
    let run = lm_run::train_tiny_run(scratch.path());
    let input = scratch.path().join("input.json");
    std::fs::write(
        &input,
        r#"{"tokens": [[3, 1, 4, 1], [5, 9, 2, 6]], "max_new_tokens": 5}"#,
    )
    .unwrap();
    let out = scratch.path().join("out.safetensors");
    assert_success(&hf_logits(&run, &input, &out, "flex"));

    let device = Device::flex();
    let (model, _) = lm_run::load_run(&run, &device);
    let rows = vec![vec![3u32, 1, 4, 1], vec![5, 9, 2, 6]];
    let flat: Vec<i64> = rows.iter().flatten().map(|&t| i64::from(t)).collect();
    let logits = model
        .forward(
            Tensor::<2, Int>::from_data(TensorData::new(flat, [2, 4]), &device),
            None,
        )
        .into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .unwrap();
    let (shape, written) = read(&out, "logits");
    assert_eq!(shape, vec![2, 4, model.vocab_size()]);
    assert_eq!(written.len(), logits.len());
    let error = written
        .iter()
        .zip(&logits)
        .map(|(a, &b)| (a - f64::from(b)).abs())
        .fold(0.0, f64::max);
    assert!(error <= 1e-5, "logits differ by {error:e}");
    let greedy: Vec<f64> = generate(&model, &rows, &GenerationConfig::greedy(5), |_| {})
        .unwrap()
        .into_iter()
        .flat_map(|g| g.tokens.into_iter().map(f64::from))
        .collect();
    assert_eq!(read(&out, "greedy"), (vec![2, 5], greedy));
}

/// Copies every file of the fixture model `name` into `dir`.
fn copy_model(name: &str, dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for entry in std::fs::read_dir(fixtures().join(name)).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
}

/// Weights holding NaN or infinity load with a warning that names them.
#[test]
fn weights_holding_nan_are_named_in_a_warning() {
    let scratch = TempDir::with_prefix("hf-logits-nan").unwrap();
    let model = scratch.path().join("model");
    copy_model("llama", &model);
    let weights = model.join("model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = file
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            (
                name,
                view.dtype(),
                view.shape().to_vec(),
                view.data().to_vec(),
            )
        })
        .collect();
    let poisoned = "model.layers.1.self_attn.v_proj.weight";
    let entry = tensors
        .iter_mut()
        .find(|(name, ..)| name == poisoned)
        .unwrap();
    entry.3[..4].copy_from_slice(&f32::NAN.to_le_bytes());
    let views: Vec<_> = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            (
                name.clone(),
                safetensors::tensor::TensorView::new(*dtype, shape.clone(), data).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &weights).unwrap();

    let out = scratch.path().join("out.safetensors");
    let output = hf_logits(&model, &model.join("input.json"), &out, "flex");
    assert_success(&output);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with("warning: ")
            && stderr.contains(&format!("tensor `{poisoned}` holds NaN or infinite values")),
        "{stderr}"
    );
    let (_, logits) = read(&out, "logits");
    assert!(
        logits.iter().any(|x| x.is_nan()),
        "NaN weights give NaN logits"
    );

    let clean = hf_logits(
        &fixtures().join("llama"),
        &model.join("input.json"),
        &out,
        "flex",
    );
    assert!(assert_success(&clean).is_empty());
    assert!(
        clean.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&clean.stderr)
    );
}

#[test]
fn bad_flags_and_damaged_files_are_clear_errors() {
    let scratch = TempDir::with_prefix("hf-logits-damaged").unwrap();
    let root = scratch.path();
    let llama = fixtures().join("llama");
    let input = llama.join("input.json");
    let out = root.join("out.safetensors");
    let with_flags = |model: &Path, flags: &[&str]| {
        let mut args = vec![
            "--model",
            model.to_str().unwrap(),
            "--input",
            input.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(flags);
        common::run(env!("CARGO_BIN_EXE_hf-logits"), &args)
    };
    assert_clear_error(
        &with_flags(&llama, &["--dtype", "f8"]),
        "unknown dtype `f8`",
    );
    assert_clear_error(
        &with_flags(&llama, &["--device", "tpu"]),
        "unknown device `tpu`",
    );

    let truncated = root.join("truncated");
    copy_model("llama", &truncated);
    let weights = truncated.join("model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();
    assert_clear_error(&with_flags(&truncated, &[]), "model.safetensors");

    let header_only = root.join("header-only");
    copy_model("llama", &header_only);
    std::fs::write(header_only.join("model.safetensors"), &bytes[..12]).unwrap();
    assert_clear_error(&with_flags(&header_only, &[]), "model.safetensors");

    let garbage = root.join("garbage");
    copy_model("llama", &garbage);
    std::fs::write(garbage.join("config.json"), [0xff, 0xfe, 0x00, 0x01]).unwrap();
    assert_clear_error(&with_flags(&garbage, &[]), "config.json");

    let shallow = root.join("shallow");
    copy_model("llama", &shallow);
    let config = std::fs::read_to_string(shallow.join("config.json")).unwrap();
    std::fs::write(
        shallow.join("config.json"),
        config.replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 1"),
    )
    .unwrap();
    assert_clear_error(
        &with_flags(&shallow, &[]),
        "`num_hidden_layers` is 1, but the checkpoint holds 2 layers",
    );

    let run = lm_run::train_tiny_run(root);
    let bpk = run.join("model.bpk");
    let bytes = std::fs::read(&bpk).unwrap();
    std::fs::write(&bpk, &bytes[..bytes.len() / 2]).unwrap();
    assert_clear_error(&with_flags(&run, &[]), "model.bpk");
    assert!(!out.exists(), "no output on failure");
}
