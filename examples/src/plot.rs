//! PNG plots of training curves with `plotters` (bitmap backend only).
//!
//! Text needs a font file: `plotters` is built without system font discovery (no
//! fontconfig/freetype), so the first TrueType font found in the usual system
//! folders is loaded at run time. Without one, the plot is drawn without labels.

use std::path::Path;
use std::sync::OnceLock;

use burn_transformer::train::History;
use plotters::prelude::*;

/// TrueType fonts tried, in order.
const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
    "/Library/Fonts/Arial.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "C:\\Windows\\Fonts\\arial.ttf",
];

/// Registers a system font as `sans-serif` once; whether text can be drawn.
fn fonts_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        FONT_CANDIDATES.iter().any(|candidate| {
            let Ok(bytes) = std::fs::read(candidate) else {
                return false;
            };
            // plotters keeps fonts for the whole process: leak the bytes once.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
        })
    })
}

/// Draws the training loss (per step, and its moving average) and the validation
/// loss of `history` into a PNG at `path`, written to a temporary file and renamed.
///
/// # Errors
/// A message naming the file.
pub fn plot_losses(history: &History, title: &str, path: &Path) -> Result<(), String> {
    crate::write_atomically(path, |temporary| draw(history, title, temporary))
}

fn draw(history: &History, title: &str, path: &Path) -> Result<(), String> {
    let failed = |error: &dyn std::fmt::Display| format!("{}: {error}", path.display());
    if history.train.is_empty() {
        return Err(failed(&"no training steps to plot"));
    }
    let text = fonts_available();
    let root = BitMapBackend::new(path, (1000, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| failed(&e))?;

    let last_step = history.train.last().map_or(1, |p| p.step).max(1) as f64;
    let losses = history
        .train
        .iter()
        .map(|p| p.loss)
        .chain(history.validation.iter().map(|p| p.loss))
        .filter(|l| l.is_finite());
    let (low, high) = losses.fold((f64::MAX, f64::MIN), |(lo, hi), l| (lo.min(l), hi.max(l)));
    let margin = ((high - low) * 0.05).max(1e-3);
    let y_range = (low - margin).max(0.0)..(high + margin);

    let mut builder = ChartBuilder::on(&root);
    builder.margin(20);
    if text {
        builder
            .caption(title, ("sans-serif", 24))
            .x_label_area_size(40)
            .y_label_area_size(60);
    }
    let mut chart = builder
        .build_cartesian_2d(0f64..last_step, y_range)
        .map_err(|e| failed(&e))?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc("step").y_desc("loss (nats/token)");
    } else {
        mesh.disable_x_axis().disable_y_axis();
    }
    mesh.draw().map_err(|e| failed(&e))?;

    let raw = RGBColor(160, 190, 230);
    let smooth = RGBColor(30, 90, 200);
    let valid = RGBColor(220, 60, 30);
    chart
        .draw_series(LineSeries::new(
            history.train.iter().map(|p| (p.step as f64, p.loss)),
            raw.stroke_width(1),
        ))
        .map_err(|e| failed(&e))?;
    // A moving average shows the trend through the per-batch noise.
    let window = (history.train.len() / 50).clamp(1, 100);
    let averaged: Vec<(f64, f64)> = history
        .train
        .windows(window)
        .map(|w| {
            let step = w[w.len() - 1].step as f64;
            (step, w.iter().map(|p| p.loss).sum::<f64>() / w.len() as f64)
        })
        .collect();
    let series = chart
        .draw_series(LineSeries::new(averaged, smooth.stroke_width(2)))
        .map_err(|e| failed(&e))?;
    if text {
        series
            .label(format!("train (mean of {window} steps)"))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], smooth.stroke_width(2))
            });
    }
    let points: Vec<(f64, f64)> = history
        .validation
        .iter()
        .map(|p| (p.step as f64, p.loss))
        .collect();
    let series = chart
        .draw_series(LineSeries::new(points.clone(), valid.stroke_width(2)))
        .map_err(|e| failed(&e))?;
    if text {
        series.label("validation").legend(move |(x, y)| {
            PathElement::new(vec![(x, y), (x + 20, y)], valid.stroke_width(2))
        });
    }
    chart
        .draw_series(
            points
                .into_iter()
                .map(|p| Circle::new(p, 4, valid.filled())),
        )
        .map_err(|e| failed(&e))?;
    if text {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| failed(&e))?;
    }
    root.present().map_err(|e| failed(&e))
}

/// One attention matrix to draw: `values` is `rows × cols`, row-major, each row a
/// query's probabilities over the keys.
pub struct Heatmap<'a> {
    /// The probabilities.
    pub values: &'a [f32],
    /// One label per query (row).
    pub row_labels: &'a [String],
    /// One label per key (column).
    pub col_labels: &'a [String],
    /// The caption.
    pub title: &'a str,
}

impl Heatmap<'_> {
    /// The matrix as text: one character per cell, darker for more attention.
    pub fn to_terminal(&self) -> String {
        const SHADES: [char; 10] = [' ', '.', ':', '-', '=', '+', '*', '#', '%', '@'];
        let cols = self.col_labels.len();
        let width = self.row_labels.iter().map(|l| l.len()).max().unwrap_or(0);
        let mut text = format!(
            "{}\n{:width$}  {}\n",
            self.title,
            "",
            self.col_labels.concat()
        );
        for (row, label) in self.row_labels.iter().enumerate() {
            let cells: String = self.values[row * cols..(row + 1) * cols]
                .iter()
                .map(|&p| SHADES[((p.clamp(0.0, 1.0) * 9.0).round()) as usize])
                .collect();
            text.push_str(&format!("{label:>width$} |{cells}|\n"));
        }
        text
    }

    /// Draws the matrix into a PNG at `path` (white = 0, dark blue = 1), written to a
    /// temporary file and renamed.
    ///
    /// # Errors
    /// A message naming the file.
    pub fn write_png(&self, path: &Path) -> Result<(), String> {
        crate::write_atomically(path, |temporary| self.draw(temporary))
    }

    fn draw(&self, path: &Path) -> Result<(), String> {
        let failed = |error: &dyn std::fmt::Display| format!("{}: {error}", path.display());
        let (rows, cols) = (self.row_labels.len(), self.col_labels.len());
        if rows == 0 || cols == 0 || self.values.len() != rows * cols {
            return Err(failed(&"the attention matrix is empty or misshapen"));
        }
        const CELL: u32 = 36;
        let (margin, title) = (40u32, 30u32);
        // Wide enough for the caption too (about 9 pixels a character at size 16).
        let width = (margin + CELL * cols as u32 + 10).max(9 * self.title.len() as u32 + 10);
        let size = (width, title + margin + CELL * rows as u32 + 10);
        let root = BitMapBackend::new(path, size).into_drawing_area();
        root.fill(&WHITE).map_err(|e| failed(&e))?;
        let text = fonts_available();
        if text {
            let style = ("sans-serif", 16).into_font();
            root.draw_text(self.title, &style.color(&BLACK), (5, 5))
                .map_err(|e| failed(&e))?;
        }
        let (x0, y0) = (margin as i32, (title + margin) as i32);
        for row in 0..rows {
            for col in 0..cols {
                let p = self.values[row * cols + col].clamp(0.0, 1.0) as f64;
                // From white to a dark blue.
                let shade = |full: f64| (255.0 - p * (255.0 - full)).round() as u8;
                let color = RGBColor(shade(20.0), shade(60.0), shade(140.0));
                let (x, y) = (
                    x0 + (col as i32) * CELL as i32,
                    y0 + (row as i32) * CELL as i32,
                );
                root.draw(&Rectangle::new(
                    [(x, y), (x + CELL as i32 - 1, y + CELL as i32 - 1)],
                    color.filled(),
                ))
                .map_err(|e| failed(&e))?;
            }
        }
        if text {
            let style = ("sans-serif", 14).into_font().color(&BLACK);
            for (col, label) in self.col_labels.iter().enumerate() {
                let x = x0 + (col as i32) * CELL as i32 + CELL as i32 / 3;
                root.draw_text(label, &style, (x, y0 - 20))
                    .map_err(|e| failed(&e))?;
            }
            for (row, label) in self.row_labels.iter().enumerate() {
                let y = y0 + (row as i32) * CELL as i32 + CELL as i32 / 3;
                root.draw_text(label, &style, (8, y))
                    .map_err(|e| failed(&e))?;
            }
        }
        root.present().map_err(|e| failed(&e))
    }
}
