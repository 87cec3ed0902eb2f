//! Wire fault points for the chaos suite's "wire-faults" scenario: drop or
//! corrupt the deltas and snapshots an arbiter sends on agents' session
//! streams, and cut those sessions, so the agents' gap, digest and
//! reconnect paths (R6, R7) are exercised against a real arbiter.
//!
//! Compiled only with the `fault-injection` cargo feature
//! (`cargo build --release --features fault-injection`); a default build
//! has none of this code. Faults are chosen by `ROLLCALL_FAULTS`, read
//! once when the arbiter starts:
//!
//! ```text
//! ROLLCALL_FAULTS=drop_delta=0.2,corrupt_snapshot=0.05,cut_session=0.01
//! ROLLCALL_FAULTS_SEED=42   # optional; default taken from the clock
//! ```
//!
//! Each name takes a probability in [0, 1], rolled once per outgoing
//! session message:
//! - `cut_session`: close the connection instead of sending the message
//!   (any message), as if the watch stream were cut;
//! - `drop_delta` / `drop_snapshot`: do not write the message;
//! - `corrupt_delta` / `corrupt_snapshot`: flip one byte of the encoded
//!   frame after its version byte, so it fails to decode or decodes to
//!   garbage; its length, and so the length prefix, are unchanged.
//!
//! A message carrying any snapshot is a snapshot message, else one carrying
//! deltas is a delta message; other messages (`Welcome`, `Current`, ...)
//! are only ever cut. The arbiter itself believes every message was sent:
//! its distribution state moves on exactly as on a lossy network.
//!
//! Every injected fault counts in `rollcall_arbiter_faults_injected_total`
//! and is logged with target `fault`. The seed is logged at start, so a
//! run can be replayed (up to the scheduling of concurrent sessions, which
//! share one random stream).

use std::sync::{LazyLock, Mutex, OnceLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::ids::AgentId;
use crate::protocol::{ServiceUpdate, SessionDown};

/// The environment variable naming the faults to inject.
pub const FAULTS_ENV: &str = "ROLLCALL_FAULTS";
/// The environment variable holding the random seed (an unsigned integer).
pub const SEED_ENV: &str = "ROLLCALL_FAULTS_SEED";

/// One kind of injected fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// A delta message is not sent.
    DropDelta,
    /// A delta message is sent with one byte flipped.
    CorruptDelta,
    /// A snapshot message is not sent.
    DropSnapshot,
    /// A snapshot message is sent with one byte flipped.
    CorruptSnapshot,
    /// The session's connection is closed instead of sending a message.
    CutSession,
}

impl Fault {
    /// Every fault, in the order they are rolled.
    pub const ALL: [Fault; 5] = [
        Fault::CutSession,
        Fault::DropDelta,
        Fault::CorruptDelta,
        Fault::DropSnapshot,
        Fault::CorruptSnapshot,
    ];

    /// Its name in `ROLLCALL_FAULTS` and in the metric's `fault` label.
    pub fn name(self) -> &'static str {
        match self {
            Fault::DropDelta => "drop_delta",
            Fault::CorruptDelta => "corrupt_delta",
            Fault::DropSnapshot => "drop_snapshot",
            Fault::CorruptSnapshot => "corrupt_snapshot",
            Fault::CutSession => "cut_session",
        }
    }

    fn from_name(name: &str) -> Option<Fault> {
        Fault::ALL.into_iter().find(|f| f.name() == name)
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Why `ROLLCALL_FAULTS` or `ROLLCALL_FAULTS_SEED` cannot be used; the
/// arbiter refuses to start.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum FaultConfigError {
    /// An entry is not `name=probability`.
    #[error("{FAULTS_ENV}: {entry:?} is not name=probability (e.g. drop_delta=0.2)")]
    Syntax {
        /// The entry as given.
        entry: String,
    },
    /// A name that is no fault point.
    #[error("{FAULTS_ENV}: {name:?} is no fault point; use drop_delta, corrupt_delta, drop_snapshot, corrupt_snapshot or cut_session")]
    UnknownName {
        /// The name as given.
        name: String,
    },
    /// A probability that is not a number in [0, 1].
    #[error("{FAULTS_ENV}: {name}={value:?} is not a probability; give a number from 0 to 1")]
    Probability {
        /// The fault point.
        name: &'static str,
        /// The value as given.
        value: String,
    },
    /// A name given twice.
    #[error("{FAULTS_ENV}: {name} is given twice; give each fault point once")]
    Duplicate {
        /// The fault point.
        name: &'static str,
    },
    /// A seed that is not an unsigned integer.
    #[error("{SEED_ENV}={value:?} is not an unsigned 64-bit integer")]
    Seed {
        /// The value as given.
        value: String,
    },
}

/// The probability of each fault, validated.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FaultPlan {
    probabilities: [f64; Fault::ALL.len()],
}

impl FaultPlan {
    /// Parses `name=probability[,name=probability...]`; spaces around
    /// entries, names and values are ignored, and an empty text plans
    /// nothing.
    pub fn parse(text: &str) -> Result<FaultPlan, FaultConfigError> {
        let mut plan = FaultPlan::default();
        let mut seen = [false; Fault::ALL.len()];
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (name, value) = entry
                .split_once('=')
                .ok_or_else(|| FaultConfigError::Syntax {
                    entry: entry.to_owned(),
                })?;
            let fault =
                Fault::from_name(name.trim()).ok_or_else(|| FaultConfigError::UnknownName {
                    name: name.trim().to_owned(),
                })?;
            let p = value
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|p| (0.0..=1.0).contains(p))
                .ok_or_else(|| FaultConfigError::Probability {
                    name: fault.name(),
                    value: value.trim().to_owned(),
                })?;
            if std::mem::replace(&mut seen[fault.index()], true) {
                return Err(FaultConfigError::Duplicate { name: fault.name() });
            }
            plan.probabilities[fault.index()] = p;
        }
        Ok(plan)
    }

    /// The chance of `fault` per eligible message.
    pub fn probability(&self, fault: Fault) -> f64 {
        self.probabilities[fault.index()]
    }

    /// No fault can happen.
    pub fn is_empty(&self) -> bool {
        self.probabilities.iter().all(|p| *p == 0.0)
    }
}

impl std::fmt::Display for FaultPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut first = true;
        for fault in Fault::ALL {
            let p = self.probability(fault);
            if p > 0.0 {
                write!(f, "{}{}={p}", if first { "" } else { "," }, fault.name())?;
                first = false;
            }
        }
        Ok(())
    }
}

/// What the writer does with one message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultAction {
    /// Write the (possibly corrupted) bytes.
    Send,
    /// Write nothing; carry on as if it had been written.
    Drop,
    /// Close the connection without writing.
    Cut,
}

/// Rolls the faults of each message: a plan and a seeded random stream,
/// with no IO, so tests can drive it directly.
#[derive(Debug)]
pub struct Injector {
    plan: FaultPlan,
    rng: StdRng,
}

impl Injector {
    /// Injects `plan` with randomness from `seed`.
    pub fn new(plan: FaultPlan, seed: u64) -> Self {
        Injector {
            plan,
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// Decides the fate of `message`, encoded as `bytes`; corrupts `bytes`
    /// in place when that is the fault chosen. Returns the action and the
    /// fault injected, if any.
    pub fn roll(
        &mut self,
        message: &SessionDown,
        bytes: &mut [u8],
    ) -> (FaultAction, Option<Fault>) {
        if self.chance(Fault::CutSession) {
            return (FaultAction::Cut, Some(Fault::CutSession));
        }
        let Some((drop, corrupt)) = eligible(message) else {
            return (FaultAction::Send, None);
        };
        if self.chance(drop) {
            return (FaultAction::Drop, Some(drop));
        }
        // Byte 0 is the format version; everything after it (kind, body)
        // is fair game. A frame is never shorter than its two header bytes.
        if bytes.len() > 1 && self.chance(corrupt) {
            let at = self.rng.random_range(1..bytes.len());
            bytes[at] ^= self.rng.random_range(1..=u8::MAX);
            return (FaultAction::Send, Some(corrupt));
        }
        (FaultAction::Send, None)
    }

    fn chance(&mut self, fault: Fault) -> bool {
        let p = self.plan.probability(fault);
        p > 0.0 && self.rng.random_bool(p)
    }
}

/// The drop and corrupt faults `message` can suffer: a snapshot's if it
/// carries any snapshot, else a delta's if it carries deltas, else none.
fn eligible(message: &SessionDown) -> Option<(Fault, Fault)> {
    let SessionDown::Update(items) = message else {
        return None;
    };
    if items
        .iter()
        .any(|u| matches!(u, ServiceUpdate::Snapshot(_)))
    {
        Some((Fault::DropSnapshot, Fault::CorruptSnapshot))
    } else if items.iter().any(|u| matches!(u, ServiceUpdate::Deltas(_))) {
        Some((Fault::DropDelta, Fault::CorruptDelta))
    } else {
        None
    }
}

/// The `fault` label of `rollcall_arbiter_faults_injected_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FaultLabel {
    fault: &'static str,
}

/// The process's injector, once an arbiter started with faults planned.
static INJECTOR: OnceLock<Mutex<Injector>> = OnceLock::new();

/// Counts shared by every arbiter registry in the process (tests and
/// `rollcall dev` run several arbiters in one).
static INJECTED: LazyLock<Family<FaultLabel, Counter>> = LazyLock::new(Family::default);

/// Reads `ROLLCALL_FAULTS` and `ROLLCALL_FAULTS_SEED` and installs the
/// process's injector; called by every arbiter as it starts. The first
/// arbiter to find faults planned installs them; later ones keep those.
pub fn install() -> Result<(), FaultConfigError> {
    if INJECTOR.get().is_some() {
        return Ok(());
    }
    let plan = FaultPlan::parse(&std::env::var(FAULTS_ENV).unwrap_or_default())?;
    if plan.is_empty() {
        return Ok(());
    }
    let seed = match std::env::var(SEED_ENV) {
        Ok(value) => value
            .trim()
            .parse::<u64>()
            .map_err(|_| FaultConfigError::Seed { value })?,
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    };
    tracing::warn!(target: "fault", faults = %plan, seed, "wire fault injection is on");
    let _ = INJECTOR.set(Mutex::new(Injector::new(plan, seed)));
    Ok(())
}

/// The fault point of an agent's session stream: what to do with
/// `message`, encoded as `bytes` (corrupted in place when so chosen).
pub fn outgoing(agent: AgentId, message: &SessionDown, bytes: &mut [u8]) -> FaultAction {
    let Some(injector) = INJECTOR.get() else {
        return FaultAction::Send;
    };
    let (action, fault) = injector
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .roll(message, bytes);
    if let Some(fault) = fault {
        INJECTED
            .get_or_create(&FaultLabel {
                fault: fault.name(),
            })
            .inc();
        tracing::info!(target: "fault", agent, fault = fault.name(), "fault injected");
    }
    action
}

/// Adds `faults_injected_total` to an arbiter's registry.
pub(crate) fn register_metrics(registry: &mut Registry) {
    registry.register(
        "faults_injected",
        "Wire faults injected on agents' session streams (fault-injection builds only)",
        INJECTED.clone(),
    );
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::codec::{decode_session_down, encode_session_down};
    use crate::protocol::ServiceUpdate;
    use crate::ServiceKey;

    fn service() -> ServiceKey {
        "default/web/http".parse().expect("a valid key")
    }

    fn snapshot_message() -> SessionDown {
        SessionDown::Update(vec![ServiceUpdate::Snapshot(Arc::from(vec![7u8; 40]))])
    }

    fn other_message() -> SessionDown {
        SessionDown::Update(vec![ServiceUpdate::Unknown { service: service() }])
    }

    #[test]
    fn plans_parse_and_bad_values_name_their_key() {
        let plan = FaultPlan::parse(" drop_delta=0.2, corrupt_snapshot = 1 ,").expect("valid");
        assert_eq!(plan.probability(Fault::DropDelta), 0.2);
        assert_eq!(plan.probability(Fault::CorruptSnapshot), 1.0);
        assert_eq!(plan.probability(Fault::CutSession), 0.0);
        assert_eq!(plan.to_string(), "drop_delta=0.2,corrupt_snapshot=1");
        assert!(FaultPlan::parse("").expect("empty").is_empty());

        let err = FaultPlan::parse("drop_delta=1.5").unwrap_err();
        assert!(err.to_string().contains("drop_delta=\"1.5\""), "{err}");
        assert!(matches!(
            FaultPlan::parse("cut_session=NaN"),
            Err(FaultConfigError::Probability {
                name: "cut_session",
                ..
            })
        ));
        assert!(matches!(
            FaultPlan::parse("drop_deltas=0.1"),
            Err(FaultConfigError::UnknownName { .. })
        ));
        assert!(matches!(
            FaultPlan::parse("drop_delta"),
            Err(FaultConfigError::Syntax { .. })
        ));
        assert!(matches!(
            FaultPlan::parse("drop_delta=0.1,drop_delta=0.2"),
            Err(FaultConfigError::Duplicate { name: "drop_delta" })
        ));
    }

    #[test]
    fn snapshots_and_deltas_get_their_own_faults() {
        let plan = FaultPlan::parse("drop_snapshot=1").expect("valid");
        let mut injector = Injector::new(plan, 1);
        let message = snapshot_message();
        let mut bytes = encode_session_down(&message);
        assert_eq!(
            injector.roll(&message, &mut bytes),
            (FaultAction::Drop, Some(Fault::DropSnapshot))
        );
        let message = other_message();
        let mut bytes = encode_session_down(&message);
        assert_eq!(
            injector.roll(&message, &mut bytes),
            (FaultAction::Send, None)
        );
    }

    #[test]
    fn corruption_keeps_the_version_and_the_length() {
        let plan = FaultPlan::parse("corrupt_snapshot=1").expect("valid");
        let mut injector = Injector::new(plan, 7);
        let message = snapshot_message();
        let clean = encode_session_down(&message);
        for _ in 0..200 {
            let mut bytes = clean.clone();
            assert_eq!(
                injector.roll(&message, &mut bytes),
                (FaultAction::Send, Some(Fault::CorruptSnapshot))
            );
            assert_eq!(bytes.len(), clean.len());
            assert_eq!(bytes[0], clean[0]);
            assert_eq!(bytes.iter().zip(&clean).filter(|(a, b)| a != b).count(), 1);
            assert_ne!(decode_session_down(&bytes).ok(), Some(message.clone()));
        }
    }

    #[test]
    fn a_seed_replays_the_same_faults() {
        let plan = FaultPlan::parse("drop_snapshot=0.5,cut_session=0.1").expect("valid");
        let message = snapshot_message();
        let run = |seed| {
            let mut injector = Injector::new(plan.clone(), seed);
            (0..100)
                .map(|_| {
                    injector
                        .roll(&message, &mut encode_session_down(&message))
                        .0
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(run(3), run(3));
        assert!(run(3).contains(&FaultAction::Cut));
        assert!(run(3).contains(&FaultAction::Drop));
        assert!(run(3).contains(&FaultAction::Send));
    }
}
