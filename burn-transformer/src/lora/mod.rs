//! LoRA: low-rank adapters on the linear layers of a built model (Hu et al., 2021),
//! attached through Burn's parameter reparameterization so that the model's code does
//! not change, only the adapters train, and [`Module::materialize`] merges them.
//!
//! ```rust
//! use burn::module::Module;
//! use burn::tensor::Device;
//! use burn_transformer::lora::{LoraConfig, attach_lora};
//! use burn_transformer::model::CausalLmConfig;
//! use burn_transformer::position::RopeConfig;
//!
//! let device = Device::flex();
//! let model = CausalLmConfig::new(64, 32, 2, 4, 64, RopeConfig::new(8)).init(&device);
//! let (model, summary) = attach_lora(model, &LoraConfig::new(4, 8.0))?;
//! assert_eq!(summary.adapted.len(), 2 * 7); // q, k, v, o, gate, up, down per layer
//! // ... train: only the adapters receive gradients ...
//! let merged = model.valid().materialize(); // W + scale·A·B, no adapters left
//! # Ok::<(), burn_transformer::ConfigError>(())
//! ```
//!
//! [`Module::materialize`]: burn::module::Module::materialize

mod adapter;
mod config;

pub use adapter::{LoraSummary, LowRankAdapter, attach_lora, freeze_matching};
pub use config::{LORA_TARGETS, LoraConfig, default_lora_targets};
