//! Checkpoint manifests: what a resumed run checks before it trusts a checkpoint.
//!
//! After the model, optimizer and scheduler records of a round are on disk, a
//! manifest `manifest-<epoch>.json` is written beside them (last, atomically): the run
//! the checkpoint belongs to, the step it was taken after, and the size and SHA-256 of
//! each record file (the same digest `sha256sum` prints). A checkpoint is *intact*
//! when its manifest reads and every file matches it. `--resume` continues from the
//! newest intact checkpoint of its own run: a damaged newer one is skipped with a
//! warning, a checkpoint of another run is an error, and so is a folder with no
//! intact checkpoint, so no damaged file ever reaches burn-train's loader (which
//! panics on one) or, worse, loads as NaN weights.
//!
//! Checkpoints written without manifests (by older versions) still resume: their
//! three files must exist and parse as burnpack records, and a warning says they
//! could not be verified.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use burn::tensor::Bytes;
use burn::train::checkpoint::Checkpoint;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::TrainError;
use super::checkpoint::{CHECKPOINT_RECORDS, checkpoint_path};
use super::json_file::{read_json, write_json};
use crate::io::read_bytes;

/// The size and digest of one record file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileDigest {
    /// Length in bytes.
    pub bytes: u64,
    /// SHA-256 of the content, lowercase hex.
    pub sha256: String,
}

impl FileDigest {
    /// The digest of `content`.
    pub fn of(content: &[u8]) -> Self {
        let hash = Sha256::digest(content);
        Self {
            bytes: content.len() as u64,
            sha256: hash.iter().map(|byte| format!("{byte:02x}")).collect(),
        }
    }
}

/// What `manifest-<epoch>.json` holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointManifest {
    /// The identity of the run that wrote the checkpoint (see
    /// [`RunOptions::run_id`](super::RunOptions::run_id)); `None` for runs without one.
    pub run: Option<String>,
    /// burn-train's epoch: the round of training + validation that ended here.
    pub epoch: usize,
    /// Optimizer steps taken when the checkpoint was written.
    pub step: usize,
    /// The digest of each record file, by file name (`model-<epoch>.bpk`, …).
    pub files: BTreeMap<String, FileDigest>,
}

/// `<directory>/manifest-<epoch>.json`.
pub fn manifest_path(directory: &Path, epoch: usize) -> PathBuf {
    directory.join(format!("manifest-{epoch}.json"))
}

/// The record file names of `epoch`.
fn record_files(epoch: usize) -> impl Iterator<Item = String> {
    CHECKPOINT_RECORDS
        .iter()
        .map(move |name| format!("{name}-{epoch}.bpk"))
}

/// Collects the digests of the records a round writes (burn-train saves them from
/// separate threads, in any order) and writes the round's manifest once all three
/// are on disk.
#[derive(Debug)]
pub(crate) struct ManifestWriter {
    directory: PathBuf,
    run: Option<String>,
    /// The step after each epoch.
    steps: EpochSteps,
    pending: Mutex<BTreeMap<usize, BTreeMap<String, FileDigest>>>,
}

/// Which step each epoch ends at: epochs after `first_epoch` take `per_epoch` steps
/// each from `first_step`, up to `total`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EpochSteps {
    pub first_epoch: usize,
    pub first_step: usize,
    pub per_epoch: usize,
    pub total: usize,
}

impl EpochSteps {
    /// The step at the end of `epoch`.
    pub fn after(&self, epoch: usize) -> usize {
        let rounds = epoch.saturating_sub(self.first_epoch);
        (self.first_step + rounds * self.per_epoch).min(self.total)
    }
}

impl ManifestWriter {
    pub(crate) fn new(directory: &Path, run: Option<String>, steps: EpochSteps) -> Self {
        Self {
            directory: directory.to_path_buf(),
            run,
            steps,
            pending: Mutex::new(BTreeMap::new()),
        }
    }

    /// Notes that `file` of `epoch` was written with `content`; writes the manifest
    /// when it completes the round.
    pub(crate) fn written(
        &self,
        epoch: usize,
        file: String,
        content: &[u8],
    ) -> Result<(), TrainError> {
        let digest = FileDigest::of(content);
        let complete = {
            let mut pending = self
                .pending
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let files = pending.entry(epoch).or_default();
            files.insert(file, digest);
            if record_files(epoch).all(|name| files.contains_key(&name)) {
                pending.remove(&epoch)
            } else {
                None
            }
        };
        match complete {
            Some(files) => write_json(
                &manifest_path(&self.directory, epoch),
                &CheckpointManifest {
                    run: self.run.clone(),
                    epoch,
                    step: self.steps.after(epoch),
                    files,
                },
            ),
            None => Ok(()),
        }
    }

    /// Forgets `epoch` before its records are deleted: its manifest goes first, so a
    /// half-deleted checkpoint is never taken for an intact one.
    pub(crate) fn deleting(&self, epoch: usize) -> std::io::Result<()> {
        self.pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(&epoch);
        match std::fs::remove_file(manifest_path(&self.directory, epoch)) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error),
            _ => Ok(()),
        }
    }
}

/// The checkpoint a run resumes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumePoint {
    /// burn-train's epoch of the checkpoint.
    pub epoch: usize,
    /// The step it was taken after, when its manifest says so.
    pub step: Option<usize>,
    /// Why newer checkpoints were passed over, or that this one could not be verified
    /// (one line each, naming the file).
    pub warnings: Vec<String>,
}

/// Finds the newest intact checkpoint in `directory` (see the module documentation).
/// With `run` given, a manifest naming another run is an error.
///
/// # Errors
/// [`TrainError::OtherRun`] for a checkpoint of another run; [`TrainError::Checkpoint`]
/// naming every damaged checkpoint when none is intact.
pub fn find_resume_point(directory: &Path, run: Option<&str>) -> Result<ResumePoint, TrainError> {
    let mut epochs = checkpoint_epochs(directory);
    epochs.sort_unstable_by(|a, b| b.cmp(a));
    let has_manifests = epochs
        .iter()
        .any(|&epoch| manifest_path(directory, epoch).is_file());
    let mut warnings = Vec::new();
    for epoch in epochs {
        let manifest = manifest_path(directory, epoch);
        let verdict = if manifest.is_file() {
            verify(directory, epoch, run)?
        } else if has_manifests {
            // Records written, then stopped before the manifest: not a checkpoint.
            Err(format!(
                "checkpoint {epoch} has no {} (the run stopped while writing it)",
                manifest.display()
            ))
        } else {
            parse_unverified(directory, epoch).map(|()| {
                warnings.push(format!(
                    "{}: checkpoint {epoch} has no manifest, so its files are not verified \
                     (written by an older version)",
                    directory.display()
                ));
                None
            })
        };
        match verdict {
            Ok(step) => {
                return Ok(ResumePoint {
                    epoch,
                    step,
                    warnings,
                });
            }
            Err(reason) => warnings.push(reason),
        }
    }
    let reason = if warnings.is_empty() {
        "no checkpoint to resume from (the run has not finished its first round of \
         training + validation)"
            .to_string()
    } else {
        format!(
            "no intact checkpoint to resume from: {}; start over with --overwrite",
            warnings.join("; ")
        )
    };
    Err(TrainError::Checkpoint {
        path: directory.to_path_buf(),
        reason,
    })
}

/// Epochs with a manifest or a model record in `directory`.
fn checkpoint_epochs(directory: &Path) -> Vec<usize> {
    let Ok(entries) = std::fs::read_dir(directory) else {
        return Vec::new();
    };
    let mut epochs: Vec<usize> = entries
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().to_string_lossy().into_owned();
            let epoch = name
                .strip_prefix("manifest-")
                .and_then(|rest| rest.strip_suffix(".json"))
                .or_else(|| name.strip_prefix("model-")?.strip_suffix(".bpk"))?;
            epoch.parse().ok()
        })
        .collect();
    epochs.sort_unstable();
    epochs.dedup();
    epochs
}

/// Checks `epoch` against its manifest: `Ok(Ok(step))` when intact, `Ok(Err(why))`
/// when damaged.
///
/// # Errors
/// [`TrainError::OtherRun`] when the manifest names a run other than `run`.
fn verify(
    directory: &Path,
    epoch: usize,
    run: Option<&str>,
) -> Result<Result<Option<usize>, String>, TrainError> {
    let path = manifest_path(directory, epoch);
    let manifest: CheckpointManifest = match read_json(&path, "a checkpoint manifest") {
        Ok(manifest) => manifest,
        Err(error) => return Ok(Err(error.to_string())),
    };
    if let Some(expected) = run
        && manifest.run.as_deref() != Some(expected)
    {
        return Err(TrainError::OtherRun {
            checkpoint: path,
            run: expected.to_string(),
            found: manifest.run,
        });
    }
    if manifest.epoch != epoch {
        return Ok(Err(format!(
            "{}: names epoch {}, not {epoch}",
            path.display(),
            manifest.epoch
        )));
    }
    for name in record_files(epoch) {
        let file = directory.join(&name);
        let Some(expected) = manifest.files.get(&name) else {
            return Ok(Err(format!("{}: does not list {name}", path.display())));
        };
        let found = match read_bytes(&file) {
            Ok(content) => FileDigest::of(&content),
            Err(error) => return Ok(Err(error.to_string())),
        };
        if found.bytes != expected.bytes {
            return Ok(Err(format!(
                "{}: {} bytes, its manifest says {} (truncated or replaced)",
                file.display(),
                found.bytes,
                expected.bytes
            )));
        }
        if found.sha256 != expected.sha256 {
            return Ok(Err(format!(
                "{}: its content does not match its manifest's SHA-256 (damaged)",
                file.display()
            )));
        }
    }
    Ok(Ok(Some(manifest.step)))
}

/// Checks that the three records of `epoch` exist and parse as burnpack records.
fn parse_unverified(directory: &Path, epoch: usize) -> Result<(), String> {
    for name in CHECKPOINT_RECORDS {
        let path = checkpoint_path(directory, name, epoch);
        let content = read_bytes(&path).map_err(|error| error.to_string())?;
        let bytes = Bytes::from_bytes_vec(content);
        let parsed = match name {
            "model" => burn::store::ModuleRecord::checkpoint_from_bytes(bytes).map(drop),
            "optim" => burn::optim::OptimizerRecord::checkpoint_from_bytes(bytes).map(drop),
            _ => {
                burn::optim::lr_scheduler::LrSchedulerRecord::checkpoint_from_bytes(bytes).map(drop)
            }
        };
        parsed.map_err(|error| format!("{}: not a burnpack record: {error}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::tests::TempDir;
    use crate::io::write_atomically;

    const STEPS: EpochSteps = EpochSteps {
        first_epoch: 0,
        first_step: 0,
        per_epoch: 10,
        total: 25,
    };

    /// Writes the three records of `epoch` (distinct content per file and epoch)
    /// through a writer, in the order burn-train's threads might.
    fn write_round(writer: &ManifestWriter, directory: &Path, epoch: usize) {
        for name in ["scheduler", "model", "optim"] {
            let file = format!("{name}-{epoch}.bpk");
            let content = format!("{name} record of round {epoch}").repeat(epoch + 1);
            write_atomically(&directory.join(&file), &content).unwrap();
            writer.written(epoch, file, content.as_bytes()).unwrap();
        }
    }

    #[test]
    fn digests_are_sha256_as_sha256sum_prints_them() {
        // FIPS 180-2's test vector.
        assert_eq!(
            FileDigest::of(b"abc").sha256,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(FileDigest::of(b"abc").bytes, 3);
    }

    #[test]
    fn the_manifest_is_written_once_the_round_is_complete_with_its_step() {
        let dir = TempDir::new().unwrap();
        let writer = ManifestWriter::new(dir.path(), Some("run-a".into()), STEPS);
        writer
            .written(3, "model-3.bpk".into(), b"partial round")
            .unwrap();
        assert!(!manifest_path(dir.path(), 3).exists());
        write_round(&writer, dir.path(), 1);
        write_round(&writer, dir.path(), 3);
        let manifest: CheckpointManifest =
            read_json(&manifest_path(dir.path(), 3), "a manifest").unwrap();
        assert_eq!(manifest.run.as_deref(), Some("run-a"));
        // 3 rounds of 10 steps, capped at the run's 25.
        assert_eq!(manifest.step, 25);
        assert_eq!(
            manifest.files["optim-3.bpk"],
            FileDigest::of("optim record of round 3".repeat(4).as_bytes())
        );
        let point = find_resume_point(dir.path(), Some("run-a")).unwrap();
        assert_eq!((point.epoch, point.step), (3, Some(25)));
        assert!(point.warnings.is_empty(), "{:?}", point.warnings);
    }

    #[test]
    fn a_damaged_newest_checkpoint_falls_back_to_the_previous_with_a_warning() {
        let steps = EpochSteps {
            first_epoch: 2,
            first_step: 15,
            ..STEPS
        };
        let dir = TempDir::new().unwrap();
        let writer = ManifestWriter::new(dir.path(), None, steps);
        write_round(&writer, dir.path(), 3);
        write_round(&writer, dir.path(), 4);
        // Same length, one byte changed: only the digest can tell.
        let damaged = dir.path().join("optim-4.bpk");
        let mut content = std::fs::read(&damaged).unwrap();
        content[5] ^= 0x20;
        std::fs::write(&damaged, content).unwrap();
        let point = find_resume_point(dir.path(), None).unwrap();
        assert_eq!((point.epoch, point.step), (3, Some(25)));
        assert_eq!(point.warnings.len(), 1);
        assert!(
            point.warnings[0].contains("optim-4.bpk"),
            "{:?}",
            point.warnings
        );
        assert!(
            point.warnings[0].contains("SHA-256"),
            "{:?}",
            point.warnings
        );

        // Truncated too: nothing intact is left.
        let truncated = dir.path().join("model-3.bpk");
        let content = std::fs::read(&truncated).unwrap();
        std::fs::write(&truncated, &content[..content.len() / 2]).unwrap();
        let error = find_resume_point(dir.path(), None).unwrap_err().to_string();
        assert!(error.contains("no intact checkpoint"), "{error}");
        assert!(
            error.contains("model-3.bpk") && error.contains("truncated"),
            "{error}"
        );
        assert!(error.contains("--overwrite"), "{error}");
    }

    #[test]
    fn a_round_without_its_manifest_or_with_garbage_in_it_is_not_a_checkpoint() {
        let dir = TempDir::new().unwrap();
        let writer = ManifestWriter::new(dir.path(), None, STEPS);
        write_round(&writer, dir.path(), 1);
        write_round(&writer, dir.path(), 2);
        std::fs::remove_file(manifest_path(dir.path(), 2)).unwrap();
        assert_eq!(find_resume_point(dir.path(), None).unwrap().epoch, 1);
        std::fs::write(manifest_path(dir.path(), 1), "{ not json").unwrap();
        let error = find_resume_point(dir.path(), None).unwrap_err().to_string();
        assert!(error.contains("manifest-1.json"), "{error}");
    }

    #[test]
    fn a_checkpoint_of_another_run_is_refused() {
        let dir = TempDir::new().unwrap();
        let writer = ManifestWriter::new(dir.path(), Some("run-a".into()), STEPS);
        write_round(&writer, dir.path(), 1);
        let error = find_resume_point(dir.path(), Some("run-b")).unwrap_err();
        assert!(matches!(error, TrainError::OtherRun { .. }), "{error}");
        let message = error.to_string();
        assert!(
            message.contains("run-a") && message.contains("run-b"),
            "{message}"
        );
        // Without a run to check against, the same checkpoint is fine.
        assert_eq!(find_resume_point(dir.path(), None).unwrap().epoch, 1);
    }

    #[test]
    fn deleting_a_round_removes_its_manifest_first() {
        let dir = TempDir::new().unwrap();
        let writer = ManifestWriter::new(dir.path(), None, STEPS);
        write_round(&writer, dir.path(), 1);
        writer.deleting(1).unwrap();
        assert!(!manifest_path(dir.path(), 1).exists());
        // The records without their manifest are no checkpoint, and they are not
        // taken for unverified ones of an older version either once another round
        // has a manifest.
        write_round(&writer, dir.path(), 2);
        assert_eq!(find_resume_point(dir.path(), None).unwrap().epoch, 2);
    }

    #[test]
    fn an_empty_folder_says_there_is_no_checkpoint_yet() {
        let dir = TempDir::new().unwrap();
        let error = find_resume_point(&dir.path().join("checkpoint"), None)
            .unwrap_err()
            .to_string();
        assert!(error.contains("no checkpoint to resume from"), "{error}");
    }
}
