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

impl HfTokenizer {
    /// Trains a byte-level BPE tokenizer (GPT-2's design: any text, 256 byte tokens
    /// then merges) of at most `vocab_size` tokens on `text`, line by line, with
    /// `tokenizers`' trainer. Deterministic for a given text.
    ///
    /// # Errors
    /// [`TrainError::Tokenizer`] when `vocab_size` is below the 256 bytes, or the
    /// trainer fails.
    pub fn train_bpe(text: &str, vocab_size: usize, path: &Path) -> Result<Self, TrainError> {
        use tokenizers::models::TrainerWrapper;
        use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
        use tokenizers::pre_tokenizers::byte_level::ByteLevel;

        if vocab_size < 256 {
            return Err(TrainError::Tokenizer(format!(
                "bpe:{vocab_size}: a byte-level BPE has at least the 256 byte tokens; give \
                 bpe:N with N >= 256"
            )));
        }
        // No space is added before the text: it is one long document, not sentences.
        let byte_level = ByteLevel::new(false, true, true);
        let mut inner = tokenizers::Tokenizer::new(BPE::default());
        inner.with_pre_tokenizer(Some(byte_level));
        inner.with_decoder(Some(byte_level));
        let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
            .vocab_size(vocab_size)
            .min_frequency(2)
            .show_progress(false)
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build()
            .into();
        inner
            .train(&mut trainer, text.split_inclusive('\n'))
            .map_err(|error| {
                TrainError::Tokenizer(format!("training bpe:{vocab_size}: {error}"))
            })?;
        Ok(Self {
            inner,
            path: path.to_path_buf(),
        })
    }

    /// The tokenizer as the text of a `tokenizer.json`.
    ///
    /// # Errors
    /// [`TrainError::Tokenizer`] when it cannot be serialized.
    pub fn to_json(&self) -> Result<String, TrainError> {
        self.inner
            .to_string(true)
            .map_err(|error| TrainError::Tokenizer(format!("{}: {error}", self.path.display())))
    }
}

impl Tokenizer for HfTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>, TrainError> {
        let mut ids = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            let mut end = rest.len().min(CHUNK_BYTES);
            if end < rest.len() {
                // Cut after the last newline before the limit, or at the last char
                // boundary before it when a line is huge (the limit itself may fall
                // inside a character).
                let boundary = (0..=end)
                    .rev()
                    .find(|&i| rest.is_char_boundary(i))
                    .unwrap_or(0);
                end = match rest[..boundary].rfind('\n') {
                    Some(newline) => newline + 1,
                    None => boundary,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trained_byte_level_bpe_round_trips_any_text_within_its_vocabulary() {
        let text = "the cat sat on the mat; the cat ate the rat. naïve café 東京\n".repeat(50);
        let path = Path::new("tokenizer.json");
        let bpe = HfTokenizer::train_bpe(&text, 300, path).unwrap();
        assert!(
            bpe.vocab_size() <= 300 && bpe.vocab_size() > 256,
            "{}",
            bpe.vocab_size()
        );
        let ids = bpe.encode(&text).unwrap();
        assert!(
            ids.len() < text.len() / 2,
            "merges shorten the text: {}",
            ids.len()
        );
        assert_eq!(bpe.decode(&ids), text);
        // Text it never saw still round-trips: every byte is a token.
        let unseen = "Zürich 🦀 {x: 1}";
        assert_eq!(bpe.decode(&bpe.encode(unseen).unwrap()), unseen);
        let again = HfTokenizer::train_bpe(&text, 300, path).unwrap();
        assert_eq!(again.to_json().unwrap(), bpe.to_json().unwrap());
        let loaded = tokenizers::Tokenizer::from_bytes(bpe.to_json().unwrap().as_bytes()).unwrap();
        assert_eq!(
            loaded.encode(unseen, false).unwrap().get_ids(),
            bpe.encode(unseen).unwrap()
        );
    }

    /// Text longer than one encoding chunk is cut between characters, whatever lies at
    /// the chunk limit: a line break just before it, or a character of several bytes
    /// across it (with and without a line break earlier in the chunk).
    #[test]
    fn long_text_is_encoded_in_chunks_cut_between_characters() {
        let bpe = HfTokenizer::train_bpe("a…b\n".repeat(20).as_str(), 260, Path::new("t")).unwrap();
        for line_break in [Some(CHUNK_BYTES - 10), None] {
            // '…' is three bytes, starting one byte before the limit.
            let mut text = "x".repeat(CHUNK_BYTES - 1);
            if let Some(at) = line_break {
                text.replace_range(at..at + 1, "\n");
            }
            text.push_str("…yz\n");
            text.push_str(&"w".repeat(100));
            let ids = bpe.encode(&text).unwrap();
            assert_eq!(bpe.decode(&ids), text);
        }
    }
}
