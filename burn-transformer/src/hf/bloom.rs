//! BLOOM's checkpoint layout: Falcon's names (`transformer.word_embeddings`,
//! `h.N.input_layernorm`, `self_attention.query_key_value`, `self_attention.dense`,
//! `post_attention_layernorm`, `mlp.dense_h_to_4h`, `mlp.dense_4h_to_h`, `ln_f`) and
//! the norm of the embeddings, `word_embeddings_layernorm` ([`NAMES`]). The published
//! checkpoints are a bare `BloomModel`'s, without the `transformer.` prefix.
//! `query_key_value` holds q, k and v head by head, as Falcon's with one query head per
//! group ([`FusedHeads`](super::fused_heads::FusedHeads)).

use super::falcon;
use super::own_names::OwnNames;

/// BLOOM's names ([`OwnNames`]): Falcon's, with the embeddings' norm.
pub(crate) const NAMES: OwnNames = OwnNames {
    model_names: &[
        ("word_embeddings_layernorm.", "embed_norm."),
        ("word_embeddings.", "model.embed_tokens."),
        ("ln_f.", "model.norm."),
    ],
    ..falcon::NAMES
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hf::own_names::assert_maps_both_ways;

    #[test]
    fn keys_map_both_ways() {
        let pairs = [
            (
                "transformer.word_embeddings.weight",
                "model.embed_tokens.weight",
            ),
            (
                "transformer.word_embeddings_layernorm.bias",
                "embed_norm.bias",
            ),
            ("transformer.ln_f.weight", "model.norm.weight"),
            (
                "transformer.h.3.self_attention.q_proj.weight",
                "model.layers.3.self_attn.q_proj.weight",
            ),
            (
                "transformer.h.3.self_attention.dense.bias",
                "model.layers.3.self_attn.o_proj.bias",
            ),
            (
                "transformer.h.3.post_attention_layernorm.weight",
                "model.layers.3.post_attention_layernorm.weight",
            ),
            (
                "transformer.h.3.mlp.dense_4h_to_h.weight",
                "model.layers.3.mlp.fc2.weight",
            ),
        ];
        assert_maps_both_ways(&NAMES, &pairs);
        // The published checkpoints' bare keys.
        assert_eq!(
            NAMES.our_key("word_embeddings_layernorm.weight").as_deref(),
            Some("embed_norm.weight")
        );
        assert_eq!(
            NAMES.our_key("h.0.input_layernorm.bias").as_deref(),
            Some("model.layers.0.input_layernorm.bias")
        );
    }
}
