//! PNG line charts (feature `plot`): the loss curves of the training programs and
//! the plots of the benchmark report.
//!
//! Drawn with `plotters`' bitmap backend, built without system font discovery (no
//! fontconfig or freetype): text needs a TrueType file, and the first one found in
//! the usual system folders is registered once per process. Without one, charts are
//! drawn without text. Files are written atomically ([`crate::io`]).

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::ranged1d::{Ranged, ValueFormatter};
use plotters::prelude::*;

use crate::io::{FileError, write_atomically_with};

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

/// Registers a system font as `sans-serif` (once per process); whether text can be
/// drawn.
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

/// An RGB colour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Colour(pub u8, pub u8, pub u8);

impl Colour {
    /// The `index`-th colour of a palette of six that stay apart on white (wrapping).
    pub fn palette(index: usize) -> Self {
        const PALETTE: [Colour; 6] = [
            Colour(214, 39, 40),
            Colour(31, 119, 180),
            Colour(44, 160, 44),
            Colour(255, 127, 14),
            Colour(148, 103, 189),
            Colour(140, 86, 75),
        ];
        PALETTE[index % PALETTE.len()]
    }

    fn rgb(self) -> RGBColor {
        RGBColor(self.0, self.1, self.2)
    }
}

/// One line of a chart.
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend text; `None` leaves the line out of the legend.
    pub name: Option<String>,
    /// `(x, y)` points, drawn in order.
    pub points: Vec<(f64, f64)>,
    /// The line's colour.
    pub colour: Colour,
    /// Stroke width in pixels.
    pub width: u32,
    /// Dashed instead of solid.
    pub dashed: bool,
    /// A dot on every point.
    pub markers: bool,
}

impl Series {
    /// A solid, 2-pixel line with a dot on every point, in the legend as `name`.
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>, colour: Colour) -> Self {
        Self {
            name: Some(name.into()),
            points,
            colour,
            width: 2,
            dashed: false,
            markers: true,
        }
    }
}

/// Where the legend goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Legend {
    /// The upper left corner (curves that rise).
    UpperLeft,
    /// The upper right corner (curves that fall).
    UpperRight,
}

/// A line chart.
#[derive(Clone, Debug)]
pub struct LinePlot {
    /// Title above the chart.
    pub title: String,
    /// X axis label.
    pub x_label: String,
    /// Y axis label.
    pub y_label: String,
    /// Logarithmic axes (points with a non-positive coordinate are left out).
    pub log_log: bool,
    /// Where the legend goes.
    pub legend: Legend,
    /// The lines.
    pub series: Vec<Series>,
}

/// Width and height of every chart, in pixels.
const SIZE: (u32, u32) = (1000, 600);

impl LinePlot {
    /// Draws the chart into a PNG at `path`, atomically.
    ///
    /// # Errors
    /// [`FileError`] naming the file, also when there is nothing to draw.
    pub fn write(&self, path: &Path) -> Result<(), FileError> {
        write_atomically_with(path, |temporary| self.draw(temporary))
    }

    fn draw(&self, path: &Path) -> Result<(), String> {
        let shown = |&(x, y): &(f64, f64)| {
            x.is_finite() && y.is_finite() && (!self.log_log || (x > 0.0 && y > 0.0))
        };
        let points: Vec<(f64, f64)> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().copied())
            .filter(shown)
            .collect();
        if points.is_empty() {
            return Err("no points to plot".into());
        }
        let (x_min, x_max, y_min, y_max) = points.iter().fold(
            (f64::MAX, f64::MIN, f64::MAX, f64::MIN),
            |(a, b, c, d), (x, y)| (a.min(*x), b.max(*x), c.min(*y), d.max(*y)),
        );
        let text = fonts_available();
        let root = BitMapBackend::new(path, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
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
            let chart = builder
                .build_cartesian_2d(x_range.log_scale(), y_range.log_scale())
                .map_err(|e| e.to_string())?;
            self.draw_on(chart, text, true)?;
        } else {
            // 5% of the range around the data, never below 0 for positive data.
            let pad = ((y_max - y_min) * 0.05).max(y_max.abs() * 1e-3).max(1e-9);
            let y_low = if y_min >= 0.0 {
                (y_min - pad).max(0.0)
            } else {
                y_min - pad
            };
            let x_range = x_min..x_max.max(x_min + 1e-9);
            let chart = builder
                .build_cartesian_2d(x_range, y_low..(y_max + pad))
                .map_err(|e| e.to_string())?;
            self.draw_on(chart, text, false)?;
        }
        root.present().map_err(|e| e.to_string())
    }

    /// The mesh, the lines and the legend.
    fn draw_on<'a, DB, X, Y>(
        &self,
        mut chart: ChartContext<'a, DB, Cartesian2d<X, Y>>,
        text: bool,
        integer_x: bool,
    ) -> Result<(), String>
    where
        DB: DrawingBackend + 'a,
        X: Ranged<ValueType = f64> + ValueFormatter<f64>,
        Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
    {
        let y_format = |y: &f64| short_number(*y);
        let x_format = |x: &f64| {
            if integer_x {
                format!("{x:.0}")
            } else {
                short_number(*x)
            }
        };
        let mut mesh = chart.configure_mesh();
        if text {
            mesh.x_desc(&self.x_label)
                .y_desc(&self.y_label)
                .y_label_formatter(&y_format)
                .x_label_formatter(&x_format);
        } else {
            mesh.disable_x_axis().disable_y_axis();
        }
        mesh.draw().map_err(|e| e.to_string())?;
        for series in &self.series {
            let colour = series.colour.rgb();
            let style = colour.stroke_width(series.width);
            let points = series.points.clone();
            let drawn = if series.dashed {
                chart.draw_series(DashedLineSeries::new(points.clone(), 8, 6, style))
            } else {
                chart.draw_series(LineSeries::new(points.clone(), style))
            }
            .map_err(|e| e.to_string())?;
            if let (true, Some(name)) = (text, &series.name) {
                // The legend's sample is drawn in the line's own style, so that a
                // dashed line reads as dashed there too.
                let [first, second] = legend_sample(series.dashed);
                drawn.label(name.clone()).legend(move |(x, y)| {
                    let style = colour.stroke_width(2);
                    EmptyElement::at((x, y))
                        + PathElement::new(vec![(first.0, 0), (first.1, 0)], style)
                        + PathElement::new(vec![(second.0, 0), (second.1, 0)], style)
                });
            }
            if series.markers {
                let radius = series.width + 1;
                chart
                    .draw_series(
                        points
                            .iter()
                            .map(|&p| Circle::new(p, radius, colour.filled())),
                    )
                    .map_err(|e| e.to_string())?;
            }
        }
        if text && self.series.iter().any(|s| s.name.is_some()) {
            chart
                .configure_series_labels()
                .position(match self.legend {
                    Legend::UpperLeft => SeriesLabelPosition::UpperLeft,
                    Legend::UpperRight => SeriesLabelPosition::UpperRight,
                })
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .label_font(("sans-serif", 15))
                .draw()
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// The two strokes, `(from, to)` in pixels along a 20-pixel sample, that show a
/// series in the legend: touching for a solid line, with a gap for a dashed one.
fn legend_sample(dashed: bool) -> [(i32, i32); 2] {
    if dashed {
        [(0, 7), (13, 20)]
    } else {
        [(0, 10), (10, 20)]
    }
}

/// `1.5k`, `2M`, `4.8`, `2.50e-1`: axis labels that fit.
fn short_number(value: f64) -> String {
    let magnitude = value.abs();
    // Three decimals at most, trailing zeros dropped.
    let trimmed = |value: f64, suffix: &str| {
        let text = format!("{value:.3}");
        let text = text.trim_end_matches('0').trim_end_matches('.');
        format!("{text}{suffix}")
    };
    if magnitude >= 1e9 {
        trimmed(value / 1e9, "G")
    } else if magnitude >= 1e6 {
        trimmed(value / 1e6, "M")
    } else if magnitude >= 1e3 {
        trimmed(value / 1e3, "k")
    } else if magnitude >= 1.0 || magnitude == 0.0 {
        trimmed(value, "")
    } else {
        format!("{value:.2e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::tests::TempDir;

    #[test]
    fn legend_samples_show_dashed_lines_dashed() {
        let [a, b] = legend_sample(false);
        assert_eq!(
            (a.0, a.1, b.0, b.1),
            (0, 10, 10, 20),
            "solid: one unbroken stroke"
        );
        let [a, b] = legend_sample(true);
        assert!(b.0 > a.1, "dashed: a gap between the strokes");
        assert_eq!((a.0, b.1), (0, 20), "the same length as a solid sample");
    }

    fn quadratic(log_log: bool) -> LinePlot {
        LinePlot {
            title: "test".into(),
            x_label: "seq".into(),
            y_label: "ms".into(),
            log_log,
            legend: Legend::UpperLeft,
            series: vec![Series::new(
                "quadratic",
                vec![(256.0, 1.0), (512.0, 4.0), (1024.0, 16.0)],
                Colour::palette(0),
            )],
        }
    }

    #[test]
    fn writes_log_log_and_linear_pngs() {
        let dir = TempDir::with_prefix("plot").unwrap();
        for log_log in [true, false] {
            let path = dir.path().join(format!("chart-{log_log}.png"));
            quadratic(log_log).write(&path).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
            // The IHDR chunk holds the size, big-endian.
            assert_eq!(&bytes[16..24], [0, 0, 3, 232, 0, 0, 2, 88]);
        }
    }

    #[test]
    fn nothing_to_draw_is_an_error_naming_the_file() {
        let dir = TempDir::with_prefix("plot-empty").unwrap();
        let path = dir.path().join("empty.png");
        let mut plot = quadratic(true);
        plot.series[0].points = vec![(0.0, 1.0), (1.0, f64::NAN)];
        let error = plot.write(&path).unwrap_err().to_string();
        assert!(
            error.contains("empty.png") && error.contains("no points to plot"),
            "{error}"
        );
        assert!(!path.exists());
    }

    #[test]
    fn axis_numbers_are_short() {
        assert_eq!(short_number(1500.0), "1.5k");
        assert_eq!(short_number(2e6), "2M");
        assert_eq!(short_number(0.25), "2.50e-1");
        assert_eq!(short_number(3.0), "3");
        assert_eq!(short_number(4.8), "4.8");
        assert_eq!(short_number(0.0), "0");
    }
}
