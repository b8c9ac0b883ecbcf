//! Reading Hugging Face safetensors weights (one file or sharded) into a module.
//!
//! Our modules carry Hugging Face's names, so loading is: list the file's tensors,
//! rename the few keys whose layout differs ([`KeyMap`]), check every key and shape
//! against the module's parameters, then hand the tensors to burn-store, whose
//! PyTorch adapter transposes linear weights (`[out, in]` on disk, `[in, out]` in Burn)
//! and whose float-cast adapter converts bf16/f16/f32 to the chosen float type. Tensor
//! bytes are read from the memory-mapped files only when a parameter takes them.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleVisitor, Param};
use burn::store::burn_pack::Tensor as PackTensor;
use burn::store::{
    FloatCastAdapter, ModuleAdapter, ModuleSnapshot, ModuleStore, PyTorchToBurnAdapter,
    SafetensorsStore,
};
use burn::tensor::{DType, Device, Tensor};
use serde::Deserialize;

use super::config::HfConfig;
use super::error::HfError;
use super::fused_heads::{FusedHeads, FusedLayout};
use super::keys::{KeyError, read_json, read_keys, required};
use super::model_type::text_model_family;
use super::own_names::OwnNames;
use super::{
    apertus, biogpt, bloom, codegen, falcon, gpt_neo, gpt_neox, gpt2, gptj, mpt, opt, persimmon,
    qwen3_next, stablelm,
};
use crate::block::BlockKind;
use crate::model::CausalLm;
use crate::module_path::ParamPath;

/// The single-file checkpoint name.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The index of a sharded checkpoint (`weight_map`: key → shard file).
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// The configuration file.
pub const CONFIG_FILE: &str = "config.json";

/// How to load a checkpoint.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// The float type of the loaded parameters, whatever the file stores
    /// (bf16, f16 or f32). Default: f32.
    pub dtype: DType,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self { dtype: DType::F32 }
    }
}

impl LoadOptions {
    /// Sets the float type of the loaded parameters.
    pub fn with_dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        self
    }
}

/// What loading found that is not an error.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Checkpoint keys of the tensors that hold NaN or infinite values once loaded
    /// (in the chosen float type). The model runs, but its outputs are likely NaN.
    pub non_finite: Vec<String>,
}

impl LoadReport {
    /// A one-line warning naming the tensors that hold NaN or infinite values; `None`
    /// when every tensor is finite.
    pub fn warning(&self) -> Option<String> {
        match self.non_finite.as_slice() {
            [] => None,
            [key] => Some(format!(
                "tensor `{key}` holds NaN or infinite values: the model's outputs will \
                 likely be NaN"
            )),
            keys => Some(format!(
                "{} tensors hold NaN or infinite values ({}): the model's outputs will \
                 likely be NaN",
                keys.len(),
                keys.iter()
                    .map(|key| format!("`{key}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
}

/// What to do with one checkpoint key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyAction {
    /// Load it into the parameter at this path.
    Load(String),
    /// Not a parameter of ours, by design (RoPE's `inv_freq` buffers, a tied
    /// `lm_head.weight`, DeepSeek-V3's multi-token-prediction layers).
    Ignore,
}

/// The rename table from Hugging Face keys to our parameter paths.
pub trait KeyMap {
    /// The action for one checkpoint key.
    fn action(&self, key: &str) -> KeyAction;

    /// The checkpoint key that loads into our parameter `path` (how errors name a
    /// missing tensor). Default: the path itself.
    fn checkpoint_key(&self, path: &str) -> String {
        path.to_string()
    }

    /// A checkpoint tensor that holds several projections fused, their rows stacked:
    /// each block's own checkpoint key and row count, in order (Phi-3's `qkv_proj`
    /// holds q, k and v). The blocks are then renamed as any key. Default: none.
    fn split(&self, key: &str) -> Option<Vec<(String, usize)>> {
        let _ = key;
        None
    }

    /// The inverse of [`KeyMap::split`], for saving: the fused key that the
    /// checkpoint key `key` is a block of, the block's place and the number of blocks.
    /// Default: none.
    fn fused(&self, key: &str) -> Option<(String, usize, usize)> {
        let _ = key;
        None
    }

    /// The heads of the fused q/k/v tensor `key` when it holds its blocks group by
    /// group (GPT-NeoX's and Falcon's `query_key_value`, [`FusedHeads`]) rather than
    /// one block after the other. Default: none.
    fn fused_heads(&self, key: &str) -> Option<FusedHeads> {
        let _ = key;
        None
    }
}

impl<F: Fn(&str) -> KeyAction> KeyMap for F {
    fn action(&self, key: &str) -> KeyAction {
        self(key)
    }
}

/// Loads `config.json` and the weights of a Hugging Face model directory into a
/// [`CausalLm`] on `device`, in f32. Tensors holding NaN or infinite values and the
/// keys of `config.json` that the family does not read ([`HfConfig::unread_keys`]) are
/// logged as warnings (`log::warn!`); [`load_causal_lm_with`] returns them.
///
/// # Errors
/// See [`HfError`]: unreadable files, bad JSON or fields, an unsupported
/// `model_type`, missing or unexpected tensors, shape or dtype mismatches, a
/// checkpoint with more layers than `num_hidden_layers`.
pub fn load_causal_lm(
    dir: impl AsRef<Path>,
    device: &Device,
) -> Result<(CausalLm, HfConfig), HfError> {
    let (model, config, report) = load_causal_lm_with(dir, device, &LoadOptions::default())?;
    for note in &config.unread_keys {
        log::warn!("{CONFIG_FILE}: {note}");
    }
    if let Some(warning) = report.warning() {
        log::warn!("{warning}");
    }
    Ok((model, config))
}

/// [`load_causal_lm`] with options (the float type of the parameters), also returning
/// what loading found besides errors ([`LoadReport`]: tensors holding NaN or
/// infinite values).
///
/// # Errors
/// As [`load_causal_lm`].
pub fn load_causal_lm_with(
    dir: impl AsRef<Path>,
    device: &Device,
    options: &LoadOptions,
) -> Result<(CausalLm, HfConfig, LoadReport), HfError> {
    let dir = dir.as_ref();
    if !device.supports_dtype(options.dtype) {
        return Err(HfError::Unsupported {
            what: format!("{device:?}"),
            reason: format!(
                "this device has no {:?} arithmetic: load the weights in another float \
                 type (f32, or f16 where the device has it)",
                options.dtype
            ),
        });
    }
    let config_path = dir.join(CONFIG_FILE);
    let mut config = HfConfig::from_file(&config_path)?;
    let tensors = checkpoint_tensors(dir)?;
    check_layer_count(&config, &config_path, tensors.keys())?;
    // Multi-token-prediction layers load when the checkpoint has them (many copies of
    // DeepSeek-V3 drop them while their config.json still counts them).
    let first_mtp_layer = config.model.n_layers;
    if config.mtp_layers > 0
        && tensors
            .keys()
            .any(|key| layer_index(key) == Some(first_mtp_layer))
    {
        config.model.mtp_depth = config.mtp_layers;
    }
    let mut model = config
        .model
        .try_init(device)
        .map_err(|source| HfError::Config {
            path: config_path.clone(),
            source,
        })?;
    let key_map = causal_lm_key_map(&config);
    let report = apply_weights(
        &mut model,
        dir,
        tensors,
        &key_map,
        &config.model_type,
        options,
    )?;
    Ok((model, config, report))
}

/// Refuses a checkpoint with more decoder layers than `config.json` declares (beyond
/// the family's own extra layers, [`HfConfig::mtp_layers`]): the rename table would
/// skip them, and the model would run without them.
fn check_layer_count<'a>(
    config: &HfConfig,
    config_path: &Path,
    keys: impl Iterator<Item = &'a String>,
) -> Result<(), HfError> {
    let multimodal = text_model_family(&config.model_type).is_some();
    let found = keys
        .filter_map(|key| {
            if multimodal {
                layer_index(&text_model_key(key)?)
            } else {
                layer_index(key)
            }
        })
        .max()
        .map(|last| last + 1);
    let allowed = config.model.n_layers + config.mtp_layers;
    match found {
        Some(found) if found > allowed => Err(HfError::LayerCount {
            path: config_path.to_path_buf(),
            model_type: config.model_type.clone(),
            configured: config.model.n_layers,
            mtp_layers: config.mtp_layers,
            found,
        }),
        _ => Ok(()),
    }
}

/// The rename table of the decoder-only families.
///
/// HF's `model.embed_tokens` is our `embed_tokens`; Mixtral and MiniMax-M2 name their
/// sparse block `block_sparse_moe` where our layer (like DeepSeek's) says `mlp`, and
/// MiniMax-M2 keeps the router's correction bias in that block; GraniteMoE names its
/// router `block_sparse_moe.router.layer` and its stacked experts `input_linear` and
/// `output_linear` (GraniteMoE-Shared its shared expert `shared_mlp`, gate and up
/// fused); Qwen2-MoE its shared expert `shared_expert` where ours says
/// `shared_experts`; Arcee the projections of its ungated feed-forward `up_proj` and
/// `down_proj`, StarCoder2 `c_fc` and `c_proj` (ours `fc1`, `fc2`); Hunyuan its
/// QK-norms `query_layernorm` and `key_layernorm` (ours `q_norm`, `k_norm`), its router
/// `gate.wg` and its shared expert `shared_mlp`; ERNIE-4.5-MoE its correction bias
/// `moe_statics.e_score_correction_bias`, stored `[1, E]`,
/// and it ignores the `mtp…` modules of its checkpoints as transformers does (as for
/// EXAONE-MoE, which keeps the correction bias as `mlp.e_score_correction_bias`); Phi
/// its output projection `dense` and its final norm `final_layernorm` (ours `o_proj`,
/// `model.norm`); HyperCLOVA X the norms of its post-norm blocks `post_norm1`,
/// `post_attention_layernorm` and `post_norm2` (ours `post_attention_layernorm`,
/// `pre_feedforward_layernorm`, `post_feedforward_layernorm`). A bias on the logits,
/// `lm_head.bias`, is our `lm_head_bias`. DeepSeek-V3's, GLM-4.5's and GLM-4.7-Flash's
/// checkpoints append multi-token-prediction layers after the last decoder layer
/// ([`HfConfig::mtp_layers`]): `model.layers.{n_layers + k}.{enorm, hnorm, eh_proj,
/// shared_head.norm}` are our `mtp.{k}.…`, the layer's decoder keys our
/// `mtp.{k}.block.…`, and its copies of the embedding and output head (`embed_tokens`,
/// `shared_head.head`) are the model's own, so ignored. Without multi-token prediction
/// in the model (`mtp_depth` 0) those layers are ignored. Layers beyond them are loaded
/// as any other key, so that a checkpoint deeper than its `config.json` is an error,
/// not a model silently missing layers.
///
/// Phi-3 stores each layer's q, k and v projections as one `qkv_proj` and its gate and
/// up projections as one `gate_up_proj`, rows stacked in that order
/// ([`KeyMap::split`]); GLM and GLM-4 fuse gate and up the same way, and GLM-4 names the
/// norms of its sandwich blocks `post_self_attn_layernorm` (ours
/// `post_attention_layernorm`), `post_attention_layernorm` (ours
/// `pre_feedforward_layernorm`) and `post_mlp_layernorm` (ours
/// `post_feedforward_layernorm`); VaultGemma names the second norm of its pre-norm
/// blocks `pre_feedforward_layernorm` (ours `post_attention_layernorm`).
///
/// GPT-2's (and GPT-BigCode's), GPT-Neo's, GPT-J's, CodeGen's, GPT-NeoX's, Persimmon's,
/// OPT's, BioGPT's, Falcon's, BLOOM's and MPT's checkpoints name every part their own way
/// (`transformer.h.N.attn.c_attn`, `gpt_neox.layers.N.attention.query_key_value`): each
/// key is translated whole before the rest; GPT-2's `Conv1D` weights are
/// transposed to `[out, in]` and its `c_attn` split as Phi-3's `qkv_proj`, GPT-NeoX's
/// `query_key_value` head by head (BLOOM's and Persimmon's too), Falcon's group by group
/// ([`KeyMap::fused_heads`]), CodeGen's `qkv_proj` in its blocks, MPT's `Wqkv` as
/// Phi-3's `qkv_proj`; BLOOM's norm of the embeddings is our `embed_norm`.
///
/// A multimodal checkpoint ([`HfConfig::model_type`] `gemma3`, `gemma4`, `mistral3`, `llama4`)
/// stores its text model under `language_model.` (`language_model.model.layers.…`,
/// `language_model.lm_head.weight`; `model.language_model.…` as transformers 5 names
/// it in memory) beside its other modalities' towers and projections, which are
/// ignored.
pub fn causal_lm_key_map(config: &HfConfig) -> impl KeyMap + use<> {
    CausalLmKeys {
        tied: config.model.tie_word_embeddings,
        n_layers: config.model.n_layers,
        mtp_layers: config.mtp_layers,
        load_mtp: config.model.mtp_depth > 0,
        renames: family_renames(config),
        multimodal: text_model_family(&config.model_type).is_some(),
        fused: fused_projections(config),
        fused_heads: fused_layout(&config.model_type).map(|layout| FusedHeads {
            heads: config.model.n_heads,
            kv_heads: config.model.kv_heads(),
            head_dim: config.model.head_width(),
            layout,
        }),
        grouped: grouped_projections(config),
        own_names: own_names(config),
        xielu_buffers: config.model_type == "apertus",
        unloaded_mtp_modules: matches!(
            config.model_type.as_str(),
            "ernie4_5_moe"
                | "exaone_moe"
                | "qwen3_5_text"
                | "qwen3_5"
                | "qwen3_next"
                | "qwen3_5_moe_text"
                | "qwen3_5_moe"
        ),
        first_kv_shared_layer: config.model.first_kv_shared_layer(),
    }
}

/// The fused projections of `config`'s family stored group by group
/// ([`FusedLayout::Parts`]), by the fused key's suffix: Qwen3-Next's linear attention,
/// key head by key head.
fn grouped_projections(config: &HfConfig) -> Vec<(&'static str, FusedHeads)> {
    let Some(linear) = config
        .model
        .linear_attention
        .as_ref()
        .filter(|_| config.model_type == "qwen3_next")
    else {
        return Vec::new();
    };
    let groups = linear.n_key_heads;
    let per_group = linear.n_value_heads / groups.max(1);
    let values = per_group * linear.value_head_dim;
    let [(qkvz, _), (ba, _)] = [FUSED_PROJECTIONS[3], FUSED_PROJECTIONS[4]];
    let grouped = |shares| FusedHeads {
        heads: groups,
        kv_heads: groups,
        head_dim: 0,
        layout: FusedLayout::Parts { shares },
    };
    let keys = linear.key_head_dim;
    vec![
        (qkvz, grouped([keys, keys, values, values])),
        (ba, grouped([per_group, per_group, 0, 0])),
    ]
}

/// The order of the rows of the fused q/k/v projection of `model_type`'s checkpoints
/// where it is not q, k and v one after the other.
fn fused_layout(model_type: &str) -> Option<FusedLayout> {
    match model_type {
        "gpt_neox" | "persimmon" | "falcon" | "bloom" | "gpt_bigcode" => {
            Some(FusedLayout::GroupByGroup)
        }
        "codegen" => Some(FusedLayout::Blocks {
            blocks: codegen::FUSED_BLOCKS,
        }),
        _ => None,
    }
}

/// The checkpoint names that `config`'s family gives some of our parameters, and ours
/// (applied one per key, in order; read backwards when saving); empty for most.
fn family_renames(config: &HfConfig) -> &'static [(&'static str, &'static str)] {
    let model_type = config.model_type.as_str();
    match model_type {
        _ if has_mixtral_layout(model_type) => &MIXTRAL_NAMES,
        "hunyuan_v1_dense" | "hunyuan_v1_moe" => &HUNYUAN_NAMES,
        "granitemoe" | "granitemoeshared" => &GRANITEMOE_NAMES,
        // Qwen2-MoE's one shared expert is our `shared_experts`.
        "qwen2_moe" => &[(".mlp.shared_expert.", ".mlp.shared_experts.")],
        // EXAONE-MoE keeps the router's correction bias in the sparse block, beside
        // the router; ERNIE-4.5-MoE in `moe_statics`.
        "exaone_moe" => &[(
            ".mlp.e_score_correction_bias",
            ".mlp.gate.e_score_correction_bias",
        )],
        "ernie4_5_moe" => &[(ERNIE_CORRECTION_BIAS, ".mlp.gate.e_score_correction_bias")],
        // gpt-oss names its router `router`, ours (like every other family) `gate`.
        "gpt_oss" => &[(".mlp.router.", ".mlp.gate.")],
        "llama4_text" | "llama4" => &LLAMA4_NAMES,
        "qwen3_5_text" | "qwen3_5" => &qwen3_next::LINEAR_ATTENTION_NAMES,
        "qwen3_next" | "qwen3_5_moe_text" | "qwen3_5_moe" => &QWEN3_NEXT_NAMES,
        "starcoder2" => &STARCODER2_MLP,
        // GPT-2's, GPT-J's and GPT-NeoX's names are translated whole ([`own_names`]).
        "gpt2" | "gpt_bigcode" | "gpt_neo" | "gptj" | "codegen" | "gpt_neox" | "persimmon"
        | "opt" | "biogpt" | "falcon" | "bloom" | "mpt" => &[],
        "phi" => &PHI_NAMES,
        "stablelm" => &QK_LAYERNORM_NAMES,
        "glm4" => &GLM4_NORMS,
        "hyperclovax" if config.model.block_kind == BlockKind::Sandwich => &HYPERCLOVAX_NORMS,
        // VaultGemma's pre-norm blocks keep Gemma-2's name of the norm before the
        // feed-forward.
        "vaultgemma" => &[(".pre_feedforward_layernorm.", ".post_attention_layernorm.")],
        "apertus" => &apertus::NAMES,
        "gemma4_text" | "gemma4" if config.model.moe.is_some() => &GEMMA4_MOE_NAMES,
        "gemma4_text" | "gemma4" => &GEMMA4_NAMES,
        // nanochat names its ungated feed-forward's projections as ours.
        "nanochat" => &[],
        _ if !config.model.gated_mlp => &ARCEE_MLP,
        _ => &[],
    }
}

/// Llama 4's names of its feed-forward (`feed_forward`, ours `mlp`), its router
/// (`router`, ours `gate`) and its shared expert (`shared_expert`, ours
/// `shared_experts`), the longer first.
const LLAMA4_NAMES: [(&str, &str); 3] = [
    (".feed_forward.router.", ".mlp.gate."),
    (".feed_forward.shared_expert.", ".mlp.shared_experts."),
    (".feed_forward.", ".mlp."),
];

/// Gemma-4's names of its per-layer embeddings (beside the stack, ours beside the
/// token embedding) and of each layer's per-layer branch, and ours.
const GEMMA4_NAMES: [(&str, &str); 6] = [
    (
        "model.embed_tokens_per_layer.",
        "per_layer_embed.embed_tokens.",
    ),
    (
        "model.per_layer_model_projection.",
        "per_layer_embed.projection.",
    ),
    ("model.per_layer_projection_norm.", "per_layer_embed.norm."),
    (".per_layer_input_gate.", ".per_layer_input.gate."),
    (".per_layer_projection.", ".per_layer_input.projection."),
    (".post_per_layer_input_norm.", ".per_layer_input.norm."),
];

/// [`GEMMA4_NAMES`] and Gemma-4's names of the parts of a layer with experts, and
/// ours: its dense feed-forward (`mlp`) is our shared experts; its router, experts and
/// their norms sit beside it in the layer, ours in the mixture of experts (`mlp`). The
/// router's scales come before its projection, whose name is a prefix of theirs among
/// ours.
const GEMMA4_MOE_NAMES: [(&str, &str); 16] = joined(
    GEMMA4_NAMES,
    [
        (".mlp.gate_proj.", ".mlp.shared_experts.gate_proj."),
        (".mlp.up_proj.", ".mlp.shared_experts.up_proj."),
        (".mlp.down_proj.", ".mlp.shared_experts.down_proj."),
        (".router.scale", ".mlp.gate.input_scale"),
        (".router.per_expert_scale", ".mlp.gate.per_expert_scale"),
        (".router.proj.", ".mlp.gate."),
        (".experts.", ".mlp.experts."),
        (
            ".post_feedforward_layernorm_1.",
            ".mlp.post_feedforward_layernorm_1.",
        ),
        (
            ".pre_feedforward_layernorm_2.",
            ".mlp.pre_feedforward_layernorm_2.",
        ),
        (
            ".post_feedforward_layernorm_2.",
            ".mlp.post_feedforward_layernorm_2.",
        ),
    ],
);

/// Qwen3-Next's and Qwen3.5-MoE's names: their linear attention's
/// ([`qwen3_next::LINEAR_ATTENTION_NAMES`]; Qwen3-Next's fused projections are cut into
/// Qwen3.5's first) and Qwen2-MoE's one shared expert (`shared_expert`, ours
/// `shared_experts`).
const QWEN3_NEXT_NAMES: [(&str, &str); 10] = joined(
    qwen3_next::LINEAR_ATTENTION_NAMES,
    [(".mlp.shared_expert.", ".mlp.shared_experts.")],
);

/// Two rename tables as one, `first`'s entries first.
const fn joined<const A: usize, const B: usize, const N: usize>(
    first: [(&'static str, &'static str); A],
    second: [(&'static str, &'static str); B],
) -> [(&'static str, &'static str); N] {
    // An empty entry left over would match every key.
    assert!(N == A + B, "the joined table holds both tables' entries");
    let mut table = [("", ""); N];
    let mut index = 0;
    while index < A {
        table[index] = first[index];
        index += 1;
    }
    while index < N {
        table[index] = second[index - A];
        index += 1;
    }
    table
}

/// GLM-4's names of the sandwich block's norms and ours (Gemma's names): its
/// `post_attention_layernorm` is the norm before the feed-forward.
const GLM4_NORMS: [(&str, &str); 3] = [
    (".post_self_attn_layernorm.", ".post_attention_layernorm."),
    (".post_attention_layernorm.", ".pre_feedforward_layernorm."),
    (".post_mlp_layernorm.", ".post_feedforward_layernorm."),
];

/// GraniteMoE's names of the shared expert (beside the sparse block), the router and
/// the experts, stacked as ours
/// (`input_linear` `[E, 2·d_ff, d_model]`, gate rows then up rows; `output_linear`
/// `[E, d_model, d_ff]`), and ours.
const GRANITEMOE_NAMES: [(&str, &str); 5] = [
    // GraniteMoE-Shared's shared expert (its gate and up rows split from
    // `shared_mlp.input_linear`, [`KeyMap::split`]).
    (
        ".shared_mlp.output_linear.",
        ".mlp.shared_experts.down_proj.",
    ),
    (".shared_mlp.", ".mlp.shared_experts."),
    (
        ".block_sparse_moe.input_linear.weight",
        ".mlp.experts.gate_up_proj",
    ),
    (
        ".block_sparse_moe.output_linear.weight",
        ".mlp.experts.down_proj",
    ),
    (".block_sparse_moe.router.layer.weight", ".mlp.gate.weight"),
];

/// HyperCLOVA X's names of the norms of its blocks with `use_post_norm` (our sandwich
/// block's): `post_norm1` after the attention, `post_attention_layernorm` before the
/// feed-forward and `post_norm2` after it.
const HYPERCLOVAX_NORMS: [(&str, &str); 3] = [
    (".post_norm1.", ".post_attention_layernorm."),
    (".post_attention_layernorm.", ".pre_feedforward_layernorm."),
    (".post_norm2.", ".post_feedforward_layernorm."),
];

/// Hunyuan's names of the QK-norms, the router and the shared expert, and ours.
const HUNYUAN_NAMES: [(&str, &str); 4] = [
    (".self_attn.query_layernorm.", ".self_attn.q_norm."),
    (".self_attn.key_layernorm.", ".self_attn.k_norm."),
    (".mlp.gate.wg.", ".mlp.gate."),
    (".mlp.shared_mlp.", ".mlp.shared_experts."),
];

/// Whether `model_type`'s checkpoints store each sparse layer's experts stacked as ours
/// (`experts.gate_up_proj` `[E, 2·d_ff, d_model]`, gates first, and `experts.down_proj`
/// `[E, d_model, d_ff]`): transformers 5 saves them so for the families it has no
/// per-expert conversion for (Mistral-4, Gemma-4).
pub(crate) fn stores_stacked_experts(model_type: &str) -> bool {
    matches!(model_type, "mistral4" | "gemma4_text" | "gemma4")
}

/// Whether the checkpoints of the family `model_type` lay their sparse layers out as
/// Mixtral's: the block named `block_sparse_moe`, each expert's projections `w1` (gate),
/// `w3` (up) and `w2` (down).
pub(crate) fn has_mixtral_layout(model_type: &str) -> bool {
    matches!(model_type, "mixtral" | "minimax_m2")
}

/// Mixtral's and MiniMax-M2's names of the sparse block and of MiniMax-M2's correction
/// bias (beside the router, in the block), and ours (the bias is the router's).
const MIXTRAL_NAMES: [(&str, &str); 2] = [
    (
        ".block_sparse_moe.e_score_correction_bias",
        ".mlp.gate.e_score_correction_bias",
    ),
    (".block_sparse_moe.", ".mlp."),
];

/// Arcee's names of an ungated feed-forward's projections, and ours.
const ARCEE_MLP: [(&str, &str); 2] = [
    (".mlp.up_proj.", ".mlp.fc1."),
    (".mlp.down_proj.", ".mlp.fc2."),
];

/// Phi's names of the output projection and the final norm, and ours (its feed-forward's
/// `fc1`, `fc2` are ours).
const PHI_NAMES: [(&str, &str); 4] = [
    (".self_attn.dense.", ".self_attn.o_proj."),
    ("model.final_layernorm.", "model.norm."),
    QK_LAYERNORM_NAMES[0],
    QK_LAYERNORM_NAMES[1],
];

/// Phi's and StableLM's names of the QK-norms (with `qk_layernorm`), and ours.
const QK_LAYERNORM_NAMES: [(&str, &str); 2] = [
    (".self_attn.q_layernorm.", ".self_attn.q_norm."),
    (".self_attn.k_layernorm.", ".self_attn.k_norm."),
];

/// StarCoder2's names of an ungated feed-forward's projections, and ours.
const STARCODER2_MLP: [(&str, &str); 2] =
    [(".mlp.c_fc.", ".mlp.fc1."), (".mlp.c_proj.", ".mlp.fc2.")];

/// Our name of the layer that `config`'s family names `name` (Phi's `dense` is our
/// `o_proj`; an ungated feed-forward's `up_proj` and `down_proj` are our `fc1` and
/// `fc2`), or `name` itself: the last part of the family's renames.
pub(crate) fn our_layer_name(config: &HfConfig, name: &str) -> String {
    let leaf = |pattern: &str| {
        pattern
            .trim_matches('.')
            .rsplit('.')
            .next()
            .map(str::to_string)
    };
    family_renames(config)
        .iter()
        .find(|(theirs, _)| leaf(theirs).as_deref() == Some(name))
        .and_then(|(_, ours)| leaf(ours))
        .unwrap_or_else(|| name.to_string())
}

/// `key` with the first of `renames`' names it holds replaced (one name per key, so the
/// renames apply as one simultaneous map).
fn rename_one(
    key: &str,
    renames: impl IntoIterator<Item = (&'static str, &'static str)>,
) -> String {
    renames
        .into_iter()
        .find(|(from, _)| key.contains(from))
        .map_or_else(|| key.to_string(), |(from, to)| key.replacen(from, to, 1))
}

/// The projections a fused layer named `name` holds, by their own names (Phi-3's
/// `qkv_proj`: `q_proj`, `k_proj`, `v_proj`); `None` for a layer of its own.
pub(crate) fn fused_layer_parts(name: &str) -> Option<Vec<&'static str>> {
    let leaf = |key: &'static str| key.trim_end_matches(".weight").rsplit('.').next();
    let (_, blocks) = FUSED_PROJECTIONS
        .iter()
        .find(|(fused, _)| leaf(fused) == Some(name))?;
    blocks.iter().map(|block| leaf(block)).collect()
}

/// The projections that some families' checkpoints store fused: the fused key's suffix
/// and its blocks' suffixes, in row order.
const FUSED_PROJECTIONS: [(&str, &[&str]); 5] = [
    (
        "self_attn.qkv_proj.weight",
        &[
            "self_attn.q_proj.weight",
            "self_attn.k_proj.weight",
            "self_attn.v_proj.weight",
        ],
    ),
    (
        "mlp.gate_up_proj.weight",
        &["mlp.gate_proj.weight", "mlp.up_proj.weight"],
    ),
    (
        "shared_mlp.input_linear.weight",
        &["shared_mlp.gate_proj.weight", "shared_mlp.up_proj.weight"],
    ),
    (
        "linear_attn.in_proj_qkvz.weight",
        &[
            "linear_attn.in_proj_qkv.weight",
            "linear_attn.in_proj_z.weight",
        ],
    ),
    (
        "linear_attn.in_proj_ba.weight",
        &[
            "linear_attn.in_proj_b.weight",
            "linear_attn.in_proj_a.weight",
        ],
    ),
];

/// A fused checkpoint tensor's key suffix, and its blocks' suffixes with their row
/// counts, in row order.
type FusedProjection = (&'static str, Vec<(&'static str, usize)>);

/// The projections `config`'s family stores fused, with the rows of each block:
/// Phi-3's q/k/v and gate/up, the q/k/v of the families named their own way
/// ([`own_qkv_tables`]), GLM's and GLM-4's gate/up, GraniteMoE-Shared's shared gate/up,
/// Qwen3-Next's linear attention's q/k/v/z and b/a.
fn fused_projections(config: &HfConfig) -> Vec<FusedProjection> {
    let model = &config.model;
    let head = model.head_width();
    let (q, kv, d_ff) = (model.n_heads * head, model.kv_heads() * head, model.d_ff);
    let [qkv, gate_up, shared_input, qkvz, ba] = FUSED_PROJECTIONS;
    let with_rows = |(fused, blocks): (&'static str, &'static [&'static str]), rows: &[usize]| {
        (
            fused,
            blocks.iter().copied().zip(rows.iter().copied()).collect(),
        )
    };
    if let Some(tables) = own_qkv_tables(&config.model_type) {
        return tables
            .iter()
            .map(|(fused, blocks)| with_rows((fused, blocks), &[q, kv, kv]))
            .collect();
    }
    match config.model_type.as_str() {
        "phi3" => vec![
            with_rows(qkv, &[q, kv, kv]),
            with_rows(gate_up, &[d_ff, d_ff]),
        ],
        "glm" | "glm4" => vec![with_rows(gate_up, &[d_ff, d_ff])],
        "qwen3_next" => match &model.linear_attention {
            Some(linear) => {
                let (keys, values) = (linear.key_width(), linear.value_width());
                let heads = linear.n_value_heads;
                vec![
                    with_rows(qkvz, &[2 * keys + values, values]),
                    with_rows(ba, &[heads, heads]),
                ]
            }
            None => Vec::new(),
        },
        "granitemoeshared" => {
            let shared = model.moe.as_ref().and_then(|moe| moe.shared_d_ff);
            shared.map_or_else(Vec::new, |width| {
                vec![with_rows(shared_input, &[width, width])]
            })
        }
        _ => Vec::new(),
    }
}

/// The fused q/k/v tensors of a family named its own way, in its names: each fused
/// key's suffix and its q, k and v blocks' suffixes (weight, and bias where it has one).
fn own_qkv_tables(model_type: &str) -> Option<&'static [(&'static str, [&'static str; 3])]> {
    match model_type {
        "gpt2" | "gpt_bigcode" => Some(&gpt2::FUSED_QKV),
        "gpt_neox" => Some(&gpt_neox::FUSED_QKV),
        "persimmon" => Some(&persimmon::FUSED_QKV),
        "codegen" => Some(&codegen::FUSED_QKV),
        "mpt" => Some(&mpt::FUSED_QKV),
        // BLOOM's names are Falcon's.
        "falcon" | "bloom" => Some(&falcon::FUSED_QKV),
        _ => None,
    }
}

/// The key a multimodal checkpoint's `key` would have in its text model's own
/// checkpoint (`language_model.model.layers.0.…` → `model.layers.0.…`); `None` for the
/// keys of the other modalities' towers and projections (Gemma-4's `embed_vision`,
/// `audio_tower`, `embed_audio`; Llama 4's `vision_model`; Qwen3.5's `visual`).
fn text_model_key(key: &str) -> Option<String> {
    const OTHER_MODALITIES: [&str; 7] = [
        "vision_tower.",
        "visual.",
        "vision_model.",
        "multi_modal_projector.",
        "embed_vision.",
        "audio_tower.",
        "embed_audio.",
    ];
    let unprefixed = key.strip_prefix("model.").unwrap_or(key);
    if OTHER_MODALITIES
        .iter()
        .any(|prefix| unprefixed.starts_with(prefix))
    {
        return None;
    }
    if let Some(inner) = key.strip_prefix("model.language_model.") {
        return Some(format!("model.{inner}"));
    }
    Some(
        key.strip_prefix("language_model.")
            .unwrap_or(key)
            .to_string(),
    )
}

/// The rename table of [`causal_lm_key_map`].
struct CausalLmKeys {
    tied: bool,
    n_layers: usize,
    mtp_layers: usize,
    load_mtp: bool,
    /// The family's names of some parameters, and ours ([`family_renames`]).
    renames: &'static [(&'static str, &'static str)],
    multimodal: bool,
    /// The projections the family's checkpoints store fused ([`fused_projections`]);
    /// empty for most.
    fused: Vec<FusedProjection>,
    /// The heads and row order of the fused q/k/v projections stored in an order of
    /// their own: GPT-NeoX's, Falcon's and BLOOM's group by group, CodeGen's in blocks
    /// ([`KeyMap::fused_heads`]).
    fused_heads: Option<FusedHeads>,
    /// The fused projections stored group by group, by suffix ([`grouped_projections`]),
    /// before [`Self::fused_heads`].
    grouped: Vec<(&'static str, FusedHeads)>,
    /// The names of a family whose every key is its own (GPT-2, GPT-NeoX), read as
    /// LLaMA's before the renames.
    own_names: Option<&'static OwnNames>,
    /// The checkpoints hold xIELU's constant buffers (Apertus'
    /// [`apertus::XIELU_BUFFERS`]), which are no parameters of ours.
    xielu_buffers: bool,
    /// The checkpoints hold multi-token-prediction modules that transformers does not
    /// load, named `mtp…` (ERNIE-4.5-MoE's `model.mtp_block.0.…`,
    /// `model.mtp_emb_norm.0.…`; EXAONE-MoE's and Qwen3.5's `mtp.…`).
    unloaded_mtp_modules: bool,
    /// The decoder layers from this one on reuse earlier layers' keys and values
    /// (`n_layers` when none do): key/value projections and norms stored for them are
    /// ignored, as transformers ignores them.
    first_kv_shared_layer: usize,
}

impl KeyMap for CausalLmKeys {
    fn action(&self, key: &str) -> KeyAction {
        if let Some(names) = self.own_names {
            return match names.our_key(key) {
                Some(key) => self.text_action(&key),
                None => KeyAction::Ignore,
            };
        }
        if self.multimodal {
            return match text_model_key(key) {
                Some(text_key) => self.text_action(&text_key),
                None => KeyAction::Ignore,
            };
        }
        self.text_action(key)
    }

    fn checkpoint_key(&self, path: &str) -> String {
        let key = self.text_checkpoint_key(path);
        if let Some(names) = self.own_names {
            names.checkpoint_key(&key)
        } else if self.multimodal {
            format!("language_model.{key}")
        } else {
            key
        }
    }

    fn split(&self, key: &str) -> Option<Vec<(String, usize)>> {
        let (fused, blocks) = self
            .fused
            .iter()
            .find(|(fused, _)| key.ends_with(&format!(".{fused}")))?;
        let prefix = key.strip_suffix(fused)?;
        Some(
            blocks
                .iter()
                .map(|(block, rows)| (format!("{prefix}{block}"), *rows))
                .collect(),
        )
    }

    fn fused_heads(&self, key: &str) -> Option<FusedHeads> {
        if let Some((_, grouped)) = self
            .grouped
            .iter()
            .find(|(fused, _)| key.ends_with(&format!(".{fused}")))
        {
            return Some(*grouped);
        }
        let fused = self
            .fused
            .iter()
            .any(|(fused, _)| key.ends_with(&format!(".{fused}")));
        self.fused_heads.filter(|_| fused)
    }

    fn fused(&self, key: &str) -> Option<(String, usize, usize)> {
        self.fused.iter().find_map(|(fused, blocks)| {
            blocks.iter().enumerate().find_map(|(index, (block, _))| {
                let prefix = key.strip_suffix(block)?.strip_suffix('.')?;
                Some((format!("{prefix}.{fused}"), index, blocks.len()))
            })
        })
    }
}

impl CausalLmKeys {
    /// [`KeyMap::action`] for a key of a text model's own checkpoint.
    fn text_action(&self, key: &str) -> KeyAction {
        if key.ends_with(".rotary_emb.inv_freq") || (self.tied && key == "lm_head.weight") {
            return KeyAction::Ignore;
        }
        if self.xielu_buffers && apertus::is_xielu_buffer(key) {
            return KeyAction::Ignore;
        }
        if self.unloaded_mtp_modules && key.split('.').any(|part| part.starts_with("mtp")) {
            return KeyAction::Ignore;
        }
        // Our logit bias sits beside the head (which a tied model lacks).
        if key == "lm_head.bias" {
            return KeyAction::Load(LM_HEAD_BIAS.into());
        }
        let kv_shared = self.first_kv_shared_layer..self.n_layers;
        if layer_index(key).is_some_and(|layer| kv_shared.contains(&layer))
            && KV_PARTS.iter().any(|part| key.contains(part))
        {
            return KeyAction::Ignore;
        }
        let mtp_layers = self.n_layers..self.n_layers + self.mtp_layers;
        if let Some(layer) = layer_index(key).filter(|layer| mtp_layers.contains(layer)) {
            return match self.load_mtp {
                true => mtp_key_action(key, layer, layer - self.n_layers),
                false => KeyAction::Ignore,
            };
        }
        // Our token embedding sits beside the stack (`embed_tokens`), HF's inside it.
        if let Some(rest) = key.strip_prefix("model.embed_tokens.") {
            return KeyAction::Load(format!("embed_tokens.{rest}"));
        }
        KeyAction::Load(rename_one(key, self.renames.iter().copied()))
    }

    /// [`KeyMap::checkpoint_key`] in a text model's own checkpoint.
    fn text_checkpoint_key(&self, path: &str) -> String {
        if path == LM_HEAD_BIAS {
            return "lm_head.bias".into();
        }
        if let Some(rest) = path.strip_prefix("embed_tokens.") {
            return format!("model.embed_tokens.{rest}");
        }
        if let Some((depth_index, rest)) = path
            .strip_prefix("mtp.")
            .and_then(|rest| rest.split_once('.'))
            && let Ok(depth_index) = depth_index.parse::<usize>()
        {
            let rest = rest.strip_prefix("block.").unwrap_or(rest);
            return format!("model.layers.{}.{rest}", self.n_layers + depth_index);
        }
        let ours_to_theirs = self.renames.iter().map(|&(theirs, ours)| (ours, theirs));
        rename_one(path, ours_to_theirs)
    }
}

/// The parts of a layer's attention that project and norm its keys and values, which a
/// layer reusing another's has none of.
const KV_PARTS: [&str; 4] = [
    ".self_attn.k_proj.",
    ".self_attn.v_proj.",
    ".self_attn.k_norm.",
    ".self_attn.v_norm.",
];

/// Our parameter path of the logits' bias (HF `lm_head.bias`).
const LM_HEAD_BIAS: &str = "lm_head_bias";

/// ERNIE-4.5-MoE's name of a router's correction bias.
const ERNIE_CORRECTION_BIAS: &str = ".mlp.moe_statics.e_score_correction_bias";

/// Whether `model_type`'s checkpoints store the tensor `key` with a leading dimension of
/// one, which ours lacks: ERNIE-4.5-MoE keeps each router's correction bias for one
/// group of experts, [`ERNIE_CORRECTION_BIAS`] `[1, E]` (ours `[E]`).
pub(crate) fn has_unit_leading_dim(model_type: &str, key: &str) -> bool {
    model_type == "ernie4_5_moe" && key.ends_with(ERNIE_CORRECTION_BIAS)
}

/// The tensors of [`has_unit_leading_dim`] without that dimension; a tensor whose first
/// dimension is not one passes unchanged, and its shape is then named as mismatched.
fn drop_unit_leading_dims(
    tensors: BTreeMap<String, FileTensor>,
    model_type: &str,
) -> Result<BTreeMap<String, FileTensor>, HfError> {
    tensors
        .into_iter()
        .map(|(key, entry)| {
            let shape = entry.tensor.shape.as_slice().to_vec();
            if !has_unit_leading_dim(model_type, &key) || shape.first() != Some(&1) {
                return Ok((key, entry));
            }
            let bytes = entry.bytes(&key)?.to_vec();
            let dtype = entry.tensor.dtype;
            let tensor = FileTensor::new(&key, dtype, shape[1..].to_vec(), bytes, entry.file);
            Ok((key, tensor))
        })
        .collect()
}

/// GPT-2's `Conv1D` weights ([`gpt2::is_conv1d_weight`], `[in, out]`) transposed to
/// torch's `nn.Linear` layout `[out, in]`, as every other checkpoint stores them; other
/// tensors and other families pass unchanged.
fn conv1d_as_linear(
    tensors: BTreeMap<String, FileTensor>,
    model_type: &str,
) -> Result<BTreeMap<String, FileTensor>, HfError> {
    if model_type != "gpt2" {
        return Ok(tensors);
    }
    tensors
        .into_iter()
        .map(|(key, entry)| {
            let &[rows, columns] = entry.tensor.shape.as_slice() else {
                return Ok((key, entry));
            };
            if !gpt2::is_conv1d_weight(&key) {
                return Ok((key, entry));
            }
            let bytes = entry.bytes(&key)?;
            let element = bytes.len() / (rows * columns).max(1);
            let mut transposed = vec![0u8; bytes.len()];
            for row in 0..rows {
                for column in 0..columns {
                    let from = (row * columns + column) * element;
                    let to = (column * rows + row) * element;
                    transposed[to..to + element].copy_from_slice(&bytes[from..from + element]);
                }
            }
            let dtype = entry.tensor.dtype;
            let tensor = FileTensor::new(&key, dtype, vec![columns, rows], transposed, entry.file);
            Ok((key, tensor))
        })
        .collect()
}

/// Where a key of multi-token-prediction layer `layer` (our module `depth_index`)
/// goes (see [`causal_lm_key_map`]).
fn mtp_key_action(key: &str, layer: usize, depth_index: usize) -> KeyAction {
    let rest = key
        .strip_prefix(&format!("model.layers.{layer}."))
        .expect("a key of this layer");
    const OWN: [&str; 4] = ["enorm.", "hnorm.", "eh_proj.", "shared_head.norm."];
    const SHARED: [&str; 2] = ["embed_tokens.", "shared_head.head."];
    if SHARED.iter().any(|prefix| rest.starts_with(prefix)) {
        KeyAction::Ignore
    } else if OWN.iter().any(|prefix| rest.starts_with(prefix)) {
        KeyAction::Load(format!("mtp.{depth_index}.{rest}"))
    } else {
        KeyAction::Load(format!("mtp.{depth_index}.block.{rest}"))
    }
}

/// The decoder layer a `model.layers.N.…` key belongs to.
fn layer_index(key: &str) -> Option<usize> {
    key.strip_prefix("model.layers.")?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// The per-expert projections of a checkpoint and the part of our stacked tensors
/// they fill: `(gate or up, into gate_up_proj)` or `down_proj`.
const EXPERT_PARTS: &[(&str, ExpertPart)] = &[
    ("gate_proj", ExpertPart::Gate),
    ("w1", ExpertPart::Gate),
    ("up_proj", ExpertPart::Up),
    ("w3", ExpertPart::Up),
    ("down_proj", ExpertPart::Down),
    ("w2", ExpertPart::Down),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ExpertPart {
    Gate,
    Up,
    Down,
}

/// Splits `prefix.experts.E.part.weight` into `(prefix, E, part)`.
fn expert_key(key: &str) -> Option<(&str, usize, ExpertPart)> {
    let rest = key.strip_suffix(".weight")?;
    let (rest, name) = rest.rsplit_once('.')?;
    let part = EXPERT_PARTS.iter().find(|(n, _)| *n == name)?.1;
    let (rest, index) = rest.rsplit_once('.')?;
    let prefix = rest.strip_suffix(".experts")?;
    Some((prefix, index.parse().ok()?, part))
}

/// Stacks per-expert checkpoint tensors (`….experts.E.gate_proj.weight` /
/// `w1`, `up_proj` / `w3`, `down_proj` / `w2`, as transformers saves them) into the
/// two tensors our [`Experts`](crate::ffn::moe::Experts) hold:
/// `….experts.gate_up_proj` `[E, 2·d_ff, d_model]` (each expert's gate rows, then
/// its up rows) and `….experts.down_proj` `[E, d_model, d_ff]`. Both are already in
/// torch's `[out, in]` per expert, so no transpose follows. A group with a missing
/// expert or part, or uneven shapes or dtypes, is left unstacked: the loader then
/// names its keys as unexpected and the stacked parameter as missing.
fn stack_experts(
    tensors: BTreeMap<String, FileTensor>,
) -> Result<BTreeMap<String, FileTensor>, HfError> {
    type Group = BTreeMap<(usize, u8), String>;
    let mut groups: BTreeMap<String, Group> = BTreeMap::new();
    for key in tensors.keys() {
        if let Some((prefix, expert, part)) = expert_key(key) {
            groups
                .entry(prefix.to_string())
                .or_default()
                .insert((expert, part as u8), key.clone());
        }
    }
    let mut tensors = tensors;
    for (prefix, group) in groups {
        let n_experts = group.keys().map(|(e, _)| e + 1).max().unwrap_or(0);
        let part_key = |expert: usize, part: ExpertPart| group.get(&(expert, part as u8));
        let complete = (0..n_experts).all(|e| {
            [ExpertPart::Gate, ExpertPart::Up, ExpertPart::Down]
                .iter()
                .all(|&part| part_key(e, part).is_some())
        }) && group.len() == 3 * n_experts;
        if !complete {
            continue;
        }
        let first = |part| &tensors[part_key(0, part).expect("complete group")];
        let (gate, down) = (first(ExpertPart::Gate), first(ExpertPart::Down));
        let dtype = gate.tensor.dtype;
        let (gate_shape, down_shape) = (
            gate.tensor.shape.as_slice().to_vec(),
            down.tensor.shape.as_slice().to_vec(),
        );
        let file = gate.file.clone();
        let uniform = group.iter().all(|(&(_, part), key)| {
            let tensor = &tensors[key].tensor;
            let want = if part == ExpertPart::Down as u8 {
                &down_shape
            } else {
                &gate_shape
            };
            tensor.dtype == dtype && tensor.shape.as_slice() == want.as_slice()
        });
        if !uniform || gate_shape.len() != 2 || down_shape.len() != 2 {
            continue;
        }
        let mut gate_up = Vec::new();
        let mut down_bytes = Vec::new();
        for expert in 0..n_experts {
            for part in [ExpertPart::Gate, ExpertPart::Up, ExpertPart::Down] {
                let key = part_key(expert, part).expect("complete group");
                let entry = tensors.remove(key).expect("listed key");
                let bytes = entry.bytes(key)?;
                match part {
                    ExpertPart::Down => down_bytes.extend_from_slice(&bytes),
                    ExpertPart::Gate | ExpertPart::Up => gate_up.extend_from_slice(&bytes),
                }
            }
        }
        let stacked = [
            (
                "gate_up_proj",
                vec![n_experts, 2 * gate_shape[0], gate_shape[1]],
                gate_up,
            ),
            (
                "down_proj",
                vec![n_experts, down_shape[0], down_shape[1]],
                down_bytes,
            ),
        ];
        for (name, shape, bytes) in stacked {
            let key = format!("{prefix}.experts.{name}");
            let tensor = FileTensor::new(&key, dtype, shape, bytes, file.clone());
            tensors.insert(key, tensor);
        }
    }
    Ok(tensors)
}

/// StableLM's QK-norms, one `nn.LayerNorm` per head (`….q_layernorm.norms.{h}.weight`,
/// [`stablelm::head_norm_row`]), stacked into one `[heads, head_dim]` tensor under
/// `….q_layernorm.weight`, the rows of our [`PerHeadNorm`](crate::norm::PerHeadNorm).
/// A group with a missing head or uneven shapes or dtypes is left unstacked: the loader
/// then names its keys as unexpected and the stacked parameter as missing.
fn stack_head_norms(
    tensors: BTreeMap<String, FileTensor>,
) -> Result<BTreeMap<String, FileTensor>, HfError> {
    let mut groups: BTreeMap<String, BTreeMap<usize, String>> = BTreeMap::new();
    for key in tensors.keys() {
        if let Some((stacked, head)) = stablelm::head_norm_row(key) {
            groups.entry(stacked).or_default().insert(head, key.clone());
        }
    }
    let mut tensors = tensors;
    for (stacked, rows) in groups {
        // Heads 0, 1, … without a gap.
        if !rows.keys().copied().eq(0..rows.len()) {
            continue;
        }
        let first = &tensors[&rows[&0]];
        let (dtype, shape) = (first.tensor.dtype, first.tensor.shape.as_slice().to_vec());
        let file = first.file.clone();
        let uniform = rows.values().all(|key| {
            let tensor = &tensors[key].tensor;
            tensor.dtype == dtype && tensor.shape.as_slice() == shape.as_slice()
        });
        if !uniform || shape.len() != 1 {
            continue;
        }
        let mut bytes = Vec::new();
        for key in rows.values() {
            let entry = tensors.remove(key).expect("listed key");
            bytes.extend_from_slice(&entry.bytes(key)?);
        }
        let tensor = FileTensor::new(&stacked, dtype, vec![rows.len(), shape[0]], bytes, file);
        tensors.insert(stacked, tensor);
    }
    Ok(tensors)
}

/// How the family `model_type` stores its experts stacked as `x · W`: `Some(true)`
/// with gate and up interleaved by column (gpt-oss), `Some(false)` with the gate
/// columns first (Llama 4); `None` for the other families.
pub(super) fn x_w_experts(model_type: &str) -> Option<bool> {
    match model_type {
        "gpt_oss" => Some(true),
        "llama4_text" | "llama4" => Some(false),
        _ => None,
    }
}

/// The column of a stacked `x · W` checkpoint's `gate_up_proj` (`2·d_ff` columns per
/// expert) that holds row `row` of ours (gate rows, then up rows).
pub(super) fn stacked_expert_column(row: usize, d_ff: usize, interleaved: bool) -> usize {
    match interleaved {
        true if row < d_ff => 2 * row,
        true => 2 * (row - d_ff) + 1,
        false => row,
    }
}

/// Experts stored stacked as `x · W` (gpt-oss's and Llama 4's) into our layout:
/// `gate_up_proj` `[E, d_model, 2·d_ff]` becomes `[E, 2·d_ff, d_model]`, gates first,
/// from gate and up interleaved by column (gpt-oss; see
/// [`Experts::from_gpt_oss`](crate::ffn::moe::Experts::from_gpt_oss), the same
/// reordering on tensors) or gate columns then up columns (Llama 4); gpt-oss's bias is
/// split the same way; `down_proj` `[E, d_ff, d_model]` becomes `[E, d_model, d_ff]`.
/// Other tensors pass unchanged.
fn reorder_stacked_experts(
    tensors: BTreeMap<String, FileTensor>,
    interleaved: bool,
) -> Result<BTreeMap<String, FileTensor>, HfError> {
    let stored = move |row: usize, f: usize| stacked_expert_column(row, f, interleaved);
    tensors
        .into_iter()
        .map(|(key, entry)| {
            let shape = entry.tensor.shape.as_slice().to_vec();
            let reorder: Option<(Vec<usize>, SourceIndex)> =
                match (key.rsplit_once(".experts."), shape.as_slice()) {
                    (Some((_, "gate_up_proj")), &[e, d, two_f]) => {
                        let f = two_f / 2;
                        let source = move |index: usize| {
                            let (expert, rest) = (index / (two_f * d), index % (two_f * d));
                            let (row, column) = (rest / d, rest % d);
                            expert * d * two_f + column * two_f + stored(row, f)
                        };
                        Some((vec![e, two_f, d], Box::new(source)))
                    }
                    (Some((_, "gate_up_proj_bias")), &[e, two_f]) => {
                        let f = two_f / 2;
                        let source = move |index: usize| {
                            let (expert, row) = (index / two_f, index % two_f);
                            expert * two_f + stored(row, f)
                        };
                        Some((vec![e, two_f], Box::new(source)))
                    }
                    (Some((_, "down_proj")), &[e, f, d]) => {
                        let source = move |index: usize| {
                            let (expert, rest) = (index / (d * f), index % (d * f));
                            let (row, column) = (rest / f, rest % f);
                            expert * f * d + column * d + row
                        };
                        Some((vec![e, d, f], Box::new(source)))
                    }
                    _ => None,
                };
            let Some((new_shape, source)) = reorder else {
                return Ok((key, entry));
            };
            let dtype = entry.tensor.dtype;
            let bytes = entry.bytes(&key)?;
            let size = dtype.size();
            let count = bytes.len() / size;
            let mut reordered = vec![0u8; bytes.len()];
            for index in 0..count {
                let from = source(index) * size;
                reordered[index * size..(index + 1) * size]
                    .copy_from_slice(&bytes[from..from + size]);
            }
            let tensor = FileTensor::new(&key, dtype, new_shape, reordered, entry.file);
            Ok((key, tensor))
        })
        .collect()
}

/// The names of the family `model_type` when its checkpoints name every part their own
/// way.
pub(crate) fn own_names(config: &HfConfig) -> Option<&'static OwnNames> {
    match config.model_type.as_str() {
        // With `new_decoder_architecture`, a norm before each parallel sublayer.
        "falcon" if config.model.block_kind == BlockKind::ParallelSeparateNorms => {
            Some(&falcon::NAMES_TWO_NORMS)
        }
        "falcon" => Some(&falcon::NAMES),
        "bloom" => Some(&bloom::NAMES),
        "mpt" => Some(&mpt::NAMES),
        // GPT-BigCode keeps GPT-2's names (its layers are `nn.Linear`s).
        "gpt2" | "gpt_bigcode" => Some(&gpt2::NAMES),
        "gptj" => Some(&gptj::NAMES),
        "codegen" => Some(&codegen::NAMES),
        "gpt_neo" => Some(&gpt_neo::NAMES),
        "opt" => Some(&opt::NAMES),
        "biogpt" => Some(&biogpt::NAMES),
        "gpt_neox" => Some(&gpt_neox::NAMES),
        "persimmon" => Some(&persimmon::NAMES),
        _ => None,
    }
}

/// The fused tensors of [`KeyMap::split`] cut into their row blocks, each under its
/// own key (taken group by group where [`KeyMap::fused_heads`] says so); a tensor
/// whose rows are not the blocks' sum is an error naming it.
fn split_fused(
    tensors: BTreeMap<String, FileTensor>,
    key_map: &impl KeyMap,
) -> Result<BTreeMap<String, FileTensor>, HfError> {
    let mut out = BTreeMap::new();
    for (key, entry) in tensors {
        let Some(blocks) = key_map.split(&key) else {
            out.insert(key, entry);
            continue;
        };
        let shape = entry.tensor.shape.as_slice().to_vec();
        let rows: usize = blocks.iter().map(|(_, rows)| rows).sum();
        if shape.first() != Some(&rows) {
            return Err(HfError::ShapeMismatch {
                file: entry.file.clone(),
                key,
                expected: [&[rows], shape.get(1..).unwrap_or(&[])].concat(),
                found: shape,
                others: 0,
            });
        }
        let bytes = entry.bytes(&key)?;
        let row_bytes = bytes.len() / rows.max(1);
        // Where row `row` of the blocks, stacked one after the other, is in the tensor.
        let fused_heads = key_map.fused_heads(&key);
        let source_row = |row: usize| fused_heads.map_or(row, |fused| fused.fused_row(row));
        let mut start = 0;
        for (block_key, block_rows) in blocks {
            let block_shape = [&[block_rows], &shape[1..]].concat();
            let block: Vec<u8> = (start..start + block_rows)
                .flat_map(|row| {
                    let from = source_row(row) * row_bytes;
                    bytes[from..from + row_bytes].iter().copied()
                })
                .collect();
            let end = start + block_rows;
            let tensor = FileTensor::new(
                &block_key,
                entry.tensor.dtype,
                block_shape,
                block,
                entry.file.clone(),
            );
            out.insert(block_key, tensor);
            start = end;
        }
    }
    Ok(out)
}

/// Where each element of a reordered tensor comes from, as a flat index.
type SourceIndex = Box<dyn Fn(usize) -> usize>;

/// One tensor of the checkpoint, with the file it is in.
struct FileTensor {
    file: PathBuf,
    tensor: PackTensor,
}

impl FileTensor {
    /// The tensor's bytes, read from its file now; an error names the file and `key`.
    fn bytes(&self, key: &str) -> Result<impl std::ops::Deref<Target = [u8]> + use<>, HfError> {
        self.tensor
            .to_bytes()
            .map_err(|error| HfError::Safetensors {
                path: self.file.clone(),
                message: format!("{key}: {error}"),
            })
    }

    /// A tensor made while loading (stacked or reordered) from the checkpoint's `file`.
    fn new(
        key: &str,
        dtype: burn::tensor::DType,
        shape: Vec<usize>,
        bytes: Vec<u8>,
        file: PathBuf,
    ) -> Self {
        let bytes = burn::store::burn_pack::Bytes::from_bytes_vec(bytes);
        Self {
            file,
            tensor: PackTensor::new(key.to_string(), dtype, shape, None, bytes),
        }
    }
}

/// The keys of `model.safetensors.index.json` that loading reads.
#[derive(Deserialize)]
struct IndexKeys {
    /// Checkpoint key → the shard file holding it.
    weight_map: Option<BTreeMap<String, String>>,
}

/// Lists the tensors of `dir`'s `model.safetensors`, or of every shard named by
/// `model.safetensors.index.json`, keyed by checkpoint key. Nothing is read but headers.
fn checkpoint_tensors(dir: &Path) -> Result<BTreeMap<String, FileTensor>, HfError> {
    let index = dir.join(INDEX_FILE);
    let single = dir.join(WEIGHTS_FILE);
    if index.is_file() {
        let value = read_json(&index)?;
        let in_index = |error: KeyError| error.in_file(&index);
        let IndexKeys { weight_map } = read_keys(&value, None).map_err(in_index)?;
        let weight_map = required(weight_map, "weight_map", "an object of key to shard file")
            .map_err(in_index)?;
        let mut shards: Vec<String> = Vec::new();
        for (key, file) in &weight_map {
            if file.contains('/') || file.contains('\\') || file == ".." {
                return Err(in_index(KeyError::new(
                    format!("weight_map.{key}"),
                    format!("\"{file}\" is not a file name in the model directory"),
                )));
            }
            if !shards.iter().any(|shard| shard == file) {
                shards.push(file.to_string());
            }
        }
        let mut tensors = BTreeMap::new();
        for shard in &shards {
            tensors.extend(file_tensors(&dir.join(shard))?);
        }
        for (key, file) in &weight_map {
            if !tensors.contains_key(key) {
                return Err(in_index(KeyError::new(
                    format!("weight_map.{key}"),
                    format!("{file} has no tensor `{key}`"),
                )));
            }
        }
        Ok(tensors)
    } else if single.is_file() {
        file_tensors(&single)
    } else {
        Err(HfError::NoWeights {
            dir: dir.to_path_buf(),
        })
    }
}

/// The tensors of one safetensors file (headers only).
fn file_tensors(path: &Path) -> Result<BTreeMap<String, FileTensor>, HfError> {
    if !path.is_file() {
        return Err(HfError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
        });
    }
    let mut store = SafetensorsStore::from_file(path);
    let tensors = store
        .get_all_tensors()
        .map_err(|error| HfError::Safetensors {
            path: path.to_path_buf(),
            message: error.to_string(),
        })?;
    Ok(tensors
        .iter()
        .map(|(key, tensor)| {
            (
                key.clone(),
                FileTensor {
                    file: path.to_path_buf(),
                    tensor: tensor.clone(),
                },
            )
        })
        .collect())
}

/// A parameter the module expects: its shape in the checkpoint's layout.
#[derive(Debug, Clone)]
struct Expected {
    shape: Vec<usize>,
}

/// Walks a module and lists its float parameters by path, with the shape a Hugging
/// Face checkpoint stores them in, without materializing lazily initialized ones.
#[derive(Default)]
struct ExpectedParams {
    path: ParamPath,
    params: BTreeMap<String, Expected>,
}

impl ModuleVisitor for ExpectedParams {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.path.enter(name, container_type);
    }

    fn exit_module(&mut self, _name: &str, container_type: &str) {
        self.path.exit(container_type);
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let mut shape = param.lazy_shape().as_slice().to_vec();
        if self.path.is_linear_weight() && D == 2 {
            shape.reverse();
        }
        self.params.insert(self.path.joined(), Expected { shape });
    }
}

/// Loads the safetensors weights of `dir` into `module`, renaming keys with
/// `key_map`, after checking that every parameter has a tensor of the right shape and
/// every tensor a parameter. The report names the tensors that hold NaN or infinite
/// values.
///
/// # Errors
/// [`HfError::NoWeights`], [`HfError::Io`], [`HfError::Safetensors`],
/// [`HfError::MissingTensor`], [`HfError::UnexpectedTensor`],
/// [`HfError::ShapeMismatch`], [`HfError::UnsupportedDtype`], [`HfError::Apply`].
/// `model_type` names the model in messages and picks its family's tensor layouts
/// (gpt-oss's experts, ERNIE-4.5-MoE's correction biases).
pub fn load_weights<M: Module>(
    module: &mut M,
    dir: impl AsRef<Path>,
    key_map: &impl KeyMap,
    model_type: &str,
    options: &LoadOptions,
) -> Result<LoadReport, HfError> {
    let dir = dir.as_ref();
    apply_weights(
        module,
        dir,
        checkpoint_tensors(dir)?,
        key_map,
        model_type,
        options,
    )
}

/// [`load_weights`] of the listed tensors of `dir`.
fn apply_weights<M: Module>(
    module: &mut M,
    dir: &Path,
    tensors: BTreeMap<String, FileTensor>,
    key_map: &impl KeyMap,
    model_type: &str,
    options: &LoadOptions,
) -> Result<LoadReport, HfError> {
    let mut expected = ExpectedParams::default();
    module.visit(&mut expected);
    let expected = expected.params;

    let mut renamed: BTreeMap<String, (String, FileTensor)> = BTreeMap::new();
    let mut unexpected: Vec<(String, FileTensor)> = Vec::new();
    let tensors = conv1d_as_linear(tensors, model_type)?;
    let tensors = split_fused(stack_experts(tensors)?, key_map)?;
    let tensors = if model_type == "stablelm" {
        stack_head_norms(tensors)?
    } else {
        tensors
    };
    let tensors = if let Some(interleaved) = x_w_experts(model_type) {
        reorder_stacked_experts(tensors, interleaved)?
    } else {
        drop_unit_leading_dims(tensors, model_type)?
    };
    for (key, entry) in tensors {
        match key_map.action(&key) {
            KeyAction::Ignore => log::debug!("{key}: ignored"),
            KeyAction::Load(path) if expected.contains_key(&path) => {
                renamed.insert(path, (key, entry));
            }
            KeyAction::Load(_) => unexpected.push((key, entry)),
        }
    }

    if let Some((key, entry)) = unexpected.first() {
        return Err(HfError::UnexpectedTensor {
            file: entry.file.clone(),
            key: key.clone(),
            found: entry.tensor.shape.as_slice().to_vec(),
            model_type: model_type.to_string(),
            others: unexpected.len() - 1,
        });
    }
    let missing: Vec<(&String, &Expected)> = expected
        .iter()
        .filter(|(path, _)| !renamed.contains_key(*path))
        .collect();
    if let Some((path, want)) = missing.first() {
        return Err(HfError::MissingTensor {
            dir: dir.to_path_buf(),
            key: key_map.checkpoint_key(path),
            expected: want.shape.clone(),
            others: missing.len() - 1,
        });
    }
    let mismatched: Vec<_> = renamed
        .iter()
        .filter(|(path, (_, entry))| {
            entry.tensor.shape.as_slice() != expected[*path].shape.as_slice()
        })
        .collect();
    if let Some((path, (key, entry))) = mismatched.first() {
        return Err(HfError::ShapeMismatch {
            file: entry.file.clone(),
            key: key.clone(),
            expected: expected[*path].shape.clone(),
            found: entry.tensor.shape.as_slice().to_vec(),
            others: mismatched.len() - 1,
        });
    }
    for (key, entry) in renamed.values() {
        if !entry.tensor.dtype.is_float() {
            return Err(HfError::UnsupportedDtype {
                file: entry.file.clone(),
                key: key.clone(),
                dtype: format!("{:?}", entry.tensor.dtype),
            });
        }
    }

    // Messages name the checkpoint's keys, not our parameter paths.
    let keys: BTreeMap<String, String> = renamed
        .iter()
        .map(|(path, (key, _))| (path.clone(), key.clone()))
        .collect();
    let tensors: Vec<PackTensor> = renamed
        .into_iter()
        .map(|(path, (_, entry))| {
            let mut tensor = entry.tensor;
            tensor.name = path;
            tensor
        })
        .collect();
    let adapter: Box<dyn ModuleAdapter> =
        Box::new(PyTorchToBurnAdapter.chain(FloatCastAdapter::to(options.dtype)));
    let result = module.apply(tensors, None, Some(adapter), true);
    if let Some(error) = result.errors.first() {
        let (key, message) = match error {
            burn::store::ApplyError::ShapeMismatch { path, .. }
            | burn::store::ApplyError::DTypeMismatch { path, .. }
            | burn::store::ApplyError::AdapterError { path, .. }
            | burn::store::ApplyError::LoadError { path, .. } => (path.clone(), error.to_string()),
        };
        return Err(HfError::Apply {
            dir: dir.to_path_buf(),
            key,
            message,
        });
    }
    let applied: HashSet<&String> = result.applied.iter().collect();
    if let Some((path, _)) = result.missing.iter().find(|(p, _)| !applied.contains(p)) {
        return Err(HfError::Apply {
            dir: dir.to_path_buf(),
            key: path.clone(),
            message: "the parameter was not loaded".into(),
        });
    }
    let non_finite = non_finite_parameters(module)
        .into_iter()
        .map(|path| keys.get(&path).cloned().unwrap_or(path))
        .collect();
    Ok(LoadReport { non_finite })
}

/// The paths of `module`'s float parameters that hold NaN or infinite values, in the
/// order the module visits them. One flag per parameter is computed on the device and
/// all flags are read back at once, so the check costs one pass over the weights and
/// one transfer.
pub fn non_finite_parameters<M: Module>(module: &M) -> Vec<String> {
    let mut check = FiniteCheck::default();
    module.visit(&mut check);
    if check.flags.is_empty() {
        return Vec::new();
    }
    let flags = Tensor::cat(check.flags, 0).into_data();
    check
        .paths
        .into_iter()
        .zip(flags.iter::<i64>())
        .filter(|(_, finite)| *finite == 0)
        .map(|(path, _)| path)
        .collect()
}

/// Collects, per float parameter, its path and whether all its values are finite.
#[derive(Default)]
struct FiniteCheck {
    path: ParamPath,
    paths: Vec<String>,
    /// `[1]` each: 1 when every value is finite.
    flags: Vec<Tensor<1, burn::tensor::Int>>,
}

impl ModuleVisitor for FiniteCheck {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.path.enter(name, container_type);
    }

    fn exit_module(&mut self, _name: &str, container_type: &str) {
        self.path.exit(container_type);
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        self.paths.push(self.path.joined());
        self.flags.push(param.val().is_finite().all().int());
    }
}
