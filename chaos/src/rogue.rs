//! What a `rogue` step measured (issue 38, item 10): a node holding a
//! valid agent certificate of its own and its zone's gossip key tries
//! every attack of README's "Security model" while the traffic flows, and
//! every attempt must be refused. The attacks themselves are made by the
//! runner (`runner::rogue`); this module holds their figures, as the
//! report carries them, and their judge (`[pass] max_rogue_breaches`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The attacks of one round, in the order it makes them.
pub const ATTACKS: [&str; 16] = [
    HELLO_AS_ANOTHER_NODE,
    HELLO_IN_ANOTHER_ZONE,
    HELLO_WITH_ANOTHER_ADDRESS,
    REVOKED_CERTIFICATE,
    TAKE_OVER_INSTANCE,
    REGISTER_ANOTHER_ADDRESS,
    REGISTER_ABOVE_WEIGHT_CAP,
    DRAIN_ANOTHER_NODES_INSTANCE,
    MARK_ANOTHER_NODES_INSTANCE,
    DEREGISTER_ANOTHER_NODES_INSTANCE,
    REPORT_DOWN_IN_ANOTHER_ZONE,
    REPORT_DOWN_ALONE,
    UNASKED_WITNESS_ANSWER,
    SUBSCRIPTION_FLOOD,
    PROPAGATION_WAIT_FLOOD,
    GOSSIP_REPLAY,
];

/// A Hello naming a node other than the certificate's.
pub const HELLO_AS_ANOTHER_NODE: &str = "hello_as_another_node";
/// A Hello declaring a zone other than the one `[[node_zones]]` binds.
pub const HELLO_IN_ANOTHER_ZONE: &str = "hello_in_another_zone";
/// A Hello declaring an address outside the certificate's IP SANs.
pub const HELLO_WITH_ANOTHER_ADDRESS: &str = "hello_with_another_address";
/// A handshake with a certificate of a revoked identity.
pub const REVOKED_CERTIFICATE: &str = "revoked_certificate";
/// A registration of an instance id another node holds live.
pub const TAKE_OVER_INSTANCE: &str = "take_over_instance";
/// A registration at another node's address.
pub const REGISTER_ANOTHER_ADDRESS: &str = "register_another_address";
/// A registration weighing more than the node's `max_weight`.
pub const REGISTER_ABOVE_WEIGHT_CAP: &str = "register_above_weight_cap";
/// A drain of another node's instance.
pub const DRAIN_ANOTHER_NODES_INSTANCE: &str = "drain_another_nodes_instance";
/// A liveness verdict on another node's instance.
pub const MARK_ANOTHER_NODES_INSTANCE: &str = "mark_another_nodes_instance";
/// A deregistration of another node's instance.
pub const DEREGISTER_ANOTHER_NODES_INSTANCE: &str = "deregister_another_nodes_instance";
/// A down report about a node of another zone.
pub const REPORT_DOWN_IN_ANOTHER_ZONE: &str = "report_down_in_another_zone";
/// A down report, by the rogue alone, about a live node of its zone.
pub const REPORT_DOWN_ALONE: &str = "report_down_alone";
/// A witness answer ("gone") about a node nobody asked the rogue about.
pub const UNASKED_WITNESS_ANSWER: &str = "unasked_witness_answer";
/// Subscriptions past `limits.subscriptions_per_session`.
pub const SUBSCRIPTION_FLOOD: &str = "subscription_flood";
/// Propagation waits past `limits.propagation_waits_per_identity`.
pub const PROPAGATION_WAIT_FLOOD: &str = "propagation_wait_flood";
/// A sealed gossip datagram sent twice to a node of the rogue's zone.
pub const GOSSIP_REPLAY: &str = "gossip_replay";

/// One attack over the run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttackFigures {
    /// Attempts made.
    pub attempts: u64,
    /// Attempts refused by the rule the attack is aimed at.
    pub refused: u64,
    /// Attempts that could not be made (a replica away, a timeout); they
    /// are neither refused nor breaches.
    pub not_made: u64,
    /// The last refusal's words, as the system gave them.
    pub last_refusal: Option<String>,
}

/// What the rogue did and what came of it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RogueFigures {
    /// Each attack of [`ATTACKS`] by name.
    pub attacks: BTreeMap<String, AttackFigures>,
    /// Attempts that were not refused, each in words.
    pub breaches: Vec<String>,
    /// Committed changes (the audit log) made by the rogue's identity to a
    /// record it does not own.
    pub foreign_changes: Vec<String>,
    /// The rise of `rollcall_arbiter_refusals_total` (every kind, every
    /// replica) over the attacks.
    pub refusals_counted: u64,
    /// Lines under the `rollcall::audit` log target naming the rogue, in
    /// the replicas' logs (repeats are folded per minute).
    pub audit_lines: u64,
    /// Gossip datagrams the rogue sent a second time.
    pub replays_sent: u64,
    /// The rise of `rollcall_gossip_dropped_total{reason="replay"}` over
    /// the agents it sent them to.
    pub replays_dropped: u64,
}

impl RogueFigures {
    /// Counts an attempt of `attack` and what came of it.
    pub fn record(&mut self, attack: &str, outcome: Outcome) {
        let figures = self.attacks.entry(attack.to_owned()).or_default();
        figures.attempts += 1;
        match outcome {
            Outcome::Refused(words) => {
                figures.refused += 1;
                figures.last_refusal = Some(words);
            }
            Outcome::NotMade(_) => figures.not_made += 1,
            Outcome::Breach(words) => {
                // Bounded: a run that lets everything through says so in
                // its first hundred.
                if self.breaches.len() < 100 {
                    self.breaches.push(format!("{attack}: {words}"));
                }
            }
        }
    }

    /// Settles `attempts` of `attack` whose refusal is read from a counter
    /// afterwards (`counted`, the counter's rise): as many as it rose are
    /// refused, the rest are breaches.
    pub fn settle(&mut self, attack: &str, attempts: u64, counted: u64, counter: &str) {
        let refused = counted.min(attempts);
        for _ in 0..refused {
            self.record(attack, Outcome::Refused(format!("counted in {counter}")));
        }
        for _ in refused..attempts {
            self.record(
                attack,
                Outcome::Breach(format!("{attempts} made, {counter} rose by {counted} only")),
            );
        }
    }

    /// The breaches counted over every attack.
    fn breach_count(&self) -> u64 {
        self.attacks
            .values()
            .map(|a| a.attempts - a.refused - a.not_made)
            .sum()
    }
}

/// What came of one attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The rule aimed at refused it, in these words.
    Refused(String),
    /// It got through, or was answered otherwise than by that rule.
    Breach(String),
    /// It could not be made.
    NotMade(String),
}

/// The failures of `[pass] max_rogue_breaches = bound`: the rogue must
/// have made every attack, at most `bound` attempts may have got through,
/// none of its committed changes may touch another node's record, and its
/// refusals must show in the counters and the audit log.
pub fn judge(figures: Option<&RogueFigures>, bound: u64, failures: &mut Vec<String>) {
    let Some(f) = figures else {
        failures.push("rogue: the run had no rogue step: the attacks were not measured".to_owned());
        return;
    };
    let unmade: Vec<String> = ATTACKS
        .iter()
        .filter(|a| f.attacks.get(**a).is_none_or(|x| x.attempts == x.not_made))
        .map(|a| a.to_string())
        .collect();
    if !unmade.is_empty() {
        failures.push(format!(
            "rogue: attacks never made (the run measured nothing of them): {}",
            unmade.join(", ")
        ));
    }
    let breaches = f.breach_count();
    if breaches > bound {
        failures.push(format!(
            "rogue: {breaches} attempts were not refused, more than the {bound} allowed: {}",
            f.breaches
                .iter()
                .take(3)
                .cloned()
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    if !f.foreign_changes.is_empty() {
        failures.push(format!(
            "rogue: {} committed changes to records it does not own: {}",
            f.foreign_changes.len(),
            f.foreign_changes
                .iter()
                .take(3)
                .cloned()
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    if f.refusals_counted == 0 {
        failures.push(
            "rogue: rollcall_arbiter_refusals_total did not rise: the refusals were not counted"
                .to_owned(),
        );
    }
    if f.audit_lines == 0 {
        failures.push(
            "rogue: no rollcall::audit line in the replicas' logs names the rogue: the refusals were not audited"
                .to_owned(),
        );
    }
}

/// The report's section: each attack with what came of it, then the
/// breaches and foreign changes if any.
pub fn markdown(f: &RogueFigures, md: &mut String) {
    use std::fmt::Write as _;
    let _ = writeln!(
        md,
        "\n## Rogue node\n\nRefusals counted by the replicas: {}. Audit lines naming the rogue: {}. Gossip datagrams replayed: {}, dropped as replays: {}.\n\n| attack | attempts | refused | not made | last refusal |\n|---|---|---|---|---|",
        f.refusals_counted, f.audit_lines, f.replays_sent, f.replays_dropped
    );
    for attack in ATTACKS {
        let a = f.attacks.get(attack).cloned().unwrap_or_default();
        let words = a.last_refusal.as_deref().unwrap_or("").replace('|', "\\|");
        let _ = writeln!(
            md,
            "| {attack} | {} | {} | {} | {} |",
            a.attempts,
            a.refused,
            a.not_made,
            words.replace('\n', " ")
        );
    }
    for (title, lines) in [
        ("Breaches", &f.breaches),
        (
            "Changes to records the rogue does not own",
            &f.foreign_changes,
        ),
    ] {
        if !lines.is_empty() {
            let _ = writeln!(md, "\n### {title}\n");
            for line in lines {
                let _ = writeln!(md, "- {}", line.replace('\n', " "));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_attack_refused() -> RogueFigures {
        let mut f = RogueFigures::default();
        for attack in ATTACKS {
            f.record(attack, Outcome::Refused("no".into()));
        }
        f.refusals_counted = 14;
        f.audit_lines = 3;
        f
    }

    fn judged(f: Option<&RogueFigures>) -> Vec<String> {
        let mut failures = Vec::new();
        judge(f, 0, &mut failures);
        failures
    }

    #[test]
    fn a_run_where_every_attack_was_refused_passes() {
        assert_eq!(judged(Some(&every_attack_refused())), Vec::<String>::new());
    }

    #[test]
    fn no_rogue_step_or_an_attack_never_made_measured_nothing() {
        assert!(judged(None)[0].contains("not measured"));
        let mut f = every_attack_refused();
        f.attacks.remove(GOSSIP_REPLAY);
        f.record(TAKE_OVER_INSTANCE, Outcome::NotMade("timeout".into()));
        let failures = judged(Some(&f));
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(failures[0].contains(GOSSIP_REPLAY), "{failures:?}");
    }

    #[test]
    fn a_breach_a_foreign_change_or_a_silent_refusal_fails() {
        let mut f = every_attack_refused();
        f.record(REPORT_DOWN_ALONE, Outcome::Breach("committed".into()));
        f.foreign_changes
            .push("revision 9: deregister web-1-0".into());
        f.refusals_counted = 0;
        f.audit_lines = 0;
        let failures = judged(Some(&f));
        assert_eq!(failures.len(), 4, "{failures:?}");
        assert!(
            failures[0].contains("1 attempts were not refused"),
            "{failures:?}"
        );
        assert!(
            failures[0].contains("report_down_alone: committed"),
            "{failures:?}"
        );
    }

    #[test]
    fn attempts_settled_from_a_counter_are_refused_as_far_as_it_rose() {
        let mut f = RogueFigures::default();
        f.settle(GOSSIP_REPLAY, 5, 3, "replay drops");
        let replay = &f.attacks[GOSSIP_REPLAY];
        assert_eq!((replay.attempts, replay.refused), (5, 3));
        assert_eq!(f.breach_count(), 2);
        f.settle(UNASKED_WITNESS_ANSWER, 2, 7, "witness refusals");
        assert_eq!(f.attacks[UNASKED_WITNESS_ANSWER].refused, 2);
        assert_eq!(f.breach_count(), 2);
    }
}
