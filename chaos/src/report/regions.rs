//! Where a multi-region run's connections went, per routing rule, and
//! the writer epochs each region read (`RegionsFigures`).

use super::*;

/// Per routing rule, where its phase's connections went: `None` in a
/// one-region run (no backend has a region). A phase that begins more
/// than once is judged over all of its spans.
pub(super) fn regions(
    timeline: &Timeline,
    conns: &[&Conn],
    events: &[&Event],
    rules: &[Routing],
) -> Option<RegionsFigures> {
    if timeline.backend_regions.is_empty() {
        return None;
    }
    let starts: Vec<(u64, &str)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Phase { t_ms, name } => Some((*t_ms, name.as_str())),
            _ => None,
        })
        .collect();
    let regions: HashSet<&str> = timeline
        .backend_regions
        .values()
        .map(String::as_str)
        .collect();
    let routing = rules
        .iter()
        .map(|rule| {
            let settle = (rule.settle_s * 1000.0) as u64;
            // The phase's spans: [start, next phase's start).
            let spans: Vec<(u64, u64)> = starts
                .iter()
                .enumerate()
                .filter(|(_, (_, name))| *name == rule.phase)
                .map(|(i, &(start, _))| {
                    let end = starts
                        .get(i + 1)
                        .map_or(timeline.duration_ms.max(start), |&(t, _)| t);
                    (start, end)
                })
                .collect();
            let within = |t: u64, settled: bool| {
                spans.iter().any(|&(start, end)| {
                    let from = if settled { start + settle } else { start };
                    from <= t && t < end
                })
            };
            let mut figures = RoutingFigures {
                phase: rule.phase.clone(),
                answered_by: rule.answered_by.clone(),
                settled_by: rule.settled().to_vec(),
                settled_from_s: spans
                    .first()
                    .map_or(0.0, |&(start, _)| seconds(start + settle)),
                conns: 0,
                answered: BTreeMap::new(),
                settled_conns: 0,
                settled_answered: BTreeMap::new(),
                refusals: BTreeMap::new(),
                interleaved: 0,
            };
            // The regions' runs of answers, in opening order: one region's
            // answers after another's took over are interleaved.
            let mut closed: Vec<String> = Vec::new();
            let mut current: Option<String> = None;
            for c in conns {
                let region = c
                    .backend
                    .as_ref()
                    .filter(|_| c.outcome == Outcome::Answered)
                    .map(|b| {
                        timeline
                            .backend_regions
                            .get(b)
                            .cloned()
                            .unwrap_or_else(|| format!("unknown backend {b}"))
                    });
                if within(c.t_ms, false) {
                    figures.conns += 1;
                    if let Some(r) = &region {
                        *figures.answered.entry(r.clone()).or_default() += 1;
                        if closed.contains(r) {
                            figures.interleaved += 1;
                        } else if current.as_ref() != Some(r) {
                            closed.extend(current.replace(r.clone()));
                        }
                    }
                }
                if within(c.t_ms, true) {
                    figures.settled_conns += 1;
                    if let Some(r) = region {
                        *figures.settled_answered.entry(r).or_default() += 1;
                    }
                }
            }
            for a in timeline
                .region_answers
                .iter()
                .filter(|a| within(a.t_ms, true))
            {
                let refusal = a.refused.clone().unwrap_or_else(|| "none".to_owned());
                *figures.refusals.entry(refusal).or_default() += 1;
            }
            figures
        })
        .collect();
    let last_reading = events.iter().rev().find_map(|e| match e {
        Event::Step { t_ms, action, .. } if action == "read-writers" => Some(*t_ms),
        _ => None,
    });
    let writers = events
        .iter()
        .filter_map(|e| match e {
            Event::Writer {
                t_ms,
                region,
                epoch,
                owner,
                settled,
            } if Some(*t_ms) == last_reading => Some(WriterReading {
                region: region.clone(),
                epoch: *epoch,
                owner: owner.clone(),
                settled: *settled,
            }),
            _ => None,
        })
        .collect();
    Some(RegionsFigures {
        regions: regions.len() as u32,
        routing,
        writers,
    })
}
