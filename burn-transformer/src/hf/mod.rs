//! Hugging Face checkpoints: `config.json` and safetensors weights (single-file or
//! sharded, bf16/f16/f32) loaded into our models by name, and the decoding settings of
//! `generation_config.json`.
//!
//! `config.json` is read here and nowhere else: serde structs for the keys of each part
//! (the model's own, the rotary embedding, latent attention, mixture of experts) and the
//! mapping to our plain configs. [`HfConfig`] reads a whole supported model; the readers
//! of one part ([`rope_config`], [`latent_attention_config`], [`moe_config`], …) serve
//! models assembled from the building blocks.
//!
//! ```rust,no_run
//! use burn::tensor::Device;
//! use burn_transformer::hf::load_causal_lm;
//!
//! let (model, config) = load_causal_lm("path/to/Llama-3.2-1B", &Device::flex())?;
//! println!("{} with {} layers", config.model_type, model.n_layers());
//! # Ok::<(), burn_transformer::hf::HfError>(())
//! ```

mod activation;
mod apertus;
mod biogpt;
mod bloom;
mod checkpoint;
mod codegen;
mod config;
mod defaults;
mod error;
mod export;
mod falcon;
mod fused_heads;
mod gemma4;
mod generation_config;
mod gpt2;
mod gpt_neo;
mod gpt_neox;
mod gptj;
mod keys;
mod latent;
mod llama4;
mod model_type;
mod moe;
mod mpt;
mod opt;
mod own_names;
mod peft;
mod persimmon;
mod qwen3_next;
mod rope;
mod stablelm;
mod tensors;

pub use checkpoint::{
    CONFIG_FILE, INDEX_FILE, KeyAction, KeyMap, LoadOptions, LoadReport, WEIGHTS_FILE,
    causal_lm_key_map, load_causal_lm, load_causal_lm_with, load_weights, non_finite_parameters,
};
pub use config::HfConfig;
pub use error::HfError;
pub use export::{ExportOptions, ExportReport, dtype_name, hf_config_json, save_causal_lm};
pub use fused_heads::{FusedHeads, FusedLayout};
pub use generation_config::{GENERATION_CONFIG_FILE, HfGenerationConfig, read_generation_config};
pub use latent::latent_attention_config;
pub use model_type::SUPPORTED_MODEL_TYPES;
pub use moe::{moe_config, moe_layer_plan, swiglu_config};
pub use peft::{
    ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, load_peft_adapters, read_peft_config,
    save_peft_adapters,
};
pub use rope::{rope_config, rope_config_of_layer_type};

#[cfg(test)]
mod export_tests;
#[cfg(test)]
mod tests;
