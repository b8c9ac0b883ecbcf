//! GPT-Neo's checkpoint layout: GPT-2's names (`transformer.wte`, `wpe`, `h.N.ln_1`,
//! `ln_2`, `mlp.c_fc`, `mlp.c_proj`, `ln_f`) as `nn.Linear` layers, with the attention
//! one level deeper, `attn.attention.{q,k,v,out}_proj` ([`NAMES`]).

use super::gpt2;
use super::own_names::OwnNames;

/// GPT-Neo's names ([`OwnNames`]): GPT-2's, with the attention's projections one level
/// deeper and apart. Old checkpoints store each attention's mask as
/// `attn.attention.bias` and `attn.attention.masked_bias`.
pub(crate) const NAMES: OwnNames = OwnNames {
    // The output projection before the attention, which would match it first.
    layer_names: &[
        ("ln_1.", "input_layernorm."),
        ("ln_2.", "post_attention_layernorm."),
        ("attn.attention.out_proj.", "self_attn.o_proj."),
        ("attn.attention.", "self_attn."),
        ("mlp.c_fc.", "mlp.fc1."),
        ("mlp.c_proj.", "mlp.fc2."),
    ],
    buffers: &[".attn.attention.bias", ".attn.attention.masked_bias"],
    fused_qkv: None,
    ..gpt2::NAMES
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hf::own_names::assert_maps_both_ways;

    #[test]
    fn keys_map_both_ways() {
        let pairs = [
            ("transformer.wte.weight", "model.embed_tokens.weight"),
            ("transformer.wpe.weight", "embed_positions.weight"),
            ("transformer.ln_f.bias", "model.norm.bias"),
            (
                "transformer.h.2.ln_1.weight",
                "model.layers.2.input_layernorm.weight",
            ),
            (
                "transformer.h.2.ln_2.bias",
                "model.layers.2.post_attention_layernorm.bias",
            ),
            (
                "transformer.h.2.attn.attention.q_proj.weight",
                "model.layers.2.self_attn.q_proj.weight",
            ),
            (
                "transformer.h.2.attn.attention.out_proj.bias",
                "model.layers.2.self_attn.o_proj.bias",
            ),
            (
                "transformer.h.2.mlp.c_fc.weight",
                "model.layers.2.mlp.fc1.weight",
            ),
            (
                "transformer.h.2.mlp.c_proj.bias",
                "model.layers.2.mlp.fc2.bias",
            ),
        ];
        assert_maps_both_ways(&NAMES, &pairs);
        for buffer in [
            "transformer.h.0.attn.attention.bias",
            "transformer.h.0.attn.attention.masked_bias",
        ] {
            assert_eq!(NAMES.our_key(buffer), None, "{buffer}");
        }
    }
}
