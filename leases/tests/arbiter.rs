//! The arbiter over real QUIC on loopback, spoken to with raw protocol
//! clients: the snapshot bound under a reconnect storm, and malformed or
//! oversize frames.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use rollcall_leases::client::ArbiterClient;
use rollcall_leases::codec::{decode_service_snapshot, FORMAT_VERSION};
use rollcall_leases::identity::Identity;
use rollcall_leases::protocol::{
    RejectKind, Request, Response, ServiceUpdate, SessionDown, SessionUp,
};
use rollcall_leases::server::ArbiterServer;
use rollcall_leases::tls::{self, Ca, TlsMaterial};
use rollcall_leases::{
    AgentEpoch, InstanceId, Label, NodeId, PrincipalName, Registration, Role, ServiceView, State,
    Version, Weight,
};

mod quic;
use quic::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_storm_never_exceeds_the_snapshot_bound_and_everyone_converges() {
    const AGENTS: usize = 200;
    const BOUND: u32 = 4;
    let ca = Ca::generate(&Label::new("r1").unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = arbiter(&ca, dir.path(), |c| {
        c.distribution.max_concurrent_snapshots = BOUND;
        c.distribution.snapshot_retry_ms = 20;
    })
    .await;
    let addr = server.quic_addr.to_string();

    // One agent fills the service.
    let (conn, _w, _r) = seed_session(&ca, &server).await;
    for i in 0..50u8 {
        let reg = seed_registration(&format!("web-{i}"), Ipv4Addr::new(10, 0, 0, i));
        assert!(matches!(
            conn.request(&Request::Register(reg)).await.unwrap(),
            Response::Committed { .. }
        ));
    }

    // 200 agents open sessions, then all ask for a snapshot at once.
    let mut sessions = Vec::new();
    for i in 0..AGENTS {
        let node = format!("node-{i}");
        let client = ArbiterClient::new(&material(&ca, Role::Agent, &node)).unwrap();
        let conn = client.connect(&addr).await.unwrap();
        let hello = SessionUp::Hello {
            node: NodeId::new(&node).unwrap(),
            epoch: AgentEpoch(1),
            zone: Label::new("z1").unwrap(),
            addresses: vec![std::net::IpAddr::from([127, 0, 0, 1])],
        };
        let (w, mut r) = conn.open_session(&hello).await.unwrap();
        assert!(matches!(
            r.next().await.unwrap(),
            SessionDown::Welcome { .. }
        ));
        sessions.push((client, conn, w, r));
    }
    let expected = revision(&server).await;
    let start = Arc::new(tokio::sync::Barrier::new(AGENTS));
    let mut tasks = Vec::new();
    for (client, conn, mut w, mut r) in sessions {
        let start = start.clone();
        tasks.push(tokio::spawn(async move {
            let _keep = (client, conn);
            start.wait().await;
            w.send(&SessionUp::Subscribe {
                shard: rollcall_leases::ShardId(0),
                service: service(),
                have: None,
            })
            .await
            .unwrap();
            let mut retries = 0u32;
            loop {
                let SessionDown::Update(items) = r.next().await.unwrap() else {
                    continue;
                };
                for item in items {
                    match item {
                        ServiceUpdate::Snapshot(bytes) => {
                            return (
                                ServiceView::from_snapshot(
                                    &decode_service_snapshot(&bytes).unwrap(),
                                )
                                .unwrap(),
                                retries,
                            )
                        }
                        ServiceUpdate::RetryAfter { ms, .. } => {
                            retries += 1;
                            tokio::time::sleep(Duration::from_millis(
                                ms + rand::random_range(0..=ms),
                            ))
                            .await;
                            w.send(&SessionUp::Subscribe {
                                shard: rollcall_leases::ShardId(0),
                                service: service(),
                                have: None,
                            })
                            .await
                            .unwrap();
                        }
                        other => panic!("unexpected {other:?}"),
                    }
                }
            }
        }));
    }
    let mut retries = 0;
    let mut digests = HashSet::new();
    for task in tasks {
        let (view, r) = tokio::time::timeout(PATIENCE, task)
            .await
            .expect("every agent converges")
            .unwrap();
        assert_eq!(view.ready().count(), 50);
        digests.insert(view.digest());
        retries += r;
    }
    assert_eq!(digests.len(), 1, "every agent holds the same service");
    let max_seen = metric(&server, "rollcall_arbiter_snapshots_in_flight_max").await;
    assert!(
        max_seen <= f64::from(BOUND),
        "at most {BOUND} snapshots in flight, saw {max_seen}"
    );
    assert_eq!(
        revision(&server).await,
        expected,
        "subscribing changes nothing"
    );
    println!(
        "{AGENTS} agents converged; most snapshots in flight {max_seen}; {retries} retry answers"
    );
    server.shutdown().await;
}

/// Connects with an agent certificate and returns the raw QUIC connection.
async fn raw(ca: &Ca, server: &ArbiterServer) -> quinn::Connection {
    let config = tls::client_config(&material(ca, Role::Agent, "node-x")).unwrap();
    let mut endpoint = quinn::Endpoint::client(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
    endpoint.set_default_client_config(config);
    endpoint
        .connect(server.quic_addr, "localhost")
        .unwrap()
        .await
        .unwrap()
}

async fn closed_with_protocol_error(conn: &quinn::Connection) -> String {
    match tokio::time::timeout(PATIENCE, conn.closed())
        .await
        .expect("the arbiter closes the connection")
    {
        quinn::ConnectionError::ApplicationClosed(close) => {
            assert_eq!(
                close.error_code,
                quinn::VarInt::from_u32(3),
                "protocol-error close code"
            );
            String::from_utf8_lossy(&close.reason).into_owned()
        }
        other => panic!("closed otherwise: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_frame_closes_the_connection_and_changes_nothing() {
    let ca = Ca::generate(&Label::new("r1").unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = arbiter(&ca, dir.path(), |_| {}).await;
    let before = revision(&server).await;
    let conn = raw(&ca, &server).await;
    let (mut send, _recv) = conn.open_bi().await.unwrap();
    // A session frame whose body is not a valid message.
    let body = [FORMAT_VERSION, 5, 0xff, 0xff, 0xff];
    send.write_all(&(body.len() as u32).to_be_bytes())
        .await
        .unwrap();
    send.write_all(&body).await.unwrap();
    let reason = closed_with_protocol_error(&conn).await;
    assert!(reason.contains("malformed"), "{reason}");
    assert_eq!(revision(&server).await, before);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_frame_is_refused_before_it_is_read() {
    let ca = Ca::generate(&Label::new("r1").unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = arbiter(&ca, dir.path(), |_| {}).await;
    let before = revision(&server).await;
    let conn = raw(&ca, &server).await;
    let (mut send, _recv) = conn.open_bi().await.unwrap();
    send.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
    let reason = closed_with_protocol_error(&conn).await;
    assert!(reason.contains("limit"), "{reason}");
    assert_eq!(revision(&server).await, before);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_must_start_with_hello_for_the_certificates_node() {
    let ca = Ca::generate(&Label::new("r1").unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = arbiter(&ca, dir.path(), |_| {}).await;
    let before = revision(&server).await;
    let client = ArbiterClient::new(&material(&ca, Role::Agent, "node-a")).unwrap();
    let conn = client.connect(&server.quic_addr.to_string()).await.unwrap();
    let hello = SessionUp::Hello {
        node: NodeId::new("node-b").unwrap(),
        epoch: AgentEpoch(1),
        zone: Label::new("z1").unwrap(),
        addresses: vec![std::net::IpAddr::from([127, 0, 0, 1])],
    };
    let (_w, mut r) = conn.open_session(&hello).await.unwrap();
    match r.next().await.unwrap() {
        SessionDown::Refused { reason } => assert!(reason.contains("node-a"), "{reason}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(revision(&server).await, before, "no lease was granted");
    // An operator certificate cannot hold a lease either.
    let operator = ArbiterClient::new(&material(&ca, Role::Operator, "ops")).unwrap();
    let conn = operator
        .connect(&server.quic_addr.to_string())
        .await
        .unwrap();
    let hello = SessionUp::Hello {
        node: NodeId::new("ops").unwrap(),
        epoch: AgentEpoch(1),
        zone: Label::new("z1").unwrap(),
        addresses: vec![std::net::IpAddr::from([127, 0, 0, 1])],
    };
    let (_w, mut r) = conn.open_session(&hello).await.unwrap();
    assert!(matches!(
        r.next().await.unwrap(),
        SessionDown::Refused { .. }
    ));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_from_another_ca_gets_nothing() {
    let ca = Ca::generate(&Label::new("r1").unwrap()).unwrap();
    let rogue = Ca::generate(&Label::new("r1").unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = arbiter(&ca, dir.path(), |_| {}).await;
    let before = revision(&server).await;
    // The handshake may appear to succeed client-side (TLS 1.3); the first
    // exchange fails.
    let outcome = async {
        let client = ArbiterClient::new(&material(&rogue, Role::Agent, "node-a")).ok()?;
        let conn = client.connect(&server.quic_addr.to_string()).await.ok()?;
        let hello = SessionUp::Hello {
            node: NodeId::new("node-a").unwrap(),
            epoch: AgentEpoch(1),
            zone: Label::new("z1").unwrap(),
            addresses: vec![std::net::IpAddr::from([127, 0, 0, 1])],
        };
        let (_w, mut r) = conn.open_session(&hello).await.ok()?;
        r.next().await.ok()
    };
    assert!(tokio::time::timeout(PATIENCE, outcome)
        .await
        .expect("the attempt ends")
        .is_none());
    assert_eq!(revision(&server).await, before);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_report_needs_the_arbiters_own_silence_too() {
    let ca = Ca::generate(&Label::new("r1").unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    // A probe waits 2 s for its answer: the answering task may run late on
    // a loaded machine (300 ms failed once in a full run).
    let server = arbiter(&ca, dir.path(), |c| c.lease.probe_timeout_ms = 2_000).await;
    let addr = server.quic_addr.to_string();
    let session = |node: &'static str| {
        let ca = &ca;
        let addr = addr.clone();
        async move {
            let client = ArbiterClient::new(&material(ca, Role::Agent, node)).unwrap();
            let conn = client.connect(&addr).await.unwrap();
            let hello = SessionUp::Hello {
                node: NodeId::new(node).unwrap(),
                epoch: AgentEpoch(7),
                zone: Label::new("z1").unwrap(),
                addresses: vec![std::net::IpAddr::from([127, 0, 0, 1])],
            };
            let (w, mut r) = conn.open_session(&hello).await.unwrap();
            assert!(matches!(
                r.next().await.unwrap(),
                SessionDown::Welcome { .. }
            ));
            (client, conn, w, r)
        }
    };
    let (_ca_client, a, _aw, _ar) = session("node-a").await;
    let (b_client, b, bw, br) = session("node-b").await;
    let reg = Registration {
        instance_id: InstanceId::new("b-web-1").unwrap(),
        service: service(),
        node: NodeId::new("node-b").unwrap(),
        epoch: AgentEpoch(7),
        address: IpAddr::V4(Ipv4Addr::LOCALHOST),
        port: 8080,
        zone: None,
        version: Version::new("v1").unwrap(),
        weight: Weight::DEFAULT,
        labels: Vec::new(),
        initial: State::Ready,
    };
    assert!(matches!(
        b.request(&Request::Register(reg)).await.unwrap(),
        Response::Committed { .. }
    ));
    let report = |epoch| Request::ReportDown {
        node: NodeId::new("node-b").unwrap(),
        epoch: AgentEpoch(epoch),
    };

    // node-b answers the arbiter's probe: gossip alone removes nothing.
    // The report makes the arbiter probe node-b's session, and its answer
    // settles the report as a partition.
    let before = revision(&server).await;
    let answering = tokio::spawn(async move {
        let (mut bw, mut br) = (bw, br);
        loop {
            if let SessionDown::Probe { nonce } = br.next().await.unwrap() {
                bw.send(&SessionUp::Alive { nonce }).await.unwrap();
                return (bw, br);
            }
        }
    });
    match a.request(&report(7)).await.unwrap() {
        Response::Rejected { message, .. } => {
            assert!(message.contains("partition inside the zone"), "{message}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let (bw, br) = answering.await.unwrap();
    assert_eq!(revision(&server).await, before);
    assert!(metric(&server, "rollcall_arbiter_down_reports_ignored_total").await >= 1.0);

    // node-b goes silent (its process is gone; its probe goes unanswered
    // or its connection closes): both signals agree.
    drop((bw, br, b, b_client));
    // A verdict about an older epoch changes nothing.
    assert!(matches!(
        a.request(&report(6)).await.unwrap(),
        Response::Rejected { .. }
    ));
    assert_eq!(revision(&server).await, before);
    assert!(matches!(
        a.request(&report(7)).await.unwrap(),
        Response::Committed {
            revision: Some(_),
            ..
        }
    ));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_every_session_with_a_reason_and_releases_the_store() {
    let ca = Ca::generate(&Label::new("r1").unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = arbiter(&ca, dir.path(), |_| {}).await;
    let before = revision(&server).await;
    let conn = raw(&ca, &server).await;
    let (closed, ()) = tokio::join!(
        tokio::time::timeout(PATIENCE, conn.closed()),
        server.shutdown()
    );
    match closed.expect("the arbiter closes the session") {
        quinn::ConnectionError::ApplicationClosed(close) => {
            assert_eq!(close.error_code, quinn::VarInt::from_u32(0), "normal close");
            assert_eq!(&close.reason[..], b"arbiter shutting down");
        }
        other => panic!("closed otherwise: {other}"),
    }
    // The store is released: the same directory opens again with the
    // catalog it held.
    let again = arbiter(&ca, dir.path(), |_| {}).await;
    assert!(revision(&again).await >= before);
    again.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_in_flight_at_shutdown_are_answered_and_every_committed_one_survives() {
    const WRITERS: u8 = 8;
    const EACH: u8 = 100;
    const BEFORE_STOP: usize = 40;
    let ca = Ca::generate(&Label::new("r1").unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = arbiter(&ca, dir.path(), |_| {}).await;
    let (conn, _w, _r) = seed_session(&ca, &server).await;
    // Writers register one instance after another until an answer is not
    // "committed"; the shutdown starts while they write.
    let commits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..WRITERS {
        let (conn, commits) = (conn.clone(), commits.clone());
        writers.spawn(async move {
            let mut answers = Vec::new();
            for j in 0..EACH {
                let id = format!("web-{w}-{j}");
                let reg = seed_registration(&id, Ipv4Addr::new(10, 0, w, j));
                let answer = conn.request(&Request::Register(reg)).await;
                let committed = matches!(answer, Ok(Response::Committed { .. }));
                answers.push((id, answer));
                if !committed {
                    break;
                }
                commits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            answers
        });
    }
    let start = std::time::Instant::now();
    while commits.load(std::sync::atomic::Ordering::Relaxed) < BEFORE_STOP {
        assert!(
            start.elapsed() < PATIENCE,
            "writes are committed before the shutdown"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let (answers, ()) = tokio::join!(
        tokio::time::timeout(PATIENCE, writers.join_all()),
        server.shutdown()
    );
    let answers: Vec<_> = answers
        .expect("every writer ends: answered or cut off, never left hanging")
        .into_iter()
        .flatten()
        .collect();
    for (id, answer) in &answers {
        match answer {
            Ok(
                Response::Committed { .. }
                | Response::Rejected {
                    kind: RejectKind::Unavailable,
                    ..
                },
            )
            | Err(_) => {}
            Ok(other) => panic!("{id}: an unexpected answer {other:?}"),
        }
    }
    let committed: HashSet<&String> = answers
        .iter()
        .filter(|(_, a)| matches!(a, Ok(Response::Committed { .. })))
        .map(|(id, _)| id)
        .collect();
    assert!(committed.len() >= BEFORE_STOP);
    // Every write answered as committed is in the reopened store's log.
    let again = arbiter(&ca, dir.path(), |_| {}).await;
    let audit = admin_get(&again, "/v1/audit?limit=1000").await;
    let registered: HashSet<String> = audit
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["command"] == "register")
        .filter_map(|e| e["instance"].as_str().map(str::to_owned))
        .collect();
    let lost: Vec<&&String> = committed
        .iter()
        .filter(|id| !registered.contains(**id))
        .collect();
    assert!(
        lost.is_empty(),
        "answered committed but not in the log: {lost:?}"
    );
    again.shutdown().await;
}

/// Issue 22, item 3: the admin API answers the documented JSON error for
/// what the framework rejects (before: a 50 MB policy file got 400, an
/// unknown path and a wrong method an empty body).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_of_the_admin_api_is_the_json_error() {
    let ca = Ca::generate(&Label::new("r1").unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = arbiter(&ca, dir.path(), |_| {}).await;
    let token = std::fs::read_to_string(&server.token_file).unwrap();
    let client = reqwest::Client::new();
    let before = revision(&server).await;
    // A 50 MB policy file, as declared: the server reads up to its 2 MiB
    // limit and answers. The client sends just past the limit, so nothing
    // is left unread when the server closes (unread bytes would make the
    // kernel reset the connection, and the answer could be lost on the way).
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(server.admin_addr)
            .await
            .unwrap();
        let head = format!(
            "PUT /v1/policies HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            token.trim(),
            50 * 1024 * 1024
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        stream
            .write_all(&vec![b' '; 2 * 1024 * 1024 + 1])
            .await
            .unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(PATIENCE, stream.read_to_end(&mut answer))
            .await
            .expect("answered")
            .unwrap();
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 413"), "{text}");
        assert!(
            text.to_lowercase()
                .contains("content-type: application/json"),
            "{text}"
        );
        let body: serde_json::Value =
            serde_json::from_str(text.split("\r\n\r\n").nth(1).unwrap()).unwrap();
        assert_eq!(body["error"], "too_large", "{body}");
    }
    // Method, path, status, code.
    let cases: [(reqwest::Method, &str, u16, &str); 3] = [
        (
            reqwest::Method::GET,
            "/v1/policies/%FF/web",
            400,
            "invalid_request",
        ),
        (reqwest::Method::GET, "/v1/no-such-path", 404, "not_found"),
        (
            reqwest::Method::POST,
            "/v1/status",
            405,
            "method_not_allowed",
        ),
    ];
    for (method, path, want_status, want_code) in cases {
        let req = client
            .request(
                method.clone(),
                format!("http://{}{path}", server.admin_addr),
            )
            .bearer_auth(token.trim());
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let kind = resp.headers().get("content-type").cloned();
        let body: serde_json::Value = resp.json().await.expect("a JSON body");
        assert_eq!(status, want_status, "{method} {path}: {body}");
        assert_eq!(
            kind.as_ref().and_then(|v| v.to_str().ok()),
            Some("application/json")
        );
        assert_eq!(body["error"], want_code, "{method} {path}: {body}");
        assert!(
            body["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{body}"
        );
    }
    assert_eq!(revision(&server).await, before, "nothing changed");
    server.shutdown().await;
}

/// Issue 22, item 4: another region's view cannot ask to stay fresh for
/// ever (`max_age_ms = u64::MAX` was accepted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_view_with_an_unbounded_max_age_is_refused() {
    let ca = Ca::generate(&Label::new("r1").unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = arbiter(&ca, dir.path(), |_| {}).await;
    let token = std::fs::read_to_string(&server.token_file).unwrap();
    let put = |max_age_ms: u64| {
        let body = serde_json::json!({
            "view": {"region": "r2", "version": 1, "as_of_ms": 1, "ingress": ["127.0.0.1:7443"], "summaries": []},
            "heard_ms_ago": 0,
            "max_age_ms": max_age_ms,
        });
        reqwest::Client::new()
            .put(format!("http://{}/v1/remote/r2", server.admin_addr))
            .bearer_auth(token.trim())
            .json(&body)
            .send()
    };
    let resp = put(u64::MAX).await.unwrap();
    assert_eq!(resp.status().as_u16(), 422);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert!(
        body["detail"].as_str().unwrap().contains("max_age_ms"),
        "{body}"
    );
    assert_eq!(
        admin_get(&server, "/v1/remote").await["regions"],
        serde_json::json!([])
    );
    let resp = put(30_000).await.unwrap();
    assert_eq!(resp.status().as_u16(), 200, "{:?}", resp.text().await);
    server.shutdown().await;
}

/// Issue 20, item 3: the arbiter closes a session whose peer certificate
/// expired, with the reason; `/v1/status` and the metrics show the
/// arbiter's own certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_certificate_expires_is_closed_with_the_reason() {
    let (ca, _dir, server) = limited(|_| {}).await;
    let identity = Identity::new(
        Label::new("r1").unwrap(),
        Role::Agent,
        PrincipalName::new("seed").unwrap(),
    );
    let short = ca
        .issue_for(&identity, &[], &[], Duration::from_secs(2))
        .unwrap();
    let (conn, _w, _r) =
        session_of(&TlsMaterial::from_issued(&ca, &short), &server, "seed", 1).await;
    let reason = close_reason(&conn).await;
    assert!(
        reason.contains("rollcall://r1/agent/seed expired at"),
        "{reason}"
    );
    let status = admin_get(&server, "/v1/status").await;
    assert_eq!(status["tls"]["identity"], "rollcall://r1/arbiter/arbiter-1");
    assert!(status["tls"]["leaf"]["not_after"].is_string(), "{status}");
    assert_eq!(status["tls"]["cas"].as_array().map(Vec::len), Some(1));
    let left = metric(
        &server,
        &format!(
            "rollcall_arbiter_certificate_expiry_seconds{{certificate=\"leaf\",serial=\"{}\"}}",
            status["tls"]["leaf"]["serial"].as_str().unwrap()
        ),
    )
    .await;
    assert!(left > 89.0 * 86_400.0, "{left}");
    server.shutdown().await;
}
