//! Llama 4's text model (`llama4_text`): the keys of its own. Its layers come in two
//! kinds, set by `no_rope_layers` (0 marks a layer without RoPE; every fourth by
//! default, `no_rope_layer_interval`):
//! - the layers with RoPE attend within chunks of `attention_chunk_size` positions
//!   (HF `layer_types` `chunked_attention`) and normalize each rotated query and key
//!   head by its RMS without a weight (`use_qk_norm`, the `L2Norm` of transformers);
//! - the layers without RoPE attend to every earlier position and scale their queries
//!   by `1 + attn_scale · ln(1 + ⌊(p + 1) / floor_scale⌋)` (`attn_temperature_tuning`).
//!
//! The layers of `moe_layers` (by default every `interleave_moe_layer_step`-th) are a
//! mixture of `num_local_experts` experts of width `intermediate_size`: the router picks
//! `num_experts_per_tok` by logit, each expert reads the token times the sigmoid of its
//! logit ([`MoeConfig::weighted_inputs`]), and a shared expert of the same width adds
//! its output. The other layers' feed-forward is `intermediate_size_mlp` wide. The
//! checkpoint stores the experts stacked, `experts.gate_up_proj` `[E, d_model, 2·d_ff]`
//! (gate columns, then up) and `experts.down_proj` `[E, d_ff, d_model]`.

use serde::Deserialize;

use super::keys::{KeyError, UnreadKeys, layers_of_kind};
use crate::attention::{QkNormConfig, QkNormPlacement, QueryTemperatureConfig};
use crate::ffn::moe::{RouterConfig, RouterScoring};
use crate::ffn::{MoeConfig, MoeLayerPlan};
use crate::model::CausalLmConfig;

/// The keys of a Llama 4 `config.json` that the common reader does not read (the
/// class's defaults filled in, see `defaults.rs`).
#[derive(Deserialize, Debug)]
pub(super) struct Llama4Keys {
    intermediate_size: Option<usize>,
    intermediate_size_mlp: Option<usize>,
    num_local_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    moe_layers: Option<Vec<usize>>,
    interleave_moe_layer_step: Option<usize>,
    use_qk_norm: Option<bool>,
    /// `null`: no chunks.
    attention_chunk_size: Option<usize>,
    layer_types: Option<Vec<String>>,
    attn_temperature_tuning: Option<bool>,
    floor_scale: Option<f64>,
    attn_scale: Option<f64>,
    router_aux_loss_coef: Option<f64>,
    router_jitter_noise: Option<f64>,
}

impl Llama4Keys {
    /// Sets Llama 4's own options on `model`, read with the common keys (its layers
    /// without RoPE among them).
    ///
    /// # Errors
    /// A [`KeyError`] naming a key whose value this crate cannot build.
    pub(super) fn apply(
        &self,
        model: &mut CausalLmConfig,
        unread: &mut UnreadKeys,
    ) -> Result<(), KeyError> {
        let n_layers = model.n_layers;
        let rotating: Vec<bool> = (0..n_layers)
            .map(|layer| !model.is_nope_layer(layer))
            .collect();
        let every_layer_rotates = rotating.iter().all(|&rotates| rotates);
        let only_rotating = || (!every_layer_rotates).then(|| rotating.clone());

        model.attention_chunk = self.attention_chunk_size;
        model.chunked_layers = self.chunked_layers(n_layers)?;
        if model
            .chunked_layers
            .as_ref()
            .is_some_and(|layers| !layers.contains(&true))
        {
            model.attention_chunk = None;
            model.chunked_layers = None;
        }

        if self.use_qk_norm.unwrap_or(true) && rotating.contains(&true) {
            model.qk_norm = Some(
                QkNormConfig::new()
                    .with_placement(QkNormPlacement::PerHeadAfterRope)
                    .with_eps(model.norm_eps)
                    .with_scale(false),
            );
            model.qk_norm_layers = only_rotating();
        }

        if self.attn_temperature_tuning.unwrap_or(true) && !every_layer_rotates {
            let interval = self.floor_scale()?;
            let beta = self.attn_scale.unwrap_or(0.1);
            if !beta.is_finite() {
                return Err(KeyError::new(
                    "attn_scale",
                    format!("must be finite, got {beta}"),
                ));
            }
            model.query_temperature =
                Some(QueryTemperatureConfig::new(beta, interval).with_position_offset(1));
            model.query_temperature_layers = model.nope_layers.clone();
        }

        unread.fixed(
            "router_jitter_noise",
            self.router_jitter_noise,
            0.0,
            "no noise on the router's inputs",
        );
        self.apply_experts(model)
    }

    /// The layers that attend within chunks: those `layer_types` names
    /// `chunked_attention` (the defaults make them the layers with RoPE when the file
    /// has a chunk size); `None` when every layer does.
    fn chunked_layers(&self, n_layers: usize) -> Result<Option<Vec<bool>>, KeyError> {
        let Some(types) = &self.layer_types else {
            return Ok(None);
        };
        let chunked = layers_of_kind(types, n_layers, "chunked_attention")?;
        if chunked.contains(&true) && self.attention_chunk_size.is_none() {
            return Err(KeyError::new(
                "layer_types",
                "names chunked_attention layers, but attention_chunk_size is null: give the \
                 chunk size, or make every layer full_attention",
            ));
        }
        Ok((!chunked.iter().all(|&chunked| chunked)).then_some(chunked))
    }

    /// `floor_scale`, the positions per step of the query temperature: a positive whole
    /// number.
    fn floor_scale(&self) -> Result<usize, KeyError> {
        let scale = self.floor_scale.unwrap_or(8192.0);
        if !(scale >= 1.0 && scale.fract() == 0.0 && scale <= u32::MAX as f64) {
            return Err(KeyError::new(
                "floor_scale",
                format!("expected a positive whole number of positions, got {scale}"),
            ));
        }
        Ok(scale as usize)
    }

    /// The dense layers' width and the experts of the sparse layers.
    fn apply_experts(&self, model: &mut CausalLmConfig) -> Result<(), KeyError> {
        let n_layers = model.n_layers;
        let sparse: Vec<usize> = match &self.moe_layers {
            Some(layers) => layers.clone(),
            None => {
                let step = self.interleave_moe_layer_step.unwrap_or(1);
                if step == 0 {
                    return Err(KeyError::new(
                        "interleave_moe_layer_step",
                        "must be positive",
                    ));
                }
                (step - 1..n_layers).step_by(step).collect()
            }
        };
        if let Some(&layer) = sparse.iter().find(|&&layer| layer >= n_layers) {
            return Err(KeyError::new(
                "moe_layers",
                format!("names layer {layer} of a model of {n_layers} layers"),
            ));
        }
        let expert_width = model.d_ff;
        if let Some(width) = self.intermediate_size_mlp {
            model.d_ff = width;
        }
        if sparse.is_empty() {
            return Ok(());
        }
        let n_experts = self.num_local_experts.unwrap_or(16);
        let top_k = self.num_experts_per_tok.unwrap_or(1);
        let d_ff = self.intermediate_size.unwrap_or(expert_width);
        let router = RouterConfig::new(model.d_model, n_experts, top_k)
            .with_scoring(RouterScoring::Sigmoid)
            .with_norm_topk_prob(false)
            .with_initializer(model.initializer.clone());
        let moe = MoeConfig::new(router, d_ff)
            .with_n_shared_experts(1)
            .with_activation(model.activation)
            .with_weighted_inputs(true);
        moe.validate().map_err(|error| {
            KeyError::new(
                "num_local_experts",
                format!("builds no mixture of experts: {error}"),
            )
        })?;
        model.moe = Some(moe);
        model.moe_layers = MoeLayerPlan::new().with_dense_layers(
            (0..n_layers)
                .filter(|layer| !sparse.contains(layer))
                .collect(),
        );
        if let Some(coef) = self.router_aux_loss_coef {
            model.aux_loss_coef = coef;
        }
        Ok(())
    }
}
