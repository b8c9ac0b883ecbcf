//! MPT's checkpoint layout. Its keys name the model `transformer` and its parts `wte`,
//! `blocks.N.norm_1`, `attn.Wqkv`, `attn.out_proj`, `norm_2`, `ffn.up_proj`,
//! `ffn.down_proj`, `norm_f` ([`NAMES`]). `Wqkv` holds q, k and v one after the other
//! ([`FUSED_QKV`]).

use super::own_names::OwnNames;

/// MPT's names ([`OwnNames`]).
pub(crate) const NAMES: OwnNames = OwnNames {
    prefix: "transformer.",
    bare_prefixes: &[],
    layers: "blocks.",
    // The output projection before the attention, which would match it first.
    layer_names: &[
        ("norm_1.", "input_layernorm."),
        ("norm_2.", "post_attention_layernorm."),
        ("attn.out_proj.", "self_attn.o_proj."),
        ("attn.", "self_attn."),
        ("ffn.up_proj.", "mlp.fc1."),
        ("ffn.down_proj.", "mlp.fc2."),
    ],
    model_names: &[("wte.", "model.embed_tokens."), ("norm_f.", "model.norm.")],
    buffers: &[],
    head: "lm_head.",
    fused_qkv: Some("attn.Wqkv"),
};

/// `Wqkv`'s weight holds q, k and v one after the other: the fused key's suffix and
/// its blocks' suffixes, in order.
pub(crate) const FUSED_QKV: [(&str, [&str; 3]); 1] = [(
    "attn.Wqkv.weight",
    [
        "attn.q_proj.weight",
        "attn.k_proj.weight",
        "attn.v_proj.weight",
    ],
)];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hf::own_names::assert_maps_both_ways;

    #[test]
    fn keys_map_both_ways() {
        let pairs = [
            ("transformer.wte.weight", "model.embed_tokens.weight"),
            ("transformer.norm_f.weight", "model.norm.weight"),
            (
                "transformer.blocks.1.norm_1.weight",
                "model.layers.1.input_layernorm.weight",
            ),
            (
                "transformer.blocks.1.norm_2.weight",
                "model.layers.1.post_attention_layernorm.weight",
            ),
            (
                "transformer.blocks.1.attn.k_proj.weight",
                "model.layers.1.self_attn.k_proj.weight",
            ),
            (
                "transformer.blocks.1.attn.out_proj.weight",
                "model.layers.1.self_attn.o_proj.weight",
            ),
            (
                "transformer.blocks.1.ffn.up_proj.weight",
                "model.layers.1.mlp.fc1.weight",
            ),
            (
                "transformer.blocks.1.ffn.down_proj.weight",
                "model.layers.1.mlp.fc2.weight",
            ),
        ];
        assert_maps_both_ways(&NAMES, &pairs);
    }
}
