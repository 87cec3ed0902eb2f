//! The plots of a simulation, SVG beside `report.json`:
//!
//! - [`CDF`]: the empirical CDFs of the leave and crash samples (exactly
//!   the numbers `leave_ms` and `crash_ms` summarize).
//! - [`LOAD`]: the arbiter's committed writes and deliveries per simulated
//!   second.
//!
//! Text is written as SVG `<text>`, so no font library is needed. The
//! pieces every plot of the crate shares are in [`crate::plot`].

use std::io;
use std::path::Path;

use plotters::prelude::*;

use super::Series;
use crate::plot::{cdf_steps, legend_line, render, series_labels, write_svgs, Svg, FONT};

/// The leave and crash CDFs: `cdf.svg`.
pub const CDF: &str = "cdf.svg";
/// Commits and deliveries per second: `load.svg`.
pub const LOAD: &str = "load.svg";

const LEAVE: RGBColor = RGBColor(30, 90, 200);
const CRASH: RGBColor = RGBColor(200, 0, 0);
const COMMITS: RGBColor = RGBColor(230, 120, 0);
const DELIVERIES: RGBColor = RGBColor(40, 160, 70);

/// Writes both plots into `dir`; returns their file names.
pub fn write_all(dir: &Path, series: &Series) -> io::Result<Vec<String>> {
    write_svgs(dir, [(CDF, cdf(series)), (LOAD, load(series))])
}

fn cdf(series: &Series) -> Svg {
    let x_max = series
        .leave_ms
        .iter()
        .chain(&series.crash_ms)
        .copied()
        .max()
        .unwrap_or(0)
        .max(1_000) as f64
        * 1.05;
    render(|root| {
        let title = format!(
            "Leave (commit → last subscribed agent applied, n={}) and crash (kill → last agent ejected, n={}) CDFs",
            series.leave_ms.len(),
            series.crash_ms.len()
        );
        let mut chart = ChartBuilder::on(root)
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
                .draw_series(LineSeries::new(
                    cdf_steps(samples, 1.0, 0.0),
                    color.stroke_width(2),
                ))?
                .label(name)
                .legend(legend_line(color));
        }
        series_labels(&mut chart, SeriesLabelPosition::LowerRight)
    })
}

fn load(series: &Series) -> Svg {
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
    render(|root| {
        let mut chart = ChartBuilder::on(root)
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
                .legend(legend_line(color));
        }
        series_labels(&mut chart, SeriesLabelPosition::UpperRight)
    })
}
