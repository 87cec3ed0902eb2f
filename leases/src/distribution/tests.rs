//! The distribution rules, stepped by hand with a manual clock.

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr};

use proptest::prelude::*;

use super::*;
use crate::command::{Command, Envelope, Registration};
use crate::endpoint::{Principal, Role, State, Weight};
use crate::ids::{AgentEpoch, Generation};
use crate::name::{InstanceId, Label, NodeId, PrincipalName, Reason, Version};
use crate::params::CatalogParams;
use crate::view::ServiceView;

fn params() -> DistParams {
    DistParams {
        coalesce_window_ms: 20,
        max_concurrent_snapshots: 2,
        max_snapshots_per_agent: 2,
        stall_timeout_ms: 10_000,
        snapshot_retry_ms: 250,
        resend_after_ms: 1_000,
    }
}

fn svc(s: &str) -> ServiceKey {
    ServiceKey::new("default", s, "default").unwrap()
}

struct World {
    cat: Catalog,
    dist: Distributor,
    now: u64,
}

impl World {
    fn new() -> Self {
        World::with_catalog(CatalogParams::with_region(Label::new("r1").unwrap()))
    }

    fn with_catalog(catalog: CatalogParams) -> Self {
        let mut w = World {
            cat: Catalog::new(catalog),
            dist: Distributor::new(params(), crate::codec::shared_service_snapshot),
            now: 1_000,
        };
        w.commit(Command::GrantLease {
            node: NodeId::new("n1").unwrap(),
            epoch: AgentEpoch(1),
            zone: Label::new("z1").unwrap(),
            ttl_ms: 10_000,
        });
        w
    }

    fn commit(&mut self, command: Command) -> Vec<Output> {
        let actor = Principal {
            role: Role::Operator,
            name: PrincipalName::new("t").unwrap(),
        };
        let applied = self
            .cat
            .apply(&Envelope {
                at_ms: self.now,
                actor,
                command,
            })
            .unwrap();
        let mut out = Vec::new();
        self.dist
            .committed(&applied.services, self.now, &self.cat, &mut out);
        out
    }

    fn register(&mut self, id: &str, service: &str) -> Vec<Output> {
        self.commit(Command::Register(Registration {
            instance_id: InstanceId::new(id).unwrap(),
            service: svc(service),
            node: NodeId::new("n1").unwrap(),
            epoch: AgentEpoch(1),
            address: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 80,
            zone: None,
            version: Version::new("v1").unwrap(),
            weight: Weight::DEFAULT,
            labels: Vec::new(),
            initial: State::Ready,
        }))
    }

    fn drain(&mut self, id: &str) -> Vec<Output> {
        self.commit(Command::Transition {
            instance_id: InstanceId::new(id).unwrap(),
            generation: Generation(1),
            to: State::Draining,
            reason: Reason::new("drain").unwrap(),
        })
    }

    fn subscribe(&mut self, agent: AgentId, service: &str, have: Option<Revision>) -> Vec<Output> {
        let mut out = Vec::new();
        self.dist
            .subscribe(agent, svc(service), have, self.now, &self.cat, &mut out);
        out
    }

    fn sent(&mut self, agent: AgentId) -> Vec<Output> {
        let mut out = Vec::new();
        self.dist.sent(agent, self.now, &self.cat, &mut out);
        out
    }

    fn wake(&mut self, agent: AgentId) -> Vec<Output> {
        let mut out = Vec::new();
        self.dist.wake(agent, self.now, &self.cat, &mut out);
        out
    }

    fn sweep(&mut self) -> Vec<Output> {
        let mut out = Vec::new();
        self.dist.sweep(self.now, &self.cat, &mut out);
        out
    }

    fn revision(&self, service: &str) -> Revision {
        self.cat.service(&svc(service)).unwrap().revision
    }

    fn ack(&mut self, agent: AgentId, service: &str, revision: Revision) -> Vec<Output> {
        let mut out = Vec::new();
        self.dist.ack(
            agent,
            &svc(service),
            revision,
            self.now,
            &self.cat,
            &mut out,
        );
        out
    }

    /// Agent `agent` follows `service`, holding its current revision, the
    /// "you are current" answer has been sent, and a coalescing window has
    /// passed since (the stream is quiet).
    fn following(&mut self, agent: AgentId, service: &str) {
        self.dist.connect(agent);
        self.subscribe(agent, service, Some(self.revision(service)));
        self.sent(agent);
        self.quiet();
    }

    /// A coalescing window passes.
    fn quiet(&mut self) {
        self.now += params().coalesce_window_ms;
    }
}

fn sends(out: &[Output]) -> Vec<(AgentId, &Vec<ServiceUpdate>)> {
    out.iter()
        .filter_map(|o| match o {
            Output::Send { agent, updates } => Some((*agent, updates)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_lone_change_goes_out_at_once_on_an_idle_stream() {
    let mut w = World::new();
    w.register("a", "web");
    w.dist.connect(1);
    let out = w.subscribe(1, "web", Some(w.cat.service(&svc("web")).unwrap().revision));
    assert!(
        matches!(&sends(&out)[0].1[0], ServiceUpdate::Current { .. }),
        "an up-to-date subscriber is told so"
    );
    w.sent(1);
    // Within a window of the last message the change waits for it.
    let out = w.drain("a");
    assert!(sends(&out).is_empty());
    assert!(out
        .iter()
        .any(|o| matches!(o, Output::WakeAt { at_ms, .. } if *at_ms == w.now + 20)));
    // On a stream quiet for a window, a lone change goes at once.
    w.quiet();
    let out = w.register("b", "web");
    let s = sends(&out);
    assert_eq!(s.len(), 1);
    assert!(matches!(&s[0].1[0], ServiceUpdate::Deltas(d) if d.len() == 2));
}

#[test]
fn changes_during_a_send_are_merged_after_the_window() {
    let mut w = World::new();
    w.dist.connect(1);
    w.register("a", "web");
    w.subscribe(1, "web", Some(w.cat.service(&svc("web")).unwrap().revision));
    w.sent(1);
    w.quiet();
    let first = w.register("b", "web");
    assert_eq!(sends(&first).len(), 1);
    // Three more changes while the first send is in flight: nothing goes.
    for id in ["c", "d", "e"] {
        w.now += 1;
        assert!(sends(&w.register(id, "web")).is_empty());
    }
    // The send completes 5 ms after it started: wait for the window.
    w.now += 2;
    let out = w.sent(1);
    assert!(sends(&out).is_empty());
    let wake_at = out
        .iter()
        .find_map(|o| match o {
            Output::WakeAt { at_ms, .. } => Some(*at_ms),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        wake_at,
        w.now - 5 + 20,
        "one message per window, counted from the last message"
    );
    w.now = wake_at;
    let out = w.wake(1);
    let s = sends(&out);
    assert_eq!(s.len(), 1);
    match &s[0].1[0] {
        ServiceUpdate::Deltas(d) => assert_eq!(d.len(), 3, "three changes, one message"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn snapshots_are_bounded_and_the_rest_retry() {
    let mut w = World::new();
    w.register("a", "web");
    let mut snapshots = 0;
    let mut retries = 0;
    for agent in 1..=3 {
        w.dist.connect(agent);
        for (_, updates) in sends(&w.subscribe(agent, "web", None)) {
            for u in updates {
                match u {
                    ServiceUpdate::Snapshot(_) => snapshots += 1,
                    ServiceUpdate::RetryAfter { ms, .. } => {
                        assert_eq!(*ms, 250);
                        retries += 1
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
    }
    assert_eq!((snapshots, retries), (2, 1));
    assert_eq!(w.dist.snapshots_in_flight(), 2);
    w.sent(1);
    assert_eq!(w.dist.snapshots_in_flight(), 1);
    // Agent 3 got its retry answer and asks again after its wait: now there is a slot.
    w.sent(3);
    w.quiet();
    let out = w.subscribe(3, "web", None);
    assert!(matches!(sends(&out)[0].1[0], ServiceUpdate::Snapshot(_)));
    assert_eq!(w.dist.stats().max_concurrent_snapshots_seen, 2);
}

/// Issue 38, item 5: one agent that lost its cache cannot take every
/// snapshot slot; what is beyond `limits.snapshots_per_session` retries,
/// with slots still free for the others.
#[test]
fn one_agent_gets_at_most_its_share_of_snapshots_at_once() {
    let mut w = World::new();
    w.dist = Distributor::new(
        DistParams {
            max_concurrent_snapshots: 10,
            ..params()
        },
        crate::codec::shared_service_snapshot,
    );
    for s in ["s1", "s2", "s3", "s4"] {
        w.register(&format!("{s}-0"), s);
    }
    w.dist.connect(1);
    // The first goes at once; the next three wait for it, then go in one
    // message, where the bound of two per agent holds.
    assert_eq!(sends(&w.subscribe(1, "s1", None)).len(), 1);
    for s in ["s2", "s3", "s4"] {
        assert!(sends(&w.subscribe(1, s, None)).is_empty());
    }
    w.quiet();
    let out = w.sent(1);
    let updates = sends(&out)[0].1;
    let snapshots = updates
        .iter()
        .filter(|u| matches!(u, ServiceUpdate::Snapshot(_)))
        .count();
    let retries = updates
        .iter()
        .filter(|u| matches!(u, ServiceUpdate::RetryAfter { .. }))
        .count();
    assert_eq!((snapshots, retries), (2, 1), "{updates:?}");
    assert_eq!(w.dist.stats().snapshots_limited, 1);
    // Another agent still gets a snapshot: slots are free overall.
    w.dist.connect(2);
    let out = w.subscribe(2, "s1", None);
    assert!(matches!(sends(&out)[0].1[0], ServiceUpdate::Snapshot(_)));
}

#[test]
fn a_snapshot_decodes_into_the_current_view() {
    let mut w = World::new();
    w.register("a", "web");
    w.register("b", "web");
    w.dist.connect(1);
    let out = w.subscribe(1, "web", None);
    let ServiceUpdate::Snapshot(bytes) = &sends(&out)[0].1[0] else {
        panic!()
    };
    let snap = crate::codec::decode_service_snapshot(bytes).unwrap();
    let view = ServiceView::from_snapshot(&snap).unwrap();
    assert_eq!(view.digest(), w.cat.service(&svc("web")).unwrap().digest);
}

#[test]
fn a_stalled_agent_is_disconnected() {
    let mut w = World::new();
    w.register("a", "web");
    w.dist.connect(1);
    w.subscribe(1, "web", None);
    assert_eq!(w.dist.snapshots_in_flight(), 1);
    w.now += 9_999;
    assert!(w.wake(1).is_empty());
    w.now += 1;
    let out = w.wake(1);
    assert!(matches!(&out[0], Output::Disconnect { agent: 1, .. }));
    assert_eq!(
        w.dist.snapshots_in_flight(),
        0,
        "its snapshot slot is freed"
    );
    assert!(w.dist.agent_ids().is_empty());
}

#[test]
fn unknown_services_are_answered_and_delivered_once_created() {
    let mut w = World::new();
    w.dist.connect(1);
    let out = w.subscribe(1, "later", None);
    assert!(matches!(
        &sends(&out)[0].1[0],
        ServiceUpdate::Unknown { .. }
    ));
    w.sent(1);
    w.quiet();
    let out = w.register("x", "later");
    let s = sends(&out);
    assert_eq!(s.len(), 1, "the creation reaches the waiting subscriber");
    let mut view = ServiceView::empty(svc("later"), crate::ids::ShardId(0));
    match &s[0].1[0] {
        ServiceUpdate::Deltas(d) => d.iter().for_each(|d| view.apply(d).unwrap()),
        other => panic!("{other:?}"),
    }
    assert_eq!(view.ready().count(), 1);
}

#[test]
fn a_subscriber_ahead_of_the_catalog_is_told_to_wait() {
    let mut w = World::new();
    w.register("a", "web");
    w.dist.connect(1);
    let ahead = w.cat.revision().next();
    let out = w.subscribe(1, "web", Some(ahead));
    assert!(matches!(&sends(&out)[0].1[0], ServiceUpdate::NotYet { .. }));
}

#[test]
fn propagation_counts_acknowledging_subscribers() {
    let mut w = World::new();
    w.register("a", "web");
    for agent in 1..=3 {
        w.dist.connect(agent);
        w.subscribe(agent, "web", None);
        w.sent(agent);
    }
    w.drain("a");
    let rev = w.cat.revision();
    assert_eq!(w.dist.propagation(&svc("web"), rev), (0, 3));
    w.ack(1, "web", rev);
    w.ack(2, "web", rev);
    assert_eq!(w.dist.propagation(&svc("web"), rev), (2, 3));
    assert!(w.dist.ack_lag(3, &w.cat) > 0);
    assert_eq!(w.dist.ack_lag(1, &w.cat), 0);
    w.dist.disconnect(3);
    assert_eq!(w.dist.propagation(&svc("web"), rev), (2, 2));
}

/// The revisions the deltas in `out` carry, for one agent.
fn delta_revisions(out: &[Output]) -> Vec<(Revision, Revision)> {
    sends(out)
        .into_iter()
        .flat_map(|(_, updates)| updates.iter())
        .filter_map(|u| match u {
            ServiceUpdate::Deltas(d) => Some(d.iter().map(|d| (d.prev_revision, d.revision))),
            _ => None,
        })
        .flatten()
        .collect()
}

#[test]
fn a_lost_delta_is_sent_again_after_resend_after_ms_and_not_before() {
    let mut w = World::new();
    w.register("a", "web");
    w.following(1, "web");
    let held = w.revision("web");
    // The delta goes out (and is lost on the way); the send completes 300 ms
    // after it was queued.
    let first = w.drain("a");
    let lost = w.revision("web");
    assert_eq!(delta_revisions(&first), vec![(held, lost)]);
    w.now += 300;
    w.sent(1);
    // The clock starts when the send completed.
    w.now += 999;
    assert!(sends(&w.sweep()).is_empty(), "not before resend_after_ms");
    w.now += 1;
    let out = w.sweep();
    assert_eq!(
        delta_revisions(&out),
        vec![(held, lost)],
        "the same delta, from the acknowledged revision"
    );
    assert_eq!(w.dist.stats().resent_as_deltas, 1);
    assert_eq!(w.dist.stats().resent_as_snapshots, 0);
}

#[test]
fn a_send_still_in_flight_is_not_sent_again() {
    let mut w = World::new();
    w.register("a", "web");
    w.following(1, "web");
    w.drain("a");
    // Not completed yet (a slow agent, below the stall timeout).
    w.now += 5_000;
    assert!(sends(&w.sweep()).is_empty());
    w.sent(1);
    w.now += 999;
    assert!(sends(&w.sweep()).is_empty());
    w.now += 1;
    assert_eq!(delta_revisions(&w.sweep()).len(), 1);
}

#[test]
fn an_ack_stops_the_resending() {
    let mut w = World::new();
    w.register("a", "web");
    w.following(1, "web");
    w.register("b", "web");
    w.sent(1);
    w.now += 1_000;
    assert_eq!(delta_revisions(&w.sweep()).len(), 1);
    w.sent(1);
    // The re-sent delta is applied and acknowledged: nothing more, ever.
    w.ack(1, "web", w.revision("web"));
    for _ in 0..20 {
        w.now += 1_000;
        assert!(sends(&w.sweep()).is_empty());
    }
    // An ack that arrives in time means no re-send at all.
    w.register("c", "web");
    w.sent(1);
    w.now += 10;
    w.ack(1, "web", w.revision("web"));
    w.now += 10_000;
    assert!(sends(&w.sweep()).is_empty());
    assert_eq!(w.dist.stats().resent_as_deltas, 1);
}

#[test]
fn a_gap_older_than_the_delta_log_gets_a_snapshot() {
    let mut params = CatalogParams::with_region(Label::new("r1").unwrap());
    params.delta_log.max_entries = 3;
    let mut w = World::with_catalog(params);
    w.register("a", "web");
    w.following(1, "web");
    w.register("b", "web");
    w.sent(1);
    // Other services' changes push the agent's acknowledged revision out
    // of the log before the re-send is due.
    for id in ["x", "y", "z", "w"] {
        w.register(id, "other");
    }
    w.now += 1_000;
    let out = w.sweep();
    let s = sends(&out);
    assert_eq!(s.len(), 1);
    let ServiceUpdate::Snapshot(bytes) = &s[0].1[0] else {
        panic!("{:?}", s[0].1)
    };
    let snap = crate::codec::decode_service_snapshot(bytes).unwrap();
    assert_eq!(snap.revision, w.revision("web"));
    assert_eq!(w.dist.snapshots_in_flight(), 1, "it takes a snapshot slot");
    assert_eq!(w.dist.stats().resent_as_snapshots, 1);
}

#[test]
fn a_snapshot_re_send_counts_against_the_snapshot_bound() {
    let mut w = World::new();
    w.register("a", "web");
    w.following(1, "web");
    w.register("b", "web");
    w.sent(1);
    // A lost snapshot: agent 2 asked for one, got it sent, never acked.
    w.dist.connect(2);
    w.subscribe(2, "web", None);
    w.sent(2);
    // Both slots are taken by agents 3 and 4 when agent 2's re-send is due.
    w.now += 1_000;
    for agent in [3, 4] {
        w.dist.connect(agent);
        w.subscribe(agent, "web", None);
    }
    let out = w.sweep();
    let updates: Vec<_> = sends(&out).into_iter().collect();
    assert!(
        matches!(
            updates.iter().find(|(a, _)| *a == 2).map(|(_, u)| &u[0]),
            Some(ServiceUpdate::RetryAfter { .. })
        ),
        "{updates:?}"
    );
    assert_eq!(w.dist.snapshots_in_flight(), 2);
    assert!(
        matches!(
            updates.iter().find(|(a, _)| *a == 1).map(|(_, u)| &u[0]),
            Some(ServiceUpdate::Deltas(_))
        ),
        "agent 1 acknowledged a revision the log holds: deltas, no slot needed"
    );
}

#[test]
fn four_quick_resends_then_the_wait_doubles_up_to_eight_times_and_resets_on_ack() {
    let mut w = World::new();
    w.register("a", "web");
    w.following(1, "web");
    w.register("b", "web");
    w.sent(1);
    let mut resent_at = Vec::new();
    let start = w.now;
    while w.now < start + 40_000 {
        w.now += 100;
        if !sends(&w.sweep()).is_empty() {
            resent_at.push(w.now - start);
            w.sent(1);
        }
    }
    assert_eq!(
        resent_at,
        vec![1_000, 2_000, 3_000, 4_000, 6_000, 10_000, 18_000, 26_000, 34_000]
    );
    // The agent catches up; the next lost change waits resend_after_ms again.
    w.ack(1, "web", w.revision("web"));
    w.register("c", "web");
    w.sent(1);
    w.now += 999;
    assert!(sends(&w.sweep()).is_empty());
    w.now += 1;
    assert_eq!(delta_revisions(&w.sweep()).len(), 1);
}

/// One agent behind a stream that loses messages, stepped by a clock that
/// sweeps every 250 ms like the arbiter's core. The agent applies what
/// reaches it as `node/src/sync.rs` does: skips deltas it holds, asks for a
/// snapshot on a gap, acknowledges what it applied — or, when `acks` says
/// so, stays quiet about it (a slow, buggy or older agent).
struct Lossy {
    w: World,
    view: ServiceView,
    wakes: Vec<u64>,
    losses: std::vec::IntoIter<bool>,
    acks: Box<dyn Iterator<Item = bool>>,
}

impl Lossy {
    const SWEEP_MS: u64 = 250;

    fn carry(&mut self, out: Vec<Output>) {
        let mut queue: VecDeque<Output> = out.into();
        while let Some(o) = queue.pop_front() {
            match o {
                Output::Send { agent, updates } => {
                    if !self.losses.next().unwrap_or(false) {
                        for update in updates {
                            queue.extend(self.receive(update));
                        }
                    }
                    queue.extend(self.w.sent(agent));
                }
                Output::WakeAt { at_ms, .. } => self.wakes.push(at_ms),
                Output::Disconnect { reason, .. } => panic!("{reason}"),
            }
        }
    }

    fn receive(&mut self, update: ServiceUpdate) -> Vec<Output> {
        match update {
            ServiceUpdate::Deltas(deltas) => {
                let held = self.view.revision();
                for delta in deltas.iter().filter(|d| d.revision > held) {
                    if self.view.apply(delta).is_err() {
                        return self.w.subscribe(1, "web", None);
                    }
                }
            }
            ServiceUpdate::Snapshot(bytes) => {
                let snap = crate::codec::decode_service_snapshot(&bytes).unwrap();
                self.view = ServiceView::from_snapshot(&snap).unwrap();
            }
            ServiceUpdate::Current { .. } => return Vec::new(),
            other => panic!("{other:?}"),
        }
        if self.acks.next().unwrap_or(true) {
            let revision = self.view.revision();
            self.w.ack(1, "web", revision);
        }
        Vec::new()
    }

    fn tick(&mut self, ms: u64) {
        let until = self.w.now + ms;
        while self.w.now < until {
            self.w.now = (self.w.now + Self::SWEEP_MS).min(until);
            let now = self.w.now;
            let due = self.wakes.iter().filter(|at| **at <= now).count();
            self.wakes.retain(|at| *at > now);
            for _ in 0..due {
                let out = self.w.wake(1);
                self.carry(out);
            }
            let out = self.w.sweep();
            self.carry(out);
        }
    }
}

/// Runs `steps` (0, 1: a change to web; 2: a change to another service;
/// 3: nothing) against one agent following web, with the stream losing
/// the sends `losses` names and the agent acknowledging as `acks` says;
/// then lets the stream work and returns the agent's view and the
/// catalog's, after the longest re-send wait.
fn converge(
    steps: Vec<(u8, u64)>,
    losses: Vec<bool>,
    acks: Box<dyn Iterator<Item = bool>>,
) -> ((Revision, crate::Digest), (Revision, crate::Digest)) {
    let mut catalog = CatalogParams::with_region(Label::new("r1").unwrap());
    catalog.delta_log.max_entries = 4;
    let mut w = World::with_catalog(catalog);
    w.register("i0", "web");
    w.dist.connect(1);
    let snap = w.cat.service_snapshot(&svc("web")).unwrap();
    let view = ServiceView::from_snapshot(&snap).unwrap();
    let out = w.subscribe(1, "web", Some(view.revision()));
    let mut sim = Lossy {
        w,
        view,
        wakes: Vec::new(),
        losses: losses.into_iter(),
        acks,
    };
    sim.carry(out);
    for (n, (kind, ms)) in steps.into_iter().enumerate() {
        let out = match kind {
            0 | 1 => sim.w.register(&format!("i{}", n + 1), "web"),
            2 => sim.w.register(&format!("o{n}"), "other"),
            _ => Vec::new(),
        };
        sim.carry(out);
        sim.tick(ms);
    }
    sim.losses = Vec::new().into_iter();
    sim.tick(MAX_RESEND_BACKOFF * params().resend_after_ms + Lossy::SWEEP_MS);
    let info = sim.w.cat.service(&svc("web")).unwrap();
    (
        (sim.view.revision(), sim.view.digest()),
        (info.revision, info.digest),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever the stream loses, once it stops losing the agent holds the
    /// catalog's view of the service within the longest re-send wait.
    #[test]
    fn an_agent_behind_a_lossy_stream_converges(
        steps in prop::collection::vec((0u8..4, 1u64..1_500), 1..40),
        losses in prop::collection::vec(any::<bool>(), 0..80),
    ) {
        let (held, catalog) = converge(steps, losses, Box::new(std::iter::empty()));
        prop_assert_eq!(held, catalog);
    }

    /// An agent that acknowledges only some of what it applied, or
    /// nothing at all (a quiet session), still gets every change: the
    /// arbiter never treats an unacknowledged revision as delivered, nor a
    /// quiet session as one to stop sending to.
    #[test]
    fn an_agent_that_acknowledges_little_or_nothing_converges(
        steps in prop::collection::vec((0u8..4, 1u64..1_500), 1..40),
        losses in prop::collection::vec(any::<bool>(), 0..80),
        acks in prop::collection::vec(any::<bool>(), 0..80),
        quiet in any::<bool>(),
    ) {
        let acks: Box<dyn Iterator<Item = bool>> = if quiet {
            Box::new(std::iter::repeat(false))
        } else {
            Box::new(acks.into_iter())
        };
        let (held, catalog) = converge(steps, losses, acks);
        prop_assert_eq!(held, catalog);
    }
}

#[test]
fn an_ack_of_a_revision_the_catalog_never_had_is_answered_with_a_snapshot() {
    let mut w = World::new();
    w.register("a", "web");
    w.following(1, "web");
    let current = w.revision("web");
    // An honest ack changes nothing.
    assert!(w.ack(1, "web", current).is_empty());
    // An agent that took a damaged update for revision 10^9 would skip
    // every later change as held: it gets a snapshot at once.
    let out = w.ack(1, "web", Revision(1_000_000_000));
    let sent = sends(&out);
    assert_eq!(sent.len(), 1, "{out:?}");
    assert!(
        matches!(sent[0].1.as_slice(), [ServiceUpdate::Snapshot(_)]),
        "{out:?}"
    );
    assert_eq!(w.dist.stats().acks_ahead, 1);
    // Its ack of the snapshot is honest again: nothing more is sent.
    w.sent(1);
    assert!(w.ack(1, "web", current).is_empty());
    w.now += 10 * params().resend_after_ms;
    assert!(sends(&w.sweep()).is_empty(), "acknowledged: no re-send");
}
