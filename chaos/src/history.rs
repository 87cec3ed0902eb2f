//! The history check of a chaos run: what the harness's clients were told,
//! the arbiter's audit log and the final catalog must tell one story.
//!
//! The audit log names every catalog change (R10), so replaying it gives
//! each instance's state at every revision. From that replay this module
//! derives, without asking the control plane's opinion of itself:
//!
//! - *Ready* and *leave* events for the report (the first READY of an
//!   instance, each commit of DRAINING or UNHEALTHY by a transition);
//! - *false removals*: an instance leaving READY (a transition, a node-down
//!   verdict, a lease expiry or revocation, a deregistration) while the
//!   scenario had caused nothing to it or its node since it was last
//!   READY — a live, healthy backend the control plane took out;
//! - *lost writes*: every registration, drain or deregistration an agent
//!   answered as committed (200), or as pending (202), must appear in the
//!   audit log after the write was sent, in the order the client made
//!   them, with the generation the agent answered; a pending one that
//!   never committed counts only when nothing recorded later made it moot
//!   (its instance deregistered, or its node's lease ended or declared
//!   down);
//! - a mismatch between the replay's final state and the final catalog as
//!   an agent serves it (every record, `all=true`), when one was read.
//!
//! Pure: times are wall-clock milliseconds passed in, nothing here reads a
//! clock, a socket or a file.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;

/// One entry of the arbiter's audit log, as `GET /v1/audit` answers it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct AuditEntry {
    /// The revision that committed it.
    pub revision: u64,
    /// When it was proposed, ms since the Unix epoch.
    pub at_ms: u64,
    /// `role:name`.
    pub actor: String,
    /// The command's kind (`register`, `transition`, `node-down`, …).
    pub command: String,
    /// The instance the command named, if any.
    pub instance: Option<String>,
    /// The detail line.
    pub detail: String,
}

/// A write the harness made through an agent's local API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    /// When it was sent, wall ms.
    pub sent_ms: u64,
    /// What it asked for.
    pub kind: WriteKind,
    /// The instance it named.
    pub instance: String,
    /// What the agent answered.
    pub answer: Answer,
}

/// The kinds of writes the harness makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteKind {
    /// `PUT /v1/agent/instances`.
    Register,
    /// `PUT /v1/agent/instances/{id}/drain`.
    Drain,
    /// `DELETE /v1/agent/instances/{id}`.
    Deregister,
}

impl WriteKind {
    fn as_str(self) -> &'static str {
        match self {
            WriteKind::Register => "registration",
            WriteKind::Drain => "drain",
            WriteKind::Deregister => "deregistration",
        }
    }
}

/// The agent's answer to a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// 200: committed; a registration's answer carries its generation.
    Committed {
        /// The generation the answer named (registrations only).
        generation: Option<u64>,
    },
    /// 202: accepted locally, to be committed when the arbiter answers.
    Pending,
    /// Anything else: the client was told it did not happen.
    Refused,
}

/// Something the scenario did to an instance at `at_ms` (wall ms) that
/// may take it out of READY: a drain, a failed readiness, a killed or
/// frozen backend, a crashed node, a deregistration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cause {
    /// When, wall ms.
    pub at_ms: u64,
    /// The instance.
    pub instance: String,
    /// What was done (for the failure text).
    pub what: String,
}

/// A record of the final catalog as an agent serves it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FinalRecord {
    /// Its generation.
    pub generation: u64,
    /// Its state (`READY`, …).
    pub state: String,
}

/// An instance the control plane took out of READY although the scenario
/// did nothing to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Removal {
    /// When, wall ms (the command's time).
    pub at_ms: u64,
    /// The instance.
    pub instance: String,
    /// The audit entry's command and detail.
    pub how: String,
}

/// What the check found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    /// Each time an instance of the judged service became READY, (wall ms,
    /// instance), in order.
    pub ready: Vec<(u64, String)>,
    /// Each commit of DRAINING or UNHEALTHY by a transition (a leave's
    /// start) of an instance of the judged service, (wall ms, instance),
    /// in order; UNHEALTHY commits of instances in `not_leaves` are left
    /// out.
    pub leaves: Vec<(u64, String)>,
    /// Live, healthy instances taken out of READY.
    pub false_removals: Vec<Removal>,
    /// Writes checked (every write answered 200 or 202).
    pub writes_checked: u64,
    /// One sentence per lost or misplaced write, and per disagreement
    /// between the replay and the final catalog.
    pub lost_writes: Vec<String>,
}

/// Replays `audit` and checks it against what the clients were told.
///
/// `nodes` maps each node to every instance of the judged service that
/// ever ran on it (only they are compared with the final catalog); `causes`
/// are what the scenario did; `not_leaves` are instances whose UNHEALTHY
/// commits are not leaves (a bad probe failed them while they served);
/// `final_catalog` is every record of the service as an agent served it
/// after the last audited change, when it could be read; `from_ms` is the
/// start of the judged window (removals before it are not judged).
pub fn check(
    audit: &[AuditEntry],
    nodes: &BTreeMap<String, Vec<String>>,
    causes: &[Cause],
    writes: &[Write],
    not_leaves: &[String],
    final_catalog: Option<&BTreeMap<String, FinalRecord>>,
    from_ms: u64,
) -> History {
    let mut history = History::default();
    let mut entries: Vec<&AuditEntry> = audit.iter().collect();
    entries.sort_by_key(|e| e.revision);
    let mut causes: Vec<&Cause> = causes.iter().collect();
    causes.sort_by_key(|c| c.at_ms);

    let judged = |i: &str| nodes.values().flatten().any(|x| x == i);
    let mut states: BTreeMap<String, Replayed> = BTreeMap::new();
    // Per instance, each state the log gave it, (command ms, state; None
    // once removed), in revision order.
    let mut timeline: HashMap<String, Vec<(u64, Option<String>)>> = HashMap::new();
    // Per instance, the cause in force since its last READY.
    let mut caused: HashMap<&str, &Cause> = HashMap::new();
    let mut next_cause = 0;
    for entry in &entries {
        while next_cause < causes.len() && causes[next_cause].at_ms <= entry.at_ms {
            let cause = causes[next_cause];
            caused.insert(cause.instance.as_str(), cause);
            next_cause += 1;
        }
        for (instance, change) in changes(entry, nodes, &states) {
            let before = states.get(&instance).map(|r| r.state.clone());
            let was_ready = before.as_deref() == Some("READY");
            let after = match &change {
                Change::To { state, .. } => Some(state.as_str()),
                Change::Removed => None,
            };
            if after == Some("READY") && !was_ready {
                if judged(&instance) {
                    history.ready.push((entry.at_ms, instance.clone()));
                }
                caused.remove(instance.as_str());
            }
            if judged(&instance)
                && entry.command == "transition"
                && matches!(after, Some("DRAINING") | Some("UNHEALTHY"))
                && !(after == Some("UNHEALTHY") && not_leaves.contains(&instance))
            {
                history.leaves.push((entry.at_ms, instance.clone()));
            }
            if was_ready
                && after != Some("READY")
                && entry.at_ms >= from_ms
                && !caused.contains_key(instance.as_str())
            {
                history.false_removals.push(Removal {
                    at_ms: entry.at_ms,
                    instance: instance.clone(),
                    how: format!("{}: {}", entry.command, entry.detail),
                });
            }
            timeline
                .entry(instance.clone())
                .or_default()
                .push((entry.at_ms, after.map(str::to_owned)));
            match change {
                Change::To { state, generation } => {
                    let generation =
                        generation.or_else(|| states.get(&instance).map(|r| r.generation));
                    states.insert(
                        instance,
                        Replayed {
                            generation: generation.unwrap_or(0),
                            state,
                            purgeable: false,
                        },
                    );
                }
                Change::Removed => {
                    states.remove(&instance);
                }
            }
        }
        if entry.command == "purge" {
            for r in states.values_mut() {
                r.purgeable |= r.state == "EXPIRED";
            }
        }
    }

    check_writes(&entries, nodes, writes, &timeline, &mut history);
    if let Some(catalog) = final_catalog {
        // The final catalog is of the judged service: its instances are
        // the ones `nodes` lists.
        states.retain(|i, _| judged(i));
        compare_final(&states, catalog, &mut history);
    }
    history
}

/// An instance's state as the replay knows it.
#[derive(Clone, Debug)]
struct Replayed {
    generation: u64,
    state: String,
    /// EXPIRED when a purge ran: it may be gone from the catalog.
    purgeable: bool,
}

enum Change {
    To {
        state: String,
        generation: Option<u64>,
    },
    Removed,
}

/// What one audit entry did to which instances.
fn changes(
    entry: &AuditEntry,
    nodes: &BTreeMap<String, Vec<String>>,
    states: &BTreeMap<String, Replayed>,
) -> Vec<(String, Change)> {
    let d = entry.detail.as_str();
    let named = || entry.instance.clone().into_iter();
    match entry.command.as_str() {
        "register" => named()
            .filter_map(|i| {
                // "registered generation 2 READY on node-1 at …"
                let mut words = d.strip_prefix("registered generation ")?.split(' ');
                let generation = words.next()?.parse().ok();
                let state = words.next()?.to_owned();
                Some((i, Change::To { state, generation }))
            })
            .collect(),
        "transition" => named()
            .filter_map(|i| {
                // "-> DRAINING (generation 3): reason"
                let mut words = d.strip_prefix("-> ")?.split(' ');
                let state = words.next()?.to_owned();
                let generation = words
                    .next()
                    .filter(|w| *w == "(generation")
                    .and_then(|_| words.next())
                    .and_then(|g| g.trim_end_matches("):").parse().ok());
                Some((i, Change::To { state, generation }))
            })
            .collect(),
        "deregister" => named().map(|i| (i, Change::Removed)).collect(),
        "node-down" | "expire-lease" | "revoke-lease" => {
            // "node down node-1 epoch 3 …: 2 records UNHEALTHY", "lease
            // expired node-1 epoch 3: 2 records EXPIRED", "lease revoked …".
            let (to, moves): (&str, fn(&str) -> bool) = match entry.command.as_str() {
                "node-down" => ("UNHEALTHY", |s| matches!(s, "STARTING" | "READY")),
                _ => ("EXPIRED", |s| s != "EXPIRED"),
            };
            let marked = d.contains(&format!("records {to}"));
            let node = ["node down ", "lease expired ", "lease revoked "]
                .iter()
                .find_map(|p| d.strip_prefix(p))
                .and_then(|rest| rest.split(' ').next());
            match (marked, node.and_then(|n| nodes.get(n))) {
                (true, Some(instances)) => instances
                    .iter()
                    .filter(|i| states.get(*i).is_some_and(|r| moves(&r.state)))
                    .map(|i| {
                        (
                            i.clone(),
                            Change::To {
                                state: to.to_owned(),
                                generation: None,
                            },
                        )
                    })
                    .collect(),
                _ => Vec::new(),
            }
        }
        _ => Vec::new(),
    }
}

/// Every write answered 200 or 202 must be in the audit log, after it was
/// sent, in the client's order per instance. A drain of an instance the
/// log had already left DRAINING when it was sent changes nothing: the
/// arbiter answers it committed without a revision, and no entry is due.
fn check_writes(
    entries: &[&AuditEntry],
    nodes: &BTreeMap<String, Vec<String>>,
    writes: &[Write],
    timeline: &HashMap<String, Vec<(u64, Option<String>)>>,
    history: &mut History,
) {
    let node_of: HashMap<&str, &str> = nodes
        .iter()
        .flat_map(|(n, is)| is.iter().map(move |i| (i.as_str(), n.as_str())))
        .collect();
    // Per instance, the revision of the last write matched.
    let mut matched: HashMap<&str, u64> = HashMap::new();
    for write in writes {
        if write.answer == Answer::Refused {
            continue;
        }
        history.writes_checked += 1;
        let instance = write.instance.as_str();
        let after = matched.get(instance).copied().unwrap_or(0);
        let found = entries.iter().find(|e| {
            e.revision > after
                && e.instance.as_deref() == Some(instance)
                // The proposer's clock and the harness's are the same host's.
                && e.at_ms + CLOCK_SLACK_MS >= write.sent_ms
                && is_write(e, write.kind)
        });
        match found {
            Some(entry) => {
                matched.insert(instance, entry.revision);
                if let Answer::Committed {
                    generation: Some(g),
                } = write.answer
                {
                    let logged = entry
                        .detail
                        .strip_prefix("registered generation ")
                        .and_then(|r| r.split(' ').next())
                        .and_then(|g| g.parse::<u64>().ok());
                    if logged != Some(g) {
                        history.lost_writes.push(format!(
                            "{instance}: the agent answered generation {g} for its registration, the audit log says {logged:?} (revision {})",
                            entry.revision
                        ));
                    }
                }
            }
            None if write.kind == WriteKind::Drain
                && matches!(write.answer, Answer::Committed { .. })
                && state_when(timeline, instance, write.sent_ms) == Some("DRAINING") => {}
            None => {
                let moot = write.answer == Answer::Pending
                    && entries.iter().any(|e| {
                        e.revision > after
                            && e.at_ms + CLOCK_SLACK_MS >= write.sent_ms
                            && ended(e, instance, node_of.get(instance).copied())
                    });
                if !moot {
                    history.lost_writes.push(format!(
                        "{instance}: a {} answered {} at {} ms is not in the audit log after revision {after}",
                        write.kind.as_str(),
                        match write.answer {
                            Answer::Committed { .. } => "committed (200)",
                            _ => "pending (202) and never committed",
                        },
                        write.sent_ms
                    ));
                }
            }
        }
    }
}

/// The state the log had given `instance` by `at_ms` (wall ms), if any.
fn state_when<'a>(
    timeline: &'a HashMap<String, Vec<(u64, Option<String>)>>,
    instance: &str,
    at_ms: u64,
) -> Option<&'a str> {
    timeline
        .get(instance)?
        .iter()
        .take_while(|(t, _)| *t <= at_ms)
        .last()
        .and_then(|(_, state)| state.as_deref())
}

/// How far the audit log's command time may precede the client's send
/// time and still be that write. Both clocks are this host's, but the
/// arbiter's core stamps a whole batch of messages with one clock reading
/// taken when it woke up, before the later ones of the batch were sent;
/// under load a batch takes a while. The order of a client's writes is
/// checked by revision, not by time.
const CLOCK_SLACK_MS: u64 = 2_000;

fn is_write(entry: &AuditEntry, kind: WriteKind) -> bool {
    match kind {
        WriteKind::Register => entry.command == "register",
        WriteKind::Drain => {
            entry.command == "transition" && entry.detail.starts_with("-> DRAINING")
        }
        WriteKind::Deregister => entry.command == "deregister",
    }
}

/// Whether `entry` ended `instance` (deregistered it, or ended or downed
/// the lease of its node), making a pending write about it moot.
fn ended(entry: &AuditEntry, instance: &str, node: Option<&str>) -> bool {
    if entry.command == "deregister" && entry.instance.as_deref() == Some(instance) {
        return true;
    }
    let Some(node) = node else {
        return false;
    };
    matches!(
        entry.command.as_str(),
        "node-down" | "expire-lease" | "revoke-lease"
    ) && entry.detail.contains(&format!(" {node} epoch "))
        && entry.detail.contains(" records ")
}

fn compare_final(
    states: &BTreeMap<String, Replayed>,
    catalog: &BTreeMap<String, FinalRecord>,
    history: &mut History,
) {
    for (instance, replayed) in states {
        match catalog.get(instance) {
            None if replayed.purgeable => {}
            None => history.lost_writes.push(format!(
                "{instance}: the audit log leaves it {} (generation {}), the final catalog does not hold it",
                replayed.state, replayed.generation
            )),
            Some(r) if r.generation != replayed.generation || r.state != replayed.state => {
                history.lost_writes.push(format!(
                    "{instance}: the audit log leaves it {} (generation {}), the final catalog holds {} (generation {})",
                    replayed.state, replayed.generation, r.state, r.generation
                ))
            }
            Some(_) => {}
        }
    }
    for (instance, r) in catalog {
        if !states.contains_key(instance) {
            history.lost_writes.push(format!(
                "{instance}: the final catalog holds it {} (generation {}), the audit log never registered it or deregistered it",
                r.state, r.generation
            ));
        }
    }
}

#[cfg(test)]
mod tests;
