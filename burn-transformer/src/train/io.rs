//! Small file helpers: every file the training programs write goes through a
//! temporary name and a rename, so an interrupted run never leaves a truncated file
//! where a good one was.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::TrainError;

/// The temporary name `path` is written under before the rename: same folder (a
/// rename within one file system is atomic), hidden, and unique per process.
pub fn temporary_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".into());
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

/// Runs `write` on a temporary file next to `path`, then renames it over `path`.
/// On failure the temporary file is removed and `path` is left as it was.
///
/// # Errors
/// The error of `write`, or [`TrainError::Io`] when the rename fails.
pub fn replace_atomically(
    path: &Path,
    write: impl FnOnce(&Path) -> Result<(), TrainError>,
) -> Result<(), TrainError> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|source| TrainError::Io {
            path: parent.to_path_buf(),
            source,
        })?;
    }
    let temporary = temporary_path(path);
    let result = write(&temporary).and_then(|()| {
        std::fs::rename(&temporary, path).map_err(|source| TrainError::Io {
            path: path.to_path_buf(),
            source,
        })
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    result
}

/// Writes `bytes` to `path` atomically (temporary file, flushed to disk, renamed).
///
/// # Errors
/// [`TrainError::Io`] naming the file.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), TrainError> {
    replace_atomically(path, |temporary| {
        let io = |source| TrainError::Io {
            path: temporary.to_path_buf(),
            source,
        };
        let mut file = std::fs::File::create(temporary).map_err(io)?;
        file.write_all(bytes).map_err(io)?;
        file.sync_all().map_err(io)
    })
}

/// Reads a UTF-8 text file.
///
/// # Errors
/// [`TrainError::NotFound`], [`TrainError::Io`] or [`TrainError::NotUtf8`], naming
/// the file.
pub fn read_text(path: &Path) -> Result<String, TrainError> {
    let bytes = read_bytes(path)?;
    String::from_utf8(bytes).map_err(|error| TrainError::NotUtf8 {
        path: path.to_path_buf(),
        valid_up_to: error.utf8_error().valid_up_to(),
    })
}

pub(crate) fn read_bytes(path: &Path) -> Result<Vec<u8>, TrainError> {
    std::fs::read(path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            TrainError::NotFound {
                path: path.to_path_buf(),
            }
        } else {
            TrainError::Io {
                path: path.to_path_buf(),
                source,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_write_keeps_the_old_file() {
        let dir = crate::train::tests::TempDir::new("io");
        let path = dir.path().join("out.txt");
        write_atomically(&path, b"good").unwrap();
        let failed = replace_atomically(&path, |temporary| {
            std::fs::write(temporary, b"trunc").unwrap();
            Err(TrainError::Training("interrupted".into()))
        });
        assert!(failed.is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"good");
        assert!(!temporary_path(&path).exists());
    }
}
