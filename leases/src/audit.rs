//! The audit log (R10): every committed catalog change as one entry saying
//! who changed what, when. Each replica writes the entries of what it
//! applies into its Raft file (`raft::AppliedCatalog::audit` reads them), so
//! every replica answers the same audit history.
//!
//! Stored as `[AUDIT_FORMAT][postcard]` under the revision (encoded here,
//! not in `codec.rs`, because it never crosses the network).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::catalog::{Applied, Effect};
use crate::command::{Command, Envelope, MAX_REPORTERS};
use crate::endpoint::Principal;
use crate::ids::Revision;
use crate::name::{InstanceId, ServiceKey};

/// The first byte of every encoded audit entry.
pub const AUDIT_FORMAT: u8 = 1;
/// Largest encoded audit entry. A purge can touch every service of a shard
/// (about 2,000 keys of at most a few hundred bytes), so this is generous.
pub const MAX_AUDIT_BYTES: usize = 4 * 1024 * 1024;

/// Who changed what, when (R10: every catalog change lands in an audit log).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct AuditEntry {
    /// The revision that committed the change.
    pub revision: Revision,
    /// When it was proposed (the command's time, ms since the Unix epoch).
    pub at_ms: u64,
    /// Who asked for it.
    pub actor: Principal,
    /// The command's kind (`Command::kind`).
    pub command: String,
    /// The services whose records changed, in key order (none for a
    /// policy change: `detail` names the policy's service).
    pub services: Vec<ServiceKey>,
    /// The instance the command named, if it named one.
    pub instance: Option<InstanceId>,
    /// A short line for humans ("-> DRAINING (generation 3): drain requested").
    pub detail: String,
}

impl AuditEntry {
    /// The audit entry of a command, from the command and what applying it
    /// did; `None` when it committed nothing (such commands are neither
    /// logged nor audited).
    pub fn describe(env: &Envelope, applied: &Applied) -> Option<AuditEntry> {
        let revision = applied.revision?;
        let effect = &applied.effect;
        let (instance, detail) = match &env.command {
            Command::GrantLease {
                node,
                epoch,
                zone,
                ttl_ms,
            } => {
                let what = match effect {
                    Effect::LeaseGranted { lease, moved: 0 } => format!("lease {lease} granted"),
                    Effect::LeaseGranted { lease, moved } => {
                        format!("lease {lease} granted ({moved} records moved to it)")
                    }
                    Effect::LeaseReinstated => "lease reinstated (its session came back)".into(),
                    other => format!("lease grant ({})", effect_name(other)),
                };
                (
                    None,
                    format!("{what} {node} epoch {epoch} zone {zone} ttl {ttl_ms} ms"),
                )
            }
            Command::RevokeLease { node, epoch } => (
                None,
                format!(
                    "lease revoked {node} epoch {epoch}{}",
                    marked(effect, "EXPIRED")
                ),
            ),
            Command::ExpireLease {
                node,
                epoch,
                silent_in_zone,
            } => {
                let detail = match effect {
                    Effect::ExpiryHeld => format!(
                        "lease expiry held by the mass-expiry guard {node} epoch {epoch} ({silent_in_zone} silent in zone)"
                    ),
                    _ => format!(
                        "lease expired {node} epoch {epoch}{}",
                        marked(effect, "EXPIRED")
                    ),
                };
                (None, detail)
            }
            Command::Register(reg) => {
                let (generation, state, replaced) = match effect {
                    Effect::Registered {
                        generation,
                        state,
                        replaced,
                    } => (generation.to_string(), state.as_str(), replaced.as_ref()),
                    _ => ("?".into(), reg.initial.as_str(), None),
                };
                let replaced = replaced.map_or_else(String::new, |r| {
                    format!(
                        "; replaced generation {} {} on {}",
                        r.generation,
                        r.state.as_str(),
                        r.node
                    )
                });
                (
                    Some(reg.instance_id.clone()),
                    format!(
                        "registered generation {generation} {state} on {} at {} version {}{replaced}",
                        reg.node,
                        SocketAddr::new(reg.address, reg.port),
                        reg.version
                    ),
                )
            }
            Command::Transition {
                instance_id,
                generation,
                to,
                reason,
            } => (
                Some(instance_id.clone()),
                format!("-> {to} (generation {generation}): {reason}"),
            ),
            Command::SetLiveness {
                instance_id,
                generation,
                liveness,
            } => (
                Some(instance_id.clone()),
                format!("liveness {} (generation {generation})", liveness.as_str()),
            ),
            Command::Deregister {
                instance_id,
                generation,
            } => (
                Some(instance_id.clone()),
                format!("deregistered generation {generation}"),
            ),
            Command::NodeDown {
                node,
                epoch,
                reporters,
            } => {
                let names: Vec<&str> = reporters
                    .iter()
                    .take(MAX_REPORTERS)
                    .map(|r| r.as_str())
                    .collect();
                (
                    None,
                    format!(
                        "node down {node} epoch {epoch} reported by {}{}",
                        names.join(", "),
                        marked(effect, "UNHEALTHY")
                    ),
                )
            }
            Command::Purge => {
                let detail = match effect {
                    Effect::Purged {
                        records,
                        generations,
                        services,
                    } => format!(
                        "purged {records} records, forgot {generations} generations, dropped {services} services"
                    ),
                    other => format!("purge ({})", effect_name(other)),
                };
                (None, detail)
            }
            Command::DeleteService { service } => (None, format!("deleted service {service}")),
            Command::SetPolicy(policy) => (
                None,
                format!("policy of {} set: {}", policy.key(), policy.summary()),
            ),
            Command::DeletePolicy { service } => (None, format!("policy of {service} deleted")),
            Command::ReplicatePolicy(remote) => (
                None,
                format!(
                    "policy of {} replicated at home revision {}: {}",
                    remote.policy.key(),
                    remote.home_revision,
                    remote.policy.summary()
                ),
            ),
            Command::DropReplicatedPolicy {
                service,
                home,
                home_revision,
            } => (
                None,
                format!("replicated policy of {service} dropped: deleted in home region {home} by its revision {home_revision}"),
            ),
            Command::Identify { catalog } => (None, format!("catalog identity {catalog}")),
            Command::TransferWriter(t) => {
                let epoch = match effect {
                    Effect::WriterChanged { epoch, settled: true } => format!("epoch {epoch}, settled"),
                    Effect::WriterChanged { epoch, settled: false } => {
                        format!("epoch {epoch}, moving until {} confirms", t.to)
                    }
                    other => effect_name(other).to_owned(),
                };
                let forced = t
                    .forced
                    .as_ref()
                    .map(|r| format!(", FORCED past an unreachable owner: {r}"))
                    .unwrap_or_default();
                (None, format!("writes of {} transferred to {} ({epoch}){forced}", t.service, t.to))
            }
            Command::ReplicateWriter(w) => {
                let settled = match effect {
                    Effect::WriterChanged { settled: true, .. } if !w.settled => {
                        " (confirmed here: this region now takes the writes)"
                    }
                    _ => "",
                };
                (None, format!("{} replicated{settled}: {}", w.service, w.summary()))
            }
        };
        Some(AuditEntry {
            revision,
            at_ms: env.at_ms,
            actor: env.actor.clone(),
            command: env.command.kind().to_string(),
            services: applied.services.clone(),
            instance,
            detail,
        })
    }
}

/// ": 3 records EXPIRED" for an ended lease, nothing otherwise.
fn marked(effect: &Effect, state: &str) -> String {
    match effect {
        Effect::LeaseEnded { marked } => format!(": {marked} records {state}"),
        other => format!(" ({})", effect_name(other)),
    }
}

/// A name for an effect the detail line of a command does not expect.
fn effect_name(effect: &Effect) -> &'static str {
    match effect {
        Effect::Unchanged => "unchanged",
        Effect::LeaseGranted { .. } => "lease granted",
        Effect::LeaseReinstated => "lease reinstated",
        Effect::LeaseEnded { .. } => "lease ended",
        Effect::ExpiryHeld => "expiry held",
        Effect::Registered { .. } => "registered",
        Effect::Changed => "changed",
        Effect::Purged { .. } => "purged",
        Effect::PolicyChanged => "policy changed",
        Effect::WriterChanged { .. } => "writer changed",
        Effect::Identified => "identified",
    }
}

/// Which audit entries to read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditQuery {
    /// Only entries that changed this service.
    pub service: Option<ServiceKey>,
    /// Only entries after this revision (exclusive).
    pub since: Option<Revision>,
    /// At most this many entries.
    pub limit: usize,
}

/// `[AUDIT_FORMAT][postcard body]`.
pub fn encode_audit(entry: &AuditEntry) -> Vec<u8> {
    postcard::to_extend(entry, vec![AUDIT_FORMAT]).expect("in-memory values always encode")
}

/// Decodes the audit value stored under `key`, checking format, size, that
/// nothing trails the body and that it names its own key.
pub fn decode_audit(key: u64, bytes: &[u8]) -> Result<AuditEntry, String> {
    let corrupt = |detail: String| detail;
    if bytes.len() > MAX_AUDIT_BYTES {
        return Err(corrupt(format!(
            "{} bytes exceed the {MAX_AUDIT_BYTES}-byte limit",
            bytes.len()
        )));
    }
    let [format, body @ ..] = bytes else {
        return Err(corrupt("empty value".into()));
    };
    if *format != AUDIT_FORMAT {
        return Err(corrupt(format!(
            "format version {format}; this build reads version {AUDIT_FORMAT}"
        )));
    }
    let (entry, rest) =
        postcard::take_from_bytes::<AuditEntry>(body).map_err(|e| corrupt(e.to_string()))?;
    if !rest.is_empty() {
        return Err(corrupt(format!("{} trailing bytes", rest.len())));
    }
    if entry.revision != Revision(key) {
        return Err(corrupt(format!("it describes revision {}", entry.revision)));
    }
    Ok(entry)
}
