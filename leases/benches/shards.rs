//! Issue 35 benchmark (not a test): a shard leader killed. Three arbiter
//! replicas (openraft, QUIC + mTLS, fsync on every append) on loopback in
//! this process, with a catalog of 6 shards whose leaders are spread 2/2/2.
//! Writers commit into every shard straight through its group (a policy
//! change of a service of their shard per write, `Raft::client_write` on
//! the shard's leader, one command per entry: agents' sessions are served
//! from shard 0 alone so far), and the replica leading the most shards is
//! killed in-process (`ArbiterServer::kill`: its QUIC endpoint closes at
//! once, its tasks are aborted, its Raft groups stop; nothing is handed
//! over).
//!
//! Measured per round, per shard:
//! - a shard the killed replica led: how long its writes were refused,
//!   from the kill to the commit of the first write sent after it (target:
//!   at most the election timeout, `raft.election_max_ms`, plus 1 s);
//! - a shard led elsewhere: its commits' latency p99 and its longest gap
//!   between commits during the window from the stop until every shard
//!   committed again (target: p99 at most 100 ms);
//! - after the replica returns, the writers still writing: how long until
//!   the leaders are 2/2/2 again (target: 30 s), and the longest time a
//!   shard went without a commit meanwhile (a hand-over holds its shard's
//!   new writes for about `election_max_ms`).
//!
//! Run: `cargo bench -p rollcall-leases --bench shards` (5 rounds).
//! `cargo test` runs it as a smoke test of one round; it fails unless every
//! shard committed before and after the stop and every figure has samples.

mod cluster;
mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cluster::shards::placed;
use cluster::Group;
use rollcall_leases::raft::Proposal;
use rollcall_leases::server::shards::ShardGroup;

const SHARDS: u16 = 6;
const WRITERS_PER_SHARD: usize = 4;

/// Every running replica's group handles, by replica index and shard; a
/// stopped replica's entry is `None`.
type Handles = Arc<Mutex<Vec<Option<Vec<ShardGroup>>>>>;

/// One commit: its shard, when it was sent and when it committed, as
/// offsets from the bench's start.
#[derive(Clone, Copy)]
struct Commit {
    shard: u16,
    sent_s: f64,
    done_s: f64,
}

fn handles(group: &Group) -> Vec<Option<Vec<ShardGroup>>> {
    group
        .servers
        .iter()
        .map(|s| s.as_ref().map(|s| s.shards().iter().cloned().collect()))
        .collect()
}

/// Shard `shard`'s leader's handle: the running replica that leads it by
/// its own account (a follower may still name a leader that is gone).
fn leader_of(handles: &Handles, shard: u16) -> Option<ShardGroup> {
    let all = handles.lock().unwrap();
    all.iter().flatten().find_map(|groups| {
        let group = &groups[usize::from(shard)];
        let metrics = group.raft.metrics().borrow().clone();
        (metrics.current_leader == Some(metrics.id)).then(|| group.clone())
    })
}

/// Writers on every shard until `stop`, each committing one change after
/// another through its shard's current leader (looked up again after any
/// failure, 10 ms later).
fn start_writers(
    handles: &Handles,
    epoch: Instant,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<Vec<Commit>>> {
    let mut tasks = Vec::new();
    for shard in 0..SHARDS {
        for w in 0..WRITERS_PER_SHARD {
            let (handles, stop) = (handles.clone(), stop.clone());
            let service = cluster::shards::service_in(shard, SHARDS, w);
            tasks.push(tokio::spawn(async move {
                let mut commits = Vec::new();
                let mut flip = false;
                while !stop.load(Ordering::Relaxed) {
                    let Some(leader) = leader_of(&handles, shard) else {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    };
                    flip = !flip;
                    let sent = epoch.elapsed().as_secs_f64();
                    let written = tokio::time::timeout(
                        Duration::from_secs(2),
                        leader.write(Proposal::one(cluster::shards::envelope(
                            cluster::shards::policy(&service, if flip { 120_000 } else { 60_000 }),
                        ))),
                    )
                    .await;
                    match written {
                        Ok(Ok(_)) => commits.push(Commit {
                            shard,
                            sent_s: sent,
                            done_s: epoch.elapsed().as_secs_f64(),
                        }),
                        _ => tokio::time::sleep(Duration::from_millis(10)).await,
                    }
                }
                commits
            }));
        }
    }
    tasks
}

/// The longest time between successive commits of `done` (sorted) inside
/// `[from, to]`, the window's edges counted.
fn longest_gap(done: &[f64], from: f64, to: f64) -> f64 {
    let mut last = from;
    let mut gap: f64 = 0.0;
    for t in done.iter().copied().filter(|t| *t >= from && *t <= to) {
        gap = gap.max(t - last);
        last = t;
    }
    gap.max(to - last)
}

/// When shard `shard`'s commits completed, in order.
fn done_times(commits: &[Commit], shard: u16) -> Vec<f64> {
    let mut done: Vec<f64> = commits
        .iter()
        .filter(|c| c.shard == shard)
        .map(|c| c.done_s)
        .collect();
    done.sort_by(f64::total_cmp);
    done
}

/// The longest time any shard went without a commit in `[from, to]`, ms.
fn longest_pause(commits: &[Commit], from: f64, to: f64) -> f64 {
    (0..SHARDS)
        .map(|shard| longest_gap(&done_times(commits, shard), from, to) * 1e3)
        .fold(0.0, f64::max)
}

fn main() {
    rollcall_leases::tls::install_crypto_provider();
    support::announce("shards");
    let rounds = if support::full_run() { 5 } else { 1 };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let mut group = Group::start_with(3, |c| c.catalog.shards = SHARDS).await;
        let election_max_ms = group.configs[0].raft.election_max_ms as f64;
        let mut refused_ms = Vec::new();
        let mut others_p99_ms = Vec::new();
        let mut others_gap_ms = Vec::new();
        let mut respread_ms = Vec::new();
        let mut pauses_ms = Vec::new();
        let mut kill_pauses_ms = Vec::new();
        for round in 0..rounds {
            let leaders = placed(&group, SHARDS).await;
            let mut led: BTreeMap<usize, Vec<u16>> = BTreeMap::new();
            for (shard, replica) in leaders.iter().enumerate() {
                led.entry(*replica).or_default().push(shard as u16);
            }
            let (victim, victim_shards) = led
                .iter()
                .max_by_key(|(r, s)| (s.len(), std::cmp::Reverse(**r)))
                .map(|(r, s)| (*r, s.clone()))
                .unwrap();
            let shared: Handles = Arc::new(Mutex::new(handles(&group)));
            let epoch = Instant::now();
            let stop = Arc::new(AtomicBool::new(false));
            let tasks = start_writers(&shared, epoch, &stop);
            tokio::time::sleep(Duration::from_secs(2)).await;

            // The stop: the replica is gone for the writers at once.
            let server = group.servers[victim].take().unwrap();
            shared.lock().unwrap()[victim] = None;
            let killed_s = epoch.elapsed().as_secs_f64();
            let teardown = tokio::spawn(server.kill());
            // Until every shard has a leader among the survivors, then 2 s
            // more for the writers to commit through them.
            let deadline = Instant::now() + Duration::from_secs(30);
            while (0..SHARDS).any(|shard| leader_of(&shared, shard).is_none()) {
                assert!(
                    Instant::now() < deadline,
                    "round {round}: a shard had no leader among the survivors 30 s after the stop"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            // The two left settle at their share (3/3), moving leadership
            // if the elections gave one of them more.
            placed(&group, SHARDS).await;
            let settled_s = epoch.elapsed().as_secs_f64();
            tokio::time::sleep(Duration::from_secs(1)).await;
            // The replica returns while the writers go on: its groups come
            // back from its files and leadership spreads again under load.
            teardown.await.unwrap();
            group.start_replica(victim).await;
            shared.lock().unwrap()[victim] = handles(&group)[victim].clone();
            let returned = Instant::now();
            let returned_s = epoch.elapsed().as_secs_f64();
            placed(&group, SHARDS).await;
            let placed_s = epoch.elapsed().as_secs_f64();
            let ms = returned.elapsed().as_secs_f64() * 1e3;
            println!("round {round}: replica {} returned; leaders within the share again after {ms:.0} ms, under load", victim + 1);
            respread_ms.push(ms);
            tokio::time::sleep(Duration::from_secs(1)).await;
            stop.store(true, Ordering::Relaxed);
            let mut commits = Vec::new();
            for t in tasks {
                commits.extend(t.await.unwrap());
            }
            let mut window_end = killed_s;
            for shard in 0..SHARDS {
                // The first write sent after the stop that committed.
                let first_after = commits
                    .iter()
                    .filter(|c| c.shard == shard && c.sent_s >= killed_s)
                    .map(|c| c.done_s)
                    .fold(f64::INFINITY, f64::min);
                assert!(
                    first_after.is_finite(),
                    "round {round}: shard {shard} never committed after the stop"
                );
                assert!(
                    commits.iter().any(|c| c.shard == shard && c.done_s < killed_s),
                    "round {round}: shard {shard} never committed before the stop"
                );
                window_end = window_end.max(first_after);
                if victim_shards.contains(&shard) {
                    let ms = (first_after - killed_s) * 1e3;
                    println!("round {round}: shard {shard} (led by the killed replica {}) refused for {ms:.0} ms", victim + 1);
                    refused_ms.push(ms);
                }
            }
            // From the kill until 3/3: each shard's longest time without a
            // commit (its election, and a hand-over if one followed).
            let after_kill = longest_pause(&commits, killed_s, settled_s);
            println!(
                "round {round}: 3/3 {:.0} ms after the kill; the longest time a shard went without a commit meanwhile: {after_kill:.0} ms",
                (settled_s - killed_s) * 1e3
            );
            kill_pauses_ms.push(after_kill);
            // While leadership spread again: each shard's longest time
            // without a commit (a hand-over holds its shard's writes).
            let pause = longest_pause(&commits, returned_s, placed_s);
            println!("round {round}: longest time a shard went without a commit while leadership spread again: {pause:.0} ms");
            pauses_ms.push(pause);
            for shard in (0..SHARDS).filter(|s| !victim_shards.contains(s)) {
                let latencies: Vec<f64> = commits
                    .iter()
                    .filter(|c| c.shard == shard && c.sent_s >= killed_s && c.sent_s <= window_end)
                    .map(|c| (c.done_s - c.sent_s) * 1e3)
                    .collect();
                let done = done_times(&commits, shard);
                let gap = longest_gap(&done, killed_s, window_end) * 1e3;
                let s = support::summarize(&format!("shard {shard} during the stop"), latencies);
                println!(
                    "round {round}: shard {shard} (led elsewhere) during the kill's {:.0} ms: {} commits, p50 {:.1} ms, p99 {:.1} ms, longest gap {gap:.0} ms",
                    (window_end - killed_s) * 1e3,
                    s.n,
                    s.p50,
                    s.p99
                );
                others_p99_ms.push(s.p99);
                others_gap_ms.push(gap);
            }
        }
        let refused = support::summarize("refused, shards of the stopped replica", refused_ms);
        let p99 = support::summarize("commit p99, shards led elsewhere", others_p99_ms);
        let gap = support::summarize("longest gap, shards led elsewhere", others_gap_ms);
        let respread = support::summarize("leaders spread again after the return", respread_ms);
        let pauses = support::summarize("longest pause while leadership spread", pauses_ms);
        let kill_pauses = support::summarize("longest pause from the kill until 3/3", kill_pauses_ms);
        println!(
            "{rounds} round(s), {SHARDS} shards on 3 replicas, {WRITERS_PER_SHARD} writers per shard:"
        );
        println!(
            "  writes refused, shards the killed replica led: p50 {:.0} ms, max {:.0} ms (target max <= election_max_ms + 1 s = {:.0} ms)",
            refused.p50,
            refused.max,
            election_max_ms + 1_000.0
        );
        println!(
            "  commit p99 during the kill, shards led elsewhere: median {:.1} ms, max {:.1} ms (target <= 100 ms); longest gap median {:.0} ms, max {:.0} ms",
            p99.p50, p99.max, gap.p50, gap.max
        );
        println!(
            "  longest time any shard went without a commit from the kill until the two left led 3/3: p50 {:.0} ms, max {:.0} ms",
            kill_pauses.p50, kill_pauses.max
        );
        println!(
            "  leaders 2/2/2 again after the replica returned, under load: p50 {:.0} ms, max {:.0} ms (target <= 30,000 ms)",
            respread.p50, respread.max
        );
        println!(
            "  longest time a shard went without a commit meanwhile (hand-overs hold new writes): p50 {:.0} ms, max {:.0} ms",
            pauses.p50, pauses.max
        );
        group.shutdown().await;
    });
}
