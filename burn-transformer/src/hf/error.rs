//! What can go wrong when reading a Hugging Face checkpoint: every error names the file,
//! and the key or field, and what was expected.

use std::path::PathBuf;

use thiserror::Error;

use super::model_type::SUPPORTED_MODEL_TYPES;
use crate::error::ConfigError;

/// An error reading a Hugging Face model directory.
#[derive(Debug, Error)]
pub enum HfError {
    /// A file could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A JSON file is not valid JSON.
    #[error("{}: invalid JSON: {source}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The parser's message (with line and column).
        #[source]
        source: serde_json::Error,
    },
    /// A field of a JSON file is missing or has the wrong type or value.
    #[error("{}: field `{field}`: {reason}", path.display())]
    Field {
        /// The file.
        path: PathBuf,
        /// The field (dotted for nested ones).
        field: String,
        /// What was expected.
        reason: String,
    },
    /// `config.json` names a model type this crate does not implement.
    #[error(
        "{}: unsupported model_type \"{model_type}\" (supported: {})",
        path.display(),
        SUPPORTED_MODEL_TYPES.join(", ")
    )]
    UnsupportedModelType {
        /// The `config.json`.
        path: PathBuf,
        /// The value found.
        model_type: String,
    },
    /// The configuration read from `config.json` is invalid for our model.
    #[error("{}: {source}", path.display())]
    Config {
        /// The `config.json`.
        path: PathBuf,
        /// The validation error.
        #[source]
        source: ConfigError,
    },
    /// The directory holds neither `model.safetensors` nor `model.safetensors.index.json`.
    #[error(
        "{}: no weights found (expected model.safetensors or model.safetensors.index.json)",
        dir.display()
    )]
    NoWeights {
        /// The model directory.
        dir: PathBuf,
    },
    /// A safetensors file could not be parsed, or holds a dtype we cannot read.
    #[error("{}: {message}", path.display())]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// The reader's message.
        message: String,
    },
    /// A parameter of the model has no tensor in the checkpoint.
    #[error(
        "{}: missing tensor `{key}` (shape {expected:?}){}",
        dir.display(),
        others_suffix(*others, "missing")
    )]
    MissingTensor {
        /// The model directory.
        dir: PathBuf,
        /// The Hugging Face key that was looked for.
        key: String,
        /// The shape it should have.
        expected: Vec<usize>,
        /// How many other keys are missing too.
        others: usize,
    },
    /// The checkpoint holds a tensor the model has no parameter for.
    #[error(
        "{}: unexpected tensor `{key}` (shape {found:?}) that the {model_type} model has no \
         parameter for{}",
        file.display(),
        others_suffix(*others, "unexpected")
    )]
    UnexpectedTensor {
        /// The safetensors file holding it.
        file: PathBuf,
        /// Its key.
        key: String,
        /// Its shape.
        found: Vec<usize>,
        /// The model type being loaded.
        model_type: String,
        /// How many other keys are unexpected too.
        others: usize,
    },
    /// A tensor's shape does not match the configuration.
    #[error(
        "{}: tensor `{key}` has shape {found:?}, but config.json implies {expected:?}{}",
        file.display(),
        others_suffix(*others, "mismatched")
    )]
    ShapeMismatch {
        /// The safetensors file holding it.
        file: PathBuf,
        /// The Hugging Face key.
        key: String,
        /// The shape the configuration implies (Hugging Face layout: `[out, in]` for
        /// linear weights).
        expected: Vec<usize>,
        /// The shape in the file.
        found: Vec<usize>,
        /// How many other tensors mismatch too.
        others: usize,
    },
    /// The checkpoint holds more decoder layers than `config.json` declares: loading
    /// it would drop the layers beyond `num_hidden_layers`.
    #[error(
        "{}: `num_hidden_layers` is {configured}{}, but the checkpoint holds {found} layers \
         (model.layers.0 to model.layers.{}): a {model_type} model built from this \
         config.json would drop {} of them",
        path.display(),
        extra_layers_note(model_type, *mtp_layers),
        found - 1,
        found - configured - mtp_layers
    )]
    LayerCount {
        /// The `config.json`.
        path: PathBuf,
        /// The model type.
        model_type: String,
        /// `num_hidden_layers`.
        configured: usize,
        /// The layers the family stores after the decoder layers
        /// (`num_nextn_predict_layers` of DeepSeek-V3).
        mtp_layers: usize,
        /// The layers the checkpoint holds (`model.layers.N`).
        found: usize,
    },
    /// A tensor is not a floating-point tensor where the model needs one.
    #[error("{}: tensor `{key}` has dtype {dtype}, expected a float (f32, f16, bf16)", file.display())]
    UnsupportedDtype {
        /// The safetensors file holding it.
        file: PathBuf,
        /// The Hugging Face key.
        key: String,
        /// The dtype found.
        dtype: String,
    },
    /// A file of an export could not be written.
    #[error("{}: cannot write: {message}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The reason.
        message: String,
    },
    /// The model cannot be saved in Hugging Face's format, or an adapter folder holds
    /// an adapter this crate does not implement.
    #[error("{what}: {reason}")]
    Unsupported {
        /// What was being saved or read (a model type, a file).
        what: String,
        /// Why, and what to do instead.
        reason: String,
    },
    /// Burn refused to load a tensor after the checks above passed.
    #[error("{}: tensor `{key}`: {message}", dir.display())]
    Apply {
        /// The model directory.
        dir: PathBuf,
        /// The key.
        key: String,
        /// burn-store's message.
        message: String,
    },
}

/// What a [`HfError::LayerCount`] message says of the family's extra layers.
fn extra_layers_note(model_type: &str, mtp_layers: usize) -> String {
    if model_type == "deepseek_v3" {
        format!(" and `num_nextn_predict_layers` is {mtp_layers}")
    } else {
        String::new()
    }
}

fn others_suffix(others: usize, what: &str) -> String {
    match others {
        0 => String::new(),
        1 => format!(" (and 1 other {what})"),
        n => format!(" (and {n} others {what})"),
    }
}
