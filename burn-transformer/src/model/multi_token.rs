//! Multi-token prediction (DeepSeek-V3, [DeepSeek-AI 2024](https://arxiv.org/abs/2412.19437)
//! §2.2): `D` extra modules, run one after the other, each predicting one token further
//! ahead than the one before, with the model's embedding and output head.
//!
//! ```text
//! depth k (1..=D), position i:
//!   h'ᵢ = eh_proj([enorm(embed(tᵢ₊ₖ)); hnorm(hᵢᵏ⁻¹)])      (embedding first, as the
//!   hᵏ  = block(h'₀..)   (a transformer block, causal)     checkpoints are laid out)
//!   logitsᵢᵏ = lm_head(shared_head.norm(hᵢᵏ))  → predicts tᵢ₊ₖ₊₁
//! ```
//!
//! `h⁰` is the main model's output (after its final norm). Training adds
//! `λ/D · Σₖ CE(logitsᵏ)` to the loss ([`CausalLmConfig::mtp_loss_weight`]); at
//! inference the first module drafts the token after next, which the main model then
//! verifies (self-speculative decoding, [`crate::generate::generate_speculative`]).
//! The field names are DeepSeek-V3's (`model.layers.{L}.enorm`, `hnorm`, `eh_proj`,
//! `shared_head.norm`, and the block's own keys), so a checkpoint's MTP layer loads
//! with a rename table ([`crate::hf`]).
//!
//! [`CausalLmConfig::mtp_loss_weight`]: super::CausalLmConfig::mtp_loss_weight

use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::{Device, Tensor};

use crate::block::{BlockCache, BlockState, RoutingLosses, TransformerBlock};
use crate::error::ConfigError;
use crate::norm::{Norm, NormConfig};

/// The norm before the shared output head (DeepSeek-V3's `shared_head`, whose `head`
/// is the model's `lm_head`).
#[derive(Module, Debug)]
pub struct SharedHead {
    /// `shared_head.norm`.
    pub norm: Norm,
}

/// One multi-token-prediction module: it combines the previous depth's hidden state
/// with the embedding of the token `k` ahead and runs one transformer block.
#[derive(Module, Debug)]
pub struct MultiTokenPredictor {
    /// Norm of the token embedding.
    pub enorm: Norm,
    /// Norm of the previous depth's hidden state.
    pub hnorm: Norm,
    /// `[2·d_model] -> [d_model]`, no bias; its input is `[embedding; hidden]`.
    pub eh_proj: Linear,
    /// The module's transformer block (configured as a layer of the main stack).
    pub block: TransformerBlock,
    /// The norm before the model's output head.
    pub shared_head: SharedHead,
}

/// The output of one [`MultiTokenPredictor`] over a sequence.
#[derive(Debug, Clone)]
pub struct PredictorOutput {
    /// The module's hidden state `hᵏ`, the next depth's input, `[batch, seq, d_model]`.
    pub hidden: Tensor<3>,
    /// What enters the output head, `shared_head.norm(hᵏ)`, `[batch, seq, d_model]`.
    pub head_input: Tensor<3>,
    /// The routing losses of the block's mixture of experts, if it has one.
    pub losses: RoutingLosses,
}

impl MultiTokenPredictor {
    /// A module around `block`, with norms of `norm` and a projection from
    /// `2·d_model`.
    ///
    /// # Errors
    /// The norm's errors.
    pub fn try_new(
        block: TransformerBlock,
        norm: &NormConfig,
        initializer: burn::module::Initializer,
        device: &Device,
    ) -> Result<Self, ConfigError> {
        let d_model = norm.d_model();
        Ok(Self {
            enorm: norm.try_init(device)?,
            hnorm: norm.try_init(device)?,
            eh_proj: LinearConfig::new(2 * d_model, d_model)
                .with_bias(false)
                .with_initializer(initializer)
                .init(device),
            block,
            shared_head: SharedHead {
                norm: norm.try_init(device)?,
            },
        })
    }

    /// Runs the module over whole sequences.
    ///
    /// # Shapes
    /// - hidden: `[batch, seq, d_model]`, the previous depth's states at positions `i`
    /// - embeddings: `[batch, seq, d_model]`, the embeddings of the tokens `k` ahead
    /// - output: `[batch, seq, d_model]` each
    pub fn forward(&self, hidden: Tensor<3>, embeddings: Tensor<3>) -> PredictorOutput {
        let state = BlockState::new(self.combine(hidden, embeddings), self.block.kind());
        self.finish(self.block.forward(state, None, None))
    }

    /// [`forward`](Self::forward) over new positions, reading and extending `cache`
    /// (made by [`new_cache`](Self::new_cache)).
    ///
    /// # Shapes
    /// As [`forward`](Self::forward), over the new positions.
    pub fn forward_cached(
        &self,
        hidden: Tensor<3>,
        embeddings: Tensor<3>,
        cache: &mut BlockCache,
    ) -> PredictorOutput {
        let state = BlockState::new(self.combine(hidden, embeddings), self.block.kind());
        self.finish(self.block.forward_cached(state, cache, None, None))
    }

    /// An empty decoding cache for the module's block.
    pub fn new_cache(&self) -> BlockCache {
        BlockCache::for_block(&self.block)
    }

    /// `eh_proj([enorm(embeddings); hnorm(hidden)])`.
    fn combine(&self, hidden: Tensor<3>, embeddings: Tensor<3>) -> Tensor<3> {
        let joined = Tensor::cat(
            vec![self.enorm.forward(embeddings), self.hnorm.forward(hidden)],
            2,
        ); // [batch, seq, 2 * d_model]
        self.eh_proj.forward(joined)
    }

    fn finish(&self, state: BlockState) -> PredictorOutput {
        PredictorOutput {
            head_input: self.shared_head.norm.forward(state.hidden.clone()),
            hidden: state.hidden,
            losses: state.losses,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::block::BlockKind;
    use crate::error::ConfigError;
    use crate::model::causal_lm_tests::{small, small_latent_moe};
    use crate::test_utils::{assert_close, model_test_devices, tokens};
    use burn::tensor::{Int, Tensor};

    /// The drafts of the cached module, fed a few positions at a time as decoding
    /// feeds them, equal the depth-1 logits of the full forward; the main logits of
    /// the full forward are the model's own; deeper modules shorten by one each.
    #[test]
    fn cached_drafts_equal_the_full_forward() {
        for device in model_test_devices() {
            device.seed(5);
            for config in [small(BlockKind::PreNorm), small_latent_moe()] {
                let model = config.with_mtp_depth(2).init(&device);
                let rows: [&[i64]; 2] = [&[1, 5, 9, 13, 17, 21, 3], &[2, 4, 6, 8, 10, 12, 14]];
                let input = tokens(&rows, &device);
                let full = model.forward_with_mtp(input.clone());
                assert_close(
                    full.logits.clone(),
                    model.forward(input.clone(), None),
                    1e-5,
                    "main logits",
                );
                let dims: Vec<[usize; 3]> = full.mtp_logits.iter().map(|l| l.dims()).collect();
                assert_eq!(dims, vec![[2, 6, 40], [2, 5, 40]]);

                let mut cache = model.new_cache();
                let mut mtp_caches = model.new_mtp_caches();
                let columns = |start: usize, len: usize| input.clone().narrow(1, start, len);
                let (_, hidden) = model.forward_cached_with_hidden(columns(0, 4), &mut cache, None);
                // States 0..2 know their next token; state 3 waits for token 4.
                let first = model
                    .draft_cached(
                        hidden.clone().narrow(1, 0, 3),
                        columns(1, 3),
                        &mut mtp_caches[0],
                    )
                    .unwrap();
                let (_, later) = model.forward_cached_with_hidden(columns(4, 3), &mut cache, None);
                let states = Tensor::cat(vec![hidden.narrow(1, 3, 1), later.narrow(1, 0, 2)], 1);
                let second = model
                    .draft_cached(states, columns(4, 3), &mut mtp_caches[0])
                    .unwrap();
                assert_close(
                    Tensor::cat(vec![first, second], 1),
                    full.mtp_logits[0].clone(),
                    1e-4,
                    &format!("cached drafts on {device:?}"),
                );
            }
        }
    }

    /// The multi-token-prediction loss reaches every module's parameters, the
    /// embedding and the head, and nothing of a model without it changes.
    #[test]
    fn every_module_receives_gradients() {
        let device = burn::tensor::Device::flex().autodiff();
        let model = small(BlockKind::PreNorm).with_mtp_depth(2).init(&device);
        let input: Tensor<2, Int> = tokens(&[&[1, 5, 9, 13, 17, 21]], &device);
        let output = model.forward_with_mtp(input);
        let loss = output.mtp_logits[0].clone().powf_scalar(2.0).mean()
            + output.mtp_logits[1].clone().powf_scalar(2.0).mean();
        let grads = loss.backward();
        for (index, module) in model.mtp.iter().enumerate() {
            let grad = module.eh_proj.weight.val().grad(&grads);
            assert!(
                grad.is_some_and(|g| g.abs().sum().into_scalar::<f32>() > 0.0),
                "mtp.{index}"
            );
            let crate::norm::Norm::Rms(norm) = &module.shared_head.norm else {
                panic!("RMSNorm models")
            };
            assert!(
                norm.weight
                    .as_ref()
                    .is_some_and(|w| w.val().grad(&grads).is_some()),
                "mtp.{index}.shared_head.norm"
            );
        }
        assert!(model.embed_tokens.weight.val().grad(&grads).is_some());
    }

    #[test]
    fn invalid_settings_are_config_errors() {
        let residual = small(BlockKind::ResiDual).with_mtp_depth(1);
        assert!(matches!(
            residual.validate(),
            Err(ConfigError::Invalid {
                field: "mtp_depth",
                ..
            })
        ));
        let negative = small(BlockKind::PreNorm).with_mtp_loss_weight(-0.1);
        assert!(negative.validate().is_err());
    }
}
