//! Reading a Hugging Face `config.json` into a [`CausalLmConfig`].
//!
//! Only the keys that change the computation are read; the rest (`architectures`,
//! `torch_dtype`, `transformers_version`, …) are ignored. A missing key takes the
//! default of the family's transformers configuration class ([`super::defaults`]), and
//! a key that the family's transformers implementation does not read changes nothing
//! here either ([`HfConfig::unread_keys`] names those the file sets). The model's own
//! keys are read here; the rotary embedding, latent attention and mixture-of-experts
//! keys by their own modules.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use super::activation::deserialize_activation;
use super::defaults::with_family_defaults;
use super::error::HfError;
use super::gemma4::Gemma4Keys;
use super::keys::{KeyError, TokenIds, UnreadKeys, layers_of_kind, read_json, read_keys, required};
use super::latent::LatentKeys;
use super::llama4::Llama4Keys;
use super::model_type::{ModelType, text_model_family};
use super::moe::MoeKeys;
use super::qwen3_next::HybridKeys;
use super::rope::RopeKeys;
use crate::attention::{QkNormConfig, QkNormKind, QkNormPlacement, QueryTemperatureConfig};
use crate::block::BlockKind;
use crate::ffn::Activation;
use crate::ffn::moe::ExpertGlu;
use crate::model::CausalLmConfig;
use crate::ops::alibi::Alibi;
use crate::position::{RopeConfig, RopeLayout, RopeScaling};

/// A model configuration read from a Hugging Face `config.json`.
#[derive(Debug, Clone)]
pub struct HfConfig {
    /// The `model_type` (one of [`SUPPORTED_MODEL_TYPES`](super::SUPPORTED_MODEL_TYPES)).
    pub model_type: String,
    /// Our model's configuration.
    pub model: CausalLmConfig,
    /// `bos_token_id`, if set.
    pub bos_token_id: Option<u32>,
    /// `eos_token_id` (a number or a list in `config.json`); empty if unset.
    pub eos_token_ids: Vec<u32>,
    /// `pad_token_id`, if set.
    pub pad_token_id: Option<u32>,
    /// Layers a checkpoint may hold after the `num_hidden_layers` decoder layers:
    /// DeepSeek-V3's, GLM-4.5's and GLM-4.7-Flash's multi-token-prediction layers
    /// (`num_nextn_predict_layers`), loaded as the model's
    /// [`mtp`](crate::model::CausalLm::mtp) modules when the checkpoint has them. 0 for
    /// every other family.
    pub mtp_layers: usize,
    /// One note per key that the file sets to a value the family's transformers
    /// implementation does not read or use (Mistral's `mlp_bias`, Gemma-3's
    /// `attn_logit_softcapping`, Mixtral's `norm_topk_prob`, …): the model is built as
    /// transformers builds it, and the loaders print these as warnings.
    pub unread_keys: Vec<String>,
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
        Self::from_value(&read_json(path)?, path)
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
        let path = path.as_ref();
        let in_file = |error: KeyError| error.in_file(path);
        // The family first: a file of another family is named as such, whatever its
        // other keys hold.
        let ModelTypeKey { model_type } = read_keys(value, None).map_err(in_file)?;
        let model_type = required(model_type, "model_type", "a string").map_err(in_file)?;
        let text_model = text_model_config(value).map_err(in_file)?;
        let value = text_model.as_ref().unwrap_or(value);
        // A multimodal model's family is its text model's.
        let family_name = match &text_model {
            Some(text) => text["model_type"].as_str().unwrap_or_default().to_string(),
            None => model_type.clone(),
        };
        let Some(family) = ModelType::from_name(&family_name) else {
            return Err(HfError::UnsupportedModelType {
                path: path.to_path_buf(),
                model_type: family_name,
            });
        };
        let value = &with_family_defaults(family, value);
        let keys: ModelKeys = read_keys(value, None).map_err(in_file)?;
        let mut unread = UnreadKeys::new(value, family.name());
        let model = keys
            .causal_lm_config(family, value, &mut unread)
            .map_err(in_file)?;
        model.validate().map_err(|source| HfError::Config {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self {
            model_type,
            model,
            bos_token_id: keys.bos_token_id,
            eos_token_ids: keys.eos_token_id.map_or_else(Vec::new, |ids| ids.0),
            pad_token_id: keys.pad_token_id,
            mtp_layers: match family.has_mtp_layers() {
                true => keys.num_nextn_predict_layers.unwrap_or(0),
                false => 0,
            },
            unread_keys: unread.into_notes(),
        })
    }
}

/// The `config.json` of the text model of a multimodal `config` ([`text_model_family`]:
/// its `text_config`, with its own `model_type` or else the wrapper's text family's,
/// and the wrapper's special
/// tokens and `tie_word_embeddings` where the wrapper sets them, since the wrapper is
/// the model that ties the embeddings); `None` for any other `model_type`.
pub(crate) fn text_model_config(config: &Value) -> Result<Option<Value>, KeyError> {
    let Some(family) = config
        .get("model_type")
        .and_then(Value::as_str)
        .and_then(text_model_family)
    else {
        return Ok(None);
    };
    let Some(Value::Object(text)) = config.get("text_config") else {
        return Err(KeyError::new(
            "text_config",
            "missing or not an object (a multimodal config describes its text model there)",
        ));
    };
    let mut text = text.clone();
    // transformers builds the text model of the type `text_config` names, the
    // wrapper's default otherwise.
    if !text.get("model_type").is_some_and(Value::is_string) {
        text.insert("model_type".into(), family.name().into());
    }
    for key in [
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
    ] {
        if let Some(value) = config.get(key).filter(|value| !value.is_null()) {
            text.insert(key.into(), value.clone());
        }
    }
    Ok(Some(Value::Object(text)))
}

/// Ministral-3's query temperature: `llama_4_scaling_beta` and the original context of
/// its rotary embedding's object; `None` when the object has no beta.
fn query_temperature(config: &Value) -> Option<QueryTemperatureConfig> {
    let rope = config
        .get("rope_parameters")
        .filter(|rope| !rope.is_null())
        .or_else(|| config.get("rope_scaling"))?;
    let beta = rope.get("llama_4_scaling_beta")?.as_f64()?;
    let interval = rope
        .get("original_max_position_embeddings")
        .or_else(|| config.get("original_max_position_embeddings"))?
        .as_u64()?;
    Some(QueryTemperatureConfig::new(beta, interval as usize))
}

/// `model_type`, read before anything else.
#[derive(Deserialize)]
struct ModelTypeKey {
    model_type: Option<String>,
}

/// The model's own keys of a `config.json`: sizes, norms, biases, sliding windows,
/// embeddings, router loss and special tokens.
#[derive(Deserialize, Debug)]
struct ModelKeys {
    vocab_size: Option<usize>,
    hidden_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    intermediate_size: Option<usize>,
    rms_norm_eps: Option<f64>,
    /// Cohere's name of the norms' epsilon (of its LayerNorms).
    layer_norm_eps: Option<f64>,
    /// StarCoder2's name of the norms' epsilon (of its LayerNorms).
    norm_epsilon: Option<f64>,
    /// Nemotron's name of the norms' epsilon (of its LayerNorms).
    norm_eps: Option<f64>,
    /// Cohere's factor on the output logits (a number); MPT's files may hold a number
    /// or the name `inv_sqrt_d_model`, which transformers' MPT does not read.
    logit_scale: Option<LogitScale>,
    /// QK-norm: GLM-4.5's RMSNorm per head; Cohere's LayerNorm with its own weights per
    /// head; no other family reads it.
    use_qk_norm: Option<bool>,
    attention_bias: Option<bool>,
    /// Qwen2-MoE's switch of the q/k/v biases.
    qkv_bias: Option<bool>,
    /// Seed-OSS's switch of the output projection's bias.
    attention_out_bias: Option<bool>,
    /// ERNIE-4.5's switch of every projection's bias.
    use_bias: Option<bool>,
    /// StableLM's switch of the q/k/v biases.
    use_qkv_bias: Option<bool>,
    /// Phi's, StableLM's and Persimmon's LayerNorm of the queries and keys.
    qk_layernorm: Option<bool>,
    /// StableLM's parallel attention and feed-forward.
    use_parallel_residual: Option<bool>,
    /// HyperCLOVA X's norms after each sublayer's output.
    use_post_norm: Option<bool>,
    /// Granite-SWA's RoPE base per layer (0: no RoPE).
    layer_rope_theta: Option<Vec<f64>>,
    mlp_bias: Option<bool>,
    #[serde(default, deserialize_with = "deserialize_activation")]
    hidden_act: Option<Activation>,
    /// Gemma-2's and Gemma-3's name of `hidden_act`.
    #[serde(default, deserialize_with = "deserialize_activation")]
    hidden_activation: Option<Activation>,
    /// MiniCPM3's scales: the embeddings times `scale_emb`, each sublayer's output times
    /// `scale_depth / √num_hidden_layers`, the logits times `dim_model_base /
    /// hidden_size` (null: no scale).
    scale_emb: Option<f64>,
    scale_depth: Option<f64>,
    dim_model_base: Option<f64>,
    /// Gemma-2 and Gemma-3: the attention scale is `query_pre_attn_scalar^-½`.
    query_pre_attn_scalar: Option<f64>,
    /// Granite's multipliers: on the embeddings, the attention scores (the softmax
    /// scale), each sublayer's output; and the divisor of the logits.
    embedding_multiplier: Option<f64>,
    attention_multiplier: Option<f64>,
    residual_multiplier: Option<f64>,
    logits_scaling: Option<f64>,
    attn_logit_softcapping: Option<f64>,
    final_logit_softcapping: Option<f64>,
    /// Gemma-3's RoPE base of the sliding layers, in configs without a
    /// `rope_parameters` object per layer type.
    rope_local_base_freq: Option<f64>,
    /// gpt-oss's clamped SwiGLU.
    swiglu_alpha: Option<f64>,
    swiglu_limit: Option<f64>,
    sliding_window: Option<usize>,
    use_sliding_window: Option<bool>,
    /// Checked only where a sliding window is in use: other families list other kinds.
    layer_types: Option<Vec<String>>,
    max_window_layers: Option<usize>,
    tie_word_embeddings: Option<bool>,
    initializer_range: Option<f64>,
    router_aux_loss_coef: Option<f64>,
    /// DeepSeek's name of `router_aux_loss_coef`.
    aux_loss_alpha: Option<f64>,
    router_z_loss_coef: Option<f64>,
    bos_token_id: Option<u32>,
    eos_token_id: Option<TokenIds>,
    pad_token_id: Option<u32>,
    /// The multi-token-prediction layers stored after the decoder layers (DeepSeek-V3,
    /// GLM-4.5, GLM-4.7-Flash).
    #[serde(alias = "num_mtp_layers")]
    num_nextn_predict_layers: Option<usize>,
    /// SmolLM3's layers that rotate (1) or attend without RoPE (0).
    no_rope_layers: Option<Vec<u8>>,
    /// Gemma-3's encoder variant (EmbeddingGemma, `true`), which this loader does not
    /// build; Gemma-4's is a string, read by [`Gemma4Keys`].
    use_bidirectional_attention: Option<Value>,
    /// OLMo's and OLMoE's clamp of q, k and v (other families' code does not read it).
    clip_qkv: Option<f64>,
    /// GPT-2's number of learned positions (`n_positions`).
    max_position_embeddings: Option<usize>,
    /// GPT-2: whether `q·kᵀ` is scaled by `head_dim^-½` (else not at all).
    scale_attn_weights: Option<bool>,
    /// GPT-2: a further scale `1 / (layer + 1)` of each layer's scores (not supported).
    scale_attn_by_inverse_layer_idx: Option<bool>,
    /// GPT-2: cross-attention layers for an encoder's states (not supported).
    add_cross_attention: Option<bool>,
    /// OPT: norms before each sublayer (else after its residual add).
    do_layer_norm_before: Option<bool>,
    /// OPT: biases on every projection.
    enable_bias: Option<bool>,
    /// OPT: LayerNorms with a scale and a shift (else without parameters).
    layer_norm_elementwise_affine: Option<bool>,
    /// OPT: no norm after the last layer (not supported).
    #[serde(rename = "_remove_final_layer_norm")]
    remove_final_layer_norm: Option<bool>,
    /// OPT: the embeddings' width, projected to `hidden_size` when it differs (not
    /// supported).
    word_embed_proj_dim: Option<usize>,
    /// Falcon: biases on every projection.
    bias: Option<bool>,
    /// Falcon: ALiBi position biases instead of RoPE (not supported: see
    /// `check_falcon`).
    alibi: Option<bool>,
    /// Falcon's architecture of Falcon-40B and later: parallel sublayers, grouped
    /// key/value heads.
    new_decoder_architecture: Option<bool>,
    /// Falcon: attention and feed-forward in parallel (else sequential).
    parallel_attn: Option<bool>,
    /// Falcon: norms before the parallel sublayers, 1 (shared) or 2 (one each).
    num_ln_in_parallel_attn: Option<usize>,
    /// BLOOM: each sublayer's residual is its normed input, not its input (not
    /// supported).
    apply_residual_connection_post_layernorm: Option<bool>,
    /// MPT's attention keys.
    attn_config: Option<MptAttentionKeys>,
    /// GPT-Neo's layer kinds: runs of `[[kinds…], repeats]`, each kind `global` or
    /// `local` (a window of `window_size`).
    attention_types: Option<Value>,
    /// GPT-Neo's window of its local layers.
    window_size: Option<usize>,
    /// BioGPT: embeddings times `√hidden_size`.
    scale_embedding: Option<bool>,
    /// MPT: no biases (transformers' MPT never has any).
    no_bias: Option<bool>,
    /// MPT: the feed-forward's width over the model's (transformers' MPT: always 4).
    expansion_ratio: Option<f64>,
    /// Set in checkpoints whose weights are stored quantized (gpt-oss's MXFP4,
    /// DeepSeek-V3's FP8 blocks, bitsandbytes, GPTQ, AWQ, …), which this loader does
    /// not read.
    quantization_config: Option<Value>,
}

/// A logit scale as files write it: a factor, or (MPT's) the name of a rule.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
enum LogitScale {
    Factor(f64),
    Named(String),
}

/// MPT's `attn_config`: the keys of its attention, nested.
#[derive(Deserialize, Debug, Default)]
struct MptAttentionKeys {
    /// The scale of `q·kᵀ` (null: `head_dim^-½`).
    softmax_scale: Option<f64>,
    /// The clamp of q, k and v after their projection.
    clip_qkv: Option<f64>,
    /// The steepest ALiBi slope's exponent (transformers' MPT: always 8).
    alibi_bias_max: Option<f64>,
    /// A LayerNorm of q and k (transformers' MPT: none).
    qk_ln: Option<bool>,
    /// `multihead_attention` or `multiquery_attention` (transformers' MPT: always the
    /// former).
    attn_type: Option<String>,
}

impl ModelKeys {
    /// The model of every family (GQA, RoPE, gated feed-forwards; they differ in
    /// biases, sliding windows, QK-norm, where the norms sit, scales and soft-capping);
    /// the sparse families add experts and DeepSeek-V2/V3 latent attention, whose keys
    /// are read from `config` by their own readers.
    fn causal_lm_config(
        &self,
        family: ModelType,
        config: &Value,
        unread: &mut UnreadKeys,
    ) -> Result<CausalLmConfig, KeyError> {
        if let Some(quantization) = &self.quantization_config {
            let method = quantization
                .get("quant_method")
                .and_then(Value::as_str)
                .unwrap_or("unknown method");
            return Err(KeyError::new(
                "quantization_config",
                format!(
                    "the checkpoint's weights are quantized ({method}); only f32, bf16 and \
                     f16 weights load: dequantize it first (transformers can load it with \
                     its quantization config's `dequantize=True` and save_pretrained the \
                     result)"
                ),
            ));
        }
        if family == ModelType::InternLm3
            && self.attention_bias.unwrap_or(false) != self.mlp_bias.unwrap_or(false)
        {
            return Err(KeyError::new(
                "qkv_bias",
                "differs from `bias`: InternLM3 (as transformers builds it) has one bias \
                 switch for the attention and the feed-forward; set both alike",
            ));
        }
        if matches!(family, ModelType::Gpt2 | ModelType::GptBigcode) {
            self.check_gpt2()?;
        }
        if family == ModelType::Opt {
            self.check_opt()?;
        }
        if family == ModelType::Falcon {
            self.check_falcon()?;
        }
        if family == ModelType::Bloom && self.apply_residual_connection_post_layernorm == Some(true)
        {
            return Err(KeyError::new(
                "apply_residual_connection_post_layernorm",
                "is true: residuals taken after the norm are not supported; only BLOOM \
                 models with `false` (every published one) load",
            ));
        }
        if matches!(family, ModelType::Gptj | ModelType::Codegen) {
            self.check_heads_split_the_width()?;
        }
        // CodeGen's attention cuts its fused projection in four blocks.
        if family == ModelType::Codegen
            && let Some(width) = self.hidden_size
            && width % super::codegen::FUSED_BLOCKS != 0
        {
            return Err(KeyError::new(
                "n_embd",
                format!(
                    "{width} is not a multiple of {}: CodeGen's attention splits q, k and v \
                     in that many blocks",
                    super::codegen::FUSED_BLOCKS
                ),
            ));
        }
        if self.use_bidirectional_attention == Some(Value::Bool(true)) {
            return Err(KeyError::new(
                "use_bidirectional_attention",
                "is true: bidirectional (encoder) Gemma models are not supported; this \
                 loader builds causal language models",
            ));
        }
        if !matches!(
            family,
            ModelType::Glm4Moe | ModelType::Cohere | ModelType::Llama4Text
        ) {
            unread.fixed("use_qk_norm", self.use_qk_norm, false, "no such switch");
        }
        unread.fixed(
            "clip_qkv",
            self.clip_qkv
                .filter(|_| !matches!(family, ModelType::Olmoe | ModelType::Olmo))
                .map(Some),
            None,
            "no clamp of q, k and v",
        );
        let size = |value, key| required(value, key, "a non-negative integer");
        let d_model = size(self.hidden_size, "hidden_size")?;
        let n_heads = size(self.num_attention_heads, "num_attention_heads")?;
        let n_layers = size(self.num_hidden_layers, "num_hidden_layers")?;
        let rope_keys = read_keys::<RopeKeys>(config, None)?;
        // Gemma-3 and OLMo-3 rotate their sliding layers with their own embedding: the
        // object of their layer type, or (in a file with one object for the model,
        // which transformers gives the full layers) no scaling, at Gemma-3's
        // `rope_local_base_freq` or OLMo-3's `rope_theta`. (transformers 5 reads an
        // OLMo-3 file of transformers 4 with its class's base, 500 000, on the sliding
        // layers; the checkpoints were trained with the file's, which the published
        // ones set to that value.)
        let (rope, sliding_rope) = match family {
            ModelType::Gemma3Text | ModelType::Olmo3 | ModelType::Gemma4Text
                if rope_keys.is_per_layer_type()? =>
            {
                (
                    rope_keys.rope_config_of(Some("full_attention"))?,
                    Some(rope_keys.rope_config_of(Some("sliding_attention"))?),
                )
            }
            ModelType::Gemma4Text => {
                return Err(KeyError::new(
                    "rope_parameters",
                    "holds one rotary embedding; Gemma-4's has one per layer type \
                     (`full_attention`, `sliding_attention`), as transformers writes it",
                ));
            }
            ModelType::Gemma3Text => {
                let full = rope_keys.rope_config()?;
                let mut sliding = full.clone().with_scaling(RopeScaling::Default);
                if let Some(theta) = self.rope_local_base_freq {
                    sliding.theta = theta;
                }
                (full, Some(sliding))
            }
            ModelType::Olmo3 => {
                let full = rope_keys.rope_config()?;
                let sliding = full.clone().with_scaling(RopeScaling::Default);
                (full, Some(sliding))
            }
            // GPT-2 and OPT learn their positions, BLOOM and MPT bias their logits by
            // distance (ALiBi); the rotary embedding is unused.
            ModelType::Gpt2
            | ModelType::GptBigcode
            | ModelType::GptNeo
            | ModelType::Opt
            | ModelType::Biogpt
            | ModelType::Bloom
            | ModelType::Mpt => (RopeConfig::new(d_model / n_heads.max(1)), None),
            // GLM, GLM-4, ERNIE, Cohere, Helium and Llama 4 rotate pairs of neighbouring
            // features (GPT-J's layout).
            ModelType::Glm
            | ModelType::Llama4Text
            | ModelType::Glm4
            | ModelType::Ernie45
            | ModelType::Ernie45Moe
            | ModelType::Cohere
            | ModelType::Cohere2
            | ModelType::Helium
            | ModelType::Gptj
            | ModelType::Codegen => (
                rope_keys
                    .rope_config()?
                    .with_layout(RopeLayout::Interleaved),
                None,
            ),
            _ => (rope_keys.rope_config()?, None),
        };
        let gemma = family.is_gemma();
        // The heads of GPT-2 and its era's families split the width, whatever else the
        // file says.
        let head_dim = match family {
            _ if family.is_classic_gpt() => rope.head_dim,
            _ => self.head_dim.unwrap_or(rope.head_dim),
        };
        let (qkv_bias, o_bias) = match family {
            // Qwen2 has biases on q, k and v but not on the output projection.
            ModelType::Qwen2 => {
                unread.fixed(
                    "attention_bias",
                    self.attention_bias,
                    false,
                    "biases on q, k and v only",
                );
                (true, false)
            }
            ModelType::Qwen2Moe => {
                unread.fixed(
                    "attention_bias",
                    self.attention_bias,
                    false,
                    "`qkv_bias` on q, k and v only",
                );
                (self.qkv_bias.unwrap_or(true), false)
            }
            // GLM's, GLM-4's, Helium's and Solar-Open's `attention_bias` is on q, k and
            // v; their output projection has none.
            ModelType::Glm
            | ModelType::Glm4
            | ModelType::Glm4Moe
            | ModelType::Helium
            | ModelType::SolarOpen => (self.attention_bias.unwrap_or(false), false),
            ModelType::SeedOss => (
                self.attention_bias.unwrap_or(false),
                self.attention_out_bias.unwrap_or(false),
            ),
            // GPT-2's and Phi's four projections always have biases; StableLM's q, k
            // and v with `use_qkv_bias`, its output projection never.
            ModelType::Gpt2 | ModelType::GptBigcode | ModelType::Biogpt | ModelType::Bloom => {
                (true, true)
            }
            // GPT-Neo's q, k and v have no biases, its output projection has one.
            ModelType::GptNeo => (false, true),
            ModelType::Opt => {
                let bias = self.enable_bias.unwrap_or(true);
                (bias, bias)
            }
            ModelType::Falcon => {
                let bias = self.bias.unwrap_or(false);
                (bias, bias)
            }
            ModelType::GptNeox => {
                let bias = self.attention_bias.unwrap_or(true);
                (bias, bias)
            }
            ModelType::Mpt => {
                let bias = unread.fixed("no_bias", self.no_bias, true, "no biases");
                (!bias, !bias)
            }
            ModelType::Phi | ModelType::Persimmon => {
                unread.fixed(
                    "attention_bias",
                    self.attention_bias,
                    true,
                    "biases on all four projections",
                );
                (true, true)
            }
            ModelType::StableLm => {
                unread.fixed(
                    "attention_bias",
                    self.attention_bias,
                    false,
                    "`use_qkv_bias` on q, k and v only",
                );
                (self.use_qkv_bias.unwrap_or(false), false)
            }
            _ if family.is_ernie() || family == ModelType::Starcoder2 => {
                let bias = self.use_bias.unwrap_or(false);
                (bias, bias)
            }
            // These families' attention has no biases.
            ModelType::Mistral
            | ModelType::Ministral
            | ModelType::Ministral3
            | ModelType::Cwm
            | ModelType::Mixtral
            | ModelType::Phi3
            | ModelType::Exaone4
            | ModelType::ExaoneMoe
            | ModelType::Gptj
            | ModelType::Codegen => {
                let bias = unread.fixed(
                    "attention_bias",
                    self.attention_bias,
                    false,
                    "no attention biases",
                );
                (bias, bias)
            }
            _ => {
                let bias = self.attention_bias.unwrap_or(false);
                (bias, bias)
            }
        };
        let mlp_bias = match family {
            ModelType::Llama
            | ModelType::InternLm3
            | ModelType::MiniCpm3
            | ModelType::Cwm
            | ModelType::Jais2
            | ModelType::Nemotron
            | ModelType::Granite
            | ModelType::HyperClovaX
            | ModelType::GraniteSwa
            | ModelType::Arcee
            | ModelType::Helium
            | ModelType::Smollm3
            | ModelType::SeedOss
            | ModelType::DeepseekV2 => self.mlp_bias.unwrap_or(false),
            _ if family.is_ernie() || family == ModelType::Starcoder2 => {
                self.use_bias.unwrap_or(false)
            }
            ModelType::Phi | ModelType::Persimmon => {
                unread.fixed("mlp_bias", self.mlp_bias, true, "feed-forward biases")
            }
            // GPT-NeoX's feed-forward always has biases.
            ModelType::Gpt2
            | ModelType::GptBigcode
            | ModelType::GptNeo
            | ModelType::Gptj
            | ModelType::Codegen
            | ModelType::Biogpt
            | ModelType::Bloom => true,
            ModelType::Opt => self.enable_bias.unwrap_or(true),
            ModelType::Falcon => self.bias.unwrap_or(false),
            ModelType::GptNeox => {
                unread.fixed("mlp_bias", self.mlp_bias, true, "feed-forward biases")
            }
            _ => unread.fixed("mlp_bias", self.mlp_bias, false, "no feed-forward biases"),
        };
        // Gemma-2 and Gemma-3 name the activation `hidden_activation`, every other
        // family `hidden_act`.
        let activation = if family == ModelType::Gemma {
            // The first Gemma checkpoints say `gelu`, which transformers reads as the
            // tanh approximation they were trained with.
            let used = match self.hidden_act {
                None | Some(Activation::Gelu) => Activation::GeluTanh,
                Some(other) => other,
            };
            unread.fixed(
                "hidden_activation",
                self.hidden_activation,
                used,
                "`hidden_act`",
            )
        } else if family.is_gemma2_or_later() {
            let used = self.hidden_activation.unwrap_or(Activation::GeluTanh);
            unread.fixed("hidden_act", self.hidden_act, used, "`hidden_activation`")
        } else {
            let used = self.hidden_act.unwrap_or(Activation::Silu);
            unread.fixed(
                "hidden_activation",
                self.hidden_activation,
                used,
                "`hidden_act`",
            )
        };
        let attention_softcap = match family {
            ModelType::Gemma2 | ModelType::VaultGemma => self.attn_logit_softcapping,
            _ => unread.fixed(
                "attn_logit_softcapping",
                self.attn_logit_softcapping.map(Some),
                None,
                "no attention soft-capping",
            ),
        };
        let final_logit_softcap = if family.is_gemma2_or_later() || family == ModelType::NanoChat {
            self.final_logit_softcapping
        } else {
            unread.fixed(
                "final_logit_softcapping",
                self.final_logit_softcapping.map(Some),
                None,
                "no logit soft-capping",
            )
        };
        let (sliding_window, sliding_layers) = self.sliding_window(family, n_layers, unread)?;
        let mut model = CausalLmConfig::new(
            size(self.vocab_size, "vocab_size")?,
            d_model,
            n_layers,
            n_heads,
            size(self.intermediate_size, "intermediate_size")?,
            rope,
        )
        .with_n_kv_heads(Some(match family {
            ModelType::Gpt2
            | ModelType::GptNeo
            | ModelType::Gptj
            | ModelType::Codegen
            | ModelType::GptNeox
            | ModelType::Opt
            | ModelType::Biogpt
            | ModelType::Bloom
            | ModelType::Mpt
            | ModelType::Persimmon => n_heads,
            _ => self.num_key_value_heads.unwrap_or(n_heads),
        }))
        .with_head_dim(Some(head_dim))
        .with_norm_eps(self.norm_eps(family))
        .with_layer_norm(family.uses_layer_norm())
        // OLMo's LayerNorm and nanochat's RMSNorm have no parameters.
        .with_norm_scale(!matches!(family, ModelType::Olmo | ModelType::NanoChat))
        .with_layer_norm_bias(family.has_shifted_layer_norm())
        .with_qkv_clip(match family {
            ModelType::Olmo | ModelType::Olmoe => self.clip_qkv,
            ModelType::Mpt => self.mpt_attention().clip_qkv,
            _ => None,
        })
        .with_logit_scale(match family {
            _ if family.is_cohere() => Some(self.cohere_logit_scale()?),
            // HyperCLOVA X multiplies by `logits_scaling`, Granite divides.
            ModelType::HyperClovaX => self.logits_scaling,
            // MiniCPM3 divides the final states by `hidden_size / dim_model_base`.
            ModelType::MiniCpm3 => self.dim_model_base.map(|base| base / d_model as f64),
            _ if family.is_granite() => self.logits_scaling.map(f64::recip),
            _ => None,
        })
        .with_qkv_bias(qkv_bias)
        .with_o_bias(o_bias)
        .with_mlp_bias(mlp_bias)
        .with_activation(activation)
        .with_gated_mlp(!family.has_ungated_mlp())
        .with_sliding_window(sliding_window)
        .with_sliding_layers(sliding_layers)
        .with_tie_word_embeddings(self.tie_word_embeddings.unwrap_or(gemma))
        // ERNIE-4.5-MoE's `use_bias` reaches the output head too (the dense model's
        // head has none); Phi's head always has a bias.
        .with_lm_head_bias(
            matches!(
                family,
                ModelType::Phi | ModelType::Gptj | ModelType::Codegen
            ) || (family == ModelType::Ernie45Moe && self.use_bias.unwrap_or(false)),
        )
        .with_sliding_rope(sliding_rope)
        .with_nope_layers(self.nope_layers(family, n_layers)?)
        .with_norm_unit_offset(family.norms_offset_by_one())
        .with_embed_scale(match family {
            _ if gemma || family == ModelType::Gemma4Text => Some((d_model as f64).sqrt()),
            ModelType::MiniCpm3 => self.scale_emb,
            ModelType::Biogpt if self.scale_embedding.unwrap_or(true) => {
                Some((d_model as f64).sqrt())
            }
            _ if family.is_granite() => self.embedding_multiplier,
            _ => None,
        })
        .with_attention_scale(match family {
            // Gemma-4 normalizes queries and keys and does not scale their product.
            ModelType::Gemma4Text => {
                unread.fixed(
                    "query_pre_attn_scalar",
                    self.query_pre_attn_scalar.map(Some),
                    None,
                    "unscaled attention scores",
                );
                Some(1.0)
            }
            _ if family.is_gemma2_or_later() => Some(
                self.query_pre_attn_scalar
                    .unwrap_or(head_dim as f64)
                    .powf(-0.5),
            ),
            _ if family.is_granite() => self.attention_multiplier,
            ModelType::Mpt => self.mpt_attention().softmax_scale,
            // GPT-Neo does not scale its scores.
            ModelType::GptNeo => Some(1.0),
            _ => {
                unread.fixed(
                    "query_pre_attn_scalar",
                    self.query_pre_attn_scalar.map(Some),
                    None,
                    "head_dim^-½ as the attention scale",
                );
                None
            }
        })
        .with_query_temperature(match family {
            ModelType::Ministral3 | ModelType::Mistral4 => query_temperature(config),
            _ => None,
        })
        .with_residual_scale(match family {
            _ if family.is_granite() => self.residual_multiplier,
            ModelType::MiniCpm3 => self
                .scale_depth
                .map(|depth| depth / (n_layers as f64).sqrt()),
            _ => None,
        })
        .with_attention_softcap(attention_softcap)
        .with_attention_sinks(matches!(family, ModelType::GptOss | ModelType::GraniteSwa))
        .with_final_logit_softcap(final_logit_softcap)
        .with_qk_norm(self.qk_norm(family))
        .with_block_kind(match family {
            ModelType::Olmo2 | ModelType::Olmo3 | ModelType::Exaone4 | ModelType::FlexOlmo => {
                BlockKind::OutputNorm
            }
            ModelType::Cohere
            | ModelType::Cohere2
            | ModelType::Phi
            | ModelType::Gptj
            | ModelType::Codegen => BlockKind::Parallel,
            ModelType::StableLm if self.use_parallel_residual == Some(true) => BlockKind::Parallel,
            ModelType::GptNeox if self.use_parallel_residual.unwrap_or(true) => {
                BlockKind::ParallelSeparateNorms
            }
            ModelType::Opt if !self.do_layer_norm_before.unwrap_or(true) => BlockKind::PostNorm,
            ModelType::Falcon => self.falcon_block_kind(),
            ModelType::Gemma2 | ModelType::Gemma3Text | ModelType::Gemma4Text | ModelType::Glm4 => {
                BlockKind::Sandwich
            }
            ModelType::HyperClovaX if self.use_post_norm.unwrap_or(true) => BlockKind::Sandwich,
            _ => BlockKind::PreNorm,
        })
        .with_initializer(burn::module::Initializer::Normal {
            mean: 0.0,
            std: self.initializer_range.unwrap_or(0.02),
        });
        if matches!(
            family,
            ModelType::Gpt2
                | ModelType::GptBigcode
                | ModelType::GptNeo
                | ModelType::Opt
                | ModelType::Biogpt
        ) {
            model.learned_positions = Some(size(
                self.max_position_embeddings,
                "max_position_embeddings",
            )?);
        }
        if family == ModelType::Bloom {
            model.alibi = Some(Alibi::new());
            model.embed_norm = true;
        }
        // nanochat normalizes the embeddings with its final norm (no parameters) and
        // rotates by the negated angle (its `rotate_half` is `cat(x2, −x1)`).
        if family == ModelType::NanoChat {
            model.embed_norm = true;
            model.rope.reversed = true;
        }
        if family == ModelType::Mpt {
            model.alibi = Some(Alibi::new());
            self.note_mpt_keys(unread);
        }
        // BioGPT's table of positions starts two rows in, as OPT's.
        if family == ModelType::Biogpt {
            model.reserved_position_rows = super::opt::RESERVED_POSITION_ROWS;
        }
        if family == ModelType::Opt {
            model.reserved_position_rows = super::opt::RESERVED_POSITION_ROWS;
            // OPT's LayerNorms have or lack both parameters.
            let affine = self.layer_norm_elementwise_affine.unwrap_or(true);
            model.norm_scale = affine;
            model.layer_norm_bias = affine;
        }
        if matches!(family, ModelType::Gpt2 | ModelType::GptBigcode)
            && self.scale_attn_weights == Some(false)
        {
            model.attention_scale = Some(1.0);
        }
        // Granite-SWA's bases per layer; a layer of base 0 is among `nope_layers` above,
        // so the base it keeps here is never used.
        if family == ModelType::GraniteSwa
            && let Some(bases) = self.layer_rope_theta_checked(n_layers)?
        {
            let theta = model.rope.theta;
            let bases = bases
                .iter()
                .map(|&base| if base == 0.0 { theta } else { base })
                .collect();
            model.layer_rope_theta = Some(bases);
        }
        if family.is_sparse() {
            let moe = read_keys::<MoeKeys>(config, None)?;
            let mut moe_config = moe.moe_config(unread)?;
            if family == ModelType::GptOss {
                moe_config.router.bias = true;
                moe_config.expert_bias = true;
                moe_config.expert_glu = ExpertGlu::Clamped {
                    alpha: self.swiglu_alpha.unwrap_or(1.702),
                    limit: self.swiglu_limit.unwrap_or(7.0),
                };
            }
            model = model
                .with_moe(Some(moe_config))
                .with_moe_layers(moe.moe_layer_plan()?);
            if let Some(coef) = self.router_aux_loss_coef.or(self.aux_loss_alpha) {
                model.aux_loss_coef = coef;
            }
            if let Some(coef) = self.router_z_loss_coef {
                model.router_z_loss_coef = coef;
            }
        }
        if family == ModelType::Gemma4Text {
            read_keys::<Gemma4Keys>(config, None)?.apply(&mut model, unread)?;
        }
        if family == ModelType::Llama4Text {
            read_keys::<Llama4Keys>(config, None)?.apply(&mut model, unread)?;
        }
        if family.is_hybrid_linear() {
            read_keys::<HybridKeys>(config, None)?.apply(&mut model)?;
        }
        if family.is_latent() {
            let (mut latent, rope) = LatentKeys::read(config)?;
            // MiniCPM3 rotates the two halves of each head (its class has no switch).
            if family == ModelType::MiniCpm3 {
                latent.rope_interleave = Some(unread.fixed(
                    "rope_interleave",
                    latent.rope_interleave,
                    false,
                    "the rotary embedding on the halves of each head",
                ));
            }
            model.latent = Some(latent.latent_attention_config(&rope)?);
        }
        Ok(model)
    }

    /// GPT-2's switches that change the model beyond what this crate builds: a per-layer
    /// scale of the scores, cross-attention layers; its heads must split the width.
    fn check_gpt2(&self) -> Result<(), KeyError> {
        if self.scale_attn_by_inverse_layer_idx == Some(true) {
            return Err(KeyError::new(
                "scale_attn_by_inverse_layer_idx",
                "is true: a further scale 1 / (layer + 1) of each layer's attention scores \
                 is not supported; only checkpoints with it false load",
            ));
        }
        if self.add_cross_attention == Some(true) {
            return Err(KeyError::new(
                "add_cross_attention",
                "is true: GPT-2 with cross-attention layers (an encoder-decoder's decoder) \
                 is not supported; this loader builds causal language models",
            ));
        }
        self.check_heads_split_the_width()
    }

    /// GPT-2's and GPT-J's heads split the width (`n_embd`), as their classes require.
    fn check_heads_split_the_width(&self) -> Result<(), KeyError> {
        if let (Some(width), Some(heads)) = (self.hidden_size, self.num_attention_heads)
            && heads > 0
            && width % heads != 0
        {
            return Err(KeyError::new(
                "n_head",
                format!("{heads} heads do not divide the width n_embd {width}"),
            ));
        }
        Ok(())
    }

    /// GPT-Neo's window and the layers it slides on: its `attention_types` runs of
    /// `[[kinds…], repeats]` expanded, a `local` layer sliding.
    fn gpt_neo_layers(
        &self,
        n_layers: usize,
    ) -> Result<(Option<usize>, Option<Vec<bool>>), KeyError> {
        let malformed = || {
            KeyError::new(
                "attention_types",
                "expected a list of `[[kinds…], repeats]` with each kind \"global\" or \
                 \"local\"",
            )
        };
        let mut layers = Vec::new();
        let runs = self.attention_types.as_ref().and_then(Value::as_array);
        for run in runs.ok_or_else(malformed)? {
            let (kinds, repeats) = match run.as_array().map(Vec::as_slice) {
                Some([kinds, repeats]) => (kinds.as_array(), repeats.as_u64()),
                _ => return Err(malformed()),
            };
            let (Some(kinds), Some(repeats)) = (kinds, repeats) else {
                return Err(malformed());
            };
            if kinds.is_empty() {
                return Err(malformed());
            }
            for _ in 0..repeats {
                for kind in kinds {
                    match kind.as_str() {
                        Some("global") => layers.push(false),
                        Some("local") => layers.push(true),
                        _ => return Err(malformed()),
                    }
                }
                // A huge repeat count is an error, not an allocation.
                if layers.len() > n_layers {
                    break;
                }
            }
        }
        if layers.len() != n_layers {
            let count = match layers.len() > n_layers {
                true => "more".to_string(),
                false => layers.len().to_string(),
            };
            return Err(KeyError::new(
                "attention_types",
                format!("gives {count} layers, but the model has {n_layers} (num_layers)"),
            ));
        }
        let window = required(self.window_size, "window_size", "a positive integer")?;
        if window == 0 {
            return Err(KeyError::new("window_size", "must be positive"));
        }
        Ok((Some(window), Some(layers)))
    }

    /// MPT's attention keys (its `attn_config`; all defaults without one).
    fn mpt_attention(&self) -> &MptAttentionKeys {
        static DEFAULTS: MptAttentionKeys = MptAttentionKeys {
            softmax_scale: None,
            clip_qkv: None,
            alibi_bias_max: None,
            qk_ln: None,
            attn_type: None,
        };
        self.attn_config.as_ref().unwrap_or(&DEFAULTS)
    }

    /// Cohere's factor on the logits: 1 where the file has none, a number otherwise.
    fn cohere_logit_scale(&self) -> Result<f64, KeyError> {
        match &self.logit_scale {
            None => Ok(1.0),
            Some(LogitScale::Factor(factor)) => Ok(*factor),
            Some(LogitScale::Named(name)) => Err(KeyError::new(
                "logit_scale",
                format!(
                    "is the name {name:?}: Cohere's models multiply their logits by a \
                     number (0.0625 in the published ones); write that number"
                ),
            )),
        }
    }

    /// MPT's keys that transformers' MPT does not read, noted where a file sets them to
    /// something else than what it computes.
    fn note_mpt_keys(&self, unread: &mut UnreadKeys) {
        let attention = self.mpt_attention();
        unread.fixed(
            "logit_scale",
            self.logit_scale.as_ref().map(|_| "set"),
            "unset",
            "unscaled logits",
        );
        unread.fixed(
            "expansion_ratio",
            self.expansion_ratio,
            4.0,
            "a feed-forward 4 times the width",
        );
        unread.fixed(
            "attn_config.alibi_bias_max",
            attention.alibi_bias_max,
            8.0,
            "ALiBi slopes down to 2^-8",
        );
        unread.fixed("attn_config.qk_ln", attention.qk_ln, false, "no QK-norm");
        unread.fixed(
            "attn_config.attn_type",
            attention.attn_type.as_deref(),
            "multihead_attention",
            "multi-head attention",
        );
    }

    /// Falcon's ALiBi, which transformers computes two ways, and the arrangements of norms
    /// that transformers' Falcon cannot run either (it builds other norms than it
    /// reads).
    fn check_falcon(&self) -> Result<(), KeyError> {
        if self.alibi == Some(true) {
            return Err(KeyError::new(
                "alibi",
                "is true: Falcon's ALiBi is not supported, as transformers gives it no \
                 single meaning (its eager attention adds the bias twice, its SDPA \
                 attention once, both with slopes rounded to bf16); only Falcon models \
                 with the rotary embedding, `alibi: false`, load",
            ));
        }
        let new = self.new_decoder_architecture.unwrap_or(false);
        let parallel = self.parallel_attn.unwrap_or(true);
        let two_norms = self.num_ln_in_parallel_attn == Some(2);
        if (new && !parallel) || (!new && parallel && two_norms) {
            return Err(KeyError::new(
                "num_ln_in_parallel_attn",
                "does not fit `new_decoder_architecture` and `parallel_attn`: transformers' \
                 Falcon builds other norms than it reads with these settings",
            ));
        }
        Ok(())
    }

    /// Falcon's blocks: the new architecture's parallel sublayers after a norm each (or
    /// one shared with `num_ln_in_parallel_attn: 1`), the old one's parallel
    /// sublayers after one norm, or sequential Pre-LN blocks.
    fn falcon_block_kind(&self) -> BlockKind {
        let new = self.new_decoder_architecture.unwrap_or(false);
        match (new, self.num_ln_in_parallel_attn) {
            (true, Some(1)) => BlockKind::Parallel,
            (true, _) => BlockKind::ParallelSeparateNorms,
            (false, _) if self.parallel_attn.unwrap_or(true) => BlockKind::Parallel,
            (false, _) => BlockKind::PreNorm,
        }
    }

    /// OPT's switches that change the model beyond what this crate builds: embeddings
    /// of another width than the model's (OPT-350M's `project_in` / `project_out`), no
    /// final norm after pre-norm blocks.
    fn check_opt(&self) -> Result<(), KeyError> {
        if let (Some(width), Some(hidden)) = (self.word_embed_proj_dim, self.hidden_size)
            && width != hidden
        {
            return Err(KeyError::new(
                "word_embed_proj_dim",
                format!(
                    "is {width}, not hidden_size {hidden}: embeddings projected to and from \
                     the model's width (OPT-350M's project_in / project_out) are not \
                     supported"
                ),
            ));
        }
        if self.remove_final_layer_norm == Some(true) && self.do_layer_norm_before != Some(false) {
            return Err(KeyError::new(
                "_remove_final_layer_norm",
                "is true: pre-norm blocks without a norm after the last one are not \
                 supported",
            ));
        }
        Ok(())
    }

    /// QK-norm, with the model's eps: Qwen3, Qwen3-MoE, dots.llm1, EXAONE-4, Apertus,
    /// GLM-4.5 (with `use_qk_norm`) and Gemma-3 (with Gemma's RMSNorm) normalize each head
    /// (`q_norm` / `k_norm` of width `head_dim`), Hunyuan and nanochat (without a scale)
    /// each rotated head, OLMo-2, OLMo-3, OLMoE and MiniMax-M2 the whole projections: all
    /// with an RMSNorm. Phi and Persimmon (with `qk_layernorm`) take a LayerNorm with a
    /// shift, shared by the heads; Cohere (with `use_qk_norm`) and StableLM (with
    /// `qk_layernorm`) a LayerNorm without one, with weights of its own per head.
    fn qk_norm(&self, family: ModelType) -> Option<QkNormConfig> {
        let rms = |placement| {
            QkNormConfig::new()
                .with_placement(placement)
                .with_eps(self.norm_eps(family))
                .with_unit_offset(family.norms_offset_by_one())
        };
        let layer = || {
            QkNormConfig::new()
                .with_kind(QkNormKind::Layer)
                .with_eps(self.norm_eps(family))
        };
        let qk_layernorm = self.qk_layernorm == Some(true);
        Some(match family {
            ModelType::Qwen3
            | ModelType::Qwen3Moe
            | ModelType::Qwen35Text
            | ModelType::Qwen35Moe
            | ModelType::Qwen3Next
            | ModelType::Dots1
            | ModelType::Gemma3Text
            | ModelType::Gemma4Text
            | ModelType::Exaone4
            | ModelType::ExaoneMoe
            | ModelType::Apertus => rms(QkNormPlacement::PerHead),
            ModelType::Glm4Moe if self.use_qk_norm == Some(true) => rms(QkNormPlacement::PerHead),
            _ if family.is_hunyuan() => rms(QkNormPlacement::PerHeadAfterRope),
            ModelType::NanoChat => rms(QkNormPlacement::PerHeadAfterRope).with_scale(false),
            ModelType::Olmo2
            | ModelType::Olmo3
            | ModelType::Olmoe
            | ModelType::FlexOlmo
            | ModelType::MinimaxM2 => rms(QkNormPlacement::AcrossHeads),
            ModelType::Phi | ModelType::Persimmon if qk_layernorm => layer().with_bias(true),
            ModelType::StableLm if qk_layernorm => layer().with_weights_per_head(true),
            ModelType::Cohere if self.use_qk_norm == Some(true) => {
                layer().with_weights_per_head(true)
            }
            _ => return None,
        })
    }

    /// Granite-SWA's `layer_rope_theta`, one non-negative base per layer; `None` without
    /// the key.
    fn layer_rope_theta_checked(&self, n_layers: usize) -> Result<Option<&[f64]>, KeyError> {
        let Some(bases) = &self.layer_rope_theta else {
            return Ok(None);
        };
        let key = "layer_rope_theta";
        if bases.len() != n_layers {
            return Err(KeyError::new(
                key,
                format!("has {} entries for {n_layers} layers", bases.len()),
            ));
        }
        if let Some(base) = bases
            .iter()
            .find(|base| !(base.is_finite() && **base >= 0.0))
        {
            return Err(KeyError::new(
                key,
                format!("expected a non-negative base per layer (0: no RoPE), got {base}"),
            ));
        }
        Ok(Some(bases))
    }

    /// SmolLM3's and Llama 4's layers without RoPE (`no_rope_layers` 0) and EXAONE-4's (EXAONE-MoE's)
    /// full layers beside sliding ones; `None` for the families whose every layer
    /// rotates.
    fn nope_layers(
        &self,
        family: ModelType,
        n_layers: usize,
    ) -> Result<Option<Vec<bool>>, KeyError> {
        // Granite-SWA's layers of base 0 do not rotate.
        if family == ModelType::GraniteSwa
            && let Some(bases) = self.layer_rope_theta_checked(n_layers)?
        {
            return Ok(Some(bases.iter().map(|&base| base == 0.0).collect()));
        }
        // Cohere-2 rotates its sliding layers only (none without a window).
        if family == ModelType::Cohere2 {
            let types = self.layer_types.as_deref().unwrap_or_default();
            let rotates = |layer: usize| {
                self.sliding_window.is_some()
                    && types
                        .get(layer)
                        .is_some_and(|kind| kind == "sliding_attention")
            };
            return Ok(Some((0..n_layers).map(|layer| !rotates(layer)).collect()));
        }
        // EXAONE-4's (and EXAONE-MoE's) full layers go without RoPE when the model has
        // sliding ones.
        if matches!(family, ModelType::Exaone4 | ModelType::ExaoneMoe) {
            let full_layers = self
                .sliding_window
                .and(self.layer_types.as_ref())
                .map(|types| types.iter().map(|kind| kind == "full_attention").collect());
            return Ok(full_layers);
        }
        let (ModelType::Smollm3 | ModelType::Llama4Text, Some(flags)) =
            (family, &self.no_rope_layers)
        else {
            return Ok(None);
        };
        if flags.len() != n_layers {
            return Err(KeyError::new(
                "no_rope_layers",
                format!("has {} entries for {n_layers} layers", flags.len()),
            ));
        }
        flags
            .iter()
            .map(|&flag| match flag {
                0 => Ok(true),
                1 => Ok(false),
                _ => Err(KeyError::new(
                    "no_rope_layers",
                    format!("expected 0 (no RoPE) or 1 (RoPE) per layer, got {flag}"),
                )),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// The norms' epsilon: Cohere's, Jais-2's, GPT-2's and GPT-J's (`layer_norm_epsilon`),
    /// GPT-NeoX's, Falcon's (`layer_norm_epsilon`), Phi's, StableLM's and Persimmon's
    /// `layer_norm_eps`,
    /// StarCoder2's `norm_epsilon`, Nemotron's `norm_eps`, OLMo's fixed 1e-5, every
    /// other family's `rms_norm_eps`.
    fn norm_eps(&self, family: ModelType) -> f64 {
        match family {
            _ if family.is_cohere()
                || matches!(
                    family,
                    ModelType::Jais2
                        | ModelType::Gpt2
                        | ModelType::GptBigcode
                        | ModelType::GptNeo
                        | ModelType::Gptj
                        | ModelType::Codegen
                        | ModelType::GptNeox
                        | ModelType::Falcon
                        | ModelType::Bloom
                        | ModelType::Mpt
                        | ModelType::Phi
                        | ModelType::StableLm
                        | ModelType::Persimmon
                ) =>
            {
                self.layer_norm_eps.unwrap_or(1e-5)
            }
            ModelType::Starcoder2 => self.norm_epsilon.unwrap_or(1e-5),
            // OLMo's and OPT's LayerNorms have no epsilon to set; BioGPT's keep PyTorch's
            // default whatever `layer_norm_eps` says.
            ModelType::Olmo | ModelType::Opt | ModelType::Biogpt => 1e-5,
            ModelType::Nemotron => self.norm_eps.unwrap_or(1e-5),
            _ => self.rms_norm_eps.unwrap_or(1e-6),
        }
    }

    /// `(sliding_window, sliding_layers)`: Mistral, Ministral-3, Mixtral, Phi-3 and
    /// StarCoder2 slide on every layer when `sliding_window` is set; Qwen2, Qwen2-MoE,
    /// Qwen3 and SmolLM3 only with `use_sliding_window`, on the layers `layer_types` (or
    /// `max_window_layers`) names; dots.llm1 on those layers whenever a window is set;
    /// Qwen3-MoE with `use_sliding_window` on every layer; other families on the layers
    /// `layer_types` names, or every layer; GPT-2 and its era's families, LLaMA,
    /// InternLM3, MiniCPM3, HyperCLOVA X, OLMo, Phi, StableLM, Persimmon, Nemotron, GLM,
    /// Jais-2, Youtu, FlexOlmo, Solar-Open, Granite, Arcee, Apertus, nanochat, Helium,
    /// Hunyuan, Gemma, GLM-4, GLM-4.5, GLM-4.7-Flash, OLMoE, MiniMax-M2, Seed-OSS,
    /// ERNIE-4.5(-MoE) and Cohere never.
    fn sliding_window(
        &self,
        family: ModelType,
        n_layers: usize,
        unread: &mut UnreadKeys,
    ) -> Result<(Option<usize>, Option<Vec<bool>>), KeyError> {
        if self.sliding_window == Some(0) {
            return Err(KeyError::new("sliding_window", "must be positive"));
        }
        let window = match family {
            ModelType::Qwen2
            | ModelType::Qwen2Moe
            | ModelType::Qwen3
            | ModelType::Qwen3Moe
            | ModelType::Smollm3
                if !self.use_sliding_window.unwrap_or(false) =>
            {
                None
            }
            ModelType::GptNeo => return self.gpt_neo_layers(n_layers),
            _ if family.is_classic_gpt() => None,
            ModelType::Llama
            | ModelType::InternLm3
            | ModelType::MiniCpm3
            | ModelType::HyperClovaX
            | ModelType::Olmo
            | ModelType::Phi
            | ModelType::StableLm
            | ModelType::Persimmon
            | ModelType::Nemotron
            | ModelType::Glm
            | ModelType::Jais2
            | ModelType::Youtu
            | ModelType::FlexOlmo
            | ModelType::SolarOpen
            | ModelType::Granite
            | ModelType::GraniteMoe
            | ModelType::GraniteMoeShared
            | ModelType::Arcee
            | ModelType::Apertus
            | ModelType::NanoChat
            | ModelType::Helium
            | ModelType::HunyuanV1Dense
            | ModelType::HunyuanV1Moe
            | ModelType::Gemma
            | ModelType::Glm4
            | ModelType::Glm4Moe
            | ModelType::Glm4MoeLite
            | ModelType::Olmoe
            | ModelType::MinimaxM2
            | ModelType::SeedOss
            | ModelType::Ernie45
            | ModelType::Ernie45Moe
            | ModelType::Llama4Text
            | ModelType::Qwen3Next
            | ModelType::Qwen35Text
            | ModelType::Qwen35Moe
            | ModelType::Cohere => None,
            _ => self.sliding_window,
        };
        let Some(window) = window else {
            return Ok((None, None));
        };
        if matches!(
            family,
            ModelType::Mistral
                | ModelType::Starcoder2
                | ModelType::Ministral3
                | ModelType::Mixtral
                | ModelType::Phi3
                | ModelType::Qwen3Moe
        ) {
            let every_layer_slides = self
                .layer_types
                .as_ref()
                .map(|types| types.iter().all(|kind| kind == "sliding_attention"));
            unread.fixed(
                "layer_types",
                every_layer_slides,
                true,
                "a window on every layer",
            );
            return Ok((Some(window), None));
        }
        let layers = match &self.layer_types {
            Some(types) => Some(layers_of_kind(types, n_layers, "sliding_attention")?),
            None if matches!(
                family,
                ModelType::Qwen2 | ModelType::Qwen3 | ModelType::Dots1
            ) =>
            {
                let first = self.max_window_layers.unwrap_or(28);
                Some((0..n_layers).map(|layer| layer >= first).collect())
            }
            // transformers 5's Qwen2-MoE: every other layer below `max_window_layers`,
            // from the first.
            None if family == ModelType::Qwen2Moe => {
                let below = self.max_window_layers.unwrap_or(28);
                Some(
                    (0..n_layers)
                        .map(|layer| layer % 2 == 0 && layer < below)
                        .collect(),
                )
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
    fn eos_token_id_is_a_number_or_a_list() {
        let read = |eos: &str| {
            let text = LLAMA.replace(
                "\"eos_token_id\": [1, 2]",
                &format!("\"eos_token_id\": {eos}"),
            );
            HfConfig::from_json(&text, "config.json")
        };
        assert_eq!(read("7").unwrap().eos_token_ids, vec![7]);
        assert_eq!(read("null").unwrap().eos_token_ids, Vec::<u32>::new());
        assert_eq!(read("[]").unwrap().eos_token_ids, Vec::<u32>::new());
        for bad in ["\"2\"", "[1, -2]", "5000000000"] {
            let error = read(bad).unwrap_err();
            assert!(
                matches!(&error, HfError::Field { field, .. } if field.starts_with("eos_token_id")),
                "{bad}: {error}"
            );
        }
    }

    #[test]
    fn unsupported_model_type_lists_the_supported_ones() {
        let text = LLAMA.replace("\"llama\"", "\"bert\"");
        let error = HfConfig::from_json(&text, "dir/config.json").unwrap_err();
        let message = error.to_string();
        assert!(matches!(error, HfError::UnsupportedModelType { .. }));
        assert!(message.contains("dir/config.json"), "{message}");
        assert!(message.contains("\"bert\""), "{message}");
        assert!(message.contains("(supported: llama, "), "{message}");
        assert!(message.contains(", mistral, "), "{message}");
        // Another family's keys do not matter: its type is the error.
        let text = text.replace("\"hidden_size\": 32", "\"hidden_size\": \"wide\"");
        let error = HfConfig::from_json(&text, "config.json").unwrap_err();
        assert!(
            matches!(error, HfError::UnsupportedModelType { .. }),
            "{error}"
        );
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
        // Nested keys are dotted; the message says what was expected.
        let text = LLAMA.replace("\"factor\": 8.0", "\"factor\": \"8\"");
        let error = HfConfig::from_json(&text, "config.json").unwrap_err();
        assert!(
            matches!(&error, HfError::Field { field, .. } if field == "rope_scaling.factor"),
            "{error}"
        );
        assert!(error.to_string().contains("expected f64"), "{error}");
        // A missing size is LlamaConfig's.
        let text = LLAMA.replace("\"vocab_size\": 100,", "");
        let config = HfConfig::from_json(&text, "config.json").unwrap();
        assert_eq!(config.model.vocab_size, 32000);
        let error = HfConfig::from_json("[1, 2]", "config.json").unwrap_err();
        assert!(
            matches!(&error, HfError::Field { field, .. } if field == "(root)"),
            "{error}"
        );
        let text = LLAMA.replace("\"model_type\": \"llama\",", "");
        let error = HfConfig::from_json(&text, "config.json").unwrap_err();
        assert!(
            matches!(&error, HfError::Field { field, .. } if field == "model_type"),
            "{error}"
        );
        let text = LLAMA.replace(
            "\"tie_word_embeddings\": true",
            "\"hidden_act\": \"quick_gelu\"",
        );
        let error = HfConfig::from_json(&text, "config.json").unwrap_err();
        assert!(
            matches!(&error, HfError::Field { field, .. } if field == "hidden_act"),
            "{error}"
        );
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

    #[test]
    fn sliding_windows_follow_each_family() {
        let with = |model_type: &str, extra: &str| {
            let text = LLAMA
                .replace("\"llama\"", &format!("\"{model_type}\""))
                .replace(
                    "\"tie_word_embeddings\"",
                    &format!("{extra} \"tie_word_embeddings\""),
                );
            HfConfig::from_json(&text, "config.json")
        };
        let window = "\"sliding_window\": 4,";
        // LLaMA ignores the key; Mistral slides everywhere; Qwen2 only when asked.
        assert_eq!(with("llama", window).unwrap().model.window_of(0), None);
        let mistral = with("mistral", window).unwrap().model;
        assert_eq!(
            (mistral.window_of(0), mistral.window_of(1)),
            (Some(4), Some(4))
        );
        assert!(!mistral.qkv_bias && !mistral.o_bias);
        assert_eq!(with("qwen2", window).unwrap().model.window_of(1), None);
        let listed = with(
            "qwen2",
            "\"use_sliding_window\": true, \"sliding_window\": 4, \
             \"layer_types\": [\"sliding_attention\", \"full_attention\"],",
        )
        .unwrap()
        .model;
        assert_eq!((listed.window_of(0), listed.window_of(1)), (Some(4), None));
        let field = |result: Result<HfConfig, HfError>| match result {
            Err(HfError::Field { field, .. }) => field,
            other => panic!("expected a field error, got {other:?}"),
        };
        assert_eq!(
            field(with("llama", "\"sliding_window\": 0,")),
            "sliding_window"
        );
        assert_eq!(
            field(with(
                "gemma2",
                "\"sliding_window\": 4, \"layer_types\": [\"full_attention\"],"
            )),
            "layer_types"
        );
        assert_eq!(
            field(with(
                "gemma2",
                "\"sliding_window\": 4, \"layer_types\": [\"full_attention\", \"chunked\"],"
            )),
            "layer_types"
        );
        // Mistral's code reads no layer types: it slides everywhere and says so.
        let typed = with(
            "mistral",
            "\"sliding_window\": 4, \"layer_types\": [\"full_attention\", \"sliding_attention\"],",
        )
        .unwrap();
        assert_eq!(typed.model.window_of(0), Some(4));
        assert_eq!(typed.unread_keys.len(), 1, "{:?}", typed.unread_keys);
        assert!(typed.unread_keys[0].starts_with("`layer_types: "));
        // Quantized checkpoints and Gemma encoders are refused by name.
        let quantized = with(
            "gpt_oss",
            "\"quantization_config\": {\"quant_method\": \"mxfp4\"},",
        );
        assert_eq!(field(quantized), "quantization_config");
        let encoder = with("gemma3_text", "\"use_bidirectional_attention\": true,");
        assert_eq!(field(encoder), "use_bidirectional_attention");
        let clamped = with("olmoe", "\"clip_qkv\": 8.0,").unwrap();
        assert_eq!(clamped.model.qkv_clip, Some(8.0));
        let switch = with("llama", "\"use_qk_norm\": true,").unwrap();
        assert!(switch.model.qk_norm.is_none());
        assert!(switch.unread_keys[0].starts_with("`use_qk_norm: true`"));
        let unread = with("llama", "\"clip_qkv\": 8.0,").unwrap();
        assert!(
            unread.unread_keys[0].starts_with("`clip_qkv: 8.0`"),
            "{:?}",
            unread.unread_keys
        );
        // A missing window is the class default (4096), a null one no window.
        assert_eq!(with("mistral", "").unwrap().model.window_of(0), Some(4096));
        let null = with("mistral", "\"sliding_window\": null,").unwrap();
        assert_eq!(null.model.window_of(0), None);
        // Without a window, other layer kinds are not this crate's concern.
        let other_kinds = with(
            "llama",
            "\"layer_types\": [\"linear_attention\", \"full_attention\"],",
        );
        assert!(other_kinds.is_ok());
    }
}
