//! Helpers shared by the example programs.

pub mod device;
pub mod hf_tokenizer;
pub mod plot;
pub mod run;
pub mod trained;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use burn_transformer::device::parse_device;
use clap::Args;

use crate::trained::{LoadedModel, ModelFolder};

/// The `examples/` folder of this checkout: the one this crate was compiled from, or,
/// where that is gone, the one cargo names when it runs a program or test. A target
/// directory shared between clones (`.ci/run` keeps one outside the clone) can hold a
/// binary compiled in a clone since deleted.
pub fn manifest_dir() -> PathBuf {
    let compiled = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    match std::env::var_os("CARGO_MANIFEST_DIR") {
        Some(running) if !compiled.exists() => PathBuf::from(running),
        _ => compiled,
    }
}

/// A program's exit: success, or its error as one `error: …` line on stderr and
/// status 1 (no panic trace for bad input).
pub fn exit_with(result: Result<(), String>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The flags of the programs that run a language model.
#[derive(Args, Debug, Clone)]
pub struct ModelFlags {
    /// Model folder: a Hugging Face model (config.json and model.safetensors or a
    /// sharded index) or a train-lm run (run.json, model.bpk and the run's tokenizer).
    #[arg(long)]
    pub model: PathBuf,
    /// Backend: flex, ndarray, wgpu, or cuda (cuda:N for the N-th GPU).
    #[arg(long, default_value = "flex")]
    pub device: String,
    /// Float type of the weights: f32, f16 or bf16.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
}

impl ModelFlags {
    /// Checks `--dtype` and `--device` and opens the `--model` folder (its kind and
    /// settings; no weights are read, no device is started).
    ///
    /// # Errors
    /// A message for a bad flag or a folder that is not a model's.
    pub fn folder(&self) -> Result<ModelFolder, String> {
        parse_dtype(&self.dtype)?;
        parse_device(&self.device).map_err(|error| error.to_string())?;
        ModelFolder::open(&self.model)
    }

    /// Loads the model of `folder` (opened by [`ModelFlags::folder`]) on the device.
    ///
    /// # Errors
    /// A message for a device that does not work, or a model that cannot be loaded.
    pub fn load(&self, folder: &ModelFolder) -> Result<LoadedModel, String> {
        let dtype = parse_dtype(&self.dtype)?;
        let device = device::open_device(&self.device)?;
        folder.load(&device, dtype)
    }
}

/// Parses a `--dtype` value.
///
/// # Errors
/// A message listing the accepted names.
pub fn parse_dtype(name: &str) -> Result<burn::tensor::DType, String> {
    match name.to_ascii_lowercase().as_str() {
        "f32" | "float32" => Ok(burn::tensor::DType::F32),
        "f16" | "float16" => Ok(burn::tensor::DType::F16),
        "bf16" | "bfloat16" => Ok(burn::tensor::DType::BF16),
        other => Err(format!(
            "unknown dtype `{other}`: expected f32, f16 or bf16"
        )),
    }
}

/// Prints generated text as it is decoded. Each new token is decoded together with
/// the tokens before it and only the new part is printed, so that characters split
/// over several tokens come out whole; text ending in an incomplete character
/// (U+FFFD) waits for the next token.
#[derive(Debug, Default)]
pub struct StreamedText {
    tokens: Vec<u32>,
    printed: String,
}

impl StreamedText {
    /// Adds `token`, decodes with `decode` and prints what is new.
    ///
    /// # Errors
    /// The error of `decode`.
    pub fn push<E>(
        &mut self,
        token: u32,
        decode: impl FnOnce(&[u32]) -> Result<String, E>,
    ) -> Result<(), E> {
        self.tokens.push(token);
        let text = decode(&self.tokens)?;
        if text.ends_with('\u{FFFD}') {
            return Ok(());
        }
        if let Some(new) = text.strip_prefix(self.printed.as_str()) {
            print!("{new}");
            let _ = std::io::stdout().flush();
        }
        self.printed = text;
        Ok(())
    }

    /// The tokens so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }
}

/// Flushes stdout (text printed without a newline shows at once).
pub fn flush() {
    let _ = std::io::stdout().flush();
}
