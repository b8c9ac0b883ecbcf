//! A Hugging Face `tokenizer.json` (BPE, WordPiece, Unigram…) as the library's
//! [`Tokenizer`]. It lives here, not in the library, so that only the example
//! programs depend on the `tokenizers` crate.

use std::path::{Path, PathBuf};

use burn_transformer::io::read_bytes;
use burn_transformer::train::{Tokenizer, TrainError};

/// Bytes of text encoded per call: long inputs are split at line ends so the
/// pre-tokenizer never holds a whole corpus at once.
const CHUNK_BYTES: usize = 1 << 16;

/// A `tokenizer.json` loaded with the `tokenizers` crate.
pub struct HfTokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
}

impl HfTokenizer {
    /// Loads `path`.
    ///
    /// # Errors
    /// [`TrainError::File`] when the file cannot be read, or [`TrainError::Tokenizer`]
    /// naming the file when it is not a tokenizer.
    pub fn load(path: &Path) -> Result<Self, TrainError> {
        let inner = tokenizers::Tokenizer::from_bytes(read_bytes(path)?).map_err(|error| {
            TrainError::Tokenizer(format!("{}: not a tokenizer.json: {error}", path.display()))
        })?;
        Ok(Self {
            inner,
            path: path.to_path_buf(),
        })
    }
}

impl Tokenizer for HfTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>, TrainError> {
        let mut ids = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            let mut end = rest.len().min(CHUNK_BYTES);
            if end < rest.len() {
                // Cut after a newline (or at a char boundary when a line is huge).
                end = match rest[..end].rfind('\n') {
                    Some(newline) => newline + 1,
                    None => (0..=end)
                        .rev()
                        .find(|&i| rest.is_char_boundary(i))
                        .unwrap_or(0),
                };
                if end == 0 {
                    end = rest.len();
                }
            }
            let encoding = self.inner.encode(&rest[..end], false).map_err(|error| {
                TrainError::Tokenizer(format!("{}: {error}", self.path.display()))
            })?;
            ids.extend_from_slice(encoding.get_ids());
            rest = &rest[end..];
        }
        Ok(ids)
    }

    fn decode(&self, tokens: &[u32]) -> String {
        self.inner.decode(tokens, false).unwrap_or_default()
    }

    fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    fn describe(&self) -> String {
        format!(
            "{} ({} tokens)",
            self.path.display(),
            self.inner.get_vocab_size(true)
        )
    }
}
