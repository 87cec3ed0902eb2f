//! Per-instance samples behind the leave and crash figures, and the
//! agents' view history the dips are counted from.

use super::*;

/// One per-instance duration behind [`Report::leave_ms`] or
/// [`Report::crash_ms`]: what the report summarizes and the plots draw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    /// The instance it is about.
    pub instance: String,
    /// When its clock started (the leave's commit, or the hard failure), ms
    /// since the run started.
    pub start_ms: u64,
    /// The duration, ms.
    pub ms: u64,
}

/// Every sample of a run, in the order their clocks started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Samples {
    /// One per leave (see [`compute`] for when a leave starts and ends).
    pub leave: Vec<Sample>,
    /// One per `HardFailure` event.
    pub crash: Vec<Sample>,
    /// One per leave that some live agent's view held at its commit.
    pub leave_view: Vec<Sample>,
    /// One per `HardFailure` that some live agent's view held then.
    pub crash_view: Vec<Sample>,
}

/// The per-instance samples that [`compute`] summarizes as `leave_ms` and
/// `crash_ms`, by the rules documented there: exactly the report's numbers.
pub fn samples(timeline: &Timeline) -> Samples {
    let (conns, events) = sorted(timeline);
    samples_of(
        &conns,
        &events,
        &timeline.routes,
        &timeline.views,
        timeline.duration_ms,
    )
}

/// The timeline's connections and events, sorted by time (stable, so
/// records of the same millisecond keep their recorded order).
pub(super) fn sorted(timeline: &Timeline) -> (Vec<&Conn>, Vec<&Event>) {
    let mut conns: Vec<&Conn> = timeline.conns.iter().collect();
    conns.sort_by_key(|c| c.t_ms);
    let mut events: Vec<&Event> = timeline.events.iter().collect();
    events.sort_by_key(|e| e.t_ms());
    (conns, events)
}

/// [`samples`] from connections and events already sorted by time.
pub(super) fn samples_of(
    conns: &[&Conn],
    events: &[&Event],
    routes: &[Route],
    views: &[Route],
    run_end_ms: u64,
) -> Samples {
    let history = ViewHistory::new(views, events, run_end_ms);
    let leave_view = leaves(events)
        .iter()
        .filter_map(|leave| {
            let ms = history.last_drop(leave.instance, leave.start, leave.end)?;
            Some(Sample {
                instance: leave.instance.to_owned(),
                start_ms: leave.start,
                ms,
            })
        })
        .collect();
    let crash_view = events
        .iter()
        .filter_map(|e| match e {
            Event::HardFailure { t_ms, instance, .. } => {
                let back = next_ready(events, instance, *t_ms);
                let ms = history.last_drop(instance, *t_ms, back)?;
                Some(Sample {
                    instance: instance.clone(),
                    start_ms: *t_ms,
                    ms,
                })
            }
            _ => None,
        })
        .collect();
    let leave = leaves(events)
        .iter()
        .map(|leave| {
            let last = conns
                .iter()
                .filter(|c| answered_by(c, leave.instance) && leave.contains(c.t_ms))
                .map(|c| c.t_ms)
                .max();
            Sample {
                instance: leave.instance.to_owned(),
                start_ms: leave.start,
                ms: last.map_or(0, |t| t - leave.start),
            }
        })
        .collect();
    let crash = events
        .iter()
        .filter_map(|e| match e {
            Event::HardFailure { t_ms, instance, .. } => {
                // Until the instance is READY again (its node restarted).
                let back = next_ready(events, instance, *t_ms);
                Some(Sample {
                    instance: instance.clone(),
                    start_ms: *t_ms,
                    ms: crash_time(conns, routes, instance, *t_ms, back),
                })
            }
            _ => None,
        })
        .collect();
    Samples {
        leave,
        crash,
        leave_view,
        crash_view,
    }
}

/// When `instance` was next READY, or its process running again (its node
/// restarted), after `t`, if it was: the end of a hard failure's window.
pub(super) fn next_ready(events: &[&Event], instance: &str, t: u64) -> Option<u64> {
    events.iter().find_map(|e| match e {
        Event::Ready { t_ms, instance: i } | Event::Restarted { t_ms, instance: i }
            if i == instance && *t_ms > t =>
        {
            Some(*t_ms)
        }
        _ => None,
    })
}

/// Every agent's view changes, and when its node was down (a
/// `crash-node` step until its `restart-node` step): a down agent's view
/// is not read, and says nothing.
pub(super) struct ViewHistory<'a> {
    by_agent: HashMap<&'a str, Vec<(u64, &'a [String])>>,
    down: HashMap<&'a str, Vec<(u64, u64)>>,
    end: u64,
}

impl<'a> ViewHistory<'a> {
    pub(super) fn new(views: &'a [Route], events: &[&'a Event], end: u64) -> Self {
        let mut by_agent: HashMap<&str, Vec<(u64, &[String])>> = HashMap::new();
        for v in views {
            by_agent
                .entry(v.agent.as_str())
                .or_default()
                .push((v.t_ms, v.instances.as_slice()));
        }
        for list in by_agent.values_mut() {
            list.sort_by_key(|(t, _)| *t);
        }
        let mut down: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
        let mut since: HashMap<&str, u64> = HashMap::new();
        for e in events {
            if let Event::Step {
                t_ms,
                action,
                target,
            } = e
            {
                match action.as_str() {
                    "crash-node" => {
                        since.insert(target.as_str(), *t_ms);
                    }
                    "restart-node" => {
                        if let Some(from) = since.remove(target.as_str()) {
                            down.entry(target).or_default().push((from, *t_ms));
                        }
                    }
                    _ => {}
                }
            }
        }
        for (agent, from) in since {
            down.entry(agent).or_default().push((from, end.max(from)));
        }
        ViewHistory {
            by_agent,
            down,
            end,
        }
    }

    fn down_within(&self, agent: &str, from: u64, to: u64) -> bool {
        self.down
            .get(agent)
            .is_some_and(|spans| spans.iter().any(|(a, b)| *a <= to && from <= *b))
    }

    /// From `from`, how long until the last agent whose view held
    /// `instance` then no longer did (each agent's first later view
    /// without it; one that still held it at `until`, or at the end of the
    /// run, counts until then). Only agents whose view was read before
    /// `from` and that were up throughout count; `None` when none held it.
    fn last_drop(&self, instance: &str, from: u64, until: Option<u64>) -> Option<u64> {
        let until = until.unwrap_or(self.end).min(self.end);
        let mut last = None;
        for (agent, list) in &self.by_agent {
            let Some(at_from) = list.iter().rposition(|(t, _)| *t <= from) else {
                continue;
            };
            if !list[at_from].1.iter().any(|i| i == instance) {
                continue;
            }
            let dropped = list[at_from + 1..]
                .iter()
                .find(|(t, set)| *t < until && !set.iter().any(|i| i == instance))
                .map_or(until, |(t, _)| *t);
            if self.down_within(agent, from, dropped) {
                continue;
            }
            let ms = dropped.saturating_sub(from);
            last = Some(last.map_or(ms, |m: u64| m.max(ms)));
        }
        last
    }
}

/// How far before an instance left a view a fault of the scenario may lie
/// and still explain it: the hard-failure SLO (a crash is out of the views
/// within it), ms.
pub(super) const DIP_CAUSE_MS: u64 = rollcall_config::HARD_FAILURE_SLO_MS as u64;

/// Counts the dips of every live agent's view: an instance the view held,
/// then did not, then held again, with no leave commit (DRAINING or
/// UNHEALTHY), hard failure, restart or first READY of that instance from
/// [`DIP_CAUSE_MS`] before it left until it came back, and the agent up
/// throughout. Such a dip is a local exclusion the catalog never recorded:
/// a gossip down verdict about a live node that the arbiter then refused.
/// Views are read by blocking resolves, so a dip shorter than one resolve's
/// round trip can be missed; a dip that never comes back is not counted
/// here (the catalog's false removals cover a removal that sticks).
pub(super) fn view_dips(history: &ViewHistory, events: &[&Event]) -> u64 {
    let caused = |instance: &str, from: u64, to: u64| {
        events.iter().any(|e| {
            let about = match e {
                Event::LeaveCommitted { instance, .. }
                | Event::HardFailure { instance, .. }
                | Event::Ready { instance, .. }
                | Event::BackendExit { instance, .. }
                | Event::Restarted { instance, .. } => instance.as_str(),
                _ => return false,
            };
            about == instance && (from..=to).contains(&e.t_ms())
        })
    };
    let mut dips = 0;
    for (agent, list) in &history.by_agent {
        let mut gone: HashMap<&str, u64> = HashMap::new();
        for pair in list.windows(2) {
            let ((_, before), (t, after)) = (&pair[0], &pair[1]);
            for instance in before.iter().filter(|i| !after.contains(i)) {
                gone.entry(instance.as_str()).or_insert(*t);
            }
            for instance in after.iter() {
                if let Some(left) = gone.remove(instance.as_str()) {
                    let from = left.saturating_sub(DIP_CAUSE_MS);
                    if !caused(instance, from, *t) && !history.down_within(agent, left, *t) {
                        dips += 1;
                    }
                }
            }
        }
    }
    dips
}
