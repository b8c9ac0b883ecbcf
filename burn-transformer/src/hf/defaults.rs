//! The defaults of transformers' configuration classes: a key that a `config.json`
//! leaves out takes the value that the family's class gives it, so that a file saved
//! with only the keys that differ from those defaults (transformers 4 saved them so)
//! builds the model transformers builds.
//!
//! A key written as `null` stays null: transformers reads it as `None` too, which for
//! some keys differs from leaving it out (Mistral's `sliding_window` is 4096 when
//! missing and no window when null).

use serde_json::{Map, Value, json};

use super::model_type::ModelType;

/// `config` with every key it leaves out filled from the configuration class of
/// `family` (transformers 5), the model's sizes and special tokens included (Gemma-3's
/// multimodal checkpoints describe their text model by the keys that differ from
/// `Gemma3TextConfig`'s only) after the keys a file may give under other names
/// (ERNIE-4.5-MoE's `num_experts`, InternLM3's `qkv_bias`, GPT-2's `n_embd`), and the
/// defaults those classes derive: GPT-2's and GPT-J's feed-forward width (from
/// `n_inner`), GPT-Neo's, Falcon's, BLOOM's and MPT's (4 times the width), GPT-J's
/// rotated part of each head (from `rotary_dim`), the layer types of Gemma-2,
/// VaultGemma, Gemma-3 (from `sliding_window_pattern`), Gemma-4, OLMo-3, SmolLM3, CWM,
/// Granite-SWA, gpt-oss and Llama 4, SmolLM3's and Llama 4's `no_rope_layers`, GLM-4.7-Flash's and
/// EXAONE-MoE's `mlp_layer_types`, MiniMax-M2's `partial_rotary_factor` (from
/// `rotary_dim`), Hunyuan's NTK-alpha base, Youtu's initializer scale, MiniCPM3's value
/// head width, and Phi-3's old names of LongRoPE (`su`, `yarn`), and the rotary
/// embedding where the file has neither `rope_parameters` nor `rope_scaling`.
pub(crate) fn with_family_defaults(family: ModelType, config: &Value) -> Value {
    let mut filled = config.clone();
    // Anything but an object is refused by the readers, naming it.
    let Value::Object(object) = &mut filled else {
        return filled;
    };
    let Value::Object(defaults) = class_defaults(family) else {
        unreachable!("the defaults are a JSON object");
    };
    // A key the file gives under another name is the key's, not the class default.
    for &(given, read) in attribute_map(family) {
        if !object.contains_key(read)
            && let Some(value) = object.remove(given)
        {
            object.insert(read.into(), value);
        }
    }
    // Whether the file gives the feed-forward's width: some classes derive it when
    // it is null or left out, before the class's sizes would fill it.
    let width_given = object
        .get("intermediate_size")
        .is_some_and(|width| !width.is_null());
    let has_rope = object.contains_key("rope_parameters") || object.contains_key("rope_scaling");
    for (key, value) in defaults {
        if key == "rope_scaling" && has_rope {
            continue;
        }
        object.entry(key).or_insert(value);
    }
    // GPT-2's and GPT-J's feed-forward is `n_inner` wide, or four times the width when
    // null.
    if matches!(
        family,
        ModelType::Gpt2 | ModelType::GptBigcode | ModelType::Gptj | ModelType::Codegen
    ) {
        let width = match object.get("n_inner") {
            Some(inner) if !inner.is_null() => Some(inner.clone()),
            _ => object
                .get("hidden_size")
                .and_then(Value::as_u64)
                .map(|hidden| json!(4 * hidden)),
        };
        if let Some(width) = width {
            object.insert("intermediate_size".into(), width);
        }
    }
    // A feed-forward four times the width: GPT-Neo's and Falcon's when their width
    // (`intermediate_size`, `ffn_hidden_size`) is null or left out, BLOOM's and MPT's
    // always (transformers' MPT does not read `expansion_ratio`).
    let four_times_the_width = match family {
        ModelType::GptNeo | ModelType::Falcon => !width_given,
        ModelType::Bloom | ModelType::Mpt => true,
        _ => false,
    };
    if four_times_the_width && let Some(hidden) = object.get("hidden_size").and_then(Value::as_u64)
    {
        object.insert("intermediate_size".into(), json!(4 * hidden));
    }
    // Falcon's key/value heads are `num_kv_heads` in the new architecture, else one
    // (`multi_query`) or one per query head.
    if family == ModelType::Falcon {
        let flag =
            |key: &str, default: bool| object.get(key).and_then(Value::as_bool).unwrap_or(default);
        let heads = object.get("num_attention_heads").and_then(Value::as_u64);
        let kv_heads = match (
            flag("new_decoder_architecture", false),
            flag("multi_query", true),
        ) {
            (true, _) => object.get("num_kv_heads").and_then(Value::as_u64).or(heads),
            (false, true) => Some(1),
            (false, false) => heads,
        };
        if let Some(kv_heads) = kv_heads {
            object.insert("num_key_value_heads".into(), json!(kv_heads));
        }
    }
    // GPT-BigCode has one key/value head with `multi_query`, else one per query head.
    if family == ModelType::GptBigcode
        && let Some(heads) = object.get("num_attention_heads").and_then(Value::as_u64)
    {
        let multi_query = object
            .get("multi_query")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        let kv_heads = if multi_query { 1 } else { heads };
        object.insert("num_key_value_heads".into(), json!(kv_heads));
    }
    // GPT-J and CodeGen rotate the first `rotary_dim` features of each head (all when
    // null).
    if matches!(family, ModelType::Gptj | ModelType::Codegen)
        && let (Some(hidden), Some(heads)) = (
            object.get("hidden_size").and_then(Value::as_f64),
            object.get("num_attention_heads").and_then(Value::as_f64),
        )
        && heads > 0.0
    {
        let factor = match object.get("rotary_dim").and_then(Value::as_f64) {
            Some(rotary) => rotary * heads / hidden,
            None => 1.0,
        };
        object.insert("partial_rotary_factor".into(), json!(factor));
    }
    if family == ModelType::Phi3 {
        for key in ["rope_scaling", "rope_parameters"] {
            if let Some(Value::Object(rope)) = object.get_mut(key) {
                for name in ["type", "rope_type"] {
                    if let Some(kind) = rope.get_mut(name)
                        && matches!(kind.as_str(), Some("su" | "yarn"))
                    {
                        *kind = json!("longrope");
                    }
                }
            }
        }
    }
    if family.is_hunyuan() {
        fix_ntk_alpha(object);
    }
    // MiniCPM3's value heads are `hidden_size / num_attention_heads` wide unless set.
    if family == ModelType::MiniCpm3
        && object.get("v_head_dim").is_none_or(Value::is_null)
        && let (Some(hidden), Some(heads)) = (
            object.get("hidden_size").and_then(Value::as_u64),
            object.get("num_attention_heads").and_then(Value::as_u64),
        )
        && heads > 0
    {
        object.insert("v_head_dim".into(), json!(hidden / heads));
    }
    // Youtu's initializer scale follows the width, `2 / √(5 · hidden_size)`.
    if family == ModelType::Youtu
        && config.get("initializer_range").is_none_or(Value::is_null)
        && let Some(hidden) = object.get("hidden_size").and_then(Value::as_f64)
        && hidden > 0.0
    {
        object.insert(
            "initializer_range".into(),
            json!(2.0 / (5.0 * hidden).sqrt()),
        );
    }
    // MiniMax-M2's files give the rotated width as `rotary_dim`.
    let has_factor = object.contains_key("partial_rotary_factor")
        || object
            .get("rope_parameters")
            .is_some_and(|rope| rope.get("partial_rotary_factor").is_some());
    if family == ModelType::MinimaxM2
        && !has_factor
        && let (Some(rotary), Some(head)) = (
            object.get("rotary_dim").and_then(Value::as_f64),
            object.get("head_dim").and_then(Value::as_f64),
        )
    {
        object.insert("partial_rotary_factor".into(), json!(rotary / head));
    }
    // SmolLM3's and Llama 4's classes derive the list when it is null too, Llama 4's
    // when it is empty.
    let empty = |layers: &Value| match layers {
        Value::Null => true,
        Value::Array(layers) => layers.is_empty() && family == ModelType::Llama4Text,
        _ => false,
    };
    if matches!(family, ModelType::Smollm3 | ModelType::Llama4Text)
        && object.get("no_rope_layers").is_none_or(empty)
        && let Some(no_rope_layers) = default_no_rope_layers(object)
    {
        object.insert("no_rope_layers".into(), no_rope_layers);
    }
    // GLM-4.7-Flash: a dense first layer, then experts; EXAONE-MoE:
    // `first_k_dense_replace` dense layers, then experts.
    let dense_first = match family {
        ModelType::Glm4MoeLite => Some(1),
        ModelType::ExaoneMoe => object.get("first_k_dense_replace").and_then(Value::as_u64),
        _ => None,
    };
    if let Some(dense_first) = dense_first
        && !object.contains_key("mlp_layer_types")
        && let Some(layers) = object.get("num_hidden_layers").and_then(Value::as_u64)
    {
        let kinds: Vec<&str> = (0..layers)
            .map(|layer| {
                if layer < dense_first {
                    "dense"
                } else {
                    "sparse"
                }
            })
            .collect();
        object.insert("mlp_layer_types".into(), json!(kinds));
    }
    if !object.contains_key("layer_types")
        && let Some(layer_types) = default_layer_types(family, object)
    {
        object.insert("layer_types".into(), layer_types);
    }
    filled
}

/// The names under which a file of `family` may give a key that our readers read
/// under another, `(given, read)`: the common names a configuration class maps to keys
/// of its own (transformers' `attribute_map`: ERNIE-4.5-MoE's `num_experts` is its
/// `moe_num_experts`), and GPT-2's own names of the common keys (`n_embd` is
/// `hidden_size`). Where the file has both, the read name wins.
fn attribute_map(family: ModelType) -> &'static [(&'static str, &'static str)] {
    match family {
        ModelType::Gpt2 | ModelType::GptBigcode | ModelType::Gptj | ModelType::Codegen => &[
            ("n_embd", "hidden_size"),
            ("n_layer", "num_hidden_layers"),
            ("n_head", "num_attention_heads"),
            ("n_positions", "max_position_embeddings"),
            ("layer_norm_epsilon", "layer_norm_eps"),
            ("activation_function", "hidden_act"),
        ],
        ModelType::Bloom => &[
            ("n_embed", "hidden_size"),
            ("n_layer", "num_hidden_layers"),
            ("n_head", "num_attention_heads"),
            ("layer_norm_epsilon", "layer_norm_eps"),
        ],
        ModelType::GptNeo => &[
            ("num_heads", "num_attention_heads"),
            ("num_layers", "num_hidden_layers"),
            ("layer_norm_epsilon", "layer_norm_eps"),
            ("activation_function", "hidden_act"),
        ],
        ModelType::Mpt => &[
            ("d_model", "hidden_size"),
            ("n_layers", "num_hidden_layers"),
            ("n_heads", "num_attention_heads"),
            ("layer_norm_epsilon", "layer_norm_eps"),
            ("max_seq_len", "max_position_embeddings"),
        ],
        ModelType::Falcon => &[
            ("n_embed", "hidden_size"),
            ("ffn_hidden_size", "intermediate_size"),
            ("layer_norm_epsilon", "layer_norm_eps"),
            ("activation", "hidden_act"),
        ],
        ModelType::Opt => &[
            ("ffn_dim", "intermediate_size"),
            ("activation_function", "hidden_act"),
            ("init_std", "initializer_range"),
        ],
        // GPT-NeoX's rotary keys of transformers 4.
        ModelType::GptNeox => &[
            ("rotary_pct", "partial_rotary_factor"),
            ("rotary_emb_base", "rope_theta"),
        ],
        ModelType::Ernie45Moe => &[
            ("num_experts", "moe_num_experts"),
            ("num_experts_per_tok", "moe_k"),
        ],
        ModelType::InternLm3 => &[("qkv_bias", "attention_bias"), ("bias", "mlp_bias")],
        _ => &[],
    }
}

/// The keys the configuration class of `family` sets without being told (transformers
/// 5.24), among those our readers read. `rope_scaling` is the rotary embedding of a
/// file that names none.
fn class_defaults(family: ModelType) -> Value {
    let mut defaults = json!({
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": false,
        "attention_bias": false,
        "initializer_range": 0.02,
    });
    // The classes of Gemma-2 and later name the activation `hidden_activation` and
    // have no `hidden_act`.
    if !family.is_gemma2_or_later() {
        defaults["hidden_act"] = json!("silu");
    }
    let own = match family {
        ModelType::Llama => json!({"mlp_bias": false}),
        ModelType::InternLm3 => json!({
            "num_key_value_heads": 2, "head_dim": 128, "rms_norm_eps": 1e-5, "mlp_bias": false
        }),
        ModelType::Mistral => json!({"num_key_value_heads": 8, "sliding_window": 4096}),
        ModelType::Ministral => json!({"num_key_value_heads": 8, "sliding_window": 4096}),
        ModelType::Ministral3 => json!({
            "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-5,
            "rope_scaling": {
                "rope_type": "yarn", "rope_theta": 1_000_000.0, "factor": 16.0,
                "original_max_position_embeddings": 16384, "beta_fast": 32.0,
                "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0,
                "llama_4_scaling_beta": 0.1
            }
        }),
        ModelType::Qwen2 => json!({
            "num_key_value_heads": 32, "use_sliding_window": false, "sliding_window": 4096,
            "max_window_layers": 28
        }),
        ModelType::Qwen3 => json!({
            "num_key_value_heads": 32, "head_dim": 128, "use_sliding_window": false,
            "sliding_window": 4096, "max_window_layers": 28
        }),
        ModelType::Olmo => json!({}),
        ModelType::Olmo2 => json!({"rms_norm_eps": 1e-5}),
        ModelType::Olmo3 => json!({
            "rms_norm_eps": 1e-5, "sliding_window": 4096, "rope_theta": 500_000.0
        }),
        ModelType::Smollm3 => json!({
            "num_key_value_heads": 4, "rope_theta": 2_000_000.0, "mlp_bias": false,
            "tie_word_embeddings": true, "use_sliding_window": false,
            "no_rope_layer_interval": 4
        }),
        ModelType::Phi3 => json!({
            "rms_norm_eps": 1e-5, "original_max_position_embeddings": 4096
        }),
        ModelType::Cwm => json!({
            "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-5,
            "mlp_bias": false, "sliding_window": 8192,
            "eos_token_id": [128001, 128008, 128009],
            "rope_scaling": {
                "rope_type": "llama3", "rope_theta": 1_000_000.0, "factor": 16.0,
                "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8192
            }
        }),
        ModelType::GptBigcode => json!({
            "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-5,
            "tie_word_embeddings": true, "scale_attn_weights": true, "multi_query": true,
            "add_cross_attention": false
        }),
        ModelType::Gpt2 => json!({
            "hidden_act": "gelu_new", "layer_norm_eps": 1e-5, "tie_word_embeddings": true,
            "scale_attn_weights": true, "scale_attn_by_inverse_layer_idx": false,
            "add_cross_attention": false
        }),
        ModelType::GptNeo => json!({
            "hidden_act": "gelu_new", "layer_norm_eps": 1e-5, "tie_word_embeddings": true,
            "window_size": 256, "attention_types": [[["global", "local"], 12]]
        }),
        ModelType::Gptj | ModelType::Codegen => json!({
            "hidden_act": "gelu_new", "layer_norm_eps": 1e-5, "rotary_dim": 64
        }),
        ModelType::Falcon => json!({
            "hidden_act": "gelu", "layer_norm_eps": 1e-5, "tie_word_embeddings": true,
            "new_decoder_architecture": false, "multi_query": true, "parallel_attn": true,
            "bias": false, "alibi": false
        }),
        // BLOOM has no activation key: its GELU is the tanh approximation.
        ModelType::Bloom => json!({
            "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-5,
            "tie_word_embeddings": true, "apply_residual_connection_post_layernorm": false
        }),
        // MPT has no activation key: its GELU is exact.
        ModelType::Mpt => json!({
            "hidden_act": "gelu", "layer_norm_eps": 1e-5, "tie_word_embeddings": true,
            "no_bias": true, "expansion_ratio": 4
        }),
        // BioGPT's `layer_norm_eps` is unread: its LayerNorms keep PyTorch's 1e-5.
        ModelType::Biogpt => json!({
            "hidden_act": "gelu", "layer_norm_eps": 1e-12, "scale_embedding": true,
            "tie_word_embeddings": true
        }),
        ModelType::Opt => json!({
            "hidden_act": "relu", "do_layer_norm_before": true, "enable_bias": true,
            "layer_norm_elementwise_affine": true, "tie_word_embeddings": true,
            "_remove_final_layer_norm": false
        }),
        ModelType::GptNeox => json!({
            "hidden_act": "gelu", "layer_norm_eps": 1e-5, "partial_rotary_factor": 0.25,
            "use_parallel_residual": true, "attention_bias": true
        }),
        ModelType::Phi => json!({
            "hidden_act": "gelu_new", "layer_norm_eps": 1e-5, "partial_rotary_factor": 0.5,
            "qk_layernorm": false
        }),
        ModelType::Persimmon => json!({
            "hidden_act": "relu2", "layer_norm_eps": 1e-5, "partial_rotary_factor": 0.5,
            "qk_layernorm": true
        }),
        ModelType::StableLm => json!({
            "num_key_value_heads": 32, "layer_norm_eps": 1e-5, "partial_rotary_factor": 0.25,
            "use_qkv_bias": false, "qk_layernorm": false, "use_parallel_residual": false
        }),
        ModelType::Nemotron => json!({
            "hidden_act": "relu2", "norm_eps": 1e-5, "partial_rotary_factor": 0.5,
            "initializer_range": 0.0134, "mlp_bias": false
        }),
        ModelType::Glm => json!({
            "num_key_value_heads": 2, "head_dim": 128, "rms_norm_eps": 1.5625e-7,
            "attention_bias": true, "partial_rotary_factor": 0.5,
            "eos_token_id": [151329, 151336, 151338]
        }),
        ModelType::Jais2 => json!({
            "hidden_act": "relu2", "layer_norm_eps": 1e-5, "attention_bias": true,
            "mlp_bias": true
        }),
        // `v_head_dim` is derived from the width below.
        ModelType::MiniCpm3 => json!({
            "num_key_value_heads": 40, "rms_norm_eps": 1e-5, "tie_word_embeddings": true,
            "initializer_range": 0.1, "kv_lora_rank": 256, "q_lora_rank": 768,
            "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "scale_emb": 12,
            "scale_depth": 1.4, "dim_model_base": 256, "mlp_bias": false
        }),
        ModelType::Youtu => json!({
            "num_key_value_heads": 16, "kv_lora_rank": 512, "q_lora_rank": 1536,
            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
            "rope_interleave": true, "tie_word_embeddings": true
        }),
        ModelType::Glm4 => json!({
            "num_key_value_heads": 2, "head_dim": 128, "rms_norm_eps": 1.5625e-7,
            "attention_bias": true, "partial_rotary_factor": 0.5,
            "eos_token_id": [151329, 151336, 151338]
        }),
        ModelType::SeedOss => json!({
            "num_key_value_heads": 8, "head_dim": 128, "attention_bias": true,
            "attention_out_bias": false, "mlp_bias": false
        }),
        ModelType::Ernie45 => json!({
            "num_key_value_heads": 2, "head_dim": 128, "use_bias": false,
            "tie_word_embeddings": true, "rms_norm_eps": 1e-5, "rope_theta": 500_000.0
        }),
        ModelType::Exaone4 => json!({
            "num_key_value_heads": 32, "rms_norm_eps": 1e-5, "sliding_window": 4096,
            "sliding_window_pattern": 4
        }),
        ModelType::ExaoneMoe => json!({
            "num_key_value_heads": 32, "rms_norm_eps": 1e-5, "sliding_window": 4096,
            "sliding_window_pattern": 4, "first_k_dense_replace": 1,
            "moe_intermediate_size": 1024, "num_experts": 64, "num_experts_per_tok": 8,
            "num_shared_experts": 1, "norm_topk_prob": true, "routed_scaling_factor": 2.5,
            "n_group": 1, "topk_group": 1
        }),
        ModelType::Cohere => json!({
            "layer_norm_eps": 1e-5, "logit_scale": 0.0625, "use_qk_norm": false,
            "tie_word_embeddings": true, "rope_theta": 500_000.0
        }),
        ModelType::Cohere2 => json!({
            "layer_norm_eps": 1e-5, "logit_scale": 0.0625, "tie_word_embeddings": true,
            "head_dim": 128, "sliding_window": 4096, "sliding_window_pattern": 4
        }),
        ModelType::GraniteMoe | ModelType::GraniteMoeShared => json!({
            "embedding_multiplier": 1.0, "logits_scaling": 1.0, "residual_multiplier": 1.0,
            "attention_multiplier": 1.0, "num_local_experts": 8, "num_experts_per_tok": 2,
            "router_aux_loss_coef": 0.001, "shared_intermediate_size": 0
        }),
        ModelType::Granite => json!({
            "mlp_bias": false, "embedding_multiplier": 1.0, "logits_scaling": 1.0,
            "residual_multiplier": 1.0, "attention_multiplier": 1.0
        }),
        // Its attention scale is head_dim^-½ unless `attention_multiplier` is set.
        ModelType::HyperClovaX => json!({
            "mlp_bias": false, "embedding_multiplier": 1.0, "logits_scaling": 1.0,
            "residual_multiplier": 1.0, "use_post_norm": true
        }),
        ModelType::GraniteSwa => json!({
            "num_key_value_heads": 4, "rms_norm_eps": 1e-5, "tie_word_embeddings": true,
            "sliding_window": 128, "mlp_bias": false, "embedding_multiplier": 1.0,
            "logits_scaling": 1.0, "residual_multiplier": 1.0, "attention_multiplier": 1.0
        }),
        ModelType::Arcee => json!({
            "hidden_act": "relu2", "rms_norm_eps": 1e-5, "mlp_bias": false
        }),
        ModelType::Apertus => json!({
            "hidden_act": "xielu", "rms_norm_eps": 1e-5,
            "rope_scaling": {
                "rope_type": "llama3", "rope_theta": 12_000_000.0, "factor": 8.0,
                "original_max_position_embeddings": 8192, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0
            }
        }),
        ModelType::NanoChat => json!({"hidden_act": "relu2", "final_logit_softcapping": 15.0}),
        ModelType::Helium => json!({
            "num_key_value_heads": 20, "head_dim": 128, "rms_norm_eps": 1e-8, "mlp_bias": false
        }),
        ModelType::Starcoder2 => json!({
            "num_key_value_heads": 2, "hidden_act": "gelu_pytorch_tanh", "norm_epsilon": 1e-5,
            "use_bias": true, "tie_word_embeddings": true, "initializer_range": 0.018042,
            "sliding_window": null
        }),
        ModelType::Ernie45Moe => json!({
            "num_key_value_heads": 4, "use_bias": false, "tie_word_embeddings": true,
            "rms_norm_eps": 1e-5, "rope_theta": 500_000.0, "moe_intermediate_size": 1536,
            "moe_k": 6, "moe_num_experts": 64, "moe_num_shared_experts": 2,
            "moe_layer_start_index": 1, "moe_layer_end_index": -1, "moe_layer_interval": 1,
            "router_aux_loss_coef": 0.001
        }),
        ModelType::HunyuanV1Dense => json!({"rms_norm_eps": 1e-5}),
        ModelType::HunyuanV1Moe => json!({"rms_norm_eps": 1e-5, "num_experts": 1, "moe_topk": 1}),
        ModelType::Gemma => json!({
            "num_key_value_heads": 16, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
            "tie_word_embeddings": true
        }),
        ModelType::Gemma2 | ModelType::VaultGemma => json!({
            "num_key_value_heads": 4, "head_dim": 256,
            "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": true,
            "query_pre_attn_scalar": 256, "sliding_window": 4096,
            "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0
        }),
        ModelType::Gemma3Text => json!({
            "num_key_value_heads": 4, "head_dim": 256,
            "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": true,
            "query_pre_attn_scalar": 256, "sliding_window": 4096,
            // The full layers' base; the sliding layers' is `rope_local_base_freq`.
            "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0
        }),
        ModelType::Gemma4Text => json!({
            "num_key_value_heads": 4, "head_dim": 256,
            "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": true,
            "sliding_window": 512, "attention_k_eq_v": false, "num_kv_shared_layers": 0,
            "enable_moe_block": false, "use_double_wide_mlp": false,
            "hidden_size_per_layer_input": 256, "vocab_size_per_layer_input": 262_144,
            "rope_scaling": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                "full_attention": {
                    "rope_type": "proportional", "partial_rotary_factor": 0.25,
                    "rope_theta": 1_000_000.0
                }
            }
        }),
        ModelType::Mixtral => json!({
            "rms_norm_eps": 1e-5, "num_key_value_heads": 8, "rope_theta": 1_000_000.0,
            "num_local_experts": 8, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.001
        }),
        ModelType::FlexOlmo => json!({
            "num_experts": 7, "num_experts_per_tok": 5, "norm_topk_prob": false,
            "router_aux_loss_coef": 0.01, "rope_theta": 500_000.0
        }),
        ModelType::Olmoe => json!({
            "rms_norm_eps": 1e-5, "num_experts": 64, "num_experts_per_tok": 8,
            "norm_topk_prob": false, "router_aux_loss_coef": 0.01
        }),
        ModelType::Qwen2Moe => json!({
            "num_key_value_heads": 16, "use_sliding_window": false, "sliding_window": 4096,
            "max_window_layers": 28, "qkv_bias": true, "num_experts": 60,
            "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
            "shared_expert_intermediate_size": 5632, "decoder_sparse_step": 1,
            "norm_topk_prob": false, "router_aux_loss_coef": 0.001
        }),
        ModelType::Qwen3Moe => json!({
            "num_key_value_heads": 4, "use_sliding_window": false, "sliding_window": 4096,
            "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
            "decoder_sparse_step": 1, "norm_topk_prob": false, "router_aux_loss_coef": 0.001
        }),
        ModelType::Glm4Moe => json!({
            "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "partial_rotary_factor": 0.5,
            "use_qk_norm": false, "n_routed_experts": 128, "n_shared_experts": 1,
            "moe_intermediate_size": 1408, "num_experts_per_tok": 8, "n_group": 1,
            "topk_group": 1, "routed_scaling_factor": 1.0, "norm_topk_prob": true,
            "first_k_dense_replace": 1, "num_nextn_predict_layers": 1
        }),
        ModelType::Glm4MoeLite => json!({
            "num_key_value_heads": 20, "rms_norm_eps": 1e-5, "kv_lora_rank": 512,
            "q_lora_rank": 768, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64,
            "v_head_dim": 256, "rope_interleave": true, "n_routed_experts": 64,
            "n_shared_experts": 1, "moe_intermediate_size": 1536, "num_experts_per_tok": 4,
            "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.8,
            "norm_topk_prob": true, "num_nextn_predict_layers": 1
        }),
        ModelType::Dots1 => json!({
            "num_key_value_heads": 32, "moe_intermediate_size": 1408, "n_group": 1,
            "topk_group": 1, "first_k_dense_replace": 0, "norm_topk_prob": false,
            "routed_scaling_factor": 1.0, "sliding_window": 4096, "max_window_layers": 62
        }),
        // Every layer is sparse: the dense width (a key its class does not have) is
        // never used.
        ModelType::SolarOpen => json!({
            "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-5,
            "rope_theta": 1_000_000.0, "intermediate_size": 1280,
            "moe_intermediate_size": 1280, "num_experts_per_tok": 8, "n_shared_experts": 1,
            "n_routed_experts": 128, "routed_scaling_factor": 1.0, "n_group": 1,
            "topk_group": 1, "norm_topk_prob": true
        }),
        ModelType::MinimaxM2 => json!({
            "num_key_value_heads": 8, "head_dim": 128, "rope_theta": 5_000_000.0,
            "num_local_experts": 256, "num_experts_per_tok": 8, "router_aux_loss_coef": 0.001
        }),
        ModelType::GptOss => json!({
            "rms_norm_eps": 1e-5, "attention_bias": true, "num_key_value_heads": 8,
            "head_dim": 64, "sliding_window": 128, "num_local_experts": 128,
            "num_experts_per_tok": 4, "swiglu_alpha": 1.702, "swiglu_limit": 7.0,
            "router_aux_loss_coef": 0.001, "rope_theta": 150_000.0,
            "rope_scaling": {
                "rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": false, "original_max_position_embeddings": 4096
            }
        }),
        ModelType::DeepseekV2 => json!({
            "mlp_bias": false, "kv_lora_rank": 512, "q_lora_rank": 1536,
            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
            "n_routed_experts": 64, "n_shared_experts": 2, "moe_intermediate_size": 1407,
            "routed_scaling_factor": 1.0, "topk_method": "greedy", "norm_topk_prob": false,
            "first_k_dense_replace": 0
        }),
        ModelType::Llama4Text => json!({
            "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-5,
            "intermediate_size_mlp": 16384, "num_local_experts": 16,
            "num_experts_per_tok": 1, "interleave_moe_layer_step": 1, "use_qk_norm": true,
            "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0,
            "no_rope_layer_interval": 4, "attention_chunk_size": 8192,
            "attn_temperature_tuning": true, "floor_scale": 8192, "attn_scale": 0.1,
            "rope_theta": 500_000.0
        }),
        ModelType::Qwen3Next => json!({
            "num_key_value_heads": 2, "head_dim": 256, "rms_norm_eps": 1e-6,
            "partial_rotary_factor": 0.25, "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 128, "linear_value_head_dim": 128,
            "linear_num_key_heads": 16, "linear_num_value_heads": 32,
            "full_attention_interval": 4, "decoder_sparse_step": 1,
            "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
            "num_experts_per_tok": 10, "num_experts": 512, "norm_topk_prob": true,
            "router_aux_loss_coef": 0.001, "mlp_only_layers": []
        }),
        ModelType::Qwen35Text => json!({
            "num_key_value_heads": 4, "head_dim": 256, "rms_norm_eps": 1e-6,
            "partial_rotary_factor": 0.25, "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 128, "linear_value_head_dim": 128,
            "linear_num_key_heads": 16, "linear_num_value_heads": 32,
            "full_attention_interval": 4
        }),
        // Every layer is sparse: the dense width (a key its class does not have) is
        // never used.
        ModelType::Qwen35Moe => json!({
            "num_key_value_heads": 2, "head_dim": 256, "rms_norm_eps": 1e-6,
            "partial_rotary_factor": 0.25, "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 128, "linear_value_head_dim": 128,
            "linear_num_key_heads": 16, "linear_num_value_heads": 32,
            "full_attention_interval": 4, "intermediate_size": 512,
            "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
            "num_experts_per_tok": 8, "num_experts": 256, "router_aux_loss_coef": 0.001
        }),
        ModelType::Mistral4 => json!({
            "num_key_value_heads": 32, "n_shared_experts": 1, "n_routed_experts": 128,
            "routed_scaling_factor": 1.0, "kv_lora_rank": 256, "q_lora_rank": 1024,
            "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 64,
            "moe_intermediate_size": 2048, "n_group": 1, "topk_group": 1,
            "num_experts_per_tok": 4, "first_k_dense_replace": 0, "norm_topk_prob": true,
            "rope_interleave": true,
            "rope_scaling": {
                "rope_type": "yarn", "rope_theta": 10000.0, "factor": 128.0,
                "original_max_position_embeddings": 8192, "beta_fast": 32.0, "beta_slow": 1.0,
                "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.1
            }
        }),
        ModelType::DeepseekV3 => json!({
            "num_key_value_heads": 128, "kv_lora_rank": 512, "q_lora_rank": 1536,
            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
            "rope_interleave": true, "n_routed_experts": 256, "n_shared_experts": 1,
            "moe_intermediate_size": 2048, "num_experts_per_tok": 8, "n_group": 8,
            "topk_group": 4, "routed_scaling_factor": 2.5, "norm_topk_prob": true,
            "first_k_dense_replace": 3, "num_nextn_predict_layers": 1
        }),
    };
    if let (Value::Object(defaults), Value::Object(own), Value::Object(sizes)) =
        (&mut defaults, own, sizes_and_tokens(family))
    {
        defaults.extend(own);
        defaults.extend(sizes);
        // Phi's and Persimmon's classes have no `attention_bias`: their projections
        // always have biases, and a file without the key asks for nothing.
        if matches!(family, ModelType::Phi | ModelType::Persimmon) {
            defaults.remove("attention_bias");
        }
    }
    defaults
}

/// The sizes and special tokens of the configuration class of `family` (the model it
/// describes by default: LLaMA-7B's shape for `LlamaConfig`, Gemma-2 2B's for
/// `Gemma2Config`, …); a token id the class leaves unset is not filled.
fn sizes_and_tokens(family: ModelType) -> Value {
    // vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
    // max_position_embeddings
    let sizes = match family {
        ModelType::Llama
        | ModelType::Granite
        | ModelType::HyperClovaX
        | ModelType::GraniteMoe
        | ModelType::GraniteMoeShared => [32000, 4096, 11008, 32, 32, 2048],
        ModelType::Mistral | ModelType::Mixtral => [32000, 4096, 14336, 32, 32, 131072],
        ModelType::Ministral => [32000, 4096, 14336, 32, 32, 131072],
        ModelType::Ministral3 => [131072, 4096, 14336, 34, 32, 262144],
        ModelType::Qwen2 | ModelType::Qwen3 => [151936, 4096, 22016, 32, 32, 32768],
        ModelType::Olmo | ModelType::Olmo2 | ModelType::Olmo3 => [50304, 4096, 11008, 32, 32, 2048],
        ModelType::Smollm3 => [128256, 2048, 11008, 36, 16, 32768],
        ModelType::Phi3 => [32064, 3072, 8192, 32, 32, 4096],
        ModelType::Glm | ModelType::Glm4 => [151552, 4096, 13696, 40, 32, 131072],
        ModelType::Cwm => [128256, 6144, 21504, 64, 48, 131072],
        ModelType::GraniteSwa => [100352, 2560, 8192, 24, 20, 8192],
        ModelType::InternLm3 => [128512, 4096, 10240, 48, 32, 32768],
        ModelType::Gpt2 | ModelType::GptBigcode => [50257, 768, 3072, 12, 12, 1024],
        ModelType::Gptj | ModelType::Codegen => [50400, 4096, 16384, 28, 16, 2048],
        // GPT-Neo's `intermediate_size` is null: 4 times the width (derived above).
        ModelType::GptNeo => [50257, 2048, 8192, 24, 16, 2048],
        ModelType::GptNeox => [50432, 6144, 24576, 44, 64, 2048],
        ModelType::Opt => [50272, 768, 3072, 12, 12, 2048],
        ModelType::Biogpt => [42384, 1024, 4096, 24, 16, 1024],
        ModelType::Falcon => [65024, 4544, 18176, 32, 71, 2048],
        // BLOOM's class has no positions size (ALiBi has no table); this one is unread.
        ModelType::Bloom => [250880, 64, 256, 2, 8, 2048],
        ModelType::Mpt => [50368, 2048, 8192, 24, 16, 2048],
        ModelType::Phi => [51200, 2048, 8192, 24, 32, 2048],
        ModelType::Nemotron => [256000, 6144, 24576, 32, 48, 4096],
        ModelType::StableLm => [50304, 2560, 6912, 32, 32, 4096],
        ModelType::Persimmon => [262144, 4096, 16384, 36, 64, 16384],
        ModelType::Jais2 => [150272, 3328, 26624, 32, 26, 8192],
        ModelType::Youtu => [128256, 2048, 6144, 32, 16, 131072],
        ModelType::MiniCpm3 => [73448, 2560, 6400, 62, 40, 32768],
        ModelType::FlexOlmo => [100352, 4096, 11008, 32, 32, 4096],
        ModelType::SolarOpen => [196608, 4096, 1280, 48, 64, 131072],
        ModelType::SeedOss => [155136, 4096, 27648, 64, 80, 524288],
        ModelType::Ernie45 => [103424, 1024, 3072, 18, 16, 131072],
        ModelType::Exaone4 | ModelType::ExaoneMoe => [102400, 4096, 16384, 32, 32, 2048],
        ModelType::Cohere | ModelType::Cohere2 => [256000, 8192, 22528, 40, 64, 8192],
        ModelType::Arcee => [32000, 2560, 18432, 32, 32, 4096],
        ModelType::Apertus => [131072, 4096, 14336, 32, 32, 65536],
        ModelType::NanoChat => [50304, 768, 8192, 12, 6, 2048],
        ModelType::Helium => [48000, 2560, 7040, 24, 20, 4096],
        ModelType::HunyuanV1Dense | ModelType::HunyuanV1Moe => [290943, 4096, 11008, 32, 32, 2048],
        ModelType::Starcoder2 => [49152, 3072, 12288, 30, 24, 4096],
        ModelType::Gemma => [256000, 3072, 24576, 28, 16, 8192],
        ModelType::Gemma2 | ModelType::VaultGemma => [256000, 2304, 9216, 26, 8, 8192],
        ModelType::Gemma3Text => [262208, 2304, 9216, 26, 8, 131072],
        ModelType::Gemma4Text => [262144, 2304, 9216, 30, 8, 131072],
        ModelType::Olmoe => [50304, 2048, 2048, 16, 16, 4096],
        ModelType::Qwen2Moe => [151936, 2048, 5632, 24, 16, 32768],
        ModelType::Qwen3Moe => [151936, 2048, 6144, 24, 32, 32768],
        ModelType::Glm4Moe => [151552, 4096, 10944, 46, 96, 131072],
        ModelType::Glm4MoeLite => [154880, 2048, 10240, 47, 20, 202752],
        ModelType::Dots1 => [152064, 4608, 10944, 62, 32, 2048],
        ModelType::Ernie45Moe => [103424, 2560, 12288, 28, 20, 131072],
        ModelType::MinimaxM2 => [200064, 3072, 1536, 62, 48, 196608],
        ModelType::GptOss => [201088, 2880, 2880, 36, 64, 131072],
        ModelType::DeepseekV2 => [102400, 4096, 11008, 32, 32, 2048],
        ModelType::DeepseekV3 => [129280, 7168, 18432, 61, 128, 4096],
        ModelType::Mistral4 => [131072, 4096, 12288, 36, 32, 1_048_576],
        ModelType::Llama4Text => [202048, 5120, 8192, 48, 40, 131072],
        ModelType::Qwen35Text => [248320, 4096, 12288, 32, 16, 32768],
        ModelType::Qwen3Next => [151936, 2048, 5632, 48, 16, 32768],
        ModelType::Qwen35Moe => [248320, 2048, 512, 40, 16, 32768],
    };
    let [vocab, hidden, intermediate, layers, heads, positions] = sizes;
    let mut values = json!({
        "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": intermediate,
        "num_hidden_layers": layers, "num_attention_heads": heads,
        "max_position_embeddings": positions,
    });
    // (bos_token_id, eos_token_id, pad_token_id)
    let tokens = match family {
        ModelType::Ministral3 => (Some(1), Some(2), Some(11)),
        ModelType::Llama
        | ModelType::Granite
        | ModelType::HyperClovaX
        | ModelType::GraniteMoe
        | ModelType::GraniteMoeShared
        | ModelType::Mistral
        | ModelType::Ministral
        | ModelType::Mixtral
        | ModelType::DeepseekV2 => (Some(1), Some(2), None),
        ModelType::Olmo | ModelType::Olmo2 | ModelType::Olmo3 | ModelType::Olmoe => {
            (None, Some(50279), Some(1))
        }
        ModelType::Smollm3 => (Some(128000), Some(128001), Some(128004)),
        ModelType::Arcee => (Some(128000), Some(128001), None),
        ModelType::Apertus => (Some(1), Some(2), Some(3)),
        ModelType::NanoChat => (Some(0), Some(1), Some(1)),
        ModelType::Helium => (Some(1), Some(2), Some(3)),
        ModelType::HunyuanV1Dense | ModelType::HunyuanV1Moe => (Some(1), Some(2), Some(0)),
        ModelType::Starcoder2 => (Some(50256), Some(50256), None),
        ModelType::MinimaxM2 => (Some(200034), Some(200020), None),
        ModelType::Phi3 => (Some(1), Some(32000), Some(32000)),
        // Its end-of-text tokens are a list (in the class defaults above).
        ModelType::Glm | ModelType::Glm4 => (None, None, Some(151329)),
        ModelType::Cwm => (Some(128000), None, None),
        ModelType::GraniteSwa => (Some(100257), Some(100257), None),
        ModelType::InternLm3 => (Some(1), Some(2), Some(2)),
        ModelType::Gpt2 | ModelType::GptBigcode => (Some(50256), Some(50256), None),
        ModelType::Gptj | ModelType::Codegen | ModelType::GptNeo => {
            (Some(50256), Some(50256), None)
        }
        ModelType::GptNeox => (Some(0), Some(2), None),
        ModelType::Opt => (Some(2), Some(2), Some(1)),
        ModelType::Biogpt => (Some(0), Some(2), Some(1)),
        ModelType::Falcon => (Some(11), Some(11), None),
        ModelType::Bloom => (Some(1), Some(2), None),
        ModelType::Mpt => (None, None, None),
        ModelType::Phi => (Some(1), Some(2), None),
        ModelType::Nemotron => (Some(2), Some(3), None),
        ModelType::StableLm => (Some(0), Some(0), None),
        ModelType::Persimmon => (Some(1), Some(2), None),
        ModelType::Jais2 => (Some(0), Some(150024), None),
        ModelType::Youtu => (Some(128000), Some(128001), None),
        ModelType::MiniCpm3 => (Some(1), Some(2), None),
        ModelType::FlexOlmo => (None, Some(100257), Some(100277)),
        ModelType::SolarOpen => (None, None, None),
        ModelType::SeedOss => (Some(0), Some(2), Some(1)),
        ModelType::Ernie45 | ModelType::Ernie45Moe => (Some(1), Some(2), Some(0)),
        ModelType::Exaone4 => (Some(0), Some(2), None),
        ModelType::ExaoneMoe => (Some(1), Some(53), Some(0)),
        ModelType::Cohere | ModelType::Cohere2 => (Some(5), Some(255001), Some(0)),
        ModelType::Gemma
        | ModelType::Gemma2
        | ModelType::Gemma3Text
        | ModelType::VaultGemma
        | ModelType::Gemma4Text => (Some(2), Some(1), Some(0)),
        ModelType::DeepseekV3 | ModelType::Glm4MoeLite => (Some(0), Some(1), None),
        ModelType::Mistral4 => (Some(1), Some(2), Some(11)),
        ModelType::Llama4Text => (Some(1), Some(2), None),
        ModelType::Qwen2
        | ModelType::Qwen2Moe
        | ModelType::Qwen3
        | ModelType::Qwen3Moe
        | ModelType::Qwen35Text
        | ModelType::Qwen35Moe
        | ModelType::Qwen3Next
        | ModelType::Glm4Moe
        | ModelType::Dots1
        | ModelType::GptOss => (None, None, None),
    };
    for (key, token) in [
        ("bos_token_id", tokens.0),
        ("eos_token_id", tokens.1),
        ("pad_token_id", tokens.2),
    ] {
        if let Some(token) = token {
            values[key] = json!(token);
        }
    }
    values
}

/// Hunyuan's RoPE: a `dynamic` rotary embedding with an `alpha` is, in transformers,
/// NTK scaling by a fixed factor that only stretches the base,
/// `theta · alpha^(d / (d − 2))` over the head width `d`, whatever the sequence length.
/// The object is rewritten as the default embedding at that base.
fn fix_ntk_alpha(config: &mut Map<String, Value>) {
    let Some(key) = ["rope_parameters", "rope_scaling"]
        .into_iter()
        .find(|key| config.get(*key).is_some_and(Value::is_object))
    else {
        return;
    };
    let rope = &config[key];
    let kind = rope.get("rope_type").or_else(|| rope.get("type"));
    let alpha = rope
        .get("alpha")
        .and_then(Value::as_f64)
        .filter(|&a| a != 0.0);
    let (Some("dynamic"), Some(alpha)) = (kind.and_then(Value::as_str), alpha) else {
        return;
    };
    let head_dim = config.get("head_dim").and_then(Value::as_f64).or_else(|| {
        let hidden = config.get("hidden_size")?.as_f64()?;
        let heads = config.get("num_attention_heads")?.as_f64()?;
        Some(hidden / heads)
    });
    let theta = rope
        .get("rope_theta")
        .or_else(|| config.get("rope_theta"))
        .and_then(Value::as_f64)
        .unwrap_or(10_000.0);
    let Some(d) = head_dim.filter(|&d| d > 2.0) else {
        return;
    };
    let base = theta * alpha.powf(d / (d - 2.0));
    config.insert(
        key.into(),
        json!({"rope_type": "default", "rope_theta": base}),
    );
    config.insert("rope_theta".into(), json!(base));
}

/// SmolLM3's `no_rope_layers` when the file has none: 0 (no RoPE) on every
/// `no_rope_layer_interval`-th layer, 1 elsewhere.
fn default_no_rope_layers(config: &Map<String, Value>) -> Option<Value> {
    let interval = config
        .get("no_rope_layer_interval")?
        .as_u64()
        .filter(|&n| n > 0)?;
    let layers = config.get("num_hidden_layers")?.as_u64()?;
    Some(
        (0..layers)
            .map(|layer| u64::from((layer + 1) % interval != 0))
            .collect(),
    )
}

/// The layer types a class derives from the layer count when the file names none
/// (Qwen3-Next and Qwen3.5(-MoE): linear attention but on every `full_attention_interval`-th
/// layer):
/// Gemma-2 and gpt-oss alternate sliding and full layers, OLMo-3 makes every fourth
/// layer full, Gemma-3 every `sliding_window_pattern`-th (default 6), Cohere-2 too
/// (default 4), EXAONE-4 too (default 4; a pattern of letters, `"LLLG"`, names each layer of the period, and no
/// window makes every layer full); SmolLM3 slides on its layers without RoPE when
/// `use_sliding_window` and a window are set; Llama 4 attends within chunks on its
/// layers with RoPE when `attention_chunk_size` is set.
fn default_layer_types(family: ModelType, config: &Map<String, Value>) -> Option<Value> {
    if matches!(family, ModelType::Smollm3 | ModelType::Llama4Text) {
        let set = |key: &str| config.get(key).is_some_and(|value| !value.is_null());
        // SmolLM3 slides on its layers without RoPE when it has a window; Llama 4
        // attends within chunks on its layers with RoPE when it has a chunk size.
        let (kind, on_rope_layers) = match family {
            ModelType::Smollm3 => {
                let slides = config.get("use_sliding_window") == Some(&Value::Bool(true))
                    && set("sliding_window");
                (slides.then_some("sliding_attention"), false)
            }
            _ => (
                set("attention_chunk_size").then_some("chunked_attention"),
                true,
            ),
        };
        let no_rope_layers = config.get("no_rope_layers")?.as_array()?;
        return Some(
            no_rope_layers
                .iter()
                .map(|uses_rope| match kind {
                    Some(kind) if (uses_rope.as_u64() != Some(0)) == on_rope_layers => kind,
                    _ => "full_attention",
                })
                .collect(),
        );
    }
    if matches!(family, ModelType::Exaone4 | ModelType::ExaoneMoe) {
        let layers = config.get("num_hidden_layers")?.as_u64()? as usize;
        let pattern = match config.get("sliding_window") {
            None | Some(Value::Null) => String::from("G"),
            _ => match config.get("sliding_window_pattern")? {
                Value::String(letters) => letters.clone(),
                every => {
                    let every = every.as_u64().filter(|&every| every > 0)? as usize;
                    "L".repeat(every - 1) + "G"
                }
            },
        };
        let pattern: Vec<char> = pattern.chars().collect();
        return Some(
            (0..layers)
                .map(|layer| match pattern[layer % pattern.len()] {
                    'L' => "sliding_attention",
                    _ => "full_attention",
                })
                .collect(),
        );
    }
    // Qwen3-Next and Qwen3.5(-MoE): every `full_attention_interval`-th layer attends in full,
    // the others are linear attention.
    if family.is_hybrid_linear() {
        let layers = config.get("num_hidden_layers")?.as_u64()?;
        let every = config
            .get("full_attention_interval")?
            .as_u64()
            .filter(|&every| every > 0)?;
        return Some(
            (0..layers)
                .map(|layer| match (layer + 1) % every {
                    0 => "full_attention",
                    _ => "linear_attention",
                })
                .collect(),
        );
    }
    // CWM and Granite-SWA: every fourth layer, from the first, attends in full.
    if matches!(family, ModelType::Cwm | ModelType::GraniteSwa) {
        let layers = config.get("num_hidden_layers")?.as_u64()?;
        return Some(
            (0..layers)
                .map(|layer| match layer % 4 {
                    0 => "full_attention",
                    _ => "sliding_attention",
                })
                .collect(),
        );
    }
    let every = match family {
        ModelType::Gemma2 | ModelType::VaultGemma | ModelType::GptOss => 2,
        ModelType::Olmo3 => 4,
        ModelType::Gemma4Text => 6,
        ModelType::Gemma3Text | ModelType::Cohere2 => match config.get("sliding_window_pattern") {
            None | Some(Value::Null) => 6,
            Some(value) => value.as_u64().filter(|&every| every > 0)? as usize,
        },
        _ => return None,
    };
    let layers = config.get("num_hidden_layers")?.as_u64()? as usize;
    Some(
        (0..layers)
            .map(|layer| {
                if (layer + 1) % every == 0 {
                    "full_attention"
                } else {
                    "sliding_attention"
                }
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_keys_take_the_class_defaults_and_null_stays_null() {
        let mistral = with_family_defaults(
            ModelType::Mistral,
            &json!({"model_type": "mistral", "rms_norm_eps": 1e-5}),
        );
        assert_eq!(mistral["sliding_window"], json!(4096));
        assert_eq!(mistral["rms_norm_eps"], json!(1e-5));
        let windowless = with_family_defaults(
            ModelType::Mistral,
            &json!({"model_type": "mistral", "sliding_window": null}),
        );
        assert_eq!(windowless["sliding_window"], Value::Null);
        let mixtral = with_family_defaults(ModelType::Mixtral, &json!({}));
        assert_eq!(
            (&mixtral["rms_norm_eps"], &mixtral["rope_theta"]),
            (&json!(1e-5), &json!(1e6))
        );
        let gemma2 = with_family_defaults(ModelType::Gemma2, &json!({}));
        assert_eq!(gemma2["attn_logit_softcapping"], json!(50.0));
        assert_eq!(gemma2["query_pre_attn_scalar"], json!(256));
    }

    /// transformers' `Glm4MoeLiteConfig`: a dense first layer, then experts, unless the
    /// file lists the kinds.
    #[test]
    fn glm4_moe_lite_layer_kinds_default_to_a_dense_first_layer() {
        let filled = with_family_defaults(ModelType::Glm4MoeLite, &json!({"num_hidden_layers": 3}));
        assert_eq!(
            filled["mlp_layer_types"],
            json!(["dense", "sparse", "sparse"])
        );
        let listed = json!({"num_hidden_layers": 2, "mlp_layer_types": ["sparse", "dense"]});
        let filled = with_family_defaults(ModelType::Glm4MoeLite, &listed);
        assert_eq!(filled["mlp_layer_types"], listed["mlp_layer_types"]);
    }

    #[test]
    fn a_file_with_its_own_rotary_embedding_keeps_it() {
        let default = with_family_defaults(ModelType::GptOss, &json!({}));
        assert_eq!(default["rope_scaling"]["rope_type"], json!("yarn"));
        assert_eq!(default["rope_theta"], json!(150000.0));
        let own = json!({"rope_scaling": {"rope_type": "linear", "factor": 2.0}});
        let filled = with_family_defaults(ModelType::GptOss, &own);
        assert_eq!(filled["rope_scaling"], own["rope_scaling"]);
        let own = json!({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}});
        let filled = with_family_defaults(ModelType::GptOss, &own);
        assert!(filled.get("rope_scaling").is_none());
    }

    #[test]
    fn youtu_initializer_scale_follows_the_width_unless_given() {
        let range = |config: Value| {
            with_family_defaults(ModelType::Youtu, &config)["initializer_range"].clone()
        };
        let derived = range(json!({"hidden_size": 20})).as_f64().unwrap();
        assert!((derived - 0.2).abs() < 1e-12, "{derived}");
        assert_eq!(
            range(json!({"hidden_size": 20, "initializer_range": 0.5})),
            json!(0.5)
        );
    }

    #[test]
    fn layer_types_are_derived_from_the_layer_count() {
        let types =
            |family, config: Value| with_family_defaults(family, &config)["layer_types"].clone();
        let sliding = "sliding_attention";
        let full = "full_attention";
        assert_eq!(
            types(ModelType::Gemma2, json!({"num_hidden_layers": 3})),
            json!([sliding, full, sliding])
        );
        assert_eq!(
            types(ModelType::GptOss, json!({"num_hidden_layers": 2})),
            json!([sliding, full])
        );
        assert_eq!(
            types(ModelType::Gemma3Text, json!({"num_hidden_layers": 7})),
            json!([sliding, sliding, sliding, sliding, sliding, full, sliding])
        );
        assert_eq!(
            types(
                ModelType::Gemma3Text,
                json!({"num_hidden_layers": 4, "sliding_window_pattern": 2})
            ),
            json!([sliding, full, sliding, full])
        );
        // CWM: every fourth layer full, from the first.
        assert_eq!(
            types(ModelType::Cwm, json!({"num_hidden_layers": 6})),
            json!([full, sliding, sliding, sliding, full, sliding])
        );
        let own = json!({"num_hidden_layers": 2, "layer_types": [full, full]});
        assert_eq!(types(ModelType::Gemma2, own), json!([full, full]));
        assert_eq!(
            types(ModelType::Llama, json!({"num_hidden_layers": 2})),
            Value::Null
        );
    }
}
