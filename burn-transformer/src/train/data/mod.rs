//! What the tasks train on: text corpora and their tokenizers, corpora tokenized once
//! into memory-mapped shards, seeded batches of language-modelling windows, and the
//! generated digit tasks of the seq2seq task.

mod corpus;
pub mod digits;
mod shards;
mod steps;
mod tokenizer;
mod tokens;
mod windows;

pub use corpus::{Corpus, TokenSplit};
pub use digits::{DigitTask, Example, Seq2SeqBatch, Seq2SeqLoader, test_examples};
pub use shards::{
    PrepareConfig, PrepareCursor, PrepareProgress, SHARDS_MANIFEST, ShardFile, ShardManifest,
    SourceFile, check_prepare_folder, is_prepared, open_shards, prepare_shards, text_files,
};
pub use tokenizer::{ByteTokenizer, CharTokenizer, Tokenizer};
pub use tokens::Tokens;
pub(crate) use windows::SplitMix64;
pub use windows::{LmBatch, WindowLoader};
