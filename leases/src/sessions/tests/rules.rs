//! The rules' own tests: who may hold which lease, write which instance,
//! register which service at which address, watch which service.

use super::*;

pub(super) fn rules_with(registration_rules: Vec<RegistrationRule>) -> Rules {
    let config = ArbiterConfig {
        registration_rules,
        ..ArbiterConfig::default()
    };
    Rules::new(&config, Label::new("r1").unwrap())
}

pub(super) fn rule(
    nodes: &[&str],
    zones: &[&str],
    services: &[&str],
    any_address: bool,
) -> RegistrationRule {
    RegistrationRule {
        nodes: nodes
            .iter()
            .map(|n| rollcall_config::NodePattern::try_from((*n).to_owned()).unwrap())
            .collect(),
        zones: zones.iter().map(|z| (*z).to_owned()).collect(),
        services: services
            .iter()
            .map(|p| ServicePattern::try_from((*p).to_owned()).unwrap())
            .collect(),
        any_address,
    }
}

#[test]
fn an_instance_id_does_not_move_between_services() {
    let r = rules();
    let cat = catalog();
    let mut moved = registration("n1", "web");
    moved.service = svc("api");
    let (kind, message) = refusal(r.authorize(
        &identity(Role::Agent, "n1"),
        None,
        &LOOPBACK,
        Request::Register(moved),
        &cat,
    ));
    assert_eq!(kind, RejectKind::Invalid);
    assert!(message.contains("deregister it first"), "{message}");
    // The same service again is a new generation, as before.
    assert!(r
        .authorize(
            &identity(Role::Agent, "n1"),
            None,
            &LOOPBACK,
            Request::Register(registration("n1", "web")),
            &cat,
        )
        .is_ok());
}

#[test]
fn an_instance_id_belongs_to_the_node_holding_it_until_it_expires() {
    let r = rules();
    let mut cat = catalog();
    let taken = |cat: &Catalog| {
        r.authorize(
            &identity(Role::Agent, "n3"),
            None,
            &LOOPBACK,
            Request::Register(registration("n3", "web")),
            cat,
        )
    };
    let (kind, message) = refusal(taken(&cat));
    assert_eq!(kind, RejectKind::Forbidden);
    assert!(
        message.contains("instance web-1 is held by node n1 (READY, generation 1)")
            && message.contains("rollcall instance free web-1"),
        "{message}"
    );
    // A controller is held to the same rule.
    let mut r = rules();
    r.controllers = vec![rollcall_config::ControllerGrant {
        name: "deployer".into(),
        services: vec!["default/web/*".to_owned().try_into().unwrap()],
    }];
    let (kind, _) = refusal(r.authorize(
        &identity(Role::Controller, "deployer"),
        None,
        &LOOPBACK,
        Request::Register(registration("n3", "web")),
        &cat,
    ));
    assert_eq!(kind, RejectKind::Forbidden);
    // Once n1's lease ends and the record is EXPIRED, n3 may take it.
    cat.apply(&Envelope {
        at_ms: 20_000,
        actor: identity(Role::Operator, "t").principal,
        command: Command::RevokeLease {
            node: NodeId::new("n1").unwrap(),
            epoch: AgentEpoch(1),
        },
    })
    .unwrap();
    assert_eq!(
        cat.instance(&InstanceId::new("web-1").unwrap())
            .unwrap()
            .state,
        State::Expired
    );
    assert!(taken(&cat).is_ok());
}

#[test]
fn a_lease_is_only_for_the_agent_of_that_node_in_this_region() {
    let r = rules();
    let n1 = NodeId::new("n1").unwrap();
    assert!(r.may_hold_lease(&identity(Role::Agent, "n1"), &n1).is_ok());
    let e = r
        .may_hold_lease(&identity(Role::Agent, "n2"), &n1)
        .unwrap_err();
    assert!(e.contains("only its own node's lease"), "{e}");
    let e = r
        .may_hold_lease(&identity(Role::Controller, "n1"), &n1)
        .unwrap_err();
    assert!(e.contains("cannot hold a node lease"), "{e}");
    let other = Identity::new(
        Label::new("r2").unwrap(),
        Role::Agent,
        PrincipalName::new("n1").unwrap(),
    );
    let e = r.may_hold_lease(&other, &n1).unwrap_err();
    assert!(e.contains("this arbiter serves region r1"), "{e}");
}

#[test]
fn watch_rules_bind_only_the_nodes_they_name() {
    let r = rules();
    let (n1, n2) = (NodeId::new("n1").unwrap(), NodeId::new("n2").unwrap());
    assert!(r.may_watch(&n1, &svc("db")).is_ok());
    assert!(r.may_watch(&n2, &svc("web")).is_ok());
    let e = r.may_watch(&n2, &svc("db")).unwrap_err();
    assert!(e.contains("watch_rules"), "{e}");
}

#[test]
fn every_write_refusal_names_its_reason_and_changes_nothing() {
    let r = rules();
    let cat = catalog();
    let session = (NodeId::new("n1").unwrap(), AgentEpoch(1));
    // Another node's instance.
    let (kind, message) = refusal(r.authorize(
        &identity(Role::Agent, "n1"),
        Some(&session),
        &LOOPBACK,
        Request::Register(registration("n2", "web")),
        &cat,
    ));
    assert_eq!(kind, RejectKind::Forbidden);
    assert!(
        message.contains("only instances on its own node"),
        "{message}"
    );
    // A controller outside its grant, and inside it.
    let (kind, message) = refusal(r.authorize(
        &identity(Role::Controller, "deployer"),
        None,
        &LOOPBACK,
        Request::Register(registration("n1", "web")),
        &cat,
    ));
    assert_eq!(kind, RejectKind::Forbidden);
    assert!(message.contains("no grant for service"), "{message}");
    assert!(matches!(
        r.authorize(
            &identity(Role::Controller, "deployer"),
            None,
            &LOOPBACK,
            Request::Register(registration("n1", "api")),
            &cat
        ),
        Ok(Authorized::Command(Command::Register(_)))
    ));
    // An operator or bridge certificate writes no instances.
    let (kind, _) = refusal(r.authorize(
        &identity(Role::Bridge, "b"),
        None,
        &LOOPBACK,
        Request::Register(registration("n1", "web")),
        &cat,
    ));
    assert_eq!(kind, RejectKind::Forbidden);
    // An instance that is not registered.
    let (kind, _) = refusal(r.authorize(
        &identity(Role::Agent, "n1"),
        Some(&session),
        &LOOPBACK,
        Request::Deregister {
            instance_id: InstanceId::new("ghost").unwrap(),
            generation: Generation(1),
        },
        &cat,
    ));
    assert_eq!(kind, RejectKind::NotFound);
    // Another node's agent may not touch web-1.
    let n2 = (NodeId::new("n2").unwrap(), AgentEpoch(1));
    let (kind, _) = refusal(r.authorize(
        &identity(Role::Agent, "n2"),
        Some(&n2),
        &LOOPBACK,
        Request::Transition {
            instance_id: InstanceId::new("web-1").unwrap(),
            generation: Generation(1),
            to: State::Draining,
            reason: Reason::new("x").unwrap(),
        },
        &cat,
    ));
    assert_eq!(kind, RejectKind::Forbidden);
    // Session-only requests without a session.
    for request in [
        Request::NodeInstances,
        Request::Leave {
            epoch: AgentEpoch(1),
        },
        Request::ReportDown {
            node: NodeId::new("n2").unwrap(),
            epoch: AgentEpoch(1),
        },
    ] {
        let (kind, message) =
            refusal(r.authorize(&identity(Role::Agent, "n1"), None, &LOOPBACK, request, &cat));
        assert_eq!(kind, RejectKind::Forbidden);
        assert!(
            message.contains("only an agent with a session"),
            "{message}"
        );
    }
    // A certificate of another region.
    let other = Identity::new(
        Label::new("r2").unwrap(),
        Role::Agent,
        PrincipalName::new("n1").unwrap(),
    );
    let (kind, _) = refusal(r.authorize(
        &other,
        Some(&session),
        &LOOPBACK,
        Request::NodeInstances,
        &cat,
    ));
    assert_eq!(kind, RejectKind::Forbidden);
}

#[test]
fn a_session_may_list_report_and_wait() {
    let r = rules();
    let cat = catalog();
    let session = (NodeId::new("n1").unwrap(), AgentEpoch(1));
    let me = identity(Role::Agent, "n1");
    assert_eq!(
        r.authorize(&me, Some(&session), &LOOPBACK, Request::NodeInstances, &cat),
        Ok(Authorized::List(NodeId::new("n1").unwrap()))
    );
    assert_eq!(
        r.authorize(
            &me,
            Some(&session),
            &LOOPBACK,
            Request::AwaitPropagation {
                service: svc("web"),
                revision: Revision(3),
                timeout_ms: 120_000,
            },
            &cat
        ),
        Ok(Authorized::Await {
            service: svc("web"),
            revision: Revision(3),
            timeout_ms: 30_000,
        })
    );
}

#[test]
fn registration_rules_bind_the_nodes_and_zones_they_name() {
    let r = rules_with(vec![
        rule(&["edge-*"], &[], &["default/web/*"], false),
        rule(&[], &["z1"], &["default/api/*"], false),
    ]);
    let at = IpAddr::V4(Ipv4Addr::LOCALHOST);
    // n1's lease is in z1: it may register only api.
    let n1 = NodeId::new("n1").unwrap();
    let e = r
        .may_register(&n1, Some("z1"), &svc("web"), at, &LOOPBACK)
        .unwrap_err();
    assert!(
        e.contains("node n1 may not register default/web/default") && e.contains("default/api/*"),
        "{e}"
    );
    assert!(r
        .may_register(&n1, Some("z1"), &svc("api"), at, &LOOPBACK)
        .is_ok());
    // edge-3 is named by prefix.
    let edge = NodeId::new("edge-3").unwrap();
    assert!(r
        .may_register(&edge, Some("z2"), &svc("web"), at, &LOOPBACK)
        .is_ok());
    assert!(r
        .may_register(&edge, Some("z2"), &svc("db"), at, &LOOPBACK)
        .is_err());
    // A node no rule applies to registers every service.
    let other = NodeId::new("db-1").unwrap();
    assert!(r
        .may_register(&other, Some("z2"), &svc("db"), at, &LOOPBACK)
        .is_ok());
    // Through authorize, with the zone of the node's lease in the
    // catalog: refused as forbidden, so nothing is proposed.
    let cat = catalog();
    let session = (n1.clone(), AgentEpoch(1));
    let (kind, message) = refusal(r.authorize(
        &identity(Role::Agent, "n1"),
        Some(&session),
        &LOOPBACK,
        Request::Register(registration("n1", "web")),
        &cat,
    ));
    assert_eq!(kind, RejectKind::Forbidden);
    assert!(message.contains("registration_rules"), "{message}");
    // Controllers keep their grants: the rules and the address check
    // bind agents only.
    let granted = Rules::new(
        &ArbiterConfig {
            controllers: vec![ControllerGrant {
                name: "deployer".into(),
                services: vec![ServicePattern::try_from("default/web/*".to_owned()).unwrap()],
            }],
            registration_rules: vec![rule(&[], &["z1"], &["default/api/*"], false)],
            ..ArbiterConfig::default()
        },
        Label::new("r1").unwrap(),
    );
    assert!(granted
        .authorize(
            &identity(Role::Controller, "deployer"),
            None,
            &[],
            Request::Register(registration("n1", "web")),
            &cat,
        )
        .is_ok());
}

#[test]
fn an_agent_registers_only_addresses_its_node_declared() {
    let r = rules_with(Vec::new());
    let n1 = NodeId::new("n1").unwrap();
    let here = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
    let there = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
    assert!(r
        .may_register(&n1, None, &svc("web"), here, &[here])
        .is_ok());
    let e = r
        .may_register(&n1, None, &svc("web"), there, &[here])
        .unwrap_err();
    assert!(
        e.contains("address 10.0.0.2 is not one of node n1's declared addresses (10.0.0.1)"),
        "{e}"
    );
    let e = r
        .may_register(&n1, None, &svc("web"), there, &[])
        .unwrap_err();
    assert!(e.contains("declared none"), "{e}");
    // A rule's any_address, or registration.addresses = "any".
    let lenient = rules_with(vec![rule(&["n1"], &[], &["default/web/*"], true)]);
    assert!(lenient
        .may_register(&n1, None, &svc("web"), there, &[here])
        .is_ok());
    let mut config = ArbiterConfig::default();
    config.registration.addresses = AddressRule::Any;
    let any = Rules::new(&config, Label::new("r1").unwrap());
    assert!(any.may_register(&n1, None, &svc("web"), there, &[]).is_ok());
}
