//! Corpora larger than memory: a corpus is tokenized once into shard files of
//! little-endian `u16` (vocabularies up to 65 536 ids) or `u32` ids, which training
//! maps into memory and cuts windows from ([`Tokens`]).
//!
//! A prepared folder holds `shards.json` (the manifest: the source files, the
//! tokenizer, the shards in stream order and where the validation part starts) and
//! `tokens-00000.bin`, `tokens-00001.bin`, … The shards are consecutive pieces of one
//! stream, the corpus tokenized as [`Corpus::load`](super::Corpus::load) reads it (files
//! in path order, a newline between two files where the first does not end with one):
//! with the same tokenizer a prepared corpus trains exactly as the text in memory,
//! the first `1 − validation_fraction` of the ids training and the rest validating.
//!
//! Preparation reads the text in chunks of `chunk_bytes` cut after a newline, so
//! memory holds one chunk and one shard. After each shard the manifest records where
//! the text continues: an interrupted preparation, run again with the same settings,
//! carries on from the last shard written and produces the same files as one that
//! never stopped.

use std::io::{Read, Seek, SeekFrom};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::corpus::collect_files;
use super::tokens::{TokenWidth, Tokens};
use super::{TokenSplit, Tokenizer};
use crate::io::{FileError, read_error, remove_stale_temporaries, write_atomically};
use crate::train::TrainError;
use crate::train::json_file::{read_json, write_json};

/// The manifest of a prepared folder.
pub const SHARDS_MANIFEST: &str = "shards.json";
/// What the manifest's `format` field says.
const FORMAT: &str = "burn-transformer token shards";
const VERSION: u32 = 1;
/// Files a prepared folder may hold besides the manifest and the shards: the
/// tokenizer, which the preparing program saves there.
const TOKENIZER_FILES: [&str; 2] = ["tokenizer.json", "vocab.json"];

/// A source text file and its size when it was listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceFile {
    /// The file.
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
}

/// One shard file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardFile {
    /// The file's name in the folder.
    pub file: String,
    /// Ids it holds.
    pub tokens: usize,
}

/// Where an unfinished preparation continues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrepareCursor {
    /// The source file (index into the sources).
    pub source: usize,
    /// The byte of that file the next chunk starts at.
    pub offset: u64,
    /// Whether the text so far ends with a newline (a file that follows one that does
    /// not is preceded by one).
    pub ends_with_newline: bool,
    /// Whether any text was tokenized yet.
    pub started: bool,
}

/// What `shards.json` records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardManifest {
    /// `burn-transformer token shards`.
    pub format: String,
    /// The layout's version (1).
    pub version: u32,
    /// `u16` or `u32`: how each id is stored.
    pub dtype: String,
    /// The tokenizer's vocabulary size (the model's).
    pub vocab_size: usize,
    /// How the tokenizer is kept: `bytes`, or the file in the folder
    /// (`tokenizer.json`, `vocab.json`).
    pub tokenizer: String,
    /// The tokenizer's description, for logs.
    pub tokenizer_description: String,
    /// The fraction of the stream (its end) that validates.
    pub validation_fraction: f64,
    /// A shard is closed once it holds at least this many ids.
    pub shard_tokens: usize,
    /// Bytes of text tokenized at a time.
    pub chunk_bytes: usize,
    /// The text files, in stream order.
    pub sources: Vec<SourceFile>,
    /// The shards written, in stream order.
    pub shards: Vec<ShardFile>,
    /// Ids written so far.
    pub tokens: usize,
    /// The largest id written so far.
    pub max_id: u32,
    /// Ids of the training part (the stream's head); set when the preparation is
    /// complete.
    pub train_tokens: Option<usize>,
    /// Where an unfinished preparation continues; `None` once complete.
    pub cursor: Option<PrepareCursor>,
}

impl ShardManifest {
    /// Whether every source was tokenized.
    pub fn is_complete(&self) -> bool {
        self.train_tokens.is_some() && self.cursor.is_none()
    }

    /// Whether `other` describes a preparation of the same data with the same
    /// settings (which an unfinished one may continue).
    fn same_preparation(&self, other: &Self) -> bool {
        self.dtype == other.dtype
            && self.vocab_size == other.vocab_size
            && self.tokenizer == other.tokenizer
            && self.tokenizer_description == other.tokenizer_description
            && self.validation_fraction == other.validation_fraction
            && self.shard_tokens == other.shard_tokens
            && self.chunk_bytes == other.chunk_bytes
            && self.sources == other.sources
    }
}

/// How to prepare a corpus.
#[derive(Debug, Clone)]
pub struct PrepareConfig {
    /// A shard is closed once it holds at least this many ids. Default: 2²⁶ (64 Mi
    /// ids, 128 MiB as `u16`).
    pub shard_tokens: usize,
    /// Bytes of text read and tokenized at a time (cut after the chunk's last
    /// newline). Default: 1 MiB.
    pub chunk_bytes: usize,
    /// The fraction of the stream (its end) that validates. Default: 0.1.
    pub validation_fraction: f64,
    /// How the tokenizer is kept: `bytes`, or the name of its file in the folder
    /// (`tokenizer.json`, `vocab.json`).
    pub tokenizer: String,
    /// The content of that file, written into the folder when the preparation starts.
    pub tokenizer_file: Option<Vec<u8>>,
    /// Prepare again over a complete preparation, or over an unfinished one of other
    /// data or settings (their shards are removed first).
    pub overwrite: bool,
}

impl PrepareConfig {
    /// The defaults, with the tokenizer kept as `tokenizer`.
    pub fn new(tokenizer: impl Into<String>) -> Self {
        Self {
            shard_tokens: 1 << 26,
            chunk_bytes: 1 << 20,
            validation_fraction: 0.1,
            tokenizer: tokenizer.into(),
            tokenizer_file: None,
            overwrite: false,
        }
    }
}

/// How far a preparation is, after each chunk.
#[derive(Debug, Clone, Copy)]
pub struct PrepareProgress {
    /// Bytes of text tokenized, of `bytes_total`.
    pub bytes_done: u64,
    /// Bytes of text in all sources.
    pub bytes_total: u64,
    /// Ids so far.
    pub tokens: usize,
    /// Shards written so far.
    pub shards: usize,
    /// Whether this report follows the writing of a shard (a point the preparation
    /// can be stopped at and continued from).
    pub shard_written: bool,
}

/// The UTF-8 text files of a corpus path, as [`Corpus::load`](super::Corpus::load)
/// reads them: the file itself, or every file under a folder in path order (hidden
/// entries left out), those that are not UTF-8 skipped. Files are checked a chunk at
/// a time, so none has to fit in memory.
///
/// # Errors
/// [`FileError::NotFound`] for a missing path, [`FileError::NotUtf8`] for a file
/// given by name that is not UTF-8, [`TrainError::EmptyCorpus`] when no file holds
/// text.
pub fn text_files(path: &Path) -> Result<Vec<SourceFile>, TrainError> {
    let metadata = std::fs::metadata(path).map_err(|source| read_error(path, source))?;
    let named = !metadata.is_dir();
    let candidates = if named {
        vec![path.to_path_buf()]
    } else {
        let mut files = Vec::new();
        collect_files(path, &mut files)?;
        files
    };
    let mut sources = Vec::new();
    let mut skipped = 0;
    for file in candidates {
        match utf8_prefix(&file)? {
            None => sources.push(SourceFile {
                bytes: std::fs::metadata(&file)
                    .map_err(|source| read_error(&file, source))?
                    .len(),
                path: file,
            }),
            Some(valid_up_to) if named => {
                return Err(FileError::NotUtf8 {
                    path: file,
                    valid_up_to,
                }
                .into());
            }
            Some(_) => skipped += 1,
        }
    }
    if sources.iter().all(|source| source.bytes == 0) {
        return Err(TrainError::EmptyCorpus {
            path: path.to_path_buf(),
            skipped,
        });
    }
    Ok(sources)
}

/// `None` for a UTF-8 file, else the number of bytes before its first invalid one.
fn utf8_prefix(path: &Path) -> Result<Option<usize>, TrainError> {
    let mut file = std::fs::File::open(path).map_err(|source| read_error(path, source))?;
    let mut buffer = vec![0u8; 1 << 20];
    let (mut carried, mut done) = (0, 0);
    loop {
        let read = file
            .read(&mut buffer[carried..])
            .map_err(|source| read_error(path, source))?;
        let filled = carried + read;
        match std::str::from_utf8(&buffer[..filled]) {
            Ok(_) if read == 0 => return Ok(None),
            Ok(_) => carried = 0,
            // A character cut by the buffer's end: carry its bytes over.
            Err(error) if error.error_len().is_none() && read > 0 => {
                let valid = error.valid_up_to();
                buffer.copy_within(valid..filled, 0);
                carried = filled - valid;
                done += valid;
                continue;
            }
            Err(error) => return Ok(Some(done + error.valid_up_to())),
        }
        done += filled;
    }
}

/// Tokenizes `sources` with `tokenizer` into shards in `out`, continuing an
/// unfinished preparation of the same sources and settings found there. `report` is
/// called after each chunk; returning `ControlFlow::Break` after a shard was written
/// stops the preparation there (it continues when called again).
///
/// Returns the manifest: complete, or not when `report` stopped it.
///
/// # Errors
/// - [`TrainError::InvalidSetting`] for sizes of 0, a validation fraction outside
///   `(0, 1)`, a folder that holds other files, a complete preparation (or an
///   unfinished one of other data) without `overwrite`;
/// - [`TrainError::Tokenizer`] for text the tokenizer cannot encode, or ids outside
///   its vocabulary;
/// - [`TrainError::File`] naming a file that cannot be read or written, or a source
///   that changed since it was listed.
pub fn prepare_shards(
    sources: &[SourceFile],
    tokenizer: &dyn Tokenizer,
    out: &Path,
    config: &PrepareConfig,
    mut report: impl FnMut(&PrepareProgress) -> ControlFlow<()>,
) -> Result<ShardManifest, TrainError> {
    if config.shard_tokens == 0 || config.chunk_bytes == 0 {
        return Err(TrainError::setting(
            "shard-tokens",
            "shard and chunk sizes must be greater than 0",
        ));
    }
    if !(config.validation_fraction > 0.0 && config.validation_fraction < 1.0) {
        return Err(TrainError::setting(
            "validation-fraction",
            format!("must be in (0, 1), got {}", config.validation_fraction),
        ));
    }
    let vocab_size = tokenizer.vocab_size();
    let width = TokenWidth::for_vocabulary(vocab_size);
    let fresh = ShardManifest {
        format: FORMAT.into(),
        version: VERSION,
        dtype: width.name().into(),
        vocab_size,
        tokenizer: config.tokenizer.clone(),
        tokenizer_description: tokenizer.describe(),
        validation_fraction: config.validation_fraction,
        shard_tokens: config.shard_tokens,
        chunk_bytes: config.chunk_bytes,
        sources: sources.to_vec(),
        shards: Vec::new(),
        tokens: 0,
        max_id: 0,
        train_tokens: None,
        cursor: Some(PrepareCursor {
            source: 0,
            offset: 0,
            ends_with_newline: false,
            started: false,
        }),
    };
    if let Some(file) = &config.tokenizer_file
        && !TOKENIZER_FILES.contains(&config.tokenizer.as_str())
    {
        return Err(TrainError::setting(
            "tokenizer",
            format!(
                "a tokenizer file is kept as one of {TOKENIZER_FILES:?}, not `{}` ({} bytes)",
                config.tokenizer,
                file.len()
            ),
        ));
    }
    let mut manifest = start_or_continue(out, fresh, config.overwrite)?;
    if let Some(file) = &config.tokenizer_file {
        write_atomically(&out.join(&config.tokenizer), file)?;
    }
    let Some(mut cursor) = manifest.cursor else {
        return Ok(manifest);
    };
    let bytes_total: u64 = sources.iter().map(|source| source.bytes).sum();
    let mut shard: Vec<u32> = Vec::new();
    let mut buffer = Vec::with_capacity(config.chunk_bytes);
    while cursor.source < sources.len() {
        let source = &sources[cursor.source];
        if cursor.offset == 0 && source.bytes > 0 && cursor.started && !cursor.ends_with_newline {
            shard.extend(tokenizer.encode("\n")?);
            cursor.ends_with_newline = true;
        }
        let mut file =
            std::fs::File::open(&source.path).map_err(|e| read_error(&source.path, e))?;
        while cursor.offset < source.bytes {
            let chunk = read_chunk(
                &mut file,
                source,
                cursor.offset,
                config.chunk_bytes,
                &mut buffer,
            )?;
            let ids = tokenizer.encode(chunk)?;
            if let Some(&max) = ids.iter().max() {
                if max as usize >= vocab_size {
                    return Err(TrainError::Tokenizer(format!(
                        "id {max} from {} is outside the vocabulary of {vocab_size} ids",
                        source.path.display()
                    )));
                }
                manifest.max_id = manifest.max_id.max(max);
            }
            cursor.ends_with_newline = chunk.ends_with('\n');
            cursor.started = true;
            cursor.offset += chunk.len() as u64;
            shard.extend(ids);
            let done = sources[..cursor.source]
                .iter()
                .map(|source| source.bytes)
                .sum::<u64>()
                + cursor.offset;
            let written = shard.len() >= config.shard_tokens;
            if written {
                // The cursor is stored past this file's end when the shard ends with
                // it; the loop below then moves on to the next file.
                write_shard(out, &mut manifest, width, &mut shard, Some(cursor))?;
            }
            let progress = PrepareProgress {
                bytes_done: done,
                bytes_total,
                tokens: manifest.tokens + shard.len(),
                shards: manifest.shards.len(),
                shard_written: written,
            };
            if report(&progress).is_break() && written {
                return Ok(manifest);
            }
        }
        cursor.source += 1;
        cursor.offset = 0;
    }
    if !shard.is_empty() {
        write_shard(out, &mut manifest, width, &mut shard, None)?;
    }
    let train_tokens = (manifest.tokens as f64 * (1.0 - config.validation_fraction)) as usize;
    manifest.train_tokens = Some(train_tokens);
    manifest.cursor = None;
    write_json(&out.join(SHARDS_MANIFEST), &manifest)?;
    Ok(manifest)
}

/// Checks the folder a preparation writes to before any work: it may be new or
/// empty, or hold a preparation (and nothing else). Returns the manifest of the
/// preparation it holds, if any.
///
/// # Errors
/// [`TrainError::InvalidSetting`] for a folder with other files, or a complete
/// preparation without `overwrite`; [`TrainError::Checkpoint`] for an unreadable
/// manifest.
pub fn check_prepare_folder(
    out: &Path,
    overwrite: bool,
) -> Result<Option<ShardManifest>, TrainError> {
    let manifest_path = out.join(SHARDS_MANIFEST);
    let existing: Option<ShardManifest> = manifest_path
        .is_file()
        .then(|| read_json(&manifest_path, "a shard manifest"))
        .transpose()?;
    if let Ok(entries) = std::fs::read_dir(out) {
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            let ours = name == SHARDS_MANIFEST
                || TOKENIZER_FILES.contains(&name.as_str())
                || (name.starts_with("tokens-") && name.ends_with(".bin"))
                || name.starts_with('.');
            if !ours {
                return Err(TrainError::setting(
                    "out",
                    format!(
                        "{} holds {name}, which is not part of a prepared corpus: give an \
                         empty or new folder",
                        out.display()
                    ),
                ));
            }
        }
    }
    match existing {
        Some(existing) if existing.is_complete() && !overwrite => Err(TrainError::setting(
            "out",
            format!(
                "{} already holds a prepared corpus ({} ids in {} shards): train on it \
                 with --data {0}, or prepare again with --overwrite",
                out.display(),
                existing.tokens,
                existing.shards.len()
            ),
        )),
        existing => Ok(existing),
    }
}

/// The manifest to continue from: `fresh` in an empty (or new) folder, or the
/// folder's unfinished preparation of the same data; `overwrite` clears a complete
/// or different one.
fn start_or_continue(
    out: &Path,
    fresh: ShardManifest,
    overwrite: bool,
) -> Result<ShardManifest, TrainError> {
    remove_stale_temporaries(out);
    let existing = check_prepare_folder(out, overwrite)?;
    // A shard written after the manifest was last saved (a kill between the two) is
    // written again.
    let listed: Vec<&str> = existing
        .iter()
        .flat_map(|manifest| manifest.shards.iter().map(|shard| shard.file.as_str()))
        .collect();
    if let Ok(entries) = std::fs::read_dir(out) {
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("tokens-") && !listed.contains(&name.as_str()) {
                remove(&entry.path())?;
            }
        }
    }
    let manifest_path = out.join(SHARDS_MANIFEST);
    match existing {
        Some(existing) if existing.same_preparation(&fresh) && !existing.is_complete() => {
            Ok(existing)
        }
        Some(_) if !overwrite => Err(TrainError::setting(
            "out",
            format!(
                "{} holds an unfinished preparation of other sources or settings: run it \
                 again with its own settings to finish it, or start over with --overwrite",
                out.display()
            ),
        )),
        Some(existing) => {
            for shard in &existing.shards {
                remove(&out.join(&shard.file))?;
            }
            write_json(&manifest_path, &fresh)?;
            Ok(fresh)
        }
        None => {
            write_json(&manifest_path, &fresh)?;
            Ok(fresh)
        }
    }
}

fn remove(path: &Path) -> Result<(), TrainError> {
    match std::fs::remove_file(path) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(FileError::Write {
            path: path.to_path_buf(),
            source: error,
        }
        .into()),
        _ => Ok(()),
    }
}

/// The text of `source` from byte `offset`: at most `chunk_bytes`, cut after the
/// last newline (or, in a chunk without one, after the last whole character), so that
/// where a chunk ends depends only on where it starts.
fn read_chunk<'a>(
    file: &mut std::fs::File,
    source: &SourceFile,
    offset: u64,
    chunk_bytes: usize,
    buffer: &'a mut Vec<u8>,
) -> Result<&'a str, TrainError> {
    let path = &source.path;
    let changed = || -> TrainError {
        FileError::Corrupt {
            path: path.clone(),
            reason: format!(
                "changed while it was being prepared (it had {} bytes): prepare again \
                 with --overwrite",
                source.bytes
            ),
        }
        .into()
    };
    file.seek(SeekFrom::Start(offset))
        .map_err(|e| read_error(path, e))?;
    let want = (chunk_bytes as u64).min(source.bytes - offset) as usize;
    buffer.clear();
    buffer.resize(want, 0);
    file.read_exact(buffer).map_err(|_| changed())?;
    let at_end = offset + want as u64 == source.bytes;
    let cut = if at_end {
        want
    } else {
        match buffer.iter().rposition(|&byte| byte == b'\n') {
            Some(newline) => newline + 1,
            None => match std::str::from_utf8(buffer) {
                Ok(_) => want,
                Err(error) => error.valid_up_to(),
            },
        }
    };
    if cut == 0 {
        return Err(changed());
    }
    std::str::from_utf8(&buffer[..cut]).map_err(|error| {
        FileError::NotUtf8 {
            path: path.clone(),
            valid_up_to: offset as usize + error.valid_up_to(),
        }
        .into()
    })
}

/// Writes the ids of `shard` as the next shard file, records it (and `cursor`) in the
/// manifest, and empties `shard`.
fn write_shard(
    out: &Path,
    manifest: &mut ShardManifest,
    width: TokenWidth,
    shard: &mut Vec<u32>,
    cursor: Option<PrepareCursor>,
) -> Result<(), TrainError> {
    let file = format!("tokens-{:05}.bin", manifest.shards.len());
    let mut bytes = Vec::with_capacity(shard.len() * width.bytes());
    width.encode(shard, &mut bytes);
    write_atomically(&out.join(&file), bytes)?;
    manifest.shards.push(ShardFile {
        file,
        tokens: shard.len(),
    });
    manifest.tokens += shard.len();
    manifest.cursor = cursor;
    shard.clear();
    write_json(&out.join(SHARDS_MANIFEST), manifest)
}

/// Whether `path` is a prepared folder (it holds a shard manifest).
pub fn is_prepared(path: &Path) -> bool {
    path.join(SHARDS_MANIFEST).is_file()
}

/// Opens a prepared folder: its manifest, and its stream mapped and split into the
/// training head and the validation tail.
///
/// # Errors
/// [`TrainError::Checkpoint`] for a missing or unreadable manifest, one of another
/// format, or an unfinished preparation; [`TrainError::File`] for a shard that is
/// missing or not of the size the manifest records.
pub fn open_shards(dir: &Path) -> Result<(ShardManifest, TokenSplit), TrainError> {
    let path = dir.join(SHARDS_MANIFEST);
    if !path.is_file() {
        return Err(FileError::NotFound { path }.into());
    }
    let manifest: ShardManifest = read_json(&path, "a shard manifest")?;
    let problem = |reason: String| TrainError::Checkpoint {
        path: path.clone(),
        reason,
    };
    if manifest.format != FORMAT || manifest.version != VERSION {
        return Err(problem(format!(
            "format `{}` version {}, not `{FORMAT}` version {VERSION}",
            manifest.format, manifest.version
        )));
    }
    let (Some(train_tokens), true) = (manifest.train_tokens, manifest.is_complete()) else {
        return Err(problem(format!(
            "an unfinished preparation ({} ids in {} shards so far): run the preparation \
             again with the same settings to finish it",
            manifest.tokens,
            manifest.shards.len()
        )));
    };
    let width = TokenWidth::from_name(&manifest.dtype)
        .ok_or_else(|| problem(format!("unknown dtype `{}`", manifest.dtype)))?;
    let files: Vec<(PathBuf, usize)> = manifest
        .shards
        .iter()
        .map(|shard| (dir.join(&shard.file), shard.tokens))
        .collect();
    let stream = Tokens::map_shards(&files, width, manifest.max_id)?;
    if stream.len() != manifest.tokens || train_tokens > stream.len() {
        return Err(problem(format!(
            "records {} ids but its shards hold {}",
            manifest.tokens,
            stream.len()
        )));
    }
    let (train, validation) = stream.split_at(train_tokens);
    Ok((manifest, TokenSplit { train, validation }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::tests::TempDir;
    use crate::train::{ByteTokenizer, CharTokenizer, Corpus};

    /// A folder of three text files (one without a final newline, one empty, one not
    /// UTF-8).
    fn corpus_folder(dir: &Path) {
        let line = |i: usize| format!("line {i}: naïve café, {} bags of wool.\n", i % 7);
        std::fs::create_dir_all(dir.join("b")).unwrap();
        std::fs::write(dir.join("a.txt"), (0..300).map(line).collect::<String>()).unwrap();
        std::fs::write(dir.join("b/c.txt"), "no newline at the end").unwrap();
        std::fs::write(dir.join("b/d.txt"), "").unwrap();
        std::fs::write(dir.join("b/e.bin"), [0x66, 0xff, 0x00]).unwrap();
        std::fs::write(dir.join("f.txt"), (300..500).map(line).collect::<String>()).unwrap();
    }

    fn config(tokenizer: &str) -> PrepareConfig {
        PrepareConfig {
            shard_tokens: 1000,
            chunk_bytes: 256,
            ..PrepareConfig::new(tokenizer)
        }
    }

    fn shard_bytes(dir: &Path) -> Vec<(String, Vec<u8>)> {
        let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.extension().is_some_and(|e| e == "bin"))
            .map(|path| {
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                (name, std::fs::read(&path).unwrap())
            })
            .collect();
        files.sort();
        files
    }

    #[test]
    fn prepared_shards_hold_the_corpus_as_memory_holds_it() {
        let dir = TempDir::with_prefix("shards").unwrap();
        let text_dir = dir.path().join("text");
        corpus_folder(&text_dir);
        let corpus = Corpus::load(&text_dir).unwrap();
        let sources = text_files(&text_dir).unwrap();
        assert_eq!(
            sources.len(),
            4,
            "the binary file is skipped, the empty one kept"
        );
        let chars = CharTokenizer::from_text(&corpus.text).unwrap();
        let tokenizers: [(&dyn Tokenizer, &str); 2] =
            [(&ByteTokenizer, "bytes"), (&chars, "vocab.json")];
        for (tokenizer, kept) in tokenizers {
            let out = dir.path().join(kept);
            let mut reports = 0;
            let manifest = prepare_shards(&sources, tokenizer, &out, &config(kept), |_| {
                reports += 1;
                ControlFlow::Continue(())
            })
            .unwrap();
            assert!(manifest.is_complete() && reports > 10);
            assert!(
                manifest.shards.len() > 10,
                "{} shards",
                manifest.shards.len()
            );
            let (_, split) = open_shards(&out).unwrap();
            let memory = TokenSplit::new(&corpus.text, tokenizer, 0.1).unwrap();
            assert_eq!(split.train.len(), memory.train.len());
            assert_eq!(
                split.train.to_vec(0..split.train.len()),
                memory.train.to_vec(0..memory.train.len())
            );
            assert_eq!(
                split.validation.to_vec(0..split.validation.len()),
                memory.validation.to_vec(0..memory.validation.len())
            );
            assert_eq!(
                split.train.max_id(),
                memory.train.max_id().max(memory.validation.max_id())
            );
        }
    }

    #[test]
    fn an_interrupted_preparation_continues_to_the_same_shards() {
        let dir = TempDir::with_prefix("shards-resume").unwrap();
        let text_dir = dir.path().join("text");
        corpus_folder(&text_dir);
        let sources = text_files(&text_dir).unwrap();
        let straight = dir.path().join("straight");
        prepare_shards(
            &sources,
            &ByteTokenizer,
            &straight,
            &config("bytes"),
            |_| ControlFlow::Continue(()),
        )
        .unwrap();

        let stopped = dir.path().join("stopped");
        let mut shards_seen = 0;
        let partial = prepare_shards(&sources, &ByteTokenizer, &stopped, &config("bytes"), |p| {
            shards_seen = p.shards;
            if p.shards == 5 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
        assert!(!partial.is_complete() && partial.shards.len() == 5 && shards_seen == 5);
        let unfinished = open_shards(&stopped).unwrap_err().to_string();
        assert!(unfinished.contains("unfinished"), "{unfinished}");
        // A shard written after the last manifest (a kill between the two) is redone.
        std::fs::write(stopped.join("tokens-00005.bin"), b"junk").unwrap();
        let finished = prepare_shards(&sources, &ByteTokenizer, &stopped, &config("bytes"), |_| {
            ControlFlow::Continue(())
        })
        .unwrap();
        assert!(finished.is_complete());
        assert_eq!(shard_bytes(&stopped), shard_bytes(&straight));
        assert_eq!(
            std::fs::read_to_string(stopped.join(SHARDS_MANIFEST)).unwrap(),
            std::fs::read_to_string(straight.join(SHARDS_MANIFEST)).unwrap()
        );
    }

    #[test]
    fn bad_folders_and_settings_are_refused_with_the_fix() {
        let dir = TempDir::with_prefix("shards-errors").unwrap();
        let text_dir = dir.path().join("text");
        corpus_folder(&text_dir);
        let sources = text_files(&text_dir).unwrap();
        let go = |_: &PrepareProgress| ControlFlow::Continue(());
        let out = dir.path().join("out");
        prepare_shards(&sources, &ByteTokenizer, &out, &config("bytes"), go).unwrap();
        let again = prepare_shards(&sources, &ByteTokenizer, &out, &config("bytes"), go)
            .unwrap_err()
            .to_string();
        assert!(
            again.contains("already holds") && again.contains("--overwrite"),
            "{again}"
        );
        let overwrite = PrepareConfig {
            overwrite: true,
            shard_tokens: 5000,
            ..config("bytes")
        };
        let redone = prepare_shards(&sources, &ByteTokenizer, &out, &overwrite, go).unwrap();
        assert_eq!(
            redone.shards.len(),
            shard_bytes(&out).len(),
            "old shards are gone"
        );

        let foreign = dir.path().join("foreign");
        std::fs::create_dir_all(&foreign).unwrap();
        std::fs::write(foreign.join("notes.md"), "mine").unwrap();
        let refused = prepare_shards(&sources, &ByteTokenizer, &foreign, &config("bytes"), go)
            .unwrap_err()
            .to_string();
        assert!(refused.contains("notes.md"), "{refused}");

        let binary = text_files(&text_dir.join("b/e.bin"))
            .unwrap_err()
            .to_string();
        assert!(binary.contains("not UTF-8"), "{binary}");
        let none = open_shards(&text_dir).unwrap_err().to_string();
        assert!(none.contains("shards.json"), "{none}");

        // A shard cut short is named when the folder is opened.
        let shard = out.join("tokens-00000.bin");
        let bytes = std::fs::read(&shard).unwrap();
        std::fs::write(&shard, &bytes[..bytes.len() - 2]).unwrap();
        let cut = open_shards(&out).unwrap_err().to_string();
        assert!(
            cut.contains("tokens-00000.bin") && cut.contains("prepare"),
            "{cut}"
        );
    }
}
