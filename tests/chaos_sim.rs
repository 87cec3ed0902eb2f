//! The fleet simulation's CI versions (issue 9): every scenario of
//! `chaos/scenarios/sim/` with `--short` (200 agents), one at a time, each
//! run twice with the same seed. Asserted: the same digest and report
//! (determinism), every live registration held by the catalog, the agents
//! converged on the catalog, the snapshot bound respected, no false
//! removal, every leave and crash resolved, and the scenario's own
//! functional criteria. Not timings: those are the full-scale runs' job
//! (README, "Fleet simulation").
//!
//! It calls the library, not the binary: the same code `rollcall chaos sim`
//! runs, without a release build.

use std::path::Path;

use rollcall_chaos::sim::scenario::SimScenario;
use rollcall_chaos::sim::{simulate_scenario, SimReport};

const SEED: u64 = 9;

fn short(name: &str) -> SimScenario {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("chaos/scenarios/sim")
        .join(format!("{name}.toml"));
    SimScenario::load(&path)
        .and_then(|s| s.for_run(true, None))
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Runs the scenario twice and checks what every scenario must hold.
fn run(name: &str) -> SimReport {
    let report = run_unchecked_drains(name);
    assert_eq!(
        report.report.new_conns_to_drained, 0,
        "{name}: connections to drained instances"
    );
    report
}

/// As `run`, without the check that no drained instance got a new
/// connection: a replica that dies with its host leaves its agents
/// without updates until their next message gets nothing back within
/// `agent.arbiter_silence_ms`, and a drain committed meanwhile can still
/// be routed to by them (leader-change measures it).
fn run_unchecked_drains(name: &str) -> SimReport {
    let scenario = short(name);
    let first = simulate_scenario(scenario.clone(), SEED, false).report;
    let second = simulate_scenario(scenario, SEED, false).report;
    assert_eq!(
        first.digest, second.digest,
        "{name}: the same seed must give the same history"
    );
    let (mut a, mut b) = (first.clone(), second);
    a.wall = b.wall.clone();
    b.wall = a.wall.clone();
    assert_eq!(a, b, "{name}: every figure but `wall` must repeat");

    let r = &first.report;
    let f = &first.sim;
    assert_eq!(r.agents, 200, "{name}: the short version has 200 agents");
    assert_eq!(f.lost_registrations, 0, "{name}: lost registrations");
    assert!(
        f.converged,
        "{name}: the agents did not converge: {:?}",
        r.failures
    );
    assert_eq!(
        f.leaves_unresolved, 0,
        "{name}: leaves never applied everywhere"
    );
    assert_eq!(
        f.crashes_unresolved, 0,
        "{name}: killed nodes still routed to"
    );
    assert!(
        f.arbiter.max_concurrent_snapshots <= f.arbiter.snapshot_bound,
        "{name}: {} snapshots at once, bound {}",
        f.arbiter.max_concurrent_snapshots,
        f.arbiter.snapshot_bound
    );
    assert_eq!(r.false_removals, 0, "{name}: false removals");
    assert_eq!(
        r.new_conns_to_not_ready, 0,
        "{name}: connections to instances not READY"
    );
    assert!(f.conns > 0, "{name}: no traffic was sampled");
    assert!(f.gossip.packets_per_node_per_s > 0.0, "{name}: no gossip");
    assert!(f.leases.renewals > 0, "{name}: no lease renewals");
    assert!(
        f.probes > 0 && f.heartbeats > 0,
        "{name}: instances are probed and heartbeat"
    );
    assert_eq!(f.unhealthy, 0, "{name}: a live instance failed its check");
    first
}

#[test]
fn every_short_simulation_is_deterministic_and_correct() {
    // One at a time, in one test: each is a whole region in this process.
    let steady = run("steady");
    assert!(steady.sim.pauses > 0, "steady: pauses were injected");
    assert!(
        steady.report.leave_ms.count > 0,
        "steady: the background deploy left"
    );

    let deploy = run("big-deploy");
    assert!(deploy.sim.replaced > 0);
    assert_eq!(
        deploy.report.leave_ms.count, deploy.sim.replaced,
        "big-deploy: one leave per replaced instance"
    );

    let crashes = run("node-crashes");
    assert_eq!(crashes.sim.nodes_killed, 2, "1% of 200 nodes");
    assert_eq!(
        crashes.report.crash_ms.count, 2,
        "one crash sample per killed node"
    );
    assert_eq!(
        crashes.sim.arbiter.node_downs, 2,
        "both signals agreed twice"
    );

    let partition = run("zone-partition");
    assert!(
        partition.sim.leases.held_by_witnesses_max > 0,
        "zone-partition: witnesses in the other zones held the cut zone's leases"
    );
    assert_eq!(
        partition.report.false_removals, 0,
        "zone-partition: nothing of the cut zone was removed"
    );
    assert!(partition.report.converge_ms.is_some());

    let storm = run("outage-and-storm");
    let resume = storm.sim.resume.as_ref().expect("an outage was simulated");
    assert!(resume.agents > 0);
    assert!(
        resume.share_by_delta >= 0.95,
        "outage-and-storm: {} of {} agents resumed by delta",
        resume.by_delta,
        resume.agents
    );
    assert!(storm.report.outage.is_some());

    // Three replicas' machines: the leader dies mid-deploy, later the
    // followers do. Every write still lands (lost_registrations above),
    // the agents converge, and nothing is removed for the silence.
    let change = run_unchecked_drains("leader-change");
    let a = &change.sim.arbiter;
    assert_eq!(a.replicas, 3);
    assert_eq!(a.leader_changes, 1, "leader-change: one election");
    assert!(
        a.sessions_moved > 0,
        "leader-change: the dead leader's agents moved"
    );
    assert!(
        a.silent_replicas_noticed > 0,
        "leader-change: the dead leader's agents noticed its silence at their silence check"
    );
    assert!(
        a.batches_timed_out > 0,
        "leader-change: writes waited while the quorum was lost"
    );
    assert_eq!(
        change.sim.leases.expired, 0,
        "leader-change: no lease expired"
    );
    assert_eq!(
        change.sim.replaced, change.report.leave_ms.count,
        "leader-change: one leave per replaced instance"
    );
}
