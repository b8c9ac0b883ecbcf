//! DeepSeek-V2/V3's multi-head latent attention keys of a `config.json`, mapped to a
//! [`LatentAttentionConfig`].

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use super::error::HfError;
use super::keys::{KeyError, read_keys, required};
use super::rope::RopeKeys;
use crate::attention::LatentAttentionConfig;
use crate::position::RopeLayout;

/// Reads the attention of a Hugging Face DeepSeek-V2/V3 `config.json` (already parsed;
/// `path` only names it in errors): `hidden_size`, `num_attention_heads`,
/// `kv_lora_rank`, `qk_nope_head_dim`, `qk_rope_head_dim`, `v_head_dim`, `q_lora_rank`
/// (null for a direct `q_proj`), `attention_bias` (default false), `attention_dropout`
/// (default 0), `rope_interleave` (default true) and the rotary embedding as
/// [`rope_config`](super::rope_config) reads it, its head size set to
/// `qk_rope_head_dim`.
///
/// # Errors
/// [`HfError::Field`] naming the key that is missing or malformed.
pub fn latent_attention_config(
    config: &Value,
    path: impl AsRef<Path>,
) -> Result<LatentAttentionConfig, HfError> {
    let path = path.as_ref();
    LatentKeys::read(config)
        .and_then(|(keys, rope)| keys.latent_attention_config(&rope))
        .map_err(|error| error.in_file(path))
}

/// The multi-head latent attention keys of a `config.json`.
#[derive(Deserialize, Debug)]
pub(crate) struct LatentKeys {
    hidden_size: Option<usize>,
    num_attention_heads: Option<usize>,
    kv_lora_rank: Option<usize>,
    qk_nope_head_dim: Option<usize>,
    qk_rope_head_dim: Option<usize>,
    v_head_dim: Option<usize>,
    q_lora_rank: Option<usize>,
    attention_bias: Option<bool>,
    attention_dropout: Option<f64>,
    pub(crate) rope_interleave: Option<bool>,
}

impl LatentKeys {
    /// These keys and the rotary embedding's, from one `config.json`.
    pub(crate) fn read(config: &Value) -> Result<(Self, RopeKeys), KeyError> {
        Ok((read_keys(config, None)?, read_keys(config, None)?))
    }

    /// The attention these keys describe, with the rotary embedding of `rope`.
    pub(crate) fn latent_attention_config(
        &self,
        rope: &RopeKeys,
    ) -> Result<LatentAttentionConfig, KeyError> {
        let size = |value, key| required(value, key, "a non-negative integer");
        let qk_rope_head_dim = size(self.qk_rope_head_dim, "qk_rope_head_dim")?;
        let mut rope = rope.rope_config()?;
        // HF's DeepSeek config sets head_dim = qk_rope_head_dim: only that part rotates,
        // all of it (Mistral-4's `partial_rotary_factor` is that part's share of the
        // whole query head, `qk_rope / (qk_nope + qk_rope)`).
        rope.head_dim = qk_rope_head_dim;
        rope.partial_rotary_factor = 1.0;
        rope.layout = if self.rope_interleave.unwrap_or(true) {
            RopeLayout::Interleaved
        } else {
            RopeLayout::HalfSplit
        };
        Ok(LatentAttentionConfig::new(
            size(self.hidden_size, "hidden_size")?,
            size(self.num_attention_heads, "num_attention_heads")?,
            size(self.kv_lora_rank, "kv_lora_rank")?,
            size(self.qk_nope_head_dim, "qk_nope_head_dim")?,
            qk_rope_head_dim,
            size(self.v_head_dim, "v_head_dim")?,
        )
        .with_q_lora_rank(self.q_lora_rank)
        .with_attention_bias(self.attention_bias.unwrap_or(false))
        .with_dropout(self.attention_dropout.unwrap_or(0.0))
        .with_rope(Some(rope)))
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::Device;

    use super::*;
    use crate::attention::{LatentAttention, LatentPath};
    use crate::hf::tests::fixture_config;
    use crate::norm::{RmsNorm, RmsNormConfig};
    use crate::test_utils::{Fixture, assert_close, test_devices};

    fn load_norm(fixture: &Fixture, prefix: &str, device: &Device) -> RmsNorm {
        let weight = fixture.tensor::<1>(&format!("{prefix}.weight"), device);
        let mut norm = RmsNormConfig::new(weight.dims()[0]).init(device);
        norm.weight = Some(burn::module::Param::from_tensor(weight));
        norm
    }

    /// The fixture's HF config and an attention holding its weights.
    fn load(name: &str, device: &Device) -> (Fixture, LatentAttentionConfig, LatentAttention) {
        let fixture = Fixture::load(name);
        let config = latent_attention_config(&fixture_config(name), name).unwrap();
        let mut attention = config.init(device);
        let linear = |prefix| Some(fixture.linear(prefix, device));
        if config.q_lora_rank.is_some() {
            attention.q_a_proj = linear("q_a_proj");
            attention.q_a_layernorm = Some(load_norm(&fixture, "q_a_layernorm", device));
            attention.q_b_proj = linear("q_b_proj");
        } else {
            attention.q_proj = linear("q_proj");
        }
        attention.kv_a_proj_with_mqa = fixture.linear("kv_a_proj_with_mqa", device);
        attention.kv_a_layernorm = load_norm(&fixture, "kv_a_layernorm", device);
        attention.kv_b_proj = fixture.linear("kv_b_proj", device);
        attention.o_proj = fixture.linear("o_proj", device);
        (fixture, config, attention)
    }

    const FIXTURES: [&str; 2] = ["mla_yarn", "mla_q_proj"];

    #[test]
    fn matches_hugging_face_deepseek_v3_attention_on_both_paths() {
        for name in FIXTURES {
            for device in test_devices() {
                let (fixture, _, attention) = load(name, &device);
                let x = fixture.tensor::<3>("x", &device);
                let expected = fixture.tensor::<3>("y", &device);
                for path in [LatentPath::Expanded, LatentPath::Absorbed] {
                    let y = attention.forward_path(x.clone(), None, path);
                    assert_close(y, expected.clone(), 1e-5, &format!("{name} {path:?}"));
                }
            }
        }
    }

    #[test]
    fn softmax_scale_includes_yarn_mscale_as_hugging_face() {
        for name in FIXTURES {
            let (fixture, config, attention) = load(name, &Device::flex());
            let expected = fixture.scalar("scaling") as f64;
            assert!(
                (attention.scale() - expected).abs() < 1e-7,
                "{name}: scale {} vs HF {expected}",
                attention.scale()
            );
            assert!(
                (attention.rope.attention_scaling() - fixture.scalar("attention_scaling") as f64)
                    .abs()
                    < 1e-6
            );
            assert_eq!(config.rope_config().layout, RopeLayout::Interleaved);
        }
    }

    #[test]
    fn reads_the_keys_and_names_the_missing_one() {
        let config = latent_attention_config(&fixture_config("mla_yarn"), "config.json").unwrap();
        assert_eq!(
            (config.d_model, config.n_heads, config.kv_lora_rank),
            (32, 4, 16)
        );
        assert_eq!(config.q_lora_rank, Some(24));
        assert!(config.attention_bias);
        assert_eq!(config.rope_config().head_dim, 8);
        let direct = latent_attention_config(&fixture_config("mla_q_proj"), "config.json").unwrap();
        assert_eq!(direct.q_lora_rank, None);

        let error = latent_attention_config(&serde_json::json!({"hidden_size": 8}), "config.json")
            .unwrap_err();
        assert!(
            matches!(&error, HfError::Field { field, .. } if field == "qk_rope_head_dim"),
            "{error}"
        );
        let mut halved = fixture_config("mla_q_proj");
        halved["rope_interleave"] = Value::from(false);
        halved["attention_dropout"] = Value::from(0.25);
        let halved = latent_attention_config(&halved, "config.json").unwrap();
        assert_eq!(halved.rope_config().layout, RopeLayout::HalfSplit);
        assert_eq!(halved.dropout, 0.25);
    }
}
