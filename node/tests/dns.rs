//! The agent's DNS server (R8), asked by a real DNS client (hickory's
//! resolver, one name server, no search domains, no cache) against a real
//! arbiter and agent on loopback.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use common::{eventually, Cluster, Http};
use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolveHosts, ResolverConfig};
use hickory_resolver::lookup::Lookup;
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::net::{DnsError, NetError};
use hickory_resolver::proto::op::ResponseCode;
use hickory_resolver::proto::rr::{Name, RData, RecordType};
use hickory_resolver::{Resolver, TokioResolver};
use rollcall_node::dns::{self, DnsHandle};
use rollcall_node::process::AgentHandle;

/// A resolver that asks only `server`, over TCP or UDP, and caches nothing.
fn resolver(server: SocketAddr, tcp: bool) -> TokioResolver {
    let mut connection = if tcp {
        ConnectionConfig::tcp()
    } else {
        ConnectionConfig::udp()
    };
    connection.port = server.port();
    let name_server = NameServerConfig::new(server.ip(), true, vec![connection]);
    let config = ResolverConfig::from_parts(None, Vec::new(), vec![name_server]);
    let mut builder = Resolver::builder_with_config(config, TokioRuntimeProvider::default());
    let options = builder.options_mut();
    options.cache_size = 0;
    options.use_hosts_file = ResolveHosts::Never;
    builder.build().unwrap()
}

/// The answer to one question, or the response code of an answer without
/// records.
async fn ask(
    resolver: &TokioResolver,
    name: &str,
    kind: RecordType,
) -> Result<Lookup, ResponseCode> {
    // `from_ascii`: the client's own parsing (IDNA) refuses some labels
    // the server must still answer.
    let query = Name::from_ascii(name).unwrap();
    match resolver.lookup(query, kind).await {
        Ok(lookup) => Ok(lookup),
        Err(NetError::Dns(DnsError::NoRecordsFound(none))) => Err(none.response_code),
        Err(NetError::Dns(DnsError::ResponseCode(code))) => Err(code),
        Err(e) => panic!("{name} {kind}: no DNS answer: {e}"),
    }
}

/// The addresses of an A/AAAA answer, each with its TTL.
fn addresses(lookup: &Lookup) -> BTreeSet<(IpAddr, u32)> {
    lookup
        .answers()
        .iter()
        .filter_map(|r| r.data.ip_addr().map(|ip| (ip, r.ttl)))
        .collect()
}

fn v4(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

/// A connected agent and its DNS server on a random port, TTL 1 s.
async fn agent_with_dns(cluster: &Cluster) -> (AgentHandle, Http, DnsHandle) {
    agent_with_dns_config(cluster, cluster.agent_config("node-a")).await
}

/// [`agent_with_dns`] for an agent with `config`.
async fn agent_with_dns_config(
    cluster: &Cluster,
    mut config: rollcall_config::AgentConfig,
) -> (AgentHandle, Http, DnsHandle) {
    // The tests register instances at 127.0.0.1–4: the node declares them
    // (the arbiter accepts only a node's declared addresses by default).
    if config.advertise_addresses.is_empty() {
        config.advertise_addresses = (1..=4).map(v4).collect();
    }
    let handle = cluster.agent_with(config).await;
    let http = Http::of(&handle);
    http.wait_connected().await;
    let sockets = dns::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let dns = dns::start(handle.agent.views().clone(), sockets, 1);
    (handle, http, dns)
}

/// Waits until the agent's view lists exactly `want` for `service`,
/// confirmed by the arbiter.
async fn wait_ready(http: &Http, service: &str, want: &[&str]) {
    let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
    eventually(&format!("{service} resolves to {want:?}"), || async {
        let (status, body) = http.resolve(service).await;
        let ids: BTreeSet<String> = body["endpoints"]
            .as_array()?
            .iter()
            .filter_map(|e| e["instance_id"].as_str().map(str::to_owned))
            .collect();
        (status == 200 && body["stale"] == false && ids == want).then_some(())
    })
    .await;
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn a_srv_and_tcp_answers_list_the_ready_endpoints() {
    let cluster = Cluster::start().await;
    let (handle, http, dns) = agent_with_dns(&cluster).await;
    let registered = [
        ("web-1", 2, 8081, 100),
        ("web-2", 3, 8082, 200),
        ("web-3", 4, 8083, 300),
    ];
    for (id, last, port, weight) in registered {
        let (status, body) = http
            .register_at("web", id, &v4(last).to_string(), port, weight)
            .await;
        assert_eq!(status, 200, "{body}");
    }
    wait_ready(&http, "web", &["web-1", "web-2", "web-3"]).await;
    let udp = resolver(dns.local_addr(), false);

    let lookup = ask(&udp, "web.default.svc.rollcall.", RecordType::A)
        .await
        .unwrap();
    assert_eq!(
        addresses(&lookup),
        BTreeSet::from([(v4(2), 1), (v4(3), 1), (v4(4), 1)])
    );
    assert_eq!(
        ask(&udp, "web.default.svc.rollcall.", RecordType::AAAA)
            .await
            .unwrap_err(),
        ResponseCode::NoError,
        "IPv4 endpoints only: no AAAA, but the name exists"
    );

    let srv = ask(
        &udp,
        "_default._tcp.WEB.default.svc.rollcall.",
        RecordType::SRV,
    )
    .await
    .unwrap();
    let mut by_port = BTreeMap::new();
    for record in srv.answers() {
        let RData::SRV(srv) = &record.data else {
            panic!("not an SRV answer: {record}");
        };
        assert_eq!(record.ttl, 1);
        by_port.insert(srv.port, (srv.priority, srv.weight, srv.target.clone()));
    }
    let ports: Vec<(u16, (u16, u16))> = by_port
        .iter()
        .map(|(port, (priority, weight, _))| (*port, (*priority, *weight)))
        .collect();
    assert_eq!(
        ports,
        vec![(8081, (0, 100)), (8082, (0, 200)), (8083, (0, 300))],
        "one SRV per endpoint, same zone, its registered port and weight"
    );
    for (port, last) in [(8081, 2), (8082, 3), (8083, 4)] {
        let target = &by_port[&port].2;
        let glue: Vec<IpAddr> = srv
            .additionals()
            .iter()
            .filter(|r| &r.name == target)
            .filter_map(|r| r.data.ip_addr())
            .collect();
        assert_eq!(glue, vec![v4(last)], "the A record of {target}");
        let direct = ask(&udp, &target.to_ascii(), RecordType::A).await.unwrap();
        assert_eq!(addresses(&direct), BTreeSet::from([(v4(last), 1)]));
    }

    let tcp = resolver(dns.local_addr(), true);
    let lookup = ask(&tcp, "web.default.svc.rollcall.", RecordType::A)
        .await
        .unwrap();
    assert_eq!(
        addresses(&lookup),
        BTreeSet::from([(v4(2), 1), (v4(3), 1), (v4(4), 1)])
    );

    let (status, body) = http.drain("web-2", "?generation=1").await;
    assert_eq!(status, 200, "{body}");
    eventually("the drained endpoint leaves the A answer", || async {
        let lookup = ask(&udp, "web.default.svc.rollcall.", RecordType::A)
            .await
            .ok()?;
        (addresses(&lookup) == BTreeSet::from([(v4(2), 1), (v4(4), 1)])).then_some(())
    })
    .await;
    assert!(
        handle
            .agent
            .metrics()
            .render()
            .contains(r#"rollcall_agent_dns_answers_total{rcode="noerror"}"#),
        "answers are counted"
    );
    dns.shutdown().await;
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn negative_answers_say_only_what_the_arbiter_said() {
    let cluster = Cluster::start().await;
    let (handle, http, dns) = agent_with_dns(&cluster).await;
    let udp = resolver(dns.local_addr(), false);

    // Known, but its only instance was drained: the name exists, empty.
    let (status, body) = http
        .register_at("api", "api-1", "127.0.0.2", 9000, 100)
        .await;
    assert_eq!(status, 200, "{body}");
    wait_ready(&http, "api", &["api-1"]).await;
    let (status, body) = http.drain("api-1", "?generation=1").await;
    assert_eq!(status, 200, "{body}");
    wait_ready(&http, "api", &[]).await;
    assert_eq!(
        ask(&udp, "api.default.svc.rollcall.", RecordType::A)
            .await
            .unwrap_err(),
        ResponseCode::NoError
    );

    // The arbiter says it does not exist: the only NXDOMAIN for a service.
    eventually("the agent learns that ghost does not exist", || async {
        (http.resolve("ghost").await.0 == 404).then_some(())
    })
    .await;
    assert_eq!(
        ask(&udp, "ghost.default.svc.rollcall.", RecordType::A)
            .await
            .unwrap_err(),
        ResponseCode::NXDomain
    );
    assert_eq!(
        ask(&udp, "no_such.default.svc.rollcall.", RecordType::A)
            .await
            .unwrap_err(),
        ResponseCode::NXDomain,
        "a name no service can have"
    );

    assert_eq!(
        ask(&udp, "example.com.", RecordType::A).await.unwrap_err(),
        ResponseCode::Refused
    );
    let metrics = handle.agent.metrics().render();
    for rcode in ["noerror", "nxdomain", "refused"] {
        assert!(
            metrics.contains(&format!(
                r#"rollcall_agent_dns_answers_total{{rcode="{rcode}"}}"#
            )),
            "{rcode} is counted:\n{metrics}"
        );
    }
    dns.shutdown().await;
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn servfail_when_the_agent_cannot_know() {
    let mut cluster = Cluster::start().await;
    let (_handle, http, dns) = agent_with_dns(&cluster).await;
    cluster.stop_arbiter().await;
    http.wait_disconnected().await;
    let udp = resolver(dns.local_addr(), false);
    assert_eq!(
        ask(&udp, "never.default.svc.rollcall.", RecordType::A)
            .await
            .unwrap_err(),
        ResponseCode::ServFail,
        "not followed and no arbiter: never a guessed NXDOMAIN"
    );
    dns.shutdown().await;
}

/// The first query of a service this agent does not follow yet waits for
/// the arbiter's answer (as the HTTP resolve does) instead of answering
/// SERVFAIL, which a caller sees as "Temporary failure in name
/// resolution": NXDOMAIN for a service that does not exist, the address
/// for one registered on another node. Queries run concurrently, so none
/// waits on another's first lookup.
#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn a_first_query_waits_for_the_arbiter_instead_of_servfail() {
    let cluster = Cluster::start().await;
    let (_handle, _http, dns) = agent_with_dns(&cluster).await;
    // A service registered through another node's agent: this agent has
    // never followed it.
    let mut config_b = cluster.agent_config("node-b");
    config_b.advertise_addresses = vec![v4(3)];
    let other = cluster.agent_with(config_b).await;
    let http_b = Http::of(&other);
    http_b.wait_connected().await;
    let (status, body) = http_b
        .register_at("pay", "pay-1", "127.0.0.3", 9000, 100)
        .await;
    assert_eq!(status, 200, "{body}");
    let udp = resolver(dns.local_addr(), false);
    let mut unknown = Vec::new();
    for n in 0..12 {
        let udp = udp.clone();
        unknown.push(tokio::spawn(async move {
            ask(
                &udp,
                &format!("nosuch-{n}.default.svc.rollcall."),
                RecordType::A,
            )
            .await
            .map(|_| ())
        }));
    }
    let known = ask(&udp, "pay.default.svc.rollcall.", RecordType::A)
        .await
        .expect("the first query of pay answers its address");
    assert_eq!(
        addresses(&known)
            .into_iter()
            .map(|(ip, _)| ip)
            .collect::<Vec<_>>(),
        vec![v4(3)]
    );
    for (n, answer) in unknown.into_iter().enumerate() {
        assert_eq!(
            answer.await.unwrap(),
            Err(ResponseCode::NXDomain),
            "the first query of nosuch-{n}"
        );
    }
    dns.shutdown().await;
    other.shutdown().await;
}

/// Issue 22, item 2: lookups of names that do not exist (anyone on the host
/// can send them, without a token) used to leave a subscription and metric
/// series per name until a restart (500 queries: 506 of each). Now an
/// unknown service is answered from memory for `unknown_ttl_ms` after its
/// last lookup, then forgotten; a service followed on demand that nobody
/// asks for goes after `follow_idle_ms`; metric labels are capped.
#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn lookups_of_unknown_names_leave_no_state_behind() {
    const NAMES: usize = 200;
    let cluster = Cluster::start().await;
    let mut config = cluster.agent_config("node-a");
    config.unknown_ttl_ms = 1_000;
    config.follow_idle_ms = 2_000;
    config.metrics_max_services = 20;
    let (handle, http, dns) = agent_with_dns_config(&cluster, config).await;
    let udp = resolver(dns.local_addr(), false);
    let (status, body) = http
        .register_at("web", "web-1", "127.0.0.2", 9000, 100)
        .await;
    assert_eq!(status, 200, "{body}");
    wait_ready(&http, "web", &["web-1"]).await;

    let followed = |status: serde_json::Value| -> BTreeSet<String> {
        status["subscriptions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["service"].as_str().unwrap().to_owned())
            .collect()
    };
    let mut answered = 0;
    for i in 0..NAMES {
        let name = format!("ghost-{i}.default.svc.rollcall.");
        if ask(&udp, &name, RecordType::A).await.unwrap_err() == ResponseCode::NXDomain {
            answered += 1;
        }
    }
    assert!(answered > NAMES / 2, "only {answered} NXDOMAIN answers");
    let metrics = handle.agent.metrics().render();
    let ghost_series = metrics.lines().filter(|l| l.contains("ghost-")).count();
    assert!(
        ghost_series <= 20,
        "per-service series are capped at metrics_max_services: {ghost_series}\n{metrics}"
    );
    // Unknown names are forgotten; the known service, looked up now and
    // then, stays.
    eventually("the unknown names are forgotten", || async {
        let _ = http.resolve("web").await;
        let now = followed(http.status().await);
        (now.iter().all(|s| !s.contains("ghost-")) && now.contains("default/web/default"))
            .then_some(())
    })
    .await;
    // The known service, no longer looked up, is dropped after
    // follow_idle_ms; asked again, it is followed again and answers.
    eventually("the idle service is no longer followed", || async {
        followed(http.status().await).is_empty().then_some(())
    })
    .await;
    wait_ready(&http, "web", &["web-1"]).await;
    assert_eq!(
        followed(http.status().await),
        BTreeSet::from(["default/web/default".to_owned()])
    );
    dns.shutdown().await;
}

/// Sends one raw datagram to `server` and decodes the answer; a response
/// that does not decode fails the test (what a resolver would do too).
async fn raw_udp(server: SocketAddr, query: &[u8]) -> hickory_resolver::proto::op::Message {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    socket.send_to(query, server).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let (n, _) = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        socket.recv_from(&mut buf),
    )
    .await
    .expect("an answer within 10 s")
    .unwrap();
    hickory_resolver::proto::op::Message::from_vec(&buf[..n])
        .unwrap_or_else(|e| panic!("the answer does not decode: {e}: {:02x?}", &buf[..n]))
}

/// Issue 20 (found by the `dns_query` fuzz target): hickory's response
/// builder copied the question bytes verbatim, compression pointers
/// included, so a question whose name points into the request's header
/// (whose flags the response changes) got an answer no client could
/// decode. Real datagrams over UDP, checked byte by byte.
#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn questions_with_compression_pointers_get_decodable_answers() {
    let cluster = Cluster::start().await;
    let (_handle, _http, dns) = agent_with_dns(&cluster).await;
    let server = dns.local_addr();

    // One question whose name is a pointer to offset 2 (the flags: 0x01 is
    // read as a one-byte label, then the root from offset 4). The response
    // sets QR, so the same pointer there would read 0x81, no label at all.
    let header = [0x12, 0x34, 0x01, 0x00, 0x00, 0x01, 0, 0, 0, 0, 0, 0];
    let mut query = header.to_vec();
    query.extend_from_slice(&[0xc0, 0x02, 0x00, 0x01, 0x00, 0x01]);
    let answer = raw_udp(server, &query).await;
    assert_eq!(answer.metadata.id, 0x1234);
    assert_eq!(
        answer.metadata.response_code,
        ResponseCode::Refused,
        "outside the zone"
    );
    let [question] = answer.queries.as_slice() else {
        panic!("one question echoed: {:?}", answer.queries);
    };
    assert_eq!(
        question.name().to_ascii(),
        "\\000.",
        "the name the request meant"
    );

    // Two questions, the second compressed against the first (legal DNS):
    // FORMERR, with no question echoed.
    let mut query = vec![0x43, 0x21, 0x01, 0x00, 0x00, 0x02, 0, 0, 0, 0, 0, 0];
    let name = Name::from_ascii("web.default.svc.rollcall.").unwrap();
    for label in name.iter() {
        query.push(label.len() as u8);
        query.extend_from_slice(label);
    }
    query.extend_from_slice(&[0, 0x00, 0x01, 0x00, 0x01]);
    query.extend_from_slice(&[0xc0, 0x0c, 0x00, 0x1c, 0x00, 0x01]);
    let answer = raw_udp(server, &query).await;
    assert_eq!(answer.metadata.id, 0x4321);
    assert_eq!(answer.metadata.response_code, ResponseCode::FormErr);
    assert!(answer.queries.is_empty(), "{:?}", answer.queries);
    assert!(answer.answers.is_empty());
    dns.shutdown().await;
}
