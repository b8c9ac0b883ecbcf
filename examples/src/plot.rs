//! The programs' pictures: loss curves (on the library's line charts) and attention
//! heatmaps, as PNG files written atomically.

use std::path::Path;

use burn_transformer::io::{FileError, write_atomically_with};
use burn_transformer::plot::{Colour, Legend, LinePlot, Series, fonts_available};
use burn_transformer::train::History;
use plotters::prelude::*;

/// Draws the training loss (per step, and its moving average) and the validation
/// loss of `history` into a PNG at `path`.
///
/// # Errors
/// [`FileError`] naming the file, also when there are no steps to draw.
pub fn plot_losses(history: &History, title: &str, path: &Path) -> Result<(), FileError> {
    let train: Vec<(f64, f64)> = history
        .train
        .iter()
        .map(|p| (p.step as f64, p.loss))
        .collect();
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
    let validation: Vec<(f64, f64)> = history
        .validation
        .iter()
        .map(|p| (p.step as f64, p.loss))
        .collect();
    LinePlot {
        title: title.into(),
        x_label: "step".into(),
        y_label: "loss (nats/token)".into(),
        log_log: false,
        legend: Legend::UpperRight,
        series: vec![
            Series {
                name: None,
                width: 1,
                markers: false,
                ..Series::new("", train, Colour(160, 190, 230))
            },
            Series {
                markers: false,
                ..Series::new(
                    format!("train (mean of {window} steps)"),
                    averaged,
                    Colour(30, 90, 200),
                )
            },
            Series::new("validation", validation, Colour(220, 60, 30)),
        ],
    }
    .write(path)
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

    /// Draws the matrix into a PNG at `path` (white = 0, dark blue = 1).
    ///
    /// # Errors
    /// [`FileError`] naming the file.
    pub fn write_png(&self, path: &Path) -> Result<(), FileError> {
        write_atomically_with(path, |temporary| self.draw(temporary))
    }

    fn draw(&self, path: &Path) -> Result<(), String> {
        let (rows, cols) = (self.row_labels.len(), self.col_labels.len());
        if rows == 0 || cols == 0 || self.values.len() != rows * cols {
            return Err("the attention matrix is empty or misshapen".into());
        }
        const CELL: u32 = 36;
        let (margin, title) = (40u32, 30u32);
        // Wide enough for the caption too (about 9 pixels a character at size 16).
        let width = (margin + CELL * cols as u32 + 10).max(9 * self.title.len() as u32 + 10);
        let size = (width, title + margin + CELL * rows as u32 + 10);
        let root = BitMapBackend::new(path, size).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let text = fonts_available();
        if text {
            let style = ("sans-serif", 16).into_font();
            root.draw_text(self.title, &style.color(&BLACK), (5, 5))
                .map_err(|e| e.to_string())?;
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
                .map_err(|e| e.to_string())?;
            }
        }
        if text {
            let style = ("sans-serif", 14).into_font().color(&BLACK);
            for (col, label) in self.col_labels.iter().enumerate() {
                let x = x0 + (col as i32) * CELL as i32 + CELL as i32 / 3;
                root.draw_text(label, &style, (x, y0 - 20))
                    .map_err(|e| e.to_string())?;
            }
            for (row, label) in self.row_labels.iter().enumerate() {
                let y = y0 + (row as i32) * CELL as i32 + CELL as i32 / 3;
                root.draw_text(label, &style, (8, y))
                    .map_err(|e| e.to_string())?;
            }
        }
        root.present().map_err(|e| e.to_string())
    }
}
