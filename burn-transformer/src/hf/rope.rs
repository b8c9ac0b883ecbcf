//! The rotary embedding of a `config.json`: `rope_theta`, `rope_scaling` (or
//! transformers 5's `rope_parameters`, possibly one per layer type),
//! `max_position_embeddings`, `head_dim`, `partial_rotary_factor`, mapped to a
//! [`RopeConfig`].

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::error::HfError;
use super::keys::{KeyError, read_keys, whole_number};
use crate::position::{RopeConfig, RopeScaling};

/// Reads the rotary embedding of a Hugging Face `config.json` (already parsed; `path`
/// only names it in errors):
///
/// - `head_dim`, else `hidden_size / num_attention_heads`;
/// - `max_position_embeddings` (default 2048);
/// - the scaling from `rope_parameters` (transformers ≥ 5) or `rope_scaling`;
/// - `rope_theta` and `partial_rotary_factor` from inside that object or from the top
///   level (defaults 10000 and 1);
/// - a top-level `original_max_position_embeddings` (Phi-3) overrides the one in the
///   scaling, as in transformers.
///
/// The layout is not part of `config.json` (it is a property of the model family): it
/// stays half-split; set it with [`RopeConfig::with_layout`].
///
/// # Errors
/// [`HfError::Field`] naming the key (dotted inside the scaling object, e.g.
/// `rope_scaling.factor`) that is missing or malformed, or `rope_parameters` when it
/// holds one object per layer type (read one with [`rope_config_of_layer_type`]).
pub fn rope_config(config: &Value, path: impl AsRef<Path>) -> Result<RopeConfig, HfError> {
    let path = path.as_ref();
    read_keys::<RopeKeys>(config, None)
        .and_then(|keys| keys.rope_config())
        .map_err(|error| error.in_file(path))
}

/// As [`rope_config`], for the layers of one type (`"full_attention"`,
/// `"sliding_attention"`) of a model whose `rope_parameters` hold one object per layer
/// type. A single `rope_parameters` / `rope_scaling` object applies to every type.
///
/// # Errors
/// As [`rope_config`]; [`HfError::Field`] naming `rope_parameters` when it has no object
/// for `layer_type`.
pub fn rope_config_of_layer_type(
    config: &Value,
    layer_type: &str,
    path: impl AsRef<Path>,
) -> Result<RopeConfig, HfError> {
    let path = path.as_ref();
    read_keys::<RopeKeys>(config, None)
        .and_then(|keys| keys.rope_config_of(Some(layer_type)))
        .map_err(|error| error.in_file(path))
}

/// The top-level keys of a `config.json` that shape the rotary embedding.
#[derive(Deserialize, Debug, Default)]
pub(crate) struct RopeKeys {
    head_dim: Option<usize>,
    hidden_size: Option<usize>,
    num_attention_heads: Option<usize>,
    max_position_embeddings: Option<usize>,
    rope_theta: Option<f64>,
    partial_rotary_factor: Option<f64>,
    original_max_position_embeddings: Option<usize>,
    /// Read as [`RopeParameters`] once the form (one object, or one per layer type) is
    /// known.
    rope_scaling: Option<Value>,
    /// transformers 5's name of `rope_scaling`; wins when both are set.
    rope_parameters: Option<Value>,
}

/// The keys of one `rope_scaling` / `rope_parameters` object.
#[derive(Deserialize, Debug, Default)]
pub(crate) struct RopeScalingKeys {
    rope_type: Option<String>,
    /// The older name of `rope_type`.
    #[serde(rename = "type")]
    legacy_type: Option<String>,
    factor: Option<f64>,
    #[serde(default, deserialize_with = "whole_number")]
    original_max_position_embeddings: Option<usize>,
    attention_factor: Option<f64>,
    beta_fast: Option<f64>,
    beta_slow: Option<f64>,
    mscale: Option<f64>,
    mscale_all_dim: Option<f64>,
    truncate: Option<bool>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    short_factor: Option<Vec<f64>>,
    long_factor: Option<Vec<f64>>,
    /// transformers 5 moves `rope_theta` inside the object.
    rope_theta: Option<f64>,
    /// transformers 5 moves `partial_rotary_factor` inside the object.
    partial_rotary_factor: Option<f64>,
}

/// A `rope_scaling` / `rope_parameters` value: one object for the whole model, or one
/// per layer type (`{"full_attention": {..}, "sliding_attention": {..}}`).
#[derive(Debug)]
pub(crate) enum RopeParameters {
    /// Every layer's rotary embedding (boxed: far larger than an empty map).
    Single(Box<RopeScalingKeys>),
    /// The rotary embedding of each layer type.
    PerLayerType(BTreeMap<String, RopeScalingKeys>),
}

impl RopeParameters {
    /// Reads the value of the key `key`: per layer type when it is a non-empty object
    /// without a type whose every value is an object (or null).
    fn read(value: &Value, key: &str) -> Result<Self, KeyError> {
        match value {
            Value::Object(object) if is_per_layer_type(object) => object
                .iter()
                .map(|(layer_type, inner)| {
                    let keys = match inner {
                        Value::Null => RopeScalingKeys::default(),
                        _ => read_keys(inner, Some(&format!("{key}.{layer_type}")))?,
                    };
                    Ok((layer_type.clone(), keys))
                })
                .collect::<Result<_, KeyError>>()
                .map(Self::PerLayerType),
            _ => read_keys(value, Some(key)).map(|keys| Self::Single(Box::new(keys))),
        }
    }
}

fn is_per_layer_type(object: &Map<String, Value>) -> bool {
    !object.is_empty()
        && !object.contains_key("rope_type")
        && !object.contains_key("type")
        && object.values().all(|v| v.is_object() || v.is_null())
}

impl RopeKeys {
    /// Whether the file has one rotary embedding per layer type (a `rope_parameters` or
    /// `rope_scaling` object of objects) rather than one for the model.
    ///
    /// # Errors
    /// A malformed `rope_parameters` / `rope_scaling` object, named.
    pub(crate) fn is_per_layer_type(&self) -> Result<bool, KeyError> {
        let (key, parameters) = self.parameters();
        Ok(matches!(
            parameters
                .map(|value| RopeParameters::read(value, key))
                .transpose()?,
            Some(RopeParameters::PerLayerType(_))
        ))
    }

    /// `rope_parameters` (transformers 5) when present, else `rope_scaling`, with its key.
    fn parameters(&self) -> (&'static str, Option<&Value>) {
        match (&self.rope_parameters, &self.rope_scaling) {
            (Some(value), _) => ("rope_parameters", Some(value)),
            (None, value) => ("rope_scaling", value.as_ref()),
        }
    }

    /// The rotary embedding of every layer.
    pub(crate) fn rope_config(&self) -> Result<RopeConfig, KeyError> {
        self.rope_config_of(None)
    }

    /// The rotary embedding of the layers of `layer_type` (`None`: of every layer, which
    /// needs a single scaling object).
    pub(crate) fn rope_config_of(&self, layer_type: Option<&str>) -> Result<RopeConfig, KeyError> {
        let head_dim = match (self.head_dim, self.hidden_size, self.num_attention_heads) {
            (Some(head_dim), _, _) => head_dim,
            (None, Some(hidden), Some(heads)) if heads > 0 => hidden / heads,
            _ => {
                return Err(KeyError::new(
                    "head_dim",
                    "missing, and hidden_size / num_attention_heads is not available either",
                ));
            }
        };
        let (key, parameters) = self.parameters();
        let parameters = parameters
            .map(|value| RopeParameters::read(value, key))
            .transpose()?;
        let default = RopeScalingKeys::default();
        let (inner, inner_key) = match (&parameters, layer_type) {
            (None, _) => (&default, key.to_string()),
            (Some(RopeParameters::Single(inner)), _) => (&**inner, key.to_string()),
            (Some(RopeParameters::PerLayerType(per_type)), None) => {
                return Err(KeyError::new(
                    key,
                    format!(
                        "nested per layer type ({}): read one with rope_config_of_layer_type",
                        per_type.keys().cloned().collect::<Vec<_>>().join(", ")
                    ),
                ));
            }
            (Some(RopeParameters::PerLayerType(per_type)), Some(layer_type)) => {
                let inner = per_type.get(layer_type).ok_or_else(|| {
                    KeyError::new(
                        key,
                        format!(
                            "has no object for layer type \"{layer_type}\" (has {})",
                            per_type.keys().cloned().collect::<Vec<_>>().join(", ")
                        ),
                    )
                })?;
                (inner, format!("{key}.{layer_type}"))
            }
        };
        let theta = inner.rope_theta.or(self.rope_theta).unwrap_or(10000.0);
        let partial_rotary_factor = inner
            .partial_rotary_factor
            .or(self.partial_rotary_factor)
            .unwrap_or(1.0);
        let mut scaling = inner.scaling(&inner_key)?;
        // A proportional RoPE turns its fraction of the pairs over the whole head, so
        // the fraction is the scaling's, not a partial rotary dimension.
        let partial_rotary_factor = match &mut scaling {
            RopeScaling::Proportional {
                rotated_fraction, ..
            } => {
                *rotated_fraction = partial_rotary_factor;
                1.0
            }
            _ => partial_rotary_factor,
        };
        if let Some(top_level) = self.original_max_position_embeddings {
            match &mut scaling {
                RopeScaling::Yarn {
                    original_max_position_embeddings,
                    ..
                }
                | RopeScaling::Llama3 {
                    original_max_position_embeddings,
                    ..
                }
                | RopeScaling::LongRope {
                    original_max_position_embeddings,
                    ..
                } => *original_max_position_embeddings = Some(top_level),
                _ => {}
            }
        }
        Ok(RopeConfig::new(head_dim)
            .with_theta(theta)
            .with_max_position_embeddings(self.max_position_embeddings.unwrap_or(2048))
            .with_scaling(scaling)
            .with_partial_rotary_factor(partial_rotary_factor))
    }
}

impl RopeScalingKeys {
    /// The scaling these keys describe; `key` is where the object sits, for errors.
    ///
    /// The type is `rope_type`, or the older `type` (`"su"` is LongRoPE's old name);
    /// none means no scaling.
    fn scaling(&self, key: &str) -> Result<RopeScaling, KeyError> {
        let (rope_type, type_key) = match (&self.rope_type, &self.legacy_type) {
            (Some(name), _) => (name.as_str(), "rope_type"),
            (None, Some(name)) => (name.as_str(), "type"),
            (None, None) => ("default", "rope_type"),
        };
        let missing = |name: &str| {
            KeyError::new(
                format!("{key}.{name}"),
                format!("required by rope_type \"{rope_type}\" but missing"),
            )
        };
        let required = |value: Option<f64>, name: &str| value.ok_or_else(|| missing(name));
        let list =
            |value: &Option<Vec<f64>>, name: &str| value.clone().ok_or_else(|| missing(name));
        Ok(match rope_type {
            "default" => RopeScaling::Default,
            "linear" => RopeScaling::Linear {
                factor: required(self.factor, "factor")?,
            },
            "dynamic" => RopeScaling::Dynamic {
                factor: required(self.factor, "factor")?,
            },
            "yarn" => RopeScaling::Yarn {
                factor: required(self.factor, "factor")?,
                original_max_position_embeddings: self.original_max_position_embeddings,
                attention_factor: self.attention_factor,
                beta_fast: self.beta_fast,
                beta_slow: self.beta_slow,
                mscale: self.mscale,
                mscale_all_dim: self.mscale_all_dim,
                truncate: self.truncate,
            },
            "llama3" => RopeScaling::Llama3 {
                factor: required(self.factor, "factor")?,
                low_freq_factor: required(self.low_freq_factor, "low_freq_factor")?,
                high_freq_factor: required(self.high_freq_factor, "high_freq_factor")?,
                original_max_position_embeddings: self.original_max_position_embeddings,
            },
            "proportional" => RopeScaling::Proportional {
                factor: self.factor.unwrap_or(1.0),
                rotated_fraction: 1.0,
            },
            "longrope" | "su" => RopeScaling::LongRope {
                short_factor: list(&self.short_factor, "short_factor")?,
                long_factor: list(&self.long_factor, "long_factor")?,
                factor: self.factor,
                attention_factor: self.attention_factor,
                original_max_position_embeddings: self.original_max_position_embeddings,
            },
            other => {
                return Err(KeyError::new(
                    format!("{key}.{type_key}"),
                    format!(
                        "unsupported rope_type \"{other}\" (expected default, linear, dynamic, \
                         yarn, llama3, longrope or proportional)"
                    ),
                ));
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, Tensor};

    use super::*;
    use crate::hf::tests::fixture_config;
    use crate::position::RopeLayout;
    use crate::test_utils::{Fixture, assert_close, test_devices};

    const FIXTURES: &[&str] = &[
        "rope_default",
        "rope_linear",
        "rope_dynamic",
        "rope_yarn",
        "rope_yarn_deepseek",
        "rope_yarn_attention_factor",
        "rope_llama3",
        "rope_longrope",
        "rope_partial",
        "rope_partial_yarn",
        "rope_proportional",
    ];

    fn cases(fixture: &Fixture) -> Vec<String> {
        fixture
            .keys_with_prefix("case")
            .into_iter()
            .filter_map(|key| key.strip_suffix(".x").map(str::to_string))
            .collect()
    }

    #[test]
    fn matches_hugging_face_for_every_scaling_and_layout() {
        for name in FIXTURES {
            let fixture = Fixture::load(name);
            let config = rope_config(&fixture_config(name), name).unwrap();
            for device in test_devices() {
                for (layout, key) in [
                    (RopeLayout::HalfSplit, "half_split"),
                    (RopeLayout::Interleaved, "interleaved"),
                ] {
                    let rope = config.clone().with_layout(layout).init(&device);
                    for case in cases(&fixture) {
                        let x = fixture.tensor::<4>(&format!("{case}.x"), &device);
                        let offset = fixture.scalar(&format!("{case}.offset")) as usize;
                        let expected = fixture.tensor::<4>(&format!("{case}.{key}"), &device);
                        assert_close(
                            rope.forward(x, offset),
                            expected,
                            1e-5,
                            &format!("{name} {case} {key}"),
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn inverse_frequencies_and_attention_scaling_match_hugging_face() {
        let device = Device::flex();
        for name in FIXTURES {
            let fixture = Fixture::load(name);
            let rope = rope_config(&fixture_config(name), name)
                .unwrap()
                .init(&device);
            let expected_scaling = fixture.scalar("attention_scaling") as f64;
            assert!(
                (rope.attention_scaling() - expected_scaling).abs() <= 1e-6 * expected_scaling,
                "{name}: attention scaling {} vs {expected_scaling}",
                rope.attention_scaling()
            );
            for case in cases(&fixture) {
                let offset = fixture.scalar(&format!("{case}.offset")) as usize;
                let seq = fixture.data(&format!("{case}.x")).shape()[2];
                let expected = fixture
                    .data(&format!("{case}.inv_freq"))
                    .try_to_vec::<f32>()
                    .unwrap();
                let actual = rope.inverse_frequencies(offset + seq);
                assert_eq!(actual.len(), expected.len(), "{name} {case}");
                for (i, (a, e)) in actual.iter().zip(&expected).enumerate() {
                    // One float32 ulp or so: pow is rounded differently than PyTorch's.
                    assert!(
                        (a - e).abs() <= 2.5e-7 * e.abs(),
                        "{name} {case}: inv_freq[{i}] {a:e} vs {e:e}"
                    );
                }
            }
        }
    }

    #[test]
    fn interleaved_equals_deepseek_up_to_its_de_interleaving() {
        for name in ["rope_default", "rope_yarn_deepseek"] {
            let fixture = Fixture::load(name);
            let config = rope_config(&fixture_config(name), name)
                .unwrap()
                .with_layout(RopeLayout::Interleaved);
            for device in test_devices() {
                let rope = config.init(&device);
                for case in cases(&fixture) {
                    let x = fixture.tensor::<4>(&format!("{case}.x"), &device);
                    let offset = fixture.scalar(&format!("{case}.offset")) as usize;
                    let [batch, heads, seq, head_dim] = x.dims();
                    // [batch, heads, seq, head_dim / 2, 2] -> evens then odds.
                    let pairs: Tensor<5> =
                        rope.forward(x, offset)
                            .reshape([batch, heads, seq, head_dim / 2, 2]);
                    let permuted = Tensor::cat(
                        vec![
                            pairs.clone().narrow(4, 0, 1).reshape([
                                batch,
                                heads,
                                seq,
                                head_dim / 2,
                            ]),
                            pairs
                                .narrow(4, 1, 1)
                                .reshape([batch, heads, seq, head_dim / 2]),
                        ],
                        3,
                    );
                    let expected =
                        fixture.tensor::<4>(&format!("{case}.interleaved_deepseek"), &device);
                    assert_close(permuted, expected, 1e-5, &format!("{name} {case} deepseek"));
                }
            }
        }
    }

    /// The scaling of a config whose `rope_scaling` is `text`.
    fn scaling(text: &str) -> Result<RopeScaling, HfError> {
        let value: Value = serde_json::from_str(text).unwrap();
        let config = serde_json::json!({"head_dim": 8, "rope_scaling": value});
        rope_config(&config, "config.json").map(|rope| rope.scaling)
    }

    #[test]
    fn reads_hugging_face_rope_scaling() {
        assert_eq!(scaling("null").unwrap(), RopeScaling::Default);
        let unscaled = rope_config(&serde_json::json!({"head_dim": 8}), "config.json").unwrap();
        assert_eq!(unscaled.scaling, RopeScaling::Default);
        assert_eq!(
            scaling(r#"{"type": "linear", "factor": 2}"#).unwrap(),
            RopeScaling::Linear { factor: 2.0 }
        );
        assert_eq!(
            scaling(
                r#"{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}"#
            )
            .unwrap(),
            RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: Some(8192),
            }
        );
        let yarn = scaling(
            r#"{"rope_type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1,
                "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096}"#,
        )
        .unwrap();
        assert!(matches!(
            yarn,
            RopeScaling::Yarn {
                factor: 40.0,
                mscale: Some(1.0),
                truncate: None,
                original_max_position_embeddings: Some(4096),
                ..
            }
        ));
        // Context lengths written as whole floats, and both type keys (rope_type wins).
        let whole = scaling(
            r#"{"type": "yarn", "rope_type": "yarn", "factor": 4,
                "original_max_position_embeddings": 4096.0}"#,
        )
        .unwrap();
        assert!(matches!(
            whole,
            RopeScaling::Yarn {
                original_max_position_embeddings: Some(4096),
                ..
            }
        ));
        let su =
            scaling(r#"{"type": "su", "short_factor": [1, 2], "long_factor": [3, 4]}"#).unwrap();
        assert_eq!(su.rope_type(), "longrope");

        let error_field = |text: &str| match scaling(text) {
            Err(HfError::Field { field, .. }) => field,
            other => panic!("expected an error for {text}, got {other:?}"),
        };
        assert_eq!(
            error_field(r#"{"rope_type": "mrope"}"#),
            "rope_scaling.rope_type"
        );
        assert_eq!(error_field(r#"{"type": "mrope"}"#), "rope_scaling.type");
        assert_eq!(
            error_field(r#"{"rope_type": "linear"}"#),
            "rope_scaling.factor"
        );
        assert_eq!(
            error_field(r#"{"rope_type": "dynamic", "factor": "2"}"#),
            "rope_scaling.factor"
        );
        assert_eq!(
            error_field(r#"{"rope_type": "longrope", "long_factor": [1]}"#),
            "rope_scaling.short_factor"
        );
        assert_eq!(
            error_field(
                r#"{"rope_type": "longrope", "short_factor": [1, "x"], "long_factor": [1]}"#
            ),
            "rope_scaling.short_factor[1]"
        );
        assert_eq!(
            error_field(
                r#"{"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 1.5}"#
            ),
            "rope_scaling.original_max_position_embeddings"
        );
        assert_eq!(error_field("[1, 2]"), "rope_scaling");
        let message = scaling(r#"{"rope_type": "linear"}"#)
            .unwrap_err()
            .to_string();
        assert!(message.contains("config.json"), "{message}");
        assert!(
            message.contains("required by rope_type \"linear\""),
            "{message}"
        );
    }

    #[test]
    fn reads_a_hugging_face_config() {
        // Phi-3.5-mini's shape, with partial rotary: 24 rotated pairs.
        let config = serde_json::json!({
            "hidden_size": 3072, "num_attention_heads": 32, "max_position_embeddings": 131072,
            "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "rope_scaling": {"type": "longrope", "short_factor": (vec![1.0; 24]),
                             "long_factor": (vec![2.0; 24])}
        });
        let rope = rope_config(&config, "config.json").unwrap();
        assert_eq!(rope.head_dim, 96);
        assert_eq!(rope.rotary_dim(), 48);
        assert_eq!(rope.max_position_embeddings, 131072);
        assert!(matches!(
            rope.scaling,
            RopeScaling::LongRope {
                original_max_position_embeddings: Some(4096),
                ..
            }
        ));
        let module = rope.init(&Device::flex());
        // factor = 131072 / 4096 = 32: sqrt(1 + ln 32 / ln 4096).
        let expected = (1.0 + 32f64.ln() / 4096f64.ln()).sqrt();
        assert!((module.attention_scaling() - expected).abs() < 1e-12);

        let inner_theta = serde_json::json!({
            "head_dim": 64, "rope_theta": 10000.0,
            "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}
        });
        let inner_theta = rope_config(&inner_theta, "config.json").unwrap();
        assert_eq!(inner_theta.theta, 500000.0);
        assert_eq!(inner_theta.scaling, RopeScaling::Default);

        let nested: Value = serde_json::from_str(
            r#"{"head_dim": 8, "rope_parameters": {"full_attention": {"rope_type": "default"},
                "sliding_attention": {"rope_type": "default"}}}"#,
        )
        .unwrap();
        assert!(matches!(
            rope_config(&nested, "config.json"),
            Err(HfError::Field { field, .. }) if field == "rope_parameters"
        ));
    }

    #[test]
    fn reads_the_rotary_embedding_of_one_layer_type() {
        let nested = serde_json::json!({
            "head_dim": 8, "rope_theta": 10000.0,
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default"}
            }
        });
        let full = rope_config_of_layer_type(&nested, "full_attention", "config.json").unwrap();
        assert_eq!(full.scaling, RopeScaling::Linear { factor: 4.0 });
        assert_eq!(full.theta, 1e6);
        let sliding =
            rope_config_of_layer_type(&nested, "sliding_attention", "config.json").unwrap();
        assert_eq!(sliding.scaling, RopeScaling::Default);
        assert_eq!(sliding.theta, 10000.0);
        assert!(matches!(
            rope_config_of_layer_type(&nested, "chunked_attention", "config.json"),
            Err(HfError::Field { field, .. }) if field == "rope_parameters"
        ));
        let broken = serde_json::json!({
            "head_dim": 8,
            "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": "4"}}
        });
        assert!(matches!(
            rope_config_of_layer_type(&broken, "full_attention", "config.json"),
            Err(HfError::Field { field, .. }) if field == "rope_parameters.full_attention.factor"
        ));
        // One object serves every layer type.
        let single =
            serde_json::json!({"head_dim": 8, "rope_scaling": {"type": "linear", "factor": 2}});
        let any = rope_config_of_layer_type(&single, "sliding_attention", "config.json").unwrap();
        assert_eq!(any.scaling, RopeScaling::Linear { factor: 2.0 });
        let headless = serde_json::json!({"rope_theta": 10000.0});
        assert!(matches!(
            rope_config(&headless, "config.json"),
            Err(HfError::Field { field, .. }) if field == "head_dim"
        ));
    }
}
