use std::collections::BTreeSet;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::SeedableRng;
use rollcall_leases::{
    AgentEpoch, EndpointRecord, Generation, LeaseId, Liveness, NodeId, Principal, PrincipalName,
    Reason, Revision, Role, State, Version, Weight,
};

use super::*;
use crate::endpoints::{Mode, Selection};
use crate::view::Answer;

fn name(s: &str) -> Name {
    Name::from_ascii(s).unwrap().to_lowercase()
}

fn key(namespace: &str, service: &str, port: &str) -> ServiceKey {
    ServiceKey::new(namespace, service, port).unwrap()
}

fn record(id: &str, address: IpAddr, zone: &str, weight: u32) -> Arc<EndpointRecord> {
    Arc::new(EndpointRecord {
        instance_id: InstanceId::new(id).unwrap(),
        generation: Generation(1),
        node_id: NodeId::new("n1").unwrap(),
        epoch: AgentEpoch(1),
        lease: LeaseId(1),
        address,
        port: 8000,
        region: Label::new("r1").unwrap(),
        zone: Label::new(zone).unwrap(),
        version: Version::new("v1").unwrap(),
        weight: Weight::new(weight).unwrap(),
        labels: Vec::new(),
        state: State::Ready,
        reason: Reason::new("t").unwrap(),
        origin: Principal {
            role: Role::Agent,
            name: PrincipalName::new("n1").unwrap(),
        },
        liveness: Liveness::Unknown,
        revision: Revision(1),
        changed_at_ms: 0,
    })
}

fn serve(service: &ServiceKey, records: &[Arc<EndpointRecord>]) -> Lookup {
    let candidates = records
        .iter()
        .map(|r| Candidate {
            record: r.clone(),
            weight: f64::from(r.weight.get()),
        })
        .collect();
    Lookup::Serve(Answer {
        service: service.clone(),
        revision: Revision(1),
        stale: false,
        age_ms: 0,
        selection: Arc::new(Selection {
            mode: Mode::Normal,
            candidates,
        }),
        records: records.to_vec().into(),
        leaving: Arc::default(),
        degraded: None,
    })
}

fn ask(query: &str, qtype: RecordType, lookup: Lookup) -> Reply {
    let owner = Name::from_ascii(query).unwrap();
    let named = classify(&owner.to_lowercase());
    reply(
        &named,
        &owner,
        qtype,
        |_| lookup,
        |_| None,
        &Label::new("z1").unwrap(),
        1,
        &mut StdRng::seed_from_u64(7),
    )
}

fn v4(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

#[test]
fn names_are_read_case_insensitively_and_validated() {
    let web = key("default", "web", "default");
    assert_eq!(
        classify(&name("Web.Default.SVC.rollcall.")),
        Named::Addresses(web.clone())
    );
    assert_eq!(
        classify(&name("_grpc._TCP.web.default.svc.rollcall.")),
        Named::Srv(key("default", "web", "grpc"))
    );
    assert_eq!(
        classify(&name("web-1.default.web.default.svc.rollcall.")),
        Named::Target(web.clone(), "web-1".into())
    );
    assert_eq!(
        classify(&name("default.web.default.svc.rollcall.")),
        Named::Targets(web)
    );
    for interior in [
        "svc.rollcall.",
        "default.svc.rollcall.",
        "_tcp.web.default.svc.rollcall.",
    ] {
        assert_eq!(classify(&name(interior)), Named::Interior, "{interior}");
    }
    for outside in ["example.com.", "rollcall.", "svc.rollcall.example.", "."] {
        assert_eq!(classify(&name(outside)), Named::Outside, "{outside}");
    }
    for invalid in [
        "we_b.default.svc.rollcall.",
        "_web.default.svc.rollcall.",
        "grpc._tcp.web.default.svc.rollcall.",
        "_._tcp.web.default.svc.rollcall.",
        "a.b.c.d.e.svc.rollcall.",
    ] {
        assert_eq!(classify(&name(invalid)), Named::Invalid, "{invalid}");
    }
}

#[test]
fn instance_labels_are_dns_labels_and_keep_distinct_ids_apart() {
    assert_eq!(instance_label(&InstanceId::new("web-1").unwrap()), "web-1");
    let odd = ["Web-1", "web_1", "web.1", "web:1", &"x".repeat(128), "__"];
    let labels: BTreeSet<String> = odd
        .iter()
        .map(|id| instance_label(&InstanceId::new(id).unwrap()))
        .collect();
    assert_eq!(labels.len(), odd.len(), "{labels:?}");
    for label in &labels {
        assert!(Label::new(label).is_ok(), "{label}");
    }
}

#[test]
fn addresses_put_the_own_zone_first_and_split_by_family() {
    let web = key("default", "web", "default");
    let records = vec![
        record("a", v4(2), "z2", 100),
        record("b", v4(3), "z1", 100),
        record("c", v4(4), "z2", 100),
        record("d", v4(5), "z1", 100),
        record("e", IpAddr::V6(Ipv6Addr::LOCALHOST), "z1", 100),
    ];
    for seed in 0..20 {
        let owner = Name::from_ascii("web.default.svc.rollcall.").unwrap();
        let named = classify(&owner.to_lowercase());
        let out = reply(
            &named,
            &owner,
            RecordType::A,
            |_| serve(&web, &records),
            |_| None,
            &Label::new("z1").unwrap(),
            1,
            &mut StdRng::seed_from_u64(seed),
        );
        let ips: Vec<IpAddr> = out
            .answers
            .iter()
            .filter_map(|r| r.data.ip_addr())
            .collect();
        assert_eq!(ips.len(), 4);
        let near: BTreeSet<IpAddr> = ips[..2].iter().copied().collect();
        assert_eq!(near, BTreeSet::from([v4(3), v4(5)]), "seed {seed}: {ips:?}");
        assert!(out.answers.iter().all(|r| r.ttl == 1 && r.name == owner));
    }
    let out = ask(
        "web.default.svc.rollcall.",
        RecordType::AAAA,
        serve(&web, &records),
    );
    assert_eq!(
        out.answers
            .iter()
            .filter_map(|r| r.data.ip_addr())
            .collect::<Vec<_>>(),
        vec![IpAddr::V6(Ipv6Addr::LOCALHOST)]
    );
}

#[test]
fn srv_priorities_follow_zones_and_targets_resolve() {
    let grpc = key("default", "web", "grpc");
    let records = vec![
        record("Web_1", v4(2), "z2", 300),
        record("web-2", v4(3), "z1", Weight::MAX),
    ];
    let out = ask(
        "_grpc._tcp.web.default.svc.rollcall.",
        RecordType::SRV,
        serve(&grpc, &records),
    );
    assert_eq!(out.rcode, ResponseCode::NoError);
    let srvs: Vec<&SRV> = out
        .answers
        .iter()
        .map(|r| match &r.data {
            RData::SRV(srv) => srv,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(srvs.len(), 2);
    assert_eq!(
        (srvs[0].priority, srvs[0].weight, srvs[0].port),
        (0, 10_000, 8000)
    );
    assert_eq!(srvs[0].target, name("web-2.grpc.web.default.svc.rollcall."));
    assert_eq!((srvs[1].priority, srvs[1].weight), (1, 300));
    let odd = instance_label(&InstanceId::new("Web_1").unwrap());
    assert_eq!(
        srvs[1].target,
        name(&format!("{odd}.grpc.web.default.svc.rollcall."))
    );
    assert_eq!(out.additionals.len(), 2);
    assert!(out
        .additionals
        .iter()
        .any(|r| r.name == srvs[1].target && r.data.ip_addr() == Some(v4(2))));

    let target = format!("{odd}.grpc.web.default.svc.rollcall.");
    let out = ask(&target, RecordType::A, serve(&grpc, &records));
    assert_eq!(
        out.answers
            .iter()
            .filter_map(|r| r.data.ip_addr())
            .collect::<Vec<_>>(),
        vec![v4(2)]
    );
    let out = ask(
        "gone.grpc.web.default.svc.rollcall.",
        RecordType::A,
        serve(&grpc, &records),
    );
    assert_eq!(
        (out.rcode, out.answers.len(), out.authorities.len()),
        (ResponseCode::NoError, 0, 1)
    );
}

fn ask_failover(query: &str, qtype: RecordType, lookup: Lookup) -> Reply {
    let owner = Name::from_ascii(query).unwrap();
    let named = classify(&owner.to_lowercase());
    let failover = Failover {
        region: Label::new("r2").unwrap(),
        ingress: vec![
            Ingress::new("127.0.0.9:7443").unwrap(),
            Ingress::new("edge.r2.example:443").unwrap(),
        ],
    };
    reply(
        &named,
        &owner,
        qtype,
        |_| lookup,
        |_| Some(failover),
        &Label::new("z1").unwrap(),
        1,
        &mut StdRng::seed_from_u64(7),
    )
}

fn region_txt(reply: &Reply) -> Vec<String> {
    reply
        .additionals
        .iter()
        .filter_map(|r| match &r.data {
            RData::TXT(t) => Some(t.to_string()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_service_with_no_endpoint_here_answers_with_its_failover_region() {
    let web = key("default", "web", "default");
    let live = [record("w1", v4(1), "z1", 1)];
    // With a local candidate the failover is never asked.
    let local = ask_failover(
        "web.default.svc.rollcall.",
        RecordType::A,
        serve(&web, &live),
    );
    assert_eq!(local.answers.len(), 1);
    assert!(region_txt(&local).is_empty());

    // Only doubtful candidates (protection holds an UNHEALTHY one): the
    // failover comes first; without one they are answered.
    let mut doubted = (*live[0]).clone();
    doubted.state = State::Unhealthy;
    let protected = serve(&web, &[Arc::new(doubted)]);
    let moved = ask_failover(
        "web.default.svc.rollcall.",
        RecordType::A,
        protected.clone(),
    );
    assert_eq!(region_txt(&moved), vec!["rollcall-region=r2".to_owned()]);
    let owner = Name::from_ascii("web.default.svc.rollcall.").unwrap();
    let kept = reply(
        &classify(&owner.to_lowercase()),
        &owner,
        RecordType::A,
        |_| protected,
        |_| None,
        &Label::new("z1").unwrap(),
        1,
        &mut StdRng::seed_from_u64(7),
    );
    assert_eq!(kept.answers.len(), 1);
    assert_eq!(kept.answers[0].data.ip_addr(), Some(v4(1)));

    let a = ask_failover("web.default.svc.rollcall.", RecordType::A, serve(&web, &[]));
    assert_eq!(a.rcode, ResponseCode::NoError);
    assert_eq!(a.answers.len(), 1, "only the literal IP has an A record");
    assert_eq!(a.answers[0].data.to_string(), "127.0.0.9");
    assert_eq!(region_txt(&a), vec!["rollcall-region=r2".to_owned()]);

    let srv = ask_failover(
        "_default._tcp.web.default.svc.rollcall.",
        RecordType::SRV,
        Lookup::Unknown,
    );
    let targets: Vec<String> = srv.answers.iter().map(|r| r.data.to_string()).collect();
    assert_eq!(
        targets,
        vec![
            "0 1 7443 ingress-r2-0.default.web.default.svc.rollcall.".to_owned(),
            "0 1 443 edge.r2.example.".to_owned(),
        ]
    );
    let target = ask_failover(
        "ingress-r2-0.default.web.default.svc.rollcall.",
        RecordType::A,
        serve(&web, &[]),
    );
    assert_eq!(target.answers.len(), 1);
}

/// Issue 37, item 6: a zone transfer is refused, not answered empty.
#[test]
fn zone_transfers_are_refused() {
    let web = key("default", "web", "default");
    for qtype in [RecordType::AXFR, RecordType::IXFR] {
        for q in ["svc.rollcall.", "web.default.svc.rollcall."] {
            let out = ask(q, qtype, serve(&web, &[]));
            assert_eq!(out.rcode, ResponseCode::Refused, "{qtype} {q}");
            assert!(out.answers.is_empty());
        }
    }
}

#[test]
fn response_codes_follow_what_the_view_knows() {
    let web = key("default", "web", "default");
    let a = RecordType::A;
    let q = "web.default.svc.rollcall.";
    assert_eq!(ask(q, a, Lookup::Unknown).rcode, ResponseCode::NXDomain);
    assert_eq!(
        ask(q, a, Lookup::CannotKnow("no arbiter".into())).rcode,
        ResponseCode::ServFail
    );
    assert_eq!(
        ask(q, a, Lookup::Refused("too old".into())).rcode,
        ResponseCode::ServFail
    );
    let empty = ask(q, a, serve(&web, &[]));
    assert_eq!(
        (empty.rcode, empty.answers.len(), empty.authorities.len()),
        (ResponseCode::NoError, 0, 1)
    );
    let only_v4 = ask(
        q,
        RecordType::AAAA,
        serve(&web, &[record("a", v4(2), "z1", 100)]),
    );
    assert_eq!(
        (only_v4.rcode, only_v4.answers.len()),
        (ResponseCode::NoError, 0)
    );
    let never = |_: &ServiceKey| -> Lookup { panic!("looked up a name that names no service") };
    let zone = Label::new("z1").unwrap();
    let mut rng = StdRng::seed_from_u64(1);
    let owner = name("example.com.");
    assert_eq!(
        reply(
            &classify(&owner),
            &owner,
            a,
            never,
            |_| None,
            &zone,
            1,
            &mut rng
        )
        .rcode,
        ResponseCode::Refused
    );
    let owner = name("we_b.default.svc.rollcall.");
    assert_eq!(
        reply(
            &classify(&owner),
            &owner,
            a,
            never,
            |_| None,
            &zone,
            1,
            &mut rng
        )
        .rcode,
        ResponseCode::NXDomain
    );
    let owner = name("default.svc.rollcall.");
    assert_eq!(
        reply(
            &classify(&owner),
            &owner,
            a,
            never,
            |_| None,
            &zone,
            1,
            &mut rng
        )
        .rcode,
        ResponseCode::NoError
    );
}
