//! A language model trained by `train-lm` in well under a second, for the tests of
//! the programs that run one, and the library's own reading of it (the reference the
//! programs are compared with).

// Each test file uses its own subset.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use burn::tensor::Device;
use burn_transformer::model::{CausalLm, CausalLmConfig};
use burn_transformer::train::{CharTokenizer, Tokenizer, load_module};
use examples::hf_tokenizer::HfTokenizer;

use crate::common::{assert_success, run};

/// The words of the corpus: the model learns to continue them with more of them.
const WORDS: [&str; 14] = [
    "the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven",
    "wizards", "hex", "jackdaws",
];

/// The training window of the run.
pub const CONTEXT: usize = 16;

/// Trains a one-layer character-level model on a corpus of 600 words into
/// `root/run` and returns that folder.
pub fn train_tiny_run(root: &Path) -> PathBuf {
    train_tiny_run_with(root, &[])
}

/// A byte-pair-encoding `tokenizer.json` over the corpus' characters, with merges
/// that make a few words single tokens.
pub fn bpe_tokenizer() -> String {
    let mut vocab = serde_json::Map::new();
    let symbols = (b'a'..=b'z').map(|c| (c as char).to_string());
    let merged = ["th", "the", "qu", "wi", "wiz"];
    for (id, symbol) in std::iter::once(" ".to_string())
        .chain(symbols)
        .chain(merged.iter().map(|s| s.to_string()))
        .enumerate()
    {
        vocab.insert(symbol, id.into());
    }
    serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": {"type": "Fuse"},
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "vocab": vocab,
            "merges": ["t h", "th e", "q u", "w i", "wi z"]
        }
    })
    .to_string()
}

/// [`train_tiny_run`] with more `train-lm` flags (into `root/run`).
pub fn train_tiny_run_with(root: &Path, extra: &[&str]) -> PathBuf {
    // A fixed word sequence (a linear congruential walk): the same corpus every time.
    let mut state = 1u64;
    let words: Vec<&str> = (0..600)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            WORDS[(state >> 33) as usize % WORDS.len()]
        })
        .collect();
    let data = root.join("corpus.txt");
    std::fs::write(&data, words.join(" ")).unwrap();
    let out = root.join("run");
    let context = CONTEXT.to_string();
    let mut args = vec![
        "--data",
        data.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--layers",
        "1",
        "--d-model",
        "32",
        "--heads",
        "2",
        "--steps",
        "60",
        "--eval-interval",
        "30",
        "--warmup",
        "5",
        "--lr",
        "3e-3",
        "--sample-tokens",
        "0",
        "--context",
        &context,
        "--batch-size",
        "8",
        "--log-every",
        "0",
    ];
    args.extend_from_slice(extra);
    assert_success(&run(env!("CARGO_BIN_EXE_train-lm"), &args));
    out
}

/// The model and tokenizer of the run in `dir`, read with the library alone (and the
/// `tokenizer.json` adapter train-lm trains with).
pub fn load_run(dir: &Path, device: &Device) -> (CausalLm, Box<dyn Tokenizer>) {
    let settings: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("run.json")).unwrap()).unwrap();
    let config: CausalLmConfig = serde_json::from_value(settings["model"].clone()).unwrap();
    let model = load_module(config.init(device), &dir.join("model.bpk")).unwrap();
    let vocabulary = dir.join("vocab.json");
    let tokenizer: Box<dyn Tokenizer> = if vocabulary.is_file() {
        Box::new(CharTokenizer::load(&vocabulary).unwrap())
    } else {
        Box::new(HfTokenizer::load(&dir.join("tokenizer.json")).unwrap())
    };
    (model, tokenizer)
}
