//! Hugging Face checkpoints: `config.json` and safetensors weights (single-file or
//! sharded, bf16/f16/f32) loaded into our models by name.
//!
//! ```rust,no_run
//! use burn::tensor::Device;
//! use burn_transformer::hf::load_causal_lm;
//!
//! let (model, config) = load_causal_lm("path/to/Llama-3.2-1B", &Device::flex())?;
//! println!("{} with {} layers", config.model_type, model.n_layers());
//! # Ok::<(), burn_transformer::hf::HfError>(())
//! ```

mod checkpoint;
mod config;
mod error;

pub use checkpoint::{
    CONFIG_FILE, INDEX_FILE, KeyAction, KeyMap, LoadOptions, WEIGHTS_FILE, causal_lm_key_map,
    load_causal_lm, load_causal_lm_with, load_weights,
};
pub use config::{HfConfig, SUPPORTED_MODEL_TYPES};
pub use error::HfError;

#[cfg(test)]
mod tests;
