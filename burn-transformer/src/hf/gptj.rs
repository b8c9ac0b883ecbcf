//! GPT-J's checkpoint layout. Its keys name the model `transformer` and its parts as
//! GPT-2 does (`wte`, `h.N.ln_1`, `ln_f`), its attention's projections `q_proj`,
//! `k_proj`, `v_proj`, `out_proj` and its feed-forward's `fc_in`, `fc_out`; the head
//! keeps its bias as `lm_head.bias` ([`NAMES`]).

use super::own_names::OwnNames;

/// GPT-J's names ([`OwnNames`]); old checkpoints store the causal mask as `attn.bias`
/// and `attn.masked_bias`.
pub(crate) const NAMES: OwnNames = OwnNames {
    prefix: "transformer.",
    bare_prefixes: &[],
    layers: "h.",
    // The output projection before the attention, which would match it first.
    layer_names: &[
        ("ln_1.", "input_layernorm."),
        ("attn.out_proj.", "self_attn.o_proj."),
        ("attn.", "self_attn."),
        ("mlp.fc_in.", "mlp.fc1."),
        ("mlp.fc_out.", "mlp.fc2."),
    ],
    model_names: &[("wte.", "model.embed_tokens."), ("ln_f.", "model.norm.")],
    buffers: &[".attn.bias", ".attn.masked_bias"],
    head: "lm_head.",
    fused_qkv: None,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hf::own_names::assert_maps_both_ways;

    #[test]
    fn keys_map_both_ways() {
        let pairs = [
            ("transformer.wte.weight", "model.embed_tokens.weight"),
            ("transformer.ln_f.bias", "model.norm.bias"),
            ("lm_head.bias", "lm_head.bias"),
            (
                "transformer.h.1.ln_1.weight",
                "model.layers.1.input_layernorm.weight",
            ),
            (
                "transformer.h.1.attn.q_proj.weight",
                "model.layers.1.self_attn.q_proj.weight",
            ),
            (
                "transformer.h.1.attn.out_proj.weight",
                "model.layers.1.self_attn.o_proj.weight",
            ),
            (
                "transformer.h.1.mlp.fc_in.bias",
                "model.layers.1.mlp.fc1.bias",
            ),
            (
                "transformer.h.1.mlp.fc_out.weight",
                "model.layers.1.mlp.fc2.weight",
            ),
        ];
        assert_maps_both_ways(&NAMES, &pairs);
        assert_eq!(NAMES.our_key("transformer.h.0.attn.masked_bias"), None);
    }
}
