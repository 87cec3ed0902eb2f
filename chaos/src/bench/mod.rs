//! `rollcall bench fleet`: a real arbiter (or Raft group) loaded with
//! thousands of real agent sessions, to size a region on real hardware —
//! what the fleet simulation cannot say, because it charges the arbiter
//! no CPU, no NIC and no fsync.
//!
//! Every simulated agent is the agent binary's own state machine and its
//! own session actor over a real QUIC connection with mutual TLS, with a
//! certificate issued by the region's CA (`agent`). The coordinator (this
//! module) starts the arbiters (`--spawn N`: real processes, real redb
//! with fsync) or dials the ones it is given, starts `--procs` worker
//! processes that each run a share of the agents (`worker`), and drives
//! them through the phases in lock step:
//!
//! 1. `connect`: every agent opens its session (100 per 100 ms per
//!    worker);
//! 2. `register`: every agent registers its instances through its own
//!    machine's local API path;
//! 3. `follow`: every agent follows its services and fetches their views;
//! 4. `steady` (scenario `steady`): nothing but keep-alives and renewals,
//!    for `--duration-s`;
//! 5. `deploy` (scenario `deploy`): the planned share of the instances
//!    replaced over `--duration-s` (register new → READY, drain old →
//!    deregister 5 s later), as in the problem statement;
//! 6. `cut`, `churn`, `heal` (scenario `storm`): every session cut at
//!    once (wiped agents restart with an empty cache), the churn nodes
//!    replace their instances while nobody listens, then the cut lifts and
//!    every agent comes back on its own backoff.
//!
//! It samples every process's CPU time and resident memory from `/proc`
//! and the arbiter's own counters from its `/metrics`, merges the
//! workers' records, and writes `report.json`, `report.md` and the plots
//! (`report`, `plot`). The plan — who runs and follows what — is a
//! function of the flags and the seed (`plan`).

pub mod agent;
pub mod arbiters;
pub mod plan;
pub mod plot;
pub mod records;
pub mod report;
pub mod worker;

mod compute;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rollcall_config::ArbiterConfig;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

use crate::report::Build;
use arbiters::{Replica, Sampler};
use compute::{compute, Computed};
use plan::{Plan, Shape};
use records::{now_us, Answer, Order, Records};
use report::{ArbiterCounters, Report, Span, Target};
use worker::WorkerSettings;

/// Why a bench could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A flag is unusable.
    #[error("{0}")]
    Args(String),
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Certificates could not be made or read.
    #[error("certificates: {0}")]
    Tls(String),
    /// The arbiters did not come up.
    #[error("{0}")]
    Arbiter(String),
    /// A worker failed.
    #[error("worker: {0}")]
    Worker(String),
}

/// Which scenarios to run after the setup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scenario {
    /// Keep-alives and renewals only.
    Steady,
    /// The deploy.
    Deploy,
    /// The reconnect storm.
    Storm,
    /// All three, in that order.
    All,
}

impl Scenario {
    fn runs(self, which: Scenario) -> bool {
        self == which || self == Scenario::All
    }
}

/// `rollcall bench fleet`'s arguments.
#[derive(Clone, Debug)]
pub struct FleetArgs {
    /// Arbiter replicas to load (QUIC `host:port`); empty: spawn.
    pub arbiters: Vec<String>,
    /// Their admin endpoints, for `/metrics` (optional).
    pub admin: Vec<SocketAddr>,
    /// With `arbiters`: the directory with the region's `ca.crt` and
    /// `ca.key` (as `rollcall certs` writes), to issue agent certificates.
    pub certs: Option<PathBuf>,
    /// Replicas to start when `arbiters` is empty: 1 or 3.
    pub spawn: usize,
    /// The fleet.
    pub shape: Shape,
    /// What to run after the setup.
    pub scenario: Scenario,
    /// Length of `steady` and of the deploy's window, s.
    pub duration_s: f64,
    /// Where the report goes (its `work/` holds the run's files).
    pub report: PathBuf,
    /// Worker processes.
    pub procs: u32,
    /// The `rollcall` binary (arbiters and workers run it).
    pub binary: PathBuf,
    /// The commit it was built from.
    pub build: Build,
}

/// The drain window of a deploy replacement, ms (the fleet simulation's
/// big-deploy uses the same), shortened for a deploy shorter than it.
const DRAIN_MS: u64 = 5_000;
/// The shortest cut of the storm, ms: longer than the agents' largest
/// reconnect backoff (`reconnect_max_ms`, 5 s by default) by 2 s, so that
/// every agent's backoff has reached its cap and the fleet comes back
/// spread over one full backoff window, as after a long outage; shorter
/// than a lease (10 s), so no lease expires only because of the cut.
const MIN_CUT_MS: u64 = 7_000;
/// Replacements each churn node keeps in flight.
const CHURN_CONCURRENCY: u32 = 64;
/// The marker of a work directory this bench made (and may replace).
const WORK_MARKER: &str = ".rollcall-bench";

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BenchError {
    let what = what.into();
    move |source| BenchError::Io { what, source }
}

/// The worker processes and what they say.
struct Workers {
    children: Vec<Child>,
    stdins: Vec<ChildStdin>,
    answers: mpsc::UnboundedReceiver<(usize, Option<Answer>)>,
    work: PathBuf,
}

impl Workers {
    async fn start(
        binary: &Path,
        work: &Path,
        settings: &WorkerSettings,
    ) -> Result<Workers, BenchError> {
        let file = work.join("workers.json");
        let json = serde_json::to_vec_pretty(settings).expect("settings serialize");
        std::fs::write(&file, json).map_err(io(format!("writing {}", file.display())))?;
        let (tx, answers) = mpsc::unbounded_channel();
        let mut children = Vec::new();
        let mut stdins = Vec::new();
        for k in 0..settings.procs as usize {
            let log = std::fs::File::create(work.join(format!("worker-{k}.log")))
                .map_err(io(format!("creating worker-{k}.log")))?;
            let mut child = Command::new(binary)
                .args(["bench", "worker", "--settings"])
                .arg(&file)
                .args(["--index", &k.to_string()])
                .env(
                    "RUST_LOG",
                    std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
                )
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(log)
                .kill_on_drop(true)
                .spawn()
                .map_err(io(format!("starting worker {k}")))?;
            stdins.push(child.stdin.take().expect("piped"));
            let stdout = child.stdout.take().expect("piped");
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Ok(answer) = serde_json::from_str::<Answer>(&line) {
                        let _ = tx.send((k, Some(answer)));
                    }
                }
                let _ = tx.send((k, None));
            });
            children.push(child);
        }
        Ok(Workers {
            children,
            stdins,
            answers,
            work: work.to_owned(),
        })
    }

    fn pids(&self) -> Vec<(String, u32)> {
        self.children
            .iter()
            .enumerate()
            .filter_map(|(k, c)| c.id().map(|pid| (format!("worker-{k}"), pid)))
            .collect()
    }

    /// Sends `order` to every worker and waits until each says `Done`,
    /// showing the summed progress on a bar.
    async fn phase(
        &mut self,
        name: &str,
        order: &Order,
    ) -> Result<(Span, Vec<Answer>), BenchError> {
        let start_us = now_us();
        let line = serde_json::to_string(order).expect("orders serialize") + "\n";
        for (k, stdin) in self.stdins.iter_mut().enumerate() {
            stdin
                .write_all(line.as_bytes())
                .await
                .map_err(io(format!("ordering worker {k}")))?;
        }
        let n = self.stdins.len();
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{msg:>9} [{bar:40}] {pos}/{len} ({elapsed})")
                .expect("a valid template")
                .progress_chars("=> "),
        );
        bar.set_message(name.to_owned());
        let mut progress = vec![(0u64, 0u64); n];
        let mut done: Vec<Option<Answer>> = vec![None; n];
        while done.iter().any(Option::is_none) {
            let Some((k, answer)) = self.answers.recv().await else {
                break;
            };
            match answer {
                Some(Answer::Progress { done: d, total }) => progress[k] = (d, total),
                Some(a @ Answer::Done { .. }) => {
                    if let Answer::Done { done: d, total, .. } = &a {
                        progress[k] = (*d, *total);
                    }
                    done[k] = Some(a);
                }
                None => {
                    bar.abandon();
                    return Err(BenchError::Worker(format!(
                        "worker {k} exited during {name}; see {}",
                        self.work.join(format!("worker-{k}.log")).display()
                    )));
                }
            }
            bar.set_length(progress.iter().map(|p| p.1).sum());
            bar.set_position(progress.iter().map(|p| p.0).sum());
        }
        bar.finish_and_clear();
        let answers: Vec<Answer> = done.into_iter().flatten().collect();
        let mut span = Span {
            name: name.to_owned(),
            start_us,
            end_us: now_us(),
            ..Span::default()
        };
        for a in &answers {
            if let Answer::Done {
                done,
                total,
                at_us,
                short,
                ..
            } = a
            {
                span.done += done;
                span.total += total;
                span.done_at_us = span.done_at_us.max(*at_us);
                span.short.extend(short.clone());
            }
        }
        eprintln!(
            "{name}: {} of {} in {:.1} s{}",
            span.done,
            span.total,
            span.seconds(),
            if span.short.is_empty() {
                String::new()
            } else {
                format!(" (short: {})", span.short.join("; "))
            }
        );
        Ok((span, answers))
    }

    /// Waits for every worker to exit (each closes its agents for up to
    /// a minute, then writes its records).
    async fn wait(&mut self) {
        for child in &mut self.children {
            let _ = tokio::time::timeout(Duration::from_secs(120), child.wait()).await;
        }
    }
}

/// Prepares `DIR/work`: made fresh, or replaced when an earlier bench made
/// it; anything else there is refused (never deleted).
fn prepare_work(report: &Path) -> Result<PathBuf, BenchError> {
    let work = report.join("work");
    if work.exists() {
        if !work.join(WORK_MARKER).exists() {
            return Err(BenchError::Args(format!(
                "{} exists and was not made by rollcall bench; remove it or choose another --report",
                work.display()
            )));
        }
        std::fs::remove_dir_all(&work).map_err(io(format!("removing {}", work.display())))?;
    }
    std::fs::create_dir_all(&work).map_err(io(format!("creating {}", work.display())))?;
    std::fs::write(work.join(WORK_MARKER), b"made by rollcall bench fleet\n")
        .map_err(io("writing the work marker"))?;
    Ok(work)
}

/// The arbiter counters of interest from one `/metrics` text.
fn counters(text: &str) -> ArbiterCounters {
    let m = |name: &str| arbiters::metric(text, &format!("rollcall_arbiter_{name}"));
    let mean = |name: &str| {
        let sum = m(&format!("{name}_sum"))?;
        let count = m(&format!("{name}_count"))?;
        (count > 0.0).then(|| sum / count)
    };
    ArbiterCounters {
        commits: m("commits_total"),
        connected_agents: m("connected_agents"),
        snapshots_sent: m("snapshots_sent"),
        snapshots_refused: m("snapshots_refused"),
        snapshots_in_flight_max: m("snapshots_in_flight_max"),
        held_leases: m("held_leases"),
        commit_mean_ms: mean("commit_latency_seconds").map(|s| s * 1e3),
        batch_mean: mean("batch_size"),
        session_state_bytes: m("session_state_bytes"),
        subscription_state_bytes: m("subscription_state_bytes"),
        udp_drops: None,
    }
}

/// Runs the bench; the report is written to `args.report` and returned.
pub async fn run(args: &FleetArgs) -> Result<Report, BenchError> {
    args.shape
        .validate()
        .map_err(|e| BenchError::Args(e.to_string()))?;
    if args.procs == 0 || args.procs > 64 {
        return Err(BenchError::Args(format!(
            "--procs = {}: must be 1 to 64",
            args.procs
        )));
    }
    if !(args.duration_s > 0.0 && args.duration_s <= 86_400.0) {
        return Err(BenchError::Args(format!(
            "--duration-s = {}: must be above 0 and at most 86400",
            args.duration_s
        )));
    }
    if args.arbiters.is_empty() && ![1, 3].contains(&args.spawn) {
        return Err(BenchError::Args(format!(
            "--spawn = {}: must be 1 or 3",
            args.spawn
        )));
    }
    std::fs::create_dir_all(&args.report)
        .map_err(io(format!("creating {}", args.report.display())))?;
    let work = prepare_work(&args.report)?;
    let http = reqwest::Client::new();

    // The arbiters and the CA the agents' certificates come from.
    let mut started = Vec::new();
    let (replicas, ca_dir, bound) = if args.arbiters.is_empty() {
        let certs = arbiters::certs_dir(&work);
        arbiters::make_certs(&certs, args.spawn)?;
        let (replicas, procs) = arbiters::spawn(&args.binary, &work, &certs, args.spawn)?;
        started = procs;
        arbiters::wait_ready(&http, &replicas, &work).await?;
        let bound = ArbiterConfig::default()
            .distribution
            .max_concurrent_snapshots;
        (replicas, certs, Some(u64::from(bound)))
    } else {
        let certs = args.certs.clone().ok_or_else(|| {
            BenchError::Args(
                "--arbiter needs --certs DIR: the region's ca.crt and ca.key, to issue the agents' certificates".into(),
            )
        })?;
        let replicas: Vec<Replica> = args
            .arbiters
            .iter()
            .enumerate()
            .map(|(k, quic)| Replica {
                quic: quic.clone(),
                admin: args.admin.get(k).copied(),
                pid: quic
                    .rsplit_once(':')
                    .and_then(|(_, p)| p.parse().ok())
                    .and_then(arbiters::pid_of_udp_port),
            })
            .collect();
        if replicas.iter().any(|r| r.admin.is_some()) {
            arbiters::wait_ready(&http, &replicas, &work).await?;
        }
        (replicas, certs, None)
    };
    let sampler = Sampler::start(Duration::from_millis(500));
    for (k, r) in replicas.iter().enumerate() {
        if let Some(pid) = r.pid {
            sampler.watch(&format!("arbiter-{}", k + 1), pid);
        }
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let settings = WorkerSettings {
        shape: args.shape.clone(),
        procs: args.procs,
        arbiters: replicas.iter().map(|r| r.quic.clone()).collect(),
        ca_dir,
        threads: (cores / args.procs as usize).max(1),
    };
    let plan = Plan::new(&args.shape);
    eprintln!(
        "fleet bench: {} agents, {} instances in {} services, {} followed per agent; {} worker(s); arbiters {}",
        args.shape.agents,
        args.shape.instances,
        args.shape.services,
        args.shape.follow,
        args.procs,
        settings.arbiters.join(", ")
    );
    let mut workers = Workers::start(&args.binary, &work, &settings).await?;
    for (name, pid) in workers.pids() {
        sampler.watch(&name, pid);
    }
    let admins: Vec<(String, SocketAddr)> = replicas
        .iter()
        .enumerate()
        .filter_map(|(k, r)| Some((format!("arbiter-{}", k + 1), r.admin?)))
        .collect();
    // Each replica's QUIC port, for the drops at its socket.
    let quic_ports: HashMap<String, u16> = replicas
        .iter()
        .enumerate()
        .filter_map(|(k, r)| {
            let port = r.quic.parse::<SocketAddr>().ok()?.port();
            Some((format!("arbiter-{}", k + 1), port))
        })
        .collect();
    // Every replica's counters at a phase's end.
    let scrape = |phase: &str| {
        let (http, admins, phase) = (http.clone(), admins.clone(), phase.to_owned());
        let quic_ports = quic_ports.clone();
        async move {
            let mut out = Vec::new();
            for (name, admin) in admins {
                let text = arbiters::metrics_text(&http, admin)
                    .await
                    .unwrap_or_default();
                let mut c = counters(&text);
                c.udp_drops = quic_ports
                    .get(&name)
                    .and_then(|p| arbiters::udp_drops(*p))
                    .map(|d| d as f64);
                out.push((phase.clone(), name, c));
            }
            out
        }
    };
    let mut spans = Vec::new();
    let mut scraped = Vec::new();
    let mut storm_samples = Vec::new();
    let phase = async |workers: &mut Workers, name: &str, order: Order| {
        sampler.mark();
        let (span, answers) = workers.phase(name, &order).await?;
        sampler.mark();
        Ok::<_, BenchError>((span, answers))
    };
    for (name, order) in [
        ("connect", Order::Connect),
        ("register", Order::Register),
        ("follow", Order::Follow),
    ] {
        let (span, _) = phase(&mut workers, name, order).await?;
        spans.push(span);
        scraped.extend(scrape(name).await);
    }
    if args.scenario.runs(Scenario::Steady) {
        sampler.mark();
        let start_us = now_us();
        let bar = indicatif::ProgressBar::new(args.duration_s.ceil() as u64);
        bar.set_message("steady");
        let until = tokio::time::Instant::now() + Duration::from_secs_f64(args.duration_s);
        while tokio::time::Instant::now() < until {
            tokio::time::sleep_until(
                until.min(tokio::time::Instant::now() + Duration::from_secs(1)),
            )
            .await;
            bar.inc(1);
        }
        bar.finish_and_clear();
        sampler.mark();
        let span = Span {
            name: "steady".into(),
            start_us,
            end_us: now_us(),
            done: 1,
            total: 1,
            done_at_us: now_us(),
            short: Vec::new(),
        };
        eprintln!("steady: {:.1} s", span.seconds());
        spans.push(span);
        scraped.extend(scrape("steady").await);
    }
    let window_us = (args.duration_s * 1e6) as u64;
    let drain_ms = DRAIN_MS.min(window_us / 1_000);
    if args.scenario.runs(Scenario::Deploy) {
        let order = Order::Deploy {
            start_us: now_us() + 1_000_000,
            window_us,
            drain_ms,
        };
        let (span, _) = phase(&mut workers, "deploy", order).await?;
        spans.push(span);
        scraped.extend(scrape("deploy").await);
    }
    if args.scenario.runs(Scenario::Storm) {
        let (span, _) = phase(&mut workers, "cut", Order::Cut).await?;
        spans.push(span);
        let order = Order::Churn {
            concurrency: CHURN_CONCURRENCY,
        };
        let (span, answers) = phase(&mut workers, "churn", order).await?;
        let cut_for = Duration::from_micros(
            now_us().saturating_sub(spans.last().map_or(0, |s: &Span| s.start_us)),
        );
        spans.push(span);
        tokio::time::sleep(Duration::from_millis(MIN_CUT_MS).saturating_sub(cut_for)).await;
        let required: Vec<(u32, u64)> = answers
            .into_iter()
            .flat_map(|a| match a {
                Answer::Done { required, .. } => required,
                Answer::Progress { .. } => Vec::new(),
            })
            .collect();
        // The arbiter's snapshots in flight and held leases, sampled
        // through the heal.
        let samples: Arc<Mutex<Vec<(f64, f64)>>> = Arc::default();
        let sampling = {
            let (http, admins, samples) = (http.clone(), admins.clone(), samples.clone());
            tokio::spawn(async move {
                if admins.is_empty() {
                    return;
                }
                loop {
                    // The most of any replica: each bounds its own.
                    let mut most = (0.0f64, 0.0f64);
                    for (_, admin) in &admins {
                        if let Ok(text) = arbiters::metrics_text(&http, *admin).await {
                            let m = |name| arbiters::metric(&text, name).unwrap_or(0.0);
                            most.0 = most.0.max(m("rollcall_arbiter_snapshots_in_flight"));
                            most.1 = most.1.max(m("rollcall_arbiter_held_leases"));
                        }
                    }
                    samples.lock().expect("samples lock").push(most);
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            })
        };
        let deadline_ms = 120_000 + u64::from(args.shape.agents) * 20;
        let order = Order::Heal {
            required,
            deadline_ms,
        };
        let result = phase(&mut workers, "heal", order).await;
        sampling.abort();
        let (span, _) = result?;
        spans.push(span);
        storm_samples = std::mem::take(&mut *samples.lock().expect("samples lock"));
        scraped.extend(scrape("storm").await);
    }
    let mut record_files = Vec::new();
    for k in 0..args.procs {
        record_files.push(work.join(format!("records-{k}.json")));
    }
    for (k, stdin) in workers.stdins.iter_mut().enumerate() {
        let order = Order::Finish {
            records: record_files[k].clone(),
        };
        let line = serde_json::to_string(&order).expect("orders serialize") + "\n";
        stdin
            .write_all(line.as_bytes())
            .await
            .map_err(io(format!("ordering worker {k}")))?;
    }
    workers.wait().await;
    sampler.mark();
    arbiters::stop(&mut started).await;
    let processes = sampler.finish();
    // A worker that wrote no records (killed, or stuck past its wait)
    // leaves the report incomplete, not unwritten: the phases, the
    // arbiters' counters and the processes' samples still tell a lot.
    let mut records = Vec::new();
    let mut lost = Vec::new();
    for (k, file) in record_files.iter().enumerate() {
        let read = std::fs::read(file)
            .map_err(|e| e.to_string())
            .and_then(|bytes| serde_json::from_slice::<Records>(&bytes).map_err(|e| e.to_string()));
        match read {
            Ok(r) => records.push(r),
            Err(e) => lost.push(format!(
                "worker {k} left no records ({}: {e}); its agents' figures are missing (see work/worker-{k}.log)",
                file.display()
            )),
        }
    }
    // The arbiters' data (large) and the CA key go; configs and logs stay.
    for k in 1..=started.len() {
        let _ = std::fs::remove_dir_all(work.join(format!("arbiter-{k}")));
    }
    let _ = std::fs::remove_dir_all(arbiters::certs_dir(&work));

    let report = compute(
        args,
        &plan,
        Computed {
            spans,
            scraped,
            storm_samples,
            records,
            lost,
            processes,
            bound,
            cores,
        },
    );
    let plots =
        plot::write_all(&args.report, &report.0, &report.1).map_err(io("writing the plots"))?;
    report::write(&args.report, &report.0, &plots).map_err(io("writing the report"))?;
    Ok(report.0)
}

#[cfg(test)]
mod tests;
