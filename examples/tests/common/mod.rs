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

/// Makes `crashed` look like `straight` interrupted during its third round: the run's
/// `files` and only round 2's checkpoint records.
pub fn interrupted_copy(straight: &Path, crashed: &Path, files: &[&str]) {
    std::fs::create_dir_all(crashed.join("checkpoint")).unwrap();
    for name in files {
        std::fs::copy(straight.join(name), crashed.join(name)).unwrap();
    }
    for name in ["model", "optim", "scheduler"] {
        let file = format!("{name}-2.bpk");
        std::fs::copy(
            straight.join("checkpoint").join(&file),
            crashed.join("checkpoint").join(&file),
        )
        .unwrap();
    }
}
