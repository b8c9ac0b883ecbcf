//! What the tasks train on: text corpora and their tokenizers, seeded batches of
//! language-modelling windows, and the generated digit tasks of the seq2seq task.

mod corpus;
pub mod digits;
mod steps;
mod tokenizer;
mod windows;

pub use corpus::{Corpus, TokenSplit};
pub use digits::{DigitTask, Example, Seq2SeqBatch, Seq2SeqLoader, test_examples};
pub use tokenizer::{ByteTokenizer, CharTokenizer, Tokenizer};
pub(crate) use windows::SplitMix64;
pub use windows::{LmBatch, WindowLoader};
