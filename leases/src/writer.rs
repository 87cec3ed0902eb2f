//! Writer epochs (R9): which region takes a single-writer service's
//! writes, as a numbered, fenced succession of owners.
//!
//! A policy's `[policy.single_writer] owner` is the first writer, epoch 1.
//! `rollcall policy transfer SERVICE --to REGION` moves the writes: the
//! owner region's arbiter commits epoch n+1 naming the new owner, *moving*
//! (not settled): from that moment no caller that holds it sends writes
//! anywhere. The region bridges carry the epoch to the other regions; the
//! new owner's arbiter, when it stores the moving epoch, stores it settled,
//! and only a settled epoch lets callers send writes to its owner. So the
//! new owner starts taking writes only after the old one committed that it
//! stopped. While the owner region is unreachable an operator may force a
//! transfer from another region (`--force --reason`): it is committed there,
//! marked forced with its reason, and reaches the old owner when the bridges
//! do.
//!
//! Every region holds, per service, the highest epoch it has seen, ordered
//! by [`WriterEpoch::rank`]: epoch number, then settled over moving, then
//! forced over not, then the committing region's name. Stored epochs only
//! ever go up, in every region, whatever order the bridges deliver them in,
//! so a late copy never takes writes back. The epoch number is the fencing
//! token an application can hand its database: writes stamped with an
//! older epoch are from a region that is no longer the writer.
//!
//! Sans-IO and deciding only succession: the catalog applies commands with
//! it, the agents route by it.

use serde::{Deserialize, Serialize};

use crate::endpoint::Principal;
use crate::ids::Revision;
use crate::name::{Label, Reason};
use crate::policy::{Policy, PolicyKey};

/// One epoch of a single-writer service's writes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriterEpoch {
    /// The service.
    pub service: PolicyKey,
    /// The epoch number: 1 for the policy's first owner, one more at each
    /// transfer. The fencing token.
    pub epoch: u64,
    /// The region that owns the writes of this epoch.
    pub owner: Label,
    /// The owner of the epoch before (`None` at epoch 1).
    pub from: Option<Label>,
    /// False while the transfer is in flight: the old owner stopped, the
    /// new owner has not yet confirmed. No caller sends writes anywhere
    /// then.
    pub settled: bool,
    /// When the transfer was committed, ms since the Unix epoch.
    pub at_ms: u64,
    /// Who asked for it.
    pub by: Principal,
    /// The region whose arbiter committed the transfer.
    pub committed_in: Label,
    /// The operator's reason, when the transfer was forced past an
    /// unreachable owner.
    pub forced: Option<Reason>,
}

impl WriterEpoch {
    /// The first epoch of `policy`, when it has a single writer: its owner,
    /// settled, as the policy was set.
    pub fn first(policy: &Policy, at_ms: u64, by: &Principal) -> Option<WriterEpoch> {
        let owner = Label::new(&policy.document().single_writer.as_ref()?.owner).ok()?;
        Some(WriterEpoch {
            service: policy.key().clone(),
            epoch: 1,
            owner,
            from: None,
            settled: true,
            at_ms,
            by: by.clone(),
            committed_in: policy.home_region().clone(),
            forced: None,
        })
    }

    /// What orders two epochs of one service: the higher rank is newer,
    /// in every region alike.
    pub fn rank(&self) -> (u64, bool, bool, &str) {
        (
            self.epoch,
            self.settled,
            self.forced.is_some(),
            self.committed_in.as_str(),
        )
    }

    /// Whether it is newer than `held`.
    pub fn newer_than(&self, held: &WriterEpoch) -> bool {
        self.rank() > held.rank()
    }

    /// Where a write of the service may go by this epoch: the owner once
    /// settled, nowhere while moving.
    pub fn writer(&self) -> Option<&Label> {
        self.settled.then_some(&self.owner)
    }

    /// One line for the audit log and the CLI.
    pub fn summary(&self) -> String {
        let mut line = match (&self.from, self.settled) {
            (None, _) => format!("writer epoch {}: {}", self.epoch, self.owner),
            (Some(from), true) => {
                format!(
                    "writer epoch {}: {from} → {} (settled)",
                    self.epoch, self.owner
                )
            }
            (Some(from), false) => format!(
                "writer epoch {}: {from} → {} (moving: no region takes writes until {} confirms)",
                self.epoch, self.owner, self.owner
            ),
        };
        line.push_str(&format!(
            ", committed in {} by {}",
            self.committed_in, self.by
        ));
        if let Some(reason) = &self.forced {
            line.push_str(&format!(", FORCED: {reason}"));
        }
        line
    }
}

/// An operator's transfer, as the `TransferWriter` command carries it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transfer {
    /// The service.
    pub service: PolicyKey,
    /// The region to take the writes.
    pub to: Label,
    /// Set when the operator forces the transfer past an unreachable
    /// owner: why.
    pub forced: Option<Reason>,
}

/// A writer epoch in a region's catalog, with the local change that stored
/// it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredWriter {
    /// The epoch.
    pub writer: WriterEpoch,
    /// The local revision that stored it.
    pub revision: Revision,
}

/// Why a transfer was refused. Each names what to do instead.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TransferRefusal {
    /// The service has no policy with a `[policy.single_writer]` here.
    #[error("service {service} has no single-writer policy in region {here}; set [policy.single_writer] in its policy first")]
    NoSingleWriter {
        /// The service.
        service: PolicyKey,
        /// This region.
        here: Label,
    },
    /// This region does not own the writes, and the transfer was not
    /// forced.
    #[error("the writes of {service} are owned by region {owner} (epoch {epoch}); run the transfer against region {owner}'s arbiter, or, only if region {owner} is unreachable, pass --force --reason TEXT")]
    NotOwner {
        /// The service.
        service: PolicyKey,
        /// The owner.
        owner: Label,
        /// Its epoch.
        epoch: u64,
    },
    /// A forced transfer asked of the owner region itself.
    #[error("region {here} owns the writes of {service}: a transfer from here needs no --force")]
    ForcedAtOwner {
        /// The service.
        service: PolicyKey,
        /// This region.
        here: Label,
    },
    /// A transfer is still in flight, and this one was not forced.
    #[error("the writes of {service} are moving from {from} to {to} (epoch {epoch}) and {to} has not confirmed yet; wait for it (rollcall policy show), or pass --force --reason TEXT if {to} is unreachable")]
    InFlight {
        /// The service.
        service: PolicyKey,
        /// The old owner.
        from: Label,
        /// The new owner.
        to: Label,
        /// The epoch in flight.
        epoch: u64,
    },
    /// The target already owns the writes.
    #[error("region {to} already owns the writes of {service} (epoch {epoch})")]
    AlreadyOwner {
        /// The service.
        service: PolicyKey,
        /// The target.
        to: Label,
        /// Its epoch.
        epoch: u64,
    },
    /// The target is not a region the policy lets the service run in.
    #[error("region {to} cannot own the writes of {service}: {why}")]
    Target {
        /// The service.
        service: PolicyKey,
        /// The target.
        to: Label,
        /// Which rule.
        why: &'static str,
    },
}

/// The epoch a transfer commits in region `here`, given the service's
/// policy and the epoch `held` (the policy's first owner when none).
pub fn transfer(
    policy: &Policy,
    held: &WriterEpoch,
    request: &Transfer,
    here: &Label,
    at_ms: u64,
    by: &Principal,
) -> Result<WriterEpoch, TransferRefusal> {
    let service = || request.service.clone();
    let doc = policy.document();
    if doc.single_writer.is_none() {
        return Err(TransferRefusal::NoSingleWriter {
            service: service(),
            here: here.clone(),
        });
    }
    let to = &request.to;
    let target = |why| TransferRefusal::Target {
        service: service(),
        to: to.clone(),
        why,
    };
    if doc.data_boundary.iter().any(|r| r == to.as_str()) {
        return Err(target("it is in the policy's data_boundary"));
    }
    if policy.home_region() != to && !doc.failover_order.iter().any(|r| r == to.as_str()) {
        return Err(target(
            "it is neither the policy's home_region nor in its failover_order",
        ));
    }
    if held.settled && &held.owner == to {
        return Err(TransferRefusal::AlreadyOwner {
            service: service(),
            to: to.clone(),
            epoch: held.epoch,
        });
    }
    match (&request.forced, held.settled) {
        (None, false) => {
            return Err(TransferRefusal::InFlight {
                service: service(),
                from: held.from.clone().unwrap_or_else(|| held.owner.clone()),
                to: held.owner.clone(),
                epoch: held.epoch,
            })
        }
        (None, true) if &held.owner != here => {
            return Err(TransferRefusal::NotOwner {
                service: service(),
                owner: held.owner.clone(),
                epoch: held.epoch,
            })
        }
        (Some(_), true) if &held.owner == here => {
            return Err(TransferRefusal::ForcedAtOwner {
                service: service(),
                here: here.clone(),
            })
        }
        _ => {}
    }
    Ok(WriterEpoch {
        service: service(),
        epoch: held.epoch + 1,
        owner: to.clone(),
        from: Some(held.owner.clone()),
        // Committed in the new owner's own region: nothing left to confirm.
        settled: to == here,
        at_ms,
        by: by.clone(),
        committed_in: here.clone(),
        forced: request.forced.clone(),
    })
}

/// What region `here` stores of an epoch another region committed: the
/// epoch as sent, settled when `here` is its owner (the new owner's
/// confirmation); `None` when it is not newer than `held`.
pub fn adopt(
    held: Option<&WriterEpoch>,
    remote: &WriterEpoch,
    here: &Label,
) -> Option<WriterEpoch> {
    let mut adopted = remote.clone();
    if !adopted.settled && &adopted.owner == here {
        adopted.settled = true;
    }
    held.is_none_or(|h| adopted.newer_than(h))
        .then_some(adopted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::Role;
    use crate::name::PrincipalName;
    use rollcall_config::{ServicePolicy, SingleWriter, TrafficClass};

    fn label(s: &str) -> Label {
        Label::new(s).unwrap()
    }

    fn operator() -> Principal {
        Principal {
            role: Role::Operator,
            name: PrincipalName::new("admin-token").unwrap(),
        }
    }

    fn ledger() -> Policy {
        let mut doc = ServicePolicy::new("shop/ledger", "r1");
        doc.cross_region = true;
        doc.failover_traffic = TrafficClass::All;
        doc.failover_order = vec!["r2".into(), "r3".into()];
        doc.data_boundary = vec!["r4".into()];
        doc.single_writer = Some(SingleWriter {
            owner: "r1".into(),
            transfer_to: None,
        });
        Policy::new(doc).unwrap()
    }

    fn ask(to: &str, forced: Option<&str>) -> Transfer {
        Transfer {
            service: "shop/ledger".parse().unwrap(),
            to: label(to),
            forced: forced.map(|r| Reason::new(r).unwrap()),
        }
    }

    #[test]
    fn a_transfer_moves_at_the_owner_and_settles_at_the_new_owner() {
        let p = ledger();
        let first = WriterEpoch::first(&p, 1, &operator()).unwrap();
        assert_eq!((first.epoch, first.owner.as_str()), (1, "r1"));
        assert_eq!(first.writer().map(Label::as_str), Some("r1"));

        let moving = transfer(&p, &first, &ask("r2", None), &label("r1"), 5, &operator()).unwrap();
        assert_eq!((moving.epoch, moving.settled), (2, false));
        assert_eq!(moving.writer(), None, "no region takes writes while moving");
        assert!(moving.newer_than(&first));

        // r3 stores it as it is; r2 stores it settled: its confirmation.
        let at_r3 = adopt(Some(&first), &moving, &label("r3")).unwrap();
        assert!(!at_r3.settled);
        let at_r2 = adopt(Some(&first), &moving, &label("r2")).unwrap();
        assert_eq!(at_r2.writer().map(Label::as_str), Some("r2"));
        // The settled copy reaches r1 and r3 and wins; the moving copy
        // arriving late at r2 changes nothing.
        assert!(adopt(Some(&moving), &at_r2, &label("r1")).is_some());
        assert!(adopt(Some(&at_r3), &at_r2, &label("r3")).is_some());
        assert_eq!(adopt(Some(&at_r2), &moving, &label("r2")), None);
        assert_eq!(
            adopt(Some(&at_r2), &first, &label("r2")),
            None,
            "never back"
        );
    }

    #[test]
    fn only_the_owner_transfers_unless_forced_and_the_target_must_be_allowed() {
        let p = ledger();
        let first = WriterEpoch::first(&p, 1, &operator()).unwrap();
        let refused = |to, forced, here| {
            transfer(&p, &first, &ask(to, forced), &label(here), 5, &operator()).unwrap_err()
        };
        let e = refused("r2", None, "r2");
        assert!(matches!(e, TransferRefusal::NotOwner { .. }), "{e}");
        assert!(e.to_string().contains("--force --reason"), "{e}");
        assert!(matches!(
            refused("r1", None, "r1"),
            TransferRefusal::AlreadyOwner { .. }
        ));
        assert!(matches!(
            refused("r4", None, "r1"),
            TransferRefusal::Target { .. }
        ));
        assert!(matches!(
            refused("r5", None, "r1"),
            TransferRefusal::Target { .. }
        ));
        assert!(matches!(
            refused("r2", Some("r1 is down"), "r1"),
            TransferRefusal::ForcedAtOwner { .. }
        ));

        // Forced at the target while r1 is cut off: settled at once, and
        // it outranks a transfer r1 made meanwhile to r3 at the same epoch.
        let forced = transfer(
            &p,
            &first,
            &ask("r2", Some("r1 unreachable")),
            &label("r2"),
            9,
            &operator(),
        )
        .unwrap();
        assert_eq!((forced.epoch, forced.settled), (2, true));
        assert!(
            forced.summary().contains("FORCED: r1 unreachable"),
            "{}",
            forced.summary()
        );
        let r1_alone =
            transfer(&p, &first, &ask("r3", None), &label("r1"), 8, &operator()).unwrap();
        let at_r3 = adopt(Some(&first), &r1_alone, &label("r3")).unwrap();
        assert!(forced.newer_than(&at_r3) || at_r3.newer_than(&forced));
        assert!(adopt(Some(&forced), &r1_alone, &label("r1")).is_none());
        assert!(adopt(Some(&r1_alone), &forced, &label("r1")).is_some());
        assert!(forced.newer_than(&r1_alone));

        // A second transfer waits for the first to settle, unless forced.
        let moving = transfer(&p, &first, &ask("r2", None), &label("r1"), 5, &operator()).unwrap();
        let e = transfer(&p, &moving, &ask("r3", None), &label("r1"), 6, &operator()).unwrap_err();
        assert!(matches!(e, TransferRefusal::InFlight { .. }), "{e}");
        let again = transfer(
            &p,
            &moving,
            &ask("r3", Some("r2 never confirmed")),
            &label("r1"),
            7,
            &operator(),
        )
        .unwrap();
        assert_eq!(
            (again.epoch, again.from.as_ref().map(Label::as_str)),
            (3, Some("r2"))
        );
    }

    #[test]
    fn a_policy_without_a_single_writer_has_no_epoch_and_no_transfer() {
        let doc = ServicePolicy::new("shop/web", "r1");
        let p = Policy::new(doc).unwrap();
        assert_eq!(WriterEpoch::first(&p, 1, &operator()), None);
        let first = WriterEpoch::first(&ledger(), 1, &operator()).unwrap();
        let mut web = ask("r1", None);
        web.service = "shop/web".parse().unwrap();
        assert!(matches!(
            transfer(&p, &first, &web, &label("r1"), 5, &operator()),
            Err(TransferRefusal::NoSingleWriter { .. })
        ));
    }
}
