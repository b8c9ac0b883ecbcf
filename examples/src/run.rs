//! What the training programs share about their run folder (`--out`): `run.json`
//! (the settings `--resume` reads back, and the run's identity), what a resumed run
//! may change, burn-train's run options, and the files written at the end (the model
//! and the loss curves).

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn_transformer::io::{read_text, write_atomically};
use burn_transformer::train::{History, RunOptions, clear_run, holds_run, new_run_id, save_module};
use clap::ArgMatches;
use clap::parser::ValueSource;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::plot::plot_losses;

/// The settings of a run, in its folder.
pub const RUN_FILE: &str = "run.json";

/// Reads the settings a run saved in its folder `out` (for `--resume`).
///
/// # Errors
/// A message naming the file when it is missing or not such settings.
pub fn load_settings<T: DeserializeOwned>(out: &Path) -> Result<T, String> {
    let path = out.join(RUN_FILE);
    let text = read_text(&path)
        .map_err(|e| format!("--resume: {e} (is --out the folder of an earlier run?)"))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: not a run file: {e}", path.display()))
}

/// Writes the settings of a new run into its folder `out` (created if missing).
///
/// # Errors
/// A message naming the file.
pub fn save_settings<T: Serialize>(out: &Path, settings: &T) -> Result<(), String> {
    let json = serde_json::to_string_pretty(settings).map_err(|e| e.to_string())?;
    write_atomically(&out.join(RUN_FILE), json).map_err(|e| e.to_string())
}

/// What the programs write in a run folder besides training's own files.
const OUTPUTS: [&str; 11] = [
    RUN_FILE,
    crate::trained::BASE_CONFIG_FILE,
    crate::trained::BASE_EXTRA_FILES[0],
    crate::trained::BASE_EXTRA_FILES[1],
    crate::trained::BASE_EXTRA_FILES[2],
    "model.bpk",
    "model.json",
    "vocab.json",
    "tokenizer.json",
    "loss.png",
    "sample.txt",
];

/// Makes `out` ready for a new run before anything is written there: a folder that
/// holds a run is refused, or with `overwrite` cleared of the run's files (anything
/// else in it stays).
///
/// # Errors
/// A message saying how to resume or start over, or naming a file that could not be
/// removed.
pub fn start_new_run(out: &Path, overwrite: bool) -> Result<(), String> {
    if !(holds_run(out) || out.join(RUN_FILE).is_file()) {
        return Ok(());
    }
    if !overwrite {
        return Err(format!(
            "{} holds a run: --resume continues it, --overwrite starts over (removing \
             its checkpoints and outputs first)",
            out.display()
        ));
    }
    clear_run(out, &OUTPUTS).map_err(|e| e.to_string())
}

/// Records the run in `out` before training and returns its identity: a resumed run's
/// settings `resumed` are saved again (a new end is kept for the next resumption); a
/// new run gets a fresh identity ([`new_run_id`]), its folder made ready
/// ([`start_new_run`]) and the settings `new(identity)` saved.
///
/// # Errors
/// A message from [`start_new_run`] or [`save_settings`].
pub fn record_run<T: Serialize>(
    out: &Path,
    overwrite: bool,
    resumed: Option<(T, Option<String>)>,
    new: impl FnOnce(String) -> T,
) -> Result<Option<String>, String> {
    match resumed {
        Some((settings, run_id)) => {
            save_settings(out, &settings)?;
            Ok(run_id)
        }
        None => {
            start_new_run(out, overwrite)?;
            let run_id = new_run_id();
            save_settings(out, &new(run_id.clone()))?;
            Ok(Some(run_id))
        }
    }
}

/// The flags given on the command line of a resumed run whose values differ from the
/// run's saved ones, other than those in `free` (which a resumed run may change:
/// the device, what is printed or sampled at the end). `given` and `saved` are the
/// same flags struct, serialized with the flags' ids as field names.
///
/// # Errors
/// A message when the settings cannot be compared (a struct that does not serialize).
pub fn changed_flags<T: Serialize>(
    matches: &ArgMatches,
    given: &T,
    saved: &T,
    free: &[&str],
) -> Result<Vec<String>, String> {
    let to_json = |value: &T| serde_json::to_value(value).map_err(|e| e.to_string());
    let (given, saved) = (to_json(given)?, to_json(saved)?);
    let show = |value: Option<&serde_json::Value>| match value {
        None | Some(serde_json::Value::Null) => "its default".to_string(),
        Some(value) => value.to_string(),
    };
    Ok(matches
        .ids()
        .map(|id| id.as_str())
        .filter(|id| matches.value_source(id) == Some(ValueSource::CommandLine))
        .filter(|id| !free.contains(id))
        .filter(|id| given.get(id) != saved.get(id))
        .map(|id| {
            format!(
                "--{}: the run has {}, given {}",
                id.replace('_', "-"),
                show(saved.get(id)),
                show(given.get(id))
            )
        })
        .collect())
}

/// The error of a resumed run given settings it cannot change.
pub fn refuse_changes(out: &Path, changes: &[String]) -> Result<(), String> {
    if changes.is_empty() {
        return Ok(());
    }
    Err(format!(
        "--resume continues the run in {} with its own settings; these differ: {}. Leave \
         them out to resume, or start a new run (another --out, or --overwrite)",
        out.display(),
        changes.join("; ")
    ))
}

/// `path` made absolute (against the current folder), so that a run resumed from
/// another folder finds the same file.
///
/// # Errors
/// A message naming the path when the current folder cannot be read.
pub fn absolute(path: &Path) -> Result<PathBuf, String> {
    std::path::absolute(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// burn-train's options for the run `run_id` in `out`: progress lines every
/// `log_every` steps and burn-train's `experiment.log`.
pub fn options(
    out: &Path,
    run_id: Option<String>,
    resume: bool,
    overwrite: bool,
    log_every: usize,
) -> RunOptions {
    RunOptions {
        directory: out.to_path_buf(),
        resume,
        run_id,
        overwrite,
        verbose: true,
        log_every,
        experiment_log: true,
        extra_devices: Vec::new(),
    }
}

/// Saves the trained model as `out/model.bpk` and plots the losses into
/// `out/loss.png` (a plot that cannot be drawn is a warning, not a failure).
///
/// # Errors
/// A message naming the model file.
pub fn save_outputs<M: Module>(
    model: M,
    history: &History,
    out: &Path,
    title: &str,
) -> Result<(), String> {
    save_module(model, &out.join("model.bpk")).map_err(|e| e.to_string())?;
    let plot = out.join("loss.png");
    match plot_losses(history, title, &plot) {
        Ok(()) => println!("loss curves: {}", plot.display()),
        Err(error) => eprintln!("warning: no plot: {error}"),
    }
    Ok(())
}
