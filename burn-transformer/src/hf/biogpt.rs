//! BioGPT's checkpoint layout: the model `biogpt` with OPT's names of its parts
//! (`embed_tokens`, `embed_positions`, `layers.N.self_attn.{q,k,v,out}_proj`,
//! `self_attn_layer_norm`, `fc1`, `fc2`, `final_layer_norm`), its final norm
//! `layer_norm` and the head `output_projection` ([`NAMES`]).

use super::opt;
use super::own_names::OwnNames;

/// BioGPT's names ([`OwnNames`]): OPT's layers under `biogpt.`, its final norm
/// `layer_norm` and its head `output_projection`.
pub(crate) const NAMES: OwnNames = OwnNames {
    prefix: "biogpt.",
    bare_prefixes: &[],
    model_names: &[
        ("embed_tokens.", "model.embed_tokens."),
        ("embed_positions.", "embed_positions."),
        ("layer_norm.", "model.norm."),
    ],
    head: "output_projection.",
    ..opt::NAMES
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hf::own_names::assert_maps_both_ways;

    #[test]
    fn keys_map_both_ways() {
        let pairs = [
            ("biogpt.embed_tokens.weight", "model.embed_tokens.weight"),
            ("biogpt.embed_positions.weight", "embed_positions.weight"),
            ("biogpt.layer_norm.bias", "model.norm.bias"),
            ("output_projection.weight", "lm_head.weight"),
            (
                "biogpt.layers.1.self_attn.q_proj.bias",
                "model.layers.1.self_attn.q_proj.bias",
            ),
            (
                "biogpt.layers.1.self_attn.out_proj.weight",
                "model.layers.1.self_attn.o_proj.weight",
            ),
            (
                "biogpt.layers.1.self_attn_layer_norm.weight",
                "model.layers.1.input_layernorm.weight",
            ),
            (
                "biogpt.layers.1.final_layer_norm.bias",
                "model.layers.1.post_attention_layernorm.bias",
            ),
            (
                "biogpt.layers.1.fc2.weight",
                "model.layers.1.mlp.fc2.weight",
            ),
        ];
        assert_maps_both_ways(&NAMES, &pairs);
    }
}
