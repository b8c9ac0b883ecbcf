//! Qwen3-Next's hybrid design, which Qwen3.5's text model (`qwen3_5_text`, and the
//! `qwen3_5` checkpoints that hold it beside a vision tower) keeps: the layers that
//! `layer_types` names `linear_attention` (by default all but every
//! `full_attention_interval`-th, three in four) are a Gated DeltaNet
//! ([`GatedDeltaNetConfig`]: `linear_num_key_heads` heads of `linear_key_head_dim` for
//! queries and keys, `linear_num_value_heads` of `linear_value_head_dim` for values, a
//! short convolution of `linear_conv_kernel_dim` taps), the others (`full_attention`)
//! grouped attention with a sigmoid gate on its output, QK-norm per head and RoPE on a
//! quarter of each head (`partial_rotary_factor`). Every RMSNorm scales by
//! `1 + weight`, but the DeltaNet's norm of its output, which scales by `weight`.
//!
//! Qwen3.5's rotary embedding is multimodal (`mrope_section`, interleaved over the
//! time, height and width positions of images and video); for text those three
//! positions are the token's, which makes it the plain rotary embedding.
//!
//! The checkpoint names a DeltaNet `linear_attn` where an attention is `self_attn`
//! (ours: `self_attn` for both, [`LINEAR_ATTENTION_NAMES`]). Qwen3-Next stores the
//! DeltaNet's projections fused, key head by key head: `in_proj_qkvz` holds each key
//! head's query, key, value and gate rows (the values and gates of the value heads it
//! serves), `in_proj_ba` its `b` and `a` rows; the loader cuts them into Qwen3.5's
//! `in_proj_qkv`, `in_proj_z`, `in_proj_b` and `in_proj_a`
//! ([`FusedLayout::Parts`](super::FusedLayout::Parts)), and saving fuses them back.
//! Qwen3-Next's layers are sparse as Qwen2-MoE's (softmax top-k experts and one
//! shared expert behind a sigmoid gate, every `decoder_sparse_step` layers but
//! `mlp_only_layers`).

use serde::Deserialize;
use serde_json::{Value, json};

use super::keys::{KeyError, layers_of_kind};
use crate::attention::{GatedDeltaNetConfig, QkNormKind, QkNormPlacement};
use crate::block::BlockKind;
use crate::ffn::Activation;
use crate::model::CausalLmConfig;
use crate::position::{RopeLayout, RopeScaling};

/// The checkpoint's names of a DeltaNet's parts, and ours (one table for loading and
/// saving: each name is a DeltaNet's alone, so the way back is unambiguous).
pub(super) const LINEAR_ATTENTION_NAMES: [(&str, &str); 9] = [
    (".linear_attn.in_proj_qkv.", ".self_attn.in_proj_qkv."),
    (".linear_attn.in_proj_z.", ".self_attn.in_proj_z."),
    (".linear_attn.in_proj_b.", ".self_attn.in_proj_b."),
    (".linear_attn.in_proj_a.", ".self_attn.in_proj_a."),
    (".linear_attn.conv1d.", ".self_attn.conv1d."),
    (".linear_attn.dt_bias", ".self_attn.dt_bias"),
    (".linear_attn.A_log", ".self_attn.a_log"),
    (".linear_attn.norm.", ".self_attn.norm."),
    (".linear_attn.out_proj.", ".self_attn.out_proj."),
];

/// The keys of the hybrid families' `config.json` that the common reader does not read
/// (the class's defaults filled in, `layer_types` among them; see `defaults.rs`).
#[derive(Deserialize, Debug)]
pub(super) struct HybridKeys {
    linear_conv_kernel_dim: Option<usize>,
    linear_key_head_dim: Option<usize>,
    linear_value_head_dim: Option<usize>,
    linear_num_key_heads: Option<usize>,
    linear_num_value_heads: Option<usize>,
    layer_types: Option<Vec<String>>,
}

impl HybridKeys {
    /// Sets the hybrid layers on `model`, read with the common keys (its norms, QK-norm
    /// and rotary embedding among them).
    ///
    /// # Errors
    /// A [`KeyError`] naming a key whose value this crate cannot build: a missing size,
    /// `layer_types` of the wrong length or with another kind of layer, an activation
    /// other than SiLU (the DeltaNet's convolution is built with SiLU).
    pub(super) fn apply(&self, model: &mut CausalLmConfig) -> Result<(), KeyError> {
        if model.activation != Activation::Silu {
            return Err(KeyError::new(
                "hidden_act",
                format!(
                    "is {:?}: the linear attention's convolution is built with SiLU, the \
                     activation of every Qwen3-Next and Qwen3.5 checkpoint",
                    model.activation
                ),
            ));
        }
        let size = |value: Option<usize>, key: &str| {
            value.ok_or_else(|| KeyError::new(key, "is required: a positive integer"))
        };
        let linear = GatedDeltaNetConfig::new(
            model.d_model,
            size(self.linear_num_key_heads, "linear_num_key_heads")?,
            size(self.linear_num_value_heads, "linear_num_value_heads")?,
            size(self.linear_key_head_dim, "linear_key_head_dim")?,
            size(self.linear_value_head_dim, "linear_value_head_dim")?,
        )
        .with_conv_kernel(size(self.linear_conv_kernel_dim, "linear_conv_kernel_dim")?)
        .with_norm_eps(model.norm_eps);
        let layers = self.linear_layers(model.n_layers)?;
        model.attention_output_gate = true;
        if layers.contains(&true) {
            model.linear_attention = Some(linear);
            model.linear_attention_layers =
                (!layers.iter().all(|&linear| linear)).then_some(layers);
        }
        Ok(())
    }

    /// Which layers are linear attention ones, from `layer_types`.
    fn linear_layers(&self, n_layers: usize) -> Result<Vec<bool>, KeyError> {
        let types = self
            .layer_types
            .as_ref()
            .ok_or_else(|| KeyError::new("layer_types", "is required: one kind per layer"))?;
        layers_of_kind(types, n_layers, "linear_attention")
    }
}

/// The `config.json` of a Qwen3.5 text model built here (`train-lm --arch qwen3_5`), as
/// transformers' `Qwen3_5ForCausalLM` reads it, but for the sizes every family names
/// alike (which the exporter adds): the inverse of [`HybridKeys::apply`] and the common
/// keys.
///
/// # Errors
/// The first option of `config` that Qwen3.5 does not have, named (for a refusal),
/// among those that LLaMA's families have or that only Qwen3.5 could; the exporter
/// refuses the options no exported family has, and Gemma-4's, before.
pub(crate) fn config_json(config: &CausalLmConfig) -> Result<Value, &'static str> {
    let head_dim = config.head_width();
    let qk_norm_is_qwen3_5s = config.qk_norm.as_ref().is_some_and(|qk| {
        qk.placement == QkNormPlacement::PerHead
            && qk.kind == QkNormKind::Rms
            && qk.unit_offset
            && qk.scale
            && !qk.weights_per_head
            && qk.eps == config.norm_eps
    });
    let rope = &config.rope;
    let unsupported = [
        (
            config.block_kind != BlockKind::PreNorm,
            "a block kind other than Pre-LN",
        ),
        (
            config.layer_norm || !config.norm_scale || !config.norm_unit_offset,
            "norms other than RMSNorms scaling by 1 + weight",
        ),
        (
            !qk_norm_is_qwen3_5s,
            "QK-norm other than an RMSNorm per head scaling by 1 + weight, with the \
             model's epsilon",
        ),
        (
            !config.attention_output_gate,
            "attention without a gate on its output",
        ),
        (
            config
                .linear_attention
                .as_ref()
                .is_some_and(|linear| linear.norm_eps != config.norm_eps),
            "a linear attention whose norm's epsilon is not the model's",
        ),
        (
            config.activation != Activation::Silu || !config.gated_mlp,
            "a feed-forward other than SwiGLU",
        ),
        (
            config.qkv_bias != config.o_bias || config.mlp_bias || config.lm_head_bias,
            "biases other than on all four attention projections",
        ),
        (config.embed_scale.is_some(), "scaled embeddings"),
        (
            config.attention_softcap.is_some() || config.final_logit_softcap.is_some(),
            "logit soft-capping",
        ),
        (config.sliding_window.is_some(), "a sliding window"),
        (
            config
                .attention_scale
                .is_some_and(|scale| (scale - 1.0 / (head_dim as f64).sqrt()).abs() > 1e-12),
            "an attention scale other than 1/sqrt(head_dim)",
        ),
        (
            rope.scaling != RopeScaling::Default
                || rope.layout != RopeLayout::HalfSplit
                || rope.reversed,
            "a RoPE scaling, or a layout other than LLaMA's",
        ),
    ];
    if let Some((_, option)) = unsupported.into_iter().find(|(set, _)| *set) {
        return Err(option);
    }
    let layer_types: Vec<&str> = (0..config.n_layers)
        .map(|layer| match config.is_linear_attention_layer(layer) {
            true => "linear_attention",
            false => "full_attention",
        })
        .collect();
    let mut value = json!({
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "head_dim": head_dim,
        "num_key_value_heads": config.kv_heads(),
        "hidden_act": "silu",
        "max_position_embeddings": rope.max_position_embeddings,
        "rms_norm_eps": config.norm_eps,
        "tie_word_embeddings": config.tie_word_embeddings,
        "attention_bias": config.qkv_bias,
        "attention_dropout": 0.0,
        "layer_types": layer_types,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": rope.theta,
            "partial_rotary_factor": rope.partial_rotary_factor,
        },
        "use_cache": true,
        "dtype": "float32",
    });
    // A model without linear layers writes the class's sizes, which no layer reads.
    let linear = config
        .linear_attention
        .clone()
        .unwrap_or_else(|| GatedDeltaNetConfig::new(config.d_model, 16, 32, 128, 128));
    let object = value.as_object_mut().expect("an object");
    for (key, size) in [
        ("linear_num_key_heads", linear.n_key_heads),
        ("linear_num_value_heads", linear.n_value_heads),
        ("linear_key_head_dim", linear.key_head_dim),
        ("linear_value_head_dim", linear.value_head_dim),
        ("linear_conv_kernel_dim", linear.conv_kernel),
    ] {
        object.insert(key.into(), size.into());
    }
    Ok(value)
}
