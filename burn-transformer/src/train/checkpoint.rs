//! Checkpoint files: the records a run checkpoints and their names, and a module's
//! parameters saved and loaded as one burnpack file (written atomically; a record of
//! the older module layout loads under today's names).

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::store::ModuleRecord;

use super::{TrainError, record_layout};
use crate::io::{read_bytes, write_atomically};

/// The records burn-train checkpoints, by file-name prefix.
pub const CHECKPOINT_RECORDS: [&str; 3] = ["model", "optim", "scheduler"];

/// `<directory>/<name>-<epoch>.bpk`.
pub fn checkpoint_path(directory: &Path, name: &str, epoch: usize) -> PathBuf {
    directory.join(format!("{name}-{epoch}.bpk"))
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
