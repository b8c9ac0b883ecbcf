//! OPT's checkpoint layout. Its keys name the decoder `model.decoder` (`decoder` in a
//! bare `OPTModel`'s checkpoints) and its parts `embed_tokens`, `embed_positions`,
//! `layers.N.self_attn.out_proj`, `self_attn_layer_norm`, `fc1`, `fc2`,
//! `final_layer_norm` (the layer's second norm) and `final_layer_norm` (the decoder's)
//! ([`NAMES`]). Its table of positions keeps two rows before position 0.

use super::own_names::OwnNames;

/// OPT's names ([`OwnNames`]).
pub(crate) const NAMES: OwnNames = OwnNames {
    prefix: "model.decoder.",
    bare_prefixes: &["decoder."],
    layers: "layers.",
    layer_names: &[
        ("self_attn_layer_norm.", "input_layernorm."),
        ("self_attn.out_proj.", "self_attn.o_proj."),
        ("final_layer_norm.", "post_attention_layernorm."),
        ("fc1.", "mlp.fc1."),
        ("fc2.", "mlp.fc2."),
    ],
    model_names: &[
        ("embed_tokens.", "model.embed_tokens."),
        ("embed_positions.", "embed_positions."),
        ("final_layer_norm.", "model.norm."),
    ],
    buffers: &[],
    head: "lm_head.",
    fused_qkv: None,
};

/// The rows OPT's table of positions keeps before position 0.
pub(crate) const RESERVED_POSITION_ROWS: usize = 2;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hf::own_names::assert_maps_both_ways;

    #[test]
    fn keys_map_both_ways() {
        let pairs = [
            (
                "model.decoder.embed_tokens.weight",
                "model.embed_tokens.weight",
            ),
            (
                "model.decoder.embed_positions.weight",
                "embed_positions.weight",
            ),
            ("model.decoder.final_layer_norm.bias", "model.norm.bias"),
            (
                "model.decoder.layers.3.self_attn_layer_norm.weight",
                "model.layers.3.input_layernorm.weight",
            ),
            (
                "model.decoder.layers.3.final_layer_norm.bias",
                "model.layers.3.post_attention_layernorm.bias",
            ),
            (
                "model.decoder.layers.3.self_attn.k_proj.bias",
                "model.layers.3.self_attn.k_proj.bias",
            ),
            (
                "model.decoder.layers.3.self_attn.out_proj.weight",
                "model.layers.3.self_attn.o_proj.weight",
            ),
            (
                "model.decoder.layers.3.fc1.weight",
                "model.layers.3.mlp.fc1.weight",
            ),
            (
                "model.decoder.layers.3.fc2.bias",
                "model.layers.3.mlp.fc2.bias",
            ),
        ];
        assert_maps_both_ways(&NAMES, &pairs);
        // A bare OPTModel's checkpoint.
        assert_eq!(
            NAMES.our_key("decoder.layers.0.fc1.bias").as_deref(),
            Some("model.layers.0.mlp.fc1.bias")
        );
    }
}
