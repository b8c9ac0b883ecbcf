//! Persimmon's checkpoint layout (Persimmon-8B, Fuyu's language model): LLaMA's
//! `model.layers.N.…` with parts of its own, `self_attn.query_key_value` (q, k and v
//! fused head by head, as GPT-NeoX's: head `h`'s rows are its q rows, then its k rows,
//! then its v rows, [`FUSED_QKV`]), `self_attn.dense`, the QK-norms
//! `self_attn.q_layernorm` / `k_layernorm`, `mlp.dense_h_to_4h`, `mlp.dense_4h_to_h`
//! and `model.final_layernorm` ([`NAMES`]).

use super::own_names::OwnNames;

/// Persimmon's names ([`OwnNames`]); its block norms are named as ours. Old checkpoints
/// store the rotary frequencies as `self_attn.rotary_emb.inv_freq`.
pub(crate) const NAMES: OwnNames = OwnNames {
    prefix: "model.",
    bare_prefixes: &[],
    layers: "layers.",
    layer_names: &[
        ("self_attn.dense.", "self_attn.o_proj."),
        ("self_attn.q_layernorm.", "self_attn.q_norm."),
        ("self_attn.k_layernorm.", "self_attn.k_norm."),
        ("mlp.dense_h_to_4h.", "mlp.fc1."),
        ("mlp.dense_4h_to_h.", "mlp.fc2."),
    ],
    model_names: &[
        ("embed_tokens.", "model.embed_tokens."),
        ("final_layernorm.", "model.norm."),
    ],
    buffers: &[".rotary_emb.inv_freq"],
    head: "lm_head.",
    fused_qkv: Some("self_attn.query_key_value"),
};

/// `query_key_value`'s weight and bias hold q, k and v, head by head: the fused key's
/// suffix and its blocks' suffixes, in order.
pub(crate) const FUSED_QKV: [(&str, [&str; 3]); 2] = [
    (
        "self_attn.query_key_value.weight",
        [
            "self_attn.q_proj.weight",
            "self_attn.k_proj.weight",
            "self_attn.v_proj.weight",
        ],
    ),
    (
        "self_attn.query_key_value.bias",
        [
            "self_attn.q_proj.bias",
            "self_attn.k_proj.bias",
            "self_attn.v_proj.bias",
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
            ("model.embed_tokens.weight", "model.embed_tokens.weight"),
            ("model.final_layernorm.bias", "model.norm.bias"),
            ("lm_head.weight", "lm_head.weight"),
            (
                "model.layers.2.input_layernorm.weight",
                "model.layers.2.input_layernorm.weight",
            ),
            (
                "model.layers.2.post_attention_layernorm.bias",
                "model.layers.2.post_attention_layernorm.bias",
            ),
            (
                "model.layers.2.self_attn.q_proj.bias",
                "model.layers.2.self_attn.q_proj.bias",
            ),
            (
                "model.layers.2.self_attn.dense.weight",
                "model.layers.2.self_attn.o_proj.weight",
            ),
            (
                "model.layers.2.self_attn.q_layernorm.bias",
                "model.layers.2.self_attn.q_norm.bias",
            ),
            (
                "model.layers.2.self_attn.k_layernorm.weight",
                "model.layers.2.self_attn.k_norm.weight",
            ),
            (
                "model.layers.2.mlp.dense_h_to_4h.weight",
                "model.layers.2.mlp.fc1.weight",
            ),
            (
                "model.layers.2.mlp.dense_4h_to_h.bias",
                "model.layers.2.mlp.fc2.bias",
            ),
        ];
        assert_maps_both_ways(&NAMES, &pairs);
        assert_eq!(
            NAMES.our_key("model.layers.0.self_attn.rotary_emb.inv_freq"),
            None
        );
    }
}
