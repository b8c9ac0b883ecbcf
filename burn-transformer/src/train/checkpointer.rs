//! The checkpointer of a training run's records.
//!
//! burn-train saves three records after every epoch: the model, the optimizer
//! state (AdamW's moments and step count) and the learning-rate scheduler's step.
//! [`AtomicFileCheckpointer`] writes each as a burnpack file through a temporary
//! name and a rename, so a run killed mid-write keeps its previous checkpoint
//! intact, and reports what it wrote to the round's [`ManifestWriter`], which adds
//! the manifest `--resume` verifies (see [`super::manifest`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::train::checkpoint::{Checkpoint, Checkpointer, CheckpointerError};

use super::checkpoint::checkpoint_path;
use super::manifest::ManifestWriter;
use super::record_layout;
use crate::io::{FileError, read_bytes, write_atomically};

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
