//! When the agents agreed again after the last recovery: `converge_ms`.

use super::*;

/// The `Step` actions the runner records for a recovery from a fault: the
/// start of the convergence clock (see [`converge_ms`]).
pub const RECOVERY_ACTIONS: [&str; 7] = [
    "heal",
    "start-arbiters",
    "restore-quorum",
    "resume-agent",
    "restart-agents",
    "restart-node",
    "corrupt-cache",
];

/// How close to the run's last route sample an agent's last sample must
/// be for the agent to count in [`converge_ms`], in ms. Every live agent is
/// sampled once per round; a round takes [`ROUTE_SAMPLE_MS`], or longer
/// while a paused agent makes the sampler wait for its 500 ms timeout, so
/// an agent sampled less recently than this is no longer answering (its
/// node crashed, or it is paused) and routes nothing.
pub const SAMPLED_AT_END_MS: u64 = 2_000;

/// How long the agents took to agree again after the last recovery, in ms,
/// from the timeline's route samples. The rule:
///
/// - The clock starts at the last `Step` event whose action is one of
///   [`RECOVERY_ACTIONS`]; without one there is nothing to converge from
///   and the result is `None`.
/// - Only route samples taken at or after that moment count, and only
///   those of agents still sampled at the end of the run (their last sample
///   at most [`SAMPLED_AT_END_MS`] before the run's last sample). A sample
///   is compared as a set of instance ids: order and repeats do not matter.
/// - The agents must end on one common set; if their last samples differ,
///   they never converged and the result is `None` (as it is when no
///   sample was taken after the recovery).
/// - An agent settles at its first sample after its last sample that
///   differed from the common set (at the recovery itself if none
///   differed). The run converged when the last agent settled: from then
///   on every counted sample is the common set until the end of the run.
///
/// The result is that moment minus the recovery. It is accurate to the
/// sampling period ([`ROUTE_SAMPLE_MS`]): an agent that changed between two
/// samples is seen at the later one. It is judged only when the scenario's
/// [`Pass`] sets `max_converge_ms` (then never converging fails too).
pub fn converge_ms(timeline: &Timeline) -> Option<u64> {
    let recovery = timeline
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Step { t_ms, action, .. } if RECOVERY_ACTIONS.contains(&action.as_str()) => {
                Some(*t_ms)
            }
            _ => None,
        })
        .max()?;
    let mut after: Vec<&Route> = timeline
        .routes
        .iter()
        .filter(|r| r.t_ms >= recovery)
        .collect();
    after.sort_by_key(|r| r.t_ms);
    let end = after.last()?.t_ms;

    // Each agent's samples after the recovery, in time order, as sets.
    let mut by_agent: HashMap<&str, Vec<(u64, Vec<&str>)>> = HashMap::new();
    for route in &after {
        let mut set: Vec<&str> = route.instances.iter().map(String::as_str).collect();
        set.sort_unstable();
        set.dedup();
        by_agent
            .entry(route.agent.as_str())
            .or_default()
            .push((route.t_ms, set));
    }
    by_agent.retain(|_, samples| {
        samples
            .last()
            .is_some_and(|(t, _)| t + SAMPLED_AT_END_MS >= end)
    });

    let common = &by_agent.values().next()?.last()?.1;
    if by_agent
        .values()
        .any(|samples| samples.last().is_some_and(|(_, set)| set != common))
    {
        return None;
    }
    let settled = by_agent.values().filter_map(|samples| {
        let last_differing = samples.iter().rposition(|(_, set)| set != common)?;
        // The agent's last sample is the common set, so one follows.
        samples.get(last_differing + 1).map(|(t, _)| *t)
    });
    Some(settled.max().unwrap_or(recovery) - recovery)
}
