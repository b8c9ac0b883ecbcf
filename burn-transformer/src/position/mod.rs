//! TEMPORARY placeholder for compile checks (helper-2 writes the real one).
mod rope;
pub use rope::*;
