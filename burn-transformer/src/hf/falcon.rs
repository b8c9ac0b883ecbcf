//! Falcon's checkpoint layout. Its keys name the model `transformer` and its parts
//! `word_embeddings`, `h.N.self_attention.query_key_value`, `self_attention.dense`,
//! `mlp.dense_h_to_4h`, `mlp.dense_4h_to_h`, `ln_f`; the norms of a layer are
//! `input_layernorm` (and `post_attention_layernorm` in sequential blocks), or
//! `ln_attn` and `ln_mlp` in the parallel blocks of two norms of
//! `new_decoder_architecture` ([`NAMES`], [`NAMES_TWO_NORMS`]). `query_key_value` holds
//! q, k and v group by group ([`FusedHeads`](super::fused_heads::FusedHeads)).

use super::own_names::OwnNames;

/// Falcon's names with one norm before its parallel sublayers, or two before
/// sequential ones, named as ours.
pub(crate) const NAMES: OwnNames = OwnNames {
    prefix: "transformer.",
    bare_prefixes: &[],
    layers: "h.",
    layer_names: LAYER_NAMES,
    model_names: MODEL_NAMES,
    buffers: &[],
    head: "lm_head.",
    fused_qkv: Some("self_attention.query_key_value"),
};

/// Falcon's names with a norm before each of its parallel sublayers (`ln_attn`,
/// `ln_mlp`).
pub(crate) const NAMES_TWO_NORMS: OwnNames = OwnNames {
    layer_names: &[
        ("ln_attn.", "input_layernorm."),
        ("ln_mlp.", "post_attention_layernorm."),
        // The output projection before the attention, which would match it first.
        ("self_attention.dense.", "self_attn.o_proj."),
        ("self_attention.", "self_attn."),
        ("mlp.dense_h_to_4h.", "mlp.fc1."),
        ("mlp.dense_4h_to_h.", "mlp.fc2."),
    ],
    ..NAMES
};

const LAYER_NAMES: &[(&str, &str)] = &[
    // The output projection before the attention, which would match it first.
    ("self_attention.dense.", "self_attn.o_proj."),
    ("self_attention.", "self_attn."),
    ("mlp.dense_h_to_4h.", "mlp.fc1."),
    ("mlp.dense_4h_to_h.", "mlp.fc2."),
];

const MODEL_NAMES: &[(&str, &str)] = &[
    ("word_embeddings.", "model.embed_tokens."),
    ("ln_f.", "model.norm."),
];

/// `query_key_value`'s weight and bias hold q, k and v group by group: the fused key's
/// suffix and its blocks' suffixes, in order.
pub(crate) const FUSED_QKV: [(&str, [&str; 3]); 2] = [
    (
        "self_attention.query_key_value.weight",
        [
            "self_attention.q_proj.weight",
            "self_attention.k_proj.weight",
            "self_attention.v_proj.weight",
        ],
    ),
    (
        "self_attention.query_key_value.bias",
        [
            "self_attention.q_proj.bias",
            "self_attention.k_proj.bias",
            "self_attention.v_proj.bias",
        ],
    ),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hf::own_names::assert_maps_both_ways;

    #[test]
    fn keys_map_both_ways() {
        let common = [
            (
                "transformer.word_embeddings.weight",
                "model.embed_tokens.weight",
            ),
            ("transformer.ln_f.bias", "model.norm.bias"),
            (
                "transformer.h.1.self_attention.k_proj.bias",
                "model.layers.1.self_attn.k_proj.bias",
            ),
            (
                "transformer.h.1.self_attention.dense.weight",
                "model.layers.1.self_attn.o_proj.weight",
            ),
            (
                "transformer.h.1.mlp.dense_h_to_4h.weight",
                "model.layers.1.mlp.fc1.weight",
            ),
        ];
        assert_maps_both_ways(&NAMES, &common);
        assert_maps_both_ways(&NAMES_TWO_NORMS, &common);
        assert_maps_both_ways(
            &NAMES,
            &[(
                "transformer.h.1.post_attention_layernorm.weight",
                "model.layers.1.post_attention_layernorm.weight",
            )],
        );
        assert_maps_both_ways(
            &NAMES_TWO_NORMS,
            &[
                (
                    "transformer.h.1.ln_attn.weight",
                    "model.layers.1.input_layernorm.weight",
                ),
                (
                    "transformer.h.1.ln_mlp.bias",
                    "model.layers.1.post_attention_layernorm.bias",
                ),
            ],
        );
    }
}
