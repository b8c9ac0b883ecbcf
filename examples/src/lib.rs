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
    /// A message for a device that does not work or has no arithmetic in `--dtype`, or
    /// a model that cannot be loaded.
    pub fn load(&self, folder: &ModelFolder) -> Result<LoadedModel, String> {
        let dtype = parse_dtype(&self.dtype)?;
        let device = device::open_device(&self.device)?;
        if !device.supports_dtype(dtype) {
            return Err(format!(
                "--dtype {}: the {} device has no {dtype:?} arithmetic; use f32 (or f16 \
                 where the device has it)",
                self.dtype, self.device
            ));
        }
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

/// Generated text as it is decoded, for printing piece by piece. Each new token is
/// decoded together with the tokens before it and only the new part is given out, so
/// that characters split over several tokens come out whole: text ending in an
/// incomplete character (U+FFFD) waits for the next token, and [`StreamedText::finish`]
/// gives out what is left once decoding has ended, so that the pieces always add up to
/// the decoded text of every token.
#[derive(Debug, Default)]
pub struct StreamedText {
    tokens: Vec<u32>,
    given: String,
}

impl StreamedText {
    /// Adds `token`, decodes with `decode` and returns the text that is new (empty while
    /// the text ends in an incomplete character).
    ///
    /// # Errors
    /// The error of `decode`.
    pub fn push<E>(
        &mut self,
        token: u32,
        decode: impl FnOnce(&[u32]) -> Result<String, E>,
    ) -> Result<String, E> {
        self.tokens.push(token);
        let text = decode(&self.tokens)?;
        if text.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        Ok(self.give(text))
    }

    /// The text not given out yet, an incomplete last character included (as the
    /// tokenizer decodes it): called once no token follows.
    ///
    /// # Errors
    /// The error of `decode`.
    pub fn finish<E>(
        &mut self,
        decode: impl FnOnce(&[u32]) -> Result<String, E>,
    ) -> Result<String, E> {
        let text = decode(&self.tokens)?;
        Ok(self.give(text))
    }

    /// The part of `text` after what was given out; `text` becomes what was given out.
    /// A decoding that rewrites earlier text (a tokenizer that cleans up spaces) gives
    /// nothing out until it extends what was given again.
    fn give(&mut self, text: String) -> String {
        let new = text
            .strip_prefix(self.given.as_str())
            .map(str::to_string)
            .unwrap_or_default();
        self.given = text;
        new
    }

    /// The tokens so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }
}

/// Prints `text` at once (no newline).
pub fn print_now(text: &str) {
    print!("{text}");
    flush();
}

/// Flushes stdout (text printed without a newline shows at once).
pub fn flush() {
    let _ = std::io::stdout().flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tokenizer whose token `t` is the byte `t`, decoded as lossy UTF-8.
    fn decode(tokens: &[u32]) -> Result<String, std::convert::Infallible> {
        let bytes: Vec<u8> = tokens.iter().map(|&t| t as u8).collect();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    #[test]
    fn streamed_pieces_add_up_to_the_decoded_text() {
        // "a", then "é" split over two tokens, then the first byte of "🦀" with no more.
        let tokens = [b'a', 0xC3, 0xA9, 0xF0, 0x9F];
        let mut stream = StreamedText::default();
        let pieces: Vec<String> = tokens
            .iter()
            .map(|&t| stream.push(u32::from(t), decode).unwrap())
            .collect();
        assert_eq!(pieces, ["a", "", "é", "", ""]);
        let rest = stream.finish(decode).unwrap();
        assert_eq!(rest, "\u{FFFD}");
        let whole: String = pieces.concat() + &rest;
        assert_eq!(whole, decode(stream.tokens()).unwrap());
        assert_eq!(stream.finish(decode).unwrap(), "");
    }
}
