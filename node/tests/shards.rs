//! Issue 35: a region's catalog in shards. Three replicas (openraft over
//! QUIC + mTLS on loopback, through the replication tests' relays) each
//! run one Raft group per shard over their one peer transport and their
//! one data directory: the groups start with their leaders spread, every
//! shard commits on its own, a replica's groups come back from its files
//! when it restarts, and leadership spreads again after it returns.
//!
//! Waits bound hangs; they are not timing claims (the `throughput`
//! benchmark and the `shard-leader-kill` scenario measure times).

mod common;
// The fixture serves the replication tests too; this file uses part of it.
#[allow(dead_code)]
mod replicas;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use replicas::Group;
use rollcall_leases::command::{Command, Envelope};
use rollcall_leases::endpoint::{Principal, Role};
use rollcall_leases::name::PrincipalName;
use rollcall_leases::raft::Proposal;
use rollcall_leases::{CatalogId, ShardId};

const SHARDS: u16 = 6;

/// How many shards each replica leads, as replica `from` sees them.
fn leaders_per_replica(group: &Group, from: usize) -> BTreeMap<u64, usize> {
    let shards = group.servers[from].as_ref().unwrap().shards();
    let mut counts = BTreeMap::new();
    for (_, leader) in shards.leaders() {
        if let Some(leader) = leader {
            *counts.entry(leader).or_insert(0) += 1;
        }
    }
    counts
}

/// Waits (bounded by `bound`, a hang guard) until every running replica
/// sees `want` leaders per replica; answers how long it took.
async fn spread(group: &Group, want: &[(u64, usize)], bound: Duration) -> Duration {
    let running: Vec<usize> = (0..3).filter(|i| group.servers[*i].is_some()).collect();
    spread_seen_by(group, &running, want, bound).await
}

/// As `spread`, as replicas `from` see it.
async fn spread_seen_by(
    group: &Group,
    from: &[usize],
    want: &[(u64, usize)],
    bound: Duration,
) -> Duration {
    let want: BTreeMap<u64, usize> = want.iter().copied().collect();
    let started = Instant::now();
    loop {
        let seen: Vec<BTreeMap<u64, usize>> = from
            .iter()
            .map(|i| leaders_per_replica(group, *i))
            .collect();
        if seen.iter().all(|s| *s == want) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < bound,
            "leaders per replica {seen:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Commits an identity on shard `shard` through its leader, and answers
/// the revision it got.
async fn write(group: &Group, shard: u16, catalog: u64) -> u64 {
    let from = (0..3).find(|i| group.servers[*i].is_some()).unwrap();
    let leader = group.servers[from].as_ref().unwrap().shards().leaders()[usize::from(shard)]
        .1
        .expect("the shard has a leader");
    let server = group.servers[leader as usize - 1].as_ref().unwrap();
    let raft = &server.shards().get(ShardId(shard)).unwrap().raft;
    let envelope = Envelope {
        at_ms: 1,
        actor: Principal {
            role: Role::Operator,
            name: PrincipalName::new("shards-test").unwrap(),
        },
        command: Command::Identify {
            catalog: CatalogId(catalog),
        },
    };
    let written = raft.client_write(Proposal::one(envelope)).await.unwrap();
    written.data.revision.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn six_shards_on_three_replicas_spread_their_leaders_commit_alone_and_come_back() {
    let mut group = Group::start(|c| c.catalog.shards = SHARDS).await;
    let took = spread(&group, &[(1, 2), (2, 2), (3, 2)], Duration::from_secs(60)).await;
    println!("leaders 2/2/2 {} ms after start", took.as_millis());

    // Every shard commits in its own group: its own revisions, its own
    // identity, on every replica's copy of that shard alone.
    for shard in 0..SHARDS {
        let revision = write(&group, shard, 0x5000 + u64::from(shard)).await;
        assert!(
            revision >= 1,
            "shard {shard} committed at revision {revision}"
        );
    }
    common::eventually("every replica applied every shard's write", || async {
        (0..3)
            .all(|i| {
                let shards = group.servers[i].as_ref().unwrap().shards();
                (0..SHARDS).all(|s| {
                    let identity = shards.get(ShardId(s)).unwrap().catalog.lock().identity();
                    // Shard 0's core names its catalog first; the others
                    // take the test's.
                    identity.is_some()
                        && (s == 0 || identity == Some(CatalogId(0x5000 + u64::from(s))))
                })
            })
            .then_some(())
    })
    .await;

    // The audit log merges every shard's entries, each naming its shard.
    let (status, rows) = group.admin(0).get("/v1/audit?limit=10000").await;
    assert_eq!(status, 200, "{rows}");
    let shards_seen: std::collections::BTreeSet<u64> = rows
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["command"] == "identify")
        .map(|r| r["shard"].as_u64().unwrap())
        .collect();
    assert_eq!(shards_seen, (0..u64::from(SHARDS)).collect());

    // Replica 3 stops: the two left lead every shard between them.
    group.stop_replica(2).await;
    let took = spread(&group, &[(1, 3), (2, 3)], Duration::from_secs(60)).await;
    println!(
        "leaders 3/3 {} ms after replica 3 stopped",
        took.as_millis()
    );
    for shard in 0..SHARDS {
        write(&group, shard, 1).await;
    }

    // It returns with every group from its files, catches up, and leads
    // its share again.
    group.start_replica(2).await;
    let took = spread(&group, &[(1, 2), (2, 2), (3, 2)], Duration::from_secs(60)).await;
    println!(
        "leaders 2/2/2 {} ms after replica 3 returned",
        took.as_millis()
    );
    let applied = |i: usize, s: u16| {
        let shards = group.servers[i].as_ref().unwrap().shards();
        let catalog = &shards.get(ShardId(s)).unwrap().catalog;
        let revision = catalog.mark().revision;
        (revision, catalog.lock().identity())
    };
    common::eventually("the returned replica caught up on every shard", || async {
        (0..SHARDS)
            .all(|s| applied(2, s) == applied(0, s))
            .then_some(())
    })
    .await;
    for s in 1..SHARDS {
        assert_eq!(applied(2, s).1, Some(CatalogId(0x5000 + u64::from(s))));
    }
    for i in 0..3 {
        group.stop_replica(i).await;
    }
}

/// The voters of every shard's group, as replica `i`'s `/v1/cluster` shows.
async fn voters_per_shard(group: &Group, i: usize) -> Vec<Vec<u64>> {
    let (status, body) = group.admin(i).get("/v1/cluster").await;
    assert_eq!(status, 200, "{body}");
    body["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|shard| {
            shard["raft"]["members"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["voter"] == true)
                .map(|m| m["id"].as_u64().unwrap())
                .collect()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_membership_change_reaches_every_shards_group_whoever_leads_it() {
    let group = Group::start(|c| c.catalog.shards = SHARDS).await;
    spread(&group, &[(1, 2), (2, 2), (3, 2)], Duration::from_secs(60)).await;
    // Replica 3 leads two shards: removing it goes through shard 0's
    // leader to each shard's leader, replica 3 itself among them.
    let (status, body) = group.admin(1).delete("/v1/cluster/members/3").await;
    assert_eq!(status, 200, "{body}");
    common::eventually("every shard's group lost replica 3", || async {
        let all = voters_per_shard(&group, 0).await;
        (all.len() == usize::from(SHARDS) && all.iter().all(|v| *v == [1, 2])).then_some(())
    })
    .await;
    // Its shards are led by the two left, within their share (the removed
    // replica, still running, follows no group).
    spread_seen_by(&group, &[0, 1], &[(1, 3), (2, 3)], Duration::from_secs(60)).await;

    let admin = group.admin(0);
    let response = admin
        .client
        .post(format!("{}/v1/cluster/members", admin.base))
        .bearer_auth(&admin.token)
        .json(&serde_json::json!({"id": 3, "addr": group.relays[2].addr.to_string()}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let all = voters_per_shard(&group, 0).await;
    assert!(all.iter().all(|v| *v == [1, 2, 3]), "{all:?}");
}

#[tokio::test]
async fn a_replica_refuses_a_store_made_for_another_shard_count() {
    let dir = tempfile::tempdir().unwrap();
    let ca =
        rollcall_leases::tls::Ca::generate(&rollcall_leases::Label::new("r1").unwrap()).unwrap();
    let tls = common::Cluster::material(&ca, Role::Arbiter, "arbiter-1");
    let mut config = rollcall_config::ArbiterConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.path().join("arbiter-1"),
        ..Default::default()
    };
    config.catalog.shards = 4;
    let server = rollcall_leases::server::ArbiterServer::start(config.clone(), &tls)
        .await
        .unwrap();
    assert_eq!(server.shards().count(), 4);
    // A group of one leads every shard.
    assert!(server
        .shards()
        .leaders()
        .iter()
        .all(|(_, l)| *l == Some(server.replica_id)));
    server.shutdown().await;
    config.catalog.shards = 2;
    let err = match rollcall_leases::server::ArbiterServer::start(config, &tls).await {
        Ok(_) => panic!("a store made for 4 shards opened with 2"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("made for a catalog of 4 shard(s)")
            && err.contains("arbiter.catalog.shards is 2"),
        "{err}"
    );
}
