//! Helpers shared by the example programs.

pub mod device;

/// The global allocator of the example and benchmark programs (mimalloc; see the
/// comment in `examples/Cargo.toml`). Each program opts in with
/// `#[global_allocator] static ALLOCATOR: examples::Allocator = examples::Allocator;`.
pub use mimalloc::MiMalloc as Allocator;
pub mod hf_tokenizer;
pub mod plot;

use std::path::{Path, PathBuf};

use burn_transformer::train::{Corpus, TrainError};

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

/// This checkout's own text (the README, the docs and the library's sources): the
/// corpus programs train on when not given one, so that they run on any clone.
///
/// # Errors
/// When none of those files can be read.
pub fn checkout_corpus() -> Result<Corpus, TrainError> {
    let root = manifest_dir()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let mut corpus: Option<Corpus> = None;
    for part in ["README.md", "docs", "burn-transformer/src"] {
        let path = root.join(part);
        if !path.exists() {
            continue;
        }
        let loaded = Corpus::load(&path)?;
        corpus = Some(match corpus {
            None => loaded,
            Some(mut all) => {
                all.text.push('\n');
                all.text.push_str(&loaded.text);
                all.files.extend(loaded.files);
                all.skipped += loaded.skipped;
                all
            }
        });
    }
    corpus.ok_or_else(|| TrainError::NotFound {
        path: root.join("burn-transformer/src"),
    })
}

/// Writes `path` through a temporary file in the same directory, renamed over `path`
/// once `write` succeeded: an interrupted or failed run never leaves a truncated file
/// where a good one was.
///
/// # Errors
/// The message of `write`, or of the rename, naming the file.
pub fn write_atomically(
    path: &Path,
    write: impl FnOnce(&Path) -> Result<(), String>,
) -> Result<(), String> {
    let name = path
        .file_name()
        .ok_or_else(|| format!("{}: not a file path", path.display()))?
        .to_string_lossy()
        .into_owned();
    // Keep the extension last: encoders (PNG, …) pick the format from it.
    let temporary: PathBuf = match path.extension() {
        Some(extension) => path.with_file_name(format!(
            ".{name}.tmp-{}.{}",
            std::process::id(),
            extension.to_string_lossy()
        )),
        None => path.with_file_name(format!(".{name}.tmp-{}", std::process::id())),
    };
    let result = write(&temporary).and_then(|()| {
        std::fs::rename(&temporary, path).map_err(|error| {
            format!(
                "cannot move {} to {}: {error}",
                temporary.display(),
                path.display()
            )
        })
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    result
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
