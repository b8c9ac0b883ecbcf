//! The model families whose `config.json` this crate reads (`model_type`).

/// The `model_type`s [`HfConfig`](super::HfConfig) reads: the families, then the
/// multimodal wrappers whose text model it reads (Gemma-3's `gemma3`).
pub const SUPPORTED_MODEL_TYPES: &[&str] = &[
    "llama",
    "internlm3",
    "mistral",
    "ministral",
    "ministral3",
    "qwen2",
    "qwen3",
    "olmo",
    "olmo2",
    "olmo3",
    "smollm3",
    "phi3",
    "glm4",
    "seed_oss",
    "ernie4_5",
    "exaone4",
    "cohere",
    "cohere2",
    "granite",
    "hyperclovax",
    "granite_swa",
    "arcee",
    "apertus",
    "nanochat",
    "helium",
    "starcoder2",
    "hunyuan_v1_dense",
    "cwm",
    "gpt2",
    "gpt_bigcode",
    "gpt_neo",
    "gptj",
    "codegen",
    "gpt_neox",
    "opt",
    "biogpt",
    "falcon",
    "bloom",
    "mpt",
    "phi",
    "stablelm",
    "persimmon",
    "nemotron",
    "glm",
    "jais2",
    "youtu",
    "minicpm3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "vaultgemma",
    "gemma4_text",
    "mixtral",
    "olmoe",
    "flex_olmo",
    "qwen2_moe",
    "qwen3_moe",
    "qwen3_next",
    "glm4_moe",
    "glm4_moe_lite",
    "dots1",
    "ernie4_5_moe",
    "solar_open",
    "exaone_moe",
    "minimax_m2",
    "granitemoe",
    "granitemoeshared",
    "hunyuan_v1_moe",
    "gpt_oss",
    "deepseek_v2",
    "deepseek_v3",
    "mistral4",
    "llama4_text",
    "qwen3_5_text",
    "qwen3_5_moe_text",
    "gemma3",
    "gemma4",
    "mistral3",
    "llama4",
    "qwen3_5",
    "qwen3_5_moe",
];

/// The family of the text model of a multimodal `model_type` (when its `text_config`
/// names none), whose `config.json` describes it under `text_config` and whose
/// checkpoint stores it under `language_model.` beside a vision tower: Gemma-3's
/// `Gemma3ForConditionalGeneration` (the 4B, 12B and 27B checkpoints), Gemma-4's
/// `Gemma4ForConditionalGeneration`, Mistral-3's `Mistral3ForConditionalGeneration`
/// (Mistral-Small-3.1 and 3.2), Llama 4's `Llama4ForConditionalGeneration` (Scout,
/// Maverick) and Qwen3.5's `Qwen3_5ForConditionalGeneration` and
/// `Qwen3_5MoeForConditionalGeneration` (every Qwen3.5 checkpoint).
pub(crate) fn text_model_family(model_type: &str) -> Option<ModelType> {
    match model_type {
        "gemma3" => Some(ModelType::Gemma3Text),
        "gemma4" => Some(ModelType::Gemma4Text),
        "mistral3" => Some(ModelType::Mistral),
        "llama4" => Some(ModelType::Llama4Text),
        "qwen3_5" => Some(ModelType::Qwen35Text),
        "qwen3_5_moe" => Some(ModelType::Qwen35Moe),
        _ => None,
    }
}

/// A family whose `config.json` [`HfConfig`](super::HfConfig) reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ModelType {
    /// LLaMA 2/3: GQA, RoPE, SwiGLU, RMSNorm; optional attention biases.
    Llama,
    /// InternLM3: LLaMA, its biases switched by `qkv_bias` (all four attention
    /// projections) and `bias` (the feed-forward's), which must agree.
    InternLm3,
    /// Mistral: LLaMA with a sliding window on every layer.
    Mistral,
    /// Ministral (8B, 2410): Mistral's layers with the windowed ones named by
    /// `layer_types` (every layer when a window is set and none are named).
    Ministral,
    /// Ministral-3: Mistral (no window by default) with the queries scaled by position
    /// past the original context (`llama_4_scaling_beta`), YaRN by default.
    Ministral3,
    /// Qwen2: q/k/v biases; a sliding window only where `use_sliding_window` asks.
    Qwen2,
    /// Qwen3: Qwen2's windows, no biases by default, and QK-norm per head.
    Qwen3,
    /// OLMo (the first generation): LLaMA with LayerNorms without parameters, and q, k
    /// and v clamped to `clip_qkv`.
    Olmo,
    /// OLMo-2: norms on the sublayers' outputs (no input norms) and QK-norm across
    /// heads.
    Olmo2,
    /// OLMo-3: OLMo-2 with sliding-window layers (three in four by default), which
    /// rotate without the full layers' RoPE scaling.
    Olmo3,
    /// SmolLM3: LLaMA with every fourth layer attending without RoPE (NoPE), tied
    /// embeddings, and windows only with `use_sliding_window`.
    Smollm3,
    /// Phi-3 and Phi-4: Mistral's layers with q/k/v and gate/up projections stored
    /// fused, partial rotary embeddings and LongRoPE.
    Phi3,
    /// GLM-4 (0414): norms before and after each sublayer (plain RMSNorm), q/k/v
    /// biases, a fused gate/up projection, and the rotary embedding interleaved over
    /// half of each head.
    Glm4,
    /// Seed-OSS: LLaMA with separate switches for the q/k/v and the output biases.
    SeedOss,
    /// ERNIE-4.5 (dense): LLaMA with biases on every projection when `use_bias`, the
    /// rotary embedding interleaved, tied embeddings.
    Ernie45,
    /// EXAONE-4: OLMo-2's output norms with QK-norm per head; with a window, three
    /// sliding layers per full one, the full ones without RoPE.
    Exaone4,
    /// Cohere (Command R): parallel attention and feed-forward after one LayerNorm
    /// without a shift, the rotary embedding on neighbouring pairs, scaled logits,
    /// tied embeddings.
    Cohere,
    /// Cohere-2 (Command R7B, Command A): Cohere with three sliding layers per full
    /// one, only the sliding ones rotated.
    Cohere2,
    /// Granite (3.x): LLaMA with multipliers on the embeddings, the attention scores
    /// and the sublayers' outputs, and logits divided by `logits_scaling`.
    Granite,
    /// HyperCLOVA X (SEED): Granite's multipliers (the logits multiplied by
    /// `logits_scaling`), with a norm after each sublayer's output (`use_post_norm`).
    HyperClovaX,
    /// Granite-SWA: Granite's multipliers with attention sinks, a window on the layers
    /// `layer_types` names (by default all but every fourth, from the first) and a RoPE
    /// base per layer (`layer_rope_theta`, 0: no RoPE).
    GraniteSwa,
    /// Arcee (AFM): LLaMA with an ungated feed-forward of squared ReLU,
    /// `down(relu(up(x))²)`.
    Arcee,
    /// Apertus (Swiss AI): LLaMA with QK-norm per head and an ungated feed-forward of
    /// xIELU, whose two factors are learned in every layer.
    Apertus,
    /// nanochat (Karpathy's): LLaMA's pre-norm blocks with norms without parameters
    /// (one more on the embeddings), QK-norm after RoPE, which turns the other way, an
    /// ungated squared-ReLU feed-forward and soft-capped logits.
    NanoChat,
    /// Helium (Kyutai): LLaMA with the rotary embedding on neighbouring pairs and no
    /// bias on the output projection.
    Helium,
    /// StarCoder2: LayerNorms with a shift, biases on every projection, an ungated
    /// feed-forward (GELU-tanh), a window on every layer when one is set.
    Starcoder2,
    /// Hunyuan (dense v1): LLaMA with QK-norm per head after RoPE, and RoPE's base
    /// stretched by a fixed NTK `alpha`.
    HunyuanV1Dense,
    /// CWM (Code World Model): LLaMA with a window on the layers `layer_types` names
    /// (by default all but every fourth, from the first), LLaMA-3 RoPE by default.
    Cwm,
    /// GPT-2 (and nanoGPT's checkpoints): learned absolute positions instead of RoPE,
    /// LayerNorms with a shift, biases everywhere, an ungated GELU (tanh) feed-forward,
    /// tied embeddings; stored as `Conv1D` layers (`[in, out]`) with q, k and v fused
    /// in `c_attn`.
    Gpt2,
    /// GPT-BigCode (StarCoder 1, SantaCoder): GPT-2's layers and names with multi-query
    /// attention (`multi_query`; q, then one k and one v head, fused in `c_attn`; one
    /// key/value head per head, fused head by head, without it), stored as `nn.Linear`.
    GptBigcode,
    /// GPT-Neo (125M, 1.3B, 2.7B): GPT-2's design with learned positions, attention
    /// layers alternating between global and local (a window of `window_size`, by
    /// `attention_types`), unscaled scores, q, k and v without biases, stored as
    /// `nn.Linear`.
    GptNeo,
    /// GPT-NeoX (Pythia, GPT-NeoX-20B): attention and an ungated GELU feed-forward in
    /// parallel, each after its own shifted LayerNorm (`use_parallel_residual`, else
    /// Pre-LN blocks), biases everywhere, the rotary embedding over a quarter of each
    /// head by default; q, k and v fused per head in `query_key_value`.
    GptNeox,
    /// GPT-J (and its fine-tunes): attention without biases and an ungated GELU (tanh)
    /// feed-forward with biases, in parallel after one shifted LayerNorm; the rotary
    /// embedding on neighbouring pairs over the first `rotary_dim` of each head; an
    /// untied head with a bias; GPT-2's names of the sizes.
    Gptj,
    /// CodeGen (CodeGen-Mono/Multi/NL, 350M to 16B): GPT-J's design (parallel blocks
    /// after one shifted LayerNorm, neighbouring pairs rotated over `rotary_dim`, an
    /// untied head with a bias) with q, k and v fused in `qkv_proj` in four blocks.
    Codegen,
    /// OPT (125M to 66B): learned positions (their table keeps two rows before position
    /// 0), LayerNorms with a shift before each sublayer (after it with
    /// `do_layer_norm_before: false`), biases everywhere (`enable_bias`), an ungated
    /// ReLU feed-forward `ffn_dim` wide, tied embeddings.
    Opt,
    /// BioGPT: OPT's learned positions (two rows before position 0) and Pre-LN blocks,
    /// embeddings scaled by `√hidden_size` (`scale_embedding`), biases everywhere, an
    /// ungated GELU feed-forward, tied embeddings (`output_projection`).
    Biogpt,
    /// Falcon (7B, 40B, 180B): attention and an ungated GELU feed-forward in parallel
    /// after one LayerNorm (`parallel_attn`; sequential Pre-LN blocks without it), or
    /// after one each with `new_decoder_architecture`; multi-query attention, or
    /// grouped (`num_kv_heads`) in the new architecture, q, k and v fused group by
    /// group; optional biases (`bias`); tied embeddings.
    Falcon,
    /// BLOOM (560M to 176B, BLOOMZ): ALiBi instead of a position encoding, a LayerNorm
    /// on the embeddings, Pre-LN blocks of shifted LayerNorms, biases everywhere, an
    /// ungated GELU (tanh) feed-forward 4× the width, tied embeddings; q, k and v fused
    /// head by head in `query_key_value`.
    Bloom,
    /// MPT (MPT-7B, MPT-30B): ALiBi instead of a position encoding, Pre-LN blocks of
    /// LayerNorms without a shift, no biases, an ungated exact-GELU feed-forward 4× the
    /// width, tied embeddings; q, k and v fused one after the other in `Wqkv`,
    /// optionally clamped (`attn_config.clip_qkv`); the attention's keys nested in
    /// `attn_config`.
    Mpt,
    /// Phi (Phi-1, Phi-1.5, Phi-2): attention and an ungated GELU feed-forward in
    /// parallel after one LayerNorm, biases everywhere (the output head's too), the
    /// rotary embedding over part of each head.
    Phi,
    /// StableLM (StableLM-2, StableLM-3B-4E1T): LLaMA with LayerNorms, the rotary
    /// embedding over a quarter of each head, optional q/k/v biases and parallel
    /// blocks.
    StableLm,
    /// Persimmon (Persimmon-8B, Fuyu's language model): Pre-LN blocks of shifted
    /// LayerNorms, q, k and v fused head by head with biases, a shifted LayerNorm of
    /// each head's queries and keys (`qk_layernorm`), the rotary embedding over half of
    /// each head, an ungated squared-ReLU feed-forward with biases.
    Persimmon,
    /// Nemotron (Nemotron-3, Minitron): LLaMA's attention with `LayerNorm1P` (a shifted
    /// LayerNorm scaling by `1 + weight`), an ungated squared-ReLU feed-forward and the
    /// rotary embedding over half of each head.
    Nemotron,
    /// GLM (GLM-4-9B's first transformers port): LLaMA's pre-norm blocks with GLM-4's
    /// q/k/v biases, fused gate/up projection and interleaved rotary over half of each
    /// head.
    Glm,
    /// Jais-2: LLaMA with LayerNorms (with a shift), an ungated squared-ReLU
    /// feed-forward and biases on every projection.
    Jais2,
    /// Youtu-LLM: DeepSeek-V3's latent attention in LLaMA's blocks, a dense feed-forward
    /// on every layer.
    Youtu,
    /// MiniCPM3: DeepSeek-V2's latent attention (rotating the halves of each head) in
    /// LLaMA's blocks, with the embeddings, each sublayer's output and the logits
    /// scaled (`scale_emb`, `scale_depth`, `dim_model_base`).
    MiniCpm3,
    /// Gemma (the first generation, CodeGemma): LLaMA's blocks with Gemma's RMSNorm,
    /// scaled and tied embeddings, and GeGLU (tanh); multi-query attention in the 2B.
    Gemma,
    /// Gemma-2: sandwich norms with Gemma's RMSNorm, scaled embeddings, GeGLU (tanh),
    /// `query_pre_attn_scalar`, attention and final logit soft-capping, alternating
    /// sliding and full layers.
    Gemma2,
    /// Gemma-3 (text): Gemma-2 with QK-norm and a RoPE per layer type.
    Gemma3Text,
    /// VaultGemma: Gemma-2 in pre-norm blocks (no norms after the sublayers).
    VaultGemma,
    /// Gemma-4 (text): Gemma-3's sandwich blocks with plain RMSNorms (no unit offset),
    /// unscaled attention, a norm of the values, global layers with heads of their own
    /// shape and (with `attention_k_eq_v`) values from the keys' projection, a
    /// proportional RoPE on them, and a fixed factor on each block's output.
    Gemma4Text,
    /// Mixtral: Mistral with every feed-forward a mixture of experts.
    Mixtral,
    /// OLMoE: OLMo-2's QK-norm across heads in LLaMA's pre-norm blocks; every layer a
    /// mixture of experts, softmax top-k, not renormalized by default.
    Olmoe,
    /// FlexOlmo: OLMo-2's blocks with OLMoE's experts on every layer.
    FlexOlmo,
    /// Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's attention (`qkv_bias`), softmax
    /// top-k routing, and a shared expert of its own width behind a per-token sigmoid
    /// gate; sparse layers by `decoder_sparse_step` and `mlp_only_layers`.
    Qwen2Moe,
    /// Qwen3-MoE: Qwen3's attention, softmax top-k routing without shared experts,
    /// sparse layers by `decoder_sparse_step` and `mlp_only_layers`.
    Qwen3Moe,
    /// Qwen3-Next: Qwen3.5's hybrid layers (its DeltaNet's projections stored fused,
    /// key head by key head) with Qwen2-MoE's experts and gated shared expert.
    Qwen3Next,
    /// GLM-4.5 and GLM-4.6: GQA with q/k/v biases, the rotary embedding over half of
    /// each head, optional QK-norm per head; dense first layers, then DeepSeek-V3's
    /// experts (sigmoid, bias-corrected, grouped routing, a shared expert) and its
    /// multi-token-prediction layers.
    Glm4Moe,
    /// GLM-4.7-Flash: DeepSeek-V3's latent attention and experts, with the dense and
    /// sparse layers listed by `mlp_layer_types`.
    Glm4MoeLite,
    /// dots.llm1: Qwen3's attention (QK-norm per head) and DeepSeek-V3's experts.
    Dots1,
    /// ERNIE-4.5-MoE: ERNIE-4.5's attention; from `moe_layer_start_index` to
    /// `moe_layer_end_index`, every `moe_layer_interval`-th layer a mixture of experts
    /// chosen by softmax scores plus a correction bias, renormalized, beside shared
    /// experts.
    Ernie45Moe,
    /// Solar-Open: LLaMA's attention with q/k/v biases; every layer GLM-4.5's
    /// (DeepSeek-V3's) experts.
    SolarOpen,
    /// EXAONE-MoE (K-EXAONE): EXAONE-4's attention in pre-norm blocks; dense first
    /// layers (`mlp_layer_types`), then DeepSeek-V3's experts.
    ExaoneMoe,
    /// MiniMax-M2: QK-norm across heads, the rotary embedding over `rotary_dim` of each
    /// head; every layer a mixture of experts routed by bias-corrected sigmoid scores,
    /// renormalized, without groups or shared experts.
    MinimaxM2,
    /// GraniteMoE (3.x MoE): Granite's multipliers, every layer a mixture of experts
    /// (softmax over the chosen experts' logits), stored as 3-D `input_linear` /
    /// `output_linear` tensors.
    GraniteMoe,
    /// GraniteMoE-Shared: GraniteMoE with a shared expert of `shared_intermediate_size`
    /// beside the experts (`shared_mlp`, its gate and up fused).
    GraniteMoeShared,
    /// Hunyuan-MoE (A13B): Hunyuan's attention; every layer a mixture of experts
    /// (softmax top-k, renormalized) beside a shared expert, all `intermediate_size`
    /// wide.
    HunyuanV1Moe,
    /// gpt-oss: attention sinks and biases, alternating sliding and full layers, YaRN;
    /// every layer a mixture of experts with router and expert biases and the clamped
    /// SwiGLU.
    GptOss,
    /// DeepSeek-V2: latent attention, dense first layers, then experts.
    DeepseekV2,
    /// DeepSeek-V3: V2 with sigmoid, bias-corrected routing.
    DeepseekV3,
    /// Mistral-4 (Mistral-Small-4): DeepSeek-V3's latent attention with Llama 4's query
    /// temperature, softmax routing through groups without a correction bias, shared
    /// experts; its experts stored stacked.
    Mistral4,
    /// Llama 4's text model: every fourth layer without RoPE and with its queries scaled
    /// by position, the others attending within chunks with a parameterless QK-norm;
    /// interleaved dense and sparse layers, one expert per token (sigmoid score on its
    /// input) beside a shared one; the rotary embedding on neighbouring pairs.
    Llama4Text,
    /// Qwen3.5's text model: Qwen3-Next's hybrid of Gated DeltaNet layers (three in
    /// four) and gated attention layers with QK-norm and partial RoPE, every RMSNorm
    /// scaling by `1 + weight`; a dense feed-forward.
    Qwen35Text,
    /// Qwen3.5-MoE's text model: Qwen3.5's hybrid layers with Qwen3-Next's experts and
    /// gated shared expert on every layer, the top-k weights always renormalized.
    Qwen35Moe,
}

impl ModelType {
    const ALL: [Self; 75] = [
        Self::Llama,
        Self::InternLm3,
        Self::Mistral,
        Self::Ministral,
        Self::Ministral3,
        Self::Qwen2,
        Self::Qwen3,
        Self::Olmo,
        Self::Olmo2,
        Self::Olmo3,
        Self::Smollm3,
        Self::Phi3,
        Self::Glm4,
        Self::SeedOss,
        Self::Ernie45,
        Self::Exaone4,
        Self::Cohere,
        Self::Cohere2,
        Self::Granite,
        Self::HyperClovaX,
        Self::GraniteSwa,
        Self::Arcee,
        Self::Apertus,
        Self::NanoChat,
        Self::Helium,
        Self::Starcoder2,
        Self::HunyuanV1Dense,
        Self::Cwm,
        Self::Gpt2,
        Self::GptBigcode,
        Self::GptNeo,
        Self::Gptj,
        Self::Codegen,
        Self::GptNeox,
        Self::Opt,
        Self::Biogpt,
        Self::Falcon,
        Self::Bloom,
        Self::Mpt,
        Self::Phi,
        Self::StableLm,
        Self::Persimmon,
        Self::Nemotron,
        Self::Glm,
        Self::Jais2,
        Self::Youtu,
        Self::MiniCpm3,
        Self::Gemma,
        Self::Gemma2,
        Self::Gemma3Text,
        Self::VaultGemma,
        Self::Gemma4Text,
        Self::Mixtral,
        Self::Olmoe,
        Self::FlexOlmo,
        Self::Qwen2Moe,
        Self::Qwen3Moe,
        Self::Qwen3Next,
        Self::Glm4Moe,
        Self::Glm4MoeLite,
        Self::Dots1,
        Self::Ernie45Moe,
        Self::SolarOpen,
        Self::ExaoneMoe,
        Self::MinimaxM2,
        Self::GraniteMoe,
        Self::GraniteMoeShared,
        Self::HunyuanV1Moe,
        Self::GptOss,
        Self::DeepseekV2,
        Self::DeepseekV3,
        Self::Mistral4,
        Self::Llama4Text,
        Self::Qwen35Text,
        Self::Qwen35Moe,
    ];

    /// The `model_type` value.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::InternLm3 => "internlm3",
            Self::Mistral => "mistral",
            Self::Ministral => "ministral",
            Self::Ministral3 => "ministral3",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Olmo => "olmo",
            Self::Olmo2 => "olmo2",
            Self::Olmo3 => "olmo3",
            Self::Smollm3 => "smollm3",
            Self::Phi3 => "phi3",
            Self::Glm4 => "glm4",
            Self::SeedOss => "seed_oss",
            Self::Ernie45 => "ernie4_5",
            Self::Exaone4 => "exaone4",
            Self::Cohere => "cohere",
            Self::Cohere2 => "cohere2",
            Self::Granite => "granite",
            Self::HyperClovaX => "hyperclovax",
            Self::GraniteSwa => "granite_swa",
            Self::Arcee => "arcee",
            Self::Apertus => "apertus",
            Self::NanoChat => "nanochat",
            Self::Helium => "helium",
            Self::Starcoder2 => "starcoder2",
            Self::HunyuanV1Dense => "hunyuan_v1_dense",
            Self::Cwm => "cwm",
            Self::Gpt2 => "gpt2",
            Self::GptBigcode => "gpt_bigcode",
            Self::GptNeo => "gpt_neo",
            Self::Gptj => "gptj",
            Self::Codegen => "codegen",
            Self::GptNeox => "gpt_neox",
            Self::Opt => "opt",
            Self::Biogpt => "biogpt",
            Self::Falcon => "falcon",
            Self::Bloom => "bloom",
            Self::Mpt => "mpt",
            Self::Phi => "phi",
            Self::StableLm => "stablelm",
            Self::Persimmon => "persimmon",
            Self::Nemotron => "nemotron",
            Self::Glm => "glm",
            Self::Jais2 => "jais2",
            Self::Youtu => "youtu",
            Self::MiniCpm3 => "minicpm3",
            Self::Gemma => "gemma",
            Self::Gemma2 => "gemma2",
            Self::Gemma3Text => "gemma3_text",
            Self::VaultGemma => "vaultgemma",
            Self::Gemma4Text => "gemma4_text",
            Self::Mixtral => "mixtral",
            Self::Olmoe => "olmoe",
            Self::FlexOlmo => "flex_olmo",
            Self::Qwen2Moe => "qwen2_moe",
            Self::Qwen3Moe => "qwen3_moe",
            Self::Qwen3Next => "qwen3_next",
            Self::Glm4Moe => "glm4_moe",
            Self::Glm4MoeLite => "glm4_moe_lite",
            Self::Dots1 => "dots1",
            Self::Ernie45Moe => "ernie4_5_moe",
            Self::SolarOpen => "solar_open",
            Self::ExaoneMoe => "exaone_moe",
            Self::MinimaxM2 => "minimax_m2",
            Self::GraniteMoe => "granitemoe",
            Self::GraniteMoeShared => "granitemoeshared",
            Self::HunyuanV1Moe => "hunyuan_v1_moe",
            Self::GptOss => "gpt_oss",
            Self::DeepseekV2 => "deepseek_v2",
            Self::DeepseekV3 => "deepseek_v3",
            Self::Mistral4 => "mistral4",
            Self::Llama4Text => "llama4_text",
            Self::Qwen35Text => "qwen3_5_text",
            Self::Qwen35Moe => "qwen3_5_moe_text",
        }
    }

    /// The family named `name`, if supported.
    pub(crate) fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|family| family.name() == name)
    }

    /// Whether every layer's feed-forward, or all after the first dense ones, is a
    /// mixture of experts.
    pub(crate) fn is_sparse(self) -> bool {
        matches!(
            self,
            Self::Mixtral
                | Self::Olmoe
                | Self::FlexOlmo
                | Self::Qwen2Moe
                | Self::Qwen3Moe
                | Self::Qwen3Next
                | Self::Qwen35Moe
                | Self::Glm4Moe
                | Self::Glm4MoeLite
                | Self::Dots1
                | Self::Ernie45Moe
                | Self::SolarOpen
                | Self::ExaoneMoe
                | Self::MinimaxM2
                | Self::GraniteMoe
                | Self::GraniteMoeShared
                | Self::HunyuanV1Moe
                | Self::GptOss
                | Self::DeepseekV2
                | Self::DeepseekV3
                | Self::Mistral4
        )
    }

    /// Whether the family is Gemma's (Gemma's RMSNorm, scaled and tied embeddings).
    pub(crate) fn is_gemma(self) -> bool {
        matches!(
            self,
            Self::Gemma | Self::Gemma2 | Self::Gemma3Text | Self::VaultGemma
        )
    }

    /// Whether the family's RMSNorms scale by `1 + weight` (weights stored around 0):
    /// Gemma's (but Gemma-4's), Nemotron's LayerNorms, Qwen3.5's (but the DeltaNet's own
    /// output norm).
    pub(crate) fn norms_offset_by_one(self) -> bool {
        self.is_gemma() || self == Self::Nemotron || self.is_hybrid_linear()
    }

    /// Whether the family's layers are a hybrid of linear attention (Gated DeltaNet) and
    /// gated attention layers (Qwen3-Next, Qwen3.5, Qwen3.5-MoE).
    pub(crate) fn is_hybrid_linear(self) -> bool {
        matches!(self, Self::Qwen3Next | Self::Qwen35Text | Self::Qwen35Moe)
    }

    /// Whether the family's experts sit beside one shared expert behind a per-token
    /// sigmoid gate (Qwen2-MoE's, which Qwen3-Next and Qwen3.5-MoE keep).
    pub(crate) fn has_gated_shared_expert(self) -> bool {
        matches!(self, Self::Qwen2Moe | Self::Qwen3Next | Self::Qwen35Moe)
    }

    /// Whether the family is Gemma-2's or a later Gemma's (`hidden_activation`, final
    /// logit soft-capping; `query_pre_attn_scalar` but in Gemma-4, whose attention is
    /// unscaled; sandwich norms but in VaultGemma).
    pub(crate) fn is_gemma2_or_later(self) -> bool {
        matches!(
            self,
            Self::Gemma2 | Self::Gemma3Text | Self::VaultGemma | Self::Gemma4Text
        )
    }

    /// Whether the family is ERNIE-4.5's (`use_bias` on every projection, the rotary
    /// embedding on neighbouring pairs).
    pub(crate) fn is_ernie(self) -> bool {
        matches!(self, Self::Ernie45 | Self::Ernie45Moe)
    }

    /// Whether the family is Hunyuan's (QK-norm after RoPE, NTK-alpha RoPE).
    pub(crate) fn is_hunyuan(self) -> bool {
        matches!(self, Self::HunyuanV1Dense | Self::HunyuanV1Moe)
    }

    /// Whether the family is Granite's (multipliers on the embeddings, the attention
    /// scores, the sublayers' outputs, and a factor or divisor of the logits).
    pub(crate) fn is_granite(self) -> bool {
        matches!(
            self,
            Self::Granite
                | Self::GraniteMoe
                | Self::GraniteMoeShared
                | Self::HyperClovaX
                | Self::GraniteSwa
        )
    }

    /// Whether the family's norms are LayerNorms, not RMSNorms (Cohere's and MPT's
    /// without a shift, OLMo's without parameters, the others' shifted).
    pub(crate) fn uses_layer_norm(self) -> bool {
        self.is_cohere() || matches!(self, Self::Olmo | Self::Mpt) || self.has_shifted_layer_norm()
    }

    /// Whether the family is GPT-2 or one of its era that kept its design (GPT-BigCode,
    /// GPT-Neo, GPT-J, CodeGen, GPT-NeoX, OPT, BioGPT, Falcon, BLOOM): shifted
    /// LayerNorms, an ungated feed-forward, heads that split the width, checkpoints
    /// named their own way.
    pub(crate) fn is_classic_gpt(self) -> bool {
        matches!(
            self,
            Self::Gpt2
                | Self::GptBigcode
                | Self::GptNeo
                | Self::Gptj
                | Self::Codegen
                | Self::GptNeox
                | Self::Opt
                | Self::Biogpt
                | Self::Falcon
                | Self::Bloom
        )
    }

    /// Whether the family's LayerNorms have a learned shift (PyTorch's `nn.LayerNorm`).
    pub(crate) fn has_shifted_layer_norm(self) -> bool {
        self.is_classic_gpt()
            || matches!(
                self,
                Self::Starcoder2
                    | Self::Jais2
                    | Self::Phi
                    | Self::StableLm
                    | Self::Persimmon
                    | Self::Nemotron
            )
    }

    /// Whether the family's dense feed-forward is ungated, `down(act(up(x)))`.
    pub(crate) fn has_ungated_mlp(self) -> bool {
        self.is_classic_gpt()
            || matches!(
                self,
                Self::Arcee
                    | Self::Apertus
                    | Self::NanoChat
                    | Self::Starcoder2
                    | Self::Jais2
                    | Self::Phi
                    | Self::Persimmon
                    | Self::Nemotron
                    | Self::Mpt
            )
    }

    /// Whether the family is Cohere's (LayerNorm, parallel blocks, scaled logits).
    pub(crate) fn is_cohere(self) -> bool {
        matches!(self, Self::Cohere | Self::Cohere2)
    }

    /// Whether the family routes as DeepSeek-V3 (sigmoid scores, the correction bias,
    /// groups, shared experts).
    pub(crate) fn routes_as_deepseek_v3(self) -> bool {
        matches!(
            self,
            Self::DeepseekV3
                | Self::Glm4Moe
                | Self::Glm4MoeLite
                | Self::Dots1
                | Self::SolarOpen
                | Self::ExaoneMoe
        )
    }

    /// Whether the family's checkpoints append multi-token-prediction layers after the
    /// decoder layers (`num_nextn_predict_layers`).
    pub(crate) fn has_mtp_layers(self) -> bool {
        matches!(self, Self::DeepseekV3 | Self::Glm4Moe | Self::Glm4MoeLite)
    }

    /// Whether attention is DeepSeek's multi-head latent attention.
    pub(crate) fn is_latent(self) -> bool {
        matches!(
            self,
            Self::DeepseekV2
                | Self::DeepseekV3
                | Self::Glm4MoeLite
                | Self::Youtu
                | Self::MiniCpm3
                | Self::Mistral4
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supported_model_types_are_the_families_read() {
        let mut names: Vec<&str> = ModelType::ALL.iter().map(|family| family.name()).collect();
        names.extend([
            "gemma3",
            "gemma4",
            "mistral3",
            "llama4",
            "qwen3_5",
            "qwen3_5_moe",
        ]);
        assert_eq!(names, SUPPORTED_MODEL_TYPES);
        assert_eq!(text_model_family("gemma3"), Some(ModelType::Gemma3Text));
        for family in ModelType::ALL {
            assert_eq!(ModelType::from_name(family.name()), Some(family));
        }
        assert_eq!(ModelType::from_name("bert"), None);
    }
}
