//! The `rogue` step (issue 38, item 10): a node of zone z1, `rogue`, holds
//! a valid agent certificate of its own (its host address an IP SAN, as
//! every node's), its zone's gossip key, and nothing else an honest node
//! lacks, and attacks the region while the traffic flows. It runs in the
//! harness's process from an address of its own on the bridge (10.S.0.230)
//! with real QUIC, TLS and UDP, like any host of the fleet.
//!
//! Each round it connects to the next replica (followers and the leader in
//! turn) and tries every attack of `crate::rogue::ATTACKS` once: Hellos
//! that lie about its node, zone or address, a handshake with a revoked
//! certificate, writes to records of other nodes (taking an instance id
//! over, draining, marking, deregistering), registrations at another
//! node's address or above its weight cap, down reports about another
//! zone's node and, alone, about a live node of its own zone, witness
//! answers nobody asked for, floods of subscriptions and propagation waits
//! past their limits, and a sealed gossip datagram sent twice. Each
//! attempt is recorded with what came of it; what only a counter shows
//! (an unasked witness answer, a replayed datagram) is settled from the
//! counters' rise when the step ends. The victims' epochs and generations
//! come from their data directories and agent APIs: what the rogue's
//! gossip and its own subscription would tell it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rollcall_gossip::{Sealer, ZoneKey};
use rollcall_leases::client::{ArbiterClient, ArbiterConn, SessionReader, SessionWriter};
use rollcall_leases::protocol::{
    RejectKind, Request, Response, ServiceUpdate, SessionDown, SessionUp,
};
use rollcall_leases::tls::{TlsFiles, TlsMaterial};
use rollcall_leases::{
    AgentEpoch, Generation, InstanceId, Label, Liveness, NodeId, Reason, Registration, Revision,
    ServiceKey, ShardId, State, Version, Weight,
};

mod setup;
pub(super) use setup::{cert_args, foreign_changes, node_zones, revoke};

use super::{Cluster, RunError, ECHO_PORT, GOSSIP_PORT, HTTP_PORT};
use crate::rogue::{self, Outcome, RogueFigures};

/// The rogue's node: its certificate is `agent:rogue`.
pub(super) const NODE: &str = "rogue";
/// An identity the run revokes (`rollcall certs --revoke`) before the
/// replicas start; the rogue holds its certificate and key too.
pub(super) const REVOKED: &str = "rogue-revoked";
/// The last octet of the rogue's host address on the bridge.
pub(super) const HOST: u8 = 230;
/// The weight cap `[[node_zones]]` gives the rogue.
pub(super) const MAX_WEIGHT: u32 = 100;

/// Pause between two rounds.
const ROUND_GAP: Duration = Duration::from_secs(2);
/// Longest wait for one attempt's answer; bounds a hang, not a timing
/// claim.
const PATIENCE: Duration = Duration::from_secs(5);
/// Most subscriptions one flood sends (the scenario's limit is below).
const FLOOD: usize = 64;
/// Propagation waits one flood holds open at once.
const WAITS: usize = 16;

/// A node the rogue aims at.
struct Victim {
    node: String,
    ip: Ipv4Addr,
    /// One of its instances.
    instance: String,
    /// Its data directory's `epoch` file (the run its gossip announces).
    epoch_file: PathBuf,
}

/// Everything the rogue holds, taken from the cluster when the step runs.
pub(super) struct Rogue {
    /// Each replica's QUIC and admin address.
    arbiters: Vec<(SocketAddr, SocketAddr)>,
    ip: Ipv4Addr,
    own: TlsMaterial,
    revoked: TlsMaterial,
    key: ZoneKey,
    zone: String,
    other_zone: String,
    /// A node of its own zone, and one of another.
    near: Victim,
    far: Victim,
    service: ServiceKey,
    http: reqwest::Client,
    /// The replicas' logs, for the audit lines.
    logs: Vec<PathBuf>,
    until: Instant,
}

impl Rogue {
    /// The rogue of `cluster`, attacking until `until`.
    pub(super) fn new(cluster: &Cluster, until: Instant) -> Result<Rogue, RunError> {
        let ip = cluster.rogue_ip.ok_or_else(|| {
            RunError::Cluster("the rogue step needs the rogue's host (set up at start)".into())
        })?;
        let certs = cluster.work.join("certs");
        let material = |name: &str| {
            TlsMaterial::load(&TlsFiles {
                ca: certs.join("ca.crt"),
                cert: certs.join(format!("agent-{name}.crt")),
                key: certs.join(format!("agent-{name}.key")),
            })
            .map_err(|e| RunError::Cluster(format!("the rogue's certificate {name}: {e}")))
        };
        let zone = cluster.zones[0].clone();
        let victim = |i: usize| Victim {
            node: cluster.nodes[i].clone(),
            ip: cluster.node_ip(i),
            instance: cluster.instances[i][0].clone(),
            epoch_file: cluster.work.join(&cluster.nodes[i]).join("epoch"),
        };
        let far = (0..cluster.nodes.len())
            .find(|i| cluster.zones[*i] != zone)
            .ok_or_else(|| RunError::Cluster("the rogue step needs two zones".into()))?;
        Ok(Rogue {
            arbiters: cluster.arbiters.clone(),
            ip,
            own: material(NODE)?,
            revoked: material(REVOKED)?,
            key: ZoneKey::load(&cluster.work.join("zone.key"))
                .map_err(|e| RunError::Cluster(format!("the zone key: {e}")))?,
            other_zone: cluster.zones[far].clone(),
            zone,
            near: victim(0),
            far: victim(far),
            service: ServiceKey::new("default", &cluster.service, "default")
                .map_err(|e| RunError::Cluster(format!("the service's key: {e}")))?,
            http: cluster.http.clone(),
            logs: (1..=cluster.arbiters.len())
                .map(|k| cluster.work.join(format!("arbiter-{k}.log")))
                .collect(),
            until,
        })
    }

    /// Attacks round after round until the step's end, then settles what
    /// the counters show.
    pub(super) async fn run(self) -> RogueFigures {
        let mut figures = RogueFigures::default();
        let bind = SocketAddr::new(self.ip.into(), 0);
        let clients = (
            ArbiterClient::bound(&self.own, bind),
            ArbiterClient::bound(&self.revoked, bind),
        );
        let (Ok(own), Ok(revoked)) = clients else {
            for attack in rogue::ATTACKS {
                figures.record(attack, Outcome::NotMade("no QUIC client".into()));
            }
            return figures;
        };
        let mut sealer = Sealer::new(self.key.clone(), None, rand::random());
        let before = self.counters().await;
        let epoch = AgentEpoch(rollcall_leases::clock::now_ms());
        let (mut witness_answers, mut replays) = (0, 0);
        let mut round = 0;
        while Instant::now() + ROUND_GAP < self.until {
            let arbiter = self.arbiters[round % self.arbiters.len()].0;
            round += 1;
            self.hellos(&own, arbiter, epoch, &mut figures).await;
            match self.session(&own, arbiter, epoch).await {
                Ok(session) => {
                    self.revoked(&revoked, arbiter, &mut figures).await;
                    witness_answers += self.requests(session, epoch, &mut figures).await;
                }
                Err(why) => {
                    for attack in SESSION_ATTACKS {
                        figures.record(attack, Outcome::NotMade(why.clone()));
                    }
                }
            }
            replays += self.replay(&mut sealer).await;
            tokio::time::sleep(ROUND_GAP).await;
        }
        // Counters are read over HTTP; give the last attempts a moment.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let after = self.counters().await;
        figures.settle(
            rogue::UNASKED_WITNESS_ANSWER,
            witness_answers,
            after.witness.saturating_sub(before.witness),
            "rollcall_arbiter_refusals_total{kind=\"witness\"}",
        );
        figures.replays_sent = replays;
        figures.replays_dropped = after.replays.saturating_sub(before.replays);
        figures.settle(
            rogue::GOSSIP_REPLAY,
            replays,
            figures.replays_dropped,
            "rollcall_gossip_dropped_total{reason=\"replay\"}",
        );
        figures.refusals_counted = after.refusals.saturating_sub(before.refusals);
        figures.audit_lines = self.audit_lines();
        figures
    }

    /// Hellos that lie: another node's name, another zone, another node's
    /// address. Each must be refused.
    async fn hellos(
        &self,
        client: &ArbiterClient,
        arbiter: SocketAddr,
        epoch: AgentEpoch,
        figures: &mut RogueFigures,
    ) {
        let hello = |node: &str, zone: &str, address: Ipv4Addr| SessionUp::Hello {
            node: NodeId::new(node).expect("a node name"),
            epoch,
            zone: Label::new(zone).expect("a zone label"),
            addresses: vec![IpAddr::V4(address)],
        };
        for (attack, lie) in [
            (
                rogue::HELLO_AS_ANOTHER_NODE,
                hello(&self.near.node, &self.zone, self.ip),
            ),
            (
                rogue::HELLO_IN_ANOTHER_ZONE,
                hello(NODE, &self.other_zone, self.ip),
            ),
            (
                rogue::HELLO_WITH_ANOTHER_ADDRESS,
                hello(NODE, &self.zone, self.far.ip),
            ),
        ] {
            let outcome = hello_outcome(client, arbiter, &lie).await;
            figures.record(attack, outcome);
        }
    }

    /// A handshake (and a Hello) with the revoked identity's certificate;
    /// made right after the rogue's own certificate reached `arbiter`, so
    /// a failed handshake is the replica's refusal, not its absence.
    async fn revoked(
        &self,
        client: &ArbiterClient,
        arbiter: SocketAddr,
        figures: &mut RogueFigures,
    ) {
        let hello = SessionUp::Hello {
            node: NodeId::new(REVOKED).expect("a node name"),
            epoch: AgentEpoch(1),
            zone: Label::new(&self.zone).expect("a zone label"),
            addresses: vec![IpAddr::V4(self.ip)],
        };
        let outcome =
            match tokio::time::timeout(PATIENCE, client.connect(&arbiter.to_string())).await {
                Ok(Err(refused)) => Outcome::Refused(format!("handshake refused: {refused}")),
                Err(_) => Outcome::NotMade("the handshake took over 5 s".into()),
                Ok(Ok(conn)) => {
                    conn.close("rogue: done");
                    hello_outcome(client, arbiter, &hello).await
                }
            };
        figures.record(rogue::REVOKED_CERTIFICATE, outcome);
    }

    /// The rogue's own session: its node, zone and address, as its
    /// certificate and `[[node_zones]]` say.
    async fn session(
        &self,
        client: &ArbiterClient,
        arbiter: SocketAddr,
        epoch: AgentEpoch,
    ) -> Result<Session, String> {
        let hello = SessionUp::Hello {
            node: NodeId::new(NODE).expect("a node name"),
            epoch,
            zone: Label::new(&self.zone).expect("a zone label"),
            addresses: vec![IpAddr::V4(self.ip)],
        };
        let open = async {
            let conn = client
                .connect(&arbiter.to_string())
                .await
                .map_err(|e| e.to_string())?;
            let (writer, mut reader) =
                conn.open_session(&hello).await.map_err(|e| e.to_string())?;
            match reader.next().await.map_err(|e| e.to_string())? {
                SessionDown::Welcome {
                    shard, revision, ..
                } => Ok(Session {
                    conn,
                    writer,
                    reader,
                    shard,
                    revision,
                }),
                other => Err(format!(
                    "the rogue's own Hello was answered {}",
                    kind(&other)
                )),
            }
        };
        tokio::time::timeout(PATIENCE, open)
            .await
            .unwrap_or_else(|_| Err(format!("no session with {arbiter} within 5 s")))
    }

    /// Every attack made through the rogue's own session; returns the
    /// unasked witness answers sent.
    async fn requests(&self, mut s: Session, epoch: AgentEpoch, figures: &mut RogueFigures) -> u64 {
        let registration = |id: &str, address: Ipv4Addr, weight: u32| Registration {
            instance_id: InstanceId::new(id).expect("an instance id"),
            service: self.service.clone(),
            node: NodeId::new(NODE).expect("a node name"),
            epoch,
            address: IpAddr::V4(address),
            port: ECHO_PORT,
            zone: None,
            version: Version::new("v1").expect("a version"),
            weight: Weight::new(weight).expect("a weight"),
            labels: Vec::new(),
            initial: State::Ready,
        };
        let near = InstanceId::new(&self.near.instance).expect("an instance id");
        let far = InstanceId::new(&self.far.instance).expect("an instance id");
        let (near_generation, far_generation) = (
            self.generation(&self.near).await,
            self.generation(&self.far).await,
        );
        let forbidden = [
            (
                rogue::TAKE_OVER_INSTANCE,
                Request::Register(registration(&self.near.instance, self.ip, 100)),
            ),
            (
                rogue::REGISTER_ANOTHER_ADDRESS,
                Request::Register(registration("rogue-elsewhere", self.far.ip, 100)),
            ),
            (
                rogue::REGISTER_ABOVE_WEIGHT_CAP,
                Request::Register(registration("rogue-heavy", self.ip, MAX_WEIGHT * 10)),
            ),
            (
                rogue::DRAIN_ANOTHER_NODES_INSTANCE,
                Request::Transition {
                    instance_id: near.clone(),
                    generation: near_generation,
                    to: State::Draining,
                    reason: Reason::new("rogue").expect("a reason"),
                },
            ),
            (
                rogue::MARK_ANOTHER_NODES_INSTANCE,
                Request::SetLiveness {
                    instance_id: far.clone(),
                    generation: far_generation,
                    liveness: Liveness::Failing,
                },
            ),
            (
                rogue::DEREGISTER_ANOTHER_NODES_INSTANCE,
                Request::Deregister {
                    instance_id: far,
                    generation: far_generation,
                },
            ),
            (
                rogue::REPORT_DOWN_IN_ANOTHER_ZONE,
                Request::ReportDown {
                    node: NodeId::new(&self.far.node).expect("a node name"),
                    epoch: epoch_of(&self.far),
                },
            ),
        ];
        for (attack, request) in forbidden {
            let outcome = match ask(&s.conn, &request).await {
                Ok(Response::Rejected {
                    kind: RejectKind::Forbidden,
                    message,
                }) => Outcome::Refused(message),
                Ok(other) => Outcome::Breach(format!("answered {other:?}")),
                Err(why) => Outcome::NotMade(why),
            };
            figures.record(attack, outcome);
        }
        // Alone, about a live node of its zone: any refusal will do (the
        // node answers the probe, or a witness sees it alive).
        let down = Request::ReportDown {
            node: NodeId::new(&self.near.node).expect("a node name"),
            epoch: epoch_of(&self.near),
        };
        let outcome = match ask(&s.conn, &down).await {
            Ok(Response::Rejected { message, .. }) => Outcome::Refused(message),
            Ok(other) => Outcome::Breach(format!("answered {other:?}")),
            Err(why) => Outcome::NotMade(why),
        };
        figures.record(rogue::REPORT_DOWN_ALONE, outcome);
        let mut witness_answers = 0;
        let gone = SessionUp::Witnessed {
            node: NodeId::new(&self.near.node).expect("a node name"),
            epoch: epoch_of(&self.near),
            gossip: Some(false),
            reachable: Some(false),
        };
        match s.writer.send(&gone).await {
            Ok(()) => witness_answers += 1,
            Err(e) => figures.record(
                rogue::UNASKED_WITNESS_ANSWER,
                Outcome::NotMade(e.to_string()),
            ),
        }
        let flood = self.subscription_flood(&mut s).await;
        figures.record(rogue::SUBSCRIPTION_FLOOD, flood);
        let waits = self.wait_flood(&s).await;
        figures.record(rogue::PROPAGATION_WAIT_FLOOD, waits);
        s.conn.close("rogue: round over");
        witness_answers
    }

    /// Up to [`FLOOD`] subscriptions to services nobody registered: one
    /// must be denied, naming the limit.
    async fn subscription_flood(&self, s: &mut Session) -> Outcome {
        for k in 0..FLOOD {
            let service = ServiceKey::new("default", &format!("rogue-flood-{k}"), "default")
                .expect("a service key");
            let subscribe = SessionUp::Subscribe {
                service,
                shard: s.shard,
                have: None,
            };
            if let Err(e) = s.writer.send(&subscribe).await {
                return Outcome::NotMade(format!("subscribing: {e}"));
            }
        }
        let denied = async {
            loop {
                match s.reader.next().await {
                    Ok(SessionDown::Update(updates)) => {
                        if let Some(reason) = updates.into_iter().find_map(|u| match u {
                            ServiceUpdate::Denied { reason, .. } => Some(reason),
                            _ => None,
                        }) {
                            return Ok(reason);
                        }
                    }
                    Ok(_) => {}
                    Err(e) => return Err(e.to_string()),
                }
            }
        };
        match tokio::time::timeout(PATIENCE, denied).await {
            Ok(Ok(reason)) if reason.contains("subscriptions_per_session") => {
                Outcome::Refused(reason)
            }
            Ok(Ok(reason)) => Outcome::Breach(format!("denied for another reason: {reason}")),
            Ok(Err(why)) => Outcome::NotMade(why),
            Err(_) => Outcome::Breach(format!("{FLOOD} subscriptions, none denied within 5 s")),
        }
    }

    /// [`WAITS`] propagation waits at once for a revision far ahead: those
    /// past the limit must be refused, naming it.
    async fn wait_flood(&self, s: &Session) -> Outcome {
        let wait = Request::AwaitPropagation {
            service: self.service.clone(),
            revision: Revision(s.revision.0 + 1_000_000),
            timeout_ms: 1_500,
        };
        let mut asked = tokio::task::JoinSet::new();
        for _ in 0..WAITS {
            let (conn, wait) = (s.conn.clone(), wait.clone());
            asked.spawn(async move { ask(&conn, &wait).await });
        }
        let (mut refused, mut errors) = (None, None);
        while let Some(answer) = asked.join_next().await {
            match answer {
                Ok(Ok(Response::Rejected {
                    kind: RejectKind::Unavailable,
                    message,
                })) if message.contains("propagation_waits_per_identity") => {
                    refused = Some(message)
                }
                Ok(Ok(_)) => {}
                Ok(Err(why)) => errors = Some(why),
                Err(e) => errors = Some(e.to_string()),
            }
        }
        match (refused, errors) {
            (Some(message), _) => Outcome::Refused(message),
            (None, Some(why)) => Outcome::NotMade(why),
            (None, None) => Outcome::Breach(format!("{WAITS} waits held at once, none refused")),
        }
    }

    /// Seals one datagram with the zone key and sends it twice to the
    /// near victim's gossip port; returns the replays sent.
    async fn replay(&self, sealer: &mut Sealer) -> u64 {
        let Some(packet) = sealer.seal(b"rollcall chaos: a rogue's datagram, sent twice") else {
            return 0;
        };
        let Ok(socket) = tokio::net::UdpSocket::bind(SocketAddr::new(self.ip.into(), 0)).await
        else {
            return 0;
        };
        let to = SocketAddr::new(self.near.ip.into(), GOSSIP_PORT);
        for _ in 0..2 {
            if socket.send_to(&packet, to).await.is_err() {
                return 0;
            }
        }
        1
    }

    /// The generation of `victim`'s instance as its agent serves it (what
    /// the rogue's own subscription would tell it); 1 if unknown (the
    /// ownership check comes first either way).
    async fn generation(&self, victim: &Victim) -> Generation {
        let url = format!(
            "http://{}:{HTTP_PORT}/v1/endpoints/{}?all=true",
            victim.ip, self.service.service
        );
        let body: Option<serde_json::Value> =
            async { self.http.get(url).send().await.ok()?.json().await.ok() }.await;
        body.and_then(|b| {
            b["endpoints"]
                .as_array()?
                .iter()
                .find(|e| e["instance_id"] == victim.instance.as_str())?["generation"]
                .as_u64()
        })
        .map_or(Generation(1), Generation)
    }

    /// The counters the attacks should raise.
    async fn counters(&self) -> Counters {
        let mut counters = Counters::default();
        for (_, admin) in &self.arbiters {
            let text = self.metrics(&format!("http://{admin}/metrics")).await;
            counters.refusals += sum(&text, "rollcall_arbiter_refusals_total{");
            counters.witness += sum(&text, "rollcall_arbiter_refusals_total{kind=\"witness\"}");
        }
        let text = self
            .metrics(&format!("http://{}:{HTTP_PORT}/metrics", self.near.ip))
            .await;
        counters.replays = sum(&text, "rollcall_gossip_dropped_total{reason=\"replay\"}");
        counters
    }

    async fn metrics(&self, url: &str) -> String {
        async { self.http.get(url).send().await.ok()?.text().await.ok() }
            .await
            .unwrap_or_default()
    }

    /// Lines of the replicas' logs under `rollcall::audit` naming the rogue.
    fn audit_lines(&self) -> u64 {
        self.logs
            .iter()
            .filter_map(|path| std::fs::read_to_string(path).ok())
            .map(|log| {
                log.lines()
                    .filter(|l| l.contains("rollcall::audit") && l.contains(NODE))
                    .count() as u64
            })
            .sum()
    }
}

/// The attacks made through the rogue's own session (not made when it
/// could not open one).
const SESSION_ATTACKS: [&str; 12] = [
    rogue::REVOKED_CERTIFICATE,
    rogue::TAKE_OVER_INSTANCE,
    rogue::REGISTER_ANOTHER_ADDRESS,
    rogue::REGISTER_ABOVE_WEIGHT_CAP,
    rogue::DRAIN_ANOTHER_NODES_INSTANCE,
    rogue::MARK_ANOTHER_NODES_INSTANCE,
    rogue::DEREGISTER_ANOTHER_NODES_INSTANCE,
    rogue::REPORT_DOWN_IN_ANOTHER_ZONE,
    rogue::REPORT_DOWN_ALONE,
    rogue::UNASKED_WITNESS_ANSWER,
    rogue::SUBSCRIPTION_FLOOD,
    rogue::PROPAGATION_WAIT_FLOOD,
];

/// The rogue's own session with one replica.
struct Session {
    conn: ArbiterConn,
    writer: SessionWriter,
    reader: SessionReader,
    shard: ShardId,
    revision: Revision,
}

#[derive(Default)]
struct Counters {
    refusals: u64,
    witness: u64,
    replays: u64,
}

/// The sum of every sample of `text` whose line starts with `prefix`.
fn sum(text: &str, prefix: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The epoch `victim`'s agent runs under (0 if unreadable: the zone
/// check comes first, and a wrong epoch is refused too).
fn epoch_of(victim: &Victim) -> AgentEpoch {
    AgentEpoch(
        std::fs::read_to_string(&victim.epoch_file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0),
    )
}

/// One request on its own stream, within [`PATIENCE`].
async fn ask(conn: &ArbiterConn, request: &Request) -> Result<Response, String> {
    match tokio::time::timeout(PATIENCE, conn.request(request)).await {
        Ok(answer) => answer.map_err(|e| e.to_string()),
        Err(_) => Err("no answer within 5 s".into()),
    }
}

/// What a lying Hello came to on a connection of its own: refused (a
/// `Refused` message, or the connection closed with a reason), welcomed
/// (a breach), or not made.
async fn hello_outcome(client: &ArbiterClient, arbiter: SocketAddr, hello: &SessionUp) -> Outcome {
    let conn = match tokio::time::timeout(PATIENCE, client.connect(&arbiter.to_string())).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => return Outcome::NotMade(format!("connecting: {e}")),
        Err(_) => return Outcome::NotMade("connecting took over 5 s".into()),
    };
    let answer = tokio::time::timeout(PATIENCE, async {
        let (_writer, mut reader) = conn.open_session(hello).await?;
        reader.next().await
    })
    .await;
    let outcome = match answer {
        Ok(Ok(SessionDown::Refused { reason })) => Outcome::Refused(reason),
        Ok(Ok(SessionDown::Welcome { .. })) => Outcome::Breach("welcomed".into()),
        Ok(Ok(other)) => Outcome::Breach(format!("answered {}", kind(&other))),
        Ok(Err(_)) => match tokio::time::timeout(Duration::from_secs(1), conn.closed()).await {
            Ok(reason) if !reason.is_empty() => Outcome::Refused(format!("closed: {reason}")),
            _ => Outcome::NotMade("the session stream failed without a reason".into()),
        },
        Err(_) => Outcome::NotMade("no answer to the Hello within 5 s".into()),
    };
    conn.close("rogue: done");
    outcome
}

/// A session message's kind, for a breach's words.
fn kind(message: &SessionDown) -> &'static str {
    match message {
        SessionDown::Welcome { .. } => "Welcome",
        SessionDown::Refused { .. } => "Refused",
        SessionDown::Update(_) => "Update",
        _ => "another message",
    }
}
