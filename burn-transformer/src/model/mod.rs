//! Models, each a stack of [`crate::block`] blocks: decoder-only causal language
//! models (the LLaMA family and its relatives) with optional multi-token prediction,
//! the encoder-decoder Transformer, and presets of published sizes.

mod causal_lm;
mod encoder_decoder;
pub mod multi_token;
mod per_layer_embedding;
mod presets;

pub use causal_lm::{CausalLm, CausalLmConfig, CausalLmOutput};
pub use encoder_decoder::{Seq2SeqCache, Transformer, TransformerConfig};
pub use per_layer_embedding::{PerLayerEmbedding, PerLayerEmbeddingConfig};

#[cfg(test)]
pub(crate) use causal_lm::tests as causal_lm_tests;
