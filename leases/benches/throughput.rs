//! Issue 21 benchmark (not a test): the arbiter's throughput figures in one
//! run, each the median of several rounds, as one table beside the
//! previous commit's figures when they were stored (`support::Table`):
//!
//! - catalog apply: transitions applied per second on one core, on the
//!   catalog bench's fleet (100,000 endpoints in 2,000 services on 5,000
//!   nodes), each a whole `Catalog::apply`; rounds of 1,000,000;
//! - durable commits, one replica: 64 concurrent writers through the real
//!   QUIC client, each flipping its own instance between READY and
//!   UNHEALTHY and waiting for each answer (every answer after the fsync
//!   of its group commit); committed transitions/s, each write's latency
//!   (p50, p99) and the mean commands per Raft entry (batch size);
//! - the same with three replicas on loopback, the writes sent to the
//!   leader and to a follower (which hands them to the leader), in turn;
//! - shard commits (issue 35): with 1, 2, 4 and 8 catalog shards, on one
//!   replica and on three, 64 writers spread over the shards, each
//!   committing its own instance's transitions straight into its shard's
//!   Raft group on that shard's leader (`ShardGroup::write`, no
//!   agent session: sessions are served from shard 0 alone so far);
//!   commits/s over all shards, latency p50 and p99, and the slowest
//!   shard's p99.
//!
//! No agent subscribes here: the control-plane bench measures commits
//! with fan-out to 200 agents.
//!
//! Run: `cargo bench -p rollcall-leases --bench throughput`. `ROLLCALL_THROUGHPUT`
//! picks parts (`catalog`, `commit`, `replicas`, `shards`, comma-separated; all by
//! default), e.g. `catalog` alone under `valgrind --tool=callgrind`, whose
//! instruction counts the round function `apply_round` carries.
//! `cargo test` runs it as a smoke test: a 1,000-endpoint catalog, short
//! rounds, and it fails unless every round applied or committed something.

mod cluster;
mod fleet;
mod support;

use std::time::Instant;

use rollcall_leases::{Catalog, Envelope};
use support::{Better, Table};

/// What a run does: the full run's sizes, or the smoke run's.
#[derive(Clone, Copy)]
struct Sizes {
    rounds: usize,
    applies: usize,
    load_secs: f64,
}

const FULL: Sizes = Sizes {
    rounds: 5,
    applies: 1_000_000,
    load_secs: 3.0,
};

const SMOKE: Sizes = Sizes {
    rounds: 2,
    applies: 2_000,
    load_secs: 0.5,
};

fn wanted(part: &str) -> bool {
    std::env::var("ROLLCALL_THROUGHPUT")
        .map_or(true, |parts| parts.split(',').any(|p| p.trim() == part))
}

fn main() {
    rollcall_leases::tls::install_crypto_provider();
    support::announce("throughput");
    let sizes = if support::full_run() { FULL } else { SMOKE };
    let mut table = Table::new("throughput");
    if wanted("catalog") {
        catalog(sizes, &mut table);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    if wanted("commit") {
        runtime.block_on(commits(sizes, 1, &mut table));
    }
    if wanted("replicas") {
        runtime.block_on(commits(sizes, 3, &mut table));
    }
    if wanted("shards") {
        runtime.block_on(shards(sizes, 1, &mut table));
        runtime.block_on(shards(sizes, 3, &mut table));
    }
    table.finish();
}

/// Applies `count` transitions, taking `envelopes` in turn from `next`;
/// answers where the next round goes on. Never inlined, so that
/// callgrind's figures for it are the applies' alone.
#[inline(never)]
fn apply_round(cat: &mut Catalog, envelopes: &[Envelope], next: usize, count: usize) -> usize {
    let mut k = next;
    for _ in 0..count {
        let applied = cat.apply(&envelopes[k % envelopes.len()]);
        assert!(
            applied.is_ok_and(|a| a.revision.is_some()),
            "every transition applies and commits"
        );
        k += 1;
    }
    k
}

fn catalog(sizes: Sizes, table: &mut Table) {
    let fleet_size = fleet::size(support::full_run());
    let (mut cat, ids) = fleet::fleet(fleet_size);
    let envelopes = fleet::transitions(&ids);
    let name = "catalog apply, 1 core";
    let mut next = 0;
    for _ in 0..sizes.rounds {
        let started = Instant::now();
        next = apply_round(&mut cat, &envelopes, next, sizes.applies);
        table.add(
            name,
            "applies/s",
            Better::Higher,
            sizes.applies as f64 / started.elapsed().as_secs_f64(),
        );
    }
    table.note(
        name,
        &format!(
            "the catalog bench's fleet: {} endpoints in {} services; rounds of {} transitions; target >= 1,000,000/s",
            fleet_size.endpoints, fleet_size.services, sizes.applies
        ),
    );
}

/// Rounds of 64 writers on `replicas` replicas: to the leader, and with
/// three replicas to a follower too, in turn.
async fn commits(sizes: Sizes, replicas: usize, table: &mut Table) {
    let group = cluster::Group::start(replicas).await;
    let leader = group.leader().await;
    let mut ways = vec![("leader", leader)];
    if replicas > 1 {
        ways.push(("follower", (leader + 1) % replicas));
    }
    let mut writers = Vec::new();
    for (way, replica) in &ways {
        let node = format!("bench-{way}");
        writers.push(cluster::Writers::register(&group.ca, &node, &group.addr(*replica)).await);
    }
    let label = |way: &str, what: &str| {
        if replicas == 1 {
            format!("durable commits, 1 replica: {what}")
        } else {
            format!("durable commits, 3 replicas, to the {way}: {what}")
        }
    };
    let mut rates = vec![Vec::new(); ways.len()];
    for _ in 0..sizes.rounds {
        for (w, (way, _)) in ways.iter().enumerate() {
            let entries = group.log_index(leader);
            let load = writers[w].run(sizes.load_secs).await;
            let entries = group.log_index(leader) - entries;
            assert!(
                load.committed > 0,
                "{way}: no write committed; this measured nothing"
            );
            let latency = support::summarize("commit latency", load.latencies_ms.clone());
            table.add(
                &label(way, "transitions/s"),
                "commits/s",
                Better::Higher,
                load.rate(),
            );
            table.add(&label(way, "latency p50"), "ms", Better::Lower, latency.p50);
            table.add(&label(way, "latency p99"), "ms", Better::Lower, latency.p99);
            table.add(
                &label(way, "commands per Raft entry"),
                "mean",
                Better::Higher,
                load.committed as f64 / entries.max(1) as f64,
            );
            rates[w].push(load.rate());
        }
    }
    table.note(
        &label("leader", "transitions/s"),
        &format!(
            "{} concurrent writers on one QUIC connection, fsync before every answer; {} rounds of {} s; target >= {}/s",
            cluster::WRITERS,
            sizes.rounds,
            sizes.load_secs,
            if replicas == 1 { "24,000" } else { "15,000" }
        ),
    );
    table.note(
        &label("leader", "latency p99"),
        "each write, sent to Committed answer; target <= 20 ms",
    );
    if replicas > 1 {
        for (leader, follower) in rates[0].iter().zip(&rates[1]) {
            table.add(
                "durable commits, 3 replicas: follower / leader",
                "%",
                Better::Higher,
                100.0 * follower / leader,
            );
        }
        table.note(
            "durable commits, 3 replicas: follower / leader",
            "target >= 80 %",
        );
    }
    group.shutdown().await;
}

/// Rounds of 64 writers spread over K shards' Raft groups, for each K, on
/// `replicas` replicas (issue 35).
async fn shards(sizes: Sizes, replicas: usize, table: &mut Table) {
    let counts: &[u16] = if support::full_run() {
        &[1, 2, 4, 8]
    } else {
        &[1, 2]
    };
    for &k in counts {
        let group = cluster::Group::start_with(replicas, |c| c.catalog.shards = k).await;
        let writers = cluster::shards::ShardWriters::register(&group, k, cluster::WRITERS).await;
        let label =
            |what: &str| format!("shard commits, {replicas} replica(s), {k} shard(s): {what}");
        for _ in 0..sizes.rounds {
            let run = writers.run(sizes.load_secs).await;
            assert!(
                run.load.committed > 0,
                "{k} shards: no write committed; this measured nothing"
            );
            assert_eq!(
                run.by_shard.len(),
                usize::from(k),
                "every shard committed something"
            );
            let latency = support::summarize("shard commit latency", run.load.latencies_ms.clone());
            let slowest = run
                .by_shard
                .iter()
                .map(|(shard, l)| {
                    support::summarize(&format!("shard {shard} latency"), l.clone()).p99
                })
                .fold(0.0, f64::max);
            table.add(
                &label("commits/s"),
                "commits/s",
                Better::Higher,
                run.load.rate(),
            );
            table.add(&label("latency p50"), "ms", Better::Lower, latency.p50);
            table.add(&label("latency p99"), "ms", Better::Lower, latency.p99);
            table.add(&label("slowest shard's p99"), "ms", Better::Lower, slowest);
        }
        table.note(
            &label("commits/s"),
            &format!(
                "{} writers spread over the shards, each waiting for its commit; straight into each shard's group on its leader; {} rounds of {} s",
                cluster::WRITERS, sizes.rounds, sizes.load_secs
            ),
        );
        group.shutdown().await;
    }
}
