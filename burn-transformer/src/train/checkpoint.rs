//! Checkpoints of a training run.
//!
//! burn-train saves three records after every epoch: the model, the optimizer
//! state (AdamW's moments and step count) and the learning-rate scheduler's step.
//! [`AtomicFileCheckpointer`] writes each as a burnpack file through a temporary
//! name and a rename, so a run killed mid-write keeps its previous checkpoint
//! intact, and reports what it wrote to the round's [`ManifestWriter`], which adds
//! the manifest `--resume` verifies (see [`super::manifest`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::module::Module;
use burn::store::ModuleRecord;
use burn::train::checkpoint::{Checkpoint, Checkpointer, CheckpointerError};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::manifest::ManifestWriter;
use super::{TrainError, record_layout};
use crate::io::{FileError, read_bytes, read_text, write_atomically};

/// The records burn-train checkpoints, by file-name prefix.
pub const CHECKPOINT_RECORDS: [&str; 3] = ["model", "optim", "scheduler"];

/// Saves each epoch's record as `<directory>/<name>-<epoch>.bpk`, atomically, and
/// tells `manifests` what it wrote.
#[derive(Debug, Clone)]
pub(crate) struct AtomicFileCheckpointer {
    directory: PathBuf,
    name: String,
    manifests: Arc<ManifestWriter>,
}

impl AtomicFileCheckpointer {
    /// A checkpointer of records named `name` in `directory` (created if missing),
    /// sharing `manifests` with the other records of the run.
    pub(crate) fn new(
        directory: impl AsRef<Path>,
        name: &str,
        manifests: Arc<ManifestWriter>,
    ) -> Self {
        Self {
            directory: directory.as_ref().to_path_buf(),
            name: name.to_string(),
            manifests,
        }
    }

    /// The file of `epoch`.
    fn path_for(&self, epoch: usize) -> PathBuf {
        checkpoint_path(&self.directory, &self.name, epoch)
    }
}

/// `<directory>/<name>-<epoch>.bpk`.
pub fn checkpoint_path(directory: &Path, name: &str, epoch: usize) -> PathBuf {
    directory.join(format!("{name}-{epoch}.bpk"))
}

fn io_error(error: FileError) -> CheckpointerError {
    match error {
        FileError::Read { source, .. } | FileError::Write { source, .. } => {
            CheckpointerError::IOError(source)
        }
        other => CheckpointerError::Unknown(other.to_string()),
    }
}

impl<R: Checkpoint> Checkpointer<R> for AtomicFileCheckpointer {
    fn save(&self, epoch: usize, record: R) -> Result<(), CheckpointerError> {
        let bytes = record
            .checkpoint_into_bytes()
            .map_err(CheckpointerError::Record)?;
        write_atomically(&self.path_for(epoch), &bytes[..]).map_err(io_error)?;
        self.manifests
            .written(epoch, format!("{}-{epoch}.bpk", self.name), &bytes[..])
            .map_err(|error| CheckpointerError::Unknown(error.to_string()))
    }

    fn delete(&self, epoch: usize) -> Result<(), CheckpointerError> {
        self.manifests
            .deleting(epoch)
            .map_err(CheckpointerError::IOError)?;
        let path = self.path_for(epoch);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(CheckpointerError::IOError(error)),
        }
    }

    fn restore(&self, epoch: usize) -> Result<R, CheckpointerError> {
        let bytes = read_bytes(&self.path_for(epoch)).map_err(io_error)?;
        let bytes = burn::tensor::Bytes::from_bytes_vec(bytes);
        // A model record of the older module layout resumes under today's names.
        let bytes = match self.name.as_str() {
            "model" => record_layout::upgrade(&bytes).unwrap_or(bytes),
            _ => bytes,
        };
        R::checkpoint_from_bytes(bytes).map_err(CheckpointerError::Record)
    }
}

/// Saves a module's parameters as a burnpack file, atomically.
///
/// # Errors
/// [`TrainError::Checkpoint`] naming the file.
pub fn save_module<M: Module>(module: M, path: &Path) -> Result<(), TrainError> {
    let failed = |reason: String| TrainError::Checkpoint {
        path: path.to_path_buf(),
        reason,
    };
    let bytes = module
        .into_record()
        .into_bytes()
        .map_err(|error| failed(error.to_string()))?;
    Ok(write_atomically(path, &bytes[..])?)
}

/// Loads parameters saved by [`save_module`] (or a checkpoint) into `module`, which
/// must have the same structure. A record of the crate's older module layout loads
/// too: its parameters are renamed to today's paths.
///
/// # Errors
/// [`TrainError::File`] or [`TrainError::Checkpoint`] naming the file and what
/// did not match.
pub fn load_module<M: Module>(module: M, path: &Path) -> Result<M, TrainError> {
    let bytes = burn::tensor::Bytes::from_bytes_vec(read_bytes(path)?);
    let read = |bytes: burn::tensor::Bytes| {
        ModuleRecord::from_bytes(bytes).map_err(|error| TrainError::Checkpoint {
            path: path.to_path_buf(),
            reason: format!("not a burnpack module record: {error}"),
        })
    };
    let upgraded = record_layout::upgrade(&bytes);
    let record = read(bytes)?;
    match module.clone().try_load_record(record) {
        Ok(loaded) => Ok(loaded),
        Err(error) => {
            let upgraded = upgraded.map(read).transpose()?;
            match upgraded.map(|record| module.try_load_record(record)) {
                Some(Ok(loaded)) => Ok(loaded),
                _ => Err(TrainError::Checkpoint {
                    path: path.to_path_buf(),
                    reason: format!("does not fit the model: {error}"),
                }),
            }
        }
    }
}

/// Reads the JSON file `path` as a `T`; `what` names a `T` in the error (`a training
/// history`).
///
/// # Errors
/// [`TrainError::File`] when the file cannot be read, [`TrainError::Checkpoint`] when
/// it is not JSON of a `T`.
pub(crate) fn read_json<T: DeserializeOwned>(path: &Path, what: &str) -> Result<T, TrainError> {
    serde_json::from_str(&read_text(path)?).map_err(|error| TrainError::Checkpoint {
        path: path.to_path_buf(),
        reason: format!("not {what}: {error}"),
    })
}

/// Writes `value` as JSON to `path`, atomically.
///
/// # Errors
/// [`TrainError::File`] naming the file.
pub(crate) fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), TrainError> {
    let json = serde_json::to_string_pretty(value).map_err(|error| TrainError::Checkpoint {
        path: path.to_path_buf(),
        reason: error.to_string(),
    })?;
    Ok(write_atomically(path, json)?)
}
