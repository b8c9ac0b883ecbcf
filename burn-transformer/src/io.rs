//! Reading and writing files, with errors that name the file.
//!
//! Every file the library and its programs write (checkpoints, histories, run
//! settings, plots, benchmark results) goes through [`write_atomically`] or
//! [`write_atomically_with`]: the content is written to a temporary name in the same
//! folder, flushed to disk, then renamed over the target. A rename within one file
//! system is atomic, so an interrupted or failed write never leaves a truncated file
//! where a good one was; on failure the temporary file is removed.

use std::fmt::Display;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use thiserror::Error;

/// A file that could not be read or written.
#[derive(Debug, Error)]
pub enum FileError {
    /// The path does not exist.
    #[error("{}: no such file or directory", path.display())]
    NotFound {
        /// The path as given.
        path: PathBuf,
    },
    /// A file or folder could not be read.
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        /// The file or folder.
        path: PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// A file (or the folder it goes in) could not be written.
    #[error("{}: cannot write: {source}", path.display())]
    Write {
        /// The file or folder.
        path: PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// The writer given to [`write_atomically_with`] failed.
    #[error("{}: cannot write: {reason}", path.display())]
    Writer {
        /// The file that was to be written.
        path: PathBuf,
        /// The writer's message.
        reason: String,
    },
    /// A file read as text is not UTF-8.
    #[error("{}: not UTF-8 text (byte {valid_up_to} is not valid UTF-8)", path.display())]
    NotUtf8 {
        /// The file.
        path: PathBuf,
        /// Bytes before the first invalid one.
        valid_up_to: usize,
    },
    /// A file this library wrote does not hold what its manifest says.
    #[error("{}: {reason}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What does not match, and what to do.
        reason: String,
    },
}

/// Writes `bytes` to `path` atomically: to a temporary file in the same folder,
/// flushed to disk, then renamed over `path`. Missing parent folders are created.
///
/// # Errors
/// [`FileError::Write`] naming the file (or the folder that could not be created);
/// `path` is then left as it was.
pub fn write_atomically(path: &Path, bytes: impl AsRef<[u8]>) -> Result<(), FileError> {
    replace(path, |temporary| {
        let failed = |source| FileError::Write {
            path: temporary.to_path_buf(),
            source,
        };
        let mut file = std::fs::File::create(temporary).map_err(failed)?;
        file.write_all(bytes.as_ref()).map_err(failed)?;
        file.sync_all().map_err(failed)
    })
}

/// Runs `write` on a temporary path in the same folder as `path`, flushes what it
/// wrote to disk, then renames it over `path`: for writers that open the file
/// themselves (image encoders, safetensors). The temporary name keeps the extension
/// of `path` last, since such writers may pick the format from it.
///
/// # Errors
/// [`FileError::Writer`] with the message of `write`, or [`FileError::Write`] when
/// the result cannot be flushed or renamed; both name `path`, which is then left as
/// it was.
pub fn write_atomically_with<E: Display>(
    path: &Path,
    write: impl FnOnce(&Path) -> Result<(), E>,
) -> Result<(), FileError> {
    replace(path, |temporary| {
        let failed = |source| FileError::Write {
            path: path.to_path_buf(),
            source,
        };
        // The permissions of a file created here (the umask's). A writer may replace the
        // file with one of its own, private to its user (safetensors renames a 0600
        // temporary over it): the result gets these back.
        let permissions = std::fs::File::create(temporary)
            .and_then(|file| file.metadata())
            .map_err(failed)?
            .permissions();
        write(temporary).map_err(|error| FileError::Writer {
            path: path.to_path_buf(),
            reason: error.to_string(),
        })?;
        std::fs::set_permissions(temporary, permissions).map_err(failed)?;
        // The writer closed the file without flushing it to disk: do that before the
        // rename, or a crash could leave an empty file under the final name.
        std::fs::File::open(temporary)
            .and_then(|file| file.sync_all())
            .map_err(failed)
    })
}

/// Reads a file.
///
/// # Errors
/// [`FileError::NotFound`] or [`FileError::Read`], naming the file.
pub fn read_bytes(path: &Path) -> Result<Vec<u8>, FileError> {
    std::fs::read(path).map_err(|source| read_error(path, source))
}

/// Reads a UTF-8 text file.
///
/// # Errors
/// [`FileError::NotFound`], [`FileError::Read`] or [`FileError::NotUtf8`], naming the
/// file.
pub fn read_text(path: &Path) -> Result<String, FileError> {
    String::from_utf8(read_bytes(path)?).map_err(|error| FileError::NotUtf8 {
        path: path.to_path_buf(),
        valid_up_to: error.utf8_error().valid_up_to(),
    })
}

/// The error of reading `path`: [`FileError::NotFound`] when it does not exist.
pub(crate) fn read_error(path: &Path, source: std::io::Error) -> FileError {
    if source.kind() == std::io::ErrorKind::NotFound {
        FileError::NotFound {
            path: path.to_path_buf(),
        }
    } else {
        FileError::Read {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// The temporary name `path` is written under: in the same folder (a rename within
/// one file system is atomic), hidden, unique per process and call, and ending in
/// the extension of `path`.
fn temporary_path(path: &Path) -> Option<PathBuf> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let name = path.file_name()?.to_string_lossy();
    let unique = format!(
        ".{name}.tmp-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    Some(path.with_file_name(match path.extension() {
        Some(extension) => format!("{unique}.{}", extension.to_string_lossy()),
        None => unique,
    }))
}

/// The process that wrote the temporary file `name` (see [`temporary_path`]), if
/// `name` is one.
fn temporary_writer(name: &str) -> Option<u32> {
    let rest = name.strip_prefix('.')?;
    let (_, after) = rest.rsplit_once(".tmp-")?;
    after.split(['-', '.']).next()?.parse().ok()
}

/// Whether process `pid` is running: `/proc/<pid>` on Linux; elsewhere every writer
/// counts as running (its temporaries are then never removed).
fn is_running(pid: u32) -> bool {
    if cfg!(target_os = "linux") {
        Path::new("/proc").join(pid.to_string()).exists()
    } else {
        true
    }
}

/// Removes the temporary files in `dir` whose writer is no longer running (a process
/// killed while writing leaves its temporary behind), and returns them. A folder that
/// cannot be read has none.
pub fn remove_stale_temporaries(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let own = std::process::id();
    entries
        .filter_map(Result::ok)
        .filter(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            temporary_writer(&name).is_some_and(|pid| pid != own && !is_running(pid))
        })
        .map(|entry| entry.path())
        .filter(|path| path.is_file() && std::fs::remove_file(path).is_ok())
        .collect()
}

/// Runs `write` on a temporary path next to `path` and renames the result over
/// `path`; removes the temporary file on failure.
fn replace(
    path: &Path,
    write: impl FnOnce(&Path) -> Result<(), FileError>,
) -> Result<(), FileError> {
    let Some(temporary) = temporary_path(path) else {
        return Err(FileError::Write {
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file path"),
        });
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|source| FileError::Write {
            path: parent.to_path_buf(),
            source,
        })?;
    }
    let result = write(&temporary).and_then(|()| {
        std::fs::rename(&temporary, path).map_err(|source| FileError::Write {
            path: path.to_path_buf(),
            source,
        })
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    result
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A temporary folder removed when dropped (for the tests of every module).
    pub use tempfile::TempDir;

    /// Temporaries of processes that are gone are removed; this process's own, those
    /// of running processes and ordinary files stay.
    #[cfg(target_os = "linux")]
    #[test]
    fn stale_temporaries_of_dead_writers_are_removed() {
        let dir = TempDir::with_prefix("stale").unwrap();
        let target = dir.path().join("model-3.bpk");
        let own = temporary_path(&target).unwrap();
        let own_name = own.file_name().unwrap().to_string_lossy().into_owned();
        // A process id above the kernel's maximum (4194304) never runs.
        let dead = dir.path().join(".model-3.bpk.tmp-4194999-0.bpk");
        let running = dir.path().join(".history.json.tmp-1-0.json");
        for path in [&own, &dead, &running, &target] {
            std::fs::write(path, b"x").unwrap();
        }
        assert_eq!(temporary_writer(&own_name), Some(std::process::id()));
        let removed = remove_stale_temporaries(dir.path());
        assert_eq!(removed, vec![dead]);
        let mut left = names(dir.path());
        left.sort();
        let mut expected = vec![
            own_name,
            ".history.json.tmp-1-0.json".to_string(),
            "model-3.bpk".to_string(),
        ];
        expected.sort();
        assert_eq!(left, expected);
    }

    /// The names in `dir`, sorted.
    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn writes_replace_the_file_and_leave_nothing_else() {
        let dir = TempDir::with_prefix("io-write").unwrap();
        let path = dir.path().join("nested/out.txt");
        write_atomically(&path, "first").unwrap();
        write_atomically(&path, b"second").unwrap();
        assert_eq!(read_text(&path).unwrap(), "second");
        assert_eq!(names(&dir.path().join("nested")), vec!["out.txt"]);
    }

    #[test]
    fn a_failed_writer_keeps_the_old_file_and_names_the_target() {
        let dir = TempDir::with_prefix("io-failed").unwrap();
        let path = dir.path().join("plot.png");
        write_atomically(&path, b"good").unwrap();
        let mut seen = None;
        let error = write_atomically_with(&path, |temporary| {
            seen = Some(temporary.to_path_buf());
            std::fs::write(temporary, b"trunc").unwrap();
            Err("interrupted")
        })
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            format!("{}: cannot write: interrupted", path.display())
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"good");
        assert_eq!(names(dir.path()), vec!["plot.png"], "the temporary is gone");
        // The writer saw a hidden name in the same folder that ends in `.png`.
        let seen = seen.unwrap();
        assert_eq!(seen.parent(), path.parent());
        let name = seen.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with(".plot.png.tmp-") && name.ends_with(".png"),
            "{name}"
        );
    }

    #[test]
    fn a_writer_that_succeeds_is_renamed_into_place() {
        let dir = TempDir::with_prefix("io-with").unwrap();
        let path = dir.path().join("data");
        write_atomically_with(&path, |temporary| std::fs::write(temporary, b"bytes")).unwrap();
        assert_eq!(read_bytes(&path).unwrap(), b"bytes");
        assert_eq!(names(dir.path()), vec!["data"]);
    }

    /// Files written atomically get the permissions of any file the process creates
    /// (the umask's), not a temporary file's private 0600.
    #[cfg(unix)]
    #[test]
    fn written_files_get_the_usual_permissions() {
        use std::os::unix::fs::PermissionsExt;
        let dir = TempDir::with_prefix("io-mode").unwrap();
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        let plain = dir.path().join("plain");
        std::fs::File::create(&plain).unwrap();
        let direct = dir.path().join("direct");
        write_atomically(&direct, b"x").unwrap();
        let with = dir.path().join("with.safetensors");
        write_atomically_with(&with, |temporary| std::fs::write(temporary, b"y")).unwrap();
        // A writer that replaces the file with a private one of its own, as safetensors
        // does (a 0600 temporary renamed over it).
        let private = dir.path().join("private.safetensors");
        write_atomically_with(&private, |temporary| {
            use std::os::unix::fs::OpenOptionsExt;
            let own = temporary.with_extension("own");
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&own)?;
            std::fs::rename(own, temporary)
        })
        .unwrap();
        assert_eq!(mode(&direct), mode(&plain));
        assert_eq!(mode(&with), mode(&plain));
        assert_eq!(mode(&private), mode(&plain));
    }

    #[test]
    fn read_errors_name_the_file() {
        let dir = TempDir::with_prefix("io-read").unwrap();
        let missing = dir.path().join("missing.txt");
        assert_eq!(
            read_text(&missing).unwrap_err().to_string(),
            format!("{}: no such file or directory", missing.display())
        );
        let binary = dir.path().join("binary.dat");
        std::fs::write(&binary, [0x66, 0x6f, 0xff]).unwrap();
        assert_eq!(
            read_text(&binary).unwrap_err().to_string(),
            format!(
                "{}: not UTF-8 text (byte 2 is not valid UTF-8)",
                binary.display()
            )
        );
        let folder = read_text(dir.path()).unwrap_err();
        assert!(matches!(folder, FileError::Read { .. }), "{folder}");
    }
}
