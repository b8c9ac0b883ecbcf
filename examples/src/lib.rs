//! Helpers shared by the example programs.

pub mod device;
pub mod hf_tokenizer;
pub mod plot;
