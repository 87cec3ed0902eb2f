//! The plots of a simulation, SVG beside `report.json`:
//!
//! - [`CDF`]: the empirical CDFs of the leave and crash samples (exactly
//!   the numbers `leave_ms` and `crash_ms` summarize).
//! - [`LOAD`]: the arbiter's committed writes and deliveries per simulated
//!   second.
//!
//! Text is written as SVG `<text>`, so no font library is needed.

use std::error::Error;
use std::io;
use std::path::Path;

use plotters::prelude::*;

use super::Series;

/// The leave and crash CDFs: `cdf.svg`.
pub const CDF: &str = "cdf.svg";
/// Commits and deliveries per second: `load.svg`.
pub const LOAD: &str = "load.svg";

const SIZE: (u32, u32) = (1200, 600);
const FONT: &str = "sans-serif";
const LEAVE: RGBColor = RGBColor(30, 90, 200);
const CRASH: RGBColor = RGBColor(200, 0, 0);
const COMMITS: RGBColor = RGBColor(230, 120, 0);
const DELIVERIES: RGBColor = RGBColor(40, 160, 70);

type Drawn = Result<String, Box<dyn Error>>;

/// Writes both plots into `dir`; returns their file names.
pub fn write_all(dir: &Path, series: &Series) -> io::Result<Vec<String>> {
    let mut written = Vec::new();
    for (file, svg) in [(CDF, cdf(series)), (LOAD, load(series))] {
        let svg = svg.map_err(|e| io::Error::other(format!("drawing {file}: {e}")))?;
        std::fs::write(dir.join(file), svg)?;
        written.push(file.to_owned());
    }
    Ok(written)
}

fn steps(samples: &[u64]) -> Vec<(f64, f64)> {
    let mut ms = samples.to_vec();
    ms.sort_unstable();
    let n = ms.len() as f64;
    let mut points = vec![(0.0, 0.0)];
    for (i, &v) in ms.iter().enumerate() {
        points.push((v as f64, i as f64 / n));
        points.push((v as f64, (i + 1) as f64 / n));
    }
    points
}

fn cdf(series: &Series) -> Drawn {
    let x_max = series
        .leave_ms
        .iter()
        .chain(&series.crash_ms)
        .copied()
        .max()
        .unwrap_or(0)
        .max(1_000) as f64
        * 1.05;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE)?;
        let title = format!(
            "Leave (commit → last subscribed agent applied, n={}) and crash (kill → last agent ejected, n={}) CDFs",
            series.leave_ms.len(),
            series.crash_ms.len()
        );
        let mut chart = ChartBuilder::on(&root)
            .caption(title, (FONT, 18))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..x_max, 0f64..1.05)?;
        chart
            .configure_mesh()
            .x_desc("duration, ms")
            .y_desc("fraction of samples at or below")
            .draw()?;
        for (name, samples, color) in [
            ("leave", &series.leave_ms, LEAVE),
            ("crash", &series.crash_ms, CRASH),
        ] {
            if samples.is_empty() {
                continue;
            }
            chart
                .draw_series(LineSeries::new(steps(samples), color.stroke_width(2)))?
                .label(name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE)
            .border_style(BLACK)
            .position(SeriesLabelPosition::LowerRight)
            .draw()?;
        root.present()?;
    }
    Ok(svg)
}

fn load(series: &Series) -> Drawn {
    let len = series
        .commits_per_s
        .len()
        .max(series.deliveries_per_s.len())
        .max(1);
    let y_max = series
        .commits_per_s
        .iter()
        .chain(&series.deliveries_per_s)
        .copied()
        .max()
        .unwrap_or(0)
        .max(10) as f64
        * 1.1;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "Arbiter: committed writes and deliveries per simulated second (log scale)",
                (FONT, 18),
            )
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..len as f64, (1f64..y_max).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("simulated time, s")
            .y_desc("per second")
            .draw()?;
        for (name, values, color) in [
            ("committed writes", &series.commits_per_s, COMMITS),
            ("deliveries", &series.deliveries_per_s, DELIVERIES),
        ] {
            let points = values
                .iter()
                .enumerate()
                .map(|(i, &v)| (i as f64 + 0.5, f64::from(v).max(1.0)));
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(1)))?
                .label(name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE)
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()?;
        root.present()?;
    }
    Ok(svg)
}
