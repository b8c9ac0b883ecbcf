//! Export and PEFT tests: every fixture family saved by [`save_causal_lm`] holds the
//! keys and shapes transformers saved and loads back to the same logits; PEFT's own
//! adapters (made by `tools/make_hf_models.py` with peft) give PEFT's logits here, and
//! our adapters round-trip through PEFT's layout.

use std::collections::BTreeMap;
use std::path::Path;

use burn::module::Module;
use burn::tensor::{DType, Device, Int, Tensor};

use super::tensors::read_safetensors;
use super::tests::{config_json, model_dir};
use super::*;
use crate::io::tests::TempDir;
use crate::lora::{LoraConfig, attach_lora};
use crate::model::CausalLm;
use crate::test_utils::{Fixture, max_abs_diff};

fn tokens(name: &str, device: &Device) -> Tensor<2, Int> {
    let reference = Fixture::load(&format!("hf/{name}/reference"));
    let data = reference.data("tokens").convert::<i64>();
    Tensor::from_data(data, device)
}

/// Every tensor of a model folder: key → shape.
fn checkpoint_shapes(dir: &Path) -> BTreeMap<String, Vec<usize>> {
    let mut shapes = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name.ends_with(".safetensors") && name != "reference.safetensors" {
            for (key, tensor) in read_safetensors(&path).unwrap() {
                shapes.insert(key, tensor.shape);
            }
        }
    }
    shapes
}

const FAMILIES: [&str; 90] = [
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
    "mixtral",
    "olmoe",
    "qwen2_moe",
    "qwen3_moe",
    "llama4_text",
    "qwen3_5_text",
    "qwen3_next",
    "glm4_moe",
    "glm4_moe_mtp",
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
    "deepseek_v3_mtp",
];

#[test]
fn every_family_exports_transformers_keys_and_loads_back_to_the_same_logits() {
    let device = Device::flex();
    for name in FAMILIES {
        let source = model_dir(name);
        let (model, _) = load_causal_lm(&source, &device).unwrap();
        let out = TempDir::new().unwrap();
        let report = save_causal_lm(
            &model,
            &config_json(&source),
            out.path(),
            &ExportOptions::default(),
        )
        .unwrap_or_else(|error| panic!("{name}: {error}"));
        assert_eq!(report.files.len(), 2, "{name}: config.json and one file");
        assert_eq!(
            checkpoint_shapes(out.path()),
            checkpoint_shapes(&source),
            "{name}: the keys and shapes transformers saved"
        );
        let (reloaded, _) = load_causal_lm(out.path(), &device).unwrap();
        let prompt = tokens(name, &device);
        let before = model.forward_with_mtp(prompt.clone());
        let after = reloaded.forward_with_mtp(prompt);
        assert_eq!(max_abs_diff(before.logits, after.logits), 0.0, "{name}");
        assert_eq!(before.mtp_logits.len(), after.mtp_logits.len(), "{name}");
        for (a, b) in before.mtp_logits.into_iter().zip(after.mtp_logits) {
            assert_eq!(max_abs_diff(a, b), 0.0, "{name} multi-token prediction");
        }
    }
}

#[test]
fn sharded_half_precision_exports_index_their_shards_and_round_to_the_type() {
    let device = Device::flex();
    let source = model_dir("qwen3_moe");
    let (model, _) = load_causal_lm(&source, &device).unwrap();
    let prompt = tokens("qwen3_moe", &device);
    let logits = model.forward(prompt.clone(), None);
    for (dtype, tolerance) in [(DType::BF16, 0.1), (DType::F16, 0.02)] {
        let out = TempDir::new().unwrap();
        let options = ExportOptions {
            dtype,
            max_shard_bytes: 40_000,
        };
        let report = save_causal_lm(&model, &config_json(&source), out.path(), &options).unwrap();
        let shards = report.files.len() - 2;
        assert!(shards >= 3, "{} files", report.files.len());
        assert!(out.path().join(INDEX_FILE).is_file());
        assert!(
            out.path()
                .join(format!("model-00001-of-{shards:05}.safetensors"))
                .is_file()
        );
        let config = config_json(out.path());
        assert_eq!(config["dtype"], dtype_name(dtype));
        let (reloaded, _) = load_causal_lm(out.path(), &device).unwrap();
        let error = max_abs_diff(logits.clone(), reloaded.forward(prompt.clone(), None));
        assert!(error > 0.0 && error < tolerance, "{dtype:?}: {error}");
    }
}

/// Models built here, initialized through `crate::train` (the `train` feature).
#[cfg(feature = "train")]
mod built_here {
    use burn::tensor::TensorData;

    use super::*;
    use crate::block::BlockKind;
    use crate::model::CausalLmConfig;
    use crate::position::RopeConfig;

    /// A LLaMA-style model as `train-lm` builds it.
    fn scratch_config() -> CausalLmConfig {
        CausalLmConfig::new(50, 32, 2, 4, 64, RopeConfig::new(8).with_theta(5e5))
            .with_n_kv_heads(Some(2))
            .with_norm_eps(1e-5)
            .with_tie_word_embeddings(true)
    }

    #[test]
    fn models_built_here_export_as_their_transformers_family() {
        let device = Device::flex();
        let qk_norm_config = || crate::attention::QkNormConfig::new().with_eps(1e-5);
        let qk_norm = qk_norm_config();
        let cases = [
            (scratch_config(), "llama"),
            (
                scratch_config()
                    .with_qkv_bias(true)
                    .with_o_bias(true)
                    .with_tie_word_embeddings(false),
                "llama",
            ),
            (scratch_config().with_qkv_bias(true), "qwen2"),
            (scratch_config().with_qk_norm(Some(qk_norm)), "qwen3"),
            (gpt2_config(), "gpt2"),
            (
                gpt2_config()
                    .with_attention_scale(Some(1.0))
                    .with_tie_word_embeddings(false),
                "gpt2",
            ),
            (gemma4_config(2), "gemma4_text"),
            // Qwen3.5's hybrid: a linear attention layer, then gated attention.
            (scratch_config().with_qwen3_5_design(), "qwen3_5_text"),
            // Gemma-4 E2B's additions: per-layer inputs, the last layer reusing the
            // keys and values of the global layer before it, twice as wide.
            (
                gemma4_config(7)
                    .with_per_layer_input_width(Some(4))
                    .with_kv_shared_layers(1)
                    .with_kv_shared_d_ff(Some(128))
                    .with_tie_word_embeddings(false),
                "gemma4_text",
            ),
        ];
        for (config, family) in cases {
            let model = crate::train::host_init(7, |host| config.try_init(host)).unwrap();
            let json = hf_config_json(&config).unwrap();
            assert_eq!(json["model_type"], family);
            let out = TempDir::new().unwrap();
            save_causal_lm(&model, &json, out.path(), &ExportOptions::default()).unwrap();
            let (reloaded, hf) = load_causal_lm(out.path(), &device).unwrap();
            assert_eq!(hf.model_type, family);
            let prompt = Tensor::<2, Int>::from_data(
                TensorData::new(vec![1i64, 7, 3, 9, 40, 2], [1, 6]),
                &device,
            );
            let error = max_abs_diff(
                model.forward(prompt.clone(), None),
                reloaded.forward(prompt, None),
            );
            assert_eq!(error, 0.0, "{family}");
        }
        let gated = scratch_config().with_attention_output_gate(true);
        let error = hf_config_json(&gated).unwrap_err().to_string();
        assert!(
            error.contains("exports as Qwen3.5")
                && error.contains("norms other than RMSNorms scaling by 1 + weight"),
            "{error}"
        );
        let gemma = scratch_config().with_block_kind(BlockKind::Sandwich);
        let error = hf_config_json(&gemma).unwrap_err().to_string();
        assert!(error.contains("a block kind other than Pre-LN"), "{error}");
        let sliding_last = gemma4_config(2).with_sliding_layers(Some(vec![false, true]));
        let error = hf_config_json(&sliding_last).unwrap_err().to_string();
        assert!(
            error.contains("exports as Gemma-4") && error.contains("a sliding last layer"),
            "{error}"
        );
        let layer_qk_norm = scratch_config().with_qk_norm(Some(
            qk_norm_config()
                .with_kind(crate::attention::QkNormKind::Layer)
                .with_weights_per_head(true),
        ));
        let error = hf_config_json(&layer_qk_norm).unwrap_err().to_string();
        assert!(error.contains("QK-norm other than Qwen3's"), "{error}");
        let bases = scratch_config().with_layer_rope_theta(Some(vec![1e4, 2e4]));
        let error = hf_config_json(&bases).unwrap_err().to_string();
        assert!(error.contains("layer_rope_theta"), "{error}");
        let chunked = scratch_config().with_attention_chunk(Some(4));
        let error = hf_config_json(&chunked).unwrap_err().to_string();
        assert!(error.contains("attention_chunk"), "{error}");
        let error = hf_config_json(&gpt2_config().with_attention_chunk(Some(4)))
            .unwrap_err()
            .to_string();
        assert!(error.contains("chunked attention"), "{error}");
        let ungated = scratch_config().with_gated_mlp(false);
        let error = hf_config_json(&ungated).unwrap_err().to_string();
        assert!(error.contains("a feed-forward without a gate"), "{error}");
        let gated = gpt2_config().with_gated_mlp(true);
        let error = hf_config_json(&gated).unwrap_err().to_string();
        assert!(
            error.contains("learned positions") && error.contains("gated feed-forward"),
            "{error}"
        );
    }

    /// A Gemma-4 of `layers` layers as `train-lm --arch gemma4` builds it (five in six
    /// sliding, over 3 positions; the last global).
    fn gemma4_config(layers: usize) -> CausalLmConfig {
        CausalLmConfig {
            n_layers: layers,
            ..scratch_config()
        }
        .with_gemma4_design(3)
    }

    /// A GPT-2 as `train-lm --arch gpt2` builds it.
    fn gpt2_config() -> CausalLmConfig {
        CausalLmConfig::new(50, 32, 2, 4, 128, RopeConfig::new(8))
            .with_norm_eps(1e-5)
            .with_gpt2_design(16)
    }
}

/// Logits of `model` on the fixture's tokens.
fn logits(model: &CausalLm, name: &str) -> Tensor<3> {
    model.forward(tokens(name, &model.device()), None)
}

#[test]
fn peft_adapters_give_peft_logits_and_merge_into_peft_merged_logits() {
    let lora = peft_adapters_round_trip("llama", "llama_lora", 14);
    assert_eq!((lora.rank, lora.alpha, lora.rslora), (4, 8.0, false));
}

/// PEFT's adapters of the projections other families name otherwise: Phi's output
/// projection `dense` and its feed-forward's `fc1` / `fc2`, Nemotron's ungated
/// `up_proj` / `down_proj` (our `fc1` / `fc2`).
#[test]
fn peft_adapters_of_families_with_their_own_projection_names_round_trip() {
    let lora = peft_adapters_round_trip("phi", "phi_lora", 10);
    let mut targets = lora.targets.clone();
    targets.sort();
    assert_eq!(targets, ["fc1", "fc2", "o_proj", "q_proj", "v_proj"]);
    // GPT-J's `out_proj` and `fc_in` (our `o_proj`, `fc1`), OPT's `out_proj` and `fc2`,
    // saved back as their paths in the block (`attn.out_proj`, `fc2`).
    let lora = peft_adapters_round_trip("gptj", "gptj_lora", 6);
    assert_eq!(lora.targets, ["fc1", "o_proj", "q_proj"]);
    let lora = peft_adapters_round_trip("opt", "opt_lora", 6);
    assert_eq!(lora.targets, ["fc2", "o_proj", "v_proj"]);
    let lora = peft_adapters_round_trip("nemotron", "nemotron_lora", 8);
    assert!(
        lora.targets.iter().any(|target| target == "fc1"),
        "{:?}",
        lora.targets
    );
}

/// The adapters of fixture `adapter` over the model `base` give PEFT's logits, adapted
/// (`pairs` adapted layers) and merged; saved in PEFT's layout they are the same
/// tensors under the same keys, and load back to the same logits.
fn peft_adapters_round_trip(base: &str, adapter: &str, pairs: usize) -> LoraConfig {
    let device = Device::flex();
    let (model, config) = load_causal_lm(model_dir(base), &device).unwrap();
    let reference = Fixture::load(&format!("hf/{adapter}/reference"));
    let (adapted, lora, summary) = load_peft_adapters(model, &config, &model_dir(adapter)).unwrap();
    assert_eq!(
        summary.adapted.len(),
        pairs,
        "{adapter}: {:?}",
        summary.adapted
    );
    let expected = reference.tensor::<3>("logits", &device);
    let error = max_abs_diff(logits(&adapted, adapter), expected);
    assert!(error < 1e-4, "{adapter}: {error}");
    let merged = adapted.clone().valid().materialize();
    let error = max_abs_diff(
        logits(&merged, adapter),
        reference.tensor::<3>("merged_logits", &device),
    );
    assert!(error < 1e-4, "{adapter} merged: {error}");

    // Saved in PEFT's layout, the same adapters come back.
    let out = TempDir::new().unwrap();
    let saved = save_peft_adapters(&adapted, &lora, &config, base, out.path()).unwrap();
    assert_eq!(saved, pairs, "{adapter}");
    let ours = read_safetensors(&out.path().join(ADAPTER_WEIGHTS_FILE)).unwrap();
    let peft = read_safetensors(&model_dir(adapter).join(ADAPTER_WEIGHTS_FILE)).unwrap();
    assert_eq!(ours.len(), peft.len(), "{adapter}");
    for ((key, a), (peft_key, b)) in ours.iter().zip(&peft) {
        assert_eq!((key, &a.shape), (peft_key, &b.shape));
        let close = a
            .values
            .iter()
            .zip(&b.values)
            .all(|(x, y)| (x - y).abs() < 1e-7);
        assert!(close, "{key}");
    }
    assert_eq!(read_peft_config(out.path(), &config).unwrap(), lora);
    let (base_model, _) = load_causal_lm(model_dir(base), &device).unwrap();
    let (again, _, _) = load_peft_adapters(base_model, &config, out.path()).unwrap();
    assert_eq!(
        max_abs_diff(logits(&again, adapter), logits(&adapted, adapter)),
        0.0
    );
    lora
}

/// Adapters trained here, saved in PEFT's layout and loaded back, give the adapted
/// model's logits: DeepSeek-V3's latent projections, Gemma-4's dense feed-forward
/// beside its experts (our shared experts, saved under its `mlp.` names) with no
/// `v_proj` in its global layers, and Gemma-4 E2B's layers reusing keys and values (no
/// `k_proj`).
#[test]
fn adapters_trained_here_round_trip_on_latent_attention_and_gemma4_models() {
    let device = Device::flex();
    let cases = [
        (
            "deepseek_v3",
            "base_model.model.model.layers.0.self_attn.kv_b_proj.lora_A.weight",
            None,
        ),
        (
            "gemma4_moe",
            "base_model.model.model.layers.0.mlp.gate_proj.lora_A.weight",
            Some("base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight"),
        ),
        // Layers reusing keys and values have no k_proj to adapt.
        (
            "gemma4_e2b",
            "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight",
            Some("base_model.model.model.layers.3.self_attn.k_proj.lora_A.weight"),
        ),
    ];
    for (name, present, absent) in cases {
        let (model, config) = load_causal_lm(model_dir(name), &device).unwrap();
        let lora = LoraConfig::new(2, 4.0).with_rslora(true);
        let (adapted, summary) = attach_lora(model, &lora).unwrap();
        // Make B non-zero: a trained adapter.
        let adapted = adapted.map(&mut RandomB);
        let out = TempDir::new().unwrap();
        let pairs = save_peft_adapters(&adapted, &lora, &config, name, out.path()).unwrap();
        assert_eq!(pairs, summary.adapted.len(), "{name}");
        let keys: Vec<String> = read_safetensors(&out.path().join(ADAPTER_WEIGHTS_FILE))
            .unwrap()
            .into_iter()
            .map(|(key, _)| key)
            .collect();
        assert!(keys.contains(&present.to_string()), "{name}: {keys:?}");
        if let Some(absent) = absent {
            assert!(!keys.contains(&absent.to_string()), "{name}: {keys:?}");
        }
        let (base, _) = load_causal_lm(model_dir(name), &device).unwrap();
        let (again, read, _) = load_peft_adapters(base, &config, out.path()).unwrap();
        assert_eq!(read.scale(), lora.scale());
        let error = max_abs_diff(logits(&again, name), logits(&adapted, name));
        assert_eq!(error, 0.0, "{name}");
        let (base, _) = load_causal_lm(model_dir(name), &device).unwrap();
        assert!(
            max_abs_diff(logits(&again, name), logits(&base, name)) > 1e-4,
            "{name}"
        );
    }
}

/// PEFT saves `target_modules="all-linear"` as the module paths it resolved to
/// (`model.layers.0.mlp.down_proj`, …): the llama adapter with its targets written so
/// gives the same logits.
#[test]
fn peft_targets_written_as_module_paths_load() {
    let device = Device::flex();
    let (model, config) = load_causal_lm(model_dir("llama"), &device).unwrap();
    let dir = TempDir::new().unwrap();
    for file in [ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE] {
        std::fs::copy(model_dir("llama_lora").join(file), dir.path().join(file)).unwrap();
    }
    let path = dir.path().join(ADAPTER_CONFIG_FILE);
    let mut adapter: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let names: Vec<String> = adapter["target_modules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|name| name.as_str().unwrap().to_string())
        .collect();
    let paths: Vec<String> = (0..config.model.n_layers)
        .flat_map(|layer| {
            names.iter().map(move |name| {
                let block = match name.as_str() {
                    "gate_proj" | "up_proj" | "down_proj" => "mlp",
                    _ => "self_attn",
                };
                format!("model.layers.{layer}.{block}.{name}")
            })
        })
        .collect();
    adapter["target_modules"] = serde_json::json!(paths);
    std::fs::write(&path, adapter.to_string()).unwrap();
    let (adapted, lora, summary) = load_peft_adapters(model, &config, dir.path()).unwrap();
    let mut targets = lora.targets.clone();
    targets.sort_unstable();
    let mut expected = names;
    expected.sort_unstable();
    assert_eq!(targets, expected);
    assert_eq!(summary.adapted.len(), 14);
    let reference = Fixture::load("hf/llama_lora/reference");
    let error = max_abs_diff(
        logits(&adapted, "llama_lora"),
        reference.tensor::<3>("logits", &device),
    );
    assert!(error < 1e-4, "{error}");
}

/// PEFT's adapters of fused layers (Phi-3's `qkv_proj`, `gate_up_proj`; GPT-2's
/// `c_attn`, beside its `Conv1D` layers `c_fc` and `mlp.c_proj`; GPT-NeoX's and
/// Falcon's `query_key_value`, head by head and group by group, BLOOM's head by head;
/// MPT's `Wqkv`; CodeGen's `qkv_proj` in four blocks) adapt each projection they hold
/// (`tools/make_hf_models.py phi3_lora gpt2_lora gpt_neox_lora falcon_lora bloom_lora
/// mpt_lora codegen_lora`):
/// PEFT's logits, adapted and merged. Saving adapters of those projections back is
/// refused, naming the fused layer, since PEFT could not apply them.
#[test]
fn peft_adapters_of_fused_layers_load_and_saving_them_is_refused() {
    let device = Device::flex();
    for (base, adapter, adapted_layers, fused) in [
        ("phi3", "phi3_lora", 2 * 7, "qkv_proj"),
        // q, k, v, fc1, fc2 (not the attention's c_proj) in each of 2 layers.
        ("gpt2", "gpt2_lora", 2 * 5, "c_attn"),
        // q, k, v (fused head by head), o_proj, fc2 in each of 2 layers.
        ("gpt_neox", "gpt_neox_lora", 2 * 5, "query_key_value"),
        // q, k, v (fused group by group), fc1 in each of 2 layers.
        ("falcon", "falcon_lora", 2 * 4, "query_key_value"),
        // q, k, v (fused head by head), fc2 in each of 2 layers.
        ("bloom", "bloom_lora", 2 * 4, "query_key_value"),
        // q, k, v, o_proj, fc1 in each of 2 layers.
        ("mpt", "mpt_lora", 2 * 5, "Wqkv"),
        // q, k, v (fused in four blocks), fc1 in each of 2 layers.
        ("codegen", "codegen_lora", 2 * 4, "qkv_proj"),
    ] {
        let (model, config) = load_causal_lm(model_dir(base), &device).unwrap();
        let (adapted, lora, summary) =
            load_peft_adapters(model, &config, &model_dir(adapter)).unwrap();
        assert!(
            lora.targets.iter().any(|target| target == "k_proj"),
            "{:?}",
            lora.targets
        );
        assert_eq!(
            summary.adapted.len(),
            adapted_layers,
            "{:?}",
            summary.adapted
        );
        let reference = Fixture::load(&format!("hf/{adapter}/reference"));
        let expected = reference.tensor::<3>("logits", &device);
        let error = max_abs_diff(logits(&adapted, adapter), expected.clone());
        assert!(error < 1e-4, "{adapter} adapted: {error}");
        let merged = adapted.clone().valid().materialize();
        let expected = reference.tensor::<3>("merged_logits", &device);
        let error = max_abs_diff(logits(&merged, adapter), expected);
        assert!(error < 1e-4, "{adapter} merged: {error}");

        let out = TempDir::new().unwrap();
        let error = save_peft_adapters(&adapted, &lora, &config, base, out.path())
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("fused into") && error.contains(fused),
            "{error}"
        );
    }
}

/// PEFT's adapters of Qwen3.5's hybrid layers (`tools/make_hf_models.py qwen3_5_lora`):
/// the Gated DeltaNet's projections (`linear_attn.in_proj_qkv`, `in_proj_z`,
/// `in_proj_b`, `out_proj` in each of 3 layers) beside the gated attention's `q_proj`
/// and every layer's `down_proj` give PEFT's logits and round-trip. Qwen3-Next stores
/// the DeltaNet's projections fused (`in_proj_qkvz`), so saving adapters of them is
/// refused, naming the fused layer.
#[test]
fn peft_adapters_of_linear_attention_layers_round_trip() {
    let lora = peft_adapters_round_trip("qwen3_5_text", "qwen3_5_lora", 3 * 4 + 1 + 4);
    assert_eq!(
        lora.targets,
        [
            "down_proj",
            "in_proj_b",
            "in_proj_qkv",
            "in_proj_z",
            "out_proj",
            "q_proj"
        ]
    );

    let device = Device::flex();
    let (model, config) = load_causal_lm(model_dir("qwen3_next"), &device).unwrap();
    let lora = LoraConfig::new(2, 4.0).with_targets(vec!["in_proj_qkv".into()]);
    let (adapted, summary) = attach_lora(model, &lora).unwrap();
    assert_eq!(summary.adapted.len(), 3, "{:?}", summary.adapted);
    let out = TempDir::new().unwrap();
    let error = save_peft_adapters(&adapted, &lora, &config, "qwen3_next", out.path())
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("fused into") && error.contains("in_proj_qkvz"),
        "{error}"
    );
}

/// GPT-2 adapters trained here on the attention's output projection and the
/// feed-forward's second layer, both `c_proj` in GPT-2's names, are saved as targets
/// PEFT tells apart (`attn.c_proj`, `mlp.c_proj`) with `fan_in_fan_out` (its `Conv1D`
/// layers), and load back to the same logits.
#[test]
fn gpt2_adapters_of_its_two_c_proj_layers_round_trip() {
    let device = Device::flex();
    let (model, config) = load_causal_lm(model_dir("gpt2"), &device).unwrap();
    let lora = LoraConfig::new(2, 4.0).with_targets(vec!["o_proj".into(), "fc2".into()]);
    let (adapted, summary) = attach_lora(model, &lora).unwrap();
    assert_eq!(summary.adapted.len(), 4, "{:?}", summary.adapted);
    let adapted = adapted.map(&mut RandomB);
    let out = TempDir::new().unwrap();
    save_peft_adapters(&adapted, &lora, &config, "gpt2", out.path()).unwrap();
    let written: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join(ADAPTER_CONFIG_FILE)).unwrap(),
    )
    .unwrap();
    assert_eq!(
        written["target_modules"],
        serde_json::json!(["attn.c_proj", "mlp.c_proj"])
    );
    assert_eq!(written["fan_in_fan_out"], serde_json::json!(true));
    let (base, _) = load_causal_lm(model_dir("gpt2"), &device).unwrap();
    let (again, read, _) = load_peft_adapters(base, &config, out.path()).unwrap();
    assert_eq!(read.targets, ["fc2", "o_proj"]);
    assert_eq!(
        max_abs_diff(logits(&again, "gpt2"), logits(&adapted, "gpt2")),
        0.0
    );
}

#[test]
fn peft_features_not_implemented_here_are_named() {
    let device = Device::flex();
    let (model, config) = load_causal_lm(model_dir("deepseek_v3"), &device).unwrap();
    // PEFT with transformers 5 adapts DeepSeek-V3's fused experts as parameters.
    let error = load_peft_adapters(model, &config, &model_dir("deepseek_v3_lora"))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("`rank_pattern`") || error.contains("`target_parameters`"),
        "{error}"
    );
}

/// Draws every adapter's `B` anew.
struct RandomB;

impl burn::module::ModuleMapper for RandomB {
    fn map_float<const D: usize>(
        &mut self,
        param: burn::module::Param<Tensor<D>>,
    ) -> burn::module::Param<Tensor<D>> {
        param.map(|value| {
            let dims = value.dims();
            // Adapter B factors are the zero tensors of the model.
            let zero = value.clone().abs().max().into_scalar::<f32>() == 0.0;
            match zero && D == 2 {
                true => Tensor::random(
                    dims,
                    burn::tensor::Distribution::Normal(0.0, 0.05),
                    &value.device(),
                ),
                false => value,
            }
        })
    }
}

/// Fine-tuning a loaded latent-attention MoE model with LoRA through burn-train: the
/// loss falls, the adapters move and every base weight stays as loaded.
#[cfg(feature = "train")]
#[test]
fn lora_fine_tuning_of_a_loaded_mla_moe_model_trains_only_the_adapters() {
    use crate::train::{LmTrainingConfig, RunOptions, TokenSplit, train_language_model_from};

    let device = Device::flex();
    let (model, _) = load_causal_lm(model_dir("deepseek_v3"), &device).unwrap();
    let before: BTreeMap<String, Vec<f32>> = super::tensors::host_parameters(&model)
        .into_iter()
        .map(|(path, tensor)| (path, tensor.values))
        .collect();
    let (model, summary) = attach_lora(model, &LoraConfig::new(4, 8.0)).unwrap();
    assert_eq!(summary.adapted.len(), 16, "{:?}", summary.adapted);
    // A repeating stream the random model has not learned.
    let stream: Vec<u32> = (0..3000u32).map(|i| (i * 7 + i / 5) % 96).collect();
    let split = TokenSplit {
        train: stream[..2700].to_vec().into(),
        validation: stream[2700..].to_vec().into(),
    };
    let training = LmTrainingConfig::new()
        .with_steps(60)
        .with_eval_interval(30)
        .with_batch_size(4)
        .with_context(16)
        .with_eval_batches(2)
        .with_warmup_steps(5)
        .with_lr(1e-2);
    let dir = TempDir::new().unwrap();
    let result = train_language_model_from(
        model,
        &training,
        &split,
        &device,
        &RunOptions::quiet(dir.path()),
    )
    .unwrap();
    let validation = &result.history.validation;
    assert!(
        validation.last().unwrap().loss < validation[0].loss,
        "{validation:?}"
    );
    let after = super::tensors::host_parameters(&result.model);
    let mut adapters_moved = 0;
    for (path, tensor) in after {
        match before.get(&path) {
            Some(values) => assert_eq!(values, &tensor.values, "{path} is frozen"),
            None if path.ends_with(".lora.b") => {
                adapters_moved += usize::from(tensor.values.iter().any(|v| *v != 0.0))
            }
            None => {}
        }
    }
    assert_eq!(adapters_moved, summary.adapted.len());
}
