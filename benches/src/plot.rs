//! PNG line plots (log-log where asked) with `plotters`' bitmap backend.
//!
//! `plotters` is built without system font discovery, so labels need a TrueType font
//! file: the first one found in the usual system folders is registered once. Without
//! one, plots are drawn without text.

use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;

/// TrueType fonts tried, in order.
const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/Library/Fonts/Arial.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "C:\\Windows\\Fonts\\arial.ttf",
];

/// Registers a system font as `sans-serif` once; whether text can be drawn.
pub fn fonts_available() -> bool {
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

/// One line of a plot.
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// `(x, y)` points, drawn in order.
    pub points: Vec<(f64, f64)>,
    /// Dashed instead of solid.
    pub dashed: bool,
    /// Index into the palette (series of one implementation share a colour).
    pub colour: usize,
}

/// What to draw.
#[derive(Clone, Debug)]
pub struct LinePlot {
    /// Title above the chart.
    pub title: String,
    /// X axis label.
    pub x_label: String,
    /// Y axis label.
    pub y_label: String,
    /// Logarithmic axes.
    pub log_log: bool,
    /// The lines.
    pub series: Vec<Series>,
}

const PALETTE: [RGBColor; 6] = [
    RGBColor(214, 39, 40),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

impl LinePlot {
    /// Draws the plot into a PNG at `path` (written to a temporary name, then renamed).
    ///
    /// # Errors
    /// A message naming the file, or saying there is nothing to draw.
    pub fn write(&self, path: &Path) -> Result<(), String> {
        examples::write_atomically(path, |temporary| self.draw(temporary))
    }

    fn draw(&self, path: &Path) -> Result<(), String> {
        let failed = |error: &dyn std::fmt::Display| format!("{}: {error}", path.display());
        let points: Vec<(f64, f64)> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().copied())
            .filter(|(x, y)| {
                x.is_finite() && y.is_finite() && (!self.log_log || (*x > 0.0 && *y > 0.0))
            })
            .collect();
        if points.is_empty() {
            return Err(failed(&"no points to plot"));
        }
        let (x_min, x_max, y_min, y_max) = points.iter().fold(
            (f64::MAX, f64::MIN, f64::MAX, f64::MIN),
            |(a, b, c, d), (x, y)| (a.min(*x), b.max(*x), c.min(*y), d.max(*y)),
        );
        let text = fonts_available();
        let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| failed(&e))?;
        let mut builder = ChartBuilder::on(&root);
        builder.margin(16);
        if text {
            builder
                .caption(&self.title, ("sans-serif", 22))
                .x_label_area_size(44)
                .y_label_area_size(72);
        }
        if self.log_log {
            let x_range = (x_min / 1.15)..(x_max * 1.15);
            let y_range = (y_min / 1.5)..(y_max * 1.5);
            let mut chart = builder
                .build_cartesian_2d(x_range.log_scale(), y_range.log_scale())
                .map_err(|e| failed(&e))?;
            if text {
                chart
                    .configure_mesh()
                    .x_desc(&self.x_label)
                    .y_desc(&self.y_label)
                    .x_label_formatter(&|x| format!("{x:.0}"))
                    .y_label_formatter(&|y| short_number(*y))
                    .draw()
                    .map_err(|e| failed(&e))?;
            } else {
                chart.configure_mesh().draw().map_err(|e| failed(&e))?;
            }
            self.draw_series(&mut chart, text).map_err(|e| failed(&e))?;
        } else {
            let pad = ((y_max - y_min) * 0.08).max(y_max.abs() * 0.05).max(1e-9);
            let mut chart = builder
                .build_cartesian_2d(x_min..x_max, (y_min - pad).min(0.0)..(y_max + pad))
                .map_err(|e| failed(&e))?;
            if text {
                chart
                    .configure_mesh()
                    .x_desc(&self.x_label)
                    .y_desc(&self.y_label)
                    .y_label_formatter(&|y| short_number(*y))
                    .draw()
                    .map_err(|e| failed(&e))?;
            } else {
                chart.configure_mesh().draw().map_err(|e| failed(&e))?;
            }
            self.draw_series(&mut chart, text).map_err(|e| failed(&e))?;
        }
        root.present().map_err(|e| failed(&e))?;
        Ok(())
    }

    fn draw_series<'a, DB, X, Y>(
        &self,
        chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
        text: bool,
    ) -> Result<(), String>
    where
        DB: DrawingBackend + 'a,
        X: plotters::coord::ranged1d::Ranged<ValueType = f64>,
        Y: plotters::coord::ranged1d::Ranged<ValueType = f64>,
    {
        for series in &self.series {
            let colour = PALETTE[series.colour % PALETTE.len()];
            let style = colour.stroke_width(2);
            let points = series.points.clone();
            let drawn = if series.dashed {
                chart.draw_series(DashedLineSeries::new(points.clone(), 8, 6, style))
            } else {
                chart.draw_series(LineSeries::new(points.clone(), style))
            }
            .map_err(|e| e.to_string())?;
            if text {
                drawn.label(series.name.clone()).legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
                });
            }
            chart
                .draw_series(points.iter().map(|&p| Circle::new(p, 3, colour.filled())))
                .map_err(|e| e.to_string())?;
        }
        if text {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .label_font(("sans-serif", 15))
                .draw()
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// `1.5k`, `2M`, `0.25`: axis labels that fit.
fn short_number(value: f64) -> String {
    let magnitude = value.abs();
    if magnitude >= 1e9 {
        format!("{:.3}G", value / 1e9)
    } else if magnitude >= 1e6 {
        format!("{:.3}M", value / 1e6)
    } else if magnitude >= 1e3 {
        format!("{:.3}k", value / 1e3)
    } else if magnitude >= 1.0 || magnitude == 0.0 {
        format!("{value:.3}")
    } else {
        format!("{value:.2e}")
    }
    .replace(".000", "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_log_log_png() {
        let path = std::env::temp_dir().join(format!("bench-plot-{}.png", std::process::id()));
        LinePlot {
            title: "test".into(),
            x_label: "seq".into(),
            y_label: "ms".into(),
            log_log: true,
            series: vec![Series {
                name: "quadratic".into(),
                points: vec![(256.0, 1.0), (512.0, 4.0), (1024.0, 16.0)],
                dashed: false,
                colour: 0,
            }],
        }
        .write(&path)
        .unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        let _ = std::fs::remove_file(path);
    }
}
