//! Three arbiter replicas (openraft over QUIC + mTLS on loopback) with real
//! agents: a leader killed during a stream of writes, a minority partition,
//! a wiped follower, two leader changes in a row, and quorum loss.
//!
//! Replicas reach each other through UDP relays the test owns, so a
//! partition drops packets (as a cut link does) instead of closing sockets.
//! Waits are generous; they bound hangs, they are not timing claims (the
//! benchmark `leases/benches/replication.rs` measures times).

mod common;
mod replicas;

use std::collections::HashSet;
use std::time::Duration;

use common::{eventually, Cluster, Http};
use replicas::Group;
use rollcall_leases::client::ArbiterClient;
use rollcall_leases::protocol::{RejectKind, Request, Response, SessionDown, SessionUp};
use rollcall_leases::{AgentEpoch, Label, NodeId, Role};
use rollcall_node::process::{self, AgentHandle};
use serde_json::Value;

/// The order of `addrs` that makes an agent for `node` start on `first`
/// (agents start at a place fixed by their node id, then move on).
fn starting_at(node: &str, addrs: &[String], first: usize) -> Vec<String> {
    let start = xxhash_rust::xxh3::xxh3_64(node.as_bytes()) as usize % addrs.len();
    let mut order: Vec<String> = addrs.to_vec();
    order.swap(start, first);
    order
}

async fn counter(handle: &AgentHandle, name: &str) -> f64 {
    handle
        .agent
        .metrics_text()
        .await
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Audit revisions are 1, 2, …, n with no gap.
fn assert_contiguous(audit: &[Value]) {
    let revisions: Vec<u64> = audit
        .iter()
        .map(|e| e["revision"].as_u64().unwrap())
        .collect();
    let expected: Vec<u64> = (1..=revisions.len() as u64).collect();
    assert_eq!(revisions, expected, "revisions are contiguous");
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn killing_the_leader_during_writes_loses_no_acknowledged_write_and_agents_resume_by_delta() {
    let mut group = Group::start(|_| {}).await;
    let leader = group.leader().await;

    // The writer stays on a follower; the watcher starts on the leader.
    let follower = (leader + 1) % 3;
    let writer = group
        .agent_on(
            "writer",
            starting_at("writer", &group.quic_addrs(), follower),
        )
        .await;
    let watcher = group
        .agent_on(
            "watcher",
            starting_at("watcher", &group.quic_addrs(), leader),
        )
        .await;
    let (w, v) = (Http::of(&writer), Http::of(&watcher));
    w.wait_connected().await;
    v.wait_connected().await;
    assert_eq!(
        v.status().await["arbiter"]["address"],
        group.quic_addrs()[leader],
        "the watcher's session is on the leader"
    );
    let (status, _) = w.register("web", "web-0", 9000).await;
    assert_eq!(status, 200);
    eventually("the watcher sees web-0", || async {
        v.ready_ids("web").await.filter(|ids| ids.len() == 1)
    })
    .await;
    let snapshots_before = counter(&watcher, "rollcall_agent_snapshots_applied_total").await;

    let mut acknowledged = Vec::new();
    let mut pending = Vec::new();
    for i in 1..=40u16 {
        if i == 15 {
            group.stop_replica(leader).await;
        }
        let id = format!("web-{i}");
        let (status, body) = w.register("web", &id, 9000 + i).await;
        match status {
            200 => acknowledged.push(id),
            202 => pending.push(id),
            other => panic!("registration {id} answered {other}: {body}"),
        }
    }
    let new_leader = group.leader_seen_by(follower).await;
    assert_ne!(new_leader, leader, "a new leader took over");
    assert!(
        acknowledged.len() >= 14,
        "writes before the kill were acknowledged"
    );

    // Pending writes go through once the new leader is there; every write
    // reaches the watcher, which moved to a surviving replica.
    eventually("all 41 instances are READY at the watcher", || async {
        v.ready_ids("web").await.filter(|ids| ids.len() == 41)
    })
    .await;
    assert!(v.connected().await);
    assert_ne!(
        v.status().await["arbiter"]["address"],
        group.quic_addrs()[leader]
    );
    assert!(counter(&watcher, "rollcall_agent_reconnects_total").await >= 1.0);
    assert_eq!(
        counter(&watcher, "rollcall_agent_snapshots_applied_total").await,
        snapshots_before,
        "the watcher resumed by delta on the other replica, no snapshot"
    );

    // No acknowledged write is lost and revisions are contiguous on both
    // survivors, which agree entry by entry.
    let survivors: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    let audits = [
        group.audit(survivors[0]).await,
        group.audit(survivors[1]).await,
    ];
    for audit in &audits {
        assert_contiguous(audit);
        let registered: HashSet<&str> = audit
            .iter()
            .filter(|e| e["command"] == "register")
            .map(|e| e["instance"].as_str().unwrap())
            .collect();
        for id in acknowledged.iter().chain(&pending) {
            assert!(registered.contains(id.as_str()), "{id} is in the log");
        }
    }
    let last = |a: &[Value]| a.last().unwrap()["revision"].as_u64().unwrap();
    eventually("survivors applied the same log", || async {
        let a = group.audit(survivors[0]).await;
        let b = group.audit(survivors[1]).await;
        (last(&a) == last(&b) && a == b).then_some(())
    })
    .await;
    writer.shutdown().await;
    watcher.shutdown().await;
    for i in survivors {
        group.stop_replica(i).await;
    }
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn a_minority_partition_refuses_writes_while_the_majority_accepts_them() {
    let group = Group::start(|_| {}).await;
    let leader = group.leader().await;
    let others: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    // One agent writes through the old leader, one through a majority replica.
    let minority = group
        .agent_on("minority", vec![group.quic_addrs()[leader].clone()])
        .await;
    let majority = group
        .agent_on("majority", vec![group.quic_addrs()[others[0]].clone()])
        .await;
    let (m1, m2) = (Http::of(&minority), Http::of(&majority));
    m1.wait_connected().await;
    m2.wait_connected().await;
    assert_eq!(m1.register("api", "api-0", 7000).await.0, 200);

    group.isolate(leader);
    let new_leader = eventually("the majority elects a new leader", || async {
        let seen = group.leader_seen_by(others[0]).await;
        (seen != leader).then_some(seen)
    })
    .await;
    assert!(others.contains(&new_leader));

    // The majority commits; the isolated old leader cannot, and says so.
    let (status, body) = m2.register("api", "api-1", 7001).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = m1.register("api", "api-2", 7002).await;
    assert_eq!(status, 202, "kept pending, not committed: {body}");
    assert_eq!(body["pending"], true);
    let registered = |audit: &[Value], id: &str| {
        audit
            .iter()
            .any(|e| e["command"] == "register" && e["instance"] == id)
    };
    let audit = group.audit(others[0]).await;
    assert!(registered(&audit, "api-1"));
    assert!(!registered(&audit, "api-2"));

    // Healed: the old leader follows, and the pending write goes through.
    group.heal();
    eventually(
        "the pending write commits after the partition heals",
        || async {
            let audit = group.audit(others[1]).await;
            registered(&audit, "api-2").then_some(())
        },
    )
    .await;
    let audit = group.audit(others[0]).await;
    assert_contiguous(&audit);
    minority.shutdown().await;
    majority.shutdown().await;
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn a_wiped_follower_rejoins_from_a_snapshot() {
    let mut group = Group::start(|c| c.store.compact_every = 20).await;
    let leader = group.leader().await;
    // Replica 1 initializes new groups, so wipe another one.
    let wiped = (1..3).find(|i| *i != leader).unwrap();
    let writer = group.agent("writer").await;
    let w = Http::of(&writer);
    w.wait_connected().await;
    for i in 0..60u16 {
        let (status, body) = w.register("db", &format!("db-{i}"), 5000 + i).await;
        assert_eq!(status, 200, "{body}");
    }
    group.stop_replica(wiped).await;
    std::fs::remove_dir_all(&group.configs[wiped].data_dir).unwrap();
    // Written while it is gone, so it must catch up past a purged log.
    for i in 60..80u16 {
        let (status, body) = w.register("db", &format!("db-{i}"), 5000 + i).await;
        assert_eq!(status, 200, "{body}");
    }
    group.start_replica(wiped).await;
    let leader_revision = group.admin(leader).revision().await;
    eventually("the wiped replica caught up", || async {
        (group.admin(wiped).revision().await == leader_revision).then_some(())
    })
    .await;
    let raft = group.servers[wiped].as_ref().unwrap().raft().clone();
    let metrics = raft.metrics().borrow().clone();
    assert!(
        metrics.snapshot.is_some(),
        "it holds a snapshot: it caught up from one"
    );
    let status = group.admin(wiped).status().await;
    assert_eq!(status["services"], 1);
    assert_eq!(
        status["raft"]["members"].as_array().unwrap().len(),
        3,
        "it knows the group"
    );
    writer.shutdown().await;
}

/// Issue 34: a replica whose host dies says nothing (no CONNECTION_CLOSE,
/// no ICMP). An agent on it notices when a message it sends (its next
/// renewal) gets nothing back within `agent.arbiter_silence_ms`, not at
/// the 10 s QUIC idle timeout, says so in `/v1/status`, and resumes on
/// another replica.
#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn an_agent_whose_replica_goes_silent_ends_the_session_at_its_silence_check_and_moves_on() {
    let mut group = Group::start(|c| c.lease.ttl_ms = 3_000).await;
    let leader = group.leader().await;
    let silent = (leader + 1) % 3;
    let relays = group.relay_addrs();
    let watcher = group
        .agent_on("watcher", starting_at("watcher", &relays, silent))
        .await;
    let writer = group
        .agent_on("writer", starting_at("writer", &relays, leader))
        .await;
    let (v, w) = (Http::of(&watcher), Http::of(&writer));
    v.wait_connected().await;
    w.wait_connected().await;
    assert_eq!(v.status().await["arbiter"]["address"], relays[silent]);
    let (status, body) = w.register("web", "web-0", 9000).await;
    assert_eq!(status, 200, "{body}");
    eventually("the watcher sees web-0", || async {
        v.ready_ids("web").await.filter(|ids| ids.len() == 1)
    })
    .await;
    assert_eq!(v.status().await["arbiter"]["last_end"], Value::Null);

    // The watcher's replica goes silent; the two others keep a quorum.
    group.isolate(silent);
    let (status, body) = w.register("web", "web-1", 9001).await;
    assert_eq!(status, 200, "{body}");
    eventually("the watcher, on another replica, sees web-1", || async {
        v.ready_ids("web").await.filter(|ids| ids.len() == 2)
    })
    .await;
    let status = v.status().await;
    assert_ne!(status["arbiter"]["address"], relays[silent], "{status}");
    let ended = status["arbiter"]["last_end"].as_str().unwrap_or_default();
    assert!(
        ended.contains("sent nothing back within agent.arbiter_silence_ms (1500 ms)"),
        "the session ended at the silence check, not the idle timeout: {status}"
    );
    writer.shutdown().await;
    watcher.shutdown().await;
    group.heal();
    for i in 0..3 {
        group.stop_replica(i).await;
    }
}

/// Opens a session as node `reporter` on replica `on` and reports `node`
/// down, as an agent whose gossip lost sight of it would.
async fn report_down(group: &Group, on: usize, node: &str, epoch: AgentEpoch) -> Response {
    let reporter = "reporter";
    let client = ArbiterClient::new(&Cluster::material(&group.ca, Role::Agent, reporter)).unwrap();
    let conn = client.connect(&group.quic_addrs()[on]).await.unwrap();
    let hello = SessionUp::Hello {
        node: NodeId::new(reporter).unwrap(),
        epoch: AgentEpoch(1),
        // The agents' zone (the default, z1): only a node of the
        // reported node's zone may report it down.
        zone: Label::new("z1").unwrap(),
        addresses: vec![std::net::IpAddr::from([127, 0, 0, 1])],
    };
    let (_writer, mut reader) = conn.open_session(&hello).await.unwrap();
    let welcome = reader.next().await.unwrap();
    assert!(
        matches!(welcome, SessionDown::Welcome { .. }),
        "{welcome:?}"
    );
    let answer = conn
        .request(&Request::ReportDown {
            node: NodeId::new(node).unwrap(),
            epoch,
        })
        .await
        .unwrap();
    let left = conn
        .request(&Request::Leave {
            epoch: AgentEpoch(1),
        })
        .await
        .unwrap();
    assert!(matches!(left, Response::Committed { .. }), "{left:?}");
    conn.close("done");
    answer
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn two_leader_changes_expire_no_renewing_lease_and_accept_no_down_verdict_about_a_live_agent()
{
    let mut group = Group::start(|c| {
        c.lease.ttl_ms = 3_000;
        // The down report below makes the replica holding a2's session
        // probe it (a follower hears of the probe with its next heard
        // report, every sweep): an answer is a partition (refused), none
        // within probe_timeout_ms would accept it. 1.5 s leaves room for
        // a loaded machine; the 4 s sleep is still past a TTL.
        c.lease.probe_timeout_ms = 1_500;
        c.lease.sweep_interval_ms = 100;
    })
    .await;
    let nodes = ["a1", "a2", "a3"];
    let mut agents = Vec::new();
    for node in nodes {
        let mut config = group.agent_config(node, group.quic_addrs());
        config.keepalive_ms = 200;
        // An agent that tries the stopped replica first after a change
        // gives up on it quickly (loopback): with the 2 s default, a loaded
        // machine could leave it without a session past the 3 s TTL here,
        // and its lease would rightly expire (a CI run saw 10 s before
        // the connect timeout existed).
        config.connect_timeout_ms = 500;
        let tls = Cluster::material(&group.ca, Role::Agent, node);
        agents.push(process::start(config, Some(&tls)).await.unwrap());
    }
    for (i, agent) in agents.iter().enumerate() {
        let http = Http::of(agent);
        http.wait_connected().await;
        assert_eq!(
            http.register("cart", &format!("cart-{i}"), 6000 + i as u16)
                .await
                .0,
            200
        );
    }

    for change in 0..2 {
        let leader = group.leader().await;
        group.stop_replica(leader).await;
        let survivor = (leader + 1) % 3;
        // Both running replicas agree on the new leader (the stopped one
        // cannot be it): a follower that does not know it yet cannot hand
        // it the sessions it hears, and the leader would count those as
        // silent from the moment it took office.
        let next = group.leader().await;
        assert_ne!(next, leader);
        // Every agent's session is back, on a replica that runs: until
        // then the new leader rightly counts a2 as silent from the moment
        // it took office, and on a loaded machine a reconnect can take
        // longer than `probe_timeout_ms` (a CI run of the whole workspace
        // saw the report below accepted while a2 was still reconnecting).
        let stopped = group.quic_addrs()[leader].clone();
        for agent in &agents {
            let http = Http::of(agent);
            eventually(
                "the agent's session is back on a running replica",
                || async {
                    let arbiter = &http.status().await["arbiter"];
                    (arbiter["connected"] == true && arbiter["address"] != stopped.as_str())
                        .then_some(())
                },
            )
            .await;
        }
        // Soon after the election, a down report about a live agent (as a
        // gossip peer that lost sight of it would send).
        let answer = report_down(&group, survivor, "a2", agents[1].agent.epoch()).await;
        assert!(
            matches!(
                &answer,
                Response::Rejected { kind: RejectKind::Invalid, message } if message.contains("alive")
            ),
            "change {change}: the down report about live a2 is refused: {answer:?}"
        );
        let leases_before: u64 = group.admin(next).status().await["leases"].as_u64().unwrap();
        assert_eq!(leases_before, 3, "change {change}: every lease is there");
        // Longer than a TTL, so a lease nobody renewed would expire.
        tokio::time::sleep(Duration::from_millis(4_000)).await;
        group.start_replica(leader).await;
        let _ = group.leader().await;
    }

    let leader = group.leader().await;
    let audit = group.audit(leader).await;
    let ended: Vec<&Value> = audit
        .iter()
        .filter(|e| {
            let c = e["command"].as_str().unwrap();
            (c == "expire-lease" || c == "node-down")
                && !e["detail"].as_str().unwrap().contains("reporter")
        })
        .collect();
    assert!(
        ended.is_empty(),
        "no lease expired, no node marked down: {ended:?}"
    );
    let status = group.admin(leader).status().await;
    assert_eq!(status["leases"], 3);
    assert_eq!(status["held_leases"], 0);
    let viewer = Http::of(&agents[1]);
    eventually("every instance stays READY", || async {
        viewer.ready_ids("cart").await.filter(|ids| ids.len() == 3)
    })
    .await;
    for agent in agents {
        agent.shutdown().await;
    }
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn without_quorum_agents_serve_their_cache_keep_writes_pending_and_send_them_when_it_returns()
{
    let mut group = Group::start(|_| {}).await;
    let _ = group.leader().await;
    let agent = group.agent("solo").await;
    let http = Http::of(&agent);
    http.wait_connected().await;
    assert_eq!(http.register("pay", "pay-0", 4000).await.0, 200);

    // Two of three replicas gone: no quorum.
    let connected_to = http.status().await["arbiter"]["address"]
        .as_str()
        .unwrap()
        .to_owned();
    let keep = group
        .quic_addrs()
        .iter()
        .position(|a| *a == connected_to)
        .unwrap();
    for i in (0..3).filter(|i| *i != keep) {
        group.stop_replica(i).await;
    }
    // The cache still answers while writes are refused and kept pending.
    let (status, body) = http.register("pay", "pay-1", 4001).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(http.ready_ids("pay").await.unwrap(), vec!["pay-0"]);
    let (status, body) = http.resolve("pay").await;
    assert_eq!(status, 200, "{body}");

    for i in (0..3).filter(|i| *i != keep) {
        group.start_replica(i).await;
    }
    eventually(
        "the pending registration commits once quorum is back",
        || async { http.ready_ids("pay").await.filter(|ids| ids.len() == 2) },
    )
    .await;
    agent.shutdown().await;
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn an_agent_certificate_cannot_speak_raft() {
    let group = Group::start(|_| {}).await;
    let _ = group.leader().await;
    let agent_tls = Cluster::material(&group.ca, Role::Agent, "intruder");
    let peers = rollcall_leases::server::peer::Peers::new(
        &rollcall_leases::tls::LiveTls::new(&agent_tls).unwrap(),
        Label::new("r1").unwrap(),
    )
    .unwrap();
    let vote = rollcall_leases::peer_protocol::PeerRequest::Heard(Vec::new());
    let answer = peers
        .call(&group.quic_addrs()[0], &vote, Duration::from_secs(5))
        .await;
    // The replica treats an agent certificate as an agent: a peer frame is
    // a protocol error that closes the connection, and nothing answers it.
    let err = answer.expect_err("an agent must get no answer to a peer request");
    assert!(
        err.to_string().contains("expected a request frame"),
        "the connection closed as a protocol error: {err}"
    );
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn membership_changes_sent_to_a_follower_reach_the_leader() {
    let group = Group::start(|_| {}).await;
    let leader = group.leader().await;
    let follower = (leader + 1) % 3;
    let removed = (leader + 2) % 3;
    let admin = group.admin(follower);
    let voters = |body: &Value| -> Vec<u64> {
        body["members"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["voter"] == true)
            .map(|m| m["id"].as_u64().unwrap())
            .collect()
    };
    let response = admin
        .client
        .delete(format!("{}/v1/cluster/members/{}", admin.base, removed + 1))
        .bearer_auth(&admin.token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let (_, body) = group.admin(leader).get("/v1/cluster").await;
    assert_eq!(voters(&body).len(), 2, "{body}");
    assert!(!voters(&body).contains(&(removed as u64 + 1)));

    let response = admin
        .client
        .post(format!("{}/v1/cluster/members", admin.base))
        .bearer_auth(&admin.token)
        .json(
            &serde_json::json!({"id": removed + 1, "addr": group.relays[removed].addr.to_string()}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let (_, body) = group.admin(leader).get("/v1/cluster").await;
    assert_eq!(voters(&body).len(), 3, "{body}");

    // An unknown replica cannot be removed.
    let response = admin
        .client
        .delete(format!("{}/v1/cluster/members/9", admin.base))
        .bearer_auth(&admin.token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);

    // A bad body changes nothing and says what is wrong.
    let response = admin
        .client
        .post(format!("{}/v1/cluster/members", admin.base))
        .bearer_auth(&admin.token)
        .json(&serde_json::json!({"id": 9, "addr": "no-port"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let detail: Value = response.json().await.unwrap();
    assert!(
        detail["detail"].as_str().unwrap().contains("addr"),
        "{detail}"
    );
    let (_, body) = group.admin(leader).get("/v1/cluster").await;
    assert_eq!(body["members"].as_array().unwrap().len(), 3);
}
