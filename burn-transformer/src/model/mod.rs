//! Models: decoder-only causal language models (the LLaMA family), the
//! encoder-decoder Transformer, and presets of published sizes.

mod causal_lm;
mod decoder_layer;
mod encoder_decoder;
mod presets;

pub use causal_lm::{CausalLm, CausalLmConfig, CausalLmOutput, DecoderCache, DecoderStack};
pub use decoder_layer::{DecoderLayer, LayerAux, LayerCache, Mlp, SelfAttention};
pub use encoder_decoder::{NormPlacement, Seq2SeqCache, Transformer, TransformerConfig};
