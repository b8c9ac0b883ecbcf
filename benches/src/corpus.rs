//! The text the training benchmarks (`nanogpt`, `speculative`) train on.

use std::path::Path;

use burn_transformer::train::Corpus;

/// tiny-shakespeare, relative to the repository root (where the runner runs).
pub const SHAKESPEARE: &str = "../shared/data/tinyshakespeare.txt";

/// The corpus `data` names, else tiny-shakespeare where this machine has it, else
/// this checkout's own text (saying so on stderr, as `program`): the timings need a
/// corpus, not this one, so the benchmarks run on any clone. Also returns its name:
/// the path, `tinyshakespeare` or `this checkout's text`.
///
/// # Errors
/// A corpus that cannot be read, as a message.
pub fn load(data: Option<&Path>, program: &str) -> Result<(Corpus, String), String> {
    match data {
        Some(path) => Ok((
            Corpus::load(path).map_err(|e| e.to_string())?,
            path.display().to_string(),
        )),
        None if Path::new(SHAKESPEARE).is_file() => Ok((
            Corpus::load(Path::new(SHAKESPEARE)).map_err(|e| e.to_string())?,
            "tinyshakespeare".to_string(),
        )),
        None => {
            eprintln!(
                "{program}: {SHAKESPEARE} not found; training on this checkout's own text \
                 instead (pass --data FILE to choose the corpus)"
            );
            Ok((
                Corpus::repository_text().map_err(|e| e.to_string())?,
                "this checkout's text".to_string(),
            ))
        }
    }
}
