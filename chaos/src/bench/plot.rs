//! The fleet bench's plots, SVG beside `report.json` (text as SVG
//! `<text>`, no font library):
//!
//! - [`APPLIED`]: the CDFs of what the report's latency rows summarize —
//!   deploy: commit → applied at each follower, and leave; storm: heal →
//!   each agent converged — on one log-scaled time axis;
//! - [`PROCESSES`]: CPU (% of one core) and resident memory of every
//!   arbiter replica and worker over the run, with the phases marked;
//! - [`DELIVERIES`]: deltas and snapshots delivered per second over the
//!   run, with the phases marked.

use std::error::Error;
use std::io;
use std::path::Path;

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::arbiters::USER_HZ;
use super::report::Report;
use crate::plot::{
    cdf_steps, legend_line, render, render_sized, series_labels, write_svgs, Svg, FONT,
};

/// The CDFs: `applied-cdf.svg`.
pub const APPLIED: &str = "applied-cdf.svg";
/// CPU and RSS over time: `processes.svg`.
pub const PROCESSES: &str = "processes.svg";
/// Deliveries per second: `deliveries.svg`.
pub const DELIVERIES: &str = "deliveries.svg";

/// The samples behind the CDFs, µs.
#[derive(Clone, Debug, Default)]
pub struct Series {
    /// Deploy: commit → applied, per (change, follower).
    pub applied: Vec<u64>,
    /// Deploy: leave, per drain.
    pub leave: Vec<u64>,
    /// Storm: heal → converged, per agent.
    pub converge: Vec<u64>,
}

const PALETTE: [RGBColor; 6] = [
    RGBColor(30, 90, 200),
    RGBColor(200, 0, 0),
    RGBColor(40, 160, 70),
    RGBColor(230, 120, 0),
    RGBColor(120, 60, 170),
    RGBColor(90, 90, 90),
];

/// Writes every plot into `dir`; returns their file names.
pub fn write_all(dir: &Path, report: &Report, series: &Series) -> io::Result<Vec<String>> {
    write_svgs(
        dir,
        [
            (APPLIED, cdf(series)),
            (PROCESSES, processes(report)),
            (DELIVERIES, deliveries(report)),
        ],
    )
}

fn cdf(series: &Series) -> Svg {
    const FLOOR_MS: f64 = 0.01;
    let x_max = series
        .applied
        .iter()
        .chain(&series.leave)
        .chain(&series.converge)
        .copied()
        .max()
        .unwrap_or(1_000) as f64
        / 1_000.0
        * 1.5;
    render(|root| {
        let mut chart = ChartBuilder::on(root)
            .caption(
                format!(
                    "deploy: commit → applied (n={}), leave (n={}); storm: heal → agent converged (n={})",
                    series.applied.len(),
                    series.leave.len(),
                    series.converge.len()
                ),
                (FONT, 18),
            )
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d((FLOOR_MS..x_max.max(1.0)).log_scale(), 0f64..1.05)?;
        chart
            .configure_mesh()
            .x_desc("ms (log scale)")
            .y_desc("fraction of samples at or below")
            .draw()?;
        for (k, (name, samples)) in [
            ("deploy: commit → applied", &series.applied),
            ("deploy: leave", &series.leave),
            ("storm: heal → converged", &series.converge),
        ]
        .into_iter()
        .enumerate()
        {
            if samples.is_empty() {
                continue;
            }
            let color = PALETTE[k];
            chart
                .draw_series(LineSeries::new(
                    cdf_steps(samples, 1_000.0, FLOOR_MS),
                    color.stroke_width(2),
                ))?
                .label(name)
                .legend(legend_line(color));
        }
        series_labels(&mut chart, SeriesLabelPosition::LowerRight)
    })
}

/// Run start, wall µs: the first phase's start.
fn origin(report: &Report) -> u64 {
    report.phases.first().map_or(0, |p| p.start_us)
}

fn run_seconds(report: &Report) -> f64 {
    let t0 = origin(report);
    report
        .phases
        .last()
        .map_or(1.0, |p| (p.end_us.saturating_sub(t0)) as f64 / 1e6)
        .max(1.0)
}

/// Draws the phase boundaries as labelled vertical lines from `y_bottom`
/// to `y_top`, each name at `label_y`.
fn phase_lines<DB, Y>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, Y>>,
    report: &Report,
    (y_bottom, y_top): (f64, f64),
    label_y: f64,
) -> Result<(), Box<dyn Error>>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    Y: Ranged<ValueType = f64>,
{
    let t0 = origin(report);
    for p in &report.phases {
        let x = p.start_us.saturating_sub(t0) as f64 / 1e6;
        chart.draw_series(LineSeries::new(
            vec![(x, y_bottom), (x, y_top)],
            RGBColor(180, 180, 180).stroke_width(1),
        ))?;
        chart.draw_series(std::iter::once(Text::new(
            p.name.clone(),
            (x, label_y),
            (FONT, 12).into_font().color(&RGBColor(90, 90, 90)),
        )))?;
    }
    Ok(())
}

fn processes(report: &Report) -> Svg {
    let t0 = origin(report);
    let x_max = run_seconds(report);
    render_sized((1200, 800), |root| {
        let (upper, lower) = root.split_vertically(400);
        let cpu: Vec<(String, Vec<(f64, f64)>)> = report
            .processes
            .iter()
            .map(|p| {
                let points = p
                    .readings
                    .windows(2)
                    .filter(|w| w[1].at_us > w[0].at_us)
                    .map(|w| {
                        let dt = (w[1].at_us - w[0].at_us) as f64 / 1e6;
                        let busy = (w[1].cpu_ticks - w[0].cpu_ticks) as f64 / USER_HZ;
                        (
                            w[1].at_us.saturating_sub(t0) as f64 / 1e6,
                            busy / dt * 100.0,
                        )
                    })
                    .collect();
                (p.name.clone(), points)
            })
            .collect();
        let rss: Vec<(String, Vec<(f64, f64)>)> = report
            .processes
            .iter()
            .map(|p| {
                let points = p
                    .readings
                    .iter()
                    .map(|r| {
                        (
                            r.at_us.saturating_sub(t0) as f64 / 1e6,
                            r.rss_kib as f64 / 1024.0,
                        )
                    })
                    .collect();
                (p.name.clone(), points)
            })
            .collect();
        panel(&upper, report, "CPU, % of one core", &cpu, x_max)?;
        panel(&lower, report, "resident memory, MiB", &rss, x_max)
    })
}

fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    report: &Report,
    what: &str,
    lines: &[(String, Vec<(f64, f64)>)],
    x_max: f64,
) -> Result<(), Box<dyn Error>>
where
    DB::ErrorType: 'static,
{
    let y_max = lines
        .iter()
        .flat_map(|(_, p)| p.iter().map(|(_, y)| *y))
        .fold(1.0f64, f64::max)
        * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(format!("{what}, by process, over the run"), (FONT, 16))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
    chart
        .configure_mesh()
        .x_desc("s since the run started")
        .y_desc(what)
        .draw()?;
    phase_lines(&mut chart, report, (0.0, y_max), y_max * 0.97)?;
    for (k, (name, points)) in lines.iter().enumerate() {
        let color = PALETTE[k % PALETTE.len()];
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(1)))?
            .label(name.clone())
            .legend(legend_line(color));
    }
    series_labels(&mut chart, SeriesLabelPosition::UpperLeft)
}

fn deliveries(report: &Report) -> Svg {
    let t0 = origin(report);
    let x_max = run_seconds(report);
    let at = |second: u64| (second * 1_000_000).saturating_sub(t0) as f64 / 1e6 + 0.5;
    let deltas: Vec<(f64, f64)> = report
        .load
        .iter()
        .map(|(s, l)| (at(*s), (l.deltas as f64).max(1.0)))
        .collect();
    let snapshots: Vec<(f64, f64)> = report
        .load
        .iter()
        .map(|(s, l)| (at(*s), (l.snapshots as f64).max(1.0)))
        .collect();
    let y_max = deltas
        .iter()
        .chain(&snapshots)
        .map(|(_, y)| *y)
        .fold(10.0f64, f64::max)
        * 1.5;
    render(|root| {
        let mut chart = ChartBuilder::on(root)
            .caption(
                "Deltas and snapshots delivered to the agents per second (log scale)",
                (FONT, 18),
            )
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..x_max, (1f64..y_max).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("s since the run started")
            .y_desc("per second")
            .draw()?;
        phase_lines(&mut chart, report, (1.0, y_max), y_max / 1.3)?;
        for (k, (name, points)) in [("deltas", deltas), ("snapshots", snapshots)]
            .into_iter()
            .enumerate()
        {
            let color = PALETTE[k + 2];
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(1)))?
                .label(name)
                .legend(legend_line(color));
        }
        series_labels(&mut chart, SeriesLabelPosition::UpperRight)
    })
}
