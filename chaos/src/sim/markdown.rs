//! A simulation report as Markdown (`report.md`).

use std::fmt::Write as _;

use crate::report::Stats;

use super::SimReport;

/// The report as Markdown.
pub fn markdown(r: &SimReport, plots: &[String]) -> String {
    let b = &r.report;
    let f = &r.sim;
    let stats = |s: &Stats| match (s.p50, s.p99, s.max) {
        (Some(p50), Some(p99), Some(max)) => {
            format!("count {}, p50 {p50}, p99 {p99}, max {max}", s.count)
        }
        _ => format!("count {}", s.count),
    };
    let mut md = String::new();
    let _ = writeln!(md, "# Simulation report: {}\n", b.scenario);
    let _ = writeln!(
        md,
        "**{}**: seed {}, {} agents in {} zones, {} instances in {} services, {} s simulated in {} s wall (setup {} s, peak RSS {} MiB). Digest `{}`.\n",
        if b.pass { "PASS" } else { "FAIL" },
        b.seed,
        b.agents,
        f.fleet.zones,
        f.fleet.instances,
        f.fleet.services,
        b.duration_s,
        r.wall.run_s,
        r.wall.setup_s,
        r.wall.peak_rss_mib,
        r.digest
    );
    md.push_str("| figure | measured |\n|---|---|\n");
    let rows: Vec<(&str, String)> = vec![
        (
            "leave_ms (commit → last subscribed agent applied)",
            stats(&b.leave_ms),
        ),
        ("crash_ms (kill → last agent ejected)", stats(&b.crash_ms)),
        (
            "converge_ms",
            b.converge_ms.map_or("-".into(), |v| v.to_string()),
        ),
        ("false_removals", b.false_removals.to_string()),
        (
            "max_concurrent_snapshots (bound)",
            format!(
                "{} ({})",
                b.max_concurrent_snapshots, f.arbiter.snapshot_bound
            ),
        ),
        (
            "sampled conns / failed attempts / failed / to drained",
            format!(
                "{} / {} / {} / {}",
                f.conns, f.failed_attempts, b.failed_conns, b.new_conns_to_drained
            ),
        ),
        (
            "arbiter commits/s (mean, max)",
            format!(
                "{} , {}",
                f.arbiter.commits_per_s, f.arbiter.commits_per_s_max
            ),
        ),
        (
            "arbiter deliveries/s (mean, max)",
            format!(
                "{} , {}",
                f.arbiter.deliveries_per_s, f.arbiter.deliveries_per_s_max
            ),
        ),
        ("arbiter bytes/s (mean)", f.arbiter.bytes_per_s.to_string()),
        (
            "arbiter CPU modelled (mean %, longest wait ms)",
            format!("{} , {}", f.arbiter.cpu_percent, f.arbiter.cpu_max_wait_ms),
        ),
        (
            "arbiter replicas / leader changes / sessions moved / batches timed out / silent replicas noticed",
            format!(
                "{} / {} / {} / {} / {}",
                f.arbiter.replicas,
                f.arbiter.leader_changes,
                f.arbiter.sessions_moved,
                f.arbiter.batches_timed_out,
                f.arbiter.silent_replicas_noticed
            ),
        ),
        (
            "gossip packets / bytes per node per s",
            format!(
                "{} / {}",
                f.gossip.packets_per_node_per_s, f.gossip.bytes_per_node_per_s
            ),
        ),
        (
            "gossip down verdicts (false)",
            format!("{} ({})", f.gossip.down_events, f.gossip.false_down_events),
        ),
        (
            "down reports (ignored, verdicts)",
            format!(
                "{} ({}, {})",
                f.arbiter.down_reports, f.arbiter.down_reports_ignored, f.arbiter.node_downs
            ),
        ),
        (
            "leases held by the guard (max)",
            f.leases.held_max.to_string(),
        ),
        (
            "leases held by witnesses (max; witness questions)",
            format!(
                "{} ({})",
                f.leases.held_by_witnesses_max, f.leases.witness_asks
            ),
        ),
        ("leases expired", f.leases.expired.to_string()),
        (
            "resumed by delta after the outage",
            f.resume.as_ref().map_or("-".into(), |x| {
                format!("{} of {} ({:.3})", x.by_delta, x.agents, x.share_by_delta)
            }),
        ),
        (
            "readiness probes / heartbeats / made unhealthy",
            format!("{} / {} / {}", f.probes, f.heartbeats, f.unhealthy),
        ),
        ("lost registrations", f.lost_registrations.to_string()),
        ("converged at the end", f.converged.to_string()),
    ];
    for (name, value) in rows {
        let _ = writeln!(md, "| {name} | {value} |");
    }
    md.push_str("\n## Failures\n\n");
    if b.failures.is_empty() {
        md.push_str("None.\n");
    }
    for failure in &b.failures {
        let _ = writeln!(md, "- {failure}");
    }
    md.push_str("\n## Phases\n\n| phase | start s | end s | conns | failed conns |\n|---|---|---|---|---|\n");
    for p in &b.phases {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} |",
            p.name, p.start_s, p.end_s, p.conns, p.failed_conns
        );
    }
    md.push_str("\n## Plots\n\n");
    for plot in plots {
        let _ = writeln!(md, "- [{plot}]({plot})");
    }
    md
}
