//! Saving a [`CausalLm`] as a Hugging Face model folder: `config.json` and
//! `model.safetensors` (or shards with `model.safetensors.index.json`) in
//! transformers' names and layouts, so that transformers, vLLM and our own loader
//! read it.
//!
//! The inverse of loading: our parameter paths become checkpoint keys through the
//! family's [`KeyMap::checkpoint_key`]; linear weights are transposed to torch's
//! `[out, in]`; our stacked experts are written per expert (`experts.E.gate_proj`, or
//! Mixtral's and MiniMax-M2's `w1`/`w3`/`w2`) or, for gpt-oss, back in its interleaved
//! `gate_up_proj` `[E, d_model, 2·d_ff]`; ERNIE-4.5-MoE's correction biases get their
//! leading unit dimension back; Phi-3's, GPT-2's and GPT-NeoX's fused projections are
//! stacked back ([`KeyMap::fused`], GPT-NeoX's and Falcon's group by group) and GPT-2's `Conv1D`
//! weights transposed back to `[in, out]`;
//! DeepSeek-V3's multi-token-prediction modules
//! go to the layers after the decoder with copies of the embedding and head, as its
//! checkpoints hold them. LoRA adapters are merged first.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::tensor::DType;
use serde_json::{Value, json};

use super::apertus;
use super::checkpoint::{
    CONFIG_FILE, INDEX_FILE, KeyMap, WEIGHTS_FILE, causal_lm_key_map, has_mixtral_layout,
    has_unit_leading_dim, stacked_expert_column, stores_stacked_experts, x_w_experts,
};
use super::config::{HfConfig, text_model_config};
use super::error::HfError;
use super::gemma4;
use super::gpt2;
use super::qwen3_next;
use super::stablelm;
use super::tensors::{HostTensor, encode, host_parameters, write_safetensors};
use crate::attention::{QkNormKind, QkNormPlacement};
use crate::block::BlockKind;
use crate::ffn::Activation;
use crate::io::write_atomically;
use crate::model::{CausalLm, CausalLmConfig};
use crate::position::{RopeLayout, RopeScaling};

/// How to save a model.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    /// The float type of the saved tensors: f32, bf16 or f16. Default: f32.
    pub dtype: DType,
    /// Shards hold at most this many bytes of tensors (a larger tensor gets a shard of
    /// its own); a model that fits is one `model.safetensors`. Default: 5 GB
    /// (transformers' `max_shard_size`).
    pub max_shard_bytes: usize,
}

impl Default for ExportOptions {
    fn default() -> Self {
        Self {
            dtype: DType::F32,
            max_shard_bytes: 5_000_000_000,
        }
    }
}

/// What [`save_causal_lm`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportReport {
    /// The `model_type` of the saved `config.json` (a multimodal model's text family).
    pub model_type: String,
    /// The files written, `config.json` first.
    pub files: Vec<PathBuf>,
    /// Tensors saved.
    pub tensors: usize,
    /// Bytes of tensor data.
    pub bytes: usize,
}

/// The `config.json` value transformers writes for a float type.
pub fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        _ => "float32",
    }
}

/// Saves `model` into `dir` as a Hugging Face model described by `config_json` (the
/// `config.json` the model was loaded from, or [`hf_config_json`] of a model built
/// here; a multimodal one's text model, as its text family: Gemma-3 as `gemma3_text`);
/// its `dtype` key is set to the saved type. Adapters are merged into the
/// weights. Every file is written under a temporary name and renamed.
///
/// # Errors
/// [`HfError`] when `config_json` is not a supported configuration, describes another
/// model than `model` (a parameter has no checkpoint key of its family, or two share
/// one), the dtype is not a float type, or a file cannot be written.
pub fn save_causal_lm(
    model: &CausalLm,
    config_json: &Value,
    dir: &Path,
    options: &ExportOptions,
) -> Result<ExportReport, HfError> {
    if !matches!(options.dtype, DType::F32 | DType::BF16 | DType::F16) {
        return Err(HfError::Unsupported {
            what: dir.display().to_string(),
            reason: format!(
                "cannot save tensors as {:?}: use f32, bf16 or f16",
                options.dtype
            ),
        });
    }
    let config_path = dir.join(CONFIG_FILE);
    // A multimodal checkpoint's model is its text model (the vision tower is never
    // loaded), saved as that family's checkpoint.
    let text_model = text_model_config(config_json).map_err(|error| error.in_file(&config_path))?;
    let config_json = text_model.as_ref().unwrap_or(config_json);
    let config = HfConfig::from_value(config_json, &config_path)?;
    let keys = causal_lm_key_map(&config);
    let merged = model.clone().valid().materialize();
    let parameters = host_parameters(&merged);
    let tensors = checkpoint_tensors(parameters, merged.mtp_depth(), &config, &keys, &config_path)?;

    let mut config_json = config_json.clone();
    if let Some(object) = config_json.as_object_mut() {
        object.remove("torch_dtype");
        object.insert("dtype".into(), Value::from(dtype_name(options.dtype)));
    }
    let text = serde_json::to_string_pretty(&config_json).expect("JSON values serialize");
    write_atomically(&config_path, format!("{text}\n")).map_err(|error| HfError::Write {
        path: config_path.clone(),
        message: error.to_string(),
    })?;

    let element = match options.dtype {
        DType::F32 => 4,
        _ => 2,
    };
    let mut shards: Vec<Vec<(String, HostTensor)>> = vec![Vec::new()];
    let mut shard_bytes = 0;
    let mut total = 0;
    for (key, tensor) in tensors {
        let bytes = tensor.values.len() * element;
        if shard_bytes > 0 && shard_bytes + bytes > options.max_shard_bytes {
            shards.push(Vec::new());
            shard_bytes = 0;
        }
        shard_bytes += bytes;
        total += bytes;
        shards.last_mut().expect("one shard").push((key, tensor));
    }
    let count: usize = shards.iter().map(Vec::len).sum();
    let mut files = vec![config_path];
    let n_shards = shards.len();
    let mut weight_map = BTreeMap::new();
    for (index, shard) in shards.into_iter().enumerate() {
        let name = match n_shards {
            1 => WEIGHTS_FILE.to_string(),
            n => format!("model-{:05}-of-{n:05}.safetensors", index + 1),
        };
        let encoded: Vec<(String, Vec<usize>, Vec<u8>)> = shard
            .into_iter()
            .map(|(key, tensor)| {
                weight_map.insert(key.clone(), name.clone());
                (key, tensor.shape, encode(&tensor.values, options.dtype))
            })
            .collect();
        let path = dir.join(&name);
        write_safetensors(&path, &encoded, options.dtype)?;
        files.push(path);
    }
    if n_shards > 1 {
        let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        let path = dir.join(INDEX_FILE);
        let text = serde_json::to_string_pretty(&index).expect("JSON values serialize");
        write_atomically(&path, format!("{text}\n")).map_err(|error| HfError::Write {
            path: path.clone(),
            message: error.to_string(),
        })?;
        files.push(path);
    }
    Ok(ExportReport {
        model_type: config.model_type.clone(),
        files,
        tensors: count,
        bytes: total,
    })
}

/// Our parameters as checkpoint tensors, sorted by key.
fn checkpoint_tensors(
    parameters: Vec<(String, HostTensor)>,
    mtp_depth: usize,
    config: &HfConfig,
    keys: &impl KeyMap,
    config_path: &Path,
) -> Result<BTreeMap<String, HostTensor>, HfError> {
    let mixtral = has_mixtral_layout(&config.model_type);
    let x_w_layout = x_w_experts(&config.model_type);
    let stacked_experts = stores_stacked_experts(&config.model_type);
    let mut tensors = BTreeMap::new();
    let mut insert = |key: String, tensor: HostTensor| -> Result<(), HfError> {
        match tensors.insert(key.clone(), tensor) {
            None => Ok(()),
            Some(_) => Err(HfError::Unsupported {
                what: config_path.display().to_string(),
                reason: format!("two parameters of the model map to the checkpoint key `{key}`"),
            }),
        }
    };
    let mut embedding = None;
    let mut head = None;
    // Blocks of the fused tensors (Phi-3's `qkv_proj`), by fused key, in row order.
    let mut fused: BTreeMap<String, Vec<Option<HostTensor>>> = BTreeMap::new();
    for (path, mut tensor) in parameters {
        let key = keys.checkpoint_key(&path);
        if has_unit_leading_dim(&config.model_type, &key) {
            tensor.shape.insert(0, 1);
        }
        if let Some((fused_key, index, blocks)) = keys.fused(&key) {
            fused.entry(fused_key).or_insert_with(|| vec![None; blocks])[index] = Some(tensor);
            continue;
        }
        // StableLM stores each head's QK-norm on its own.
        if config.model_type == "stablelm"
            && let &[heads, width] = tensor.shape.as_slice()
            && stablelm::head_norm_key(&key, 0).is_some()
        {
            for (head, row) in tensor.values.chunks(width.max(1)).take(heads).enumerate() {
                let key = stablelm::head_norm_key(&key, head).expect("a QK-norm's key");
                let row = HostTensor {
                    values: row.to_vec(),
                    shape: vec![width],
                };
                insert(key, row)?;
            }
            continue;
        }
        if path == "embed_tokens.weight" {
            embedding = Some(tensor.values.clone());
        } else if path == "lm_head.weight" {
            head = Some(tensor.values.clone());
        }
        let expert = [
            "gate_up_proj",
            "down_proj",
            "gate_up_proj_bias",
            "down_proj_bias",
        ]
        .into_iter()
        .find(|part| key.ends_with(&format!(".experts.{part}")));
        match expert {
            Some(_) if stacked_experts => insert(key, tensor)?,
            Some(part) if x_w_layout.is_some() => {
                let interleaved = x_w_layout == Some(true);
                let (key, tensor) = (key.clone(), to_x_w_experts(part, tensor, interleaved));
                insert(key, tensor)?;
            }
            Some(part) => {
                let prefix = key.trim_end_matches(&format!(".{part}")).to_string();
                for (key, tensor) in per_expert(&prefix, part, tensor, mixtral) {
                    insert(key, tensor)?;
                }
            }
            None => insert(key, tensor)?,
        }
    }
    for (key, blocks) in fused {
        let blocks: Option<Vec<HostTensor>> = blocks.into_iter().collect();
        let Some(blocks) = blocks else {
            return Err(HfError::Unsupported {
                what: config_path.display().to_string(),
                reason: format!("the model lacks a projection that `{key}` fuses"),
            });
        };
        let rows: usize = blocks.iter().map(|block| block.shape[0]).sum();
        let shape = [&[rows], &blocks[0].shape[1..]].concat();
        let stacked: Vec<f32> = blocks.into_iter().flat_map(|block| block.values).collect();
        // GPT-NeoX's and Falcon's `query_key_value` hold their blocks group by group.
        let values = match keys.fused_heads(&key) {
            Some(fused) => {
                let width = stacked.len() / rows.max(1);
                let mut values = vec![0.0; stacked.len()];
                for (row, chunk) in stacked.chunks(width).enumerate() {
                    let to = fused.fused_row(row) * width;
                    values[to..to + width].copy_from_slice(chunk);
                }
                values
            }
            None => stacked,
        };
        insert(key, HostTensor { values, shape })?;
    }
    let n_layers = config.model.n_layers;
    // Apertus stores xIELU's constants as buffers of every layer.
    if config.model_type == "apertus" {
        for layer in 0..n_layers {
            for (key, value) in apertus::xielu_buffers(layer) {
                let constant = HostTensor {
                    values: vec![value as f32],
                    shape: Vec::new(),
                };
                insert(key, constant)?;
            }
        }
    }
    // DeepSeek-V3 stores each multi-token-prediction layer with copies of the
    // embedding and of the output head.
    for depth in 0..mtp_depth {
        let layer = format!("model.layers.{}", n_layers + depth);
        let vocab = config.model.vocab_size;
        let d_model = config.model.d_model;
        if let Some(values) = &embedding {
            let shape = vec![vocab, d_model];
            insert(
                format!("{layer}.embed_tokens.weight"),
                HostTensor {
                    values: values.clone(),
                    shape: shape.clone(),
                },
            )?;
            let head = head.clone().unwrap_or_else(|| values.clone());
            insert(
                format!("{layer}.shared_head.head.weight"),
                HostTensor {
                    values: head,
                    shape,
                },
            )?;
        }
    }
    // GPT-2's `Conv1D` layers store their weights `[in, out]`.
    if config.model_type == "gpt2" {
        for (key, tensor) in tensors.iter_mut() {
            if gpt2::is_conv1d_weight(key) {
                *tensor = transposed(std::mem::take(tensor));
            }
        }
    }
    // Gemma-4's layers hold a fixed factor on their output (`layer_scalar`), 1 in a
    // model built here without one.
    if config.model.layer_scalar {
        for layer in 0..n_layers {
            tensors
                .entry(format!("model.layers.{layer}.layer_scalar"))
                .or_insert_with(|| HostTensor {
                    values: vec![1.0],
                    shape: vec![1],
                });
        }
    }
    Ok(tensors)
}

/// The first option of `config` that neither LLaMA's families nor Gemma-4 nor Qwen3.5
/// have (the families a model built here with RoPE exports as), named for a refusal.
fn option_no_exported_family_has(config: &CausalLmConfig) -> Option<&'static str> {
    [
        (config.latent.is_some(), "latent attention (MLA)"),
        (config.alibi.is_some(), "ALiBi instead of RoPE"),
        (config.embed_norm, "a norm of the embeddings"),
        (config.moe.is_some(), "a mixture of experts"),
        (
            config.mtp_depth > 0,
            "multi-token prediction (mtp_depth > 0)",
        ),
        (
            config.nope_layers.is_some(),
            "layers without RoPE (nope_layers)",
        ),
        (
            config.layer_rope_theta.is_some(),
            "a RoPE base per layer (layer_rope_theta)",
        ),
        (
            config.qkv_clip.is_some(),
            "a clamp of q, k and v (qkv_clip)",
        ),
        (config.logit_scale.is_some(), "a logit scale"),
        (config.residual_scale.is_some(), "a residual scale"),
        (config.query_temperature.is_some(), "a query temperature"),
        (config.attention_sinks, "attention sinks"),
        (
            config.attention_chunk.is_some(),
            "chunked attention (attention_chunk)",
        ),
        (
            config.qk_norm_layers.is_some(),
            "QK-norm on some layers only (qk_norm_layers)",
        ),
    ]
    .into_iter()
    .find_map(|(set, option)| set.then_some(option))
}

/// `json` (an object) with the sizes every decoder family's `config.json` names alike.
fn with_sizes(mut json: Value, config: &CausalLmConfig) -> Value {
    if let Some(object) = json.as_object_mut() {
        for (key, size) in [
            ("vocab_size", config.vocab_size),
            ("hidden_size", config.d_model),
            ("intermediate_size", config.d_ff),
            ("num_hidden_layers", config.n_layers),
            ("num_attention_heads", config.n_heads),
            ("num_key_value_heads", config.kv_heads()),
        ] {
            object.insert(key.into(), size.into());
        }
    }
    json
}

/// A matrix `[rows, columns]` as `[columns, rows]`.
fn transposed(tensor: HostTensor) -> HostTensor {
    let &[rows, columns] = tensor.shape.as_slice() else {
        return tensor;
    };
    let mut values = vec![0.0; tensor.values.len()];
    for row in 0..rows {
        for column in 0..columns {
            values[column * rows + row] = tensor.values[row * columns + column];
        }
    }
    HostTensor {
        values,
        shape: vec![columns, rows],
    }
}

/// The first of Gemma-4's options that `config` sets (global layers of their own
/// shape, values from the keys, a norm of the values, a factor per block, per-layer
/// embeddings, keys and values shared between layers), named for a refusal: neither
/// LLaMA's families nor GPT-2 have them.
fn gemma4_option(config: &CausalLmConfig) -> Option<&'static str> {
    [
        (
            config.global_head_dim.is_some(),
            "global layers of their own head width",
        ),
        (
            config.global_kv_heads.is_some(),
            "global layers of their own key/value heads",
        ),
        (
            config.global_values_from_keys,
            "values taken from the keys' projection",
        ),
        (config.value_norm, "a norm of the values"),
        (
            config.layer_scalar,
            "a factor on each block's output (layer_scalar)",
        ),
        (
            config.per_layer_input_width.is_some(),
            "per-layer embeddings",
        ),
        (
            config.kv_shared_layers > 0,
            "layers that reuse earlier layers' keys and values",
        ),
    ]
    .into_iter()
    .find_map(|(set, option)| set.then_some(option))
}

/// The `config.json` of a GPT-2 built here (`train-lm --arch gpt2`): learned
/// positions, Pre-LN blocks of shifted LayerNorms, biases on every projection, an
/// ungated feed-forward, multi-head attention splitting the width, scores scaled by
/// `head_dim^-½` or not at all.
///
/// # Errors
/// [`HfError::Unsupported`] naming the first option GPT-2 does not have.
fn gpt2_config_json(config: &CausalLmConfig) -> Result<Value, HfError> {
    let refuse = |option: &str| {
        Err(HfError::Unsupported {
            what: "config.json".into(),
            reason: format!(
                "the model has learned positions, so it exports as GPT-2, which has no \
                 {option}"
            ),
        })
    };
    let head_dim = config.head_width();
    let default_scale = 1.0 / (head_dim as f64).sqrt();
    let activation = match config.activation {
        Activation::GeluTanh => "gelu_new",
        Activation::Gelu => "gelu",
        Activation::Relu => "relu",
        Activation::Silu => "silu",
        Activation::Relu2 => "relu2",
        // GPT-2's `mlp.act` would hold xIELU's parameters under names of its own.
        Activation::Xielu => return refuse("xIELU activation"),
    };
    let scale_attn_weights = match config.attention_scale {
        None => true,
        Some(scale) if (scale - default_scale).abs() <= 1e-12 => true,
        Some(1.0) => false,
        Some(_) => return refuse("attention scale but head_dim^-½ or 1"),
    };
    if let Some(option) = gemma4_option(config) {
        return refuse(option);
    }
    match () {
        _ if config.reserved_position_rows > 0 => {
            refuse("rows reserved before position 0 in its table of positions")
        }
        _ if config.moe.is_some() => refuse("mixture of experts"),
        _ if config.linear_attention.is_some() => refuse("linear attention"),
        _ if config.attention_output_gate => refuse("gate on the attention's output"),
        _ if config.embed_norm => refuse("norm of the embeddings"),
        _ if config.block_kind != BlockKind::PreNorm => refuse("block kind but Pre-LN"),
        _ if !(config.layer_norm && config.layer_norm_bias && config.norm_scale)
            || config.norm_unit_offset =>
        {
            refuse("norm but LayerNorm with a scale and a shift")
        }
        _ if config.gated_mlp => refuse("gated feed-forward"),
        _ if !(config.qkv_bias && config.o_bias && config.mlp_bias) || config.lm_head_bias => {
            refuse("other biases than on every projection (and none on the logits)")
        }
        _ if config.kv_heads() != config.n_heads || head_dim * config.n_heads != config.d_model => {
            refuse("grouped-query attention, nor heads that do not split the width")
        }
        _ if config.embed_scale.is_some() => refuse("embedding scale"),
        _ if config.attention_softcap.is_some() || config.final_logit_softcap.is_some() => {
            refuse("logit soft-capping")
        }
        _ if config.sliding_window.is_some() => refuse("sliding window"),
        _ if config.attention_chunk.is_some() => refuse("chunked attention"),
        _ if config.qk_norm.is_some() => refuse("QK-norm"),
        _ if config.qkv_clip.is_some() => refuse("clamp of q, k and v"),
        _ if config.logit_scale.is_some() => refuse("logit scale"),
        _ if config.residual_scale.is_some() => refuse("residual scale"),
        _ if config.query_temperature.is_some() => refuse("query temperature"),
        _ if config.attention_sinks => refuse("attention sinks"),
        _ => Ok(json!({
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "vocab_size": config.vocab_size,
            "n_embd": config.d_model,
            "n_layer": config.n_layers,
            "n_head": config.n_heads,
            "n_inner": config.d_ff,
            "n_positions": config.learned_positions,
            "activation_function": activation,
            "layer_norm_epsilon": config.norm_eps,
            "tie_word_embeddings": config.tie_word_embeddings,
            "scale_attn_weights": scale_attn_weights,
            "scale_attn_by_inverse_layer_idx": false,
            "reorder_and_upcast_attn": false,
            "add_cross_attention": false,
            // Our model has no dropout in these places.
            "attn_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "resid_pdrop": 0.0,
            "use_cache": true,
            "dtype": "float32",
        })),
    }
}

/// Our stacked experts of `part` as per-expert tensors: `gate_up_proj` `[E, 2F, D]`
/// is each expert's gate rows then up rows; `down_proj` `[E, D, F]`.
fn per_expert(
    prefix: &str,
    part: &str,
    tensor: HostTensor,
    mixtral: bool,
) -> Vec<(String, HostTensor)> {
    let shape = &tensor.shape;
    let experts = shape[0];
    let per = tensor.values.len() / experts.max(1);
    let names = match (part, mixtral) {
        ("gate_up_proj", false) => vec!["gate_proj", "up_proj"],
        ("gate_up_proj", true) => vec!["w1", "w3"],
        (_, false) => vec!["down_proj"],
        (_, true) => vec!["w2"],
    };
    let rows = shape[1] / names.len();
    let mut out = Vec::new();
    for expert in 0..experts {
        let values = &tensor.values[expert * per..(expert + 1) * per];
        let chunk = values.len() / names.len();
        for (index, name) in names.iter().enumerate() {
            out.push((
                format!("{prefix}.{expert}.{name}.weight"),
                HostTensor {
                    values: values[index * chunk..(index + 1) * chunk].to_vec(),
                    shape: vec![rows, shape[2]],
                },
            ));
        }
    }
    out
}

/// Our expert tensors in a stacked `x · W` checkpoint's layout (gpt-oss's, Llama 4's):
/// `gate_up_proj` `[E, 2F, D]` (gates first) → `[E, D, 2F]` with gate and up
/// interleaved by column or not ([`stacked_expert_column`]); its bias `[E, 2F]`
/// ordered the same way; `down_proj` `[E, D, F]` → `[E, F, D]`.
fn to_x_w_experts(part: &str, tensor: HostTensor, interleaved: bool) -> HostTensor {
    let shape = tensor.shape.clone();
    let v = &tensor.values;
    match (part, shape.as_slice()) {
        ("gate_up_proj", &[e, two_f, d]) => {
            let f = two_f / 2;
            let mut out = vec![0.0; v.len()];
            for expert in 0..e {
                for row in 0..two_f {
                    let unit = stacked_expert_column(row, f, interleaved);
                    for column in 0..d {
                        out[expert * d * two_f + column * two_f + unit] =
                            v[expert * two_f * d + row * d + column];
                    }
                }
            }
            HostTensor {
                values: out,
                shape: vec![e, d, two_f],
            }
        }
        ("gate_up_proj_bias", &[e, two_f]) => {
            let f = two_f / 2;
            let mut out = vec![0.0; v.len()];
            for expert in 0..e {
                for row in 0..two_f {
                    let unit = stacked_expert_column(row, f, interleaved);
                    out[expert * two_f + unit] = v[expert * two_f + row];
                }
            }
            HostTensor { values: out, shape }
        }
        ("down_proj", &[e, d, f]) => {
            let mut out = vec![0.0; v.len()];
            for expert in 0..e {
                for row in 0..d {
                    for column in 0..f {
                        out[expert * f * d + column * d + row] =
                            v[expert * d * f + row * f + column];
                    }
                }
            }
            HostTensor {
                values: out,
                shape: vec![e, f, d],
            }
        }
        _ => tensor,
    }
}

/// The `config.json` of a model built here (not loaded from a checkpoint), as the
/// transformers family that computes the same function: `llama` (Pre-LN, SwiGLU,
/// RoPE; biases on all four attention projections or none), `qwen2` (biases on q, k,
/// v only), `qwen3` (QK-norm per head), with learned positions `gpt2` (Pre-LN
/// blocks of shifted LayerNorms, biases everywhere, an ungated feed-forward, one
/// key/value head per head) or, with any of Gemma-4's options (a norm of the values,
/// global layers of their own heads, per-layer embeddings, layers reusing keys and
/// values), `gemma4_text` (`train-lm --arch gemma4`), or, with linear attention layers or
/// a gate on the attention's output, `qwen3_5_text` (`train-lm --arch qwen3_5`).
///
/// # Errors
/// [`HfError::Unsupported`] naming the first option no such family has (latent
/// attention, experts, other block kinds, soft-capping, sliding windows, sinks,
/// multi-token prediction, a RoPE scaling or layout other than LLaMA's), so that an
/// export never silently computes something else.
pub fn hf_config_json(config: &CausalLmConfig) -> Result<Value, HfError> {
    if config.learned_positions.is_some() {
        return gpt2_config_json(config);
    }
    let refuse = |option: &str| {
        Err(HfError::Unsupported {
            what: "config.json".into(),
            reason: format!(
                "the model uses {option}, which the LLaMA, Qwen2 and Qwen3 families of \
                 transformers do not have: only models of those families can be exported \
                 from a configuration built here"
            ),
        })
    };
    let rope = &config.rope;
    let head_dim = config.head_width();
    if config.linear_attention.is_some() || config.attention_output_gate {
        let option = option_no_exported_family_has(config)
            .or_else(|| gemma4_option(config))
            .map_or_else(|| qwen3_next::config_json(config), Err);
        return option
            .map(|json| with_sizes(json, config))
            .map_err(|option| HfError::Unsupported {
                what: "config.json".into(),
                reason: format!(
                    "the model has linear attention layers or a gate on the attention's \
                     output, so it exports as Qwen3.5 (qwen3_5_text), which does not have \
                     {option}"
                ),
            });
    }
    if let Some(gemma4_option) = gemma4_option(config) {
        let json = match option_no_exported_family_has(config) {
            Some(option) => Err(option),
            None => gemma4::config_json(config),
        };
        return json
            .map(|json| with_sizes(json, config))
            .map_err(|option| HfError::Unsupported {
                what: "config.json".into(),
                reason: format!(
                    "the model has {gemma4_option}, so it exports as Gemma-4 (gemma4_text), \
                     which does not have {option}"
                ),
            });
    }
    if let Some(option) = option_no_exported_family_has(config) {
        return refuse(option);
    }
    match () {
        _ if config.block_kind != BlockKind::PreNorm => refuse("a block kind other than Pre-LN"),
        _ if config.norm_unit_offset => {
            refuse("norms scaling by 1 + weight (Gemma's RMSNorm, Nemotron's LayerNorm1P)")
        }
        _ if config.embed_scale.is_some() => refuse("scaled embeddings"),
        _ if config.attention_softcap.is_some() || config.final_logit_softcap.is_some() => {
            refuse("logit soft-capping")
        }
        _ if config.sliding_window.is_some() => refuse("a sliding window"),
        _ if config.layer_norm => refuse("LayerNorm instead of RMSNorm"),
        _ if !config.norm_scale => refuse("norms without a learned scale"),
        _ if config.lm_head_bias => refuse("a bias on the logits"),
        _ if !config.gated_mlp => refuse("a feed-forward without a gate"),
        _ if config.activation != Activation::Silu => refuse("an activation other than SiLU"),
        _ if config.qkv_bias != config.o_bias && (!config.qkv_bias || config.qk_norm.is_some()) => {
            refuse("a bias on the output projection without q/k/v biases")
        }
        _ if config
            .attention_scale
            .is_some_and(|scale| (scale - 1.0 / (head_dim as f64).sqrt()).abs() > 1e-12) =>
        {
            refuse("an attention scale other than 1/sqrt(head_dim)")
        }
        _ if rope.scaling != RopeScaling::Default => refuse("a RoPE scaling"),
        _ if rope.layout != RopeLayout::HalfSplit || rope.partial_rotary_factor != 1.0 => {
            refuse("an interleaved or partial RoPE")
        }
        _ if config.qk_norm.as_ref().is_some_and(|qk| {
            qk.placement != QkNormPlacement::PerHead
                || qk.unit_offset
                || qk.kind != QkNormKind::Rms
                || qk.weights_per_head
                || !qk.scale
        }) =>
        {
            refuse(
                "QK-norm other than Qwen3's (an RMSNorm per head with a weight shared by the \
                 heads, before RoPE, without a unit offset)",
            )
        }
        _ => {
            let (model_type, architecture) =
                match (&config.qk_norm, config.qkv_bias && !config.o_bias) {
                    (Some(_), _) => ("qwen3", "Qwen3ForCausalLM"),
                    (None, true) => ("qwen2", "Qwen2ForCausalLM"),
                    (None, false) => ("llama", "LlamaForCausalLM"),
                };
            let mut value = with_sizes(
                json!({
                    "architectures": [architecture],
                    "model_type": model_type,
                    "head_dim": head_dim,
                    "hidden_act": "silu",
                    "max_position_embeddings": rope.max_position_embeddings,
                    "rms_norm_eps": config.norm_eps,
                    "tie_word_embeddings": config.tie_word_embeddings,
                    "rope_parameters": {"rope_type": "default", "rope_theta": rope.theta},
                    "attention_dropout": 0.0,
                    "use_cache": true,
                    "dtype": "float32",
                }),
                config,
            );
            let object = value.as_object_mut().expect("an object");
            match model_type {
                "llama" => {
                    object.insert("attention_bias".into(), config.qkv_bias.into());
                    object.insert("mlp_bias".into(), config.mlp_bias.into());
                }
                "qwen3" => {
                    object.insert("attention_bias".into(), config.qkv_bias.into());
                }
                _ => {}
            }
            if config.mlp_bias && model_type != "llama" {
                return refuse("biases in the feed-forward");
            }
            if model_type == "qwen3" && config.qkv_bias != config.o_bias {
                return refuse("a bias on q/k/v but not on the output projection with QK-norm");
            }
            Ok(value)
        }
    }
}
