//! Gemma-4's text model (`gemma4_text`, and the text model of `gemma4`'s multimodal
//! checkpoints): the keys of its own. Its global layers (`full_attention`) have heads
//! of their own shape (`global_head_dim`, `num_global_key_value_heads`, or
//! transformers 5's `per_layer_config`), take their values from the keys' projection
//! with `attention_k_eq_v`, and rotate with a proportional RoPE of their head width;
//! every layer normalizes its values and scales its output by a fixed `layer_scalar`.
//! With `enable_moe_block` every layer runs its dense feed-forward beside
//! `num_experts` experts (top `top_k_experts`, width `moe_intermediate_size`) that
//! route the residual stream ([`MoeConfig::stream_norms`]).
//!
//! The smaller checkpoints (E2B, E4B) add per-layer embeddings
//! (`hidden_size_per_layer_input`, a table of `vocab_size_per_layer_input` rows; on by
//! default in transformers, with width 256) and let their last `num_kv_shared_layers`
//! layers reuse the keys and values of the last earlier layer of their kind, with a
//! feed-forward twice as wide under `use_double_wide_mlp`.
//!
//! [`config_json`] writes these keys back for a Gemma-4 model built here.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Value, json};

use super::keys::{KeyError, UnreadKeys};
use crate::attention::{QkNormKind, QkNormPlacement};
use crate::block::BlockKind;
use crate::ffn::moe::RouterConfig;
use crate::ffn::{Activation, MoeConfig, MoeLayerPlan};
use crate::model::CausalLmConfig;
use crate::position::{RopeConfig, RopeLayout, RopeScaling};

/// transformers' width of a global layer's heads where the file names none.
const DEFAULT_GLOBAL_HEAD_DIM: usize = 512;

/// The keys of a Gemma-4 `config.json` that the common reader does not read.
#[derive(Deserialize, Debug)]
pub(super) struct Gemma4Keys {
    global_head_dim: Option<usize>,
    num_global_key_value_heads: Option<usize>,
    attention_k_eq_v: Option<bool>,
    /// transformers 5's form: the attributes that differ per layer, by layer index.
    per_layer_config: Option<BTreeMap<String, Value>>,
    hidden_size_per_layer_input: Option<usize>,
    vocab_size_per_layer_input: Option<usize>,
    num_kv_shared_layers: Option<usize>,
    enable_moe_block: Option<bool>,
    num_experts: Option<usize>,
    top_k_experts: Option<usize>,
    moe_intermediate_size: Option<usize>,
    use_double_wide_mlp: Option<bool>,
    use_bidirectional_attention: Option<String>,
}

/// The head shape of the global layers: its width and key/value heads, where they
/// differ from every layer's.
#[derive(Debug, Default, Clone, PartialEq)]
struct GlobalHeads {
    head_dim: Option<usize>,
    kv_heads: Option<usize>,
}

impl Gemma4Keys {
    /// Sets Gemma-4's own options on `model`, read with the common keys (its rotary
    /// embedding is the global layers' and its sliding layers come from `layer_types`).
    ///
    /// # Errors
    /// A [`KeyError`] naming a feature that is not supported or a `per_layer_config`
    /// that this crate cannot build.
    pub(super) fn apply(
        &self,
        model: &mut CausalLmConfig,
        unread: &mut UnreadKeys,
    ) -> Result<(), KeyError> {
        self.refuse_unsupported()?;
        // transformers makes the last layer global, whatever `layer_types` says.
        let last = model.n_layers.saturating_sub(1);
        if let Some(sliding) = model.sliding_layers.as_mut()
            && let Some(flag) = sliding.get_mut(last)
        {
            unread.fixed("layer_types", Some(*flag), false, "a global last layer");
            *flag = false;
        }
        let sliding: Vec<bool> = (0..model.n_layers)
            .map(|layer| !model.is_global_layer(layer))
            .collect();
        let values_from_keys = self.attention_k_eq_v.unwrap_or(false);
        let global = match &self.per_layer_config {
            Some(per_layer) => global_heads_of(per_layer, &sliding)?,
            None => GlobalHeads {
                head_dim: Some(self.global_head_dim.unwrap_or(DEFAULT_GLOBAL_HEAD_DIM)),
                // transformers gives the global layers their own key/value heads only
                // with `attention_k_eq_v`.
                kv_heads: match values_from_keys {
                    true => self.num_global_key_value_heads,
                    false => unread.fixed(
                        "num_global_key_value_heads",
                        self.num_global_key_value_heads.map(Some),
                        None,
                        "`num_key_value_heads` in every layer without attention_k_eq_v",
                    ),
                },
            },
        };
        if let Some(head_dim) = global.head_dim {
            model.rope.head_dim = head_dim;
        }
        model.global_head_dim = global.head_dim;
        model.global_kv_heads = global.kv_heads;
        model.global_values_from_keys = values_from_keys;
        model.value_norm = true;
        model.layer_scalar = true;
        if self.enable_moe_block == Some(true) {
            model.moe = Some(self.moe_config(model)?);
            model.moe_layers = MoeLayerPlan::all_sparse();
        }
        self.apply_per_layer_embeddings(model);
        self.apply_kv_sharing(model, unread);
        Ok(())
    }

    /// Per-layer embeddings of `hidden_size_per_layer_input` (the class's default
    /// where the file names none); 0 turns them off.
    fn apply_per_layer_embeddings(&self, model: &mut CausalLmConfig) {
        if let Some(width) = self.hidden_size_per_layer_input.filter(|&width| width > 0) {
            model.per_layer_input_width = Some(width);
            model.per_layer_vocab_size = self.vocab_size_per_layer_input;
        }
    }

    /// The last `num_kv_shared_layers` layers reuse keys and values, their feed-forward
    /// twice as wide with `use_double_wide_mlp`.
    fn apply_kv_sharing(&self, model: &mut CausalLmConfig, unread: &mut UnreadKeys) {
        model.kv_shared_layers = self.num_kv_shared_layers.unwrap_or(0);
        let double_wide = self.use_double_wide_mlp == Some(true);
        if model.kv_shared_layers == 0 {
            unread.fixed(
                "use_double_wide_mlp",
                self.use_double_wide_mlp,
                false,
                "the double-width feed-forward only in layers that share keys and values, \
                 which this model has none of",
            );
        } else if double_wide {
            model.kv_shared_d_ff = Some(2 * model.d_ff);
        }
    }

    /// The mixture of experts of every layer with `enable_moe_block`: the dense
    /// feed-forward (`intermediate_size`) as the shared experts beside the routed ones,
    /// which route the residual stream through the router's own norm and scale; softmax
    /// over the experts, top-k renormalized, then each expert's `per_expert_scale`.
    fn moe_config(&self, model: &CausalLmConfig) -> Result<MoeConfig, KeyError> {
        let required = |value: Option<usize>, key: &str| {
            value.filter(|&value| value > 0).ok_or_else(|| {
                KeyError::new(key, "required by enable_moe_block: a positive integer")
            })
        };
        let experts = required(self.num_experts, "num_experts")?;
        let top_k = required(self.top_k_experts, "top_k_experts")?;
        let width = required(self.moe_intermediate_size, "moe_intermediate_size")?;
        let router = RouterConfig::new(model.d_model, experts, top_k)
            .with_input_norm_eps(Some(model.norm_eps))
            .with_per_expert_scale(true)
            .with_initializer(model.initializer.clone());
        Ok(MoeConfig::new(router, width)
            .with_n_shared_experts(1)
            .with_shared_d_ff(Some(model.d_ff))
            .with_activation(model.activation)
            .with_stream_norms(Some(model.norm_config())))
    }

    /// The Gemma-4 features this crate does not build, named.
    fn refuse_unsupported(&self) -> Result<(), KeyError> {
        if self.use_bidirectional_attention.as_deref() == Some("all") {
            return Err(KeyError::new(
                "use_bidirectional_attention",
                "is \"all\": bidirectional (encoder) Gemma models are not supported; this \
                 loader builds causal language models",
            ));
        }
        Ok(())
    }
}

/// The global layers' heads from transformers 5's `per_layer_config` (layer index →
/// attributes that differ): only `head_dim` and `num_key_value_heads` may differ, only
/// in global layers, and alike in all of them.
fn global_heads_of(
    per_layer: &BTreeMap<String, Value>,
    sliding: &[bool],
) -> Result<GlobalHeads, KeyError> {
    let mut overrides = vec![GlobalHeads::default(); sliding.len()];
    for (index, attributes) in per_layer {
        let key = format!("per_layer_config.{index}");
        let layer = index
            .parse::<usize>()
            .ok()
            .filter(|&layer| layer < sliding.len())
            .ok_or_else(|| {
                KeyError::new(
                    &key,
                    format!(
                        "is not a layer index below num_hidden_layers {}",
                        sliding.len()
                    ),
                )
            })?;
        let Value::Object(attributes) = attributes else {
            return Err(KeyError::new(&key, "expected an object of attributes"));
        };
        for (name, value) in attributes {
            let size = || {
                value
                    .as_u64()
                    .filter(|&size| size > 0)
                    .map(|size| size as usize)
                    .ok_or_else(|| {
                        KeyError::new(
                            format!("{key}.{name}"),
                            format!("expected a positive integer, got {value}"),
                        )
                    })
            };
            match name.as_str() {
                "head_dim" => overrides[layer].head_dim = Some(size()?),
                "num_key_value_heads" => overrides[layer].kv_heads = Some(size()?),
                _ => {
                    return Err(KeyError::new(
                        format!("{key}.{name}"),
                        "differs per layer, which is not supported: only head_dim and \
                         num_key_value_heads may differ, in the full-attention layers",
                    ));
                }
            }
        }
    }
    let mut global = None;
    for (layer, (heads, &slides)) in overrides.into_iter().zip(sliding).enumerate() {
        let key = || format!("per_layer_config.{layer}");
        if slides {
            if heads != GlobalHeads::default() {
                return Err(KeyError::new(
                    key(),
                    "gives a sliding-window layer heads of its own shape, which is not \
                     supported: only the full-attention layers may differ",
                ));
            }
            continue;
        }
        match &global {
            None => global = Some(heads),
            Some(first) if *first != heads => {
                return Err(KeyError::new(
                    key(),
                    "gives this full-attention layer heads of another shape than the \
                     first one's: all full-attention layers must have the same",
                ));
            }
            Some(_) => {}
        }
    }
    Ok(global.unwrap_or_default())
}

/// The `config.json` of a Gemma-4 text model built here (`train-lm --arch gemma4`,
/// with or without per-layer embeddings and layers reusing keys and values), as
/// transformers' `Gemma4ForCausalLM` reads it, but for the sizes every family names
/// alike (which the exporter adds): the inverse of [`Gemma4Keys::apply`] and the
/// common keys.
///
/// # Errors
/// The first option of `config` that Gemma-4 does not have, named (for a refusal),
/// among those that LLaMA's families have or that only Gemma-4 could; the exporter
/// refuses the options no exported family has before.
pub(crate) fn config_json(config: &CausalLmConfig) -> Result<Value, &'static str> {
    let qk_norm_is_gemma4s = config.qk_norm.as_ref().is_some_and(|qk| {
        qk.placement == QkNormPlacement::PerHead
            && qk.kind == QkNormKind::Rms
            && !qk.unit_offset
            && qk.scale
            && !qk.weights_per_head
            && qk.eps == config.norm_eps
    });
    let embed_scale = (config.d_model as f64).sqrt();
    let last = config.n_layers - 1;
    let unsupported = [
        (
            config.block_kind != BlockKind::Sandwich,
            "a block kind other than sandwich norms",
        ),
        (
            config.layer_norm || !config.norm_scale || config.norm_unit_offset,
            "norms other than RMSNorms scaling by a plain weight",
        ),
        (
            !qk_norm_is_gemma4s,
            "QK-norm other than an RMSNorm per head with the model's epsilon",
        ),
        (!config.value_norm, "values without their norm (value_norm)"),
        (
            config.attention_scale != Some(1.0),
            "an attention scale other than 1",
        ),
        (
            config
                .embed_scale
                .is_none_or(|scale| (scale - embed_scale).abs() > 1e-9 * embed_scale),
            "an embedding scale other than √d_model",
        ),
        (
            config.activation != Activation::GeluTanh || !config.gated_mlp,
            "a feed-forward other than GeGLU with tanh-GELU",
        ),
        (
            config.qkv_bias || config.o_bias || config.mlp_bias || config.lm_head_bias,
            "biases",
        ),
        (
            config.attention_softcap.is_some(),
            "attention logit soft-capping",
        ),
        (
            !config.is_global_layer(last),
            "a sliding last layer (Gemma-4's last layer is global)",
        ),
        (
            config.kv_heads_of(last) != config.kv_heads() && !config.global_values_from_keys,
            "global layers of their own key/value heads without values from the keys",
        ),
        (
            config
                .kv_shared_d_ff
                .is_some_and(|width| width != 2 * config.d_ff),
            "a feed-forward in the layers reusing keys and values other than twice d_ff wide",
        ),
    ];
    if let Some((_, option)) = unsupported.into_iter().find(|(set, _)| *set) {
        return Err(option);
    }
    let sliding_rope = config.sliding_rope.as_ref().unwrap_or(&config.rope);
    let layer_types: Vec<&str> = (0..config.n_layers)
        .map(|layer| match config.is_global_layer(layer) {
            true => "full_attention",
            false => "sliding_attention",
        })
        .collect();
    let mut value = json!({
        "architectures": ["Gemma4ForCausalLM"],
        "model_type": "gemma4_text",
        "head_dim": config.head_width(),
        "global_head_dim": config.head_width_of(last),
        "attention_k_eq_v": config.global_values_from_keys,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": config.rope.max_position_embeddings,
        "rms_norm_eps": config.norm_eps,
        "tie_word_embeddings": config.tie_word_embeddings,
        "final_logit_softcapping": config.final_logit_softcap,
        "layer_types": layer_types,
        "sliding_window": config.sliding_window.unwrap_or(config.rope.max_position_embeddings),
        "rope_parameters": {
            "full_attention": rope_parameters(&config.rope)?,
            "sliding_attention": rope_parameters(sliding_rope)?,
        },
        "hidden_size_per_layer_input": config.per_layer_input_width.unwrap_or(0),
        "vocab_size_per_layer_input": config.per_layer_vocab_size.unwrap_or(config.vocab_size),
        "num_kv_shared_layers": config.kv_shared_layers,
        "use_double_wide_mlp": config.kv_shared_d_ff.is_some(),
        "enable_moe_block": false,
        "attention_bias": false,
        "attention_dropout": 0.0,
        "use_cache": true,
        "dtype": "float32",
    });
    if config.global_values_from_keys {
        let object = value.as_object_mut().expect("an object");
        object.insert(
            "num_global_key_value_heads".into(),
            config.kv_heads_of(last).into(),
        );
    }
    Ok(value)
}

/// One kind of layer's `rope_parameters`: Gemma-4 rotates with the default or the
/// proportional RoPE.
fn rope_parameters(rope: &RopeConfig) -> Result<Value, &'static str> {
    if rope.layout != RopeLayout::HalfSplit || rope.partial_rotary_factor != 1.0 || rope.reversed {
        return Err("an interleaved, partial or reversed RoPE");
    }
    match rope.scaling {
        RopeScaling::Default => Ok(json!({"rope_type": "default", "rope_theta": rope.theta})),
        RopeScaling::Proportional {
            factor,
            rotated_fraction,
        } => {
            let mut parameters = json!({
                "rope_type": "proportional",
                "rope_theta": rope.theta,
                "partial_rotary_factor": rotated_fraction,
            });
            // transformers names `factor` an unrecognized key of this type (and reads
            // it): written only where it matters.
            if factor != 1.0 {
                parameters["factor"] = factor.into();
            }
            Ok(parameters)
        }
        _ => Err("a RoPE scaling other than the proportional one"),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use crate::hf::tests::{config_json, model_dir};
    use crate::hf::{HfConfig, HfError};

    /// The `gemma4_text` fixture's `config.json`, as an object to edit.
    fn fixture_config() -> serde_json::Map<String, Value> {
        match config_json(&model_dir("gemma4_text")) {
            Value::Object(config) => config,
            other => panic!("config.json is not an object: {other}"),
        }
    }

    /// The key a refused config names.
    fn refused_key(config: serde_json::Map<String, Value>) -> String {
        match HfConfig::from_value(&Value::Object(config), "config.json") {
            Err(HfError::Field { field, .. }) => field,
            other => panic!("expected a field error, got {other:?}"),
        }
    }

    #[test]
    fn unsupported_gemma4_features_are_refused_by_name() {
        let mut config = fixture_config();
        config.insert("use_bidirectional_attention".into(), json!("all"));
        assert_eq!(refused_key(config), "use_bidirectional_attention");
        // Vision tokens attending both ways change nothing for text.
        let mut config = fixture_config();
        config.insert("use_bidirectional_attention".into(), json!("vision"));
        assert!(HfConfig::from_value(&Value::Object(config), "config.json").is_ok());
    }

    /// transformers' default is per-layer embeddings of width 256 over 262144 tokens: a
    /// file without the keys has them; 0 turns them off.
    #[test]
    fn per_layer_embeddings_follow_transformers_defaults() {
        let mut config = fixture_config();
        config.remove("hidden_size_per_layer_input");
        config.remove("vocab_size_per_layer_input");
        let model = HfConfig::from_value(&Value::Object(config), "config.json")
            .unwrap()
            .model;
        assert_eq!(model.per_layer_input_width, Some(256));
        assert_eq!(model.per_layer_vocab_size, Some(262_144));
        let model = HfConfig::from_value(&Value::Object(fixture_config()), "config.json")
            .unwrap()
            .model;
        assert_eq!(model.per_layer_input_width, None);
    }

    /// Reusing layers take the last earlier layer of their kind; a kind that no earlier
    /// layer has, or every layer reusing, is refused by name.
    #[test]
    fn kv_sharing_takes_the_last_earlier_layer_of_each_kind() {
        let with_sharing = |layer_types: Value, shared: usize| {
            let mut config = fixture_config();
            config.remove("per_layer_config");
            config.insert("num_hidden_layers".into(), json!(5));
            config.insert("layer_types".into(), layer_types);
            config.insert("num_kv_shared_layers".into(), json!(shared));
            config.insert("use_double_wide_mlp".into(), json!(true));
            HfConfig::from_value(&Value::Object(config), "config.json")
        };
        let (s, f) = ("sliding_attention", "full_attention");
        let model = with_sharing(json!([s, f, s, s, f]), 2).unwrap().model;
        let sources: Vec<_> = (0..5).map(|layer| model.kv_source_of(layer)).collect();
        assert_eq!(sources, [None, None, None, Some(2), Some(1)]);
        let widths: Vec<_> = (0..5).map(|layer| model.d_ff_of(layer)).collect();
        assert_eq!(widths, [48, 48, 48, 96, 96]);
        for (layer_types, shared) in [(json!([s, s, s, s, f]), 2), (json!([s, f, s, s, f]), 5)] {
            match with_sharing(layer_types, shared) {
                Err(HfError::Config { source, .. }) => {
                    assert!(source.to_string().contains("kv_shared_layers"), "{source}");
                }
                other => panic!("expected a configuration error, got {other:?}"),
            }
        }
    }

    #[test]
    fn experts_without_their_sizes_are_refused_by_name() {
        for key in ["num_experts", "top_k_experts", "moe_intermediate_size"] {
            let mut config = fixture_config();
            config.insert("enable_moe_block".into(), json!(true));
            for size in ["num_experts", "top_k_experts", "moe_intermediate_size"] {
                config.insert(size.into(), json!(if size == key { 0 } else { 2 }));
            }
            assert_eq!(refused_key(config), key);
        }
    }

    #[test]
    fn per_layer_config_that_this_crate_cannot_build_is_refused_by_name() {
        let cases = [
            (json!({"0": {"head_dim": 16}}), "per_layer_config.0"),
            (json!({"1": {"head_dim": 16}}), "per_layer_config.2"),
            (
                json!({"1": {"intermediate_size": 64}}),
                "per_layer_config.1.intermediate_size",
            ),
            (json!({"7": {"head_dim": 16}}), "per_layer_config.7"),
            (json!({"1": {"head_dim": 0}}), "per_layer_config.1.head_dim"),
        ];
        for (per_layer, key) in cases {
            let mut config = fixture_config();
            config.insert("per_layer_config".into(), per_layer);
            assert_eq!(refused_key(config), key);
        }
    }

    /// Without `per_layer_config`: `global_head_dim` (512 when absent) for the global
    /// layers, and their own key/value heads only with `attention_k_eq_v`.
    #[test]
    fn global_heads_follow_the_class_keys() {
        let mut config = fixture_config();
        config.remove("per_layer_config");
        config.insert("num_global_key_value_heads".into(), json!(1));
        config.insert("attention_k_eq_v".into(), json!(false));
        let hf = HfConfig::from_value(&Value::Object(config), "config.json").unwrap();
        assert!(
            hf.unread_keys[0].starts_with("`num_global_key_value_heads: 1`"),
            "{:?}",
            hf.unread_keys
        );
        let model = hf.model;
        assert_eq!(model.global_head_dim, Some(512));
        assert_eq!(model.rope.head_dim, 512);
        assert_eq!(model.global_kv_heads, None);
        assert!(!model.global_values_from_keys);
        assert_eq!((model.head_width_of(0), model.head_width_of(1)), (8, 512));
        assert_eq!((model.kv_heads_of(0), model.kv_heads_of(1)), (2, 2));
    }
}
