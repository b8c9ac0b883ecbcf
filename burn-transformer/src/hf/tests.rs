//! Whole-model tests against tiny random Hugging Face checkpoints written by
//! `tools/make_hf_models.py`: logits and greedy continuations equal transformers',
//! cached decoding equals the full forward, batched prompts equal one-by-one, and a
//! broken checkpoint gives an error that names the problem.

use std::path::{Path, PathBuf};

use burn::tensor::{Device, Int, Tensor, TensorData};

use super::*;
use crate::generate::{
    BeamSearchConfig, EarlyStopping, GenerationConfig, beam_search, generate, log_softmax,
};
use burn::tensor::activation::log_softmax as log_softmax_dim;

use crate::model::CausalLm;
use crate::test_utils::{
    Fixture, assert_close, fixture_dir, matmul_relative_rounding, max_abs_diff, model_test_devices,
};

/// Our f32 logits agree with transformers' to this absolute difference on every
/// fixture model.
const LOGIT_TOLERANCE: f32 = 1e-4;

/// The Hugging Face `config.json` written next to a layer fixture
/// (`tests/fixtures/<name>.json`).
pub(super) fn fixture_config(name: &str) -> serde_json::Value {
    let path = fixture_dir().join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run tools/make_fixtures.py)", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub(super) fn model_dir(name: &str) -> PathBuf {
    fixture_dir().join("hf").join(name)
}

/// The `config.json` of the model folder `dir`.
pub(super) fn config_json(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join(CONFIG_FILE)).unwrap()).unwrap()
}

/// Why the fixture model `name`'s `config.json`, with `key` set to `value`, is refused.
fn config_error_with(name: &str, key: &str, value: serde_json::Value) -> HfError {
    let mut config = config_json(&model_dir(name));
    config[key] = value;
    HfConfig::from_value(&config, "config.json").unwrap_err()
}

/// The fixture `name`'s `config.json` with `key` set to `value` is refused, naming the
/// key, with `reason` in the message.
fn assert_field_refused(name: &str, key: &str, value: serde_json::Value, reason: &str) {
    let error = config_error_with(name, key, value);
    assert!(
        matches!(&error, HfError::Field { field, .. } if field == key)
            && error.to_string().contains(reason),
        "{name}, {key}: {error}"
    );
}

fn reference(name: &str) -> Fixture {
    Fixture::load(&format!("hf/{name}/reference"))
}

/// The rows of an i64 `[batch, seq]` tensor as token ids.
fn rows(data: &TensorData) -> Vec<Vec<u32>> {
    let [_, seq] = [data.shape()[0], data.shape()[1]];
    let values = data.clone().convert::<i64>().try_into_vec::<i64>().unwrap();
    values
        .chunks(seq)
        .map(|row| row.iter().map(|&t| t as u32).collect())
        .collect()
}

fn int_tensor(rows: &[Vec<u32>], device: &Device) -> Tensor<2, Int> {
    let seq = rows[0].len();
    let values: Vec<i64> = rows.iter().flatten().map(|&t| t as i64).collect();
    Tensor::from_data(TensorData::new(values, [rows.len(), seq]), device)
}

/// Loads a fixture model and checks its logits and greedy continuation against
/// transformers on every model test device.
fn matches_transformers(name: &str) {
    let reference = reference(name);
    let prompts = rows(&reference.data("tokens"));
    let expected_greedy = rows(&reference.data("greedy"));
    for device in model_test_devices() {
        let (model, _) = load_causal_lm(model_dir(name), &device)
            .unwrap_or_else(|error| panic!("{name}: {error}"));
        let logits = model.forward(int_tensor(&prompts, &device), None);
        assert_close(
            logits,
            reference.tensor::<3>("logits", &device),
            LOGIT_TOLERANCE,
            &format!("{name} logits"),
        );
        let config = GenerationConfig::greedy(expected_greedy[0].len());
        let greedy: Vec<Vec<u32>> = generate(&model, &prompts, &config, |_| {})
            .unwrap()
            .into_iter()
            .map(|g| g.tokens)
            .collect();
        // A row whose first greedy step is a near-tie in transformers' logits (top two
        // closer than the device's matmul rounding: TF32 on CUDA) may take the other
        // branch there; every other row must continue exactly as transformers does.
        let logits = reference.data("logits");
        let magnitude = logits
            .iter::<f32>()
            .fold(0.0f32, |largest, x| largest.max(x.abs()));
        let slack = matmul_relative_rounding(&device) * magnitude;
        let margins = first_step_margins(&logits);
        for (row, (got, want)) in greedy.iter().zip(&expected_greedy).enumerate() {
            if margins[row] > 2.0 * slack {
                assert_eq!(
                    got, want,
                    "{name} greedy tokens of prompt {row} on {device:?}"
                );
            }
        }
        assert!(
            margins.iter().any(|&margin| margin > 2.0 * slack),
            "{name}: no prompt has a clear first greedy token on {device:?}"
        );
    }
}

/// Per prompt: the gap between the two largest logits at its last position (the
/// first greedy step).
///
/// # Shapes
/// - logits: `[batch, seq, vocab]`
fn first_step_margins(logits: &TensorData) -> Vec<f32> {
    let [batch, seq, vocab] = [logits.shape()[0], logits.shape()[1], logits.shape()[2]];
    let values = logits
        .clone()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .unwrap();
    (0..batch)
        .map(|b| {
            let last = &values[((b + 1) * seq - 1) * vocab..(b + 1) * seq * vocab];
            let (mut first, mut second) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
            for &x in last {
                if x > first {
                    second = first;
                    first = x;
                } else if x > second {
                    second = x;
                }
            }
            first - second
        })
        .collect()
}

#[test]
fn llama_matches_transformers() {
    matches_transformers("llama");
}

#[test]
fn sharded_llama_with_biases_yarn_and_tied_embeddings_matches_transformers() {
    matches_transformers("llama_sharded");
}

#[test]
fn mistral_with_sliding_window_matches_transformers() {
    matches_transformers("mistral");
}

#[test]
fn qwen2_with_biases_and_per_layer_window_matches_transformers() {
    matches_transformers("qwen2");
}

#[test]
fn qwen3_with_qk_norm_wide_heads_and_per_layer_window_matches_transformers() {
    matches_transformers("qwen3");
}

#[test]
fn qwen3_with_one_kv_head_biases_and_tied_embeddings_matches_transformers() {
    matches_transformers("qwen3_mqa");
}

#[test]
fn olmo2_with_output_norms_and_qk_norm_across_heads_matches_transformers() {
    matches_transformers("olmo2");
}

#[test]
fn olmo2_with_one_kv_head_biases_and_tied_embeddings_matches_transformers() {
    matches_transformers("olmo2_mqa");
}

#[test]
fn olmo3_with_sliding_layers_and_yarn_on_the_full_layer_matches_transformers() {
    matches_transformers("olmo3");
}

#[test]
fn smollm3_with_layers_without_rope_and_their_windows_matches_transformers() {
    matches_transformers("smollm3");
}

#[test]
fn phi3_with_fused_projections_partial_longrope_and_windows_matches_transformers() {
    matches_transformers("phi3");
}

/// Decoding past LongRoPE's original context rebuilds the cache with the long factors,
/// as transformers' Phi-3 does (`hf/phi3/crossing.json`, `tools/make_hf_models.py
/// longrope_crossing`: prompts of 5 tokens, 8 new tokens, an original context of 8):
/// greedy decoding gives the tokens of argmax decoding without a cache, and beam
/// search transformers' best beam.
#[test]
fn decoding_past_the_longrope_original_context_rebuilds_the_cache() {
    #[derive(serde::Deserialize)]
    struct Case {
        prompt: Vec<u32>,
        greedy: Vec<u32>,
        beams: Vec<u32>,
    }
    let text = std::fs::read_to_string(model_dir("phi3").join("crossing.json")).unwrap();
    let cases: Vec<Case> = serde_json::from_str(&text).unwrap();
    for device in model_test_devices() {
        let (model, _) = load_causal_lm(model_dir("phi3"), &device).unwrap();
        assert_eq!(model.cache_rebuild_length(), Some(8));
        for case in &cases {
            let greedy = GenerationConfig::greedy(case.greedy.len());
            let generated = generate(&model, std::slice::from_ref(&case.prompt), &greedy, |_| {})
                .unwrap()
                .remove(0);
            assert_eq!(generated.tokens, case.greedy, "greedy on {device:?}");
            let beams = BeamSearchConfig::new(3, case.beams.len());
            let best =
                &beam_search(&model, std::slice::from_ref(&case.prompt), &beams).unwrap()[0][0];
            assert_eq!(best.tokens, case.beams, "beams on {device:?}");
        }
    }
}

#[test]
fn glm4_with_sandwich_norms_and_interleaved_partial_rope_matches_transformers() {
    matches_transformers("glm4");
}

#[test]
fn seed_oss_with_q_k_v_biases_and_none_on_the_output_matches_transformers() {
    matches_transformers("seed_oss");
}

#[test]
fn ernie4_5_with_biases_interleaved_rope_and_tied_embeddings_matches_transformers() {
    matches_transformers("ernie4_5");
}

#[test]
fn exaone4_with_output_norms_sliding_layers_and_a_full_layer_without_rope_matches_transformers() {
    matches_transformers("exaone4");
}

#[test]
fn cohere_with_parallel_blocks_layer_norms_and_scaled_logits_matches_transformers() {
    matches_transformers("cohere");
    // MPT's named rule is no factor.
    assert_field_refused(
        "cohere",
        "logit_scale",
        "inv_sqrt_d_model".into(),
        "write that number",
    );
}

/// Command R+'s QK-norm: a LayerNorm over each head with weights of its own per head.
#[test]
fn cohere_with_a_layer_norm_of_each_head_with_its_own_weights_matches_transformers() {
    matches_transformers("cohere_qk_norm");
}

#[test]
fn cohere2_with_sliding_layers_rotated_and_a_full_one_without_rope_matches_transformers() {
    matches_transformers("cohere2");
}

#[test]
fn granite_with_embedding_attention_residual_and_logit_multipliers_matches_transformers() {
    matches_transformers("granite");
}

#[test]
fn ministral3_with_queries_scaled_past_the_original_context_matches_transformers() {
    matches_transformers("ministral3");
}

#[test]
fn arcee_with_an_ungated_squared_relu_feed_forward_matches_transformers() {
    matches_transformers("arcee");
}

#[test]
fn helium_with_interleaved_rope_and_biases_on_q_k_v_only_matches_transformers() {
    matches_transformers("helium");
}

#[test]
fn ministral_with_a_window_on_the_layers_it_names_matches_transformers() {
    matches_transformers("ministral");
}

#[test]
fn starcoder2_with_shifted_layer_norms_biases_and_an_ungated_feed_forward_matches_transformers() {
    matches_transformers("starcoder2");
}

#[test]
fn hunyuan_with_qk_norm_after_rope_and_an_ntk_alpha_base_matches_transformers() {
    matches_transformers("hunyuan_v1_dense");
}

#[test]
fn hunyuan_moe_with_per_layer_top_k_and_a_shared_expert_matches_transformers() {
    matches_transformers("hunyuan_v1_moe");
}

#[test]
fn gemma_with_gemma_norms_scaled_tied_embeddings_and_one_kv_head_matches_transformers() {
    matches_transformers("gemma");
}

#[test]
fn gemma2_with_sandwich_norms_soft_capping_and_alternating_windows_matches_transformers() {
    matches_transformers("gemma2");
}

#[test]
fn gemma3_with_qk_norm_and_a_rope_per_layer_type_matches_transformers() {
    matches_transformers("gemma3_text");
}

#[test]
fn gemma4_with_global_heads_of_their_own_values_from_keys_and_layer_scalars_matches_transformers() {
    matches_transformers("gemma4_text");
}

/// Gemma-3's multimodal checkpoint (`Gemma3ForConditionalGeneration`, as the 4B and
/// larger models ship): the text model under `language_model.`, described by a sparse
/// `text_config` with transformers 4's rotary keys; the vision tower is not loaded. The
/// text model's logits equal transformers' on text, with the keys as transformers 5
/// names them in memory too, and it exports as a `gemma3_text` checkpoint.
#[test]
fn gemma3_multimodal_checkpoint_loads_its_text_model_and_matches_transformers() {
    let (model, config) = multimodal_text_model("gemma3_vision", "gemma3");
    let device = Device::flex();
    let sliding: Vec<bool> = (0..4)
        .map(|layer| config.model.window_of(layer).is_some())
        .collect();
    assert_eq!(sliding, [true, true, true, false]);
    let reference = reference("gemma3_vision");
    let prompts = int_tensor(&rows(&reference.data("tokens")), &device);
    let expected = reference.tensor::<3>("logits", &device);

    let renamed = ScratchModel::copy("gemma3_vision").edit_tensors(|tensors| {
        for (name, ..) in tensors.iter_mut() {
            *name = match name.strip_prefix("language_model.model.") {
                Some(rest) => format!("model.language_model.{rest}"),
                None => format!("model.{name}"),
            };
        }
    });
    let (in_memory_names, _) = load_causal_lm(renamed.path(), &device).unwrap();
    assert_close(
        in_memory_names.forward(prompts, None),
        expected,
        LOGIT_TOLERANCE,
        "gemma3 with transformers 5's key names",
    );

    exports_as_its_text_model("gemma3_vision", &model, "gemma3_text");
}

/// Gemma-4's sparse layers (the 26B-A4B's): the dense feed-forward beside experts that
/// route the residual stream through the router's own norm and scale.
#[test]
fn gemma4_with_experts_beside_the_dense_feed_forward_matches_transformers() {
    matches_transformers("gemma4_moe");
}

/// Gemma-4's small checkpoints (E2B, E4B): per-layer embeddings read by a branch in
/// every layer, and the last layers reusing the keys and values of the last earlier
/// layer of their kind (also while decoding, through the producers' caches), with a
/// feed-forward twice as wide.
#[test]
fn gemma4_with_per_layer_embeddings_and_shared_keys_and_values_matches_transformers() {
    matches_transformers("gemma4_e2b");
    let device = Device::flex();
    let (model, config) = load_causal_lm(model_dir("gemma4_e2b"), &device).unwrap();
    let shared = config.model.first_kv_shared_layer();
    assert_eq!(shared, 3);
    // The reusing layers cache nothing: their caches stay empty while decoding.
    let mut cache = model.new_cache();
    let prompt = int_tensor(&[vec![3, 17, 42, 8, 60]], &device);
    model.forward_cached(prompt, &mut cache, None);
    let sizes: Vec<usize> = cache
        .blocks
        .iter()
        .map(|block| block.self_attn.bytes())
        .collect();
    assert!(sizes[..shared].iter().all(|&bytes| bytes > 0), "{sizes:?}");
    assert!(sizes[shared..].iter().all(|&bytes| bytes == 0), "{sizes:?}");
}

/// Gemma-4's multimodal checkpoint (`Gemma4ForConditionalGeneration`): the text model
/// under `model.language_model.` beside a vision tower and its embedder, which are not
/// loaded. The text model matches transformers on text and exports as `gemma4_text`.
#[test]
fn gemma4_multimodal_checkpoint_loads_its_text_model_and_matches_transformers() {
    let (model, _) = multimodal_text_model("gemma4_vision", "gemma4");
    exports_as_its_text_model("gemma4_vision", &model, "gemma4_text");
}

/// The text model of the multimodal fixture `name` (a `wrapper` checkpoint), after
/// checking that it matches transformers; loaded on flex.
fn multimodal_text_model(name: &str, wrapper: &str) -> (CausalLm, HfConfig) {
    matches_transformers(name);
    let (model, config) = load_causal_lm(model_dir(name), &Device::flex()).unwrap();
    assert_eq!(config.model_type, wrapper);
    (model, config)
}

/// The model of the multimodal fixture `name`, exported: the folder's `model_type` is
/// `text_family`, and it loads back to transformers' logits of the fixture.
fn exports_as_its_text_model(name: &str, model: &CausalLm, text_family: &str) {
    let device = model.device();
    let json = config_json(&model_dir(name));
    let out = tempfile::TempDir::new().unwrap();
    let report = save_causal_lm(model, &json, out.path(), &ExportOptions::default()).unwrap();
    assert_eq!(report.model_type, text_family);
    let (exported, hf) = load_causal_lm(out.path(), &device).unwrap();
    assert_eq!(hf.model_type, text_family);
    let reference = reference(name);
    assert_close(
        exported.forward(int_tensor(&rows(&reference.data("tokens")), &device), None),
        reference.tensor::<3>("logits", &device),
        LOGIT_TOLERANCE,
        &format!("{name} exported as its text model"),
    );
}

/// Mistral-Small-4's multimodal checkpoint: a `mistral3` wrapper whose `text_config`
/// names `mistral4`. Its text model matches transformers (latent attention with the
/// query temperature, softmax routing through groups) and exports as a `mistral4`
/// checkpoint with the same logits.
#[test]
fn mistral4_multimodal_checkpoint_loads_its_text_model_and_matches_transformers() {
    let (model, config) = multimodal_text_model("mistral4_vision", "mistral3");
    assert!(config.model.latent.is_some() && config.model.query_temperature.is_some());
    exports_as_its_text_model("mistral4_vision", &model, "mistral4");
}

/// Mistral-3's multimodal checkpoint (`Mistral3ForConditionalGeneration`, as
/// Mistral-Small-3.1 and 3.2 ship): its `text_config` names the `mistral` text model,
/// stored under `language_model.` beside a Pixtral vision tower, and the wrapper ties
/// the embeddings. The text model's logits equal transformers' on text; it exports as
/// a `mistral` checkpoint; a `text_config` of a family we do not read is named.
#[test]
fn mistral3_multimodal_checkpoint_loads_its_text_model_and_matches_transformers() {
    let (model, config) = multimodal_text_model("mistral3_vision", "mistral3");
    assert!(config.model.tie_word_embeddings && config.model.sliding_window.is_none());
    exports_as_its_text_model("mistral3_vision", &model, "mistral");

    let mut other = config_json(&model_dir("mistral3_vision"));
    other["text_config"]["model_type"] = "jamba".into();
    let error = HfConfig::from_value(&other, "config.json").unwrap_err();
    assert!(
        matches!(&error, HfError::UnsupportedModelType { model_type, .. } if model_type == "jamba"),
        "{error}"
    );
}

#[test]
fn mixtral_sparse_moe_matches_transformers() {
    matches_transformers("mixtral");
}

#[test]
fn olmoe_with_qk_norm_across_heads_and_unnormalized_softmax_routing_matches_transformers() {
    matches_transformers("olmoe");
}

#[test]
fn qwen2_moe_with_a_gated_shared_expert_and_a_dense_layer_matches_transformers() {
    matches_transformers("qwen2_moe");
}

/// Llama 4's text model: chunked attention with a parameterless QK-norm on the layers
/// with RoPE (the prompt and its continuation cross chunk boundaries, whole and
/// through the caches), a layer without RoPE whose queries are scaled by position,
/// dense layers between sparse ones whose one expert per token reads the token times
/// its sigmoid score, beside a shared expert; the rotary embedding on neighbouring
/// pairs with llama3 scaling.
#[test]
fn llama4_with_chunked_layers_and_input_weighted_experts_matches_transformers() {
    matches_transformers("llama4_text");
    let config = HfConfig::from_file(model_dir("llama4_text").join(CONFIG_FILE)).unwrap();
    assert!(config.unread_keys.is_empty(), "{:?}", config.unread_keys);
    let model = &config.model;
    let chunks: Vec<Option<usize>> = (0..4).map(|layer| model.chunk_of(layer)).collect();
    assert_eq!(chunks, [Some(4), Some(4), Some(4), None]);
    assert_eq!(model.nope_layers, Some(vec![false, false, false, true]));
    let sparse: Vec<bool> = (0..4).map(|layer| model.moe_layers.is_moe(layer)).collect();
    assert_eq!(sparse, [false, true, false, true]);
    assert_eq!(
        (model.d_ff, model.moe.as_ref().map(|moe| moe.d_ff)),
        (48, Some(16))
    );

    // Without a chunk size (`null`), every layer attends in full; a chunked layer
    // without one is refused, as is a layer type Llama 4 does not have.
    let mut full = config_json(&model_dir("llama4_text"));
    full["attention_chunk_size"] = serde_json::Value::Null;
    full.as_object_mut().unwrap().remove("layer_types");
    let full = HfConfig::from_value(&full, "config.json").unwrap();
    assert!((0..4).all(|layer| full.model.chunk_of(layer).is_none()));
    let mut orphan = config_json(&model_dir("llama4_text"));
    orphan["attention_chunk_size"] = serde_json::Value::Null;
    let error = HfConfig::from_value(&orphan, "config.json").unwrap_err();
    assert!(
        matches!(&error, HfError::Field { field, .. } if field == "layer_types"),
        "{error}"
    );
    assert_field_refused(
        "llama4_text",
        "layer_types",
        serde_json::json!([
            "chunked_attention",
            "sliding_attention",
            "full_attention",
            "full_attention"
        ]),
        "expected \"chunked_attention\" or \"full_attention\", got \"sliding_attention\"",
    );
    assert_field_refused(
        "llama4_text",
        "floor_scale",
        serde_json::json!(0.5),
        "whole number",
    );
    assert_field_refused(
        "llama4_text",
        "moe_layers",
        serde_json::json!([1, 4]),
        "layer 4",
    );
}

/// Llama 4's multimodal checkpoint (`Llama4ForConditionalGeneration`, as Scout and
/// Maverick ship): the text model under `language_model.` beside a vision tower and
/// its projector, which are not loaded. The text model matches transformers on text
/// and exports as `llama4_text`.
#[test]
fn llama4_multimodal_checkpoint_loads_its_text_model_and_matches_transformers() {
    let (model, config) = multimodal_text_model("llama4_vision", "llama4");
    assert_eq!(config.model.attention_chunk, Some(4));
    exports_as_its_text_model("llama4_vision", &model, "llama4_text");
}

/// Which layers of `model` are linear attention ones.
fn linear_layers(model: &crate::model::CausalLmConfig) -> Vec<bool> {
    (0..model.n_layers)
        .map(|layer| model.is_linear_attention_layer(layer))
        .collect()
}

/// Qwen3.5's text model: three Gated DeltaNet layers (key heads serving two value
/// heads each, a short convolution) and a gated attention layer with QK-norm and RoPE
/// on a quarter of each head, every norm but the DeltaNet's scaling by 1 + weight; its
/// file's multimodal rotary sections read as the plain rotary embedding for text.
#[test]
fn qwen3_5_with_gated_delta_net_and_gated_attention_matches_transformers() {
    matches_transformers("qwen3_5_text");
    let config = HfConfig::from_file(model_dir("qwen3_5_text").join(CONFIG_FILE)).unwrap();
    assert!(config.unread_keys.is_empty(), "{:?}", config.unread_keys);
    let model = &config.model;
    assert_eq!(linear_layers(model), [true, true, true, false]);
    assert!(model.attention_output_gate && model.norm_unit_offset);
    assert_eq!(model.rope.rotary_dim(), 4);

    // Without `layer_types`, every `full_attention_interval`-th layer attends in full.
    let mut derived = config_json(&model_dir("qwen3_5_text"));
    derived.as_object_mut().unwrap().remove("layer_types");
    derived["full_attention_interval"] = 2.into();
    let derived = HfConfig::from_value(&derived, "config.json").unwrap();
    assert_eq!(linear_layers(&derived.model), [true, false, true, false]);
    assert_field_refused(
        "qwen3_5_text",
        "layer_types",
        serde_json::json!([
            "linear_attention",
            "sliding_attention",
            "linear_attention",
            "full_attention"
        ]),
        "expected \"linear_attention\" or \"full_attention\", got \"sliding_attention\"",
    );
    assert_field_refused("qwen3_5_text", "hidden_act", "gelu".into(), "SiLU");
}

/// Qwen3-Next: Qwen3.5's hybrid layers with the DeltaNet's projections stored fused key
/// head by key head (cut into ours on loading, fused back on saving), and Qwen2-MoE's
/// experts beside a gated shared expert, a dense layer among the sparse ones.
#[test]
fn qwen3_next_with_fused_linear_attention_and_a_gated_shared_expert_matches_transformers() {
    matches_transformers("qwen3_next");
    let config = HfConfig::from_file(model_dir("qwen3_next").join(CONFIG_FILE)).unwrap();
    assert!(config.unread_keys.is_empty(), "{:?}", config.unread_keys);
    let model = &config.model;
    assert_eq!(linear_layers(model), [true, true, true, false]);
    let sparse: Vec<bool> = (0..4).map(|layer| model.moe_layers.is_moe(layer)).collect();
    assert_eq!(sparse, [true, false, true, true]);
    assert!(model.moe.as_ref().is_some_and(|moe| moe.shared_expert_gate));
}

/// Qwen3.5's checkpoint as every Qwen3.5 model ships
/// (`Qwen3_5ForConditionalGeneration`): the text model under `model.language_model.`
/// beside a vision tower (`model.visual.`), which is not loaded, in two shards. The
/// text model matches transformers on text and exports as `qwen3_5_text`.
#[test]
fn qwen3_5_multimodal_checkpoint_loads_its_text_model_and_matches_transformers() {
    let (model, config) = multimodal_text_model("qwen3_5_vision", "qwen3_5");
    assert!(config.model.linear_attention.is_some());
    exports_as_its_text_model("qwen3_5_vision", &model, "qwen3_5_text");
}

/// Qwen3.5-MoE's checkpoint as every one ships (`Qwen3_5MoeForConditionalGeneration`):
/// Qwen3.5's hybrid layers with Qwen3-Next's experts (stored expert by expert) and gated
/// shared expert on every layer, the text model under `model.language_model.` beside a
/// vision tower, in three shards. It matches transformers on text and exports as
/// `qwen3_5_moe_text`; the keys its class has not (`norm_topk_prob`, the dense layers)
/// are noted, not followed.
#[test]
fn qwen3_5_moe_multimodal_checkpoint_with_experts_on_hybrid_layers_matches_transformers() {
    let (model, config) = multimodal_text_model("qwen3_5_moe", "qwen3_5_moe");
    assert!(config.unread_keys.is_empty(), "{:?}", config.unread_keys);
    let text = &config.model;
    assert_eq!(linear_layers(text), [true, true, true, false]);
    assert!((0..4).all(|layer| text.moe_layers.is_moe(layer)));
    let moe = text.moe.as_ref().expect("experts");
    assert!(moe.shared_expert_gate && moe.router.norm_topk_prob);
    exports_as_its_text_model("qwen3_5_moe", &model, "qwen3_5_moe_text");

    // transformers renormalizes the top-k weights and makes every layer sparse whatever
    // the file says: so does the model, and the note names the keys.
    let mut json = config_json(&model_dir("qwen3_5_moe"));
    let text_config = json["text_config"].as_object_mut().unwrap();
    text_config.insert("norm_topk_prob".into(), false.into());
    text_config.insert("mlp_only_layers".into(), serde_json::json!([1]));
    let noted = HfConfig::from_value(&json, Path::new("config.json")).unwrap();
    assert!(noted.model.moe.as_ref().unwrap().router.norm_topk_prob);
    assert!((0..4).all(|layer| noted.model.moe_layers.is_moe(layer)));
    for key in ["norm_topk_prob", "mlp_only_layers"] {
        assert!(
            noted.unread_keys.iter().any(|note| note.contains(key)),
            "{key}: {:?}",
            noted.unread_keys
        );
    }
}

#[test]
fn qwen3_moe_with_dense_layers_between_sparse_ones_matches_transformers() {
    matches_transformers("qwen3_moe");
}

#[test]
fn glm4_moe_with_qk_norm_partial_rope_and_grouped_sigmoid_routing_matches_transformers() {
    matches_transformers("glm4_moe");
}

#[test]
fn glm4_moe_lite_with_latent_attention_and_listed_layer_kinds_matches_transformers() {
    matches_transformers("glm4_moe_lite");
}

#[test]
fn dots1_with_qwen3_attention_a_window_and_grouped_sigmoid_routing_matches_transformers() {
    matches_transformers("dots1");
}

#[test]
fn ernie4_5_moe_with_bias_corrected_softmax_routing_and_a_range_of_sparse_layers_matches_transformers()
 {
    matches_transformers("ernie4_5_moe");
}

/// ERNIE-4.5-MoE's checkpoints keep multi-token-prediction modules that transformers
/// does not load (`model.mtp_block.0.…`, `model.mtp_emb_norm.0.…`): they are ignored as
/// there. A correction bias stored for more than one group of experts is a shape error
/// naming its key.
#[test]
fn ernie4_5_moe_ignores_its_mtp_modules_and_names_a_misshapen_correction_bias() {
    let bias_key = "model.layers.1.mlp.moe_statics.e_score_correction_bias";
    let with_mtp = ScratchModel::copy("ernie4_5_moe").edit_tensors(|tensors| {
        let norm = tensor_mut(tensors, "model.norm.weight").clone();
        let gate = tensor_mut(tensors, "model.layers.1.mlp.gate.weight").clone();
        for (name, tensor) in [
            ("model.mtp_emb_norm.0.weight", norm.clone()),
            ("model.mtp_hidden_norm.0.weight", norm),
            ("model.mtp_block.0.mlp.gate.weight", gate),
        ] {
            tensors.push((name.to_string(), tensor.1, tensor.2, tensor.3));
        }
    });
    let device = Device::flex();
    let (model, _) = load_causal_lm(with_mtp.path(), &device).unwrap();
    let reference = reference("ernie4_5_moe");
    assert_close(
        model.forward(int_tensor(&rows(&reference.data("tokens")), &device), None),
        reference.tensor::<3>("logits", &device),
        LOGIT_TOLERANCE,
        "ernie4_5_moe with its mtp modules",
    );
    let two_groups = ScratchModel::copy("ernie4_5_moe").edit_tensors(|tensors| {
        tensor_mut(tensors, bias_key).2 = vec![2, 2];
    });
    let error = two_groups.load();
    assert!(
        matches!(&error, HfError::ShapeMismatch { key, expected, found, .. }
            if key == bias_key && expected == &[4] && found == &[2, 2]),
        "{error}"
    );
}

#[test]
fn internlm3_with_attention_and_feed_forward_biases_matches_transformers() {
    matches_transformers("internlm3");
}

/// InternLM3's two bias switches must agree, as transformers' configuration requires.
#[test]
fn internlm3_refuses_different_attention_and_feed_forward_bias_switches() {
    let error = config_error_with("internlm3", "mlp_bias", false.into());
    assert!(
        matches!(&error, HfError::Field { field, .. } if field == "qkv_bias"),
        "{error}"
    );
}

#[test]
fn cwm_with_windows_on_three_layers_of_four_and_llama3_rope_matches_transformers() {
    matches_transformers("cwm");
}

#[test]
fn gpt2_with_learned_positions_conv1d_layers_and_fused_qkv_matches_transformers() {
    matches_transformers("gpt2");
}

#[test]
fn codegen_with_qkv_fused_in_four_blocks_matches_transformers() {
    matches_transformers("codegen");
}

/// CodeGen's attention cuts its fused projection in four blocks: a width that does not
/// divide is refused by name.
#[test]
fn codegen_refuses_a_width_its_blocks_do_not_divide() {
    // 30 is split by 2 heads, not by 4 blocks.
    let scratch = ScratchModel::copy("codegen").edit_config(|config| {
        config.insert("n_embd".into(), 30.into());
        config.insert("n_head".into(), 2.into());
    });
    let error = HfConfig::from_file(scratch.path().join("config.json")).unwrap_err();
    assert!(
        matches!(&error, HfError::Field { field, .. } if field == "n_embd")
            && error.to_string().contains("multiple of 4"),
        "{error}"
    );
}

#[test]
fn gpt_neo_with_global_and_local_layers_and_unscaled_scores_matches_transformers() {
    matches_transformers("gpt_neo");
}

/// GPT-Neo's layer kinds must be runs of known kinds that add up to its layers.
#[test]
fn gpt_neo_refuses_layer_kinds_that_do_not_fit_its_layers() {
    for (key, value, reason) in [
        (
            "attention_types",
            serde_json::json!([[["global", "local"], 2]]),
            "gives more layers",
        ),
        (
            "attention_types",
            serde_json::json!([[["global"], 1]]),
            "gives 1 layers",
        ),
        (
            "attention_types",
            serde_json::json!([[["sparse", "local"], 1]]),
            "\"global\" or",
        ),
        (
            "attention_types",
            serde_json::json!([[[], 1_000_000_000_000u64]]),
            "\"global\" or",
        ),
        ("window_size", serde_json::json!(0), "positive"),
    ] {
        assert_field_refused("gpt_neo", key, value, reason);
    }
}

#[test]
fn falcon_with_two_norms_and_grouped_fused_qkv_matches_transformers() {
    matches_transformers("falcon");
}

#[test]
fn falcon_7b_with_multi_query_attention_and_one_norm_matches_transformers() {
    matches_transformers("falcon_7b");
}

#[test]
fn falcon_with_sequential_blocks_and_per_head_fused_qkv_matches_transformers() {
    matches_transformers("falcon_sequential");
}

#[test]
fn bloom_with_alibi_an_embedding_norm_and_per_head_fused_qkv_matches_transformers() {
    matches_transformers("bloom");
}

#[test]
fn mpt_with_alibi_clamped_qkv_and_its_softmax_scale_matches_transformers() {
    matches_transformers("mpt");
}

/// BLOOM's residuals taken after the norm are refused by name.
#[test]
fn bloom_refuses_residuals_after_the_norm() {
    assert_field_refused(
        "bloom",
        "apply_residual_connection_post_layernorm",
        true.into(),
        "after the norm",
    );
}

/// Falcon's ALiBi and the arrangements of norms transformers cannot run are refused by
/// name.
#[test]
fn falcon_refuses_alibi_and_norms_that_do_not_fit_its_blocks() {
    assert_field_refused("falcon", "alibi", true.into(), "ALiBi");
    assert_field_refused(
        "falcon_7b",
        "num_ln_in_parallel_attn",
        2.into(),
        "other norms",
    );
}

#[test]
fn biogpt_with_scaled_embeddings_and_opt_positions_matches_transformers() {
    matches_transformers("biogpt");
}

#[test]
fn opt_with_learned_positions_after_two_reserved_rows_matches_transformers() {
    matches_transformers("opt");
}

#[test]
fn opt_with_post_norm_blocks_and_no_final_norm_matches_transformers() {
    matches_transformers("opt_post_norm");
}

/// OPT's embedding projections (OPT-350M) and a pre-norm stack without its final norm
/// are refused by name.
#[test]
fn opt_refuses_projected_embeddings_and_a_removed_final_norm() {
    for (key, value, reason) in [
        ("word_embed_proj_dim", 16.into(), "project_in"),
        (
            "_remove_final_layer_norm",
            true.into(),
            "without a norm after the last",
        ),
    ] {
        assert_field_refused("opt", key, value, reason);
    }
}

#[test]
fn gpt_bigcode_with_multi_query_attention_and_learned_positions_matches_transformers() {
    matches_transformers("gpt_bigcode");
}

#[test]
fn gpt_bigcode_without_multi_query_and_per_head_fused_qkv_matches_transformers() {
    matches_transformers("gpt_bigcode_mha");
}

#[test]
fn gptj_with_parallel_blocks_partial_interleaved_rope_and_a_biased_head_matches_transformers() {
    matches_transformers("gptj");
}

#[test]
fn gpt_neox_with_parallel_blocks_of_two_norms_and_per_head_fused_qkv_matches_transformers() {
    matches_transformers("gpt_neox");
}

#[test]
fn gpt_neox_with_sequential_blocks_and_half_rotated_heads_matches_transformers() {
    matches_transformers("gpt_neox_sequential");
}

/// GPT-2's switches this crate does not build are refused by name, and so are heads
/// that do not split the width; `scale_attn_weights: false` leaves the scores unscaled.
#[test]
fn gpt2_refuses_what_it_does_not_build_and_reads_its_scale_switch() {
    for (key, value, reason) in [
        (
            "scale_attn_by_inverse_layer_idx",
            true.into(),
            "1 / (layer + 1)",
        ),
        ("add_cross_attention", true.into(), "cross-attention"),
        (
            "n_head",
            5.into(),
            "5 heads do not divide the width n_embd 32",
        ),
    ] {
        assert_field_refused("gpt2", key, value, reason);
    }
    let mut json = config_json(&model_dir("gpt2"));
    json["scale_attn_weights"] = false.into();
    let config = HfConfig::from_value(&json, "config.json").unwrap();
    assert_eq!(config.model.attention_scale, Some(1.0));
    assert_eq!(config.model.learned_positions, Some(64));
    assert_eq!((config.model.d_ff, config.model.head_width()), (128, 8));
}

#[test]
fn phi_with_parallel_blocks_partial_rope_and_a_biased_head_matches_transformers() {
    matches_transformers("phi");
}

#[test]
fn stablelm_with_layer_norms_qkv_biases_and_quarter_rope_matches_transformers() {
    matches_transformers("stablelm");
}

#[test]
fn granite_swa_with_sinks_windows_and_a_rope_base_per_layer_matches_transformers() {
    matches_transformers("granite_swa");
}

/// Granite-SWA's bases per layer: one per layer, none negative.
#[test]
fn granite_swa_names_a_malformed_list_of_rope_bases() {
    for (bases, reason) in [
        (serde_json::json!([10000.0, 0]), "2 entries for 4 layers"),
        (serde_json::json!([10000.0, -1.0, 0, 0]), "non-negative"),
    ] {
        assert_field_refused("granite_swa", "layer_rope_theta", bases, reason);
    }
}

#[test]
fn hyperclovax_with_granite_multipliers_and_post_norms_matches_transformers() {
    matches_transformers("hyperclovax");
}

#[test]
fn olmo_with_parameter_free_layer_norms_and_clamped_qkv_matches_transformers() {
    matches_transformers("olmo");
}

#[test]
fn nemotron_with_layer_norm_1p_and_an_ungated_relu2_feed_forward_matches_transformers() {
    matches_transformers("nemotron");
}

/// Phi's `qk_layernorm`: one LayerNorm with a shift, shared by the heads.
#[test]
fn phi_with_a_shifted_layer_norm_of_queries_and_keys_matches_transformers() {
    matches_transformers("phi_qk_layernorm");
}

/// StableLM's `qk_layernorm`: a LayerNorm per head, each stored on its own
/// (`q_layernorm.norms.{h}.weight`) and loaded as one row of our per-head norm.
#[test]
fn stablelm_with_a_layer_norm_per_head_matches_transformers() {
    matches_transformers("stablelm_qk_layernorm");
}

/// Apertus: xIELU's learned factors load into every layer's feed-forward, its constant
/// buffers are not parameters.
#[test]
fn apertus_with_an_ungated_xielu_feed_forward_and_qk_norm_matches_transformers() {
    matches_transformers("apertus");
}

/// nanochat: norms without parameters (on the embeddings too), QK-norm after a rotary
/// embedding that turns the other way, soft-capped logits.
#[test]
fn nanochat_with_bare_norms_reversed_rope_and_capped_logits_matches_transformers() {
    matches_transformers("nanochat");
}

/// Mistral-4: DeepSeek-V3's latent attention with the query temperature crossing two
/// steps in the prompt, softmax routing through groups without a bias, a shared expert,
/// experts stored stacked.
#[test]
fn mistral4_with_latent_attention_query_temperature_and_grouped_softmax_routing_matches_transformers()
 {
    matches_transformers("mistral4");
}

#[test]
fn persimmon_with_fused_qkv_a_shifted_qk_norm_and_half_rope_matches_transformers() {
    matches_transformers("persimmon");
}

/// Every fixture's own `config.json` loads without a note of an unread key: a key the
/// file leaves out asks for nothing (Phi's class has no `attention_bias`, so the
/// default of the classes that have one must not be noted as ignored).
#[test]
fn fixture_configs_load_without_unread_keys() {
    let mut checked = 0;
    for entry in std::fs::read_dir(fixture_dir().join("hf")).unwrap() {
        let path = entry.unwrap().path().join(CONFIG_FILE);
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        let config = HfConfig::from_value(&value, "config.json")
            .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
        assert!(
            config.unread_keys.is_empty(),
            "{}: {:?}",
            path.display(),
            config.unread_keys
        );
        checked += 1;
    }
    assert!(checked >= 80, "{checked} fixture configs");
}

/// A StableLM checkpoint that lacks one head's QK-norm is refused, naming the head's
/// key as unexpected (its siblings cannot be stacked without it).
#[test]
fn stablelm_with_a_head_norm_missing_names_the_unstacked_keys() {
    let missing = "model.layers.1.self_attn.q_layernorm.norms.2.weight";
    let model = ScratchModel::copy("stablelm_qk_layernorm")
        .edit_tensors(|tensors| tensors.retain(|(name, ..)| name != missing));
    let error = model.load();
    assert!(
        matches!(&error, HfError::UnexpectedTensor { key, .. }
            if key.starts_with("model.layers.1.self_attn.q_layernorm.norms.")),
        "{error}"
    );
}

/// Cohere-2 has no QK-norm: its `use_qk_norm` is read by no class, so it is noted as
/// unread rather than applied.
#[test]
fn cohere2_notes_use_qk_norm_as_unread() {
    let mut config = config_json(&model_dir("cohere2"));
    config["use_qk_norm"] = true.into();
    let config = HfConfig::from_value(&config, "config.json").unwrap();
    assert!(config.model.qk_norm.is_none());
    assert!(
        config
            .unread_keys
            .iter()
            .any(|key| key.starts_with("`use_qk_norm: true`")),
        "{:?}",
        config.unread_keys
    );
}

#[test]
fn glm_with_qkv_biases_fused_gate_up_and_interleaved_half_rope_matches_transformers() {
    matches_transformers("glm");
}

#[test]
fn jais2_with_shifted_layer_norms_and_an_ungated_relu2_feed_forward_matches_transformers() {
    matches_transformers("jais2");
}

#[test]
fn vaultgemma_with_gemma2_attention_in_pre_norm_blocks_matches_transformers() {
    matches_transformers("vaultgemma");
}

#[test]
fn minicpm3_with_latent_attention_longrope_and_its_scales_matches_transformers() {
    matches_transformers("minicpm3");
}

#[test]
fn youtu_with_latent_attention_and_dense_feed_forwards_matches_transformers() {
    matches_transformers("youtu");
}

#[test]
fn flex_olmo_with_olmo2_blocks_and_softmax_routing_matches_transformers() {
    matches_transformers("flex_olmo");
}

#[test]
fn solar_open_with_grouped_sigmoid_routing_on_every_layer_matches_transformers() {
    matches_transformers("solar_open");
}

#[test]
fn exaone_moe_with_nope_full_layers_a_dense_layer_and_grouped_sigmoid_routing_matches_transformers()
{
    matches_transformers("exaone_moe");
}

#[test]
fn minimax_m2_with_qk_norm_across_heads_and_bias_corrected_sigmoid_routing_matches_transformers() {
    matches_transformers("minimax_m2");
}

#[test]
fn granitemoe_with_multipliers_and_stacked_experts_matches_transformers() {
    matches_transformers("granitemoe");
}

#[test]
fn granitemoeshared_with_a_fused_shared_expert_matches_transformers() {
    matches_transformers("granitemoeshared");
}

#[test]
fn gpt_oss_with_sinks_biased_clamped_experts_and_alternating_windows_matches_transformers() {
    matches_transformers("gpt_oss");
}

#[test]
fn deepseek_v3_mla_yarn_and_grouped_sigmoid_routing_matches_transformers() {
    matches_transformers("deepseek_v3");
}

#[test]
fn deepseek_v2_mla_direct_queries_and_softmax_routing_matches_transformers() {
    matches_transformers("deepseek_v2");
}

/// Fixture configs rewritten the way other `config.json` files describe the same
/// model (keys left at their class defaults, transformers 4's rotary keys, keys the
/// family's transformers code does not read) load to transformers' logits, and the
/// keys that had no effect are named.
#[test]
fn configs_with_defaults_left_out_legacy_keys_and_unread_keys_match_transformers() {
    use serde_json::json;
    type Edit = fn(&mut serde_json::Map<String, serde_json::Value>);
    let cases: [(&str, Edit, &[&str]); 56] = [
        // Mixtral's class defaults: rms_norm_eps 1e-5, rope_theta 1e6, two experts per
        // token. Its code has no attention or feed-forward biases, always renormalizes
        // softmax weights and has no expert groups.
        (
            "mixtral",
            |config| {
                for key in ["rms_norm_eps", "rope_parameters", "num_experts_per_tok"] {
                    config.remove(key);
                }
                config.insert("attention_bias".into(), json!(true));
                config.insert("mlp_bias".into(), json!(true));
                config.insert("scoring_func".into(), json!("sigmoid"));
                config.insert("norm_topk_prob".into(), json!(false));
                config.insert("n_group".into(), json!(2));
            },
            &[
                "attention_bias",
                "mlp_bias",
                "scoring_func",
                "norm_topk_prob",
                "n_group",
            ],
        ),
        // transformers 4's Gemma-3 keys: the scaling and `rope_theta` (default 1e6) are
        // the full layers', the sliding layers rotate unscaled at
        // `rope_local_base_freq`, and every `sliding_window_pattern`-th layer is full.
        (
            "gemma3_text",
            |config| {
                for key in ["rope_parameters", "layer_types", "_sliding_window_pattern"] {
                    config.remove(key);
                }
                config.insert(
                    "rope_scaling".into(),
                    json!({"rope_type": "linear", "factor": 2.0}),
                );
                config.insert("rope_local_base_freq".into(), json!(100.0));
                config.insert("sliding_window_pattern".into(), json!(2));
                config.insert("attn_logit_softcapping".into(), json!(3.0));
                config.insert("hidden_act".into(), json!("silu"));
            },
            &["hidden_act", "attn_logit_softcapping"],
        ),
        // Gemma-4's global heads as its class takes them (`global_head_dim`, and
        // `num_global_key_value_heads` with `attention_k_eq_v`) instead of
        // `per_layer_config`; a last layer listed as sliding, which transformers makes
        // global; a `query_pre_attn_scalar` it does not read.
        (
            "gemma4_text",
            |config| {
                config.remove("per_layer_config");
                config.insert("global_head_dim".into(), json!(16));
                config.insert("num_global_key_value_heads".into(), json!(1));
                config.insert(
                    "layer_types".into(),
                    json!(["sliding_attention", "full_attention", "sliding_attention"]),
                );
                config.insert("query_pre_attn_scalar".into(), json!(8));
            },
            &["layer_types", "query_pre_attn_scalar"],
        ),
        // transformers 4's OLMo-3 keys: the scaling is the full layers', the sliding
        // layers rotate unscaled at the same base; three in four layers slide.
        (
            "olmo3",
            |config| {
                for key in ["rope_parameters", "layer_types"] {
                    config.remove(key);
                }
                config.insert("rope_theta".into(), json!(500000.0));
                config.insert(
                    "rope_scaling".into(),
                    json!({"rope_type": "yarn", "factor": 4.0,
                        "original_max_position_embeddings": 16}),
                );
            },
            &[],
        ),
        // SmolLM3's derived lists: every `no_rope_layer_interval`-th layer has no RoPE
        // and, with `use_sliding_window`, slides.
        (
            "smollm3",
            |config| {
                for key in ["no_rope_layers", "layer_types", "tie_word_embeddings"] {
                    config.remove(key);
                }
                config.insert("no_rope_layer_interval".into(), json!(2));
            },
            &[],
        ),
        // Phi-3's files of transformers 4: LongRoPE under its old name `su` in
        // `rope_scaling`, the partial factor and original context beside it. Its
        // attention has no biases.
        (
            "phi3",
            |config| {
                let rope = config.remove("rope_parameters").unwrap();
                config.insert(
                    "rope_scaling".into(),
                    json!({"type": "su", "short_factor": rope["short_factor"],
                        "long_factor": rope["long_factor"]}),
                );
                config.insert("rope_theta".into(), rope["rope_theta"].clone());
                config.insert("attention_bias".into(), json!(true));
            },
            &["attention_bias"],
        ),
        // GLM-4's files of transformers 4 (the base at the top) and its class defaults:
        // q/k/v biases, rotary over half of each head.
        (
            "glm4",
            |config| {
                for key in ["rope_parameters", "attention_bias", "partial_rotary_factor"] {
                    config.remove(key);
                }
                config.insert("rope_theta".into(), json!(10000.0));
            },
            &[],
        ),
        // Seed-OSS's defaults: biases on q, k and v, none on the output projection.
        (
            "seed_oss",
            |config| {
                for key in ["attention_bias", "attention_out_bias", "mlp_bias"] {
                    config.remove(key);
                }
            },
            &[],
        ),
        // ERNIE-4.5's default: tied embeddings.
        (
            "ernie4_5",
            |config| {
                config.remove("tie_word_embeddings");
            },
            &[],
        ),
        // EXAONE-4's layers named by a pattern of letters (transformers 4's files).
        (
            "exaone4",
            |config| {
                config.remove("layer_types");
                config.insert("sliding_window_pattern".into(), json!("LLLG"));
            },
            &[],
        ),
        // Cohere-2's defaults: every fourth layer full, tied embeddings, LayerNorm's
        // epsilon; its code has no feed-forward biases.
        (
            "cohere2",
            |config| {
                for key in ["layer_types", "tie_word_embeddings", "layer_norm_eps"] {
                    config.remove(key);
                }
                config.insert("mlp_bias".into(), json!(true));
            },
            &["mlp_bias"],
        ),
        // Gemma-2's defaults: alternating layers from a sliding one, tied embeddings.
        (
            "gemma2",
            |config| {
                for key in ["layer_types", "tie_word_embeddings", "rope_parameters"] {
                    config.remove(key);
                }
            },
            &[],
        ),
        // gpt-oss's defaults: attention biases, the clamped SwiGLU's constants,
        // alternating layers. Its router always renormalizes.
        (
            "gpt_oss",
            |config| {
                for key in [
                    "attention_bias",
                    "swiglu_alpha",
                    "swiglu_limit",
                    "layer_types",
                ] {
                    config.remove(key);
                }
                config.insert("norm_topk_prob".into(), json!(false));
            },
            &["norm_topk_prob"],
        ),
        // DeepSeek-V2's defaults: greedy routing, two shared experts, unscaled weights.
        // Greedy routing ignores the groups; the weights are never renormalized.
        (
            "deepseek_v2",
            |config| {
                for key in ["topk_method", "n_shared_experts", "routed_scaling_factor"] {
                    config.remove(key);
                }
                config.insert("n_group".into(), json!(4));
                config.insert("norm_topk_prob".into(), json!(true));
            },
            &["norm_topk_prob", "n_group"],
        ),
        // StarCoder2's defaults: biases everywhere, GELU-tanh, tied embeddings, its own
        // name of the norms' epsilon (`rms_norm_eps` is another family's key).
        (
            "starcoder2",
            |config| {
                for key in ["use_bias", "hidden_act", "tie_word_embeddings"] {
                    config.remove(key);
                }
                config.insert("rms_norm_eps".into(), json!(0.5));
            },
            &[],
        ),
        // Hunyuan's files as published: the embedding under `rope_scaling` with its old
        // `type` key and the base beside it. Its code has no feed-forward biases.
        (
            "hunyuan_v1_dense",
            |config| {
                config.remove("rope_parameters");
                config.insert("rope_theta".into(), json!(10000.0));
                config.insert(
                    "rope_scaling".into(),
                    json!({"type": "dynamic", "alpha": 50.0, "factor": 1.0}),
                );
                config.insert("mlp_bias".into(), json!(true));
            },
            &["mlp_bias"],
        ),
        // Ministral's code has no attention or feed-forward biases.
        (
            "ministral",
            |config| {
                config.insert("attention_bias".into(), json!(true));
                config.insert("mlp_bias".into(), json!(true));
            },
            &["attention_bias", "mlp_bias"],
        ),
        // Arcee's default activation: the squared ReLU.
        (
            "arcee",
            |config| {
                config.remove("hidden_act");
            },
            &[],
        ),
        // The first Gemma's files: `hidden_act: gelu`, which transformers reads as the
        // tanh approximation, beside `hidden_activation`; tied embeddings by default.
        // Its code has no soft-capping and scales attention by head_dim^-½.
        (
            "gemma",
            |config| {
                config.remove("tie_word_embeddings");
                config.insert("hidden_act".into(), json!("gelu"));
                config.insert("hidden_activation".into(), json!("gelu_pytorch_tanh"));
                config.insert("query_pre_attn_scalar".into(), json!(10));
                config.insert("final_logit_softcapping".into(), json!(5.0));
            },
            &["query_pre_attn_scalar", "final_logit_softcapping"],
        ),
        // OLMoE's default: weights not renormalized. Its code has no feed-forward
        // biases.
        (
            "olmoe",
            |config| {
                config.remove("norm_topk_prob");
                config.insert("mlp_bias".into(), json!(true));
            },
            &["mlp_bias"],
        ),
        // GLM-4.7-Flash's defaults: interleaved rotary, renormalized weights. Its code
        // takes the layer kinds from their list (here a sparse layer, then a dense one),
        // never from a count of dense first layers.
        (
            "glm4_moe_lite",
            |config| {
                for key in ["rope_interleave", "norm_topk_prob"] {
                    config.remove(key);
                }
                config.insert("first_k_dense_replace".into(), json!(1));
            },
            &[],
        ),
        // dots.llm1 as older files describe it: the windowed layers by
        // `max_window_layers`, no `layer_types`.
        (
            "dots1",
            |config| {
                config.remove("layer_types");
            },
            &[],
        ),
        // ERNIE-4.5-MoE's files may give its experts and top-k by the common names its
        // class maps to its own (`moe_num_experts`, `moe_k`); the base at its class's
        // default. Its code always renormalizes, without groups.
        (
            "ernie4_5_moe",
            |config| {
                config.remove("rope_parameters");
                let experts = config.remove("moe_num_experts").unwrap();
                config.insert("num_experts".into(), experts);
                let top_k = config.remove("moe_k").unwrap();
                config.insert("num_experts_per_tok".into(), top_k);
                config.insert("norm_topk_prob".into(), json!(false));
                config.insert("n_group".into(), json!(2));
            },
            &["norm_topk_prob", "n_group"],
        ),
        // Phi's files as transformers 4 wrote them: no rotary object (half-rotated heads
        // by its class's default), GELU-tanh by default; its projections always have
        // biases.
        (
            "phi",
            |config| {
                for key in ["rope_parameters", "hidden_act"] {
                    config.remove(key);
                }
                config.insert("attention_bias".into(), json!(false));
                config.insert("mlp_bias".into(), json!(false));
            },
            &["attention_bias", "mlp_bias"],
        ),
        // GPT-2's sizes under the common names (its class maps them to its own), its
        // class defaults left out, and the feed-forward's width given as `n_inner`,
        // which wins over any `intermediate_size`.
        (
            "gpt2",
            |config| {
                for (own, common) in [("n_embd", "hidden_size"), ("n_layer", "num_hidden_layers")] {
                    let value = config.remove(own).unwrap();
                    config.insert(common.into(), value);
                }
                for key in [
                    "activation_function",
                    "layer_norm_epsilon",
                    "scale_attn_weights",
                    "tie_word_embeddings",
                ] {
                    config.remove(key);
                }
                config.insert("n_inner".into(), json!(128));
                config.insert("intermediate_size".into(), json!(48));
            },
            &[],
        ),
        // BLOOM's files as bigscience published them: the width as `n_embed`, the heads
        // under the common name, the class defaults left out; its feed-forward is
        // always 4× the width, whatever `n_inner` or `intermediate_size` say.
        (
            "bloom",
            |config| {
                for (own, common) in [
                    ("hidden_size", "n_embed"),
                    ("n_head", "num_attention_heads"),
                ] {
                    let value = config.remove(own).unwrap();
                    config.insert(common.into(), value);
                }
                for key in [
                    "layer_norm_epsilon",
                    "tie_word_embeddings",
                    "apply_residual_connection_post_layernorm",
                ] {
                    config.remove(key);
                }
                config.insert("n_inner".into(), json!(null));
                config.insert("intermediate_size".into(), json!(48));
            },
            &[],
        ),
        // MPT's sizes under the common names, and its keys that transformers' MPT does
        // not read set to what it does not compute: another feed-forward width, other
        // ALiBi slopes, QK-norm, biases, a logit scale named by its rule.
        (
            "mpt",
            |config| {
                for (own, common) in [
                    ("d_model", "hidden_size"),
                    ("n_layers", "num_hidden_layers"),
                ] {
                    let value = config.remove(own).unwrap();
                    config.insert(common.into(), value);
                }
                config.insert("expansion_ratio".into(), json!(2));
                config.insert("no_bias".into(), json!(false));
                config.insert("logit_scale".into(), json!("inv_sqrt_d_model"));
                let attention = config["attn_config"].as_object_mut().unwrap();
                attention.insert("alibi_bias_max".into(), json!(4));
                attention.insert("qk_ln".into(), json!(true));
            },
            &[
                "expansion_ratio",
                "no_bias",
                "logit_scale",
                "attn_config.alibi_bias_max",
                "attn_config.qk_ln",
            ],
        ),
        // BioGPT's class defaults left out (GELU, scaled and tied embeddings); its
        // LayerNorms keep PyTorch's epsilon whatever `layer_norm_eps` says (its class
        // default, 1e-12, is never used either, so no file's value is noted).
        (
            "biogpt",
            |config| {
                for key in ["hidden_act", "scale_embedding", "tie_word_embeddings"] {
                    config.remove(key);
                }
                config.insert("layer_norm_eps".into(), json!(0.5));
            },
            &[],
        ),
        // Falcon's feed-forward width left out, as transformers 4 wrote its null
        // default: 4 times the width, not the class's 7B size.
        (
            "falcon_7b",
            |config| {
                config.remove("ffn_hidden_size");
            },
            &[],
        ),
        // GPT-Neo's sizes under the common names, its class defaults (GELU-tanh, the
        // epsilon) and its null feed-forward width left out.
        (
            "gpt_neo",
            |config| {
                for (own, common) in [
                    ("num_heads", "num_attention_heads"),
                    ("num_layers", "num_hidden_layers"),
                ] {
                    let value = config.remove(own).unwrap();
                    config.insert(common.into(), value);
                }
                for key in [
                    "activation_function",
                    "layer_norm_epsilon",
                    "intermediate_size",
                ] {
                    config.remove(key);
                }
            },
            &[],
        ),
        // GPT-J's sizes under the common names, its feed-forward's width as `n_inner`
        // and the class's GELU (tanh) and epsilon left out. Its attention has no biases.
        (
            "gptj",
            |config| {
                for (own, common) in [
                    ("n_head", "num_attention_heads"),
                    ("n_positions", "max_position_embeddings"),
                ] {
                    let value = config.remove(own).unwrap();
                    config.insert(common.into(), value);
                }
                for key in ["activation_function", "layer_norm_epsilon"] {
                    config.remove(key);
                }
                config.insert("n_inner".into(), json!(128));
                config.insert("attention_bias".into(), json!(true));
            },
            &["attention_bias"],
        ),
        // GPT-NeoX's files as transformers 4 wrote them: the rotary keys on their own
        // (`rotary_pct`, `rotary_emb_base`), the class's parallel blocks, biases and
        // exact GELU left out. Its feed-forward always has biases.
        (
            "gpt_neox",
            |config| {
                for key in [
                    "rope_parameters",
                    "use_parallel_residual",
                    "attention_bias",
                    "hidden_act",
                ] {
                    config.remove(key);
                }
                config.insert("rotary_pct".into(), json!(0.25));
                config.insert("rotary_emb_base".into(), json!(1000.0));
                config.insert("mlp_bias".into(), json!(false));
            },
            &["mlp_bias"],
        ),
        // StableLM's files as transformers 4 wrote them: no rotary object (a quarter of
        // each head rotated by its class's default); its output projection has no bias.
        (
            "stablelm",
            |config| {
                config.remove("rope_parameters");
                config.insert("attention_bias".into(), json!(true));
            },
            &["attention_bias"],
        ),
        // Apertus' class defaults: xIELU, rms_norm_eps 1e-5, LLaMA-3 scaling at base
        // 1.2e7 from an original context of 8192.
        (
            "apertus",
            |config| {
                for key in ["rope_parameters", "hidden_act", "rms_norm_eps"] {
                    config.remove(key);
                }
            },
            &[],
        ),
        // Mistral-4's class defaults: interleaved rotary pairs, renormalized weights.
        (
            "mistral4",
            |config| {
                for key in ["rope_interleave", "norm_topk_prob"] {
                    config.remove(key);
                }
            },
            &[],
        ),
        // nanochat's class defaults: squared ReLU, logits capped at 15. Its
        // feed-forward has no biases.
        (
            "nanochat",
            |config| {
                for key in ["hidden_act", "final_logit_softcapping"] {
                    config.remove(key);
                }
                config.insert("mlp_bias".into(), json!(true));
            },
            &["mlp_bias"],
        ),
        // Persimmon's files as transformers 4 wrote them (Persimmon-8B's): the rotary
        // base and part at the top level, no rotary scaling, QK-norm by the class's
        // default. Its projections always have biases.
        (
            "persimmon",
            |config| {
                for key in ["rope_parameters", "qk_layernorm", "hidden_act"] {
                    config.remove(key);
                }
                config.insert("rope_theta".into(), json!(25000.0));
                config.insert("partial_rotary_factor".into(), json!(0.5));
                config.insert("rope_scaling".into(), json!(null));
                config.insert("attention_bias".into(), json!(false));
            },
            &["attention_bias"],
        ),
        // Granite-SWA's default layer kinds: every fourth full, from the first.
        (
            "granite_swa",
            |config| {
                config.remove("layer_types");
            },
            &[],
        ),
        // HyperCLOVA X's default: norms after the sublayers.
        (
            "hyperclovax",
            |config| {
                config.remove("use_post_norm");
            },
            &[],
        ),
        // OLMo's LayerNorm has no epsilon to set (`rms_norm_eps` is another family's
        // key); its code has no feed-forward biases.
        (
            "olmo",
            |config| {
                config.insert("rms_norm_eps".into(), json!(0.5));
                config.insert("mlp_bias".into(), json!(true));
            },
            &["mlp_bias"],
        ),
        // Nemotron's files as transformers 4 wrote them: no rotary object (half-rotated
        // heads by its class's default), squared ReLU by default; `rms_norm_eps` is
        // another family's key.
        (
            "nemotron",
            |config| {
                for key in ["rope_parameters", "hidden_act"] {
                    config.remove(key);
                }
                config.insert("rms_norm_eps".into(), json!(0.5));
            },
            &[],
        ),
        // InternLM3's files as published: the bias switches by the names its class maps
        // (`qkv_bias` and `bias`).
        (
            "internlm3",
            |config| {
                let attention = config.remove("attention_bias").unwrap();
                config.insert("qkv_bias".into(), attention);
                let mlp = config.remove("mlp_bias").unwrap();
                config.insert("bias".into(), mlp);
            },
            &[],
        ),
        // CWM's default layer kinds (every fourth full, from the first); its attention
        // has no biases.
        (
            "cwm",
            |config| {
                config.remove("layer_types");
                config.insert("attention_bias".into(), json!(true));
            },
            &["attention_bias"],
        ),
        // GLM's files as transformers 4 wrote them: no rotary object (the base and the
        // half-rotated heads are its class's defaults); its code has no feed-forward
        // biases.
        (
            "glm",
            |config| {
                config.remove("rope_parameters");
                config.insert("mlp_bias".into(), json!(true));
            },
            &["mlp_bias"],
        ),
        // Jais-2's defaults: biases everywhere, squared ReLU; `rms_norm_eps` is another
        // family's key.
        (
            "jais2",
            |config| {
                for key in ["attention_bias", "mlp_bias", "hidden_act"] {
                    config.remove(key);
                }
                config.insert("rms_norm_eps".into(), json!(0.5));
            },
            &[],
        ),
        // VaultGemma's defaults: alternating layers from a sliding one, tied embeddings.
        (
            "vaultgemma",
            |config| {
                for key in ["layer_types", "tie_word_embeddings"] {
                    config.remove(key);
                }
            },
            &[],
        ),
        // MiniCPM3's value heads default to hidden_size / heads; its code rotates the
        // halves of each head whatever `rope_interleave` says.
        (
            "minicpm3",
            |config| {
                config.remove("v_head_dim");
                config.insert("rope_interleave".into(), json!(true));
            },
            &["rope_interleave"],
        ),
        // Youtu's defaults: interleaved rotary, tied embeddings.
        (
            "youtu",
            |config| {
                for key in ["rope_interleave", "tie_word_embeddings"] {
                    config.remove(key);
                }
            },
            &[],
        ),
        // FlexOlmo's default: weights not renormalized; its code has no feed-forward
        // biases.
        (
            "flex_olmo",
            |config| {
                config.remove("norm_topk_prob");
                config.insert("mlp_bias".into(), json!(true));
            },
            &["mlp_bias"],
        ),
        // Solar-Open's default: renormalized weights; its class has no dense layers,
        // whatever `first_k_dense_replace` says.
        (
            "solar_open",
            |config| {
                config.remove("norm_topk_prob");
                config.insert("first_k_dense_replace".into(), json!(1));
            },
            &[],
        ),
        // EXAONE-MoE's files as its class derives them: the layer kinds from
        // `sliding_window_pattern`, the feed-forward kinds from
        // `first_k_dense_replace`; DeepSeek's name of the shared experts is another
        // family's key.
        (
            "exaone_moe",
            |config| {
                for key in ["layer_types", "mlp_layer_types"] {
                    config.remove(key);
                }
                config.insert("n_shared_experts".into(), json!(3));
            },
            &["n_shared_experts"],
        ),
        // GraniteMoE's code always renormalizes over the chosen experts and has no
        // shared expert.
        (
            "granitemoe",
            |config| {
                config.insert("norm_topk_prob".into(), json!(false));
                config.insert("n_shared_experts".into(), json!(1));
            },
            &["norm_topk_prob", "n_shared_experts"],
        ),
        // MiniMax-M2's files as published: the rotated width as `rotary_dim`, the base
        // at its class's default. Its code always renormalizes, without groups.
        (
            "minimax_m2",
            |config| {
                config.remove("rope_parameters");
                config.insert("norm_topk_prob".into(), json!(false));
                config.insert("n_group".into(), json!(2));
            },
            &["norm_topk_prob", "n_group"],
        ),
        // Qwen2-MoE's defaults: q/k/v biases, weights not renormalized; without
        // `layer_types`, transformers 5 slides on every other layer below
        // `max_window_layers`. Its code has one shared expert, unscaled weights and no
        // output bias.
        (
            "qwen2_moe",
            |config| {
                for key in ["qkv_bias", "norm_topk_prob", "layer_types"] {
                    config.remove(key);
                }
                config.insert("n_shared_experts".into(), json!(2));
                config.insert("routed_scaling_factor".into(), json!(2.0));
                config.insert("attention_bias".into(), json!(true));
            },
            &[
                "n_shared_experts",
                "routed_scaling_factor",
                "attention_bias",
            ],
        ),
        // GLM-4.5's files as transformers 4 wrote them: `rope_theta` on its own and the
        // class's half-rotated heads; renormalized weights, one dense layer and one MTP
        // layer by default. Its routing is DeepSeek-V3's whatever the method keys say.
        (
            "glm4_moe",
            |config| {
                for key in [
                    "rope_parameters",
                    "norm_topk_prob",
                    "first_k_dense_replace",
                    "num_nextn_predict_layers",
                ] {
                    config.remove(key);
                }
                config.insert("rope_theta".into(), json!(10000.0));
                config.insert("topk_method".into(), json!("greedy"));
                config.insert("scoring_func".into(), json!("softmax"));
            },
            &["topk_method", "scoring_func"],
        ),
        // Mistral slides on every layer whatever `layer_types` says; no MLP biases.
        (
            "mistral",
            |config| {
                config.insert(
                    "layer_types".into(),
                    json!(["full_attention", "sliding_attention"]),
                );
                config.insert("mlp_bias".into(), json!(true));
            },
            &["mlp_bias", "layer_types"],
        ),
    ];
    let device = Device::flex();
    for (name, edit, unread) in cases {
        let scratch = ScratchModel::copy(name).edit_config(edit);
        let (model, config) = load_causal_lm(scratch.path(), &device)
            .unwrap_or_else(|error| panic!("{name}: {error}"));
        let reference = reference(name);
        let prompts = rows(&reference.data("tokens"));
        assert_close(
            model.forward(int_tensor(&prompts, &device), None),
            reference.tensor::<3>("logits", &device),
            LOGIT_TOLERANCE,
            &format!("{name} with its config rewritten"),
        );
        let named: Vec<&str> = config
            .unread_keys
            .iter()
            .map(|note| note.split('`').nth(1).unwrap().split(':').next().unwrap())
            .collect();
        let mut expected = unread.to_vec();
        expected.sort_unstable();
        let mut named_sorted = named.clone();
        named_sorted.sort_unstable();
        assert_eq!(named_sorted, expected, "{name}: {:?}", config.unread_keys);
    }
}

/// A DeepSeek-V3 checkpoint with its multi-token-prediction layer: the model matches
/// transformers (which ignores that layer), and the loaded module gives the PyTorch
/// reference's states and logits (tools/make_hf_models.py: transformers' decoder layer
/// with DeepSeek-V3's `enorm`/`hnorm`/`eh_proj`/`shared_head`, embedding first).
/// Self-speculative decoding with it gives transformers' greedy tokens.
#[test]
fn deepseek_v3_multi_token_prediction_layer_matches_the_pytorch_reference() {
    multi_token_prediction_layer_matches_the_pytorch_reference("deepseek_v3_mtp");
}

/// GLM-4.5's checkpoints store their multi-token-prediction layer as DeepSeek-V3's do
/// (the same keys after the decoder layers, the same computation).
#[test]
fn glm4_moe_multi_token_prediction_layer_matches_the_pytorch_reference() {
    multi_token_prediction_layer_matches_the_pytorch_reference("glm4_moe_mtp");
}

/// The fixture `name` (a checkpoint with one multi-token-prediction layer) matches
/// transformers, its MTP logits the PyTorch reference's, and self-speculative decoding
/// gives transformers' greedy tokens.
fn multi_token_prediction_layer_matches_the_pytorch_reference(name: &str) {
    matches_transformers(name);
    let reference = reference(name);
    let prompts = rows(&reference.data("tokens"));
    let expected_greedy = rows(&reference.data("greedy"));
    for device in model_test_devices() {
        let (model, config) = load_causal_lm(model_dir(name), &device).unwrap();
        assert_eq!((config.mtp_layers, model.mtp_depth()), (1, 1));
        let output = model.forward_with_mtp(int_tensor(&prompts, &device));
        assert_close(
            output.mtp_logits[0].clone(),
            reference.tensor::<3>("mtp_logits", &device),
            LOGIT_TOLERANCE,
            &format!("{name} mtp logits on {device:?}"),
        );
        let greedy = GenerationConfig::greedy(expected_greedy[0].len());
        for (prompt, expected) in prompts.iter().zip(&expected_greedy) {
            let output =
                crate::generate::generate_speculative(&model, prompt, &greedy, |_| {}).unwrap();
            assert_eq!(&output.generated.tokens, expected, "{name} on {device:?}");
        }
    }
}

#[test]
fn bf16_checkpoint_loads_as_f32_and_matches_transformers() {
    matches_transformers("qwen2_bf16");
}

/// Prefill, single steps and a chunk through the cache equal one full forward pass;
/// the sliding-window fixture also exercises the rolling cache.
#[test]
fn cached_decoding_equals_the_full_forward() {
    for name in [
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "mixtral",
        "qwen2_moe",
        "qwen3_moe",
        "glm4_moe",
        "minimax_m2",
        "gpt_oss",
        "deepseek_v3",
        "llama4_text",
        "qwen3_5_text",
        "qwen3_next",
        "qwen3_5_moe",
    ] {
        let reference = reference(name);
        let prompts = rows(&reference.data("tokens"));
        let greedy = rows(&reference.data("greedy"));
        let sequences: Vec<Vec<u32>> = prompts
            .iter()
            .zip(&greedy)
            .map(|(p, g)| p.iter().chain(g).copied().collect())
            .collect();
        let total = sequences[0].len();
        for device in model_test_devices() {
            let (model, hf) = load_causal_lm(model_dir(name), &device).unwrap();
            let tokens = int_tensor(&sequences, &device);
            let full = model.forward(tokens.clone(), None);
            let mut cache = model.new_cache();
            let mut pieces =
                vec![model.forward_cached(tokens.clone().narrow(1, 0, 5), &mut cache, None)];
            for position in 5..total - 3 {
                pieces.push(model.forward_cached(
                    tokens.clone().narrow(1, position, 1),
                    &mut cache,
                    None,
                ));
            }
            pieces.push(model.forward_cached(tokens.narrow(1, total - 3, 3), &mut cache, None));
            assert_eq!(cache.position(), total);
            // The hybrid fixtures are ill-conditioned in f32: transformers' own cached
            // and full logits differ by 1.7e-5 (qwen3_5_text) and 5.7e-5 (qwen3_next),
            // as much as each differs from its f64 logits; their linear attention sums
            // in the order of the calls' positions (its chunks), so ours do too.
            let tolerance = match hf.model.linear_attention {
                Some(_) => 1e-5 * full.clone().abs().max().into_scalar::<f32>(),
                None => 1e-5,
            };
            assert_close(
                Tensor::cat(pieces, 1),
                full,
                tolerance,
                &format!("{name} cached"),
            );
        }
    }
}

/// Prompts of different lengths in one left-padded batch give the logits and
/// greedy tokens each gives alone.
#[test]
fn batched_left_padded_prompts_equal_one_by_one() {
    for name in ["mistral", "qwen2", "bloom", "qwen3_5_text"] {
        let reference = reference(name);
        let full = rows(&reference.data("tokens"));
        let prompts = vec![
            full[0].clone(),
            full[1][..5].to_vec(),
            full[0][2..5].to_vec(),
        ];
        for device in model_test_devices() {
            let (model, _) = load_causal_lm(model_dir(name), &device).unwrap();
            let config = GenerationConfig::greedy(6);
            let batched = generate(&model, &prompts, &config, |_| {}).unwrap();
            for (row, prompt) in prompts.iter().enumerate() {
                let alone = generate(&model, std::slice::from_ref(prompt), &config, |_| {})
                    .unwrap()
                    .remove(0);
                assert_eq!(batched[row], alone, "{name} row {row} on {device:?}");
            }

            let (tokens, padding) = crate::generate::left_pad(&prompts, 0, &device);
            let padded_logits = model.forward(tokens, padding);
            for (row, prompt) in prompts.iter().enumerate() {
                let alone = model.forward(int_tensor(std::slice::from_ref(prompt), &device), None);
                let len = prompt.len();
                let padded = padded_logits
                    .clone()
                    .narrow(0, row, 1)
                    .narrow(1, 9 - len, len);
                let diff = max_abs_diff(padded, alone);
                assert!(
                    diff <= LOGIT_TOLERANCE,
                    "{name} row {row}: padded logits differ by {diff:e}"
                );
            }
        }
    }
}

#[test]
fn streaming_callback_sees_every_token_in_order() {
    let device = Device::flex();
    let (model, _) = load_causal_lm(model_dir("llama"), &device).unwrap();
    let prompts = rows(&reference("llama").data("tokens"));
    let mut events = Vec::new();
    let outputs = generate(&model, &prompts, &GenerationConfig::greedy(4), |event| {
        events.push(event)
    })
    .unwrap();
    assert_eq!(events.len(), 8);
    for (row, output) in outputs.iter().enumerate() {
        let streamed: Vec<u32> = events
            .iter()
            .filter(|e| e.row == row)
            .map(|e| e.token)
            .collect();
        assert_eq!(streamed, output.tokens);
    }
}

#[test]
fn stop_tokens_end_a_row_and_max_new_tokens_the_rest() {
    let device = Device::flex();
    let (model, _) = load_causal_lm(model_dir("llama"), &device).unwrap();
    let reference = reference("llama");
    let prompts = rows(&reference.data("tokens"));
    let greedy = rows(&reference.data("greedy"));
    // Row 0's third greedy token becomes a stop token (if row 1 does not produce it).
    let stop = greedy[0][2];
    let config = GenerationConfig::greedy(6).with_stop_tokens(vec![stop]);
    let outputs = generate(&model, &prompts, &config, |_| {}).unwrap();
    let first_stop = greedy[0].iter().position(|&t| t == stop).unwrap();
    assert_eq!(outputs[0].tokens, greedy[0][..=first_stop].to_vec());
    assert_eq!(outputs[0].stop, crate::generate::StopReason::StopToken);
    if !greedy[1].contains(&stop) {
        assert_eq!(outputs[1].tokens, greedy[1]);
        assert_eq!(outputs[1].stop, crate::generate::StopReason::MaxNewTokens);
    }
}

#[test]
fn beam_search_with_one_beam_is_greedy() {
    for device in model_test_devices() {
        let (model, _) = load_causal_lm(model_dir("mistral"), &device).unwrap();
        let reference = reference("mistral");
        let prompts = rows(&reference.data("tokens"));
        let greedy = rows(&reference.data("greedy"));
        let beams = beam_search(&model, &prompts, &BeamSearchConfig::new(1, 6)).unwrap();
        for (row, hypotheses) in beams.iter().enumerate() {
            assert_eq!(hypotheses[0].tokens, greedy[row], "row {row} on {device:?}");
        }
    }
}

/// The norm of every parameter's gradient of `loss`, by the name transformers gives
/// the parameter in memory (`model.embed_tokens.weight`, gpt-oss's `mlp.router`,
/// Gemma-3 multimodal's `model.language_model.…`); parameters the loss does not reach
/// (an unused multi-token-prediction module) have no gradient and are left out.
fn gradient_norms(
    model: &CausalLm,
    loss: Tensor<1>,
    config: &HfConfig,
) -> std::collections::BTreeMap<String, f64> {
    let model_type = config.model_type.as_str();
    use burn::module::{Module, ModuleVisitor, Param};
    struct Norms<'a> {
        grads: &'a burn::tensor::Gradients,
        path: crate::module_path::ParamPath,
        norms: Vec<(String, f64)>,
    }
    impl ModuleVisitor for Norms<'_> {
        fn enter_module(&mut self, name: &str, container_type: &str) {
            self.path.enter(name, container_type);
        }
        fn exit_module(&mut self, _name: &str, container_type: &str) {
            self.path.exit(container_type);
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if let Some(grad) = param.val().grad(self.grads) {
                let values: Vec<f32> = grad.try_to_vec_as().unwrap();
                let norm = values
                    .iter()
                    .map(|&v| f64::from(v).powi(2))
                    .sum::<f64>()
                    .sqrt();
                self.norms.push((self.path.joined(), norm));
            }
        }
    }
    let grads = loss.backward();
    let mut visitor = Norms {
        grads: &grads,
        path: Default::default(),
        norms: Vec::new(),
    };
    model.visit(&mut visitor);
    // Squared norms by transformers' parameter, which for Phi-3's fused projections
    // holds several of ours.
    let mut squares = std::collections::BTreeMap::new();
    for (path, norm) in visitor.norms {
        let name = match path.strip_prefix("embed_tokens.") {
            Some(rest) => format!("model.embed_tokens.{rest}"),
            None if path == "lm_head_bias" => "lm_head.bias".to_string(),
            None => path,
        };
        // The families with names of their own (GPT-2, GPT-NeoX, …): q, k and v share
        // their fused layer, if any. transformers names GPT-NeoX's head `lm_head`.
        if let Some(names) = crate::hf::checkpoint::own_names(config) {
            let name = match name.as_str() {
                "lm_head.weight" => name.clone(),
                _ => names.checkpoint_key(&name),
            };
            let fused = names.fused_qkv.and_then(|fused| fused.rsplit('.').next());
            // Whole segments: CodeGen's fused `qkv_proj` ends with `v_proj`.
            let name = match fused {
                Some(fused) => name
                    .split('.')
                    .map(|part| match part {
                        "q_proj" | "k_proj" | "v_proj" => fused,
                        part => part,
                    })
                    .collect::<Vec<_>>()
                    .join("."),
                None => name,
            };
            *squares.entry(name).or_insert(0.0) += norm * norm;
            continue;
        }
        let renames: &[(&str, &str)] = match model_type {
            "gpt_oss" => &[(".mlp.gate.", ".mlp.router.")],
            "llama4_text" | "llama4" => &[
                (".mlp.gate.", ".feed_forward.router."),
                (".mlp.shared_experts.", ".feed_forward.shared_expert."),
                (".mlp.", ".feed_forward."),
            ],
            "qwen2_moe" => &[(".mlp.shared_experts.", ".mlp.shared_expert.")],
            // Qwen3-Next's linear attention holds its projections fused (ours are its
            // parts, whose squared norms add up).
            "qwen3_next" => &[
                (".self_attn.in_proj_qkv.", ".linear_attn.in_proj_qkvz."),
                (".self_attn.in_proj_z.", ".linear_attn.in_proj_qkvz."),
                (".self_attn.in_proj_b.", ".linear_attn.in_proj_ba."),
                (".self_attn.in_proj_a.", ".linear_attn.in_proj_ba."),
                (".self_attn.conv1d.", ".linear_attn.conv1d."),
                (".self_attn.dt_bias", ".linear_attn.dt_bias"),
                (".self_attn.a_log", ".linear_attn.A_log"),
                (".self_attn.norm.", ".linear_attn.norm."),
                (".self_attn.out_proj.", ".linear_attn.out_proj."),
                (".mlp.shared_experts.", ".mlp.shared_expert."),
            ],
            "hunyuan_v1_dense" | "hunyuan_v1_moe" => &[
                (".self_attn.q_norm.", ".self_attn.query_layernorm."),
                (".self_attn.k_norm.", ".self_attn.key_layernorm."),
                (".mlp.gate.", ".mlp.gate.wg."),
                (".mlp.shared_experts.", ".mlp.shared_mlp."),
            ],
            "granitemoe" | "granitemoeshared" => &[
                (
                    ".mlp.shared_experts.gate_proj.",
                    ".shared_mlp.input_linear.",
                ),
                (".mlp.shared_experts.up_proj.", ".shared_mlp.input_linear."),
                (
                    ".mlp.shared_experts.down_proj.",
                    ".shared_mlp.output_linear.",
                ),
                (".mlp.gate.", ".block_sparse_moe.router."),
                (".mlp.", ".block_sparse_moe."),
            ],
            // Ungated feed-forwards: Arcee's and StarCoder2's names of `fc1` and `fc2`.
            "arcee" => &[
                (".mlp.fc1.", ".mlp.up_proj."),
                (".mlp.fc2.", ".mlp.down_proj."),
            ],
            "starcoder2" => &[(".mlp.fc1.", ".mlp.c_fc."), (".mlp.fc2.", ".mlp.c_proj.")],
            "apertus" => &[
                (".mlp.fc1.", ".mlp.up_proj."),
                (".mlp.fc2.", ".mlp.down_proj."),
                (".input_layernorm.", ".attention_layernorm."),
                (".post_attention_layernorm.", ".feedforward_layernorm."),
            ],
            "jais2" | "nemotron" => &[
                (".mlp.fc1.", ".mlp.up_proj."),
                (".mlp.fc2.", ".mlp.down_proj."),
            ],
            "vaultgemma" => &[(".post_attention_layernorm.", ".pre_feedforward_layernorm.")],
            "hyperclovax" => &[
                (".post_attention_layernorm.", ".post_norm1."),
                (".pre_feedforward_layernorm.", ".post_attention_layernorm."),
                (".post_feedforward_layernorm.", ".post_norm2."),
            ],
            "phi" => &[
                (".self_attn.o_proj.", ".self_attn.dense."),
                ("model.norm.", "model.final_layernorm."),
                (".self_attn.q_norm.", ".self_attn.q_layernorm."),
                (".self_attn.k_norm.", ".self_attn.k_layernorm."),
            ],
            // Each row of our per-head norms is one of StableLM's (folded in the test).
            "stablelm" => &[
                (".self_attn.q_norm.", ".self_attn.q_layernorm."),
                (".self_attn.k_norm.", ".self_attn.k_layernorm."),
            ],
            "glm" => &[
                (".gate_proj.", ".gate_up_proj."),
                (".up_proj.", ".gate_up_proj."),
            ],
            "gemma3" | "gemma4" | "mistral3" => &[("model.", "model.language_model.")],
            // Qwen3.5's linear attention is `linear_attn` (its text model, in the
            // multimodal class, moves under `model.language_model.` below).
            "qwen3_5_text" | "qwen3_5" => &[
                (".self_attn.in_proj_", ".linear_attn.in_proj_"),
                (".self_attn.conv1d.", ".linear_attn.conv1d."),
                (".self_attn.dt_bias", ".linear_attn.dt_bias"),
                (".self_attn.a_log", ".linear_attn.A_log"),
                (".self_attn.norm.", ".linear_attn.norm."),
                (".self_attn.out_proj.", ".linear_attn.out_proj."),
            ],
            "qwen3_5_moe" => &[
                (".self_attn.in_proj_", ".linear_attn.in_proj_"),
                (".self_attn.conv1d.", ".linear_attn.conv1d."),
                (".self_attn.dt_bias", ".linear_attn.dt_bias"),
                (".self_attn.a_log", ".linear_attn.A_log"),
                (".self_attn.norm.", ".linear_attn.norm."),
                (".self_attn.out_proj.", ".linear_attn.out_proj."),
                (".mlp.shared_experts.", ".mlp.shared_expert."),
            ],

            // Gemma-4's router, experts and their norms sit beside its dense
            // feed-forward (our shared experts) in the layer; its per-layer embeddings
            // in its stack, each layer's per-layer branch in the layer.
            "gemma4_text" => &[
                (
                    "per_layer_embed.embed_tokens.",
                    "model.embed_tokens_per_layer.",
                ),
                (
                    "per_layer_embed.projection.",
                    "model.per_layer_model_projection.",
                ),
                ("per_layer_embed.norm.", "model.per_layer_projection_norm."),
                (".per_layer_input.gate.", ".per_layer_input_gate."),
                (".per_layer_input.projection.", ".per_layer_projection."),
                (".per_layer_input.norm.", ".post_per_layer_input_norm."),
                (".mlp.shared_experts.", ".mlp."),
                (".mlp.gate.input_scale", ".router.scale"),
                (".mlp.gate.per_expert_scale", ".router.per_expert_scale"),
                (".mlp.gate.", ".router.proj."),
                (".mlp.experts.", ".experts."),
                (
                    ".mlp.post_feedforward_layernorm_",
                    ".post_feedforward_layernorm_",
                ),
                (
                    ".mlp.pre_feedforward_layernorm_",
                    ".pre_feedforward_layernorm_",
                ),
            ],
            "glm4" => &[
                (".post_attention_layernorm.", ".post_self_attn_layernorm."),
                (".pre_feedforward_layernorm.", ".post_attention_layernorm."),
                (".post_feedforward_layernorm.", ".post_mlp_layernorm."),
                (".gate_proj.", ".gate_up_proj."),
                (".up_proj.", ".gate_up_proj."),
            ],
            "phi3" => &[
                (".q_proj.", ".qkv_proj."),
                (".k_proj.", ".qkv_proj."),
                (".v_proj.", ".qkv_proj."),
                (".gate_proj.", ".gate_up_proj."),
                (".up_proj.", ".gate_up_proj."),
            ],
            _ => &[],
        };
        // At most one rename applies to a name.
        let name = renames
            .iter()
            .find(|(ours, _)| name.contains(ours))
            .map_or(name.clone(), |(ours, theirs)| {
                name.replacen(ours, theirs, 1)
            });
        // Llama 4's multimodal class holds its text model whole, head included.
        let name = match model_type {
            "llama4" => format!("language_model.{name}"),
            "qwen3_5" | "qwen3_5_moe" => name.replacen("model.", "model.language_model.", 1),
            _ => name,
        };
        *squares.entry(name).or_insert(0.0) += norm * norm;
    }
    squares
        .into_iter()
        .map(|(name, square)| (name, f64::sqrt(square)))
        .collect()
}

/// Training computes what PyTorch computes: on every fixture model, the next-token
/// cross-entropy of its reference tokens and the gradient of every parameter equal
/// transformers' (`hf/gradients.json`, `tools/make_hf_models.py gradients`) on flex
/// and ndarray, and on wgpu (the CubeCL attention backward) for four families.
#[test]
fn loss_and_every_gradient_match_transformers() {
    let text = std::fs::read_to_string(fixture_dir().join("hf/gradients.json")).unwrap();
    let expected: serde_json::Value = serde_json::from_str(&text).unwrap();
    let expected = expected.as_object().unwrap();
    assert!(expected.len() >= 18, "{} models", expected.len());
    #[allow(unused_mut)] // without the ndarray and wgpu features, flex alone
    let mut devices: Vec<(Device, Option<&[&str]>)> = vec![(Device::flex(), None)];
    #[cfg(feature = "ndarray")]
    #[allow(deprecated)]
    devices.push((Device::ndarray(), None));
    #[cfg(feature = "wgpu")]
    devices.push((
        crate::test_utils::wgpu_device(),
        Some(&["llama", "gemma2", "gpt_oss", "deepseek_v3"]),
    ));
    for (device, only) in devices {
        for (name, reference_values) in expected {
            if only.is_some_and(|names| !names.contains(&name.as_str())) {
                continue;
            }
            let device = device.clone().autodiff();
            let (model, config) = load_causal_lm(model_dir(name), &device).unwrap();
            let prompts = rows(&reference(name).data("tokens"));
            let seq = prompts[0].len();
            let tokens = int_tensor(&prompts, &device);
            let logits = model.forward(tokens.clone().narrow(1, 0, seq - 1), None);
            // Mean next-token cross-entropy, as torch's `cross_entropy`.
            let [batch, steps, vocab] = logits.dims();
            let log_probs = log_softmax_dim(logits.reshape([batch * steps, vocab]), 1);
            let targets = tokens.narrow(1, 1, seq - 1).reshape([batch * steps, 1]);
            let loss: Tensor<1> = -log_probs.gather(1, targets).mean();
            let what = format!("{name} on {device:?}");
            let want = reference_values["loss"].as_f64().unwrap();
            let got = f64::from(loss.clone().into_scalar::<f32>());
            assert!(
                (got - want).abs() < 1e-5 * want.max(1.0),
                "{what}: loss {got} vs {want}"
            );
            let norms = gradient_norms(&model, loss, &config);
            // StableLM's per-head norms are the rows of one of ours: their squared
            // gradient norms add up.
            let mut want_norms = std::collections::BTreeMap::<String, f64>::new();
            for (key, norm) in reference_values["gradient_norms"].as_object().unwrap() {
                let norm = norm.as_f64().unwrap();
                let key = match stablelm::head_norm_row(key) {
                    Some((stacked, _)) if config.model_type == "stablelm" => stacked,
                    _ => key.clone(),
                };
                *want_norms.entry(key).or_insert(0.0) += norm * norm;
            }
            let want_norms: std::collections::BTreeMap<String, f64> = want_norms
                .into_iter()
                .map(|(key, square)| (key, square.sqrt()))
                .collect();
            let names: Vec<&String> = norms.keys().collect();
            let want_names: Vec<&String> = want_norms.keys().collect();
            assert_eq!(names, want_names, "{what}: parameters with a gradient");
            for (key, norm) in &norms {
                let want = want_norms[key];
                assert!(
                    (norm - want).abs() <= 1e-4 * want + 1e-6,
                    "{what}: gradient of {key}: norm {norm} vs {want}"
                );
            }
        }
    }
}

/// transformers' `generate(num_beams=…)` on the llama fixture (`hf/llama/beams.json`,
/// `tools/make_hf_models.py llama_beams`): the same best hypothesis and score, with
/// length penalties, repetition penalties above and below 1 (applied to each step's log
/// probabilities, as transformers applies its processors) and stop tokens that end
/// some hypotheses early.
#[test]
fn beam_search_matches_transformers_with_length_and_repetition_penalties() {
    #[derive(serde::Deserialize)]
    struct Case {
        num_beams: usize,
        length_penalty: f32,
        repetition_penalty: f32,
        stop: Option<u32>,
        prompt: Vec<u32>,
        max_new_tokens: usize,
        tokens: Vec<u32>,
        score: f32,
    }
    let text = std::fs::read_to_string(model_dir("llama").join("beams.json")).unwrap();
    let cases: Vec<Case> = serde_json::from_str(&text).unwrap();
    assert!(cases.iter().any(|case| case.repetition_penalty != 1.0));
    assert!(cases.iter().any(|case| {
        case.stop
            .is_some_and(|stop| case.tokens.last() == Some(&stop))
    }));
    for device in model_test_devices() {
        let (model, _) = load_causal_lm(model_dir("llama"), &device).unwrap();
        for case in &cases {
            let config = BeamSearchConfig::new(case.num_beams, case.max_new_tokens)
                .with_length_penalty(case.length_penalty)
                .with_repetition_penalty(case.repetition_penalty)
                .with_stop_tokens(case.stop.into_iter().collect());
            let best =
                &beam_search(&model, std::slice::from_ref(&case.prompt), &config).unwrap()[0][0];
            let what = format!(
                "{} beams, length penalty {}, repetition penalty {}, stop {:?} on {device:?}",
                case.num_beams, case.length_penalty, case.repetition_penalty, case.stop
            );
            assert_eq!(best.tokens, case.tokens, "{what}");
            assert!(
                (best.score - case.score).abs() < 1e-4,
                "{what}: {} vs {}",
                best.score,
                case.score
            );
        }
    }
}

/// The summed log probability of a continuation, from one full forward pass.
fn sequence_logprob(model: &CausalLm, prompt: &[u32], continuation: &[u32]) -> f32 {
    let device = crate::generate::LanguageModel::device(model);
    let sequence: Vec<u32> = prompt.iter().chain(continuation).copied().collect();
    let logits = model.forward(int_tensor(std::slice::from_ref(&sequence), &device), None);
    let [_, seq, vocab] = logits.dims();
    let values = logits
        .into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .unwrap();
    continuation
        .iter()
        .enumerate()
        .map(|(i, &token)| {
            let position = prompt.len() + i - 1;
            debug_assert!(position < seq);
            log_softmax(&values[position * vocab..(position + 1) * vocab])[token as usize]
        })
        .sum()
}

#[test]
fn beam_search_scores_are_length_normalized_log_probabilities_and_batching_is_transparent() {
    let device = Device::flex();
    let (model, _) = load_causal_lm(model_dir("qwen2"), &device).unwrap();
    let full = rows(&reference("qwen2").data("tokens"));
    let prompts = vec![full[0].clone(), full[1][..4].to_vec()];
    // Stop on a frequent token so that hypotheses of different lengths compete.
    let config = BeamSearchConfig::new(3, 5)
        .with_length_penalty(0.7)
        .with_early_stopping(EarlyStopping::Never)
        .with_stop_tokens(vec![full[0][3], full[1][1]]);
    let batched = beam_search(&model, &prompts, &config).unwrap();
    for (row, prompt) in prompts.iter().enumerate() {
        let alone = beam_search(&model, std::slice::from_ref(prompt), &config)
            .unwrap()
            .remove(0);
        let tokens = |hs: &[crate::generate::Hypothesis]| {
            hs.iter().map(|h| h.tokens.clone()).collect::<Vec<_>>()
        };
        assert_eq!(tokens(&batched[row]), tokens(&alone), "row {row}");
        assert_eq!(batched[row].len(), 3);
        for hypothesis in &batched[row] {
            let logprob = sequence_logprob(&model, prompt, &hypothesis.tokens);
            let expected = logprob / (hypothesis.tokens.len() as f32).powf(0.7);
            assert!(
                (hypothesis.score - expected).abs() < 1e-4,
                "score {} vs recomputed {expected}",
                hypothesis.score
            );
        }
        let scores: Vec<f32> = batched[row].iter().map(|h| h.score).collect();
        assert!(
            scores.windows(2).all(|w| w[0] >= w[1]),
            "sorted best first: {scores:?}"
        );
    }
}

/// The tensors of a safetensors file: name, dtype, shape, bytes.
type TensorList = Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)>;

/// A scratch copy of a fixture model, whose `config.json` and weights a test edits.
struct ScratchModel {
    dir: tempfile::TempDir,
}

impl ScratchModel {
    /// A copy of the fixture model `name` (every file of its folder).
    fn copy(name: &str) -> Self {
        let dir = tempfile::TempDir::with_prefix(format!("hf-{name}-")).unwrap();
        for entry in std::fs::read_dir(model_dir(name)).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
        }
        Self { dir }
    }

    fn path(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Rewrites the keys of `config.json`.
    fn edit_config(
        self,
        edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
    ) -> Self {
        let path = self.path().join(CONFIG_FILE);
        let mut config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        edit(config.as_object_mut().unwrap());
        std::fs::write(&path, serde_json::to_string_pretty(&config).unwrap()).unwrap();
        self
    }

    /// Rewrites the tensors of `model.safetensors`.
    fn edit_tensors(self, edit: impl FnOnce(&mut TensorList)) -> Self {
        let path = self.path().join(WEIGHTS_FILE);
        let bytes = std::fs::read(&path).unwrap();
        let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut tensors: TensorList = file
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
        edit(&mut tensors);
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
            .iter()
            .map(|(name, dtype, shape, data)| {
                (
                    name.clone(),
                    safetensors::tensor::TensorView::new(*dtype, shape.clone(), data).unwrap(),
                )
            })
            .collect();
        safetensors::serialize_to_file(views, None, &path).unwrap();
        self
    }

    fn load(&self) -> HfError {
        load_causal_lm(self.path(), &Device::flex()).unwrap_err()
    }
}

/// A copy of the llama fixture whose weights `edit` rewrites.
fn broken_llama(edit: impl FnOnce(&mut TensorList)) -> ScratchModel {
    ScratchModel::copy("llama").edit_tensors(edit)
}

/// The tensor `key` of `tensors`.
fn tensor_mut<'a>(
    tensors: &'a mut TensorList,
    key: &str,
) -> &'a mut (String, safetensors::Dtype, Vec<usize>, Vec<u8>) {
    tensors
        .iter_mut()
        .find(|(name, ..)| name == key)
        .unwrap_or_else(|| panic!("no tensor {key}"))
}

/// Sets the `index`-th value of an f32 tensor.
fn set_f32(tensors: &mut TensorList, key: &str, index: usize, value: f32) {
    let entry = tensor_mut(tensors, key);
    assert_eq!(entry.1, safetensors::Dtype::F32);
    entry.3[4 * index..4 * index + 4].copy_from_slice(&value.to_le_bytes());
}

/// Copies every tensor of decoder layer `from` as layer `to` (as a checkpoint with
/// more layers would hold them).
fn copy_layer(tensors: &mut TensorList, from: usize, to: usize) {
    let prefix = format!("model.layers.{from}.");
    let copies: TensorList = tensors
        .iter()
        .filter_map(|(name, dtype, shape, data)| {
            let rest = name.strip_prefix(&prefix)?;
            Some((
                format!("model.layers.{to}.{rest}"),
                *dtype,
                shape.clone(),
                data.clone(),
            ))
        })
        .collect();
    assert!(!copies.is_empty(), "layer {from} has tensors");
    tensors.extend(copies);
}

#[test]
fn missing_extra_and_misshapen_tensors_are_named() {
    let missing = broken_llama(|tensors| tensors.retain(|(name, ..)| name != "model.norm.weight"));
    let error = missing.load();
    assert!(
        matches!(&error, HfError::MissingTensor { key, expected, others: 0, .. }
            if key == "model.norm.weight" && expected == &vec![32]),
        "{error}"
    );
    assert!(error.to_string().contains("model.norm.weight"), "{error}");

    let extra = broken_llama(|tensors| {
        tensors.push((
            "model.layers.0.mlp.extra_proj.weight".into(),
            safetensors::Dtype::F32,
            vec![2],
            vec![0; 8],
        ))
    });
    let error = extra.load();
    assert!(
        matches!(&error, HfError::UnexpectedTensor { key, .. } if key == "model.layers.0.mlp.extra_proj.weight"),
        "{error}"
    );
    assert!(error.to_string().contains("model.safetensors"), "{error}");

    let misshapen = broken_llama(|tensors| {
        let entry = tensor_mut(tensors, "model.layers.1.self_attn.k_proj.weight");
        entry.2 = vec![17, 32];
        entry.3 = vec![0; 17 * 32 * 4];
    });
    let error = misshapen.load();
    assert!(
        matches!(&error, HfError::ShapeMismatch { key, expected, found, .. }
            if key == "model.layers.1.self_attn.k_proj.weight"
                && expected == &vec![16, 32] && found == &vec![17, 32]),
        "{error}"
    );
    let message = error.to_string();
    assert!(
        message.contains("[16, 32]") && message.contains("[17, 32]"),
        "{message}"
    );

    let integer = broken_llama(|tensors| {
        let entry = tensor_mut(tensors, "model.norm.weight");
        entry.1 = safetensors::Dtype::I32;
    });
    let error = integer.load();
    assert!(
        matches!(&error, HfError::UnsupportedDtype { key, .. } if key == "model.norm.weight"),
        "{error}"
    );
}

#[test]
fn config_and_directory_errors_name_the_file() {
    let dir =
        std::env::temp_dir().join(format!("burn-transformer-hf-config-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let check = |error: HfError, needle: &str| {
        let message = error.to_string();
        assert!(
            message.contains(needle),
            "`{message}` should mention `{needle}`"
        );
        message
    };

    let error = load_causal_lm(&dir, &Device::flex()).unwrap_err();
    assert!(matches!(error, HfError::Io { .. }), "{error}");
    check(error, "config.json");

    std::fs::write(dir.join(CONFIG_FILE), "{\"model_type\": \"llama\",").unwrap();
    let error = load_causal_lm(&dir, &Device::flex()).unwrap_err();
    assert!(matches!(error, HfError::Json { .. }), "{error}");

    let config = std::fs::read_to_string(model_dir("llama").join(CONFIG_FILE)).unwrap();
    std::fs::write(
        dir.join(CONFIG_FILE),
        config.replace("\"llama\"", "\"bert\""),
    )
    .unwrap();
    let message = check(
        load_causal_lm(&dir, &Device::flex()).unwrap_err(),
        "\"bert\"",
    );
    assert!(message.contains("supported: llama"), "{message}");

    std::fs::write(dir.join(CONFIG_FILE), &config).unwrap();
    let error = load_causal_lm(&dir, &Device::flex()).unwrap_err();
    assert!(matches!(error, HfError::NoWeights { .. }), "{error}");

    std::fs::write(
        dir.join(INDEX_FILE),
        "{\"weight_map\": {\"lm_head.weight\": \"../x\"}}",
    )
    .unwrap();
    let error = load_causal_lm(&dir, &Device::flex()).unwrap_err();
    assert!(
        matches!(&error, HfError::Field { field, .. } if field == "weight_map.lm_head.weight"),
        "{error}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn loading_in_f16_converts_every_parameter() {
    let device = Device::flex();
    let options = LoadOptions::default().with_dtype(burn::tensor::DType::F16);
    let (model, _, report) =
        load_causal_lm_with(model_dir("qwen2_bf16"), &device, &options).unwrap();
    assert_eq!(report, LoadReport::default());
    assert_eq!(
        model.embed_tokens.weight.val().dtype(),
        burn::tensor::DType::F16
    );
    let reference = reference("qwen2_bf16");
    let prompts = rows(&reference.data("tokens"));
    let logits = model.forward(int_tensor(&prompts, &device), None);
    assert_eq!(logits.dtype(), burn::tensor::DType::F16);
    // Half precision: agreement to f16 accuracy only.
    let diff = max_abs_diff(
        logits.cast(burn::tensor::DType::F32),
        reference.tensor("logits", &device),
    );
    assert!(diff < 0.1, "f16 logits differ by {diff}");
}

/// Every family decodes in half precision through its caches (DeepSeek's absorbed
/// latent weights keep the model's float type; the hybrid models' linear attention runs
/// its rule and keeps its state in f32), and a float type the device has no arithmetic
/// for is refused before anything loads.
#[test]
fn half_precision_models_decode_and_unsupported_types_are_refused() {
    let options = LoadOptions::default().with_dtype(burn::tensor::DType::F16);
    // The hybrid fixtures are ill-conditioned: transformers' own f16 logits differ from
    // its f32 ones by 0.25 (`qwen3_5_text`) and 0.07 (`qwen3_5_moe`).
    for (name, bound) in [
        ("deepseek_v2", 0.1),
        ("gpt_oss", 0.1),
        ("qwen3_5_text", 0.3),
        ("qwen3_5_moe", 0.3),
    ] {
        let device = Device::flex();
        let (model, _, _) = load_causal_lm_with(model_dir(name), &device, &options).unwrap();
        let reference = reference(name);
        let prompts = rows(&reference.data("tokens"));
        let logits = model.forward(int_tensor(&prompts, &device), None);
        let diff = max_abs_diff(
            logits.cast(burn::tensor::DType::F32),
            reference.tensor("logits", &device),
        );
        assert!(diff < bound, "{name}: f16 logits differ by {diff}");
        let outputs = generate(&model, &prompts, &GenerationConfig::greedy(3), |_| {}).unwrap();
        assert!(
            outputs.iter().all(|output| output.tokens.len() == 3),
            "{name}"
        );
    }
    for device in model_test_devices() {
        for dtype in [burn::tensor::DType::BF16, burn::tensor::DType::F16] {
            if device.supports_dtype(dtype) {
                continue;
            }
            let options = LoadOptions::default().with_dtype(dtype);
            let error = load_causal_lm_with(model_dir("llama"), &device, &options).unwrap_err();
            assert!(matches!(error, HfError::Unsupported { .. }), "{error}");
            assert!(error.to_string().contains("arithmetic"), "{error}");
        }
    }
}

#[test]
fn tensors_holding_nan_or_infinity_are_named_by_their_checkpoint_key() {
    let device = Device::flex();
    let (_, _, clean) =
        load_causal_lm_with(model_dir("llama"), &device, &LoadOptions::default()).unwrap();
    assert_eq!(clean, LoadReport::default());
    assert_eq!(clean.warning(), None);

    // 1e6 is finite in f32 and beyond f16's range (65504).
    let damaged = broken_llama(|tensors| {
        set_f32(tensors, "model.embed_tokens.weight", 7, f32::NAN);
        set_f32(
            tensors,
            "model.layers.1.mlp.down_proj.weight",
            0,
            f32::INFINITY,
        );
        set_f32(tensors, "model.norm.weight", 3, f32::NEG_INFINITY);
        set_f32(tensors, "model.layers.0.self_attn.o_proj.weight", 5, 1e6);
    });
    let expected = [
        "model.embed_tokens.weight",
        "model.layers.1.mlp.down_proj.weight",
        "model.norm.weight",
    ];
    let (_, _, report) =
        load_causal_lm_with(damaged.path(), &device, &LoadOptions::default()).unwrap();
    assert_eq!(report.non_finite, expected);
    let warning = report.warning().unwrap();
    assert!(
        warning.starts_with("3 tensors hold NaN or infinite values"),
        "{warning}"
    );
    for key in expected {
        assert!(warning.contains(&format!("`{key}`")), "{warning}");
    }

    let half = LoadOptions::default().with_dtype(burn::tensor::DType::F16);
    let (_, _, report) = load_causal_lm_with(damaged.path(), &device, &half).unwrap();
    assert_eq!(
        report.non_finite,
        [
            "model.embed_tokens.weight",
            "model.layers.0.self_attn.o_proj.weight",
            "model.layers.1.mlp.down_proj.weight",
            "model.norm.weight",
        ]
    );
}

#[test]
fn a_config_with_fewer_layers_than_its_checkpoint_is_an_error_for_every_family() {
    for name in [
        "llama",
        "llama_sharded",
        "mistral",
        "qwen2",
        "mixtral",
        "deepseek_v2",
        "deepseek_v3",
    ] {
        let scratch = ScratchModel::copy(name).edit_config(|config| {
            config.insert("num_hidden_layers".into(), 1.into());
            config.remove("layer_types");
            config.insert("num_nextn_predict_layers".into(), 0.into());
        });
        let error = scratch.load();
        assert!(
            matches!(
                &error,
                HfError::LayerCount {
                    configured: 1,
                    mtp_layers: 0,
                    found: 2,
                    ..
                }
            ),
            "{name}: {error}"
        );
        let message = error.to_string();
        assert!(
            message.contains("`num_hidden_layers` is 1")
                && message.contains("holds 2 layers")
                && message.contains("config.json"),
            "{name}: {message}"
        );
    }

    // The same checkpoint one layer deeper.
    let deeper = broken_llama(|tensors| copy_layer(tensors, 1, 2));
    let error = deeper.load();
    assert!(
        matches!(
            &error,
            HfError::LayerCount {
                configured: 2,
                found: 3,
                ..
            }
        ),
        "{error}"
    );
}

/// DeepSeek-V3 checkpoints may hold `num_nextn_predict_layers` multi-token-prediction
/// layers after the decoder layers: a checkpoint without them loads a model without
/// multi-token prediction, an incomplete one names what is missing, and a layer more
/// than declared is an error.
#[test]
fn deepseek_v3_multi_token_prediction_layers_are_checked() {
    let with_layers = |label_layers: &[usize]| {
        let layers = label_layers.to_vec();
        ScratchModel::copy("deepseek_v3").edit_tensors(move |tensors| {
            for &layer in &layers {
                copy_layer(tensors, 1, layer);
                // The MTP layer's own projection, which decoder layers lack.
                tensors.push((
                    format!("model.layers.{layer}.eh_proj.weight"),
                    safetensors::Dtype::F32,
                    vec![32, 64],
                    vec![0; 32 * 64 * 4],
                ));
            }
        })
    };
    let device = Device::flex();
    let (model, config) = load_causal_lm(model_dir("deepseek_v3"), &device).unwrap();
    assert_eq!((config.mtp_layers, model.mtp_depth()), (1, 0));

    let error = with_layers(&[2]).load();
    assert!(
        matches!(&error, HfError::MissingTensor { key, .. } if key.contains("model.layers.2.")
            && ["enorm", "hnorm", "shared_head"].iter().any(|part| key.contains(part))),
        "{error}"
    );

    let error = with_layers(&[2, 3]).load();
    assert!(
        matches!(
            &error,
            HfError::LayerCount {
                configured: 2,
                mtp_layers: 1,
                found: 4,
                ..
            }
        ),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .contains("`num_nextn_predict_layers` is 1"),
        "{error}"
    );
}
