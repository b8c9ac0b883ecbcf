//! Text corpora for language modelling: one UTF-8 file, or every UTF-8 file under a
//! folder, tokenized once and split into a training and a validation part.
//!
//! The split is the one nanoGPT uses: the first `1 - validation_fraction` of the
//! tokens train, the rest validates. It involves no randomness, so the same corpus
//! always splits the same way, and the validation text never overlaps a training
//! window.

use std::path::{Path, PathBuf};

use super::{Tokenizer, Tokens};
use crate::io::{FileError, read_bytes, read_error, read_text};
use crate::train::TrainError;

/// The text of a corpus and where it came from.
#[derive(Debug, Clone)]
pub struct Corpus {
    /// All files' text, in path order, separated by a newline where a file does not
    /// end with one.
    pub text: String,
    /// The files read, in order.
    pub files: Vec<PathBuf>,
    /// Files of a folder skipped because they are not UTF-8 text.
    pub skipped: usize,
}

impl Corpus {
    /// Reads a file, or every UTF-8 file under a folder (recursively, in path order,
    /// skipping hidden entries such as `.git` and files that are not UTF-8 text).
    ///
    /// # Errors
    /// - [`FileError::NotFound`] if `path` does not exist;
    /// - [`FileError::NotUtf8`] if a file given by name is not UTF-8;
    /// - [`TrainError::EmptyCorpus`] if no text was found (only whitespace counts
    ///   as empty too);
    /// - [`FileError::Read`] for unreadable files.
    pub fn load(path: &Path) -> Result<Self, TrainError> {
        let metadata = std::fs::metadata(path).map_err(|source| read_error(path, source))?;
        let mut corpus = Self {
            text: String::new(),
            files: Vec::new(),
            skipped: 0,
        };
        if metadata.is_dir() {
            let mut files = Vec::new();
            collect_files(path, &mut files)?;
            for file in files {
                match String::from_utf8(read_bytes(&file)?) {
                    Ok(text) => corpus.push(file, &text),
                    Err(_) => corpus.skipped += 1,
                }
            }
        } else {
            corpus.push(path.to_path_buf(), &read_text(path)?);
        }
        if corpus.text.trim().is_empty() {
            return Err(TrainError::EmptyCorpus {
                path: path.to_path_buf(),
                skipped: corpus.skipped,
            });
        }
        Ok(corpus)
    }

    /// The text of the repository this library was built from: its `README.md`, every
    /// UTF-8 file under `docs/` and the library's sources, in that order, each part
    /// separated by a newline. The example programs train on it when not given a
    /// corpus, so that they run in any clone without downloading data.
    ///
    /// The repository is found from the library's source folder, as it was when the
    /// library was compiled; where that folder is gone (a build shared between clones),
    /// from the package folder that `cargo run` or `cargo test` names at run time.
    ///
    /// # Errors
    /// [`FileError::NotFound`] naming the library's sources when none of the parts
    /// exists, and the errors of [`Corpus::load`] for a part that does.
    pub fn repository_text() -> Result<Self, TrainError> {
        let compiled = Path::new(env!("CARGO_MANIFEST_DIR"));
        let package = match std::env::var_os("CARGO_MANIFEST_DIR") {
            Some(running) if !compiled.exists() => PathBuf::from(running),
            _ => compiled.to_path_buf(),
        };
        let root = package.parent().map(Path::to_path_buf).unwrap_or_default();
        let mut corpus: Option<Self> = None;
        for part in ["README.md", "docs", "burn-transformer/src"] {
            let path = root.join(part);
            if !path.exists() {
                continue;
            }
            let loaded = Self::load(&path)?;
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
        corpus.ok_or_else(|| {
            FileError::NotFound {
                path: root.join("burn-transformer/src"),
            }
            .into()
        })
    }

    fn push(&mut self, file: PathBuf, text: &str) {
        if text.is_empty() {
            return;
        }
        if !self.text.is_empty() && !self.text.ends_with('\n') {
            self.text.push('\n');
        }
        self.text.push_str(text);
        self.files.push(file);
    }
}

/// Every regular file under `dir`, sorted by path, without hidden entries and
/// without following symbolic links to folders (no cycles).
pub(crate) fn collect_files(dir: &Path, files: &mut Vec<PathBuf>) -> Result<(), TrainError> {
    let io = |source| FileError::Read {
        path: dir.to_path_buf(),
        source,
    };
    let mut entries = std::fs::read_dir(dir)
        .map_err(io)?
        .map(|entry| entry.map(|entry| entry.path()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(io)?;
    entries.sort();
    for entry in entries {
        let hidden = entry
            .file_name()
            .is_some_and(|name| name.to_string_lossy().starts_with('.'));
        if hidden {
            continue;
        }
        let metadata = std::fs::symlink_metadata(&entry).map_err(|source| FileError::Read {
            path: entry.clone(),
            source,
        })?;
        if metadata.is_dir() {
            collect_files(&entry, files)?;
        } else if metadata.is_file() || (metadata.is_symlink() && entry.is_file()) {
            files.push(entry);
        }
    }
    Ok(())
}

/// A tokenized corpus split into training and validation tokens (in memory, or
/// mapped from a prepared folder: [`open_shards`](super::open_shards)).
#[derive(Debug, Clone)]
pub struct TokenSplit {
    /// The first part of the corpus.
    pub train: Tokens,
    /// The last part of the corpus.
    pub validation: Tokens,
}

impl TokenSplit {
    /// Tokenizes `text` and splits it: the first `1 - validation_fraction` of the
    /// tokens train, the rest validates (contiguous, no shuffling: deterministic).
    ///
    /// # Errors
    /// [`TrainError::InvalidSetting`] for a fraction outside `(0, 1)`, and the
    /// tokenizer's errors.
    pub fn new(
        text: &str,
        tokenizer: &dyn Tokenizer,
        validation_fraction: f64,
    ) -> Result<Self, TrainError> {
        Self::from_tokens(tokenizer.encode(text)?, validation_fraction)
    }

    /// Splits already tokenized text; see [`TokenSplit::new`].
    ///
    /// # Errors
    /// [`TrainError::InvalidSetting`] for a fraction outside `(0, 1)`.
    pub fn from_tokens(mut tokens: Vec<u32>, validation_fraction: f64) -> Result<Self, TrainError> {
        if !(validation_fraction > 0.0 && validation_fraction < 1.0) {
            return Err(TrainError::setting(
                "validation-fraction",
                format!("must be in (0, 1), got {validation_fraction}"),
            ));
        }
        let train_len = (tokens.len() as f64 * (1.0 - validation_fraction)) as usize;
        let validation = tokens.split_off(train_len);
        Ok(Self {
            train: tokens.into(),
            validation: validation.into(),
        })
    }

    /// The largest id of either part (see [`Tokens::max_id`]).
    pub fn max_id(&self) -> Option<u32> {
        self.train.max_id().max(self.validation.max_id())
    }

    /// Checks that both parts hold at least one window of `context + 1` tokens.
    ///
    /// # Errors
    /// [`TrainError::ContextTooLong`] naming the part that is too short.
    pub fn check_context(&self, context: usize) -> Result<(), TrainError> {
        for (split, tokens) in [("train", &self.train), ("validation", &self.validation)] {
            if tokens.len() < context + 1 {
                return Err(TrainError::ContextTooLong {
                    split,
                    tokens: tokens.len(),
                    context,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::tests::TempDir;
    use crate::train::CharTokenizer;

    #[test]
    fn split_is_deterministic_and_contiguous() {
        let text = "the quick brown fox jumps over the lazy dog. ".repeat(20);
        let tokenizer = CharTokenizer::from_text(&text).unwrap();
        let a = TokenSplit::new(&text, &tokenizer, 0.1).unwrap();
        let b = TokenSplit::new(&text, &tokenizer, 0.1).unwrap();
        let all = |tokens: &Tokens| tokens.to_vec(0..tokens.len());
        assert_eq!(all(&a.train), all(&b.train));
        assert_eq!(all(&a.validation), all(&b.validation));
        let n = text.chars().count();
        assert_eq!(a.train.len(), n * 9 / 10);
        assert_eq!(a.train.len() + a.validation.len(), n);
        // Training text is the head of the corpus, validation its tail.
        let tokens = tokenizer.encode(&text).unwrap();
        assert_eq!([all(&a.train), all(&a.validation)].concat(), tokens);
        assert!(TokenSplit::new(&text, &tokenizer, 1.0).is_err());
    }

    #[test]
    fn folders_are_read_in_path_order_skipping_binary_and_hidden_files() {
        let dir = TempDir::with_prefix("corpus").unwrap();
        std::fs::create_dir_all(dir.path().join("b")).unwrap();
        std::fs::create_dir_all(dir.path().join(".git")).unwrap();
        std::fs::write(dir.path().join("b/two.txt"), "two").unwrap();
        std::fs::write(dir.path().join("a.txt"), "one\n").unwrap();
        std::fs::write(dir.path().join("c.bin"), [0xff, 0xfe, 0x00]).unwrap();
        std::fs::write(dir.path().join(".git/HEAD"), "hidden").unwrap();
        let corpus = Corpus::load(dir.path()).unwrap();
        assert_eq!(corpus.text, "one\ntwo");
        assert_eq!(corpus.files.len(), 2);
        assert_eq!(corpus.skipped, 1);
    }

    #[test]
    fn bad_corpora_get_clear_messages() {
        let dir = TempDir::with_prefix("corpus-errors").unwrap();
        let missing = Corpus::load(&dir.path().join("missing.txt")).unwrap_err();
        assert!(missing.to_string().contains("no such file"), "{missing}");

        std::fs::write(dir.path().join("empty.txt"), "").unwrap();
        let empty = Corpus::load(&dir.path().join("empty.txt")).unwrap_err();
        assert!(empty.to_string().contains("the corpus is empty"), "{empty}");

        std::fs::write(dir.path().join("binary.dat"), [0x66, 0xff]).unwrap();
        let binary = Corpus::load(&dir.path().join("binary.dat")).unwrap_err();
        assert!(binary.to_string().contains("not UTF-8"), "{binary}");

        let tokenizer = CharTokenizer::from_text("abcdefghij").unwrap();
        let split = TokenSplit::new("abcdefghij", &tokenizer, 0.5).unwrap();
        let long = split.check_context(8).unwrap_err().to_string();
        assert!(
            long.contains("too few for a context of 8") && long.contains("train split"),
            "{long}"
        );
        assert!(split.check_context(4).is_ok());
    }

    #[test]
    fn repository_text_is_the_readme_then_the_docs_then_the_sources() {
        let corpus = Corpus::repository_text().unwrap();
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
        assert!(corpus.text.starts_with(&readme));
        assert_eq!(corpus.files[0], root.join("README.md"));
        let first_source = corpus
            .files
            .iter()
            .position(|file| file.starts_with(root.join("burn-transformer/src")))
            .unwrap();
        assert!(
            corpus.files[1..first_source]
                .iter()
                .all(|file| file.starts_with(root.join("docs")))
        );
        // This very file is part of it.
        let this_file = std::fs::read_to_string(root.join(file!())).unwrap();
        assert!(corpus.text.contains(&this_file));
    }
}
