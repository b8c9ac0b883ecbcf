//! A stream of token ids that training windows are cut from: a vector in memory, or
//! the memory-mapped shard files of a prepared corpus (see
//! [`prepare_shards`](super::prepare_shards)), which may be larger than memory.
//!
//! A stream is one sequence of ids however it is stored: shards are consecutive pieces
//! of it, and a window may start in one shard and end in the next.

use std::fmt;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use crate::io::{FileError, read_error};

/// Bytes per stored id of a shard file: little-endian `u16` or `u32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenWidth {
    U16,
    U32,
}

impl TokenWidth {
    /// The narrowest width that holds ids below `vocab_size`.
    pub(crate) fn for_vocabulary(vocab_size: usize) -> Self {
        if vocab_size <= 1 << 16 {
            Self::U16
        } else {
            Self::U32
        }
    }

    pub(crate) fn bytes(self) -> usize {
        match self {
            Self::U16 => 2,
            Self::U32 => 4,
        }
    }

    /// `u16` or `u32`, as the manifest names it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::U16 => "u16",
            Self::U32 => "u32",
        }
    }

    pub(crate) fn from_name(name: &str) -> Option<Self> {
        match name {
            "u16" => Some(Self::U16),
            "u32" => Some(Self::U32),
            _ => None,
        }
    }

    /// Appends the little-endian bytes of `tokens`.
    pub(crate) fn encode(self, tokens: &[u32], out: &mut Vec<u8>) {
        for &token in tokens {
            match self {
                Self::U16 => out.extend_from_slice(&(token as u16).to_le_bytes()),
                Self::U32 => out.extend_from_slice(&token.to_le_bytes()),
            }
        }
    }

    fn decode(self, bytes: &[u8], out: &mut impl Extend<u32>) {
        match self {
            Self::U16 => out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|b| u32::from(u16::from_le_bytes([b[0], b[1]]))),
            ),
            Self::U32 => out.extend(
                bytes
                    .chunks_exact(4)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            ),
        }
    }
}

/// One shard file, mapped read-only.
struct MappedShard {
    map: memmap2::Mmap,
    /// Position of its first id in the stream.
    first: usize,
    len: usize,
}

enum Store {
    Memory(Vec<u32>),
    Shards {
        shards: Vec<MappedShard>,
        width: TokenWidth,
        /// The largest id of the whole stream, recorded when it was prepared.
        max_id: u32,
    },
}

/// A cheaply cloned view of a range of a token stream.
#[derive(Clone)]
pub struct Tokens {
    store: Arc<Store>,
    range: Range<usize>,
}

impl fmt::Debug for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &*self.store {
            Store::Memory(_) => "memory".to_string(),
            Store::Shards { shards, width, .. } => {
                format!("{} {} shards", shards.len(), width.name())
            }
        };
        f.debug_struct("Tokens")
            .field("store", &kind)
            .field("range", &self.range)
            .finish()
    }
}

impl From<Vec<u32>> for Tokens {
    fn from(tokens: Vec<u32>) -> Self {
        let range = 0..tokens.len();
        Self {
            store: Arc::new(Store::Memory(tokens)),
            range,
        }
    }
}

impl Tokens {
    /// Maps shard files holding `(path, ids)` each, in stream order, as one stream.
    /// `max_id` is the largest id they hold, as recorded when they were written.
    ///
    /// # Errors
    /// [`FileError::NotFound`] or [`FileError::Read`] for a file that cannot be opened
    /// or mapped, [`FileError::Corrupt`] when a file's size is not `ids · width`.
    pub(crate) fn map_shards(
        files: &[(std::path::PathBuf, usize)],
        width: TokenWidth,
        max_id: u32,
    ) -> Result<Self, FileError> {
        let mut shards = Vec::with_capacity(files.len());
        let mut first = 0;
        for (path, len) in files {
            let map = map_file(path)?;
            if map.len() != len * width.bytes() {
                return Err(FileError::Corrupt {
                    path: path.clone(),
                    reason: format!(
                        "{} bytes where the manifest records {len} {} ids ({} bytes): the \
                         file was changed or cut; prepare the corpus again",
                        map.len(),
                        width.name(),
                        len * width.bytes()
                    ),
                });
            }
            shards.push(MappedShard {
                map,
                first,
                len: *len,
            });
            first += len;
        }
        Ok(Self {
            store: Arc::new(Store::Shards {
                shards,
                width,
                max_id,
            }),
            range: 0..first,
        })
    }

    /// Number of ids.
    pub fn len(&self) -> usize {
        self.range.len()
    }

    /// Whether there are no ids.
    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }

    /// The ids before position `at` and those from it on.
    ///
    /// # Panics
    /// If `at > len`.
    pub fn split_at(&self, at: usize) -> (Self, Self) {
        assert!(at <= self.len(), "split at {at} of {} ids", self.len());
        let middle = self.range.start + at;
        (
            Self {
                store: self.store.clone(),
                range: self.range.start..middle,
            },
            Self {
                store: self.store.clone(),
                range: middle..self.range.end,
            },
        )
    }

    /// Appends the ids of positions `range` to `out`.
    ///
    /// # Panics
    /// If `range` reaches past the end.
    pub fn extend_into(&self, range: Range<usize>, out: &mut impl Extend<u32>) {
        assert!(
            range.start <= range.end && range.end <= self.len(),
            "ids {range:?} of a stream of {}",
            self.len()
        );
        let (start, end) = (self.range.start + range.start, self.range.start + range.end);
        match &*self.store {
            Store::Memory(tokens) => out.extend(tokens[start..end].iter().copied()),
            Store::Shards { shards, width, .. } => {
                // The last shard starting at or before `start`, then on across shards.
                let mut index = shards.partition_point(|shard| shard.first <= start) - 1;
                let mut at = start;
                while at < end {
                    let shard = &shards[index];
                    let from = at - shard.first;
                    let to = (end - shard.first).min(shard.len);
                    let bytes = width.bytes();
                    width.decode(&shard.map[from * bytes..to * bytes], out);
                    at = shard.first + to;
                    index += 1;
                }
            }
        }
    }

    /// The ids of positions `range`.
    ///
    /// # Panics
    /// If `range` reaches past the end.
    pub fn to_vec(&self, range: Range<usize>) -> Vec<u32> {
        let mut out = Vec::with_capacity(range.len());
        self.extend_into(range, &mut out);
        out
    }

    /// The largest id: of this range for a stream in memory; of the whole prepared
    /// stream (as its manifest records it) for shards, so that no shard is read.
    /// `None` for an empty stream in memory.
    pub fn max_id(&self) -> Option<u32> {
        match &*self.store {
            Store::Memory(tokens) => tokens[self.range.clone()].iter().copied().max(),
            Store::Shards { max_id, .. } => Some(*max_id),
        }
    }
}

/// Maps `path` read-only.
fn map_file(path: &Path) -> Result<memmap2::Mmap, FileError> {
    let file = std::fs::File::open(path).map_err(|source| read_error(path, source))?;
    // SAFETY: the map is read-only and private to this process. Shard files are written
    // once under a temporary name and renamed into place, never modified afterwards by
    // this library; a user who truncates one while a run maps it gets a SIGBUS, as
    // with any memory-mapped data (the docs say not to edit prepared shards).
    unsafe { memmap2::Mmap::map(&file) }.map_err(|source| read_error(path, source))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::tests::TempDir;

    #[test]
    fn windows_across_shard_boundaries_read_the_stream_in_order() {
        let dir = TempDir::with_prefix("tokens").unwrap();
        let ids: Vec<u32> = (0..50).map(|i| i * 1000 + 7).collect();
        for width in [TokenWidth::U16, TokenWidth::U32] {
            let mut files = Vec::new();
            for (index, part) in [&ids[..13], &ids[13..14], &ids[14..40], &ids[40..]]
                .iter()
                .enumerate()
            {
                let path = dir.path().join(format!("{}-{index}.bin", width.name()));
                let mut bytes = Vec::new();
                width.encode(part, &mut bytes);
                std::fs::write(&path, bytes).unwrap();
                files.push((path, part.len()));
            }
            let stream = Tokens::map_shards(&files, width, 49_007).unwrap();
            let memory = Tokens::from(ids.clone());
            assert_eq!(stream.len(), 50);
            for range in [0..50, 10..20, 12..15, 13..14, 39..41, 49..50, 5..5] {
                assert_eq!(stream.to_vec(range.clone()), ids[range.clone()].to_vec());
                assert_eq!(memory.to_vec(range.clone()), ids[range].to_vec());
            }
            let (head, tail) = stream.split_at(30);
            assert_eq!((head.len(), tail.len()), (30, 20));
            assert_eq!(tail.to_vec(0..3), ids[30..33].to_vec());
            assert_eq!(head.to_vec(10..16), ids[10..16].to_vec());
            assert_eq!(stream.max_id(), Some(49_007));
        }
        let (_, tail) = Tokens::from(vec![5, 9, 2, 3]).split_at(2);
        assert_eq!(tail.max_id(), Some(3));
    }

    #[test]
    fn a_shard_of_the_wrong_size_is_named() {
        let dir = TempDir::with_prefix("tokens-size").unwrap();
        let path = dir.path().join("cut.bin");
        std::fs::write(&path, [1u8, 0, 2]).unwrap();
        let error = Tokens::map_shards(&[(path, 2)], TokenWidth::U16, 2)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("cut.bin") && error.contains("3 bytes") && error.contains("prepare"),
            "{error}"
        );
    }
}
