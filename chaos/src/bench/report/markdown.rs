//! `report.md`: the fleet bench's figures as tables, and `write`, which
//! puts it beside `report.json`.

use std::fmt::Write as _;
use std::path::Path;

use super::{Latency, Report, Usage};

fn show(v: Option<f64>, unit: &str) -> String {
    v.map_or("-".into(), |v| {
        if v.abs() >= 100.0 {
            format!("{v:.0}{unit}")
        } else {
            format!("{v:.2}{unit}")
        }
    })
}

fn lat(l: &Latency) -> String {
    if l.count == 0 {
        return "no samples".into();
    }
    format!(
        "n={}, p50 {} / p99 {} / max {} ms",
        l.count,
        show(l.p50_ms, ""),
        show(l.p99_ms, ""),
        show(l.max_ms, "")
    )
}

fn usage_rows(out: &mut String, usage: &[Usage]) {
    for u in usage {
        let _ = writeln!(
            out,
            "| {} CPU / RSS end / RSS max | {} / {} / {} |",
            u.name,
            show(u.cpu_percent, " %"),
            show(u.rss_end_mib, " MiB"),
            show(u.rss_max_mib, " MiB")
        );
    }
}

/// `report.md`.
pub fn markdown(report: &Report, plots: &[String]) -> String {
    let mut out = String::new();
    let verdict = if report.failures.is_empty() {
        "measured"
    } else {
        "INCOMPLETE"
    };
    let _ = writeln!(out, "# Fleet bench\n");
    let _ = writeln!(
        out,
        "**{verdict}**: build `{}`{}, {} cores. Settings: `{}`.\n",
        report.build.commit,
        if report.build.dirty { " (dirty)" } else { "" },
        report.cores,
        report.settings
    );
    let _ = writeln!(
        out,
        "## Phases\n\n| phase | s | done / due | short |\n|---|---|---|---|"
    );
    for p in &report.phases {
        let _ = writeln!(
            out,
            "| {} | {:.1} | {} / {} | {} |",
            p.name,
            p.seconds(),
            p.done,
            p.total,
            if p.short.is_empty() {
                "-".into()
            } else {
                p.short.join("; ")
            }
        );
    }
    let s = &report.setup;
    let _ = writeln!(out, "\n## Setup\n\n| figure | measured |\n|---|---|");
    let _ = writeln!(
        out,
        "| sessions / endpoints / subscriptions | {} / {} / {} |",
        s.sessions, s.endpoints, s.subscriptions
    );
    let _ = writeln!(
        out,
        "| connect / register / follow | {:.1} / {:.1} / {:.1} s |",
        s.connect_s, s.register_s, s.follow_s
    );
    let _ = writeln!(
        out,
        "| registrations committed per s | {} |",
        show(s.register_commits_per_s, "")
    );
    let _ = writeln!(
        out,
        "| first replica RSS idle; per session / endpoint / subscription | {}; {} / {} / {} |",
        show(s.rss_idle_mib, " MiB"),
        show(s.rss_per_session_kib, " KiB"),
        show(s.rss_per_endpoint_kib, " KiB"),
        show(s.rss_per_subscription_kib, " KiB")
    );
    let _ = writeln!(
        out,
        "| per session: counted session state / the rest (QUIC connection, its tasks, allocator) | {} / {} |",
        show(s.session_state_per_session_kib, " KiB"),
        show(s.connection_per_session_kib, " KiB")
    );
    let _ = writeln!(
        out,
        "| per subscription: counted subscription state | {} |",
        show(s.subscription_state_per_subscription_kib, " KiB")
    );
    if let Some(st) = &report.steady {
        let _ = writeln!(
            out,
            "\n## steady ({:.0} s)\n\n| figure | measured |\n|---|---|",
            st.seconds
        );
        usage_rows(&mut out, &st.usage);
        let _ = writeln!(
            out,
            "| deliveries/s mean / max | {} / {} |",
            st.deliveries_per_s.mean, st.deliveries_per_s.max
        );
    }
    if let Some(d) = &report.deploy {
        let _ = writeln!(
            out,
            "\n## deploy ({} of {} replaced over {:.0} s, drain {} ms)\n\n| figure | measured |\n|---|---|",
            d.replaced, d.replacements, d.window_s, d.drain_ms
        );
        let _ = writeln!(out, "| commit (every write) | {} |", lat(&d.commit));
        let _ = writeln!(
            out,
            "| commit register / drain / deregister p99 | {} / {} / {} ms |",
            show(d.commit_register.p99_ms, ""),
            show(d.commit_drain.p99_ms, ""),
            show(d.commit_deregister.p99_ms, "")
        );
        let _ = writeln!(
            out,
            "| commit → applied at each follower | {} |",
            lat(&d.applied)
        );
        let _ = writeln!(
            out,
            "| leave (drain commit → last follower applied) | {} |",
            lat(&d.leave)
        );
        let _ = writeln!(
            out,
            "| undelivered (change, follower) | {} |",
            d.undelivered
        );
        let _ = writeln!(
            out,
            "| commits/s mean / max | {} / {} |",
            d.commits_per_s.mean, d.commits_per_s.max
        );
        let _ = writeln!(
            out,
            "| deliveries/s mean / max | {} / {} |",
            d.deliveries_per_s.mean, d.deliveries_per_s.max
        );
        let _ = writeln!(
            out,
            "| update messages/s mean / max | {} / {} |",
            d.messages_per_s.mean, d.messages_per_s.max
        );
        let _ = writeln!(
            out,
            "| bytes/s mean / max | {} / {} |",
            d.bytes_per_s.mean, d.bytes_per_s.max
        );
        usage_rows(&mut out, &d.usage);
    }
    if let Some(st) = &report.storm {
        let _ = writeln!(out, "\n## storm\n\n| figure | measured |\n|---|---|");
        let _ = writeln!(out, "| agents cut (wiped) | {} ({}) |", st.agents, st.wiped);
        let _ = writeln!(
            out,
            "| churn commits while cut; per s | {}; {} |",
            st.churn_commits,
            show(st.churn_commits_per_s, "")
        );
        let _ = writeln!(out, "| cut for | {:.1} s |", st.cut_s);
        let _ = writeln!(out, "| heal → converged | {} |", show(st.converge_s, " s"));
        let _ = writeln!(
            out,
            "| heal → each agent converged | {} |",
            lat(&st.agent_converge)
        );
        let _ = writeln!(
            out,
            "| heal → each agent's session | {} |",
            lat(&st.reconnect)
        );
        let _ = writeln!(
            out,
            "| snapshots in flight: sampled max / run max / bound | {} / {} / {} |",
            show(st.snapshots_in_flight_sampled_max, ""),
            show(st.snapshots_in_flight_max, ""),
            st.max_concurrent_snapshots
                .map_or("-".into(), |b| b.to_string())
        );
        let _ = writeln!(
            out,
            "| snapshots / retries answered after the heal | {} / {} |",
            st.snapshots, st.retries
        );
        let _ = writeln!(
            out,
            "| resumed by delta (agents not wiped) | {} of {} ({}) |",
            st.resumed_by_delta,
            st.resumed_agents,
            show(st.resumed_by_delta_share, "")
        );
        let _ = writeln!(
            out,
            "| leases held by the guard, max | {} |",
            show(st.held_leases_max, "")
        );
        usage_rows(&mut out, &st.usage);
    }
    if !report.counters.is_empty() {
        let _ = writeln!(
            out,
            "\n## Arbiter counters at each phase's end\n\n| phase | replica | commits | agents | snapshots sent / refused / most in flight | held leases | commit mean ms | commands per entry | session / subscription state MiB | UDP datagrams dropped at its socket |\n|---|---|---|---|---|---|---|---|---|---|"
        );
        for (phase, replica, k) in &report.counters {
            let _ = writeln!(
                out,
                "| {phase} | {replica} | {} | {} | {} / {} / {} | {} | {} | {} | {} / {} | {} |",
                show(k.commits, ""),
                show(k.connected_agents, ""),
                show(k.snapshots_sent, ""),
                show(k.snapshots_refused, ""),
                show(k.snapshots_in_flight_max, ""),
                show(k.held_leases, ""),
                show(k.commit_mean_ms, ""),
                show(k.batch_mean, ""),
                show(mib(k.session_state_bytes), ""),
                show(mib(k.subscription_state_bytes), ""),
                show(k.udp_drops, "")
            );
        }
    }
    let _ = writeln!(
        out,
        "\n## Targets\n\n| target | wanted | measured | met |\n|---|---|---|---|"
    );
    for t in &report.targets {
        let met = match t.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "-",
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {met} |",
            t.name, t.target, t.measured
        );
    }
    if !report.errors.is_empty() {
        let _ = writeln!(
            out,
            "\n## Errors answered to the bench's calls, and why sessions ended\n"
        );
        for (e, n) in &report.errors {
            let _ = writeln!(out, "- {n} × {e}");
        }
    }
    if !report.notes.is_empty() {
        let _ = writeln!(out, "\n## Notes\n");
        for n in &report.notes {
            let _ = writeln!(out, "- {n}");
        }
    }
    let _ = writeln!(out, "\n## Failures\n");
    if report.failures.is_empty() {
        let _ = writeln!(out, "None: every figure has its samples.");
    }
    for f in &report.failures {
        let _ = writeln!(out, "- {f}");
    }
    if !plots.is_empty() {
        let _ = writeln!(out, "\n## Plots\n");
        for p in plots {
            let _ = writeln!(out, "- [{p}]({p})");
        }
    }
    out
}

/// Writes `report.json` and `report.md` into `dir`.
pub fn write(dir: &Path, report: &Report, plots: &[String]) -> std::io::Result<()> {
    let json = serde_json::to_vec_pretty(report).map_err(std::io::Error::other)?;
    std::fs::write(dir.join("report.json"), json)?;
    std::fs::write(dir.join("report.md"), markdown(report, plots))
}

/// Bytes as MiB with one decimal.
fn mib(bytes: Option<f64>) -> Option<f64> {
    bytes.map(|b| (b / 104_857.6).round() / 10.0)
}
