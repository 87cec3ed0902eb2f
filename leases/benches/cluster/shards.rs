//! Writers straight into each shard's Raft group (issue 35): the shards'
//! group commits with no agent session in front (each write a service
//! policy change of the writer's own service: policies are the catalog's
//! changes no lease fences, so shard 0's replica machine, which expires
//! leases without sessions, leaves them alone), so the figure is what K
//! groups per replica (K store files, K writer threads, one QUIC peer
//! transport) commit, without the core that serves shard 0's sessions.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rollcall_leases::raft::Proposal;
use rollcall_leases::server::shards::ShardGroup;
use rollcall_leases::{Command, Envelope, Policy, Principal, PrincipalName, Role, ShardId};

use super::{Group, Load};

/// Every shard has a leader every running replica agrees on, and no
/// replica leads more than ceil(K / replicas): the leaders of each shard,
/// by replica index.
pub async fn placed(group: &Group, shards: u16) -> Vec<usize> {
    let running: Vec<usize> = (0..group.servers.len())
        .filter(|i| group.servers[*i].is_some())
        .collect();
    let share = usize::from(shards).div_ceil(running.len());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let views: Vec<Vec<Option<u64>>> = running
            .iter()
            .map(|i| {
                let server = group.servers[*i].as_ref().unwrap();
                server
                    .shards()
                    .leaders()
                    .into_iter()
                    .map(|(_, l)| l)
                    .collect()
            })
            .collect();
        let agreed = views.windows(2).all(|w| w[0] == w[1]);
        if let (true, Some(Some(leaders))) = (
            agreed,
            views
                .first()
                .map(|v| v.iter().copied().collect::<Option<Vec<u64>>>()),
        ) {
            let mut led: BTreeMap<u64, usize> = BTreeMap::new();
            for l in &leaders {
                *led.entry(*l).or_default() += 1;
            }
            if led.values().all(|n| *n <= share) {
                return leaders.iter().map(|l| *l as usize - 1).collect();
            }
        }
        assert!(
            Instant::now() < deadline,
            "shards not placed within 60 s: {views:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn envelope(command: Command) -> Envelope {
    Envelope {
        at_ms: 1_764_000_000_000,
        actor: Principal {
            role: Role::Agent,
            name: PrincipalName::new("bench").unwrap(),
        },
        command,
    }
}

/// One writer: a service of its shard whose policy it changes.
struct Writer {
    raft: ShardGroup,
    shard: u16,
    service: String,
}

async fn commit(raft: &ShardGroup, command: Command) -> rollcall_leases::raft::Outcome {
    let written = raft
        .write(Proposal::one(envelope(command)))
        .await
        .expect("the shard's leader commits");
    let outcome = written.data;
    assert!(
        outcome.results.iter().all(Result::is_ok),
        "the catalog applied it: {:?}",
        outcome.results
    );
    outcome
}

/// A policy of `service` (`namespace/service`) homed in r1; `max_age_ms`
/// tells two of them apart, so each write changes the catalog.
pub fn policy(service: &str, max_age_ms: u64) -> Command {
    let document: rollcall_config::ServicePolicy = serde_json::from_value(serde_json::json!({
        "service": service,
        "home_region": "r1",
        "max_snapshot_age_ms": max_age_ms,
    }))
    .expect("a valid policy document");
    Command::SetPolicy(Box::new(Policy::new(document).expect("a valid policy")))
}

/// The `nth` service of shard `shard` (of `shards`), by its stable hash.
pub fn service_in(shard: u16, shards: u16, nth: usize) -> String {
    (0..)
        .map(|i| format!("svc-{i}"))
        .filter(|name| {
            rollcall_leases::shard::shard_of_name("default", name, shards) == ShardId(shard)
        })
        .nth(nth)
        .map(|name| format!("default/{name}"))
        .unwrap()
}

/// Writers spread over the shards in turn, each with its own node lease
/// and instance in a service of its shard, on the shard's leader.
pub struct ShardWriters {
    writers: Vec<Writer>,
}

/// What one run measured: the whole load, and each shard's latencies.
pub struct ShardLoad {
    pub load: Load,
    pub by_shard: BTreeMap<u16, Vec<f64>>,
}

impl ShardWriters {
    /// Registers `writers` writers over `shards` placed shards.
    pub async fn register(group: &Group, shards: u16, writers: usize) -> ShardWriters {
        let leaders = placed(group, shards).await;
        let mut all = Vec::new();
        for w in 0..writers {
            let shard = (w % usize::from(shards)) as u16;
            let server = group.servers[leaders[usize::from(shard)]].as_ref().unwrap();
            let raft = server.shards().get(ShardId(shard)).unwrap().clone();
            let service = service_in(shard, shards, w);
            commit(&raft, policy(&service, 60_000)).await;
            all.push(Writer {
                raft,
                shard,
                service,
            });
        }
        ShardWriters { writers: all }
    }

    /// Every writer flips its instance between READY and UNHEALTHY until
    /// `secs` passed, one commit after another.
    pub async fn run(&self, secs: f64) -> ShardLoad {
        let committed = Arc::new(AtomicU64::new(0));
        let stop = Instant::now() + Duration::from_secs_f64(secs);
        let started = Instant::now();
        let mut tasks = Vec::new();
        for writer in &self.writers {
            let (raft, service) = (writer.raft.clone(), writer.service.clone());
            let (shard, committed) = (writer.shard, committed.clone());
            tasks.push(tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut flip = false;
                while Instant::now() < stop {
                    flip = !flip;
                    let sent = Instant::now();
                    commit(&raft, policy(&service, if flip { 120_000 } else { 60_000 })).await;
                    latencies.push(sent.elapsed().as_secs_f64() * 1e3);
                    committed.fetch_add(1, Ordering::Relaxed);
                }
                (shard, latencies)
            }));
        }
        let mut by_shard: BTreeMap<u16, Vec<f64>> = BTreeMap::new();
        let mut latencies_ms = Vec::new();
        for t in tasks {
            let (shard, latencies) = t.await.unwrap();
            latencies_ms.extend(latencies.iter().copied());
            by_shard.entry(shard).or_default().extend(latencies);
        }
        ShardLoad {
            load: Load {
                committed: committed.load(Ordering::Relaxed),
                secs: started.elapsed().as_secs_f64(),
                latencies_ms,
            },
            by_shard,
        }
    }
}
