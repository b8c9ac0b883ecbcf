//! What can go wrong before or around training: unreadable corpora, settings that do
//! not fit the data, checkpoints that are missing or broken. Every message names the
//! file or the setting and says what was expected, so the example programs print it
//! as it is instead of a panic trace.

use std::path::PathBuf;

use thiserror::Error;

use crate::error::ConfigError;
use crate::io::FileError;

/// An error of the training programs' data, settings or files.
#[derive(Debug, Error)]
pub enum TrainError {
    /// A file could not be read or written.
    #[error(transparent)]
    File(#[from] FileError),
    /// The corpus holds no text (an empty file, or a folder without UTF-8 files).
    #[error("{}: the corpus is empty{}", path.display(), if *skipped > 0 {
        format!(" ({skipped} files skipped as not UTF-8 text)")
    } else {
        String::new()
    })]
    EmptyCorpus {
        /// The file or folder.
        path: PathBuf,
        /// Files of a folder that were skipped as binary.
        skipped: usize,
    },
    /// A split has too few tokens for one training window.
    #[error(
        "the {split} split has {tokens} tokens, too few for a context of {context} \
         (a window needs context + 1 = {} tokens): use a larger corpus or a smaller --context",
        context + 1
    )]
    ContextTooLong {
        /// `train` or `validation`.
        split: &'static str,
        /// Tokens in that split.
        tokens: usize,
        /// The requested context length.
        context: usize,
    },
    /// A training setting is out of range.
    #[error("invalid setting `{setting}`: {reason}")]
    InvalidSetting {
        /// The setting (as the command-line flag names it).
        setting: &'static str,
        /// What was expected.
        reason: String,
    },
    /// A model configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A tokenizer could not be built, read or used.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A checkpoint or run file is missing or unreadable.
    #[error("{}: {reason}", path.display())]
    Checkpoint {
        /// The file or folder.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A run's folder holds a checkpoint written by another run.
    #[error(
        "{}: this checkpoint belongs to {}, not to the run being resumed ({run}): the \
         folder mixes two runs; start over with `--overwrite` or resume the other run's folder",
        checkpoint.display(),
        found.as_deref().map_or_else(|| "a run without an identity".to_string(), |found| format!("run {found}"))
    )]
    OtherRun {
        /// The checkpoint's manifest.
        checkpoint: PathBuf,
        /// The identity of the run being resumed.
        run: String,
        /// The identity the manifest names.
        found: Option<String>,
    },
    /// A new run was asked for in a folder that holds a run.
    #[error(
        "{} holds a run: resume it (`--resume`) or start over (`--overwrite`, which \
         removes the run's files first)",
        directory.display()
    )]
    RunExists {
        /// The run folder.
        directory: PathBuf,
    },
    /// Training stopped on an error reported by burn-train.
    #[error("training failed: {0}")]
    Training(String),
}

impl TrainError {
    /// An [`TrainError::InvalidSetting`].
    pub fn setting(setting: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidSetting {
            setting,
            reason: reason.into(),
        }
    }
}
