//! DNS on loopback (R8): answers names under `svc.rollcall.` from the
//! endpoint view (`view::Views`), the same view the proxy and the resolve
//! API use, so ejection, empty-set protection and panic apply here too.
//!
//! Names (matched case-insensitively; every part must be a valid rollcall
//! label, as `rollcall_leases::ServiceKey::new` checks them):
//!
//! - `<service>.<namespace>.svc.rollcall.`: A / AAAA of port `default`.
//! - `_<port>._tcp.<service>.<namespace>.svc.rollcall.`: SRV, one per
//!   endpoint (priority 0 in this agent's zone, 1 elsewhere; the record's
//!   weight; its port), the targets' A / AAAA in the ADDITIONAL section.
//! - `<instance>.<port>.<service>.<namespace>.svc.rollcall.`: an SRV target,
//!   A / AAAA of that endpoint while it is a candidate.
//!
//! Addresses list this agent's zone first, shuffled within each zone. TTL is
//! `ttl_s`.
//!
//! `<instance>` is the instance id when it already is a valid DNS label
//! (lowercase letters, digits, inner '-', at most 63), else the id
//! lowercased with every other character turned into '-', cut to 54
//! characters, then `-` and the CRC-32 of the id in 8 hex digits
//! (`Web_1.a` becomes `web-1-a-<crc>`). The port is part of the target name
//! because only a full service key names a view to look in.
//!
//! Response codes:
//! - NXDOMAIN only when the arbiter says the service does not exist
//!   (`Lookup::Unknown`), and for names under the zone that no service can
//!   ever have (an invalid label, a shape not listed above).
//! - NOERROR without answers for a known service without candidates, for a
//!   type its endpoints do not have (AAAA when all are IPv4), for an SRV
//!   target that is not a candidate, and for names that only have children:
//!   `svc.rollcall.`, `<namespace>.…`, `_tcp.<service>.<namespace>.…`, and
//!   `<port>.<service>.<namespace>.…` (this one takes its service's code).
//!   Negative answers carry the zone's SOA with a minimum of `ttl_s`, so
//!   resolvers cache them no longer than an answer.
//! - SERVFAIL only when the agent truly cannot know (`CannotKnow`,
//!   `Refused`): not cached and the arbiter unreachable, the watch
//!   refused, or the service still not arrived after
//!   `first_resolve_wait_ms`. An NXDOMAIN is cached by resolvers and must
//!   never be guessed; a SERVFAIL is "Temporary failure in name
//!   resolution" to a caller, so the first query of a service this agent
//!   does not follow yet waits for its snapshot, exactly as the HTTP
//!   resolve does, and then answers what the arbiter said. Other queries
//!   never wait on it: each UDP query is its own task.
//! - REFUSED for names outside `svc.rollcall.`, classes other than IN
//!   (or ANY) and zone transfers (AXFR, IXFR); FORMERR for a message without exactly one question; NOTIMP
//!   for opcodes other than QUERY; BADVERS for EDNS versions above 0.
//!   Undecodable messages get FORMERR from hickory, before this module.
//!
//! Every answer this module sends is counted in
//! `rollcall_agent_dns_answers_total{rcode}`.
//!
//! Sans-IO core (`classify`, `reply`): the view's answer and the randomness
//! come in as arguments. The `Handler` around it only asks the view and
//! sends; this module changes nothing in the agent beyond what a lookup
//! does (following a service).

use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::time::Duration;

use hickory_proto::op::{Edns, Header, HeaderCounts, Metadata, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, SOA, SRV, TXT};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use hickory_proto::serialize::binary::{BinDecoder, BinEncodable, BinEncoder, NameEncoding};
use hickory_server::net::runtime::Time;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::{MessageResponseBuilder, Queries};
use hickory_server::Server;
use rand::seq::SliceRandom;
use rand::Rng;
use rollcall_config::ConnTraffic;
use rollcall_leases::{Ingress, InstanceId, Label, ServiceKey};
use tokio::net::{TcpListener, UdpSocket};

use rollcall_leases::clock::now_ms;

use crate::endpoints::Candidate;
use crate::failover::Decision;
use crate::view::{Lookup, Views, DEGRADED_TTL_S};

/// The zone this server answers for.
pub const ZONE: &str = "svc.rollcall.";

/// A TCP connection that sends no query for this long is closed.
const TCP_IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// Responses queued per TCP connection.
const TCP_RESPONSE_BUFFER: usize = 32;

/// Binding a random port (port 0) takes the UDP port first, then TCP on the
/// same port; this many tries when another process holds that TCP port.
const BIND_ATTEMPTS: usize = 16;

/// Why the DNS server could not start.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    /// A socket could not be bound.
    #[error(
        "binding DNS over {protocol} on {addr}: {source}; free the port or change agent.dns_listen"
    )]
    Bind {
        /// "UDP" or "TCP".
        protocol: &'static str,
        /// The address asked for.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
}

/// A running DNS server. Dropping it stops it too (abruptly).
pub struct DnsHandle {
    server: Server<Handler>,
    local_addr: SocketAddr,
}

impl DnsHandle {
    /// Where the server listens, on both UDP and TCP (the bound port when
    /// started on port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting queries and waits for the server's tasks to end.
    pub async fn shutdown(mut self) {
        if let Err(e) = self.server.shutdown_gracefully().await {
            tracing::warn!(error = %e, "DNS server stopped with an error");
        }
    }
}

/// The DNS server's UDP socket and TCP listener, bound on the same port,
/// not serving yet: the agent binds them before it starts anything, so a
/// port in use stops it before anything ran.
pub struct DnsSockets {
    udp: UdpSocket,
    tcp: TcpListener,
    /// The address both are bound to (the real port when asked for port 0).
    pub local_addr: SocketAddr,
}

/// Binds UDP and TCP on `listen` (the same port for both; with port 0, a
/// free port both can have).
pub async fn bind(listen: SocketAddr) -> Result<DnsSockets, DnsError> {
    let mut attempt = 1;
    loop {
        let udp_error = |source| DnsError::Bind {
            protocol: "UDP",
            addr: listen,
            source,
        };
        let udp = UdpSocket::bind(listen).await.map_err(udp_error)?;
        let local_addr = udp.local_addr().map_err(udp_error)?;
        match TcpListener::bind(local_addr).await {
            Ok(tcp) => {
                return Ok(DnsSockets {
                    udp,
                    tcp,
                    local_addr,
                })
            }
            Err(e)
                if listen.port() == 0
                    && e.kind() == std::io::ErrorKind::AddrInUse
                    && attempt < BIND_ATTEMPTS =>
            {
                attempt += 1;
            }
            Err(source) => {
                return Err(DnsError::Bind {
                    protocol: "TCP",
                    addr: local_addr,
                    source,
                })
            }
        }
    }
}

/// Serves DNS over `views` on `sockets` with answers valid for `ttl_s`
/// seconds, until `DnsHandle::shutdown`.
pub fn start(views: Views, sockets: DnsSockets, ttl_s: u32) -> DnsHandle {
    let DnsSockets {
        udp,
        tcp,
        local_addr,
    } = sockets;
    let mut server = Server::new(Handler::new(views, ttl_s));
    server.register_socket(udp);
    server.register_listener(tcp, TCP_IDLE_TIMEOUT, TCP_RESPONSE_BUFFER);
    tracing::info!(dns = %local_addr, ttl_s, "DNS server started");
    DnsHandle { server, local_addr }
}

/// What a query name names.
#[derive(Clone, Debug, PartialEq)]
enum Named {
    /// Not under `svc.rollcall.`.
    Outside,
    /// Under the zone, but no service could ever have this name.
    Invalid,
    /// A name that only has children (the apex, a namespace,
    /// `_tcp.<service>.<namespace>`).
    Interior,
    /// `<service>.<namespace>`: the addresses of port `default`.
    Addresses(ServiceKey),
    /// `_<port>._tcp.<service>.<namespace>`.
    Srv(ServiceKey),
    /// `<port>.<service>.<namespace>`: the parent of the SRV targets.
    Targets(ServiceKey),
    /// `<instance>.<port>.<service>.<namespace>`: one SRV target.
    Target(ServiceKey, String),
}

impl Named {
    /// The service the name is about, if any.
    fn key(&self) -> Option<&ServiceKey> {
        match self {
            Named::Addresses(key)
            | Named::Srv(key)
            | Named::Targets(key)
            | Named::Target(key, _) => Some(key),
            Named::Outside | Named::Invalid | Named::Interior => None,
        }
    }
}

/// Reads a lowercased query name.
fn classify(name: &Name) -> Named {
    let labels: Vec<&[u8]> = name.iter().collect();
    let Some(inner) = labels.len().checked_sub(2) else {
        return Named::Outside;
    };
    if labels[inner..] != [b"svc".as_slice(), b"rollcall".as_slice()] {
        return Named::Outside;
    }
    let Some(parts) = labels[..inner]
        .iter()
        .map(|l| std::str::from_utf8(l).ok())
        .collect::<Option<Vec<&str>>>()
    else {
        return Named::Invalid;
    };
    let key =
        |namespace: &str, service: &str, port: &str| ServiceKey::new(namespace, service, port).ok();
    let named = match parts.as_slice() {
        [] => Some(Named::Interior),
        [namespace] => Label::new(namespace).ok().map(|_| Named::Interior),
        [service, namespace] => key(namespace, service, "default").map(Named::Addresses),
        ["_tcp", service, namespace] => key(namespace, service, "default").map(|_| Named::Interior),
        [port, "_tcp", service, namespace] => port
            .strip_prefix('_')
            .and_then(|port| key(namespace, service, port))
            .map(Named::Srv),
        [port, service, namespace] => key(namespace, service, port).map(Named::Targets),
        [instance, port, service, namespace] => key(namespace, service, port)
            .filter(|_| Label::new(instance).is_ok())
            .map(|k| Named::Target(k, (*instance).to_owned())),
        _ => None,
    };
    named.unwrap_or(Named::Invalid)
}

/// The DNS label of an instance in SRV target names (see the module doc).
pub fn instance_label(id: &InstanceId) -> String {
    let id = id.as_str();
    if Label::new(id).is_ok() {
        return id.to_owned();
    }
    let mut cleaned: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    cleaned.truncate(54);
    let crc = crc32fast::hash(id.as_bytes());
    match cleaned.trim_matches('-') {
        "" => format!("i-{crc:08x}"),
        cleaned => format!("{cleaned}-{crc:08x}"),
    }
}

/// The name of an SRV target.
fn target_name(record_id: &InstanceId, key: &ServiceKey) -> Option<Name> {
    Name::from_ascii(format!(
        "{}.{}.{}.{}.{ZONE}",
        instance_label(record_id),
        key.port_name,
        key.service,
        key.namespace
    ))
    .ok()
}

/// What to send back, before encoding.
#[derive(Debug, Default)]
struct Reply {
    rcode: ResponseCode,
    answers: Vec<Record>,
    authorities: Vec<Record>,
    additionals: Vec<Record>,
}

impl Reply {
    fn code(rcode: ResponseCode) -> Reply {
        Reply {
            rcode,
            ..Reply::default()
        }
    }
}

/// The zone's SOA, sent with negative answers: its minimum bounds how long
/// resolvers cache them.
fn soa(ttl_s: u32) -> Option<Record> {
    let zone = Name::from_ascii(ZONE).ok()?;
    let mname = Name::from_ascii(format!("ns.{ZONE}")).ok()?;
    let rname = Name::from_ascii(format!("hostmaster.{ZONE}")).ok()?;
    let ttl = i32::try_from(ttl_s).unwrap_or(i32::MAX);
    let soa = SOA::new(mname, rname, 1, ttl, ttl, ttl, ttl_s);
    Some(Record::from_rdata(zone, ttl_s, RData::SOA(soa)))
}

/// Same-zone candidates first, each group shuffled.
fn zone_first<'c>(
    candidates: &'c [Candidate],
    zone: &Label,
    rng: &mut impl Rng,
) -> Vec<&'c Candidate> {
    let (mut near, mut far): (Vec<&Candidate>, Vec<&Candidate>) =
        candidates.iter().partition(|c| &c.record.zone == zone);
    near.shuffle(rng);
    far.shuffle(rng);
    near.extend(far);
    near
}

/// The A / AAAA records of `address` asked for by `qtype`.
fn address_record(owner: &Name, address: IpAddr, qtype: RecordType, ttl_s: u32) -> Option<Record> {
    let data = match (address, qtype) {
        (IpAddr::V4(v4), RecordType::A | RecordType::ANY) => RData::A(A(v4)),
        (IpAddr::V6(v6), RecordType::AAAA | RecordType::ANY) => RData::AAAA(AAAA(v6)),
        _ => return None,
    };
    Some(Record::from_rdata(owner.clone(), ttl_s, data))
}

/// Where a service with no usable local endpoint fails over to (R9).
#[derive(Clone, Debug)]
struct Failover {
    region: Label,
    ingress: Vec<Ingress>,
}

/// The TXT record a single-writer service's answers carry in their
/// additional section, beside `rollcall-region`: its writer epoch as this
/// agent holds it, the fencing token (README, "Single writer").
fn writer_txt(owner: &Name, writer: &rollcall_leases::WriterEpoch, ttl_s: u32) -> Record {
    let txt = TXT::new(vec![
        format!("rollcall-writer={}", writer.owner),
        format!("rollcall-writer-epoch={}", writer.epoch),
        format!(
            "rollcall-writer-state={}",
            if writer.settled { "settled" } else { "moving" }
        ),
    ]);
    Record::from_rdata(owner.clone(), ttl_s, RData::TXT(txt))
}

/// The SRV target label of a region's `i`-th ingress address.
fn ingress_label(region: &Label, i: usize) -> String {
    format!("ingress-{region}-{i}")
}

/// The answer for a service that failed over: its region's ingress
/// addresses (A / AAAA of the literal IPs; SRV with the ingress port,
/// targeting a name this server answers for a literal IP, or the ingress
/// host name itself), and a TXT `rollcall-region=<region>` in the
/// additional section saying where the answer comes from.
fn failover_reply(
    named: &Named,
    owner: &Name,
    qtype: RecordType,
    failover: &Failover,
    ttl_s: u32,
) -> Reply {
    let mut out = Reply::code(ResponseCode::NoError);
    for (i, ingress) in failover.ingress.iter().enumerate() {
        let Some((host, port)) = ingress
            .as_str()
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
        else {
            continue;
        };
        let ip = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .ok();
        let label = ingress_label(&failover.region, i);
        match named {
            Named::Addresses(_) => {
                out.answers
                    .extend(ip.and_then(|ip| address_record(owner, ip, qtype, ttl_s)));
            }
            Named::Srv(key) if matches!(qtype, RecordType::SRV | RecordType::ANY) => {
                let target = match ip {
                    Some(_) => Name::from_ascii(format!(
                        "{label}.{}.{}.{}.{ZONE}",
                        key.port_name, key.service, key.namespace
                    )),
                    None => Name::from_ascii(format!("{host}.")),
                };
                let Ok(target) = target else { continue };
                let srv = SRV::new(0, 1, port, target.clone());
                out.answers
                    .push(Record::from_rdata(owner.clone(), ttl_s, RData::SRV(srv)));
                out.additionals
                    .extend(ip.and_then(|ip| address_record(&target, ip, RecordType::ANY, ttl_s)));
            }
            Named::Target(_, asked) if asked == &label => {
                out.answers
                    .extend(ip.and_then(|ip| address_record(owner, ip, qtype, ttl_s)));
            }
            _ => {}
        }
    }
    let txt = TXT::new(vec![format!("rollcall-region={}", failover.region)]);
    out.additionals
        .push(Record::from_rdata(owner.clone(), ttl_s, RData::TXT(txt)));
    if out.answers.is_empty() {
        out.authorities.extend(soa(ttl_s));
    }
    out
}

/// Answers one question. `owner` is the name as asked (case kept), `named`
/// what its lowercased form names; `lookup` asks the endpoint view, and
/// `failover` where a service with no usable endpoint here goes instead.
#[allow(clippy::too_many_arguments)]
fn reply(
    named: &Named,
    owner: &Name,
    qtype: RecordType,
    lookup: impl FnOnce(&ServiceKey) -> Lookup,
    failover: impl FnOnce(&ServiceKey) -> Option<Failover>,
    zone: &Label,
    ttl_s: u32,
    rng: &mut impl Rng,
) -> Reply {
    // Zone transfers: the zone is each agent's own view, never a zone file
    // to copy; refused as a server refuses a transfer it does not allow.
    if matches!(qtype, RecordType::AXFR | RecordType::IXFR) {
        return Reply::code(ResponseCode::Refused);
    }
    let key = match named {
        Named::Outside => return Reply::code(ResponseCode::Refused),
        Named::Invalid => return negative(ResponseCode::NXDomain, ttl_s),
        Named::Interior => return negative(ResponseCode::NoError, ttl_s),
        Named::Addresses(key) | Named::Srv(key) | Named::Targets(key) | Named::Target(key, _) => {
            key
        }
    };
    let answer = match lookup(key) {
        // No READY endpoint here (none, or only what protection or panic
        // holds): a failover the policy allows comes first.
        Lookup::Serve(answer) if !answer.selection.holds_ready() => {
            if let Some(f) = failover(key) {
                return failover_reply(named, owner, qtype, &f, ttl_s);
            }
            answer
        }
        Lookup::Serve(answer) => answer,
        Lookup::Unknown => {
            return match failover(key) {
                Some(f) => failover_reply(named, owner, qtype, &f, ttl_s),
                None => negative(ResponseCode::NXDomain, ttl_s),
            }
        }
        Lookup::CannotKnow(reason) | Lookup::Refused(reason) => {
            tracing::debug!(service = %key, reason = %reason, "DNS cannot know; SERVFAIL");
            return Reply::code(ResponseCode::ServFail);
        }
    };
    // A degraded copy's answer is good for a second at most: callers ask
    // again soon, and get the arbiter's answer as soon as it is back.
    let ttl_s = match answer.degraded {
        Some(_) => ttl_s.min(DEGRADED_TTL_S),
        None => ttl_s,
    };
    let ordered = zone_first(&answer.selection.candidates, zone, rng);
    let mut out = Reply::code(ResponseCode::NoError);
    match named {
        Named::Addresses(_) => {
            out.answers = ordered
                .iter()
                .filter_map(|c| address_record(owner, c.record.address, qtype, ttl_s))
                .collect();
        }
        Named::Srv(key) if matches!(qtype, RecordType::SRV | RecordType::ANY) => {
            for c in ordered {
                let Some(target) = target_name(&c.record.instance_id, key) else {
                    continue;
                };
                let priority = u16::from(&c.record.zone != zone);
                let weight = u16::try_from(c.record.weight.get()).unwrap_or(u16::MAX);
                let srv = SRV::new(priority, weight, c.record.port, target.clone());
                out.answers
                    .push(Record::from_rdata(owner.clone(), ttl_s, RData::SRV(srv)));
                out.additionals.extend(address_record(
                    &target,
                    c.record.address,
                    RecordType::ANY,
                    ttl_s,
                ));
            }
        }
        Named::Target(_, label) => {
            out.answers = ordered
                .iter()
                .filter(|c| &instance_label(&c.record.instance_id) == label)
                .filter_map(|c| address_record(owner, c.record.address, qtype, ttl_s))
                .collect();
        }
        _ => {}
    }
    if out.answers.is_empty() {
        out.authorities.extend(soa(ttl_s));
    }
    out
}

fn negative(rcode: ResponseCode, ttl_s: u32) -> Reply {
    Reply {
        authorities: soa(ttl_s).into_iter().collect(),
        ..Reply::code(rcode)
    }
}

/// The metric label of a response code.
fn rcode_label(rcode: ResponseCode) -> &'static str {
    match rcode {
        ResponseCode::NoError => "noerror",
        ResponseCode::NXDomain => "nxdomain",
        ResponseCode::ServFail => "servfail",
        ResponseCode::Refused => "refused",
        ResponseCode::FormErr => "formerr",
        ResponseCode::NotImp => "notimp",
        ResponseCode::BADVERS => "badvers",
        _ => "other",
    }
}

/// Serves queries from the agent's endpoint view: what the DNS server
/// runs for every decoded query (public so the fuzz target feeds queries
/// through exactly this, as `RequestHandler::handle_request`).
pub struct Handler {
    views: Views,
    ttl_s: u32,
}

impl Handler {
    /// Answers from `views`, valid for `ttl_s` seconds.
    pub fn new(views: Views, ttl_s: u32) -> Handler {
        Handler { views, ttl_s }
    }

    /// Everything but the sending. A name of a service not arrived yet
    /// waits for it (up to `first_resolve_wait_ms`); the answer itself is
    /// computed without waiting (the thread RNG never crosses an await).
    async fn answer(&self, request: &Request) -> Reply {
        if request.metadata.op_code != OpCode::Query {
            return Reply::code(ResponseCode::NotImp);
        }
        if request.edns.as_ref().is_some_and(|e| e.version() > 0) {
            return Reply::code(ResponseCode::BADVERS);
        }
        let [query] = request.queries.queries() else {
            return Reply::code(ResponseCode::FormErr);
        };
        if !matches!(query.query_class(), DNSClass::IN | DNSClass::ANY) {
            return Reply::code(ResponseCode::Refused);
        }
        let named = classify(query.name());
        let looked = match named.key() {
            Some(key) => Some(self.views.lookup_wait(key).await),
            None => None,
        };
        let now = now_ms();
        let writer = named.key().and_then(|key| self.views.writer(key));
        let mut reply = reply(
            &named,
            query.original().name(),
            query.query_type(),
            |key| looked.unwrap_or_else(|| self.views.lookup(key, now)),
            // DNS cannot tell reads from writes: read-write, the safe side.
            |key| match self.views.failover(key, ConnTraffic::ReadWrite, now) {
                Decision::Remote {
                    region, ingress, ..
                } => Some(Failover { region, ingress }),
                Decision::Refused(_) => None,
            },
            self.views.zone(),
            self.ttl_s,
            &mut rand::rng(),
        );
        if let Some(writer) = writer.filter(|_| reply.rcode == ResponseCode::NoError) {
            reply
                .additionals
                .push(writer_txt(query.original().name(), &writer, self.ttl_s));
        }
        reply
    }

    async fn respond<R: ResponseHandler>(
        &self,
        request: &Request,
        mut response_handle: R,
    ) -> ResponseInfo {
        let reply = self.answer(request).await;
        self.views.metrics().dns_answer(rcode_label(reply.rcode));
        let mut metadata = Metadata::response_from_request(&request.metadata);
        metadata.response_code = reply.rcode;
        metadata.authoritative =
            matches!(reply.rcode, ResponseCode::NoError | ResponseCode::NXDomain);
        let edns = request.edns.as_ref().map(|asked| {
            let mut edns = Edns::new();
            edns.set_max_payload(asked.max_payload().max(512));
            edns.set_version(0);
            edns.set_rcode_high(reply.rcode.high());
            edns
        });
        let question = echoed_question(request, reply.rcode);
        let builder = MessageResponseBuilder::new(&question, edns.as_ref());
        let response = builder.build(
            metadata,
            reply.answers.iter(),
            reply.authorities.iter(),
            std::iter::empty(),
            reply.additionals.iter(),
        );
        match response_handle.send_response(response).await {
            Ok(info) => info,
            Err(e) => {
                tracing::warn!(error = %e, "sending a DNS response failed");
                metadata.response_code = ResponseCode::ServFail;
                ResponseInfo::from(Header {
                    metadata,
                    counts: HeaderCounts::default(),
                })
            }
        }
    }
}

/// The question section the response carries. hickory's own builder
/// (`from_message_request`) copies the request's question bytes verbatim,
/// compression pointers included; a pointer into the request's header
/// (whose flags differ in the response) then makes the answer undecodable
/// (found by the `dns_query` fuzz target). So the one question is
/// re-encoded uncompressed, in its own case. A FORMERR (not exactly one
/// question) carries none: echoing up to 65,535 questions helps nobody.
fn echoed_question(request: &Request, rcode: ResponseCode) -> Queries {
    let none = || Queries::read(&mut BinDecoder::new(&[]), 0).expect("no questions always decode");
    let [query] = request.queries.queries() else {
        return none();
    };
    if rcode == ResponseCode::FormErr {
        return none();
    }
    let mut bytes = Vec::with_capacity(64);
    let mut encoder = BinEncoder::new(&mut bytes);
    encoder.set_name_encoding(NameEncoding::Uncompressed);
    // A name that decoded (at most 255 bytes) always encodes and decodes
    // again; should it not, the answer goes out without the question.
    let echoed = query
        .original()
        .emit(&mut encoder)
        .map_err(|e| e.to_string())
        .and_then(|()| Queries::read(&mut BinDecoder::new(&bytes), 1).map_err(|e| e.to_string()));
    echoed.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "the question did not re-encode; answering without it");
        none()
    })
}

/// Written out by hand: the trait is declared with `async_trait`, which
/// this crate does not depend on.
impl RequestHandler for Handler {
    fn handle_request<'life0, 'life1, 'async_trait, R, T>(
        &'life0 self,
        request: &'life1 Request,
        response_handle: R,
    ) -> Pin<Box<dyn std::future::Future<Output = ResponseInfo> + Send + 'async_trait>>
    where
        R: ResponseHandler + 'async_trait,
        T: Time + 'async_trait,
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(self.respond(request, response_handle))
    }
}

#[cfg(test)]
mod tests;
