//! The session machine stepped by hand: Hellos, watches, requests, down
//! reports; `rules` holds the rules' own tests.

use std::net::{IpAddr, Ipv4Addr};

use rollcall_config::{
    AddressRule, ArbiterConfig, ControllerGrant, RegistrationRule, ServicePattern, WatchRule,
};

use super::*;
use crate::command::{Envelope, Registration};
use crate::endpoint::{Principal, Role, State, Weight};
use crate::ids::Generation;
use crate::name::{InstanceId, PrincipalName, Reason, Version};
use crate::params::CatalogParams;

mod rules;

use rules::rules_with;

/// The addresses a test session declared: its registrations' address.
pub(super) const LOOPBACK: [IpAddr; 1] = [IpAddr::V4(Ipv4Addr::LOCALHOST)];

pub(super) fn rules() -> Rules {
    let mut config = ArbiterConfig {
        controllers: vec![ControllerGrant {
            name: "deployer".into(),
            services: vec![ServicePattern::try_from("default/api/*".to_owned()).unwrap()],
        }],
        ..ArbiterConfig::default()
    };
    config.watch_rules = vec![WatchRule {
        nodes: vec!["n2".into()],
        services: vec![ServicePattern::try_from("default/web/*".to_owned()).unwrap()],
    }];
    Rules::new(&config, Label::new("r1").unwrap())
}

pub(super) fn identity(role: Role, name: &str) -> Identity {
    Identity::new(
        Label::new("r1").unwrap(),
        role,
        PrincipalName::new(name).unwrap(),
    )
}

pub(super) fn svc(s: &str) -> ServiceKey {
    ServiceKey::new("default", s, "default").unwrap()
}

pub(super) fn registration(node: &str, service: &str) -> Registration {
    Registration {
        instance_id: InstanceId::new(&format!("{service}-1")).unwrap(),
        service: svc(service),
        node: NodeId::new(node).unwrap(),
        epoch: AgentEpoch(1),
        address: IpAddr::V4(Ipv4Addr::LOCALHOST),
        port: 80,
        zone: None,
        version: Version::new("v1").unwrap(),
        weight: Weight::DEFAULT,
        labels: Vec::new(),
        initial: State::Ready,
    }
}

/// A catalog holding web-1 on n1.
pub(super) fn catalog() -> Catalog {
    let mut cat = Catalog::new(CatalogParams::with_region(Label::new("r1").unwrap()));
    let actor = Principal {
        role: Role::Operator,
        name: PrincipalName::new("t").unwrap(),
    };
    for command in [
        Command::GrantLease {
            node: NodeId::new("n1").unwrap(),
            epoch: AgentEpoch(1),
            zone: Label::new("z1").unwrap(),
            ttl_ms: 10_000,
        },
        Command::Register(registration("n1", "web")),
    ] {
        cat.apply(&Envelope {
            at_ms: 1,
            actor: actor.clone(),
            command,
        })
        .unwrap();
    }
    cat
}

pub(super) fn refusal(result: Result<Authorized, Response>) -> (RejectKind, String) {
    match result {
        Err(Response::Rejected { kind, message }) => (kind, message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn sessions() -> Sessions {
    Sessions::new(rules(), ShardId(0), 10_000)
}

fn hello(node: &str) -> SessionUp {
    SessionUp::Hello {
        node: NodeId::new(node).unwrap(),
        epoch: AgentEpoch(4),
        zone: Label::new("z1").unwrap(),
        addresses: LOOPBACK.to_vec(),
    }
}

#[test]
fn a_session_starts_with_an_accepted_hello_and_nothing_else() {
    let mut s = sessions();
    s.connect(1, identity(Role::Agent, "n1"), Vec::new());
    // Anything before Hello closes the connection.
    let (heard, step) = s.message(1, SessionUp::Keepalive, 5);
    assert_eq!(heard, None);
    assert_eq!(
        step,
        Step::Close("the session must start with Hello".into())
    );
    // Hello for another node is refused with the reason.
    let (heard, step) = s.message(1, hello("n2"), 5);
    assert_eq!(heard, None);
    assert!(matches!(step, Step::Refuse(r) if r.contains("only its own node's lease")));
    assert!(s.held(1).is_none(), "a refused Hello holds nothing");
    // Its own node: a lease grant, stamped now, for the configured TTL.
    let (heard, step) = s.message(1, hello("n1"), 7);
    assert_eq!(
        heard,
        Some((NodeId::new("n1").unwrap(), AgentEpoch(4), false))
    );
    let Step::Grant { envelope, .. } = step else {
        panic!("{step:?}")
    };
    assert_eq!(envelope.at_ms, 7);
    assert!(matches!(
        envelope.command,
        Command::GrantLease {
            ttl_ms: 10_000,
            epoch: AgentEpoch(4),
            ..
        }
    ));
    // A second Hello on the same session closes it.
    let (_, step) = s.message(1, hello("n1"), 8);
    assert_eq!(step, Step::Close("a second Hello on one session".into()));
    // Every message of the session counts as heard; a renewal says so.
    let (heard, step) = s.message(1, SessionUp::Renew, 9);
    assert_eq!(
        heard,
        Some((NodeId::new("n1").unwrap(), AgentEpoch(4), true))
    );
    assert!(matches!(step, Step::Renew { .. }));
    assert_eq!(
        s.disconnect(1),
        Some((NodeId::new("n1").unwrap(), AgentEpoch(4)))
    );
}

#[test]
fn a_session_is_live_only_once_its_welcome_went_out() {
    let mut s = sessions();
    s.connect(1, identity(Role::Agent, "n1"), Vec::new());
    s.welcomed(1);
    assert!(s.live(1).is_none(), "no Hello yet: nothing to welcome");
    let (_, step) = s.message(1, hello("n1"), 7);
    assert!(matches!(step, Step::Grant { .. }));
    // The grant is proposed, not committed: the session holds the
    // lease, but nothing may go down its stream before the Welcome.
    assert!(s.held(1).is_some());
    assert!(s.live(1).is_none());
    s.welcomed(1);
    assert_eq!(
        s.live(1),
        Some(&(NodeId::new("n1").unwrap(), AgentEpoch(4)))
    );
    s.disconnect(1);
    assert!(s.live(1).is_none());
}

#[test]
fn a_new_session_of_a_node_replaces_the_old_one_unless_it_is_an_older_run() {
    let mut s = sessions();
    let with_epoch = |epoch| SessionUp::Hello {
        node: NodeId::new("n1").unwrap(),
        epoch: AgentEpoch(epoch),
        zone: Label::new("z1").unwrap(),
        addresses: LOOPBACK.to_vec(),
    };
    s.connect(1, identity(Role::Agent, "n1"), Vec::new());
    let (_, step) = s.message(1, with_epoch(4), 1);
    assert!(matches!(step, Step::Grant { ref replaced, .. } if replaced.is_empty()));
    // Another node's session is nobody's business here.
    s.connect(9, identity(Role::Agent, "n9"), Vec::new());
    s.message(9, hello("n9"), 1);
    // The same run reconnecting: the old session goes, with the reason.
    s.connect(2, identity(Role::Agent, "n1"), Vec::new());
    let (_, step) = s.message(2, with_epoch(4), 2);
    let Step::Grant { replaced, .. } = step else {
        panic!("{step:?}")
    };
    assert_eq!(replaced.len(), 1);
    assert_eq!(replaced[0].0, 1);
    assert!(replaced[0]
        .1
        .contains("replaced by a newer session of node n1"));
    assert!(
        s.held(1).is_none() && s.identity(1).is_none(),
        "forgotten at once"
    );
    assert_eq!(s.message(1, SessionUp::Renew, 3), (None, Step::Nothing));
    // An older run cannot push out a later one, and holds nothing.
    s.connect(3, identity(Role::Agent, "n1"), Vec::new());
    let (heard, step) = s.message(3, with_epoch(3), 4);
    assert_eq!(heard, None);
    assert!(
        matches!(&step, Step::Refuse(r) if r.contains("later agent run (epoch 4")),
        "{step:?}"
    );
    assert!(s.held(2).is_some() && s.held(3).is_none());
    // A later run does.
    s.connect(4, identity(Role::Agent, "n1"), Vec::new());
    let (_, step) = s.message(4, with_epoch(5), 5);
    assert!(
        matches!(step, Step::Grant { ref replaced, .. } if replaced.iter().map(|r| r.0).collect::<Vec<_>>() == vec![2])
    );
    assert!(s.held(9).is_some(), "n9 untouched");
}

#[test]
fn a_controller_certificate_holds_no_lease() {
    let mut s = sessions();
    s.connect(2, identity(Role::Controller, "deployer"), Vec::new());
    let (_, step) = s.message(2, hello("deployer"), 1);
    assert!(matches!(step, Step::Refuse(r) if r.contains("cannot hold a node lease")));
}

#[test]
fn watches_outside_the_rules_or_the_shard_are_denied() {
    let mut s = sessions();
    s.connect(3, identity(Role::Agent, "n2"), Vec::new());
    s.message(3, hello("n2"), 1);
    let subscribe = |service: &str, shard: u16| SessionUp::Subscribe {
        shard: ShardId(shard),
        service: svc(service),
        have: None,
    };
    assert_eq!(
        s.message(3, subscribe("web", 0), 2).1,
        Step::Subscribe {
            service: svc("web"),
            have: None
        }
    );
    assert!(matches!(
        s.message(3, subscribe("db", 0), 2).1,
        Step::Deny { reason, .. } if reason.contains("watch_rules")
    ));
    assert!(matches!(
        s.message(3, subscribe("web", 1), 2).1,
        Step::Deny { reason, .. } if reason.contains("serves shard 0, not shard 1")
    ));
}

#[test]
fn the_services_listed_are_those_the_node_may_watch() {
    let mut s = sessions();
    let mut cat = catalog();
    cat.apply(&Envelope {
        at_ms: 2,
        actor: identity(Role::Agent, "n1").principal,
        command: Command::Register(registration("n1", "db")),
    })
    .unwrap();
    let listed = |s: &Sessions, agent| match s.request(agent, Request::Services, &cat, 3) {
        Ok(Accepted::Answer(Response::Services {
            services,
            revision,
            truncated,
        })) => {
            assert_eq!((revision, truncated), (cat.revision(), false));
            services
                .iter()
                .map(|c| (c.service.service.to_string(), c.ready, c.total))
                .collect::<Vec<_>>()
        }
        other => panic!("{other:?}"),
    };
    // Without a session, nothing is listed.
    s.connect(1, identity(Role::Agent, "n1"), Vec::new());
    assert!(s.request(1, Request::Services, &cat, 3).is_err());
    s.message(1, hello("n1"), 3);
    assert_eq!(
        listed(&s, 1),
        vec![("db".to_owned(), 1, 1), ("web".to_owned(), 1, 1)]
    );
    // n2 may watch web only.
    s.connect(2, identity(Role::Agent, "n2"), Vec::new());
    s.message(2, hello("n2"), 3);
    assert_eq!(listed(&s, 2), vec![("web".to_owned(), 1, 1)]);
}

#[test]
fn requests_are_stamped_with_who_and_when_or_refused() {
    let mut s = sessions();
    let cat = catalog();
    s.connect(1, identity(Role::Agent, "n1"), Vec::new());
    // No session yet: listing is refused.
    assert!(s.request(1, Request::NodeInstances, &cat, 5).is_err());
    s.message(1, hello("n1"), 5);
    let Ok(Accepted::Propose(envelope)) =
        s.request(1, Request::Register(registration("n1", "web")), &cat, 9)
    else {
        panic!("an agent registers on its own node")
    };
    assert_eq!(envelope.at_ms, 9);
    assert_eq!(envelope.actor, identity(Role::Agent, "n1").principal);
    assert!(matches!(
        s.request(
            1,
            Request::ReportDown {
                node: NodeId::new("n2").unwrap(),
                epoch: AgentEpoch(1)
            },
            &cat,
            9
        ),
        Ok(Accepted::Down { reporter, .. }) if reporter.as_str() == "n1"
    ));
    // A connection that is gone.
    assert!(s.request(7, Request::NodeInstances, &cat, 9).is_err());
}

/// The two-signal rule (R4) as the core and the simulator carry it: a
/// report about a node the arbiter hears after it (its probe answered)
/// answers "partition", removes nothing; about a node that answers no
/// probe within the timeout, it proposes the verdict and answers the
/// first reporter once committed.
#[test]
fn a_down_report_needs_the_arbiters_own_silence_too() {
    use crate::leader::{agent_principal, LeaderMemory, LeaderParams};
    let cat = catalog();
    let params = LeaderParams::from(&ArbiterConfig::default());
    let probe = params.probe_timeout_ms;
    let me = Principal {
        role: Role::Arbiter,
        name: PrincipalName::new("a").unwrap(),
    };
    let mut leader: LeaderMemory<u32> = LeaderMemory::new(params, me, 0);
    leader.take_office(0, cat.leases());
    let (n1, n2) = (NodeId::new("n1").unwrap(), NodeId::new("n2").unwrap());
    // n1 was heard just before: the report is held, then heard again →
    // partition.
    leader.heard(&n1, 999);
    let held = leader.report_down(
        n2.clone(),
        agent_principal(&n2),
        n1.clone(),
        AgentEpoch(1),
        1_000,
        false,
        Some(1),
    );
    assert!(held.is_empty(), "held for the arbiter's own signal");
    leader.heard(&n1, 1_500);
    let verdicts = leader.sweep(1_600, cat.leases()).verdicts;
    let [verdict] = <[_; 1]>::try_from(verdicts).expect("one verdict");
    match down_outcome(verdict) {
        DownOutcome::Answer { waiting, answer } => {
            assert_eq!(waiting, vec![1]);
            assert!(
                matches!(answer, Response::Rejected { kind: RejectKind::Invalid, message } if message.contains("partition"))
            );
        }
        other => panic!("a heard node is a partition: {other:?}"),
    }
    // Silent since 1.5 s: a new report settles once its probe went
    // unanswered for the timeout.
    leader.report_down(
        n2.clone(),
        agent_principal(&n2),
        n1.clone(),
        AgentEpoch(1),
        2_000,
        false,
        Some(2),
    );
    // A second node's report: a single reporter would wait for a witness.
    let n3 = NodeId::new("n3").unwrap();
    leader.report_down(
        n3.clone(),
        agent_principal(&n3),
        n1.clone(),
        AgentEpoch(1),
        2_100,
        false,
        Some(3),
    );
    assert!(leader
        .sweep(2_000 + probe - 1, cat.leases())
        .verdicts
        .is_empty());
    let verdicts = leader.sweep(2_000 + probe, cat.leases()).verdicts;
    let [verdict] = <[_; 1]>::try_from(verdicts).expect("one verdict");
    match down_outcome(verdict) {
        DownOutcome::Propose {
            envelope,
            first,
            others,
            answer,
        } => {
            assert!(matches!(envelope.command, Command::NodeDown { ref node, .. } if *node == n1));
            assert_eq!(first, Some(2));
            assert_eq!(others, vec![3]);
            assert!(matches!(answer, Response::Committed { .. }));
        }
        other => panic!("a silent node is proposed down: {other:?}"),
    }
}

#[test]
fn a_hello_declares_addresses_within_the_certificate() {
    let here = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
    let there = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
    let hello_at = |addresses: Vec<IpAddr>| SessionUp::Hello {
        node: NodeId::new("n1").unwrap(),
        epoch: AgentEpoch(4),
        zone: Label::new("z1").unwrap(),
        addresses,
    };
    let register_at = |address: IpAddr| {
        let mut reg = registration("n1", "web");
        reg.address = address;
        Request::Register(reg)
    };
    let cat = catalog();
    let mut s = Sessions::new(rules_with(Vec::new()), ShardId(0), 10_000);
    // The certificate names 10.0.0.1: a Hello naming 10.0.0.2 is refused.
    s.connect(1, identity(Role::Agent, "n1"), vec![here]);
    let (_, step) = s.message(1, hello_at(vec![there]), 1);
    assert!(
        matches!(&step, Step::Refuse(r) if r.contains("which the certificate does not name")),
        "{step:?}"
    );
    // A Hello that names none: the certificate's addresses are the node's.
    s.connect(2, identity(Role::Agent, "n1"), vec![here]);
    assert!(matches!(
        s.message(2, hello_at(Vec::new()), 1).1,
        Step::Grant { .. }
    ));
    assert!(s.request(2, register_at(here), &cat, 2).is_ok());
    assert!(s.request(2, register_at(there), &cat, 2).is_err());
    // A certificate without IP SANs: the Hello's addresses are the node's.
    s.connect(3, identity(Role::Agent, "n1"), Vec::new());
    assert!(matches!(
        s.message(3, hello_at(vec![there]), 1).1,
        Step::Grant { .. }
    ));
    assert!(s.request(3, register_at(there), &cat, 2).is_ok());
    assert!(s.request(3, register_at(here), &cat, 2).is_err());
    // Too many addresses.
    s.connect(4, identity(Role::Agent, "n1"), Vec::new());
    let many: Vec<IpAddr> = (0..=MAX_DECLARED_ADDRESSES)
        .map(|i| IpAddr::V4(Ipv4Addr::new(10, 1, 0, i as u8)))
        .collect();
    assert!(matches!(
        s.message(4, hello_at(many), 1).1,
        Step::Refuse(r) if r.contains("at most")
    ));
}

/// Issue 38, item 2: a node's zone is the arbiter's to bind, not its
/// Hello's to claim, and its weight is capped by the same entry.
#[test]
fn a_bound_zone_refuses_a_hello_that_claims_another_and_caps_the_weight() {
    let entry = |nodes: &[&str], zone: &str, max_weight| rollcall_config::NodeZone {
        nodes: nodes
            .iter()
            .map(|n| rollcall_config::NodePattern::try_from((*n).to_owned()).unwrap())
            .collect(),
        zone: zone.to_owned(),
        max_weight,
    };
    let config = ArbiterConfig {
        node_zones: vec![entry(&["n1"], "dmz", Some(50)), entry(&["n*"], "z1", None)],
        ..ArbiterConfig::default()
    };
    let rules = Rules::new(&config, Label::new("r1").unwrap());
    let mut s = Sessions::new(rules.clone(), ShardId(0), 10_000);
    // n1 is bound to dmz (the first entry that names it): a Hello for z1
    // is refused naming the binding.
    s.connect(1, identity(Role::Agent, "n1"), Vec::new());
    let (_, step) = s.message(1, hello("n1"), 1);
    assert!(
        matches!(&step, Step::Refuse(r) if r.contains("is in zone dmz by the arbiter's [[node_zones]]") && r.contains("declares zone z1")),
        "{step:?}"
    );
    assert!(s.held(1).is_none());
    // n2 is bound to z1, which it declares.
    s.connect(2, identity(Role::Agent, "n2"), Vec::new());
    assert!(matches!(s.message(2, hello("n2"), 1).1, Step::Grant { .. }));
    // A node no entry names is where it says, unless zones are "bound".
    let mut free = ArbiterConfig {
        node_zones: vec![entry(&["edge-*"], "dmz", None)],
        ..ArbiterConfig::default()
    };
    let node = NodeId::new("core-1").unwrap();
    let z1 = Label::new("z1").unwrap();
    assert!(Rules::new(&free, Label::new("r1").unwrap())
        .may_declare_zone(&node, &z1)
        .is_ok());
    free.registration.zones = rollcall_config::ZoneRule::Bound;
    let e = Rules::new(&free, Label::new("r1").unwrap())
        .may_declare_zone(&node, &z1)
        .unwrap_err();
    assert!(e.contains("named by no [[node_zones]] entry"), "{e}");
    // The weight cap of n1's entry.
    let cat = catalog();
    let mut heavy = registration("n1", "api");
    heavy.weight = Weight::new(51).unwrap();
    let (kind, message) = refusal(rules.authorize(
        &identity(Role::Agent, "n1"),
        None,
        &LOOPBACK,
        Request::Register(heavy.clone()),
        &cat,
    ));
    assert_eq!(kind, RejectKind::Forbidden);
    assert!(
        message.contains("above node n1's max_weight 50"),
        "{message}"
    );
    heavy.weight = Weight::new(50).unwrap();
    assert!(rules
        .authorize(
            &identity(Role::Agent, "n1"),
            None,
            &LOOPBACK,
            Request::Register(heavy),
            &cat,
        )
        .is_ok());
}
