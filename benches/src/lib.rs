//! Cross-backend benchmarks of burn-transformer, and the report that `docs/` shows.
//!
//! The `bench` binary is the one runner: it runs every suite of [`suites`] on each
//! backend available on the machine, one job per child process, and writes JSON lines
//! ([`record::Record`], the format of DESIGN.md), Markdown tables and PNG plots into
//! `docs/benchmarks/`, plus the generated section of `docs/benchmarks.md`.
//!
//! ```text
//! cargo run --release -p benches --bin bench -- --quick   # about 5 minutes on 2 cores
//! cargo run --release -p benches --bin bench -- --full
//! ```
//!
//! Timings are never asserted anywhere: CI only builds the runner.

pub mod machine;
pub mod measure;
pub mod plot;
pub mod record;
pub mod report;
pub mod suites;

use std::path::Path;

/// Writes `text` to a temporary name next to `path`, then renames it into place: the
/// runner and the companion programs never leave a half-written result file.
///
/// # Errors
/// Why the file could not be written or moved, naming it.
pub fn write_text_atomically(path: &Path, text: &str) -> Result<(), String> {
    examples::write_atomically(path, |temporary| {
        std::fs::write(temporary, text)
            .map_err(|error| format!("cannot write {}: {error}", temporary.display()))
    })
}
