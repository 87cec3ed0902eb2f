//! The plots of a chaos run: SVG files beside `report.json`, drawn from the
//! run's [`Timeline`] and [`Report`] for the people who read the report.
//!
//! - [`TRAFFIC`]: answered connections per second stacked by what their
//!   backend was (READY, leaving, not READY yet), failed ones on their own
//!   axis, phases as shaded bands, a marker at every fault, recovery step
//!   and leave commit.
//! - [`CDF`]: the empirical distributions of the leave and crash times.
//! - [`STAGES`]: per instance that left, from its commit to the last new
//!   connection it answered, and its exit (only when an instance left).
//!
//! It draws figures and must not compute its own version of one the report
//! has: the CDFs and the stage bars are [`report::samples`], exactly the
//! numbers `report.json` summarizes. Only [`write_all`] touches the
//! filesystem. Text is written as SVG `<text>` elements and laid out with
//! plotters' estimate, so no font file or font library is needed.

use std::collections::BTreeMap;
use std::error::Error;
use std::io;
use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::report::{self, Report, Sample, Samples, DRAIN_GRACE_MS};
use crate::timeline::{Event, Outcome, Timeline};

/// Connections per second over time, stacked by backend state: `traffic.svg`.
pub const TRAFFIC: &str = "traffic.svg";
/// The empirical CDFs of the leave and crash times: `cdf.svg`.
pub const CDF: &str = "cdf.svg";
/// The rolling-deploy stage timeline: `stages.svg`.
pub const STAGES: &str = "stages.svg";

/// Every plot's size in pixels (the simulator's and the fleet bench's
/// too); here the right-hand [`LEGEND_WIDTH`] holds the legend, so that
/// many backends never cover the data.
pub(crate) const SIZE: (u32, u32) = (1200, 600);
const LEGEND_WIDTH: u32 = 230;
pub(crate) const FONT: &str = "sans-serif";

const FAILED: RGBColor = RGBColor(220, 20, 20);
const PHASE: RGBColor = RGBColor(90, 90, 90);
const STEP: RGBColor = RGBColor(30, 90, 200);
const HARD_FAILURE: RGBColor = RGBColor(200, 0, 0);
const LEAVE: RGBColor = RGBColor(230, 120, 0);
const WITHIN_GRACE: RGBColor = RGBColor(40, 160, 70);
const PAST_GRACE: RGBColor = RGBColor(210, 40, 40);

type Drawn = Result<(), Box<dyn Error>>;
/// A drawn SVG document, or why it could not be drawn.
pub(crate) type Svg = Result<String, Box<dyn Error>>;
pub(crate) type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// Draws the run's plots into `dir` (created if needed) and returns the
/// file names written, in order: [`TRAFFIC`], [`CDF`], and [`STAGES`] when
/// the timeline has a `LeaveCommitted` event. A plot that cannot be drawn
/// or written is an error naming its file; the plots before it stay.
pub fn write_all(dir: &Path, report: &Report, timeline: &Timeline) -> io::Result<Vec<String>> {
    let samples = report::samples(timeline);
    let mut plots = vec![(TRAFFIC, traffic(timeline)), (CDF, cdf(report, &samples))];
    if has_leave(timeline) {
        plots.push((STAGES, stages(timeline, &samples)));
    }
    write_svgs(dir, plots)
}

/// Writes each drawn plot into `dir` (created if needed) under its file
/// name and returns the names written, in order. A plot that could not be
/// drawn or written is an error naming its file; the plots before it stay.
/// The simulator's and the fleet bench's plots are written through this too.
pub(crate) fn write_svgs(
    dir: &Path,
    plots: impl IntoIterator<Item = (&'static str, Svg)>,
) -> io::Result<Vec<String>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    for (file, svg) in plots {
        let path = dir.join(file);
        let svg = svg.map_err(|e| io::Error::other(format!("drawing {}: {e}", path.display())))?;
        std::fs::write(&path, svg)
            .map_err(|e| io::Error::new(e.kind(), format!("writing {}: {e}", path.display())))?;
        written.push(file.to_owned());
    }
    Ok(written)
}

fn has_leave(timeline: &Timeline) -> bool {
    timeline
        .events
        .iter()
        .any(|e| matches!(e, Event::LeaveCommitted { .. }))
}

/// An SVG document of [`SIZE`] drawn by `draw` on a white background.
pub(crate) fn render(draw: impl FnOnce(&Area<'_>) -> Drawn) -> Svg {
    render_sized(SIZE, draw)
}

/// [`render`] at `size` pixels.
pub(crate) fn render_sized(size: (u32, u32), draw: impl FnOnce(&Area<'_>) -> Drawn) -> Svg {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE)?;
        draw(&root)?;
        root.present()?;
    }
    Ok(svg)
}

/// The legend mark of a line series: a short line in its colour.
pub(crate) fn legend_line(color: RGBColor) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color)
}

/// Draws the labels of a chart's series (those given a `label`) at
/// `position`, boxed on white.
pub(crate) fn series_labels<'a, DB, CT>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
) -> Drawn
where
    DB: DrawingBackend + 'a,
    DB::ErrorType: 'static,
    CT: CoordTranslate,
{
    chart
        .configure_series_labels()
        .background_style(WHITE)
        .border_style(BLACK)
        .position(position)
        .draw()?;
    Ok(())
}

/// What the backend answering a connection was, at the connection's
/// opening time, in `traffic.svg`'s stack (bottom to top).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Served {
    /// READY (or never seen leaving).
    Ready,
    /// Leaving: its DRAINING or UNHEALTHY commit came, it was not READY again.
    Leaving,
    /// Before its first READY (a deploy's new instance).
    NotReady,
}

const SERVED: [(Served, &str, RGBColor); 3] = [
    (Served::Ready, "answered: READY", RGBColor(70, 130, 180)),
    (
        Served::Leaving,
        "answered: leaving (after commit)",
        RGBColor(240, 160, 40),
    ),
    (
        Served::NotReady,
        "answered: not READY yet",
        RGBColor(150, 90, 190),
    ),
];

/// Labels drawn on the plot at most; past it markers are ticks without a
/// label (their count is in the legend), so a run of 100 crashes stays
/// readable.
const MAX_LABELLED_MARKERS: usize = 24;

/// `traffic.svg`, readable at a glance: the upper panel stacks, per 1 s
/// bucket of opening time, the answered connections by what their backend
/// was then (READY, leaving, not READY yet); the lower panel shows the
/// failed connections on their own axis. Phases are shaded bands named at
/// the top; faults, recoveries and leave commits are vertical markers,
/// labelled while there are few.
fn traffic(timeline: &Timeline) -> Svg {
    let markers: Vec<(u64, String, RGBColor)> = timeline
        .events
        .iter()
        .filter(|e| !matches!(e, Event::Phase { .. }))
        .filter_map(marker)
        .collect();
    let phases: Vec<(u64, &str)> = timeline
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Phase { t_ms, name } => Some((*t_ms, name.as_str())),
            _ => None,
        })
        .collect();
    // Bucket k holds the connections opened in [k, k + 1) s; the last one
    // may be partial (the run ends within it).
    let buckets = timeline
        .conns
        .iter()
        .map(|c| c.t_ms / 1000 + 1)
        .fold(timeline.duration_ms.div_ceil(1000).max(1), u64::max) as usize;
    let x_max = markers
        .iter()
        .map(|(t, _, _)| *t as f64 / 1000.0 + 0.5)
        .fold(buckets as f64, f64::max);
    let served_at = served_by(timeline);
    let mut stacks = vec![[0u32; 3]; buckets];
    let mut failed = vec![0u32; buckets];
    let mut backends = std::collections::BTreeSet::new();
    for conn in &timeline.conns {
        let k = (conn.t_ms / 1000) as usize;
        match (conn.outcome, &conn.backend) {
            (Outcome::Answered, Some(backend)) => {
                backends.insert(backend.as_str());
                let layer = SERVED
                    .iter()
                    .position(|(s, _, _)| *s == served_at(backend, conn.t_ms))
                    .expect("every kind has a layer");
                stacks[k][layer] += 1;
            }
            _ => failed[k] += 1,
        }
    }
    let answered: u64 = stacks.iter().flatten().map(|&n| u64::from(n)).sum();
    let failed_total: u64 = failed.iter().map(|&n| u64::from(n)).sum();
    let title = if timeline.conns.is_empty() {
        "Connections per second: no data (the run recorded no connections)".to_owned()
    } else {
        format!(
            "Connections per second: {answered} answered by {} backends, {failed_total} failed",
            backends.len()
        )
    };
    let peak = stacks
        .iter()
        .map(|s| s.iter().sum::<u32>())
        .max()
        .unwrap_or(0)
        .max(1);
    let failed_peak = failed.iter().copied().max().unwrap_or(0).max(1);
    render(|root| {
        let (plot, legend_area) = root.split_horizontally(SIZE.0 - LEGEND_WIDTH);
        let (upper, lower) = plot.split_vertically((SIZE.1 as f64 * 0.68) as u32);
        // Headroom above the stack for the phase names and labels.
        let y_max = f64::from(peak) * 1.3;
        let mut chart = ChartBuilder::on(&upper)
            .caption(title, (FONT, 20))
            .margin(10)
            .x_label_area_size(20)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
        chart
            .configure_mesh()
            .x_label_formatter(&tidy)
            .y_label_formatter(&|v| format!("{v:.0}"))
            .y_desc("answered per second")
            .draw()?;
        for (i, &(start, name)) in phases.iter().enumerate() {
            let end = phases.get(i + 1).map_or(x_max, |(t, _)| *t as f64 / 1000.0);
            let x = start as f64 / 1000.0;
            if i % 2 == 1 {
                chart.draw_series([Rectangle::new(
                    [(x, 0.0), (end, y_max)],
                    PHASE.mix(0.08).filled(),
                )])?;
            }
            chart.draw_series([Text::new(
                name.to_owned(),
                (x, y_max * 0.99),
                (FONT, 12)
                    .into_font()
                    .color(&PHASE)
                    .pos(Pos::new(HPos::Left, VPos::Top)),
            )])?;
        }
        // Stacked: each layer is drawn as the sum of itself and the ones
        // below it, top layer first, so each shows as its own band.
        for top in (0..SERVED.len()).rev() {
            let area: Vec<(f64, f64)> = stacks
                .iter()
                .enumerate()
                .map(|(k, s)| {
                    let sum: u32 = s[..=top].iter().sum();
                    (k as f64 + 0.5, f64::from(sum))
                })
                .collect();
            let color = SERVED[top].2;
            chart.draw_series(AreaSeries::new(area, 0.0, color.mix(0.85)).border_style(color))?;
        }
        for (t_ms, _, color) in &markers {
            let x = *t_ms as f64 / 1000.0;
            chart.draw_series([PathElement::new(
                vec![(x, 0.0), (x, y_max * 0.9)],
                color.mix(0.6).stroke_width(1),
            )])?;
        }
        let labels = marker_labels(&markers);
        if labels.len() <= MAX_LABELLED_MARKERS {
            for (i, (t_ms, label, color)) in labels.iter().enumerate() {
                let x = *t_ms as f64 / 1000.0;
                // Staggered, so that markers close together stay readable.
                let y = y_max * (0.92 - 0.045 * (i % 5) as f64);
                chart.draw_series([Text::new(
                    label.clone(),
                    (x, y),
                    (FONT, 11)
                        .into_font()
                        .color(color)
                        .pos(Pos::new(HPos::Left, VPos::Top)),
                )])?;
            }
        }
        let mut below = ChartBuilder::on(&lower)
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..x_max, 0f64..f64::from(failed_peak) * 1.15)?;
        below
            .configure_mesh()
            .x_label_formatter(&tidy)
            .y_labels(failed_peak.min(5) as usize + 1)
            .y_label_formatter(&|v| format!("{v:.0}"))
            .x_desc("time since the run started, s (1 s buckets)")
            .y_desc("failed per second")
            .draw()?;
        below.draw_series(
            failed
                .iter()
                .enumerate()
                .filter(|(_, &n)| n > 0)
                .map(|(k, &n)| {
                    Rectangle::new(
                        [(k as f64 + 0.1, 0.0), (k as f64 + 0.9, f64::from(n))],
                        FAILED.filled(),
                    )
                }),
        )?;
        for (t_ms, _, color) in &markers {
            let x = *t_ms as f64 / 1000.0;
            below.draw_series([PathElement::new(
                vec![(x, 0.0), (x, f64::from(failed_peak) * 1.15)],
                color.mix(0.4).stroke_width(1),
            )])?;
        }
        let mut legend: Vec<(String, RGBColor)> = SERVED
            .iter()
            .map(|(_, name, color)| ((*name).to_owned(), *color))
            .collect();
        legend.push(("failed (lower panel)".to_owned(), FAILED));
        for (name, color) in [
            ("step", STEP),
            ("hard failure", HARD_FAILURE),
            ("leave commit", LEAVE),
        ] {
            let count = markers.iter().filter(|(_, _, c)| *c == color).count();
            if count > 0 {
                legend.push((format!("| {name} ({count})"), color));
            }
        }
        if !phases.is_empty() {
            legend.push(("phases: bands, named on top".to_owned(), PHASE));
        }
        draw_legend(&legend_area, &legend)
    })
}

/// The markers' labels, those of one kind within the same 200 ms merged
/// into one ("drain ×3"): a deploy wave's markers would cover each other.
fn marker_labels(markers: &[(u64, String, RGBColor)]) -> Vec<(u64, String, RGBColor)> {
    let mut labels: Vec<(u64, String, RGBColor, usize)> = Vec::new();
    for (t_ms, label, color) in markers {
        let kind = label.split(' ').next().unwrap_or_default();
        match labels.iter_mut().find(|(t, l, c, _)| {
            c == color && t_ms.abs_diff(*t) < 200 && l.split(' ').next() == Some(kind)
        }) {
            Some(merged) => merged.3 += 1,
            None => labels.push((*t_ms, label.clone(), *color, 1)),
        }
    }
    labels
        .into_iter()
        .map(|(t, label, color, n)| match n {
            1 => (t, label, color),
            n => (
                t,
                format!("{} ×{n}", label.split(' ').next().unwrap_or_default()),
                color,
            ),
        })
        .collect()
}

/// What `backend` was at `t_ms` (see [`Served`]), from the timeline's
/// leave, ready and hard-failure events.
fn served_by(timeline: &Timeline) -> impl Fn(&str, u64) -> Served + '_ {
    let mut changes: BTreeMap<&str, Vec<(u64, Served)>> = BTreeMap::new();
    for event in &timeline.events {
        let (t, instance, to) = match event {
            Event::Ready { t_ms, instance } => (*t_ms, instance.as_str(), Served::Ready),
            Event::LeaveCommitted { t_ms, instance } => (*t_ms, instance.as_str(), Served::Leaving),
            _ => continue,
        };
        changes.entry(instance).or_default().push((t, to));
    }
    for list in changes.values_mut() {
        list.sort_by_key(|(t, _)| *t);
    }
    move |backend, t_ms| match changes.get(backend) {
        None => Served::Ready,
        Some(list) => {
            let before: Vec<&(u64, Served)> = list.iter().filter(|(t, _)| *t <= t_ms).collect();
            match before.last() {
                Some((_, state)) => *state,
                // Its first change is a READY: it was not READY before.
                None if list.first().is_some_and(|(_, s)| *s == Served::Ready) => Served::NotReady,
                None => Served::Ready,
            }
        }
    }
}

/// The traffic plot's marker for an event: its time, label and colour.
fn marker(event: &Event) -> Option<(u64, String, RGBColor)> {
    match event {
        Event::Phase { t_ms, name } => Some((*t_ms, name.clone(), PHASE)),
        Event::Step {
            t_ms,
            action,
            target,
        } if target.is_empty() => Some((*t_ms, action.clone(), STEP)),
        Event::Step {
            t_ms,
            action,
            target,
        } => Some((*t_ms, format!("{action} {target}"), STEP)),
        Event::HardFailure {
            t_ms,
            instance,
            fault,
        } => Some((*t_ms, format!("{fault} {instance}"), HARD_FAILURE)),
        Event::LeaveCommitted { t_ms, instance } => {
            Some((*t_ms, format!("leave {instance}"), LEAVE))
        }
        Event::Ready { .. }
        | Event::BackendExit { .. }
        | Event::Restarted { .. }
        | Event::Writer { .. } => None,
    }
}

/// `cdf.svg`: the empirical CDF of each kind of sample, as a step
/// function (the fraction of samples at or below each duration). A kind
/// without samples is named in the title rather than silently missing.
fn cdf(report: &Report, samples: &Samples) -> Svg {
    let kinds = [
        ("leave", &samples.leave, report.leave_ms.p99, STEP),
        ("crash", &samples.crash, report.crash_ms.p99, HARD_FAILURE),
    ];
    let summary: Vec<String> = kinds
        .iter()
        .map(|(name, samples, p99, _)| match p99 {
            Some(p99) if !samples.is_empty() => {
                format!("{name} n={}, p99 {p99} ms", samples.len())
            }
            _ => format!("no {name} samples"),
        })
        .collect();
    let title = if kinds.iter().all(|(_, samples, _, _)| samples.is_empty()) {
        "Leave and crash times (CDF): no data (no leave and no hard failure)".to_owned()
    } else {
        format!("Leave and crash times (CDF): {}", summary.join("; "))
    };
    let x_max = kinds
        .iter()
        .flat_map(|(_, samples, _, _)| samples.iter().map(|s| s.ms))
        .max()
        .unwrap_or(0)
        .max(1000) as f64
        * 1.05;
    render(|root| {
        let (plot, legend_area) = root.split_horizontally(SIZE.0 - LEGEND_WIDTH);
        let mut chart = ChartBuilder::on(&plot)
            .caption(title, (FONT, 20))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..x_max, 0f64..1.05)?;
        chart
            .configure_mesh()
            .x_label_formatter(&tidy)
            .x_desc("duration, ms")
            .y_desc("fraction of samples at or below")
            .draw()?;
        let mut legend = Vec::new();
        for ((name, samples, _, color), text) in kinds.iter().zip(&summary) {
            if !samples.is_empty() {
                chart.draw_series(LineSeries::new(steps(samples), color.stroke_width(2)))?;
            }
            legend.push((format!("{name}: {text}"), *color));
        }
        draw_legend(&legend_area, &legend)
    })
}

/// Most corners drawn per CDF: a curve of a million samples is drawn
/// through this many of its order statistics, evenly spaced in rank.
const MAX_STEPS: usize = 2_000;

/// The empirical CDF of `values` as the corners of a step function, from
/// (`floor`, 0) to (largest, 1), each value divided by `per_unit` (1 for
/// values already in the axis' unit; 1,000 for µs on a ms axis) and drawn
/// no lower than `floor` (0 on a linear axis; a log axis has no 0). At most
/// [`MAX_STEPS`] order statistics are drawn, the largest always among them.
pub(crate) fn cdf_steps(values: &[u64], per_unit: f64, floor: f64) -> Vec<(f64, f64)> {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let n = sorted.len();
    let stride = n.div_ceil(MAX_STEPS).max(1);
    let mut points = Vec::with_capacity(2 * n / stride + 3);
    points.push((floor, 0.0));
    let ranks = (0..n)
        .step_by(stride)
        .chain((n > 0 && (n - 1) % stride != 0).then(|| n - 1));
    for i in ranks {
        let x = (sorted[i] as f64 / per_unit).max(floor);
        points.push((x, i as f64 / n as f64));
        points.push((x, (i + 1) as f64 / n as f64));
    }
    points
}

/// The CDF corners of the report's samples, in ms on a linear axis.
fn steps(samples: &[Sample]) -> Vec<(f64, f64)> {
    let ms: Vec<u64> = samples.iter().map(|s| s.ms).collect();
    cdf_steps(&ms, 1.0, 0.0)
}

/// `stages.svg`: one row per instance that received a `LeaveCommitted`
/// event, in the order they left, and per leave a bar from its commit to
/// the last new connection it answered (the report's leave sample: green
/// within [`DRAIN_GRACE_MS`], red past it), a tick at commit + the grace,
/// and a cross at each `BackendExit` of the instance.
fn stages(timeline: &Timeline, samples: &Samples) -> Svg {
    let mut rows: Vec<&str> = Vec::new();
    for sample in &samples.leave {
        if !rows.contains(&sample.instance.as_str()) {
            rows.push(&sample.instance);
        }
    }
    let exits: Vec<(usize, u64)> = timeline
        .events
        .iter()
        .filter_map(|e| match e {
            Event::BackendExit { t_ms, instance } => rows
                .iter()
                .position(|r| r == instance)
                .map(|row| (row, *t_ms)),
            _ => None,
        })
        .collect();
    let end_ms = samples
        .leave
        .iter()
        .map(|s| (s.start_ms + s.ms).max(s.start_ms + DRAIN_GRACE_MS))
        .chain(exits.iter().map(|(_, t)| *t))
        .fold(timeline.duration_ms, u64::max)
        .max(1000);
    let n = rows.len();
    // Row 0 (the first to leave) at the top.
    let y_of = |row: usize| (n - 1 - row) as f64;
    let title = format!(
        "Rolling-deploy stages: instances that left: {n}; backend exits: {}",
        if exits.is_empty() {
            "none recorded".to_owned()
        } else {
            exits.len().to_string()
        }
    );
    render(|root| {
        let (plot, legend_area) = root.split_horizontally(SIZE.0 - LEGEND_WIDTH);
        let names = |y: &f64| -> String {
            let row = y.round();
            if (y - row).abs() > 0.01 || row < 0.0 || row >= n as f64 {
                return String::new();
            }
            rows[n - 1 - row as usize].to_owned()
        };
        let mut chart = ChartBuilder::on(&plot)
            .caption(title, (FONT, 20))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(120)
            .build_cartesian_2d(0f64..end_ms as f64 / 1000.0 * 1.05, -0.6..n as f64 - 0.4)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(n.max(1))
            .y_label_formatter(&names)
            .x_label_formatter(&tidy)
            .x_desc("time since the run started, s")
            .draw()?;
        for sample in &samples.leave {
            let Some(row) = rows.iter().position(|r| *r == sample.instance) else {
                continue;
            };
            let y = y_of(row);
            let (start, last) = (
                sample.start_ms as f64 / 1000.0,
                (sample.start_ms + sample.ms) as f64 / 1000.0,
            );
            let color = if sample.ms > DRAIN_GRACE_MS {
                PAST_GRACE
            } else {
                WITHIN_GRACE
            };
            chart.draw_series([Rectangle::new(
                [(start, y - 0.25), (last, y + 0.25)],
                color.filled(),
            )])?;
            // The commit as a dot, so that a 0 ms leave shows too.
            chart.draw_series([Circle::new((start, y), 5, color.filled())])?;
            let grace = (sample.start_ms + DRAIN_GRACE_MS) as f64 / 1000.0;
            chart.draw_series([PathElement::new(
                vec![(grace, y - 0.35), (grace, y + 0.35)],
                BLACK.stroke_width(2),
            )])?;
            chart.draw_series([Text::new(
                format!("{} ms", sample.ms),
                (last, y + 0.3),
                (FONT, 11)
                    .into_font()
                    .color(&BLACK)
                    .pos(Pos::new(HPos::Left, VPos::Bottom)),
            )])?;
        }
        chart.draw_series(exits.iter().map(|&(row, t)| {
            Cross::new((t as f64 / 1000.0, y_of(row)), 7, BLACK.stroke_width(2))
        }))?;
        draw_legend(
            &legend_area,
            &[
                (
                    format!("commit to last new conn, <= {DRAIN_GRACE_MS} ms"),
                    WITHIN_GRACE,
                ),
                (
                    format!("commit to last new conn, > {DRAIN_GRACE_MS} ms"),
                    PAST_GRACE,
                ),
                ("dot: the commit".to_owned(), BLACK),
                (format!("tick: commit + {DRAIN_GRACE_MS} ms"), BLACK),
                ("cross: backend exit".to_owned(), BLACK),
            ],
        )
    })
}

/// An axis value without a trailing ".0" (and without the float noise of
/// a computed tick such as 0.30000000000000004).
fn tidy(v: &f64) -> String {
    let text = format!("{v:.1}");
    text.strip_suffix(".0").unwrap_or(&text).to_owned()
}

/// A legend drawn in its own area: a short line in each entry's colour and
/// the entry's name, one entry a line.
fn draw_legend(area: &Area<'_>, entries: &[(String, RGBColor)]) -> Drawn {
    for (i, (name, color)) in entries.iter().enumerate() {
        let y = 50 + 20 * i as i32;
        area.draw(&PathElement::new(
            vec![(8, y), (32, y)],
            color.stroke_width(3),
        ))?;
        area.draw(&Text::new(
            name.as_str(),
            (38, y),
            (FONT, 12)
                .into_font()
                .color(&BLACK)
                .pos(Pos::new(HPos::Left, VPos::Center)),
        ))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
