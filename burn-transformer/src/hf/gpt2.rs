//! GPT-2's checkpoint layout. Its keys name the model `transformer` and its parts
//! `wte`, `wpe`, `h.N`, `ln_1`, `attn.c_attn`, `mlp.c_fc`, `ln_f` ([`NAMES`]). Its
//! linear layers are `Conv1D`s, whose weights are stored `[in, out]` where torch's
//! `nn.Linear` stores `[out, in]` ([`is_conv1d_weight`]), and `c_attn` holds q, k and
//! v, columns side by side ([`FUSED_QKV`]).

use super::own_names::OwnNames;

/// GPT-2's names ([`OwnNames`]): `transformer.wte`, `wpe`, `h.N.ln_1`, `attn`,
/// `attn.c_proj`, `ln_2`, `mlp.c_fc`, `mlp.c_proj`, `ln_f`; old checkpoints store the
/// causal mask as `attn.bias` and `attn.masked_bias`.
pub(crate) const NAMES: OwnNames = OwnNames {
    prefix: "transformer.",
    bare_prefixes: &[],
    layers: "h.",
    // The output projection before the attention, which would match it first.
    layer_names: &[
        ("ln_1.", "input_layernorm."),
        ("ln_2.", "post_attention_layernorm."),
        ("attn.c_proj.", "self_attn.o_proj."),
        ("attn.", "self_attn."),
        ("mlp.c_fc.", "mlp.fc1."),
        ("mlp.c_proj.", "mlp.fc2."),
    ],
    model_names: &[
        ("wte.", "model.embed_tokens."),
        ("wpe.", "embed_positions."),
        ("ln_f.", "model.norm."),
    ],
    buffers: &[".attn.bias", ".attn.masked_bias"],
    head: "lm_head.",
    fused_qkv: Some("attn.c_attn"),
};

/// `c_attn`'s weight and bias hold q, k and v (after the `Conv1D` transpose, as rows):
/// the fused key's suffix and its blocks' suffixes, in order.
pub(crate) const FUSED_QKV: [(&str, [&str; 3]); 2] = [
    (
        "attn.c_attn.weight",
        [
            "attn.q_proj.weight",
            "attn.k_proj.weight",
            "attn.v_proj.weight",
        ],
    ),
    (
        "attn.c_attn.bias",
        ["attn.q_proj.bias", "attn.k_proj.bias", "attn.v_proj.bias"],
    ),
];

/// Whether GPT-2's `key` is the weight of a `Conv1D` layer, stored `[in, out]`.
pub(crate) fn is_conv1d_weight(key: &str) -> bool {
    [".c_attn.weight", ".c_proj.weight", ".c_fc.weight"]
        .iter()
        .any(|suffix| key.ends_with(suffix))
}

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
                "transformer.h.3.ln_1.weight",
                "model.layers.3.input_layernorm.weight",
            ),
            (
                "transformer.h.3.ln_2.bias",
                "model.layers.3.post_attention_layernorm.bias",
            ),
            (
                "transformer.h.3.attn.q_proj.weight",
                "model.layers.3.self_attn.q_proj.weight",
            ),
            (
                "transformer.h.3.attn.c_proj.bias",
                "model.layers.3.self_attn.o_proj.bias",
            ),
            (
                "transformer.h.12.mlp.c_fc.weight",
                "model.layers.12.mlp.fc1.weight",
            ),
            (
                "transformer.h.12.mlp.c_proj.weight",
                "model.layers.12.mlp.fc2.weight",
            ),
            ("lm_head.weight", "lm_head.weight"),
        ];
        assert_maps_both_ways(&NAMES, &pairs);
        // A bare GPT2Model's keys, and the causal-mask buffers.
        assert_eq!(
            NAMES.our_key("h.0.attn.k_proj.bias").as_deref(),
            Some("model.layers.0.self_attn.k_proj.bias")
        );
        assert_eq!(NAMES.our_key("transformer.h.0.attn.bias"), None);
        assert_eq!(NAMES.our_key("h.1.attn.masked_bias"), None);
        assert_eq!(
            NAMES.our_key("transformer.extra.weight").as_deref(),
            Some("extra.weight")
        );
        assert!(is_conv1d_weight("transformer.h.0.attn.c_attn.weight"));
        assert!(is_conv1d_weight("h.0.mlp.c_proj.weight"));
        assert!(!is_conv1d_weight("transformer.h.0.attn.c_attn.bias"));
        assert!(!is_conv1d_weight("transformer.wte.weight"));
    }

    /// PEFT's targets in GPT-2's names: the fused `c_attn`, and `c_proj`, which names
    /// two layers unless its parent is given.
    #[test]
    fn peft_targets_name_our_layers() {
        assert_eq!(
            NAMES.adapted_layers("c_attn"),
            ["q_proj", "k_proj", "v_proj"]
        );
        assert_eq!(NAMES.adapted_layers("c_proj"), ["o_proj", "fc2"]);
        assert_eq!(NAMES.adapted_layers("mlp.c_proj"), ["fc2"]);
        assert_eq!(
            NAMES.adapted_layers("transformer.h.0.attn.c_proj"),
            ["o_proj"]
        );
        assert!(NAMES.adapted_layers("q_proj").is_empty());
        assert_eq!(
            NAMES.peft_target("transformer.h.1.mlp.c_proj"),
            "mlp.c_proj"
        );
        assert_eq!(
            NAMES.peft_target("transformer.h.1.attn.c_proj"),
            "attn.c_proj"
        );
        assert_eq!(NAMES.peft_target("h.1.mlp.c_fc"), "mlp.c_fc");
    }
}
