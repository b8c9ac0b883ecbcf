//! GPT-NeoX's checkpoint layout (Pythia, GPT-NeoX-20B). Its keys name the model
//! `gpt_neox` and its parts `embed_in`, `layers.N.attention.query_key_value`,
//! `attention.dense`, `mlp.dense_h_to_4h`, `mlp.dense_4h_to_h`, `final_layer_norm`, and
//! the head `embed_out` ([`NAMES`]). `query_key_value` holds q, k and v head by head:
//! head `h`'s rows are its q rows, then its k rows, then its v rows ([`FUSED_QKV`],
//! [`FusedHeads`](super::fused_heads::FusedHeads) with one query head per group).

use super::own_names::OwnNames;

/// GPT-NeoX's names ([`OwnNames`]); its norms are named as ours. Old checkpoints store
/// the causal mask as `attention.bias` / `attention.masked_bias` and the rotary
/// frequencies as `attention.rotary_emb.inv_freq`.
pub(crate) const NAMES: OwnNames = OwnNames {
    prefix: "gpt_neox.",
    bare_prefixes: &[],
    layers: "layers.",
    // The output projection before the attention, which would match it first.
    layer_names: &[
        ("attention.dense.", "self_attn.o_proj."),
        ("attention.", "self_attn."),
        ("mlp.dense_h_to_4h.", "mlp.fc1."),
        ("mlp.dense_4h_to_h.", "mlp.fc2."),
    ],
    model_names: &[
        ("embed_in.", "model.embed_tokens."),
        ("final_layer_norm.", "model.norm."),
    ],
    buffers: &[
        ".attention.bias",
        ".attention.masked_bias",
        ".rotary_emb.inv_freq",
    ],
    head: "embed_out.",
    fused_qkv: Some("attention.query_key_value"),
};

/// `query_key_value`'s weight and bias hold q, k and v, head by head: the fused key's
/// suffix and its blocks' suffixes, in order.
pub(crate) const FUSED_QKV: [(&str, [&str; 3]); 2] = [
    (
        "attention.query_key_value.weight",
        [
            "attention.q_proj.weight",
            "attention.k_proj.weight",
            "attention.v_proj.weight",
        ],
    ),
    (
        "attention.query_key_value.bias",
        [
            "attention.q_proj.bias",
            "attention.k_proj.bias",
            "attention.v_proj.bias",
        ],
    ),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hf::own_names::assert_maps_both_ways;

    #[test]
    fn keys_map_both_ways() {
        let pairs = [
            ("gpt_neox.embed_in.weight", "model.embed_tokens.weight"),
            ("gpt_neox.final_layer_norm.bias", "model.norm.bias"),
            ("embed_out.weight", "lm_head.weight"),
            (
                "gpt_neox.layers.2.input_layernorm.weight",
                "model.layers.2.input_layernorm.weight",
            ),
            (
                "gpt_neox.layers.2.attention.q_proj.bias",
                "model.layers.2.self_attn.q_proj.bias",
            ),
            (
                "gpt_neox.layers.2.attention.dense.weight",
                "model.layers.2.self_attn.o_proj.weight",
            ),
            (
                "gpt_neox.layers.2.mlp.dense_h_to_4h.weight",
                "model.layers.2.mlp.fc1.weight",
            ),
            (
                "gpt_neox.layers.2.mlp.dense_4h_to_h.bias",
                "model.layers.2.mlp.fc2.bias",
            ),
        ];
        assert_maps_both_ways(&NAMES, &pairs);
        // transformers 5's name of the head, and old checkpoints' buffers.
        assert_eq!(
            NAMES.our_key("lm_head.weight").as_deref(),
            Some("lm_head.weight")
        );
        for buffer in [
            "gpt_neox.layers.0.attention.bias",
            "gpt_neox.layers.0.attention.masked_bias",
            "gpt_neox.layers.0.attention.rotary_emb.inv_freq",
        ] {
            assert_eq!(NAMES.our_key(buffer), None, "{buffer}");
        }
    }
}
