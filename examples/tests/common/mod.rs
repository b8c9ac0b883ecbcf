//! Helpers shared by the program tests.

use std::path::Path;

/// `(step, loss)` points of a loss curve.
pub type Curve = Vec<(u64, f64)>;

/// The training and validation losses of a run's `history.json`.
pub fn losses(run: &Path) -> (Curve, Curve) {
    let text = std::fs::read_to_string(run.join("history.json")).unwrap();
    let history: serde_json::Value = serde_json::from_str(&text).unwrap();
    let points = |key: &str| {
        history[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["step"].as_u64().unwrap(), p["loss"].as_f64().unwrap()))
            .collect::<Vec<_>>()
    };
    (points("train"), points("validation"))
}
