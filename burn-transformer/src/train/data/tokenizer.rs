//! Turning text into token ids and back.
//!
//! The library ships the character-level tokenizer that nanoGPT's Shakespeare recipe
//! uses: one id per distinct character of the corpus, in code-point order. Subword
//! tokenizers (a Hugging Face `tokenizer.json`) plug in through the same
//! [`Tokenizer`] trait; the example programs hold that adapter, so the library does
//! not depend on the `tokenizers` crate.

use std::collections::BTreeSet;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::train::TrainError;
use crate::train::json_file::{read_json, write_json};

/// Text to token ids and back.
pub trait Tokenizer: Send + Sync {
    /// The ids of `text`.
    ///
    /// # Errors
    /// [`TrainError::Tokenizer`] when `text` holds something the vocabulary cannot
    /// express.
    fn encode(&self, text: &str) -> Result<Vec<u32>, TrainError>;

    /// The text of `tokens`; ids outside the vocabulary are skipped.
    fn decode(&self, tokens: &[u32]) -> String;

    /// Number of ids (the model's vocabulary size).
    fn vocab_size(&self) -> usize;

    /// A short description for logs (`char-level, 65 symbols`).
    fn describe(&self) -> String;
}

/// One token per distinct character of a corpus.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CharTokenizer {
    /// The vocabulary, in id order (sorted by code point).
    chars: Vec<char>,
}

impl CharTokenizer {
    /// The vocabulary of `text`: its distinct characters, sorted, so the same corpus
    /// always gives the same ids.
    ///
    /// # Errors
    /// [`TrainError::Tokenizer`] if `text` is empty.
    pub fn from_text(text: &str) -> Result<Self, TrainError> {
        let chars: Vec<char> = text.chars().collect::<BTreeSet<_>>().into_iter().collect();
        if chars.is_empty() {
            return Err(TrainError::Tokenizer(
                "cannot build a character vocabulary from empty text".into(),
            ));
        }
        Ok(Self { chars })
    }

    /// The characters, in id order.
    pub fn chars(&self) -> &[char] {
        &self.chars
    }

    /// Writes the vocabulary as JSON, atomically (see [`crate::io`]).
    ///
    /// # Errors
    /// [`TrainError::File`] naming the file.
    pub fn save(&self, path: &Path) -> Result<(), TrainError> {
        write_json(path, self)
    }

    /// Reads a vocabulary written by [`CharTokenizer::save`].
    ///
    /// # Errors
    /// [`TrainError::File`] when the file cannot be read, or
    /// [`TrainError::Checkpoint`] when it is not such a vocabulary.
    pub fn load(path: &Path) -> Result<Self, TrainError> {
        let tokenizer: Self = read_json(path, "a character vocabulary")?;
        if tokenizer.chars.is_empty() {
            return Err(TrainError::Checkpoint {
                path: path.to_path_buf(),
                reason: "the character vocabulary is empty".into(),
            });
        }
        Ok(tokenizer)
    }
}

impl Tokenizer for CharTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>, TrainError> {
        text.chars()
            .map(|c| {
                self.chars
                    .binary_search(&c)
                    .map(|id| id as u32)
                    .map_err(|_| {
                        TrainError::Tokenizer(format!(
                            "character {c:?} is not in the vocabulary of {} characters",
                            self.chars.len()
                        ))
                    })
            })
            .collect()
    }

    fn decode(&self, tokens: &[u32]) -> String {
        tokens
            .iter()
            .filter_map(|&id| self.chars.get(id as usize))
            .collect()
    }

    fn vocab_size(&self) -> usize {
        self.chars.len()
    }

    fn describe(&self) -> String {
        format!("char-level, {} symbols", self.chars.len())
    }
}

/// One token per byte of the UTF-8 text: 256 ids, any text, no vocabulary to save.
/// Decoding replaces bytes that do not form UTF-8 (an incomplete character at a
/// sample's end) with U+FFFD.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ByteTokenizer;

impl Tokenizer for ByteTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>, TrainError> {
        Ok(text.bytes().map(u32::from).collect())
    }

    fn decode(&self, tokens: &[u32]) -> String {
        let bytes: Vec<u8> = tokens
            .iter()
            .filter_map(|&id| u8::try_from(id).ok())
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn vocab_size(&self) -> usize {
        256
    }

    fn describe(&self) -> String {
        "bytes (256 ids)".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_any_text() {
        let text = "naïve café — 東京, emoji 🦀\n";
        let ids = ByteTokenizer.encode(text).unwrap();
        assert_eq!(ids.len(), text.len());
        assert!(ids.iter().all(|&id| id < 256));
        assert_eq!(ByteTokenizer.decode(&ids), text);
        // A cut inside a character decodes to the replacement character, no panic.
        assert_eq!(
            ByteTokenizer.decode(&ids[..ids.len() - 3]).chars().last(),
            Some('\u{FFFD}')
        );
    }

    #[test]
    fn char_vocabulary_is_sorted_and_round_trips() {
        let tokenizer = CharTokenizer::from_text("hello, world").unwrap();
        assert_eq!(
            tokenizer.chars(),
            &[' ', ',', 'd', 'e', 'h', 'l', 'o', 'r', 'w']
        );
        let ids = tokenizer.encode("world, hello").unwrap();
        assert_eq!(ids[0], 8);
        assert_eq!(tokenizer.decode(&ids), "world, hello");
        assert_eq!(tokenizer.vocab_size(), 9);
    }

    #[test]
    fn unknown_characters_and_empty_text_are_errors() {
        let tokenizer = CharTokenizer::from_text("abc").unwrap();
        let error = tokenizer.encode("abz").unwrap_err().to_string();
        assert!(error.contains("'z'"), "{error}");
        assert!(CharTokenizer::from_text("").is_err());
    }
}
