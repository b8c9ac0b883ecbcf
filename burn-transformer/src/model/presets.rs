//! Named configurations: tiny debug models, the Transformer paper's base and big
//! encoder-decoders, and the published sizes of the model families we load, copied from their `config.json` files on the Hugging Face Hub, so
//! that a model, or one of its layers, can be built (for training, or to check a
//! checkpoint against) without a file.

use super::causal_lm::CausalLmConfig;
use super::encoder_decoder::TransformerConfig;
use crate::attention::{GatedDeltaNetConfig, LatentAttentionConfig, QkNormConfig, QkNormPlacement};
use crate::block::BlockKind;
use crate::ffn::Activation;
use crate::ffn::moe::{ExpertGlu, RouterConfig, RouterScoring};
use crate::ffn::{MoeConfig, MoeLayerPlan};
use crate::position::{RopeConfig, RopeLayout, RopeScaling};

impl CausalLmConfig {
    /// A tiny LLaMA-style model for tests and debugging: 2 layers, width 64, 4 query
    /// heads sharing 2 key/value heads, vocabulary 256.
    pub fn tiny() -> Self {
        Self::new(
            256,
            64,
            2,
            4,
            128,
            RopeConfig::new(16).with_max_position_embeddings(512),
        )
        .with_n_kv_heads(Some(2))
        .with_head_dim(Some(16))
        .with_norm_eps(1e-5)
    }

    /// A 50M-parameter LLaMA-style model to train from scratch on a CPU or one GPU
    /// (`train-lm --preset 50m`): 10 layers, width 640, 10 query heads of 64 sharing 5
    /// key/value heads, SwiGLU 1728, tied embeddings; 45.5M parameters besides the
    /// embedding, 50.7M in all with a vocabulary of 8192 (a `bpe:8192` tokenizer).
    pub fn llama_50m(vocab_size: usize) -> Self {
        Self::new(
            vocab_size,
            640,
            10,
            10,
            1728,
            RopeConfig::new(64).with_max_position_embeddings(2048),
        )
        .with_n_kv_heads(Some(5))
        .with_norm_eps(1e-5)
        .with_tie_word_embeddings(true)
    }

    /// This configuration with GPT-2's design, its sizes kept: `positions` learned
    /// positions instead of RoPE, Pre-LN blocks of LayerNorms with a shift, biases on
    /// every projection, an ungated GELU (tanh) feed-forward, tied embeddings.
    pub fn with_gpt2_design(self, positions: usize) -> Self {
        self.with_learned_positions(Some(positions))
            .with_block_kind(BlockKind::PreNorm)
            .with_layer_norm(true)
            .with_layer_norm_bias(true)
            .with_gated_mlp(false)
            .with_activation(Activation::GeluTanh)
            .with_qkv_bias(true)
            .with_o_bias(true)
            .with_mlp_bias(true)
            .with_tie_word_embeddings(true)
    }

    /// This configuration with Gemma-4's design, its sizes kept (`train-lm --arch
    /// gemma4`; exports as `gemma4_text`): sandwich blocks of plain RMSNorms, GeGLU
    /// (tanh-GELU), embeddings × √d_model, QK-norm per head and a norm of the values,
    /// unscaled attention, output logits soft-capped at 30; five layers in six slide
    /// over `window` positions (RoPE at its base), the others and the last are global,
    /// with heads twice as wide, half the key/value heads (when even) whose values are
    /// the keys' projection, rotated on a quarter of their pairs by a proportional RoPE
    /// at base 10⁶.
    pub fn with_gemma4_design(self, window: usize) -> Self {
        let layers = self.n_layers;
        let (d_model, head_dim, kv_heads, eps) = (
            self.d_model,
            self.head_width(),
            self.kv_heads(),
            self.norm_eps,
        );
        let global_kv_heads = if kv_heads.is_multiple_of(2) {
            kv_heads / 2
        } else {
            kv_heads
        };
        let sliding_rope = self.rope.clone();
        let global_rope = RopeConfig::new(2 * head_dim)
            .with_theta(1_000_000.0)
            .with_max_position_embeddings(sliding_rope.max_position_embeddings)
            .with_scaling(RopeScaling::Proportional {
                factor: 1.0,
                rotated_fraction: 0.25,
            });
        Self {
            rope: global_rope,
            ..self
        }
        .with_sliding_rope(Some(sliding_rope))
        .with_block_kind(BlockKind::Sandwich)
        .with_activation(Activation::GeluTanh)
        .with_embed_scale(Some((d_model as f64).sqrt()))
        .with_qk_norm(Some(QkNormConfig::new().with_eps(eps)))
        .with_value_norm(true)
        .with_attention_scale(Some(1.0))
        .with_final_logit_softcap(Some(30.0))
        .with_sliding_window(Some(window))
        .with_sliding_layers(Some(
            (0..layers)
                .map(|layer| (layer + 1) % 6 != 0 && layer + 1 != layers)
                .collect(),
        ))
        .with_global_head_dim(Some(2 * head_dim))
        .with_global_kv_heads(Some(global_kv_heads))
        .with_global_values_from_keys(true)
    }

    /// This configuration with Qwen3.5's design, its sizes kept (`train-lm --arch
    /// qwen3_5`; exports as `qwen3_5_text`): every fourth layer and the last are grouped
    /// attention with a sigmoid gate on the output, QK-norm per head and RoPE on a
    /// quarter of each head; the others a Gated DeltaNet of half as many query/key heads
    /// as attention heads, each serving two value heads, every head of the attention's
    /// width, with a convolution of 4 taps; RMSNorms scaling by 1 + weight.
    pub fn with_qwen3_5_design(self) -> Self {
        let (layers, head_dim, eps) = (self.n_layers, self.head_width(), self.norm_eps);
        let key_heads = (self.n_heads / 2).max(1);
        let linear =
            GatedDeltaNetConfig::new(self.d_model, key_heads, 2 * key_heads, head_dim, head_dim)
                .with_norm_eps(eps);
        let rope = self.rope.clone().with_partial_rotary_factor(0.25);
        Self { rope, ..self }
            .with_linear_attention(Some(linear))
            .with_linear_attention_layers(Some(
                (0..layers)
                    .map(|layer| (layer + 1) % 4 != 0 && layer + 1 != layers)
                    .collect(),
            ))
            .with_attention_output_gate(true)
            .with_norm_unit_offset(true)
            .with_qk_norm(Some(
                QkNormConfig::new().with_eps(eps).with_unit_offset(true),
            ))
    }

    /// `openai-community/gpt2` (GPT-2 small): 12 layers, width 768, 12 heads, 1024
    /// learned positions, a GELU (tanh) feed-forward of 3072, vocabulary 50257, tied
    /// embeddings; 124M parameters.
    pub fn gpt2() -> Self {
        Self::new(50257, 768, 12, 12, 3072, RopeConfig::new(64))
            .with_norm_eps(1e-5)
            .with_gpt2_design(1024)
    }

    /// `openai-community/gpt2-medium`: GPT-2 with 24 layers, width 1024, 16 heads, a
    /// feed-forward of 4096; 355M parameters.
    pub fn gpt2_medium() -> Self {
        Self::new(50257, 1024, 24, 16, 4096, RopeConfig::new(64))
            .with_norm_eps(1e-5)
            .with_gpt2_design(1024)
    }

    /// `meta-llama/Llama-3.2-1B`: 16 layers, width 2048, GQA 32/8, Llama 3 RoPE
    /// scaling, tied embeddings.
    pub fn llama_3_2_1b() -> Self {
        let rope = RopeConfig::new(64)
            .with_theta(500_000.0)
            .with_max_position_embeddings(131_072)
            .with_scaling(RopeScaling::Llama3 {
                factor: 32.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: Some(8192),
            });
        Self::new(128_256, 2048, 16, 32, 8192, rope)
            .with_n_kv_heads(Some(8))
            .with_head_dim(Some(64))
            .with_norm_eps(1e-5)
            .with_tie_word_embeddings(true)
    }

    /// `meta-llama/Llama-3.1-8B`: 32 layers, width 4096, GQA 32/8, Llama 3 RoPE scaling.
    pub fn llama_3_1_8b() -> Self {
        let rope = RopeConfig::new(128)
            .with_theta(500_000.0)
            .with_max_position_embeddings(131_072)
            .with_scaling(RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: Some(8192),
            });
        Self::new(128_256, 4096, 32, 32, 14_336, rope)
            .with_n_kv_heads(Some(8))
            .with_norm_eps(1e-5)
    }

    /// `mistralai/Mistral-7B-v0.1`: 32 layers, width 4096, GQA 32/8, sliding window 4096.
    pub fn mistral_7b() -> Self {
        let rope = RopeConfig::new(128).with_max_position_embeddings(32_768);
        Self::new(32_000, 4096, 32, 32, 14_336, rope)
            .with_n_kv_heads(Some(8))
            .with_norm_eps(1e-5)
            .with_sliding_window(Some(4096))
    }

    /// `Qwen/Qwen2-0.5B`: 24 layers, width 896, GQA 14/2, q/k/v biases, tied embeddings.
    pub fn qwen2_0_5b() -> Self {
        let rope = RopeConfig::new(64)
            .with_theta(1_000_000.0)
            .with_max_position_embeddings(131_072);
        Self::new(151_936, 896, 24, 14, 4864, rope)
            .with_n_kv_heads(Some(2))
            .with_norm_eps(1e-6)
            .with_qkv_bias(true)
            .with_tie_word_embeddings(true)
    }

    /// `Qwen/Qwen3-0.6B`: 28 layers, width 1024, GQA 16/8 of width 128, QK-norm,
    /// tied embeddings.
    pub fn qwen3_0_6b() -> Self {
        Self::qwen3(1024, 28, 16, 3072).with_tie_word_embeddings(true)
    }

    /// `Qwen/Qwen3-8B`: 36 layers, width 4096, GQA 32/8 of width 128, QK-norm.
    pub fn qwen3_8b() -> Self {
        Self::qwen3(4096, 36, 32, 12_288)
    }

    /// `Qwen/Qwen3-30B-A3B`: 48 layers, width 2048, GQA 32/4 of width 128, QK-norm,
    /// every layer a mixture of 128 experts of width 768, top-8 renormalized.
    pub fn qwen3_30b_a3b() -> Self {
        Self::qwen3(2048, 48, 32, 6144)
            .with_n_kv_heads(Some(4))
            .with_moe(Some(MoeConfig::mixtral(2048, 768, 128, 8)))
    }

    /// The Qwen3 dense family: heads of width 128 whatever the width, 8 key/value
    /// heads, QK-norm per head, RoPE θ 1e6 over 40960 positions.
    fn qwen3(d_model: usize, n_layers: usize, n_heads: usize, d_ff: usize) -> Self {
        let rope = RopeConfig::new(128)
            .with_theta(1_000_000.0)
            .with_max_position_embeddings(40_960);
        Self::new(151_936, d_model, n_layers, n_heads, d_ff, rope)
            .with_n_kv_heads(Some(8))
            .with_head_dim(Some(128))
            .with_norm_eps(1e-6)
            .with_qk_norm(Some(QkNormConfig::new().with_eps(1e-6)))
    }

    /// `allenai/OLMo-2-0425-1B`: 16 layers, width 2048, 16 heads of width 128, FFN
    /// width 8192.
    pub fn olmo2_1b() -> Self {
        Self::olmo2(2048, 16, 16, 8192)
    }

    /// `allenai/OLMo-2-1124-7B`: 32 layers, width 4096, 32 heads of width 128, FFN
    /// width 11008.
    pub fn olmo2_7b() -> Self {
        Self::olmo2(4096, 32, 32, 11_008)
    }

    /// The OLMo-2 family: norms on the sublayers' outputs, QK-norm across heads,
    /// multi-head attention, RoPE θ 5e5 over 4096 positions, vocabulary 100352, untied
    /// embeddings.
    fn olmo2(d_model: usize, n_layers: usize, n_heads: usize, d_ff: usize) -> Self {
        let rope = RopeConfig::new(d_model / n_heads)
            .with_theta(500_000.0)
            .with_max_position_embeddings(4096);
        Self::new(100_352, d_model, n_layers, n_heads, d_ff, rope)
            .with_norm_eps(1e-6)
            .with_block_kind(BlockKind::OutputNorm)
            .with_qk_norm(Some(
                QkNormConfig::new()
                    .with_placement(QkNormPlacement::AcrossHeads)
                    .with_eps(1e-6),
            ))
    }

    /// `openai/gpt-oss-20b`: 24 layers of 32 experts (top-4).
    pub fn gpt_oss_20b() -> Self {
        Self::gpt_oss(24, 32)
    }

    /// `openai/gpt-oss-120b`: 36 layers of 128 experts (top-4).
    pub fn gpt_oss_120b() -> Self {
        Self::gpt_oss(36, 128)
    }

    /// The gpt-oss family: width 2880, 64 query heads of 64 sharing 8 key/value heads,
    /// attention sinks and biases, a window of 128 on every other layer, YaRN ×32 over
    /// 4096 positions; every layer a mixture of experts of width 2880 with router and
    /// expert biases and the clamped SwiGLU; vocabulary 201088, untied.
    fn gpt_oss(n_layers: usize, n_experts: usize) -> Self {
        let rope = RopeConfig::new(64)
            .with_theta(150_000.0)
            .with_max_position_embeddings(131_072)
            .with_scaling(RopeScaling::Yarn {
                factor: 32.0,
                original_max_position_embeddings: Some(4096),
                attention_factor: None,
                beta_fast: Some(32.0),
                beta_slow: Some(1.0),
                mscale: None,
                mscale_all_dim: None,
                truncate: Some(false),
            });
        let router = RouterConfig::new(2880, n_experts, 4).with_bias(true);
        let moe = MoeConfig::new(router, 2880)
            .with_expert_bias(true)
            .with_expert_glu(ExpertGlu::Clamped {
                alpha: 1.702,
                limit: 7.0,
            });
        Self::new(201_088, 2880, n_layers, 64, 2880, rope)
            .with_n_kv_heads(Some(8))
            .with_head_dim(Some(64))
            .with_norm_eps(1e-5)
            .with_qkv_bias(true)
            .with_o_bias(true)
            .with_attention_sinks(true)
            .with_sliding_window(Some(128))
            .with_sliding_layers(Some((0..n_layers).map(|layer| layer % 2 == 0).collect()))
            .with_moe(Some(moe))
    }

    /// `google/gemma-2-2b`: 26 layers, width 2304, GQA 8/4 of width 256, sandwich
    /// norms, sliding window 4096 on every other layer, logit soft-capping.
    pub fn gemma2_2b() -> Self {
        Self::gemma2(2304, 26, 8, 4, 9216)
    }

    /// `google/gemma-2-9b`: 42 layers, width 3584, GQA 16/8 of width 256.
    pub fn gemma2_9b() -> Self {
        Self::gemma2(3584, 42, 16, 8, 14_336)
    }

    /// The Gemma-2 family: vocabulary 256000, heads of width 256 scaled by
    /// `query_pre_attn_scalar` 256, GeGLU (tanh), Gemma's RMSNorm in sandwich blocks,
    /// embeddings scaled by `√d_model` and tied, attention logits capped at 50 and
    /// output logits at 30, a window of 4096 on the even layers.
    fn gemma2(
        d_model: usize,
        n_layers: usize,
        n_heads: usize,
        n_kv_heads: usize,
        d_ff: usize,
    ) -> Self {
        let rope = RopeConfig::new(256).with_max_position_embeddings(8192);
        Self::gemma(256_000, d_model, n_layers, n_heads, n_kv_heads, d_ff, rope)
            .with_attention_softcap(Some(50.0))
            .with_final_logit_softcap(Some(30.0))
            .with_sliding_window(Some(4096))
            .with_sliding_layers(Some((0..n_layers).map(|layer| layer % 2 == 0).collect()))
    }

    /// `google/gemma-3-1b-pt`: 26 layers, width 1152, 4 query heads sharing one
    /// key/value head of width 256, QK-norm, five sliding layers (window 512, RoPE base
    /// 10000) to one full layer (RoPE base 1e6).
    pub fn gemma3_1b() -> Self {
        let n_layers = 26;
        let rope = RopeConfig::new(256)
            .with_theta(1_000_000.0)
            .with_max_position_embeddings(32_768);
        Self::gemma(262_144, 1152, n_layers, 4, 1, 6912, rope.clone())
            .with_sliding_rope(Some(rope.with_theta(10_000.0)))
            .with_sliding_window(Some(512))
            .with_sliding_layers(Some(
                (0..n_layers).map(|layer| (layer + 1) % 6 != 0).collect(),
            ))
            .with_qk_norm(Some(QkNormConfig::new().with_unit_offset(true)))
    }

    /// `google/gemma-3-4b-pt` (its text model): 34 layers, width 2560, GQA 8/4 of
    /// width 256, QK-norm, five sliding layers (window 1024, RoPE base 10000) to one
    /// full layer (RoPE base 1e6, linear scaling ×8).
    pub fn gemma3_4b() -> Self {
        let n_layers = 34;
        let local = RopeConfig::new(256)
            .with_theta(10_000.0)
            .with_max_position_embeddings(131_072);
        let global = local
            .clone()
            .with_theta(1_000_000.0)
            .with_scaling(RopeScaling::Linear { factor: 8.0 });
        Self::gemma(262_208, 2560, n_layers, 8, 4, 10_240, global)
            .with_sliding_rope(Some(local))
            .with_sliding_window(Some(1024))
            .with_sliding_layers(Some(
                (0..n_layers).map(|layer| (layer + 1) % 6 != 0).collect(),
            ))
            .with_qk_norm(Some(QkNormConfig::new().with_unit_offset(true)))
    }

    /// What every Gemma shares: Gemma's RMSNorm in sandwich blocks, GeGLU (tanh),
    /// embeddings scaled by `√d_model` and tied, the attention scaled by
    /// `query_pre_attn_scalar^-½` (the head width).
    fn gemma(
        vocab_size: usize,
        d_model: usize,
        n_layers: usize,
        n_heads: usize,
        n_kv_heads: usize,
        d_ff: usize,
        rope: RopeConfig,
    ) -> Self {
        let head_dim = rope.head_dim;
        Self::new(vocab_size, d_model, n_layers, n_heads, d_ff, rope)
            .with_n_kv_heads(Some(n_kv_heads))
            .with_head_dim(Some(head_dim))
            .with_norm_eps(1e-6)
            .with_norm_unit_offset(true)
            .with_block_kind(BlockKind::Sandwich)
            .with_activation(Activation::GeluTanh)
            .with_embed_scale(Some((d_model as f64).sqrt()))
            .with_attention_scale(Some((head_dim as f64).powf(-0.5)))
            .with_tie_word_embeddings(true)
    }

    /// `mistralai/Mixtral-8x7B-v0.1`: 32 layers, width 4096, GQA 32/8, every layer a
    /// mixture of 8 SwiGLU experts of width 14336, top-2.
    pub fn mixtral_8x7b() -> Self {
        let rope = RopeConfig::new(128)
            .with_theta(1_000_000.0)
            .with_max_position_embeddings(32_768);
        Self::new(32_000, 4096, 32, 32, 14_336, rope)
            .with_n_kv_heads(Some(8))
            .with_norm_eps(1e-5)
            .with_moe(Some(MoeConfig::mixtral(4096, 14_336, 8, 2)))
            .with_aux_loss_coef(0.02)
    }

    /// `deepseek-ai/DeepSeek-V3`: 61 layers, width 7168, multi-head latent attention
    /// (128 heads, q rank 1536, kv rank 512), the first 3 layers dense (width 18432),
    /// then 256 routed experts (top-8 in 4 of 8 groups) plus one shared expert. The
    /// multi-token-prediction layer is not part of the model.
    pub fn deepseek_v3() -> Self {
        let latent = LatentAttentionConfig::deepseek_v3();
        let rope = latent.rope_config();
        Self::new(129_280, 7168, 61, 128, 18_432, rope)
            .with_norm_eps(1e-6)
            .with_latent(Some(latent))
            .with_moe(Some(MoeConfig::deepseek_v3()))
            .with_moe_layers(MoeLayerPlan::new().with_first_k_dense_replace(3))
            .with_aux_loss_coef(0.0001)
    }

    /// `deepseek-ai/DeepSeek-V2-Lite`: 27 layers, width 2048, multi-head latent attention
    /// (16 heads, a direct `q_proj`, kv rank 512), the first layer dense (width 10944),
    /// then 64 routed experts of width 1408 (top-6, softmax, not renormalized) plus two
    /// shared experts.
    pub fn deepseek_v2_lite() -> Self {
        let latent = LatentAttentionConfig::deepseek_v2_lite();
        let rope = latent.rope_config();
        let router = RouterConfig::new(2048, 64, 6).with_norm_topk_prob(false);
        Self::new(102_400, 2048, 27, 16, 10_944, rope)
            .with_norm_eps(1e-6)
            .with_latent(Some(latent))
            .with_moe(Some(MoeConfig::new(router, 1408).with_n_shared_experts(2)))
            .with_moe_layers(MoeLayerPlan::new().with_first_k_dense_replace(1))
            .with_aux_loss_coef(0.001)
    }
}

impl LatentAttentionConfig {
    /// DeepSeek-V3 (and R1): 7168 wide, 128 heads, q rank 1536, kv rank 512, head dims
    /// 128 + 64 (rope) for q·k and 128 for v, YaRN ×40 from 4096 positions.
    pub fn deepseek_v3() -> Self {
        Self::new(7168, 128, 512, 128, 64, 128)
            .with_q_lora_rank(Some(1536))
            .with_rope(Some(deepseek_rope(163_840, 1.0, 1.0)))
    }

    /// DeepSeek-V2-Lite: 2048 wide, 16 heads, a direct `q_proj`, kv rank 512, the same
    /// head dims as V3, YaRN ×40 with `mscale = mscale_all_dim = 0.707`.
    pub fn deepseek_v2_lite() -> Self {
        Self::new(2048, 16, 512, 128, 64, 128).with_rope(Some(deepseek_rope(163_840, 0.707, 0.707)))
    }
}

/// DeepSeek's published rotary embedding: theta 10000, interleaved, YaRN ×40 from 4096.
fn deepseek_rope(max_positions: usize, mscale: f64, mscale_all_dim: f64) -> RopeConfig {
    RopeConfig::new(64)
        .with_max_position_embeddings(max_positions)
        .with_layout(RopeLayout::Interleaved)
        .with_scaling(RopeScaling::Yarn {
            factor: 40.0,
            original_max_position_embeddings: Some(4096),
            attention_factor: None,
            beta_fast: Some(32.0),
            beta_slow: Some(1.0),
            mscale: Some(mscale),
            mscale_all_dim: Some(mscale_all_dim),
            truncate: None,
        })
}

impl MoeConfig {
    /// Mixtral's sparse block: softmax router with renormalized top-k, no shared expert
    /// (Mixtral 8x7B: `mixtral(4096, 14336, 8, 2)`).
    pub fn mixtral(d_model: usize, d_ff: usize, n_experts: usize, top_k: usize) -> Self {
        Self::new(RouterConfig::new(d_model, n_experts, top_k), d_ff)
    }

    /// DeepSeek-V3's MoE: 256 routed experts of width 2048 in 8 groups (4 eligible), top-8,
    /// sigmoid scores with the correction bias, renormalized and scaled by 2.5, one
    /// shared expert.
    pub fn deepseek_v3() -> Self {
        let router = RouterConfig::new(7168, 256, 8)
            .with_scoring(RouterScoring::Sigmoid)
            .with_routed_scaling_factor(2.5)
            .with_n_group(8)
            .with_topk_group(4)
            .with_score_correction_bias(true);
        Self::new(router, 2048).with_n_shared_experts(1)
    }
}

impl TransformerConfig {
    /// The paper's base model (65M parameters with a 37k shared vocabulary).
    pub fn base(src_vocab_size: usize, tgt_vocab_size: usize) -> Self {
        Self::new(src_vocab_size, tgt_vocab_size)
    }

    /// The paper's big model: width 1024, 16 heads, d_ff 4096, dropout 0.3.
    pub fn big(src_vocab_size: usize, tgt_vocab_size: usize) -> Self {
        Self::new(src_vocab_size, tgt_vocab_size)
            .with_d_model(1024)
            .with_n_heads(16)
            .with_d_ff(4096)
            .with_dropout(0.3)
    }

    /// A tiny model for tests: width 32, 4 heads, 2 + 2 layers, no dropout.
    pub fn tiny(src_vocab_size: usize, tgt_vocab_size: usize) -> Self {
        Self::new(src_vocab_size, tgt_vocab_size)
            .with_d_model(32)
            .with_n_heads(4)
            .with_d_ff(64)
            .with_n_encoder_layers(2)
            .with_n_decoder_layers(2)
            .with_dropout(0.0)
            .with_max_positions(64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::DType;

    #[test]
    fn presets_validate_and_have_their_published_sizes() {
        for (config, head_dim) in [
            (CausalLmConfig::tiny(), 16),
            (CausalLmConfig::llama_3_2_1b(), 64),
            (CausalLmConfig::llama_3_1_8b(), 128),
            (CausalLmConfig::mistral_7b(), 128),
            (CausalLmConfig::qwen2_0_5b(), 64),
        ] {
            config.validate().unwrap();
            assert_eq!(config.head_width(), head_dim);
        }
        assert_eq!(CausalLmConfig::mistral_7b().window_of(31), Some(4096));
        let mixtral = CausalLmConfig::mixtral_8x7b();
        mixtral.validate().unwrap();
        assert!(mixtral.moe_layers.is_moe(0) && mixtral.moe_layers.is_moe(31));
        let deepseek = CausalLmConfig::deepseek_v3();
        deepseek.validate().unwrap();
        assert!(!deepseek.moe_layers.is_moe(2) && deepseek.moe_layers.is_moe(3));
        let latent = deepseek.latent.as_ref().unwrap();
        assert_eq!((latent.kv_lora_rank, latent.qk_head_dim()), (512, 192));
        let lite = CausalLmConfig::deepseek_v2_lite();
        lite.validate().unwrap();
        assert!(!lite.moe_layers.is_moe(0) && lite.moe_layers.is_moe(1));
        assert_eq!(lite.latent.as_ref().unwrap().q_lora_rank, None);
    }

    /// Parameters in billions, rounded as the model cards print them: (all, without
    /// the token embedding and the LM head).
    fn billions(config: &CausalLmConfig, digits: i32) -> (f64, f64) {
        // Parameters are initialized lazily: counting them allocates nothing.
        let model = config.try_init(&burn::tensor::Device::flex()).unwrap();
        let total = burn::module::Module::num_params(&model);
        let heads = if config.tie_word_embeddings { 1 } else { 2 };
        let embedding = heads * config.vocab_size * config.d_model;
        let round = |n: usize| {
            let scale = 10f64.powi(digits);
            (n as f64 / 1e9 * scale).round() / scale
        };
        (round(total), round(total - embedding))
    }

    #[test]
    fn the_50m_preset_has_50m_parameters_with_a_vocabulary_of_8192() {
        let config = CausalLmConfig::llama_50m(8192);
        config.validate().unwrap();
        assert_eq!(config.head_width(), 64);
        let model = config.try_init(&burn::tensor::Device::flex()).unwrap();
        let total = burn::module::Module::num_params(&model);
        assert_eq!((total as f64 / 1e5).round() / 10.0, 50.7);
        assert_eq!(((total - 8192 * 640) as f64 / 1e5).round() / 10.0, 45.5);
    }

    #[test]
    fn qwen3_presets_have_the_published_parameter_counts() {
        // The model cards: Qwen3-0.6B "0.6B, non-embedding 0.44B"; Qwen3-8B "8.2B,
        // non-embedding 6.95B".
        assert_eq!(billions(&CausalLmConfig::qwen3_0_6b(), 2), (0.6, 0.44));
        assert_eq!(billions(&CausalLmConfig::qwen3_8b(), 1).0, 8.2);
        assert_eq!(billions(&CausalLmConfig::qwen3_8b(), 2).1, 6.95);
        assert_eq!(CausalLmConfig::qwen3_8b().head_width(), 128);
        // Qwen3-30B-A3B: "30.5B in total, non-embedding 29.9B".
        assert_eq!(billions(&CausalLmConfig::qwen3_30b_a3b(), 1), (30.5, 29.9));
    }

    #[test]
    fn gpt2_presets_have_the_parameter_counts_of_their_checkpoints() {
        // The safetensors of openai-community/gpt2 hold 124,439,808 parameters (wte,
        // wpe, 12 layers, ln_f; the head is tied), gpt2-medium's 354,823,168.
        let count = |config: CausalLmConfig| {
            let model = config.try_init(&burn::tensor::Device::flex()).unwrap();
            burn::module::Module::num_params(&model)
        };
        assert_eq!(count(CausalLmConfig::gpt2()), 124_439_808);
        assert_eq!(count(CausalLmConfig::gpt2_medium()), 354_823_168);
        assert_eq!(CausalLmConfig::gpt2().head_width(), 64);
    }

    #[test]
    fn gpt_oss_presets_have_the_published_parameter_counts() {
        // The model cards: gpt-oss-20b "21B parameters", gpt-oss-120b "117B".
        assert_eq!(billions(&CausalLmConfig::gpt_oss_20b(), 0).0, 21.0);
        assert_eq!(billions(&CausalLmConfig::gpt_oss_120b(), 0).0, 117.0);
    }

    #[test]
    fn olmo2_preset_has_the_published_parameter_count() {
        // The model card: OLMo-2-1124-7B, 7.3B parameters.
        assert_eq!(billions(&CausalLmConfig::olmo2_7b(), 1).0, 7.3);
        // OLMo-2-0425-1B: 1.48B parameters (the Hub's count of its safetensors).
        assert_eq!(billions(&CausalLmConfig::olmo2_1b(), 2).0, 1.48);
        assert_eq!(CausalLmConfig::olmo2_1b().head_width(), 128);
    }

    #[test]
    fn gemma_presets_have_the_published_parameter_counts() {
        // The model cards: Gemma-2-2B 2.61B, Gemma-2-9B 9.24B, Gemma-3-1B 1.0B.
        assert_eq!(billions(&CausalLmConfig::gemma2_2b(), 2).0, 2.61);
        assert_eq!(billions(&CausalLmConfig::gemma2_9b(), 2).0, 9.24);
        assert_eq!(billions(&CausalLmConfig::gemma3_1b(), 2).0, 1.0);
        // Gemma 3's report (its parameter table): the 4B model's language part has
        // 3,209M non-embedding parameters.
        assert_eq!(billions(&CausalLmConfig::gemma3_4b(), 2).1, 3.21);
        let gemma3_4b = CausalLmConfig::gemma3_4b();
        assert_eq!(
            (gemma3_4b.window_of(10), gemma3_4b.window_of(11)),
            (Some(1024), None)
        );
        let gemma3 = CausalLmConfig::gemma3_1b();
        assert_eq!(
            (gemma3.window_of(4), gemma3.window_of(5)),
            (Some(512), None)
        );
    }

    #[test]
    fn deepseek_v3_cache_is_576_values_per_token() {
        let footprint = LatentAttentionConfig::deepseek_v3().cache_bytes_per_token(DType::BF16, 8);
        assert_eq!(footprint.latent, 576 * 2);
        assert_eq!(footprint.mha, 128 * (192 + 128) * 2);
        assert_eq!(footprint.gqa, 8 * (192 + 128) * 2);
        println!("{footprint}");
        // YaRN ×40 with mscale_all_dim 1: scale = 192^-0.5 · (0.1 ln 40 + 1)².
        let mscale = 0.1 * 40f64.ln() + 1.0;
        let expected = mscale * mscale / 192f64.sqrt();
        assert!((LatentAttentionConfig::deepseek_v3().softmax_scale() - expected).abs() < 1e-12);
        LatentAttentionConfig::deepseek_v3().validate().unwrap();
        LatentAttentionConfig::deepseek_v2_lite()
            .validate()
            .unwrap();
    }
}
