//! `rollcall chaos run`: builds a real cluster in network namespaces and
//! drives a scenario through it while the traffic generator records every
//! connection.
//!
//! Layout: the arbiter replicas (`arbiters`, a Raft group) run in the root
//! namespace on bridge addresses 10.S.0.1, .3, .4, … (and reach each other
//! through delaying UDP relays on .240, .241, … when the scenario delays a
//! follower); each node is a namespace (10.S.0.10 + i) holding one
//! `rollcall agent` (HTTP API on :7070, TCP proxy for the scenario's
//! service on :15001, gossip on :7946) and its `rollcall echo` backends
//! (:9000 + k, HTTP health on :10000 + k); nodes are spread over the
//! scenario's zones round robin; the traffic generator sends from 10.S.0.2
//! to every node's proxy. Every process is the `rollcall` binary itself,
//! started with its real config files and certificates from `rollcall
//! certs`.
//!
//! Leave commits come from the arbiter's audit log after the run (the
//! command's time, converted to run time), not from polling.
//!
//! Everything started is stopped when the run ends, fails or is dropped
//! (Ctrl-C): processes are resumed and killed, namespaces and links removed.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rollcall_leases::clock::now_ms;

use crate::degraded::{self, DegradedFigures, StaleAnswer};
use crate::history::{self, Answer, Cause, FinalRecord, WriteKind};
use crate::netns::{NetError, Topology};
use crate::report::{Corruption, HistoryFigures};
use crate::scenario::{Action, Scenario, Step};
use crate::timeline::{Event, RegionAnswer, Route, Timeline};
use crate::traffic::{Target, Traffic, TrafficConfig};

mod drive;
mod faults;
mod launch;
mod observe;
mod regions;
mod rogue;
mod step;

// The run's parts share this module's types and each other's functions.
use drive::*;
use faults::*;
use launch::*;
use observe::*;
use step::*;

/// Why a run could not be carried out.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The namespaces could not be built.
    #[error(transparent)]
    Net(#[from] NetError),
    /// A file or process could not be made.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The cluster did not come up, or a step could not be done.
    #[error("{0}")]
    Cluster(String),
    /// The scenario needs something this binary lacks (fault points).
    #[error("{0}")]
    Unsupported(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RunError {
    let what = what.into();
    move |source| RunError::Io { what, source }
}

/// What `run` needs besides the scenario.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The `rollcall` binary every process runs.
    pub binary: PathBuf,
    /// Where configs, data and logs go (`work/` under it).
    pub dir: PathBuf,
    /// Names the run's interfaces: 1–6 lowercase letters or digits.
    pub run_id: String,
    /// The bridge's /24 is 10.`subnet`.0.0.
    pub subnet: u8,
    /// Seeds the choices of `crash_rounds` and `pause_rounds`.
    pub seed: u64,
}

/// Every process of the run; killed (after being resumed) when dropped.
#[derive(Default)]
struct Processes {
    children: Vec<(String, Child)>,
}

impl Processes {
    /// Whether the named process runs (was started and has not exited).
    fn running(&mut self, name: &str) -> bool {
        self.children
            .iter_mut()
            .any(|(n, c)| n == name && matches!(c.try_wait(), Ok(None)))
    }

    fn pid(&self, name: &str) -> Option<u32> {
        self.children
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, c)| c.id())
    }

    fn signal(&self, name: &str, signal: &str) -> Result<(), RunError> {
        let pid = self
            .pid(name)
            .ok_or_else(|| RunError::Cluster(format!("no process named {name}")))?;
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .map_err(io(format!("kill {signal} {name}")))?;
        if status.success() {
            Ok(())
        } else {
            Err(RunError::Cluster(format!(
                "kill {signal} {name} (pid {pid}) failed"
            )))
        }
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            if !matches!(child.try_wait(), Ok(None)) {
                continue;
            }
            let _ = Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .stderr(Stdio::null())
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One silent crash of a node: from `from` until `to` (run ms), while
/// its agent and backends are frozen and its link is down.
#[derive(Clone, Copy, Debug)]
struct Crash {
    node: usize,
    from: u64,
    to: Option<u64>,
}

/// The run's crashes, shared with the route sampler.
#[derive(Clone, Default)]
struct Crashes(std::sync::Arc<std::sync::Mutex<Vec<Crash>>>);

impl Crashes {
    fn all(&self) -> Vec<Crash> {
        self.0.lock().expect("crashes lock").clone()
    }

    /// Nodes crashed now.
    fn down(&self) -> Vec<usize> {
        self.all()
            .iter()
            .filter(|c| c.to.is_none())
            .map(|c| c.node)
            .collect()
    }

    fn start(&self, node: usize, at: u64) {
        self.0.lock().expect("crashes lock").push(Crash {
            node,
            from: at,
            to: None,
        });
    }

    /// Ends node's crash at `at`; false when it was not crashed.
    fn end(&self, node: usize, at: u64) -> bool {
        let mut crashes = self.0.lock().expect("crashes lock");
        match crashes
            .iter_mut()
            .find(|c| c.node == node && c.to.is_none())
        {
            Some(c) => {
                c.to = Some(at);
                true
            }
            None => false,
        }
    }
}

/// The cluster of one run.
struct Cluster {
    topology: Topology,
    processes: Processes,
    work: PathBuf,
    binary: PathBuf,
    /// Each replica's QUIC and admin address (replica k is index k − 1).
    arbiters: Vec<(SocketAddr, SocketAddr)>,
    traffic_ip: Ipv4Addr,
    nodes: Vec<String>,
    /// Each node's zone.
    zones: Vec<String>,
    /// Each node's instances, with their echo ports (same order).
    instances: Vec<Vec<String>>,
    ports: Vec<Vec<u16>>,
    /// The scenario's service.
    service: String,
    /// Partitions in force: a node and the addresses it cannot reach.
    cuts: Vec<(usize, Vec<Ipv4Addr>)>,
    /// `ROLLCALL_FAULTS` for the arbiter replicas (fault-point scenarios).
    faults: Option<String>,
    /// The agents' `gossip.preset`, when the scenario names one.
    gossip_preset: Option<String>,
    agent_toml: Option<String>,
    /// The scenario's extra services (`extra-0`, `extra-1`, …).
    extra_services: u32,
    /// UDP relays the replicas reach each other through (index = replica),
    /// when the scenario delays a follower; empty otherwise.
    relays: Vec<crate::relay::Relay>,
    /// Instances whose readiness a bad probe failed while they were fine:
    /// their UNHEALTHY commits are not leaves (traffic is meant to stay).
    bad_probed: Vec<String>,
    http: reqwest::Client,
    /// Node crashes so far: while a node is crashed its own callers are
    /// dead, so their traffic is not counted, and its agent is not sampled.
    crashed: Crashes,
    /// Every write made through an agent's API, with its answer (the
    /// history check's client side).
    writes: std::sync::Mutex<Vec<history::Write>>,
    /// What the scenario did to instances, for the history check.
    causes: Vec<Cause>,
    /// Each node crash as (node, wall ms), for crash → commit.
    crash_walls: Vec<(usize, u64)>,
    /// Node index and wall-clock ms of every `restart_node`: a crash's
    /// commit must come before its node's restart (the new epoch's
    /// registrations replace the frozen epoch's records without one).
    restart_walls: Vec<(usize, u64)>,
    /// The run's seeded generator (which node a round faults).
    rng: u64,
    /// A leader election, [kill, first answered commit) in run ms.
    election: Option<(u64, u64)>,
    /// What a `corrupt_cache` step found.
    corruption: Option<Corruption>,
    /// The topology index of r1's bridge host, in a multi-region run.
    bridge_host: Option<usize>,
    /// The regions other than r1, in a multi-region run.
    regions: Vec<regions::RegionHost>,
    /// Backends killed by `kill_backend` or `kill_backends` and not yet
    /// started again: (node, instance, port).
    killed: Vec<(usize, String, u16)>,
    /// The rogue's host address, when the scenario has a `rogue` step.
    rogue_ip: Option<Ipv4Addr>,
    /// The running `rogue` step.
    rogue: Option<tokio::task::JoinHandle<crate::rogue::RogueFigures>>,
}

const ECHO_PORT: u16 = 9000;
const PROXY_PORT: u16 = 15001;
const HTTP_PORT: u16 = 7070;
const GOSSIP_PORT: u16 = 7946;
/// Waits for the cluster to come up; bounds a hang, not a timing claim.
const PATIENCE: Duration = Duration::from_secs(60);

impl Cluster {
    fn spawn(&mut self, name: &str, node: Option<usize>, args: &[String]) -> Result<(), RunError> {
        self.spawn_env(name, node, args, &[])
    }

    /// Starts `name` (in node `node`'s namespace, or the root one) with
    /// extra environment; its stderr is appended to work/`name`.log.
    fn spawn_env(
        &mut self,
        name: &str,
        node: Option<usize>,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Result<(), RunError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.work.join(format!("{name}.log")))
            .map_err(io(format!("opening {name}.log")))?;
        let mut command = match node {
            Some(i) => self.topology.command(i, &self.binary.display().to_string()),
            None => Command::new(&self.binary),
        };
        let child = command
            .args(args)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(io(format!("starting {name}")))?;
        self.processes.children.push((name.to_owned(), child));
        Ok(())
    }

    fn node_ip(&self, i: usize) -> Ipv4Addr {
        self.topology.nodes[i].ip
    }

    fn token(&self, i: usize) -> Result<String, RunError> {
        let path = self.work.join(&self.nodes[i]).join("agent.token");
        std::fs::read_to_string(&path)
            .map(|t| t.trim().to_owned())
            .map_err(io(format!("reading {}", path.display())))
    }

    /// Records that the scenario did `what` to `instance` now.
    fn cause(&mut self, instance: &str, what: &str) {
        self.causes.push(Cause {
            at_ms: now_ms(),
            instance: instance.to_owned(),
            what: what.to_owned(),
        });
    }

    /// The next number of the run's seeded generator (xorshift64).
    fn random(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// Records a write made through an agent's API and its answer.
    fn wrote(&self, sent_ms: u64, kind: WriteKind, instance: &str, answer: Answer) {
        self.writes
            .lock()
            .expect("writes lock")
            .push(history::Write {
                sent_ms,
                kind,
                instance: instance.to_owned(),
                answer,
            });
    }

    async fn agent_get(&self, i: usize, path: &str) -> Option<serde_json::Value> {
        let url = format!("http://{}:{HTTP_PORT}{path}", self.node_ip(i));
        self.http.get(url).send().await.ok()?.json().await.ok()
    }

    async fn wait(&self, what: &str, mut check: impl AsyncFnMut() -> bool) -> Result<(), RunError> {
        let start = Instant::now();
        while !check().await {
            if start.elapsed() > PATIENCE {
                return Err(RunError::Cluster(format!(
                    "gave up waiting ({} s): {what}; logs in {}",
                    PATIENCE.as_secs(),
                    self.work.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// The nodes a step's target names: a zone ("z2": all its nodes), or
    /// nodes separated by commas ("node-1,node-3").
    fn nodes_named(&self, target: &str) -> Result<Vec<usize>, RunError> {
        if self.zones.iter().any(|z| z == target) {
            return Ok((0..self.nodes.len())
                .filter(|i| self.zones[*i] == target)
                .collect());
        }
        target
            .split(',')
            .map(|n| self.target(n.trim()).map(|(i, _)| i))
            .collect()
    }

    /// The node index and instance a step's target names: `node-2` or
    /// `node-2/web-2-0`.
    fn target(&self, target: &str) -> Result<(usize, Option<String>), RunError> {
        let (node, instance) = match target.split_once('/') {
            Some((n, i)) => (n, Some(i.to_owned())),
            None => (target, None),
        };
        let i =
            self.nodes.iter().position(|n| n == node).ok_or_else(|| {
                RunError::Cluster(format!("step target {target:?}: no node {node}"))
            })?;
        if let Some(id) = &instance {
            if !self.instances[i].contains(id) {
                return Err(RunError::Cluster(format!(
                    "step target {target:?}: node {node} has no instance {id}"
                )));
            }
        }
        Ok((i, instance))
    }
}

/// What a run measured.
#[derive(Clone, Debug, Default)]
pub struct RunResult {
    /// The records (times in real ms since the traffic started).
    pub timeline: Timeline,
    /// Live, healthy instances the catalog took out of READY, from the
    /// history check.
    pub false_removals: u64,
    /// The history check; `None` when the audit log could not be read.
    pub history: Option<HistoryFigures>,
    /// Per crashed node, fault → the arbiter's commit, ms.
    pub crash_commit_ms: Vec<u64>,
    /// A leader election, [kill, first answered commit) in run ms.
    pub election: Option<(u64, u64)>,
    /// What a `corrupt_cache` step found.
    pub cache_corruption: Option<Corruption>,
    /// Whether stale copies were served degraded exactly while past their
    /// maximum age; `None` unless the scenario checks it.
    pub degraded: Option<DegradedFigures>,
    /// What a `rogue` step tried and what came of it.
    pub rogue: Option<crate::rogue::RogueFigures>,
    /// The arbiter outage, `[start, end)` in run ms, if the scenario had one
    /// (an outage still running at the end ends there).
    pub outage: Option<(u64, u64)>,
    /// The most full snapshots the arbiter served at once (its metric, since
    /// its last start).
    pub max_concurrent_snapshots: u64,
    /// Snapshot requests the arbiter told to retry (its metric).
    pub snapshots_refused: u64,
    /// The config files the run's first agent and first arbiter replica
    /// ran with (every agent's differs only in names and addresses), for
    /// the budget of the same settings.
    pub configs: (PathBuf, PathBuf),
}

/// Builds the cluster, runs the scenario, tears everything down, and returns
/// what it measured.
pub async fn run(scenario: &Scenario, options: &RunOptions) -> Result<RunResult, RunError> {
    if scenario.needs_fault_injection && !has_fault_points(&options.binary)? {
        return Err(RunError::Unsupported(format!(
            "scenario {} needs fault points, and {} was built without them: build it with `cargo build --release --features fault-injection` and run that binary",
            scenario.name,
            options.binary.display()
        )));
    }
    let work = options.dir.join("work");
    // A run into the same report directory starts from nothing: an
    // earlier run's arbiter store would hand this one its catalog (its
    // records then counted as lost writes of this run).
    if work.exists() {
        std::fs::remove_dir_all(&work)
            .map_err(io(format!("removing the earlier run's {}", work.display())))?;
    }
    std::fs::create_dir_all(&work).map_err(io(format!("creating {}", work.display())))?;
    let nodes: Vec<String> = (0..scenario.agents).map(|i| format!("node-{i}")).collect();
    // The other regions' hosts come after the nodes.
    let hosts: Vec<String> = nodes
        .iter()
        .cloned()
        .chain(regions::host_names(scenario))
        .collect();
    let topology = Topology::create(&options.run_id, options.subnet, &hosts)?;
    let (bridge_host, region_hosts) = regions::hosts(scenario, nodes.len());
    let traffic_ip = topology.add_host_ip(2)?;
    // Replica 1 on the bridge's own address, the others on .3, .4, …
    let mut arbiter_ips = vec![topology.host_ip];
    for k in 1..scenario.arbiters as u8 {
        arbiter_ips.push(topology.add_host_ip(2 + k)?);
    }
    let mut cluster = Cluster {
        arbiters: arbiter_ips
            .iter()
            .map(|ip| {
                (
                    SocketAddr::new((*ip).into(), 7443),
                    SocketAddr::new((*ip).into(), 7071),
                )
            })
            .collect(),
        topology,
        processes: Processes::default(),
        work: work.clone(),
        binary: options.binary.clone(),
        traffic_ip,
        instances: (0..nodes.len())
            .map(|i| {
                (0..scenario.instances_per_agent)
                    .map(|k| format!("{}-{i}-{k}", scenario.service))
                    .collect()
            })
            .collect(),
        ports: (0..nodes.len())
            .map(|_| {
                (0..scenario.instances_per_agent as u16)
                    .map(|k| ECHO_PORT + k)
                    .collect()
            })
            .collect(),
        zones: (0..nodes.len())
            .map(|i| format!("z{}", i as u32 % scenario.zones + 1))
            .collect(),
        service: scenario.service.clone(),
        cuts: Vec::new(),
        relays: Vec::new(),
        bad_probed: Vec::new(),
        faults: scenario.faults.clone(),
        gossip_preset: scenario.gossip_preset.clone(),
        agent_toml: scenario.agent_toml.clone(),
        extra_services: scenario.extra_services,
        nodes,
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| RunError::Cluster(format!("HTTP client: {e}")))?,
        crashed: Crashes::default(),
        writes: Default::default(),
        causes: Vec::new(),
        crash_walls: Vec::new(),
        restart_walls: Vec::new(),
        // xorshift64 needs a non-zero state.
        rng: options.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
        election: None,
        corruption: None,
        bridge_host,
        regions: region_hosts,
        killed: Vec::new(),
        rogue_ip: None,
        rogue: None,
    };
    if scenario.steps.iter().any(|s| s.action == Action::Rogue) {
        cluster.rogue_ip = Some(cluster.topology.add_host_ip(rogue::HOST)?);
    }
    if cluster.arbiters.len() > 1
        && scenario
            .steps
            .iter()
            .any(|s| s.action == Action::DelayFollower)
    {
        for k in 0..cluster.arbiters.len() {
            let ip = cluster.topology.add_host_ip(240 + k as u8)?;
            let relay = crate::relay::Relay::start(
                SocketAddr::new(ip.into(), cluster.arbiters[k].0.port()),
                cluster.arbiters[k].0,
            )
            .await
            .map_err(io(format!("starting the relay for arbiter-{}", k + 1)))?;
            cluster.relays.push(relay);
        }
    }
    start(&mut cluster, scenario).await?;
    drive(&mut cluster, scenario).await
}

/// Whether `binary --version` lists the fault-injection feature.
fn has_fault_points(binary: &Path) -> Result<bool, RunError> {
    let out = Command::new(binary)
        .arg("--version")
        .output()
        .map_err(io(format!("{} --version", binary.display())))?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.trim() == "features: fault-injection"))
}

/// Where a run's files go by default: `chaos-reports/<scenario>`.
pub fn default_dir(scenario: &Scenario) -> PathBuf {
    Path::new("chaos-reports").join(&scenario.name)
}
