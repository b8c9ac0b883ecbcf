//! JSON files of a run (its history, manifests, vocabularies): read with an error
//! that names the file and what it should hold, written atomically.

use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::TrainError;
use crate::io::{read_text, write_atomically};

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
