//! The encoder-decoder Transformer of "Attention Is All You Need"
//! ([Vaswani et al. 2017](https://arxiv.org/abs/1706.03762)).
//!
//! ```text
//! source ─► embed·√d + sinusoid ─► encoder blocks ──────────────────────┐ memory
//! target ─► embed·√d + sinusoid ─► decoder blocks (self-attn, cross-attn ◄┘, FFN) ─► lm_head
//! ```
//!
//! The stacks are [`TransformerStack`]s of [`crate::block`] blocks: Post-LN as in the
//! paper (`x = norm(x + sublayer(x))`), Pre-LN (`x = x + sublayer(norm(x))` with a
//! final norm per stack, [Xiong et al. 2020](https://arxiv.org/abs/2002.04745)) or
//! ResiDual ([`BlockKind`]).
//! Padding masks apply on both sides: the source padding hides padded source positions
//! from the encoder and from cross-attention, the target padding hides padded target
//! positions from the decoder's self-attention.
//!
//! During decoding each decoder block's self-attention grows a
//! [`KvCache`](crate::attention::KvCache) and its cross-attention projects the
//! encoder's memory once into a [`CrossKvCache`](crate::attention::CrossKvCache)
//! (together a [`BlockCache`]).

use burn::config::Config;
use burn::module::{Initializer, Module};
use burn::nn::{Dropout, DropoutConfig, Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn::tensor::{Bool, Device, Int, Tensor};

use crate::attention::{AttentionImpl, MultiHeadAttentionConfig, SelfAttentionConfig};
use crate::block::{
    BlockKind, BlockWeights, Memory, StackCache, TransformerBlockConfig, TransformerStack,
    TransformerStackConfig,
};
use crate::error::ConfigError;
use crate::ffn::{Activation, DenseFfnConfig, FeedForwardConfig};
use crate::norm::{LayerNormConfig, NormConfig};
use crate::ops::linear::{linear_rows, matmul_rows};
use crate::position::{SinusoidalPosition, SinusoidalPositionConfig};

const MODULE: &str = "TransformerConfig";

/// Configuration of a [`Transformer`].
#[derive(Config, Debug)]
pub struct TransformerConfig {
    /// Number of source token ids.
    pub src_vocab_size: usize,
    /// Number of target token ids.
    pub tgt_vocab_size: usize,
    /// Model width. Default: 512 (the paper's base model).
    #[config(default = 512)]
    pub d_model: usize,
    /// Number of attention heads. Default: 8.
    #[config(default = 8)]
    pub n_heads: usize,
    /// Hidden width of the feed-forward networks. Default: 2048.
    #[config(default = 2048)]
    pub d_ff: usize,
    /// Number of encoder layers. Default: 6.
    #[config(default = 6)]
    pub n_encoder_layers: usize,
    /// Number of decoder layers. Default: 6.
    #[config(default = 6)]
    pub n_decoder_layers: usize,
    /// Dropout on embeddings, sub-layer outputs, attention probabilities and FFN
    /// activations during training. Default: 0.1.
    #[config(default = 0.1)]
    pub dropout: f64,
    /// Where norms and residuals sit in every block: Post-LN (the paper), Pre-LN or
    /// ResiDual (a parallel block has no place for cross-attention). Default: Post-LN.
    #[config(default = "BlockKind::PostNorm")]
    pub block_kind: BlockKind,
    /// Feed-forward activation. Default: ReLU (the paper).
    #[config(default = "Activation::Relu")]
    pub activation: Activation,
    /// Epsilon of the layer norms. Default: 1e-5.
    #[config(default = 1e-5)]
    pub norm_eps: f64,
    /// Source and target share one embedding (needs equal vocabularies, as the
    /// paper's shared BPE vocabulary). Default: false.
    #[config(default = false)]
    pub share_embeddings: bool,
    /// The output projection reuses the target embedding's weight (the paper).
    /// Default: true.
    #[config(default = true)]
    pub tie_output: bool,
    /// Positions whose sinusoids are precomputed (longer inputs still work).
    /// Default: 1024.
    #[config(default = 1024)]
    pub max_positions: usize,
    /// Which attention implementation to use. Default: automatic.
    #[config(default = "AttentionImpl::Auto")]
    pub implementation: AttentionImpl,
    /// Initializer of the attention projections. Default: Xavier-uniform, as the
    /// reference implementations.
    #[config(default = "Initializer::XavierUniform { gain: 1.0 }")]
    pub initializer: Initializer,
}

impl TransformerConfig {
    fn attention(&self, causal: bool) -> MultiHeadAttentionConfig {
        MultiHeadAttentionConfig::new(self.d_model, self.n_heads)
            .with_qkv_bias(true)
            .with_o_bias(true)
            .with_causal(causal)
            .with_dropout(self.dropout)
            .with_implementation(self.implementation)
            .with_initializer(self.initializer.clone())
    }

    /// The configuration of the encoder's or the decoder's stack.
    pub fn stack(&self, decoder: bool) -> TransformerStackConfig {
        let block = TransformerBlockConfig::new(
            SelfAttentionConfig::MultiHead(self.attention(decoder)),
            FeedForwardConfig::Dense(
                DenseFfnConfig::new(self.d_model, self.d_ff)
                    .with_activation(self.activation)
                    .with_dropout(self.dropout),
            ),
            NormConfig::Layer(LayerNormConfig::new(self.d_model).with_eps(self.norm_eps)),
        )
        .with_cross_attention(decoder.then(|| self.attention(false)))
        .with_kind(self.block_kind)
        .with_residual_dropout(self.dropout);
        let layers = if decoder {
            self.n_decoder_layers
        } else {
            self.n_encoder_layers
        };
        TransformerStackConfig::new(block, layers)
    }

    /// Checks the configuration.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        ConfigError::check_positive(MODULE, "src_vocab_size", self.src_vocab_size)?;
        ConfigError::check_positive(MODULE, "tgt_vocab_size", self.tgt_vocab_size)?;
        ConfigError::check_probability(MODULE, "dropout", self.dropout)?;
        self.stack(false).validate()?;
        self.stack(true).validate()?;
        if self.share_embeddings && self.src_vocab_size != self.tgt_vocab_size {
            return Err(ConfigError::Invalid {
                module: MODULE,
                field: "share_embeddings",
                reason: format!(
                    "needs equal vocabularies, got {} (source) and {} (target)",
                    self.src_vocab_size, self.tgt_vocab_size
                ),
            });
        }
        Ok(())
    }

    /// Builds the model.
    ///
    /// # Errors
    /// See [`TransformerConfig::validate`].
    pub fn try_init(&self, device: &Device) -> Result<Transformer, ConfigError> {
        self.validate()?;
        // The paper's N(0, d^-1/2) embedding: with the √d scale, unit-variance inputs.
        let embedding = |vocab: usize| {
            EmbeddingConfig::new(vocab, self.d_model)
                .with_initializer(Initializer::Normal {
                    mean: 0.0,
                    std: (self.d_model as f64).powf(-0.5),
                })
                .init(device)
        };
        Ok(Transformer {
            embed_tokens: embedding(self.src_vocab_size),
            decoder_embed_tokens: (!self.share_embeddings).then(|| embedding(self.tgt_vocab_size)),
            embed_positions: SinusoidalPositionConfig::new(self.d_model)
                .with_max_position_embeddings(self.max_positions)
                .try_init(device)?,
            encoder: self.stack(false).try_init(device)?,
            decoder: self.stack(true).try_init(device)?,
            lm_head: (!self.tie_output).then(|| {
                LinearConfig::new(self.d_model, self.tgt_vocab_size)
                    .with_bias(false)
                    .with_initializer(self.initializer.clone())
                    .init(device)
            }),
            dropout: DropoutConfig::new(self.dropout).init(),
            d_model: self.d_model,
            tgt_vocab_size: self.tgt_vocab_size,
        })
    }
}

crate::builders::init_or_panic!(TransformerConfig => Transformer);

/// The encoder-decoder Transformer.
#[derive(Module, Debug)]
pub struct Transformer {
    /// Source embedding (and target embedding when shared), `[src_vocab, d_model]`.
    pub embed_tokens: Embedding,
    /// Target embedding; `None` when shared with `embed_tokens`.
    pub decoder_embed_tokens: Option<Embedding>,
    /// Sinusoidal positions, added on both sides (no parameters).
    pub embed_positions: SinusoidalPosition,
    /// The encoder: bidirectional self-attention blocks.
    pub encoder: TransformerStack,
    /// The decoder: causal self-attention, cross-attention and FFN blocks.
    pub decoder: TransformerStack,
    /// Output projection; `None` when tied to the target embedding.
    pub lm_head: Option<Linear>,
    /// On the embeddings.
    pub dropout: Dropout,
    #[module(skip)]
    d_model: usize,
    #[module(skip)]
    tgt_vocab_size: usize,
}

/// The decoding state of a [`Transformer`]: the encoder's memory and the decoder's
/// caches.
#[derive(Clone, Debug)]
pub struct Seq2SeqCache {
    /// The encoded source and its padding.
    pub memory: Memory,
    /// One cache per decoder block.
    pub decoder: StackCache,
}

impl Seq2SeqCache {
    /// The number of target positions decoded so far.
    pub fn position(&self) -> usize {
        self.decoder.position()
    }

    /// Keeps the batch rows `indices`, in that order (beam search).
    ///
    /// # Shapes
    /// - indices: `[new_batch]`
    pub fn select_batch(&mut self, indices: Tensor<1, Int>) {
        self.memory.states = self.memory.states.clone().select(0, indices.clone());
        self.memory.padding = self
            .memory
            .padding
            .take()
            .map(|p| p.int().select(0, indices.clone()).bool());
        self.decoder.select_batch(indices);
    }
}

impl Transformer {
    /// Number of target token ids.
    pub fn tgt_vocab_size(&self) -> usize {
        self.tgt_vocab_size
    }

    fn target_embedding(&self) -> &Embedding {
        self.decoder_embed_tokens
            .as_ref()
            .unwrap_or(&self.embed_tokens)
    }

    /// `embedding(tokens)·√d_model + sinusoid(offset..)`, then dropout.
    fn embed(&self, embedding: &Embedding, tokens: Tensor<2, Int>, offset: usize) -> Tensor<3> {
        let x = embedding.forward(tokens) * (self.d_model as f64).sqrt();
        self.dropout
            .forward(self.embed_positions.forward(x, offset))
    }

    /// Encodes the source.
    ///
    /// # Shapes
    /// - source: `[batch, seq_src]`
    /// - source_padding: `[batch, seq_src]`, `true` = padded
    /// - output (the memory): `[batch, seq_src, d_model]`
    pub fn encode(
        &self,
        source: Tensor<2, Int>,
        source_padding: Option<Tensor<2, Bool>>,
    ) -> Tensor<3> {
        let x = self.embed(&self.embed_tokens, source, 0);
        self.encoder.forward(x, source_padding, None)
    }

    /// Teacher-forced decoding of whole targets over an encoded source.
    ///
    /// # Shapes
    /// - target: `[batch, seq_tgt]`
    /// - memory: `[batch, seq_src, d_model]`
    /// - memory_padding: `[batch, seq_src]`, target_padding: `[batch, seq_tgt]`
    /// - output: `[batch, seq_tgt, tgt_vocab_size]`
    pub fn decode(
        &self,
        target: Tensor<2, Int>,
        memory: Tensor<3>,
        memory_padding: Option<Tensor<2, Bool>>,
        target_padding: Option<Tensor<2, Bool>>,
    ) -> Tensor<3> {
        let x = self.embed(self.target_embedding(), target, 0);
        let memory = Memory {
            states: memory,
            padding: memory_padding,
        };
        self.project(self.decoder.forward(x, target_padding, Some(&memory)))
    }

    /// Encodes the source and decodes the target (teacher forcing): the training
    /// forward pass.
    ///
    /// # Shapes
    /// - source: `[batch, seq_src]`, target: `[batch, seq_tgt]`
    /// - source_padding: `[batch, seq_src]`, target_padding: `[batch, seq_tgt]`
    /// - output: `[batch, seq_tgt, tgt_vocab_size]`
    pub fn forward(
        &self,
        source: Tensor<2, Int>,
        target: Tensor<2, Int>,
        source_padding: Option<Tensor<2, Bool>>,
        target_padding: Option<Tensor<2, Bool>>,
    ) -> Tensor<3> {
        let memory = self.encode(source, source_padding.clone());
        self.decode(target, memory, source_padding, target_padding)
    }

    /// [`forward`](Self::forward) that also returns every block's attention
    /// probabilities, for inspection: the encoder's self-attention and the decoder's
    /// self- and cross-attention. Computed on the reference path (the fused kernel
    /// never forms the probabilities).
    ///
    /// # Shapes
    /// - as [`forward`](Self::forward)
    /// - encoder weights: per block, `self_attn` `[batch, heads, seq_src, seq_src]`
    /// - decoder weights: per block, `self_attn` `[batch, heads, seq_tgt, seq_tgt]` and
    ///   `cross_attn` `[batch, heads, seq_tgt, seq_src]`
    pub fn forward_with_weights(
        &self,
        source: Tensor<2, Int>,
        target: Tensor<2, Int>,
        source_padding: Option<Tensor<2, Bool>>,
        target_padding: Option<Tensor<2, Bool>>,
    ) -> (Tensor<3>, Vec<BlockWeights>, Vec<BlockWeights>) {
        let x = self.embed(&self.embed_tokens, source, 0);
        let (memory, encoder_weights) =
            self.encoder
                .forward_with_weights(x, None, source_padding.clone(), None);
        let memory = Memory {
            states: memory,
            padding: source_padding,
        };
        let y = self.embed(self.target_embedding(), target, 0);
        let (hidden, decoder_weights) =
            self.decoder
                .forward_with_weights(y, None, target_padding, Some(&memory));
        (self.project(hidden), encoder_weights, decoder_weights)
    }

    /// An empty decoding cache over an encoded source.
    ///
    /// # Shapes
    /// - memory: `[batch, seq_src, d_model]`, memory_padding: `[batch, seq_src]`
    pub fn new_cache(
        &self,
        memory: Tensor<3>,
        memory_padding: Option<Tensor<2, Bool>>,
    ) -> Seq2SeqCache {
        Seq2SeqCache {
            memory: Memory {
                states: memory,
                padding: memory_padding,
            },
            decoder: self.decoder.new_cache(),
        }
    }

    /// Logits of new target positions, attending to the cached ones and the memory.
    /// Equals [`decode`](Self::decode) over the whole target, one chunk at a time.
    ///
    /// # Shapes
    /// - target: `[batch, new]`
    /// - target_padding: `[batch, new]`, `true` = padded
    /// - output: `[batch, new, tgt_vocab_size]`
    pub fn decode_cached(
        &self,
        target: Tensor<2, Int>,
        cache: &mut Seq2SeqCache,
        target_padding: Option<Tensor<2, Bool>>,
    ) -> Tensor<3> {
        let x = self.embed(self.target_embedding(), target, cache.position());
        let (hidden, _) = self.decoder.forward_cached(
            x,
            None,
            &mut cache.decoder,
            target_padding,
            Some(&cache.memory),
        );
        self.project(hidden)
    }

    /// Output projection (the stack already applied its final norm).
    fn project(&self, x: Tensor<3>) -> Tensor<3> {
        match &self.lm_head {
            Some(head) => linear_rows(head, x),
            // The embedding is [vocab, d_model]; tied logits are x · Eᵀ.
            None => matmul_rows(x, self.target_embedding().weight.val().transpose()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::padding_mask_from_lengths;
    use crate::generate::{
        BeamSearchConfig, GenerationConfig, Seq2SeqDecoding, beam_search, generate,
    };
    use crate::test_utils::{assert_close, max_abs_diff, model_test_devices, tokens};

    /// Random weights with some spread, so that outputs depend on every parameter.
    fn model(kind: BlockKind, device: &Device) -> Transformer {
        device.seed(17);
        TransformerConfig::tiny(40, 30)
            .with_block_kind(kind)
            .with_initializer(Initializer::Normal {
                mean: 0.0,
                std: 0.3,
            })
            .init(device)
    }

    /// PyTorch's `nn.TransformerEncoderLayer` / `nn.TransformerDecoderLayer` stacked as
    /// the paper does (`tools/make_fixtures.py transformer_post_ln transformer_pre_ln`):
    /// the same logits at every real target position, Post-LN and Pre-LN, with padding
    /// on both sides and the tied output head.
    #[test]
    fn matches_pytorch_transformer_layers() {
        use crate::test_utils::{Fixture, fixture_dir};
        use burn::store::{ModuleSnapshot, PyTorchToBurnAdapter, SafetensorsStore};
        for (name, kind) in [
            ("transformer_post_ln", BlockKind::PostNorm),
            ("transformer_pre_ln", BlockKind::PreNorm),
        ] {
            let fixture = Fixture::load(name);
            for device in model_test_devices() {
                let mut model = TransformerConfig::new(20, 24)
                    .with_d_model(16)
                    .with_n_heads(2)
                    .with_d_ff(32)
                    .with_n_encoder_layers(2)
                    .with_n_decoder_layers(2)
                    .with_dropout(0.0)
                    .with_block_kind(kind)
                    .init(&device);
                // The weights are the fixture's `w.<our path>` tensors, PyTorch's layout.
                let mut store =
                    SafetensorsStore::from_file(fixture_dir().join(format!("{name}.safetensors")))
                        .with_key_remapping(r"^w\.", "")
                        .with_from_adapter(PyTorchToBurnAdapter)
                        .skip_enum_variants(true);
                let result = model.load_from(&mut store).unwrap();
                assert!(result.missing.is_empty(), "{name}: {:?}", result.missing);
                let ints = |key: &str| {
                    let data = fixture.data(key);
                    Tensor::<2, Int>::from_data(data.convert::<i64>(), &device)
                };
                let padding = |key: &str| ints(key).equal_elem(1);
                let logits = model.forward(
                    ints("src"),
                    ints("tgt"),
                    Some(padding("src_padding")),
                    Some(padding("tgt_padding")),
                );
                // Padded target positions are never read: compare the real ones.
                let real = padding("tgt_padding")
                    .bool_not()
                    .float()
                    .unsqueeze_dim::<3>(2);
                let expected = fixture.tensor::<3>("logits", &device);
                assert_close(logits * real.clone(), expected * real, 1e-4, name);
            }
        }
    }

    #[test]
    fn attention_weights_come_with_the_same_logits_and_are_distributions() {
        for device in model_test_devices() {
            let model = model(BlockKind::PreNorm, &device);
            let source = tokens(&[&[5, 6, 7, 8, 9, 1], &[3, 4, 5, 1, 0, 0]], &device);
            let source_padding = padding_mask_from_lengths(&[6, 4], 6, &device);
            let target = tokens(&[&[1, 11, 12, 13], &[1, 21, 22, 23]], &device);
            let logits = model.forward(
                source.clone(),
                target.clone(),
                Some(source_padding.clone()),
                None,
            );
            let (with_weights, encoder, decoder) =
                model.forward_with_weights(source, target, Some(source_padding), None);
            assert_close(with_weights, logits, 1e-5, "logits");
            assert_eq!((encoder.len(), decoder.len()), (2, 2));
            assert_eq!(encoder[0].self_attn.dims(), [2, 4, 6, 6]);
            let cross = decoder[1]
                .cross_attn
                .clone()
                .expect("decoder cross-attention");
            assert_eq!(cross.dims(), [2, 4, 4, 6]);
            // Rows are probability distributions; padded source keys get none.
            let sums = cross.clone().sum_dim(3);
            assert_close(sums, Tensor::ones([2, 4, 4, 1], &device), 1e-5, "row sums");
            let padded = cross
                .narrow(0, 1, 1)
                .narrow(3, 4, 2)
                .abs()
                .max()
                .into_scalar::<f32>();
            assert_eq!(padded, 0.0, "attention to padded source positions");
            // Causal decoder self-attention: nothing above the diagonal.
            let future = decoder[0].self_attn.clone().narrow(2, 0, 1).narrow(3, 1, 3);
            assert_eq!(future.abs().max().into_scalar::<f32>(), 0.0);
        }
    }

    #[test]
    fn cached_decoding_equals_teacher_forcing_for_every_block_kind() {
        for device in model_test_devices() {
            for kind in [BlockKind::PostNorm, BlockKind::PreNorm, BlockKind::ResiDual] {
                let model = model(kind, &device);
                let source = tokens(&[&[5, 6, 7, 8, 9, 1], &[3, 4, 5, 1, 0, 0]], &device);
                let source_padding = padding_mask_from_lengths(&[6, 4], 6, &device);
                let target = tokens(&[&[1, 11, 12, 13, 14], &[1, 21, 22, 23, 24]], &device);
                let memory = model.encode(source, Some(source_padding.clone()));
                let full = model.decode(
                    target.clone(),
                    memory.clone(),
                    Some(source_padding.clone()),
                    None,
                );
                let mut cache = model.new_cache(memory, Some(source_padding));
                let mut steps =
                    vec![model.decode_cached(target.clone().narrow(1, 0, 2), &mut cache, None)];
                for position in 2..5 {
                    steps.push(model.decode_cached(
                        target.clone().narrow(1, position, 1),
                        &mut cache,
                        None,
                    ));
                }
                assert!(
                    cache
                        .decoder
                        .blocks
                        .iter()
                        .all(|b| b.cross_attn.is_filled())
                );
                assert_close(
                    Tensor::cat(steps, 1),
                    full,
                    1e-5,
                    &format!("{kind:?} cached vs full"),
                );
            }
        }
    }

    #[test]
    fn padding_on_either_side_does_not_change_real_positions() {
        for device in model_test_devices() {
            let model = model(BlockKind::PostNorm, &device);
            let alone = model.forward(
                tokens(&[&[5, 6, 7]], &device),
                tokens(&[&[1, 11, 12]], &device),
                None,
                None,
            );
            // The same pair padded to 5 source and 4 target positions with other ids.
            let padded = model.forward(
                tokens(&[&[5, 6, 7, 33, 34]], &device),
                tokens(&[&[1, 11, 12, 29]], &device),
                Some(padding_mask_from_lengths(&[3], 5, &device)),
                Some(padding_mask_from_lengths(&[3], 4, &device)),
            );
            let diff = max_abs_diff(padded.narrow(1, 0, 3), alone);
            assert!(
                diff < 1e-5,
                "padding changed real outputs by {diff:e} on {device:?}"
            );
        }
    }

    #[test]
    fn shared_and_tied_embeddings_are_one_parameter() {
        let device = Device::flex();
        let model = TransformerConfig::tiny(30, 30)
            .with_share_embeddings(true)
            .init(&device);
        assert!(model.decoder_embed_tokens.is_none() && model.lm_head.is_none());
        let untied = TransformerConfig::tiny(30, 20)
            .with_tie_output(false)
            .init(&device);
        let target = untied.decoder_embed_tokens.as_ref().unwrap();
        assert_eq!(target.weight.dims(), [20, 32]);
        assert_eq!(untied.lm_head.as_ref().unwrap().weight.dims(), [32, 20]);
        let error = TransformerConfig::tiny(30, 20)
            .with_share_embeddings(true)
            .validate()
            .unwrap_err();
        assert!(error.to_string().contains("share_embeddings"), "{error}");
    }

    #[test]
    fn generation_and_beam_search_run_through_the_caches() {
        for device in model_test_devices() {
            let model = model(BlockKind::PreNorm, &device);
            let source = tokens(&[&[5, 6, 7, 8], &[9, 10, 0, 0]], &device);
            let padding = padding_mask_from_lengths(&[4, 2], 4, &device);
            let memory = model.encode(source, Some(padding.clone()));
            let decoding = Seq2SeqDecoding::new(&model, memory.clone(), Some(padding.clone()));
            let starts = vec![vec![1], vec![1]];
            let greedy =
                generate(&decoding, &starts, &GenerationConfig::greedy(5), |_| {}).unwrap();
            let beams = beam_search(&decoding, &starts, &BeamSearchConfig::new(1, 5)).unwrap();
            for row in 0..2 {
                assert_eq!(beams[row][0].tokens, greedy[row].tokens);
                // Teacher forcing on the generated tokens gives argmaxes that match.
                let mut target = vec![1i64];
                target.extend(greedy[row].tokens.iter().map(|&t| t as i64));
                let logits = model.decode(
                    tokens(&[&target[..5]], &device),
                    memory.clone().narrow(0, row, 1),
                    Some(padding.clone().narrow(0, row, 1)),
                    None,
                );
                let argmax: Vec<i64> = logits
                    .argmax(2)
                    .into_data()
                    .convert::<i64>()
                    .try_into_vec::<i64>()
                    .unwrap();
                assert_eq!(argmax, target[1..].to_vec(), "row {row}");
            }
            let beams = beam_search(&decoding, &starts, &BeamSearchConfig::new(3, 4)).unwrap();
            assert!(beams.iter().all(|b| b.len() == 3));
        }
    }
}
