//! What the fuzz targets of the node agent's decoders assert (issue 20),
//! shared by the targets in `fuzz/fuzz_targets/` and by the stable replay
//! of the committed corpora in `node/tests/fuzz_corpus.rs`. Each check
//! takes bytes as they would arrive from outside (a file's contents once
//! `durable` verified its checksum, an HTTP body, a DNS datagram) and
//! panics only when a property fails:
//!
//! - nothing panics, whatever the bytes;
//! - what a file decoder accepts encodes, and decodes again to the same
//!   value and the same bytes;
//! - a cached view matches its digest;
//! - a registration body the API accepts survives the registrations file
//!   (what the agent persists reads back to the same registration);
//! - refused bodies get 400, 413 or 422;
//! - every DNS query hickory decodes gets one response that decodes, has
//!   the query's id and question, answers only the name asked, and uses
//!   the codes the module documents (REFUSED outside `svc.rollcall.`,
//!   NXDOMAIN only inside it).
//!
//! `seeds` builds valid inputs for the starting corpora.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex, OnceLock};

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RecordType};
use hickory_proto::serialize::binary::BinEncoder;
use hickory_server::net::runtime::TokioTime;
use hickory_server::net::xfer::Protocol;
use hickory_server::net::NetError;
use hickory_server::proto::rr::Record;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponse;
use rollcall_config::{ChecksConfig, DataPlaneConfig, ServicePolicy};
use rollcall_leases::{
    AgentEpoch, CatalogId, EndpointRecord, Generation, HeldPolicy, Ingress, InstanceId, Label,
    LeaseId, Liveness, NodeId, Policy, Principal, PrincipalName, Reason, RegionEntry,
    RegionsUpdate, Revision, Role, ServiceKey, ServiceSnapshot, ServiceView, ShardId, State,
    Version, Weight,
};
use rollcall_node::api::MAX_BODY_BYTES;
use rollcall_node::api_types::{parse_json, RegisterRequest};
use rollcall_node::cache;
use rollcall_node::dns::Handler;
use rollcall_node::metrics::AgentMetrics;
use rollcall_node::registrations::{Intent, LocalInstance, Registrations};
use rollcall_node::view::{Published, Status, ViewSettings, Views};

/// `cache_file`: the contents of a service cache file. What decodes is a
/// view that matches its digest, and it is stored and read back the same.
pub fn cache_file(data: &[u8]) {
    let Ok((view, catalog)) = cache::decode_service_file(data) else {
        return;
    };
    assert_eq!(
        view.digest(),
        rollcall_leases::Digest::of_records(view.records().map(|r| &**r)),
        "a cached view does not match its digest"
    );
    let bytes = cache::encode_service_file(&view, catalog);
    let again = cache::decode_service_file(&bytes)
        .unwrap_or_else(|e| panic!("a stored view does not read back: {e}"));
    assert_eq!(again, (view, catalog), "store → load changed the view");
    assert_eq!(cache::encode_service_file(&again.0, again.1), bytes);
}

/// `regions_file`: the contents of the regions file.
pub fn regions_file(data: &[u8]) {
    let Ok((update, at)) = cache::decode_regions_file(data) else {
        return;
    };
    let bytes = cache::encode_regions_file(&update, at);
    let again = cache::decode_regions_file(&bytes)
        .unwrap_or_else(|e| panic!("a stored regions message does not read back: {e}"));
    assert_eq!(
        again,
        (update, at),
        "store → load changed the regions message"
    );
    assert_eq!(cache::encode_regions_file(&again.0, again.1), bytes);
}

/// `registrations_file`: the contents of the registrations file.
pub fn registrations_file(data: &[u8]) {
    let Ok(registrations) = Registrations::decode(data) else {
        return;
    };
    let bytes = registrations.encode();
    let again = Registrations::decode(&bytes)
        .unwrap_or_else(|e| panic!("written registrations do not read back: {e}"));
    assert!(
        again.iter().eq(registrations.iter()),
        "write → load changed the registrations"
    );
    assert_eq!(again.encode(), bytes);
}

/// `register_body`: the body of `PUT /v1/agent/instances`, parsed and
/// validated as the handler does. A refusal is 400, 413 or 422; what is
/// accepted is what the agent persists, and it reads back the same.
pub fn register_body(data: &[u8]) {
    let parsed = parse_json::<RegisterRequest>(data, MAX_BODY_BYTES)
        .and_then(|request| request.validate(&ChecksConfig::default()));
    let registration = match parsed {
        Ok(registration) => registration,
        Err(error) => {
            assert!(
                matches!(error.status, 400 | 413 | 422),
                "a refused registration got status {}: {error}",
                error.status
            );
            return;
        }
    };
    let instance = LocalInstance {
        registration,
        generation: None,
        intent: Intent::Serve,
        committed: false,
    };
    let mut registrations = Registrations::default();
    registrations.put(instance.clone());
    let back = Registrations::decode(&registrations.encode())
        .unwrap_or_else(|e| panic!("an accepted registration does not read back: {e}"));
    assert_eq!(
        back.get(&instance.registration.instance_id),
        Some(&instance),
        "an accepted registration reads back changed"
    );
}

/// A response handler that keeps the encoded response (the real one sends
/// it on a socket). Encoded for TCP, without the 512-byte UDP cut.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Option<Vec<u8>>>>);

#[async_trait::async_trait]
impl ResponseHandler for Capture {
    async fn send_response<'a>(
        &mut self,
        response: MessageResponse<
            '_,
            'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
        >,
    ) -> Result<ResponseInfo, NetError> {
        let mut bytes = Vec::new();
        let info = response.destructive_emit(&mut BinEncoder::new(&mut bytes))?;
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        assert!(slot.is_none(), "two responses to one query");
        *slot = Some(bytes);
        Ok(info)
    }
}

/// The service the DNS target's view holds, and one the arbiter says does
/// not exist.
fn dns_services() -> (ServiceKey, ServiceKey) {
    (
        ServiceKey::new("shop", "web", "default").expect("valid key"),
        ServiceKey::new("shop", "gone", "default").expect("valid key"),
    )
}

fn record(id: &str, address: IpAddr, zone: &str) -> Arc<EndpointRecord> {
    Arc::new(EndpointRecord {
        instance_id: InstanceId::new(id).expect("valid id"),
        generation: Generation(1),
        node_id: NodeId::new("n1").expect("valid node"),
        epoch: AgentEpoch(1),
        lease: LeaseId(1),
        address,
        port: 8000,
        region: Label::new("r1").expect("valid label"),
        zone: Label::new(zone).expect("valid label"),
        version: Version::new("v1").expect("valid version"),
        weight: Weight::DEFAULT,
        labels: Vec::new(),
        state: State::Ready,
        reason: Reason::new("t").expect("valid reason"),
        origin: Principal {
            role: Role::Agent,
            name: PrincipalName::new("n1").expect("valid principal"),
        },
        liveness: Liveness::Unknown,
        revision: Revision(1),
        changed_at_ms: 0,
    })
}

/// A fresh view (lookups of new names add services to it) with `web`
/// held (IPv4 and IPv6 endpoints, one with an id that is no DNS label)
/// and `gone` unknown.
fn dns_views() -> Views {
    let (web, gone) = dns_services();
    let views = Views::new(
        ViewSettings {
            data_plane: DataPlaneConfig::default(),
            region: "r1".into(),
            zone: Label::new("z1").expect("valid label"),
            first_resolve_wait_ms: 0,
        },
        Arc::new(AgentMetrics::new()),
        |_| {},
    );
    let records: Vec<Arc<EndpointRecord>> = vec![
        record("web-1", IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), "z1"),
        record("Web_2.a", IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)), "z2"),
        record("web-3", IpAddr::V6(Ipv6Addr::LOCALHOST), "z1"),
    ];
    views.publish(
        Published {
            status: Status::Held,
            records: records.into(),
            revision: Revision(1),
            synced: true,
            confirmed_at_ms: Some(0),
            ready_weight: 300,
            ..Published::waiting(web, 0)
        },
        0,
    );
    views.publish(
        Published {
            status: Status::Unknown,
            ..Published::waiting(gone, 0)
        },
        0,
    );
    views
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime builds")
    })
}

/// `dns_query`: a DNS datagram, decoded as the server does, answered by
/// the agent's `Handler` over a view holding `web.shop` and knowing
/// `gone.shop` does not exist.
pub fn dns_query(data: &[u8]) {
    let src = SocketAddr::from(([127, 0, 0, 1], 5353));
    // What hickory cannot decode gets FORMERR from hickory itself.
    let Ok(request) = Request::from_bytes(data.to_vec(), src, Protocol::Udp) else {
        return;
    };
    let asked = Message::from_vec(data).ok();
    let handler = Handler::new(dns_views(), 5);
    let capture = Capture::default();
    runtime().block_on(RequestHandler::handle_request::<Capture, TokioTime>(
        &handler,
        &request,
        capture.clone(),
    ));
    let bytes = capture
        .0
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .expect("every decoded query gets a response");
    let response =
        Message::from_vec(&bytes).unwrap_or_else(|e| panic!("the response does not decode: {e}"));
    let Some(asked) = asked else {
        return;
    };
    assert_eq!(response.metadata.id, asked.metadata.id, "response id");
    assert_eq!(response.metadata.message_type, MessageType::Response);
    let rcode = response.metadata.response_code;
    if asked.metadata.op_code != OpCode::Query {
        assert_eq!(rcode, ResponseCode::NotImp);
        return;
    }
    if asked.edns.as_ref().is_some_and(|e| e.version() > 0) {
        // BADVERS is extended code 16, which hickory decodes as BADSIG
        // (TSIG's name for the same number): compare the numbers.
        assert_eq!(
            u16::from(rcode),
            u16::from(ResponseCode::BADVERS),
            "BADVERS (16), got {rcode:?}"
        );
        return;
    }
    let [query] = asked.queries.as_slice() else {
        assert_eq!(rcode, ResponseCode::FormErr);
        assert!(response.queries.is_empty(), "FORMERR echoes no question");
        return;
    };
    assert_eq!(
        response.queries.as_slice(),
        std::slice::from_ref(query),
        "the question"
    );
    if !matches!(query.query_class(), DNSClass::IN | DNSClass::ANY) {
        assert_eq!(rcode, ResponseCode::Refused);
        return;
    }
    if matches!(query.query_type(), RecordType::AXFR | RecordType::IXFR) {
        assert_eq!(rcode, ResponseCode::Refused, "a zone transfer");
        return;
    }
    let zone = Name::from_ascii("svc.rollcall.").expect("valid name");
    let inside = zone.zone_of(&query.name().to_lowercase());
    if !inside {
        assert_eq!(rcode, ResponseCode::Refused, "a name outside the zone");
    }
    assert!(
        matches!(
            rcode,
            ResponseCode::NoError
                | ResponseCode::NXDomain
                | ResponseCode::Refused
                | ResponseCode::ServFail
        ),
        "unexpected response code {rcode}"
    );
    for answer in &response.answers {
        assert_eq!(answer.name, *query.name(), "an answer for another name");
        assert!(
            matches!(
                answer.record_type(),
                RecordType::A | RecordType::AAAA | RecordType::SRV
            ),
            "an answer of type {}",
            answer.record_type()
        );
    }
    let lower = query.name().to_lowercase();
    if lower == Name::from_ascii("web.shop.svc.rollcall.").expect("valid name")
        && query.query_type() == RecordType::A
    {
        assert_eq!(rcode, ResponseCode::NoError);
        assert_eq!(response.answers.len(), 2, "both IPv4 endpoints of web");
    }
    if lower == Name::from_ascii("gone.shop.svc.rollcall.").expect("valid name") {
        assert_eq!(rcode, ResponseCode::NXDomain);
    }
}

fn key(service: &str) -> ServiceKey {
    ServiceKey::new("shop", service, "http").expect("seed key")
}

fn seed_view() -> ServiceView {
    let records: Vec<Arc<EndpointRecord>> = vec![
        record("checkout-0", IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), "z1"),
        record("checkout-1", IpAddr::V6(Ipv6Addr::LOCALHOST), "z2"),
    ];
    let snapshot = ServiceSnapshot {
        shard: ShardId(0),
        service: key("checkout"),
        revision: Revision(4),
        digest: rollcall_leases::Digest::of_records(records.iter().map(|r| &**r)),
        records,
    };
    ServiceView::from_snapshot(&snapshot).expect("seed snapshot matches its digest")
}

fn dns_seed(name: &str, qtype: RecordType, id: u16) -> Vec<u8> {
    let mut message = Message::query();
    message.metadata.id = id;
    message.metadata.recursion_desired = true;
    message.add_query(Query::query(
        Name::from_ascii(name).expect("seed name"),
        qtype,
    ));
    message.to_vec().expect("a seed query encodes")
}

/// Valid inputs per target of this crate, by target name.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut out: Vec<(&'static str, Vec<u8>)> = Vec::new();
    let view = seed_view();
    out.push((
        "cache_file",
        cache::encode_service_file(&view, Some(CatalogId(9))),
    ));
    out.push(("cache_file", cache::encode_service_file(&view, None)));
    out.push((
        "cache_file",
        rollcall_leases::codec::encode_service_snapshot(&view.to_snapshot()),
    ));
    let mut doc = ServicePolicy::new("shop/web", "r1");
    doc.cross_region = true;
    doc.failover_order = vec!["r2".into()];
    let update = RegionsUpdate {
        policies: vec![HeldPolicy {
            policy: Policy::new(doc).expect("seed policy"),
            home_revision: Revision(7),
        }],
        regions: vec![RegionEntry {
            region: Label::new("r2").expect("seed label"),
            age_ms: 300,
            max_age_ms: 10_000,
            version: Revision(9),
            ingress: vec![Ingress::new("10.0.0.9:7443").expect("seed ingress")],
            summaries: Vec::new(),
        }],
        writers: Vec::new(),
    };
    out.push(("regions_file", cache::encode_regions_file(&update, 123_456)));
    let bodies = [
        r#"{"service":"web","instance_id":"web-1","address":"10.0.0.1","port":8080}"#,
        r#"{"service":"web","namespace":"shop","port_name":"http","instance_id":"web-2","address":"::1","port":8080,"zone":"z1","version":"v2","weight":200,"labels":{"track":"canary"},"checks":{"startup":{"kind":"tcp","interval_ms":500},"readiness":{"kind":"http","path":"/ready","port":9000,"timeout_ms":200,"failure_threshold":2,"success_threshold":1,"jitter":0.1},"liveness":{"kind":"ttl","ttl_ms":10000}}}"#,
        r#"{"service":"web","instance_id":"web-3","address":"10.0.0.3","port":0}"#,
    ];
    let mut registrations = Registrations::default();
    for body in bodies {
        out.push(("register_body", body.as_bytes().to_vec()));
        let valid = parse_json::<RegisterRequest>(body.as_bytes(), MAX_BODY_BYTES)
            .and_then(|r| r.validate(&ChecksConfig::default()));
        if let Ok(registration) = valid {
            registrations.put(LocalInstance {
                registration,
                generation: Some(Generation(3)),
                intent: Intent::Drain,
                committed: false,
            });
        }
    }
    out.push(("registrations_file", registrations.encode()));
    for (i, (name, qtype)) in [
        ("web.shop.svc.rollcall.", RecordType::A),
        ("WEB.shop.svc.rollcall.", RecordType::AAAA),
        ("_default._tcp.web.shop.svc.rollcall.", RecordType::SRV),
        ("web-1.default.web.shop.svc.rollcall.", RecordType::A),
        ("gone.shop.svc.rollcall.", RecordType::A),
        ("example.com.", RecordType::A),
        ("shop.svc.rollcall.", RecordType::ANY),
    ]
    .into_iter()
    .enumerate()
    {
        out.push(("dns_query", dns_seed(name, qtype, i as u16)));
    }
    out
}

/// A fuzz target: its name and its check.
pub type Target = (&'static str, fn(&[u8]));

/// Every fuzz target of this module and its check, by target name.
pub const TARGETS: &[Target] = &[
    ("cache_file", cache_file),
    ("regions_file", regions_file),
    ("registrations_file", registrations_file),
    ("register_body", register_body),
    ("dns_query", dns_query),
];
