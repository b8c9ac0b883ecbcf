//! The programs' pictures: loss curves (on the library's line charts) and attention
//! heatmaps, as PNG files written atomically.

use std::path::Path;

use burn_transformer::io::{FileError, write_atomically_with};
use burn_transformer::plot::{Colour, Legend, LinePlot, Series, fonts_available};
use burn_transformer::train::History;
use plotters::coord::Shift;
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

    /// Draws the matrix into a PNG at `path` (white = 0, dark blue = 1), with a colour
    /// bar that gives the scale.
    ///
    /// # Errors
    /// [`FileError`] naming the file.
    pub fn write_png(&self, path: &Path) -> Result<(), FileError> {
        write_atomically_with(path, |temporary| {
            let root = BitMapBackend::new(temporary, self.layout()?.size).into_drawing_area();
            self.render(&root)
        })
    }

    /// Where everything goes.
    fn layout(&self) -> Result<Layout, String> {
        let (rows, cols) = (self.row_labels.len(), self.col_labels.len());
        if rows == 0 || cols == 0 || self.values.len() != rows * cols {
            return Err("the attention matrix is empty or misshapen".into());
        }
        let (margin, title) = (40i32, 30i32);
        let matrix = (margin, title + margin);
        let bar_x = matrix.0 + CELL * cols as i32 + BAR_GAP;
        // The bar spans the matrix, but is never too short to read.
        let bar_height = (CELL * rows as i32).max(MIN_BAR_HEIGHT);
        let width = (bar_x + BAR_WIDTH + BAR_LABELS) as u32;
        // Wide enough for the caption too (about 9 pixels a character at size 16).
        let width = width.max(9 * self.title.len() as u32 + 10);
        let height = (matrix.1 + (CELL * rows as i32).max(bar_height) + 10) as u32;
        Ok(Layout {
            size: (width, height),
            matrix,
            bar: (bar_x, matrix.1, bar_height),
        })
    }

    /// Draws the matrix, its labels and the colour bar on `root`.
    fn render<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let layout = self.layout()?;
        let (rows, cols) = (self.row_labels.len(), self.col_labels.len());
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let text = fonts_available();
        if text {
            let style = ("sans-serif", 16).into_font();
            root.draw_text(self.title, &style.color(&BLACK), (5, 5))
                .map_err(|e| e.to_string())?;
        }
        let (x0, y0) = layout.matrix;
        for row in 0..rows {
            for col in 0..cols {
                let (x, y) = (x0 + col as i32 * CELL, y0 + row as i32 * CELL);
                root.draw(&Rectangle::new(
                    [(x, y), (x + CELL - 1, y + CELL - 1)],
                    shade(self.values[row * cols + col]).filled(),
                ))
                .map_err(|e| e.to_string())?;
            }
        }
        // The colour bar: probability 1 at the top, 0 at the bottom, framed.
        let (bar_x, bar_y, bar_height) = layout.bar;
        for offset in 0..bar_height {
            let p = 1.0 - offset as f32 / (bar_height - 1).max(1) as f32;
            // A filled rectangle covers its corners' rows and columns but the last.
            root.draw(&Rectangle::new(
                [
                    (bar_x, bar_y + offset),
                    (bar_x + BAR_WIDTH, bar_y + offset + 1),
                ],
                shade(p).filled(),
            ))
            .map_err(|e| e.to_string())?;
        }
        root.draw(&Rectangle::new(
            [
                (bar_x - 1, bar_y - 1),
                (bar_x + BAR_WIDTH, bar_y + bar_height),
            ],
            BLACK.stroke_width(1),
        ))
        .map_err(|e| e.to_string())?;
        if text {
            let style = ("sans-serif", 14).into_font().color(&BLACK);
            for (col, label) in self.col_labels.iter().enumerate() {
                let x = x0 + col as i32 * CELL + CELL / 3;
                root.draw_text(label, &style, (x, y0 - 20))
                    .map_err(|e| e.to_string())?;
            }
            for (row, label) in self.row_labels.iter().enumerate() {
                let y = y0 + row as i32 * CELL + CELL / 3;
                root.draw_text(label, &style, (8, y))
                    .map_err(|e| e.to_string())?;
            }
            for (p, label) in [(1.0, "1"), (0.5, "0.5"), (0.0, "0")] {
                let y = bar_y + ((1.0 - p) * (bar_height - 1) as f64) as i32 - 7;
                root.draw_text(label, &style, (bar_x + BAR_WIDTH + 6, y))
                    .map_err(|e| e.to_string())?;
            }
        }
        root.present().map_err(|e| e.to_string())
    }
}

/// Side of one cell of the matrix, in pixels.
const CELL: i32 = 36;
/// The colour bar: its width, the gap before it, the room for its labels, and the
/// least height it gets under a matrix of few rows.
const BAR_WIDTH: i32 = 16;
const BAR_GAP: i32 = 16;
const BAR_LABELS: i32 = 40;
const MIN_BAR_HEIGHT: i32 = 5 * CELL;

/// Where a heatmap's parts go: the image size, the matrix's upper-left corner, and the
/// colour bar's `(x, top, height)`.
struct Layout {
    size: (u32, u32),
    matrix: (i32, i32),
    bar: (i32, i32, i32),
}

/// The colour of probability `p`: from white (0) to a dark blue (1), the same for the
/// cells and the colour bar.
fn shade(p: f32) -> RGBColor {
    let p = f64::from(p.clamp(0.0, 1.0));
    let channel = |full: f64| (255.0 - p * (255.0 - full)).round() as u8;
    RGBColor(channel(20.0), channel(60.0), channel(140.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The colour bar runs from the colour of 1 at its top to the colour of 0 at its
    /// bottom, through the colour of 0.5 halfway, whatever the matrix's size.
    #[test]
    fn heatmaps_have_a_colour_bar_with_the_cells_scale() {
        for rows in [2, 9] {
            let labels: Vec<String> = (0..rows).map(|i| i.to_string()).collect();
            let values: Vec<f32> = (0..rows * rows).map(|i| (i % 3) as f32 / 2.0).collect();
            let heatmap = Heatmap {
                values: &values,
                row_labels: &labels,
                col_labels: &labels,
                title: "test",
            };
            let layout = heatmap.layout().unwrap();
            let (width, height) = layout.size;
            let mut pixels = vec![0u8; (width * height * 3) as usize];
            {
                let root = BitMapBackend::with_buffer(&mut pixels, layout.size).into_drawing_area();
                heatmap.render(&root).unwrap();
            }
            let pixel = |x: i32, y: i32| {
                let at = ((y as u32 * width + x as u32) * 3) as usize;
                RGBColor(pixels[at], pixels[at + 1], pixels[at + 2])
            };
            let (bar_x, top, bar_height) = layout.bar;
            let middle_x = bar_x + BAR_WIDTH / 2;
            assert!(bar_height >= MIN_BAR_HEIGHT);
            assert_eq!(pixel(middle_x, top), shade(1.0), "{rows} rows: top");
            assert_eq!(pixel(middle_x, top + bar_height - 1), shade(0.0), "bottom");
            let halfway = pixel(middle_x, top + (bar_height - 1) / 2);
            let expected = shade(0.5);
            assert!(
                (i32::from(halfway.0) - i32::from(expected.0)).abs() <= 2,
                "halfway {halfway:?} vs {expected:?}"
            );
            // A cell of probability 1 has the bar's top colour.
            let (x0, y0) = layout.matrix;
            let full = (0..rows * rows).position(|i| values[i] == 1.0).unwrap();
            let (row, col) = ((full / rows) as i32, (full % rows) as i32);
            assert_eq!(pixel(x0 + col * CELL + 3, y0 + row * CELL + 3), shade(1.0));
        }
    }
}
