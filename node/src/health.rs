//! The health of one registered instance (R4): which of its probes are due,
//! and how their results move it between STARTING, READY and UNHEALTHY, and
//! its liveness between unknown, passing and failing.
//!
//! Sans-IO like the other state machines: time comes in as `now_ms`
//! (milliseconds on whatever monotonic clock the caller keeps, the same one
//! for every call), randomness as a `&mut impl Rng` (the agent passes its
//! thread rng, tests a seeded `StdRng`, so a failing seed replays). The probes
//! it wants run come out of [`InstanceHealth::due`] as [`ProbeTask`]s; the
//! driver runs them (`prober.rs`) and feeds each outcome back through
//! [`InstanceHealth::result`]. TTL checks need no IO and are evaluated here
//! when they are due. This module must not read clocks, open sockets, spawn
//! tasks or talk to the arbiter: it only says what changed.
//!
//! Rules:
//! - Startup gates the others: until it has passed `success_threshold`
//!   consecutive times, readiness and liveness are not probed and the
//!   instance is STARTING. Failing `failure_threshold` times before that
//!   keeps it STARTING (with a reason, [`HealthEvent::StartupFailing`]) and
//!   probing continues. Once passed, startup is never probed again.
//! - After startup (at once without a startup check): READY after
//!   `success_threshold` consecutive readiness passes, or at once without a
//!   readiness check. `failure_threshold` consecutive readiness failures make
//!   it UNHEALTHY, `success_threshold` consecutive passes READY again.
//! - Liveness flips between passing and failing by the same thresholds and
//!   never changes the state: it is for the supervisor.
//! - A TTL check passes at a tick iff the last heartbeat (the registration
//!   counts as the first) is at most `ttl_ms` old.
//! - Each check's first probe falls at a random offset within its first
//!   interval, so a node's probes never fire in lockstep. Each next probe
//!   starts `interval_ms × (1 + U[0, jitter])` after the previous one
//!   *started* (as `CheckTiming::interval_ms` defines it, and as the
//!   detection budget counts it), or as soon as its result is in if that is
//!   later. A check whose probe is running is never started again.

use std::fmt;
use std::net::SocketAddr;

use rand::{Rng, RngExt};
use rollcall_config::CheckTiming;
use rollcall_leases::{Liveness, State};

use crate::api_types::{Check, CheckKind, ValidChecks};

/// Which of an instance's three checks a probe or result belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Which {
    /// Gates the other two until it first passes.
    Startup,
    /// Failing removes new traffic.
    Readiness,
    /// Failing is reported to the supervisor.
    Liveness,
}

impl Which {
    /// The name used in reasons and logs (`readiness`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Which::Startup => "startup",
            Which::Readiness => "readiness",
            Which::Liveness => "liveness",
        }
    }
}

impl fmt::Display for Which {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A probe that needs IO: the kinds of [`CheckKind`] the prober runs. TTL
/// checks have no variant here because this state machine evaluates them,
/// so a TTL check can never be handed to the prober by mistake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeKind {
    /// GET `path` on the instance; 2xx and 3xx pass.
    Http {
        /// Starts with '/' (validated at registration).
        path: String,
    },
    /// A TCP connect to the instance.
    Tcp,
}

/// A probe to start now; report its outcome with [`InstanceHealth::result`]
/// and the same `which`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeTask {
    /// The check it belongs to.
    pub which: Which,
    /// The instance's address and port.
    pub target: SocketAddr,
    /// What to do.
    pub kind: ProbeKind,
    /// How long the probe may take before it counts as failed, in ms.
    pub timeout_ms: u64,
}

/// A change of the instance's health, emitted only when something changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthEvent {
    /// The instance became READY (startup and readiness passed, or passed
    /// again after UNHEALTHY).
    Ready,
    /// Readiness failed its threshold: the instance is UNHEALTHY.
    Unhealthy {
        /// Which check, what it probed and what happened, e.g. `readiness
        /// http GET /healthz: status 503 (3 consecutive failures)`.
        reason: String,
    },
    /// Startup failed its threshold without ever passing. The instance stays
    /// STARTING (it never routes) and startup keeps being probed; this is
    /// for logs, the status API and the supervisor.
    StartupFailing {
        /// Same shape as [`HealthEvent::Unhealthy`]'s reason.
        reason: String,
    },
    /// The liveness verdict changed.
    Liveness(Liveness),
}

/// What [`InstanceHealth::due`] found due.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Due {
    /// Probes to start now, at most one per check.
    pub probes: Vec<ProbeTask>,
    /// Changes caused by TTL checks, which were evaluated on the spot.
    pub events: Vec<HealthEvent>,
}

/// Where one check is in its cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Schedule {
    /// Waiting for startup to pass.
    Gated,
    /// Next probe due at this time.
    At(u64),
    /// A probe started at this time and has not reported yet.
    Running { since: u64 },
    /// A startup check that has passed: never probed again.
    Done,
}

/// One configured check and its counters.
#[derive(Debug, Clone)]
struct Slot {
    which: Which,
    check: Check,
    schedule: Schedule,
    /// `None` until the first threshold is reached, then whether it passes.
    verdict: Option<bool>,
    passes: u32,
    failures: u32,
}

impl Slot {
    /// Counts one result; returns the new verdict if it changed.
    fn count(&mut self, passed: bool) -> Option<bool> {
        let timing = &self.check.timing;
        let reached = if passed {
            self.passes = self.passes.saturating_add(1);
            self.failures = 0;
            self.passes >= timing.success_threshold
        } else {
            self.failures = self.failures.saturating_add(1);
            self.passes = 0;
            self.failures >= timing.failure_threshold
        };
        (reached && self.verdict != Some(passed)).then(|| {
            self.verdict = Some(passed);
            passed
        })
    }
}

/// The health of one instance: its checks, their schedules and counters, and
/// the resulting state and liveness. One per registration (a re-registration
/// starts a new one); the driver must feed back the outcome of every
/// [`ProbeTask`] it got, exactly once.
#[derive(Debug, Clone)]
pub struct InstanceHealth {
    target: SocketAddr,
    /// The configured checks, in the order startup, readiness, liveness.
    slots: Vec<Slot>,
    state: State,
    reason: Option<String>,
    liveness: Liveness,
    last_heartbeat_ms: u64,
}

impl InstanceHealth {
    /// The health of an instance registered at `now_ms` with `checks`
    /// (`None`: no checks, READY at once) and probed at `target`. Each
    /// startable check gets its first probe at a random point of its first
    /// interval. Check [`InstanceHealth::state`] afterwards: an instance
    /// without startup and readiness checks starts READY, with no event.
    pub fn new<R: Rng + ?Sized>(
        checks: Option<&ValidChecks>,
        target: SocketAddr,
        now_ms: u64,
        rng: &mut R,
    ) -> Self {
        let (startup, readiness, liveness) = checks.map_or((None, None, None), |c| {
            (
                c.startup.as_ref(),
                c.readiness.as_ref(),
                c.liveness.as_ref(),
            )
        });
        let gated = startup.is_some();
        let slots = [
            (Which::Startup, startup),
            (Which::Readiness, readiness),
            (Which::Liveness, liveness),
        ]
        .into_iter()
        .filter_map(|(which, check)| {
            let check = check?.clone();
            let schedule = if gated && which != Which::Startup {
                Schedule::Gated
            } else {
                Schedule::At(first_due(now_ms, &check.timing, rng))
            };
            Some(Slot {
                which,
                check,
                schedule,
                verdict: None,
                passes: 0,
                failures: 0,
            })
        })
        .collect();
        InstanceHealth {
            target,
            slots,
            state: if gated || readiness.is_some() {
                State::Starting
            } else {
                State::Ready
            },
            reason: None,
            liveness: Liveness::Unknown,
            last_heartbeat_ms: now_ms,
        }
    }

    /// The current state: STARTING, READY or UNHEALTHY.
    pub fn state(&self) -> State {
        self.state
    }

    /// The current liveness verdict (unknown without a liveness check or
    /// until it reaches a threshold).
    pub fn liveness(&self) -> Liveness {
        self.liveness
    }

    /// Why the instance is UNHEALTHY, or why it is stuck STARTING (startup
    /// failed its threshold); `None` otherwise.
    pub fn reason(&self) -> Option<&str> {
        self.reason.as_deref()
    }

    /// Records a heartbeat from the instance at `now_ms`. TTL checks look at
    /// it at their next tick, not now.
    pub fn heartbeat(&mut self, now_ms: u64) {
        self.last_heartbeat_ms = self.last_heartbeat_ms.max(now_ms);
    }

    /// When [`InstanceHealth::due`] has something to do next; `None` while
    /// every check is running, gated or done (a result or a passing startup
    /// check reschedules).
    pub fn next_due_ms(&self) -> Option<u64> {
        self.slots
            .iter()
            .filter_map(|s| match s.schedule {
                Schedule::At(at) => Some(at),
                _ => None,
            })
            .min()
    }

    /// Starts every check that is due at `now_ms` and not running: returns
    /// the probes to run, and evaluates due TTL checks on the spot (their
    /// changes are in [`Due::events`]).
    pub fn due<R: Rng + ?Sized>(&mut self, now_ms: u64, rng: &mut R) -> Due {
        let mut due = Due::default();
        // By index: a passing TTL startup check opens the gate, which
        // schedules the later slots while this loop runs.
        for i in 0..self.slots.len() {
            let slot = &mut self.slots[i];
            if !matches!(slot.schedule, Schedule::At(at) if at <= now_ms) {
                continue;
            }
            slot.schedule = Schedule::Running { since: now_ms };
            let which = slot.which;
            let probe = match &slot.check.kind {
                CheckKind::Http { path } => ProbeKind::Http { path: path.clone() },
                CheckKind::Tcp => ProbeKind::Tcp,
                CheckKind::Ttl { ttl_ms } => {
                    let ttl_ms = *ttl_ms;
                    let age = now_ms.saturating_sub(self.last_heartbeat_ms);
                    let passed = age <= ttl_ms;
                    let detail = if passed {
                        format!("last heartbeat {age} ms ago (ttl {ttl_ms} ms)")
                    } else {
                        format!("no heartbeat for {age} ms (ttl {ttl_ms} ms)")
                    };
                    let events = self.record(which, passed, &detail, now_ms, rng);
                    due.events.extend(events);
                    continue;
                }
            };
            due.probes.push(ProbeTask {
                which,
                target: probed(self.target, &slot.check),
                kind: probe,
                timeout_ms: slot.check.timing.timeout_ms,
            });
        }
        due
    }

    /// Feeds the outcome of a probe of `which` that finished at `now_ms`
    /// (`detail` as the prober words it: "status 503", "connection
    /// refused"), schedules that check's next probe and returns what
    /// changed. A result for a check with no probe running (not configured,
    /// a TTL check, or already reported) is ignored.
    pub fn result<R: Rng + ?Sized>(
        &mut self,
        which: Which,
        passed: bool,
        detail: &str,
        now_ms: u64,
        rng: &mut R,
    ) -> Vec<HealthEvent> {
        self.record(which, passed, detail, now_ms, rng)
    }

    fn record<R: Rng + ?Sized>(
        &mut self,
        which: Which,
        passed: bool,
        detail: &str,
        now_ms: u64,
        rng: &mut R,
    ) -> Vec<HealthEvent> {
        let mut events = Vec::new();
        let Some(slot) = self.slots.iter_mut().find(|s| s.which == which) else {
            return events;
        };
        let Schedule::Running { since } = slot.schedule else {
            return events;
        };
        slot.schedule = Schedule::At(next_due(since, now_ms, &slot.check.timing, rng));
        let Some(verdict) = slot.count(passed) else {
            return events;
        };
        let reason = || {
            let n = slot.failures;
            let s = if n == 1 { "" } else { "s" };
            format!(
                "{}: {detail} ({n} consecutive failure{s})",
                describe(which, &slot.check.kind, probed(self.target, &slot.check))
            )
        };
        match (which, verdict) {
            (Which::Startup, true) => {
                slot.schedule = Schedule::Done;
                self.open_gate(now_ms, rng, &mut events);
            }
            (Which::Startup, false) => {
                let reason = reason();
                self.reason = Some(reason.clone());
                events.push(HealthEvent::StartupFailing { reason });
            }
            (Which::Readiness, true) => self.become_ready(&mut events),
            (Which::Readiness, false) => {
                let reason = reason();
                if self.state != State::Unhealthy {
                    self.state = State::Unhealthy;
                    self.reason = Some(reason.clone());
                    events.push(HealthEvent::Unhealthy { reason });
                }
            }
            (Which::Liveness, passed) => {
                self.liveness = if passed {
                    Liveness::Passing
                } else {
                    Liveness::Failing
                };
                events.push(HealthEvent::Liveness(self.liveness));
            }
        }
        events
    }

    /// Startup passed: schedules the gated checks, READY at once without a
    /// readiness check.
    fn open_gate<R: Rng + ?Sized>(
        &mut self,
        now_ms: u64,
        rng: &mut R,
        events: &mut Vec<HealthEvent>,
    ) {
        self.reason = None;
        for slot in &mut self.slots {
            if slot.schedule == Schedule::Gated {
                slot.schedule = Schedule::At(first_due(now_ms, &slot.check.timing, rng));
            }
        }
        if !self.slots.iter().any(|s| s.which == Which::Readiness) {
            self.become_ready(events);
        }
    }

    fn become_ready(&mut self, events: &mut Vec<HealthEvent>) {
        if self.state != State::Ready {
            self.state = State::Ready;
            self.reason = None;
            events.push(HealthEvent::Ready);
        }
    }
}

/// "readiness http GET /healthz", "liveness tcp connect 10.0.0.5:8080",
/// "startup ttl": the start of a reason.
/// Where a check probes: the instance's address, at the check's own port
/// when it has one.
fn probed(target: SocketAddr, check: &Check) -> SocketAddr {
    check
        .port
        .map_or(target, |port| SocketAddr::new(target.ip(), port))
}

fn describe(which: Which, kind: &CheckKind, target: SocketAddr) -> String {
    match kind {
        CheckKind::Http { path } => format!("{which} http GET {path}"),
        CheckKind::Tcp => format!("{which} tcp connect {target}"),
        CheckKind::Ttl { .. } => format!("{which} ttl"),
    }
}

/// A uniformly random point of the first interval after `now_ms`.
fn first_due<R: Rng + ?Sized>(now_ms: u64, timing: &CheckTiming, rng: &mut R) -> u64 {
    now_ms.saturating_add(rng.random_range(0..timing.interval_ms.max(1)))
}

/// `interval × (1 + U[0, jitter])` after the probe started, and not before
/// its result is in.
fn next_due<R: Rng + ?Sized>(
    started_ms: u64,
    now_ms: u64,
    timing: &CheckTiming,
    rng: &mut R,
) -> u64 {
    let stretch = timing.interval_ms as f64 * timing.jitter * rng.random::<f64>();
    // `as` saturates: a NaN or negative stretch (impossible after
    // validation) counts as none.
    let interval = timing.interval_ms.saturating_add(stretch.round() as u64);
    started_ms.saturating_add(interval).max(now_ms)
}

#[cfg(test)]
mod tests;
