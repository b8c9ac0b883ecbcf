//! Reading a Hugging Face `config.json` into a [`CausalLmConfig`].
//!
//! Only the keys that change the computation are read; the rest (`architectures`,
//! `torch_dtype`, `transformers_version`, …) are ignored. A missing key takes the
//! default of the family's transformers configuration class.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::error::HfError;
use crate::attention::LatentAttentionConfig;
use crate::ffn::{Activation, MoeConfig, MoeLayerPlan};
use crate::model::CausalLmConfig;
use crate::position::RopeConfig;

/// The `model_type`s [`HfConfig`] reads.
pub const SUPPORTED_MODEL_TYPES: &[&str] = &[
    "llama",
    "mistral",
    "qwen2",
    "mixtral",
    "deepseek_v2",
    "deepseek_v3",
];

/// A model configuration read from a Hugging Face `config.json`.
#[derive(Debug, Clone)]
pub struct HfConfig {
    /// The `model_type` (one of [`SUPPORTED_MODEL_TYPES`]).
    pub model_type: String,
    /// Our model's configuration.
    pub model: CausalLmConfig,
    /// `bos_token_id`, if set.
    pub bos_token_id: Option<u32>,
    /// `eos_token_id` (a number or a list in `config.json`); empty if unset.
    pub eos_token_ids: Vec<u32>,
    /// `pad_token_id`, if set.
    pub pad_token_id: Option<u32>,
}

impl HfConfig {
    /// Reads `path` (a `config.json`).
    ///
    /// # Errors
    /// [`HfError::Io`], [`HfError::Json`], [`HfError::Field`] naming the key,
    /// [`HfError::UnsupportedModelType`] (listing the supported ones) or
    /// [`HfError::Config`] when the values do not make a valid model.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, HfError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| HfError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json(&text, path)
    }

    /// Parses the text of a `config.json`; `path` only names it in errors.
    ///
    /// # Errors
    /// As [`HfConfig::from_file`], without the I/O.
    pub fn from_json(text: &str, path: impl AsRef<Path>) -> Result<Self, HfError> {
        let path = path.as_ref();
        let value: Value = serde_json::from_str(text).map_err(|source| HfError::Json {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_value(&value, path)
    }

    /// Reads an already parsed `config.json`; `path` only names it in errors.
    ///
    /// # Errors
    /// As [`HfConfig::from_file`], without the I/O and JSON syntax.
    pub fn from_value(value: &Value, path: impl AsRef<Path>) -> Result<Self, HfError> {
        let fields = Fields::new(value, path.as_ref())?;
        let model_type = fields.string("model_type")?;
        let model = match model_type.as_str() {
            "llama" | "mistral" | "qwen2" => dense_config(&fields, &model_type)?,
            "mixtral" => sparse_config(&fields, value, &model_type, false)?,
            "deepseek_v2" | "deepseek_v3" => sparse_config(&fields, value, &model_type, true)?,
            _ => {
                return Err(HfError::UnsupportedModelType {
                    path: fields.path.clone(),
                    model_type,
                });
            }
        };
        model.validate().map_err(|source| HfError::Config {
            path: fields.path.clone(),
            source,
        })?;
        Ok(Self {
            model_type,
            model,
            bos_token_id: fields.opt_u32("bos_token_id")?,
            eos_token_ids: fields.token_list("eos_token_id")?,
            pad_token_id: fields.opt_u32("pad_token_id")?,
        })
    }
}

/// LLaMA, Mistral and Qwen2: GQA, RoPE, SwiGLU, RMSNorm; they differ in biases and
/// sliding windows.
fn dense_config(fields: &Fields, model_type: &str) -> Result<CausalLmConfig, HfError> {
    let d_model = fields.usize("hidden_size")?;
    let n_heads = fields.usize("num_attention_heads")?;
    let n_layers = fields.usize("num_hidden_layers")?;
    let rope = fields.rope()?;
    let head_dim = match fields.opt_usize("head_dim")? {
        Some(head_dim) => head_dim,
        None => rope.head_dim,
    };
    let (qkv_bias, o_bias) = match model_type {
        // Qwen2 has biases on q, k and v but not on the output projection.
        "qwen2" => (true, false),
        "mistral" => (false, false),
        _ => {
            let bias = fields.opt_bool("attention_bias")?.unwrap_or(false);
            (bias, bias)
        }
    };
    let (sliding_window, sliding_layers) = fields.sliding_window(model_type, n_layers)?;
    Ok(CausalLmConfig::new(
        fields.usize("vocab_size")?,
        d_model,
        n_layers,
        n_heads,
        fields.usize("intermediate_size")?,
        rope,
    )
    .with_n_kv_heads(Some(
        fields.opt_usize("num_key_value_heads")?.unwrap_or(n_heads),
    ))
    .with_head_dim(Some(head_dim))
    .with_norm_eps(fields.opt_f64("rms_norm_eps")?.unwrap_or(1e-6))
    .with_qkv_bias(qkv_bias)
    .with_o_bias(o_bias)
    .with_mlp_bias(fields.opt_bool("mlp_bias")?.unwrap_or(false))
    .with_activation(fields.activation()?)
    .with_sliding_window(sliding_window)
    .with_sliding_layers(sliding_layers)
    .with_tie_word_embeddings(fields.opt_bool("tie_word_embeddings")?.unwrap_or(false))
    .with_initializer(burn::module::Initializer::Normal {
        mean: 0.0,
        std: fields.opt_f64("initializer_range")?.unwrap_or(0.02),
    }))
}

/// Mixtral (grouped attention, every layer sparse) and DeepSeek-V2/V3 (latent
/// attention, dense first layers then sparse): the dense family's fields plus the
/// MoE router and experts, and MLA's ranks for DeepSeek.
fn sparse_config(
    fields: &Fields,
    value: &Value,
    model_type: &str,
    latent: bool,
) -> Result<CausalLmConfig, HfError> {
    let config_error = |source| HfError::Config {
        path: fields.path.clone(),
        source,
    };
    let mut config = dense_config(fields, model_type)?
        .with_moe(Some(
            MoeConfig::from_hf_config(value).map_err(config_error)?,
        ))
        .with_moe_layers(MoeLayerPlan::from_hf_config(value).map_err(config_error)?);
    if let Some(coef) = match fields.opt_f64("router_aux_loss_coef")? {
        Some(coef) => Some(coef),
        None => fields.opt_f64("aux_loss_alpha")?,
    } {
        config.aux_loss_coef = coef;
    }
    if latent {
        config.latent = Some(LatentAttentionConfig::from_hf_config(value).map_err(config_error)?);
    }
    Ok(config)
}

/// Typed access to the keys of one JSON object, with errors naming the file and key.
pub(crate) struct Fields<'a> {
    object: &'a Map<String, Value>,
    root: &'a Value,
    pub(crate) path: PathBuf,
}

impl<'a> Fields<'a> {
    pub(crate) fn new(value: &'a Value, path: &Path) -> Result<Self, HfError> {
        let object = value.as_object().ok_or_else(|| HfError::Field {
            path: path.to_path_buf(),
            field: "(root)".into(),
            reason: "expected a JSON object".into(),
        })?;
        Ok(Self {
            object,
            root: value,
            path: path.to_path_buf(),
        })
    }

    pub(crate) fn error(&self, field: &str, reason: impl Into<String>) -> HfError {
        HfError::Field {
            path: self.path.clone(),
            field: field.to_string(),
            reason: reason.into(),
        }
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        match self.object.get(key) {
            None | Some(Value::Null) => None,
            Some(value) => Some(value),
        }
    }

    pub(crate) fn string(&self, key: &str) -> Result<String, HfError> {
        match self.get(key) {
            Some(Value::String(text)) => Ok(text.clone()),
            Some(other) => Err(self.error(key, format!("expected a string, got {other}"))),
            None => Err(self.error(key, "missing")),
        }
    }

    pub(crate) fn opt_string(&self, key: &str) -> Result<Option<String>, HfError> {
        match self.get(key) {
            Some(Value::String(text)) => Ok(Some(text.clone())),
            Some(other) => Err(self.error(key, format!("expected a string, got {other}"))),
            None => Ok(None),
        }
    }

    pub(crate) fn opt_usize(&self, key: &str) -> Result<Option<usize>, HfError> {
        match self.get(key) {
            Some(value) => match value.as_u64() {
                Some(number) => usize::try_from(number)
                    .map(Some)
                    .map_err(|_| self.error(key, format!("{number} is too large"))),
                None => {
                    Err(self.error(key, format!("expected a non-negative integer, got {value}")))
                }
            },
            None => Ok(None),
        }
    }

    pub(crate) fn usize(&self, key: &str) -> Result<usize, HfError> {
        self.opt_usize(key)?
            .ok_or_else(|| self.error(key, "missing (a non-negative integer is required)"))
    }

    pub(crate) fn opt_u32(&self, key: &str) -> Result<Option<u32>, HfError> {
        match self.opt_usize(key)? {
            Some(value) => u32::try_from(value)
                .map(Some)
                .map_err(|_| self.error(key, format!("{value} does not fit a token id"))),
            None => Ok(None),
        }
    }

    pub(crate) fn opt_f64(&self, key: &str) -> Result<Option<f64>, HfError> {
        match self.get(key) {
            Some(value) => value
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.error(key, format!("expected a number, got {value}"))),
            None => Ok(None),
        }
    }

    pub(crate) fn opt_bool(&self, key: &str) -> Result<Option<bool>, HfError> {
        match self.get(key) {
            Some(Value::Bool(flag)) => Ok(Some(*flag)),
            Some(other) => Err(self.error(key, format!("expected true or false, got {other}"))),
            None => Ok(None),
        }
    }

    /// A token id or a list of them (`eos_token_id` is either).
    pub(crate) fn token_list(&self, key: &str) -> Result<Vec<u32>, HfError> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| {
                    item.as_u64()
                        .and_then(|id| u32::try_from(id).ok())
                        .ok_or_else(|| self.error(key, format!("expected token ids, got {item}")))
                })
                .collect(),
            Some(_) => Ok(self.opt_u32(key)?.into_iter().collect()),
        }
    }

    /// `hidden_act`, default SiLU.
    pub(crate) fn activation(&self) -> Result<Activation, HfError> {
        match self.opt_string("hidden_act")? {
            Some(name) => Activation::from_hf_name(&name)
                .map_err(|error| self.error("hidden_act", error.to_string())),
            None => Ok(Activation::Silu),
        }
    }

    /// The rotary embedding: `rope_theta`, `rope_scaling`/`rope_parameters`,
    /// `max_position_embeddings`, `head_dim`, `partial_rotary_factor`.
    pub(crate) fn rope(&self) -> Result<RopeConfig, HfError> {
        RopeConfig::from_hf_config(self.root).map_err(|error| {
            let field = match &error {
                crate::ConfigError::Invalid { field, .. } => {
                    format!("rope ({field})")
                }
                _ => "rope".to_string(),
            };
            self.error(&field, error.to_string())
        })
    }

    /// `(sliding_window, sliding_layers)`: Mistral and Mixtral slide on every layer
    /// when `sliding_window` is set; Qwen2 only with `use_sliding_window`, on the
    /// layers `layer_types` (or `max_window_layers`) names.
    pub(crate) fn sliding_window(
        &self,
        model_type: &str,
        n_layers: usize,
    ) -> Result<(Option<usize>, Option<Vec<bool>>), HfError> {
        let window = self.opt_usize("sliding_window")?;
        if window == Some(0) {
            return Err(self.error("sliding_window", "must be positive"));
        }
        let window = match model_type {
            "qwen2" if !self.opt_bool("use_sliding_window")?.unwrap_or(false) => None,
            "llama" => None,
            _ => window,
        };
        let Some(window) = window else {
            return Ok((None, None));
        };
        let layers = match self.get("layer_types") {
            Some(Value::Array(types)) => {
                if types.len() != n_layers {
                    return Err(self.error(
                        "layer_types",
                        format!("has {} entries for {n_layers} layers", types.len()),
                    ));
                }
                let flags = types
                    .iter()
                    .map(|kind| match kind.as_str() {
                        Some("sliding_attention") => Ok(true),
                        Some("full_attention") => Ok(false),
                        _ => Err(self.error(
                            "layer_types",
                            format!(
                                "expected \"full_attention\" or \"sliding_attention\", got {kind}"
                            ),
                        )),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Some(flags)
            }
            Some(other) => {
                return Err(self.error("layer_types", format!("expected a list, got {other}")));
            }
            None if model_type == "qwen2" => {
                let first = self.opt_usize("max_window_layers")?.unwrap_or(28);
                Some((0..n_layers).map(|layer| layer >= first).collect())
            }
            None => None,
        };
        Ok((Some(window), layers))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LLAMA: &str = r#"{
        "model_type": "llama", "vocab_size": 100, "hidden_size": 32,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 64, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        "max_position_embeddings": 256, "tie_word_embeddings": true,
        "eos_token_id": [1, 2], "bos_token_id": 0
    }"#;

    #[test]
    fn reads_a_llama_config() {
        let config = HfConfig::from_json(LLAMA, "config.json").unwrap();
        assert_eq!(config.model_type, "llama");
        let model = &config.model;
        assert_eq!(model.kv_heads(), 2);
        assert_eq!(model.head_width(), 8);
        assert!(model.tie_word_embeddings);
        assert_eq!(model.rope.theta, 500000.0);
        assert_eq!(model.rope.scaling.rope_type(), "llama3");
        assert_eq!(config.eos_token_ids, vec![1, 2]);
        assert_eq!(config.bos_token_id, Some(0));
    }

    #[test]
    fn unsupported_model_type_lists_the_supported_ones() {
        let text = LLAMA.replace("\"llama\"", "\"gpt2\"");
        let error = HfConfig::from_json(&text, "dir/config.json").unwrap_err();
        let message = error.to_string();
        assert!(matches!(error, HfError::UnsupportedModelType { .. }));
        assert!(message.contains("dir/config.json"), "{message}");
        assert!(message.contains("\"gpt2\""), "{message}");
        assert!(message.contains("llama, mistral"), "{message}");
    }

    #[test]
    fn bad_fields_are_named() {
        let text = LLAMA.replace("\"hidden_size\": 32", "\"hidden_size\": \"wide\"");
        let error = HfConfig::from_json(&text, "config.json").unwrap_err();
        assert!(
            matches!(&error, HfError::Field { field, .. } if field == "hidden_size"),
            "{error}"
        );
        let error = HfConfig::from_json("{ \"model_type\": ", "config.json").unwrap_err();
        assert!(matches!(error, HfError::Json { .. }), "{error}");
        let text = LLAMA.replace("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3");
        let error = HfConfig::from_json(&text, "config.json").unwrap_err();
        assert!(matches!(error, HfError::Config { .. }), "{error}");
        assert!(error.to_string().contains("n_kv_heads"), "{error}");
    }

    #[test]
    fn qwen2_slides_only_on_the_layers_it_names() {
        let text = LLAMA.replace("\"llama\"", "\"qwen2\"").replace(
            "\"tie_word_embeddings\"",
            "\"use_sliding_window\": true, \"sliding_window\": 4, \
                 \"max_window_layers\": 1, \"tie_word_embeddings\"",
        );
        let config = HfConfig::from_json(&text, "config.json").unwrap().model;
        assert!(config.qkv_bias && !config.o_bias);
        assert_eq!(config.window_of(0), None);
        assert_eq!(config.window_of(1), Some(4));
    }
}
