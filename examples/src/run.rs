//! What the training programs share about their run folder (`--out`): `run.json`
//! (the settings `--resume` reads back), burn-train's run options, and the files
//! written at the end (the model and the loss curves).

use std::path::Path;

use burn::module::Module;
use burn_transformer::io::{read_text, write_atomically};
use burn_transformer::train::{History, RunOptions, clear_run, holds_run, save_module};
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
const OUTPUTS: [&str; 7] = [
    RUN_FILE,
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

/// burn-train's options for a run in `out`: progress lines every `log_every` steps
/// and burn-train's `experiment.log`.
pub fn options(out: &Path, resume: bool, overwrite: bool, log_every: usize) -> RunOptions {
    RunOptions {
        directory: out.to_path_buf(),
        resume,
        overwrite,
        verbose: true,
        log_every,
        experiment_log: true,
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
