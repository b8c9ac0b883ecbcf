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
//! Timings are never asserted anywhere: CI only builds the runner. The plots are the
//! library's line charts (`burn_transformer::plot`).

#[cfg(feature = "train")]
pub mod corpus;
pub mod machine;
pub mod measure;
pub mod record;
pub mod report;
pub mod suites;
