//! Apertus' checkpoint layout: LLaMA's names, with its block norms named
//! `attention_layernorm` and `feedforward_layernorm` ([`NAMES`]) and its ungated
//! feed-forward's `up_proj` / `down_proj` (ours `fc1` / `fc2`). The xIELU activation
//! stores its learned factors `mlp.act_fn.alpha_p` / `alpha_n` (ours by the same names)
//! beside two constants of the activation saved as buffers, `mlp.act_fn.beta` and
//! `mlp.act_fn.eps` ([`XIELU_BUFFERS`]): ignored when loading (ours are
//! [`XieluConfig`]'s), written back when saving.

use crate::ffn::XieluConfig;

/// Apertus' names of the block norms and of the feed-forward's projections, and ours.
pub(crate) const NAMES: [(&str, &str); 4] = [
    (".attention_layernorm.", ".input_layernorm."),
    (".feedforward_layernorm.", ".post_attention_layernorm."),
    (".mlp.up_proj.", ".mlp.fc1."),
    (".mlp.down_proj.", ".mlp.fc2."),
];

/// The suffixes of xIELU's constant buffers in a decoder layer.
pub(crate) const XIELU_BUFFERS: [&str; 2] = [".mlp.act_fn.beta", ".mlp.act_fn.eps"];

/// Whether `key` is one of xIELU's constant buffers ([`XIELU_BUFFERS`]).
pub(crate) fn is_xielu_buffer(key: &str) -> bool {
    XIELU_BUFFERS.iter().any(|suffix| key.ends_with(suffix))
}

/// The buffers of xIELU in layer `layer`, as transformers saves them: each key and its
/// value (a tensor of no dimensions), from [`XieluConfig`]'s `beta` and `eps`.
pub(crate) fn xielu_buffers(layer: usize) -> [(String, f64); 2] {
    let config = XieluConfig::new();
    let [beta, eps] = XIELU_BUFFERS;
    [
        (format!("model.layers.{layer}{beta}"), config.beta),
        (format!("model.layers.{layer}{eps}"), config.eps),
    ]
}
