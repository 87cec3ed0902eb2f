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

mod regions;
mod rogue;

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

/// Certificates, the arbiter, agents and backends; returns when every agent
/// routes to every instance.
async fn start(cluster: &mut Cluster, scenario: &Scenario) -> Result<(), RunError> {
    let work = cluster.work.clone();
    let certs = work.join("certs");
    let mut args: Vec<String> = vec![
        "certs".into(),
        "--out".into(),
        certs.display().to_string(),
        "--region".into(),
        "r1".into(),
    ];
    // Each replica's certificate names its own address (and its relay's,
    // which its peers dial): the peer link admits a replica only by a
    // member's address, so every run exercises that check.
    for (k, (quic, _)) in cluster.arbiters.iter().enumerate() {
        let mut own = quic.ip().to_string();
        if let Some(relay) = cluster.relays.get(k) {
            own.push_str(&format!(",{}", relay.addr.ip()));
        }
        args.extend(["--arbiter".into(), format!("arbiter-{}={own}", k + 1)]);
    }
    // Each agent's certificate names its node's address as an IP SAN: what
    // the arbiter (`registration.addresses = "declared"`, the default) lets
    // the node register, as on a production fleet.
    for (i, node) in cluster.nodes.iter().enumerate() {
        args.extend(["--agent".into(), format!("{node}={}", cluster.node_ip(i))]);
    }
    if let Some(ip) = cluster.rogue_ip {
        args.extend(rogue::cert_args(ip));
    }
    if let Some(host) = cluster.bridge_host {
        args.extend([
            "--bridge".into(),
            "bridge-r1".into(),
            "--ip".into(),
            cluster.node_ip(host).to_string(),
        ]);
    }
    let status = Command::new(&cluster.binary)
        .args(&args)
        .stdout(Stdio::null())
        .status()
        .map_err(io("rollcall certs"))?;
    if !status.success() {
        return Err(RunError::Cluster("rollcall certs failed".into()));
    }
    if cluster.rogue_ip.is_some() {
        rogue::revoke(cluster, &certs)?;
    }
    let key = Command::new(&cluster.binary)
        .args(["gossip-key", "--id", "1"])
        .output()
        .map_err(io("rollcall gossip-key"))?;
    std::fs::write(work.join("zone.key"), &key.stdout).map_err(io("writing zone.key"))?;

    let replicas: String = if cluster.arbiters.len() == 1 {
        String::new()
    } else {
        cluster
            .arbiters
            .iter()
            .enumerate()
            .map(|(k, (quic, _))| {
                // Peers dial the replica's relay when there is one.
                let addr = cluster.relays.get(k).map_or(*quic, |r| r.addr);
                format!("[[raft.replicas]]\nid = {}\naddr = \"{addr}\"\n", k + 1)
            })
            .collect()
    };
    for k in 0..cluster.arbiters.len() {
        let (quic, admin) = cluster.arbiters[k];
        let mut toml = format!(
            "name = \"arbiter-{id}\"\nlisten = \"{quic}\"\nadmin = \"{admin}\"\ndata_dir = \"{data}\"\n[tls]\nca = \"{c}/ca.crt\"\ncert = \"{c}/arbiter-arbiter-{id}.crt\"\nkey = \"{c}/arbiter-arbiter-{id}.key\"\n[raft]\nid = {id}\n{replicas}",
            id = k + 1,
            data = work.join(format!("arbiter-{}", k + 1)).display(),
            c = certs.display()
        );
        if let Some(extra) = &scenario.arbiter_toml {
            toml.push('\n');
            toml.push_str(extra);
            toml.push('\n');
        }
        if cluster.rogue_ip.is_some() {
            toml.push_str(&rogue::node_zones(cluster));
        }
        let path = work.join(format!("arbiter-{}.toml", k + 1));
        std::fs::write(&path, toml).map_err(io(format!("writing {}", path.display())))?;
        start_arbiter(cluster, k)?;
    }
    for i in 0..cluster.nodes.len() {
        for k in 0..cluster.instances[i].len() {
            let (id, port) = (cluster.instances[i][k].clone(), cluster.ports[i][k]);
            start_echo(cluster, i, &id, port)?;
        }
        start_agent(cluster, i)?;
    }
    for i in 0..cluster.nodes.len() {
        let node = cluster.nodes[i].clone();
        cluster
            .wait(&format!("{node} connected to the arbiter"), async || {
                cluster
                    .agent_get(i, "/v1/status")
                    .await
                    .is_some_and(|s| s["arbiter"]["connected"] == true)
            })
            .await?;
        for k in 0..cluster.instances[i].len() {
            let (id, port) = (cluster.instances[i][k].clone(), cluster.ports[i][k]);
            register(cluster, i, &id, port).await?;
        }
    }
    // The extra services: one record each on node-0 whose readiness port
    // has no listener, so it stays STARTING and takes no traffic.
    for k in 0..cluster.extra_services {
        register_record(
            cluster,
            0,
            &format!("extra-{k}"),
            &format!("extra-{k}-0"),
            EXTRA_PORT,
        )
        .await?;
    }
    // Every node knows its zone peers before the first fault: a node that
    // knows nobody would never report a peer down.
    for i in 0..cluster.nodes.len() {
        let peers = cluster
            .zones
            .iter()
            .filter(|z| **z == cluster.zones[i])
            .count()
            - 1;
        cluster
            .wait(
                &format!(
                    "{} sees its {peers} zone peers through gossip",
                    cluster.nodes[i]
                ),
                async || {
                    cluster.agent_get(i, "/v1/status").await.is_some_and(|s| {
                        s["gossip"]["alive"]
                            .as_array()
                            .is_some_and(|a| a.len() == peers)
                    })
                },
            )
            .await?;
    }
    let total: usize = cluster.instances.iter().map(Vec::len).sum();
    for i in 0..cluster.nodes.len() {
        let path = format!("/v1/endpoints/{}", scenario.service);
        cluster
            .wait("every agent routes to every instance", async || {
                cluster
                    .agent_get(i, &path)
                    .await
                    .is_some_and(|b| b["endpoints"].as_array().is_some_and(|e| e.len() == total))
            })
            .await?;
    }
    regions::start(cluster, scenario).await
}

/// An echo backend's HTTP health port: its data port + 1000.
const HEALTH_PORT_OFFSET: u16 = 1000;

/// The file whose existence fails instance `id`'s readiness.
fn not_ready_file(cluster: &Cluster, id: &str) -> PathBuf {
    cluster.work.join(format!("{id}.not-ready"))
}

/// Starts an echo backend `id` on node `i` at `port`, with its HTTP
/// health on `port` + 1000.
fn start_echo(cluster: &mut Cluster, i: usize, id: &str, port: u16) -> Result<(), RunError> {
    let ip = cluster.node_ip(i);
    let flag = not_ready_file(cluster, id).display().to_string();
    cluster.spawn(
        id,
        Some(i),
        &[
            "echo".into(),
            "--listen".into(),
            format!("{ip}:{port}"),
            "--id".into(),
            id.to_owned(),
            "--health".into(),
            format!("{ip}:{}", port + HEALTH_PORT_OFFSET),
            "--not-ready-file".into(),
            flag,
        ],
    )
}

/// The budget's `fanout_us` for this rig, in µs: every agent follows the
/// scenario's service and shares the machine's two cores with the others
/// and the arbiter, so the last agent's view changes after the other
/// agents' wake-ups and applies. Measured (rolling-deploy, 20 agents, 200
/// leaves, 2026-12-03): first → last agent's view change p50 8 ms, so
/// about 8/19 ms per further agent.
const RIG_FANOUT_US: u64 = 420;

/// The budget's `commit_ms` for this rig, in ms: in the same rolling-deploy
/// run the first agent's view changed 3 ms after the drain's proposal
/// (p50), which holds the commit (fsync included), one hop and one apply.
const RIG_COMMIT_MS: u64 = 2;

/// Writes node `i`'s agent config (its zone, its zone's first node as the
/// gossip seed) and starts the agent.
fn start_agent(cluster: &mut Cluster, i: usize) -> Result<(), RunError> {
    let ip = cluster.node_ip(i);
    let zone = cluster.zones[i].clone();
    // The zone's first three nodes: a restarted node rejoins through
    // another even when it is one of them (a member skips itself).
    let seeds = (0..cluster.nodes.len())
        .filter(|j| cluster.zones[*j] == zone)
        .take(3)
        .map(|j| format!("\"{}:{GOSSIP_PORT}\"", cluster.node_ip(j)))
        .collect::<Vec<_>>()
        .join(", ");
    let node = cluster.nodes[i].clone();
    let certs = cluster.work.join("certs");
    let mut toml = format!(
        "node_id = \"{node}\"\nzone = \"{zone}\"\ndata_dir = \"{data}\"\nhttp_listen = \"{ip}:{HTTP_PORT}\"\ndns_listen = \"{ip}:8600\"\narbiters = [\"{arbiter}\"]\nreconnect_min_ms = 50\nreconnect_max_ms = 1000\nservices = [{extra}]\n\
         [tls]\nca = \"{c}/ca.crt\"\ncert = \"{c}/agent-{node}.crt\"\nkey = \"{c}/agent-{node}.key\"\n\
         [gossip]\nlisten = \"{ip}:{GOSSIP_PORT}\"\nseeds = [{seeds}]\nkey_file = \"{k}\"\n{preset}\
         [budget]\ncommit_ms = {RIG_COMMIT_MS}\nfollowers = {followers}\nfanout_us = {RIG_FANOUT_US}\n\
         [[proxy]]\nservice = \"default/{service}/default\"\nlisten = \"{ip}:{PROXY_PORT}\"\n",
        data = cluster.work.join(&node).display(),
        arbiter = cluster
            .arbiters
            .iter()
            .map(|(quic, _)| quic.to_string())
            .collect::<Vec<_>>()
            .join("\", \""),
        c = certs.display(),
        k = cluster.work.join("zone.key").display(),
        extra = (0..cluster.extra_services)
            .map(|k| format!("\"default/extra-{k}/default\""))
            .collect::<Vec<_>>()
            .join(", "),
        preset = cluster
            .gossip_preset
            .as_ref()
            .map_or_else(String::new, |p| format!("preset = \"{p}\"\n")),
        service = cluster.service,
        followers = cluster.nodes.len(),
    );
    if let Some(extra) = &cluster.agent_toml {
        toml.push('\n');
        toml.push_str(extra);
        toml.push('\n');
    }
    let path = cluster.work.join(format!("{node}.toml"));
    std::fs::write(&path, toml).map_err(io(format!("writing {}", path.display())))?;
    cluster.processes.children.retain(|(n, _)| *n != node);
    cluster.spawn(
        &node,
        Some(i),
        &[
            "agent".into(),
            "--config".into(),
            path.display().to_string(),
        ],
    )
}

/// Registers instance `id` (echo on `port`) through node `i`'s agent API,
/// with an HTTP readiness check on its health port at the agent's default
/// timings: STARTING until the first probe passes, UNHEALTHY after three
/// failed or timed-out probes (a frozen backend times out).
async fn register(cluster: &Cluster, i: usize, id: &str, port: u16) -> Result<(), RunError> {
    register_record(cluster, i, &cluster.service, id, port).await
}

/// The port of the extra services' records: nothing listens on it.
const EXTRA_PORT: u16 = 8999;

/// Registers instance `id` of `service` (see [`register`]).
async fn register_record(
    cluster: &Cluster,
    i: usize,
    service: &str,
    id: &str,
    port: u16,
) -> Result<(), RunError> {
    let token = cluster.token(i)?;
    let body = serde_json::json!({
        "service": service,
        "instance_id": id,
        "address": cluster.node_ip(i).to_string(),
        "port": port,
        "checks": {
            "readiness": {"kind": "http", "path": "/ready", "port": port + HEALTH_PORT_OFFSET},
        },
    });
    let url = format!(
        "http://{}:{HTTP_PORT}/v1/agent/instances",
        cluster.node_ip(i)
    );
    let sent = now_ms();
    let response = cluster
        .http
        .put(url)
        .bearer_auth(&token)
        .json(&body)
        .send()
        .await
        .map_err(|e| RunError::Cluster(format!("registering {id}: {e}")))?;
    let status = response.status();
    if !status.is_success() {
        cluster.wrote(sent, WriteKind::Register, id, Answer::Refused);
        return Err(RunError::Cluster(format!("registering {id}: {status}")));
    }
    let body: serde_json::Value = response.json().await.unwrap_or_default();
    let answer = if status == reqwest::StatusCode::ACCEPTED {
        Answer::Pending
    } else {
        Answer::Committed {
            generation: body["generation"].as_u64(),
        }
    };
    cluster.wrote(sent, WriteKind::Register, id, answer);
    Ok(())
}

/// An agent API call with node `i`'s token; fails unless it answers 2xx.
/// The write is recorded for the history check as `kind` about
/// `instance`.
async fn agent_call(
    cluster: &Cluster,
    i: usize,
    method: reqwest::Method,
    path: &str,
    (kind, instance): (WriteKind, &str),
    what: &str,
) -> Result<(), RunError> {
    let token = cluster.token(i)?;
    let url = format!("http://{}:{HTTP_PORT}{path}", cluster.node_ip(i));
    let sent = now_ms();
    let response = cluster
        .http
        .request(method, url)
        .bearer_auth(token)
        .send()
        .await
        .map_err(|e| RunError::Cluster(format!("{what}: {e}")))?;
    let status = response.status();
    let answer = match status {
        reqwest::StatusCode::ACCEPTED => Answer::Pending,
        s if s.is_success() => Answer::Committed { generation: None },
        _ => Answer::Refused,
    };
    cluster.wrote(sent, kind, instance, answer);
    if !status.is_success() {
        return Err(RunError::Cluster(format!("{what}: {status}")));
    }
    Ok(())
}

/// Starts replica `k` (index, id k + 1) unless it runs.
fn start_arbiter(cluster: &mut Cluster, k: usize) -> Result<(), RunError> {
    let name = format!("arbiter-{}", k + 1);
    if cluster.processes.running(&name) {
        return Ok(());
    }
    let config = cluster
        .work
        .join(format!("{name}.toml"))
        .display()
        .to_string();
    cluster.processes.children.retain(|(n, _)| *n != name);
    let faults = cluster.faults.clone();
    let env: Vec<(&str, &str)> = faults
        .as_deref()
        .map(|f| ("ROLLCALL_FAULTS", f))
        .into_iter()
        .collect();
    cluster.spawn_env(
        &name,
        None,
        &["arbiter".into(), "--config".into(), config],
        &env,
    )
}

/// The admin address and token of a replica that runs, if any.
fn running_admin(cluster: &mut Cluster) -> Option<(SocketAddr, String)> {
    (0..cluster.arbiters.len()).find_map(|k| {
        let name = format!("arbiter-{}", k + 1);
        if !cluster.processes.running(&name) {
            return None;
        }
        let token = std::fs::read_to_string(cluster.work.join(&name).join("admin.token")).ok()?;
        Some((cluster.arbiters[k].1, token.trim().to_owned()))
    })
}

/// The leader's replica index as a running replica reports it.
async fn leader(cluster: &mut Cluster) -> Option<usize> {
    for k in 0..cluster.arbiters.len() {
        let name = format!("arbiter-{}", k + 1);
        if !cluster.processes.running(&name) {
            continue;
        }
        let Ok(token) = std::fs::read_to_string(cluster.work.join(&name).join("admin.token"))
        else {
            continue;
        };
        let url = format!("http://{}/v1/cluster", cluster.arbiters[k].1);
        let Ok(response) = cluster.http.get(url).bearer_auth(token.trim()).send().await else {
            continue;
        };
        let Ok(body) = response.json::<serde_json::Value>().await else {
            continue;
        };
        if let Some(id) = body["leader"].as_u64() {
            return Some(id as usize - 1);
        }
    }
    None
}

/// Runs the steps while the traffic flows; returns the timeline.
async fn drive(cluster: &mut Cluster, scenario: &Scenario) -> Result<RunResult, RunError> {
    let targets: Vec<Target> = (0..cluster.nodes.len())
        .map(|i| Target {
            agent: cluster.nodes[i].clone(),
            addr: SocketAddr::new(cluster.node_ip(i).into(), PROXY_PORT),
        })
        .collect();
    let duration = Duration::from_secs_f64(scenario.duration_s);
    let t0 = Instant::now();
    let t0_wall = now_ms();
    let traffic = Traffic::start(
        targets,
        TrafficConfig {
            rate_per_target: scenario.traffic_rate_per_agent,
            connect_timeout: Duration::from_millis(scenario.connect_timeout_ms),
            bind: Some(cluster.traffic_ip.into()),
            max_duration: duration + Duration::from_secs(5),
        },
        t0,
    );
    let routes: std::sync::Arc<std::sync::Mutex<Vec<Route>>> = Default::default();
    let region_answers: std::sync::Arc<std::sync::Mutex<Vec<RegionAnswer>>> = Default::default();
    let views: std::sync::Arc<std::sync::Mutex<Vec<Route>>> = Default::default();
    let stale_answers: Records<StaleAnswer> = Default::default();
    let watchers: Vec<tokio::task::JoinHandle<()>> = (0..cluster.nodes.len())
        .map(|i| {
            tokio::spawn(watch_view(
                views.clone(),
                (i, cluster.nodes[i].clone(), cluster.node_ip(i)),
                scenario.service.clone(),
                cluster.crashed.clone(),
                t0,
                duration + Duration::from_secs(5),
            ))
        })
        .collect();
    let sampler = tokio::spawn(sample_routes(
        (
            routes.clone(),
            (!cluster.regions.is_empty()).then(|| region_answers.clone()),
            scenario
                .pass
                .degraded_max_age_ms
                .map(|_| stale_answers.clone()),
        ),
        cluster.http.clone(),
        (0..cluster.nodes.len())
            .map(|i| (cluster.nodes[i].clone(), cluster.node_ip(i)))
            .collect(),
        scenario.service.clone(),
        cluster.crashed.clone(),
        t0,
        duration + Duration::from_secs(5),
    ));
    // Every instance was READY when the traffic started (`start` waits
    // for every agent to route to all of them).
    let mut events: Vec<Event> = cluster
        .instances
        .iter()
        .flatten()
        .map(|id| Event::Ready {
            t_ms: 0,
            instance: id.clone(),
        })
        .collect();
    let mut outage: Option<(u64, Option<u64>)> = None;
    let mut steps: Vec<_> = scenario.steps.iter().collect();
    steps.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    // The run's progress on stderr (drawn only on a terminal).
    let bar = indicatif::ProgressBar::new(duration.as_millis() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{prefix} [{bar:40}] {elapsed_precise}/{duration_precise} {msg}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    bar.set_prefix(scenario.name.clone());
    let ticker = {
        let bar = bar.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            loop {
                tick.tick().await;
                bar.set_position(t0.elapsed().as_millis() as u64);
            }
        })
    };
    for step in steps {
        let at = t0 + Duration::from_secs_f64(step.at_s);
        tokio::time::sleep_until(at.into()).await;
        bar.set_message(format!("{} {}", step.action, step.target));
        let t_ms = t0.elapsed().as_millis() as u64;
        step_once(cluster, step, t0, &mut events).await?;
        match step.action {
            Action::StopArbiters | Action::RemoveQuorum => outage = Some((t_ms, None)),
            Action::StartArbiters | Action::RestoreQuorum => {
                if let Some((start, None)) = outage {
                    outage = Some((start, Some(t_ms)));
                }
            }
            _ => {}
        }
    }
    tokio::time::sleep_until((t0 + duration).into()).await;
    let mut rogue = match cluster.rogue.take() {
        Some(attacks) => attacks.await.ok(),
        None => None,
    };
    ticker.abort();
    bar.finish_and_clear();
    let duration_ms = t0.elapsed().as_millis() as u64;
    let mut conns = traffic.stop().await;
    sampler.abort();
    let _ = sampler.await;
    for watcher in watchers {
        watcher.abort();
        let _ = watcher.await;
    }
    let routes = std::mem::take(&mut *routes.lock().expect("routes lock"));
    let region_answers = std::mem::take(&mut *region_answers.lock().expect("answers lock"));
    let backend_regions = if cluster.regions.is_empty() {
        Default::default()
    } else {
        cluster
            .instances
            .iter()
            .flatten()
            .map(|i| (i.clone(), "r1".to_owned()))
            .chain(
                cluster
                    .regions
                    .iter()
                    .flat_map(|r| r.instances.iter().map(|(i, _)| (i.clone(), r.name.clone()))),
            )
            .collect()
    };
    let views = std::mem::take(&mut *views.lock().expect("views lock"));
    let crashes = cluster.crashed.all();
    conns.retain(|c| {
        !crashes.iter().any(|k| {
            cluster.nodes[k.node] == c.agent
                && c.t_ms >= k.from
                && k.to.is_none_or(|to| c.t_ms < to)
        })
    });
    let outage = outage.map(|(start, end)| (start, end.unwrap_or(duration_ms)));
    let max_concurrent_snapshots = metric(cluster, "rollcall_arbiter_snapshots_in_flight_max")
        .await
        .unwrap_or(0.0) as u64;
    let snapshots_refused = metric(cluster, "rollcall_arbiter_snapshots_refused")
        .await
        .unwrap_or(0.0) as u64;
    // The audit log (the arbiter is back if the scenario restarted it),
    // then the final catalog as a live agent serves it once it holds the
    // last audited change, and the history check over both.
    let mut crash_commit_ms = Vec::new();
    let mut history_figures = None;
    let mut false_removals = 0;
    if let Some(audit) = audit(cluster).await {
        let service_key = format!("default/{}/default", scenario.service);
        let last_revision = audit
            .iter()
            .filter(|e| {
                e.services.contains(&service_key)
                    || e.entry
                        .instance
                        .as_deref()
                        .is_some_and(|i| cluster.instances.iter().flatten().any(|x| x == i))
            })
            .map(|e| e.entry.revision)
            .max()
            .unwrap_or(0);
        let entries: Vec<history::AuditEntry> = audit.into_iter().map(|e| e.entry).collect();
        if let Some(rogue) = &mut rogue {
            rogue.foreign_changes = rogue::foreign_changes(&entries);
        }
        let final_catalog = final_catalog(cluster, last_revision).await;
        let nodes: std::collections::BTreeMap<String, Vec<String>> = cluster
            .nodes
            .iter()
            .cloned()
            .zip(cluster.instances.iter().cloned())
            .collect();
        let writes = cluster.writes.lock().expect("writes lock").clone();
        let checked = history::check(
            &entries,
            &nodes,
            &cluster.causes,
            &writes,
            &cluster.bad_probed,
            final_catalog.as_ref(),
            t0_wall,
        );
        for (at, instance) in &checked.ready {
            if *at >= t0_wall {
                events.push(Event::Ready {
                    t_ms: at - t0_wall,
                    instance: instance.clone(),
                });
            }
        }
        for (at, instance) in &checked.leaves {
            if *at >= t0_wall {
                events.push(Event::LeaveCommitted {
                    t_ms: at - t0_wall,
                    instance: instance.clone(),
                });
            }
        }
        // Crash → the first commit that took the node's records out
        // before the node restarted; a crash with none (its records
        // replaced by the next epoch's) is no sample, and `crash_view_ms`
        // counts it missing too.
        for (i, at) in &cluster.crash_walls {
            let node = format!(" {} epoch ", cluster.nodes[*i]);
            let restarted = cluster
                .restart_walls
                .iter()
                .filter(|(j, r)| j == i && r >= at)
                .map(|(_, r)| *r)
                .min()
                .unwrap_or(u64::MAX);
            let commit = entries
                .iter()
                .filter(|e| {
                    e.at_ms >= *at
                        && e.at_ms < restarted
                        && matches!(e.command.as_str(), "node-down" | "expire-lease")
                        && format!(" {}", e.detail).contains(&node)
                        && e.detail.contains(" records ")
                })
                .map(|e| e.at_ms)
                .min();
            if let Some(commit) = commit {
                crash_commit_ms.push(commit - at);
            }
        }
        false_removals = checked.false_removals.len() as u64;
        history_figures = Some(HistoryFigures {
            writes_checked: checked.writes_checked,
            lost_writes: checked.lost_writes,
            false_removals: checked
                .false_removals
                .iter()
                .map(|r| {
                    format!(
                        "{} at {} ms: {}",
                        r.instance,
                        r.at_ms.saturating_sub(t0_wall),
                        r.how
                    )
                })
                .collect(),
        });
    }
    events.sort_by_key(Event::t_ms);
    Ok(RunResult {
        timeline: Timeline {
            conns,
            routes,
            views,
            region_answers,
            backend_regions,
            events,
            duration_ms,
        },
        false_removals,
        history: history_figures,
        rogue,
        crash_commit_ms,
        election: cluster.election,
        cache_corruption: cluster.corruption.clone(),
        degraded: scenario.pass.degraded_max_age_ms.map(|max_age_ms| {
            let down: Vec<String> = cluster
                .crashed
                .down()
                .into_iter()
                .map(|i| cluster.nodes[i].clone())
                .collect();
            degraded::figures(
                &stale_answers.lock().expect("stale answers lock"),
                max_age_ms,
                &down,
            )
        }),
        outage,
        max_concurrent_snapshots,
        snapshots_refused,
        configs: (
            cluster.work.join(format!("{}.toml", cluster.nodes[0])),
            cluster.work.join("arbiter-1.toml"),
        ),
    })
}

/// Every record of the scenario's service as a live agent serves it
/// (`all=true`), once it holds revision `revision` or later and the
/// arbiter confirmed it; `None` if no agent did within `PATIENCE`.
async fn final_catalog(
    cluster: &Cluster,
    revision: u64,
) -> Option<std::collections::BTreeMap<String, FinalRecord>> {
    let down = cluster.crashed.down();
    let live: Vec<usize> = (0..cluster.nodes.len())
        .filter(|i| !down.contains(i))
        .collect();
    let path = format!("/v1/endpoints/{}?all=true", cluster.service);
    let started = Instant::now();
    while started.elapsed() < PATIENCE {
        for &i in &live {
            let Some(body) = cluster.agent_get(i, &path).await else {
                continue;
            };
            let current =
                body["stale"] == false && body["revision"].as_u64().is_some_and(|r| r >= revision);
            if !current {
                continue;
            }
            let records = body["endpoints"].as_array()?;
            return Some(
                records
                    .iter()
                    .filter_map(|e| {
                        Some((
                            e["instance_id"].as_str()?.to_owned(),
                            FinalRecord {
                                generation: e["generation"].as_u64()?,
                                state: e["state"].as_str()?.to_owned(),
                            },
                        ))
                    })
                    .collect(),
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

/// Follows agent `i`'s view of `service` through blocking resolves
/// (`?index=`): records each change (and the first answer) into `views`,
/// the moment the answer came back, until aborted or `limit`. While its
/// node is crashed it asks nothing; after a restart it starts over.
async fn watch_view(
    views: std::sync::Arc<std::sync::Mutex<Vec<Route>>>,
    (i, agent, ip): (usize, String, Ipv4Addr),
    service: String,
    crashed: Crashes,
    t0: Instant,
    limit: Duration,
) {
    let http = match reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
    {
        Ok(http) => http,
        Err(_) => return,
    };
    let mut index: Option<String> = None;
    while t0.elapsed() < limit {
        if crashed.down().contains(&i) {
            index = None;
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let url = match &index {
            Some(index) => format!(
                "http://{ip}:{HTTP_PORT}/v1/endpoints/{service}?index={index}&wait_ms=10000"
            ),
            None => format!("http://{ip}:{HTTP_PORT}/v1/endpoints/{service}"),
        };
        let body = match http.get(url).send().await {
            Ok(response) if response.status().is_success() => {
                response.json::<serde_json::Value>().await.ok()
            }
            _ => None,
        };
        let t_ms = t0.elapsed().as_millis() as u64;
        let Some(body) = body else {
            index = None;
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let next = body["index"].as_str().map(str::to_owned);
        if next != index {
            views.lock().expect("views lock").push(Route {
                t_ms,
                agent: agent.clone(),
                instances: endpoint_ids(&body),
            });
        }
        index = next;
    }
}

/// The instance ids of a resolve answer, in its order.
fn endpoint_ids(body: &serde_json::Value) -> Vec<String> {
    body["endpoints"]
        .as_array()
        .map(|e| {
            e.iter()
                .filter_map(|e| e["instance_id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Records the sampling tasks append to while the run goes on.
type Records<T> = std::sync::Arc<std::sync::Mutex<Vec<T>>>;

/// Samples every live agent's resolve answer into `routes` every 100 ms,
/// and, in a multi-region run, what it says of regions into `answers`,
/// until aborted or `limit`.
async fn sample_routes(
    (routes, answers, stale): (
        Records<Route>,
        Option<Records<RegionAnswer>>,
        Option<Records<StaleAnswer>>,
    ),
    http: reqwest::Client,
    agents: Vec<(String, Ipv4Addr)>,
    service: String,
    crashed: Crashes,
    t0: Instant,
    limit: Duration,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while t0.elapsed() < limit {
        tick.tick().await;
        let down = crashed.down();
        for (i, (agent, ip)) in agents.iter().enumerate() {
            if down.contains(&i) {
                continue;
            }
            let t_ms = t0.elapsed().as_millis() as u64;
            let url = format!("http://{ip}:{HTTP_PORT}/v1/endpoints/{service}");
            let Ok(response) = http
                .get(url)
                .timeout(Duration::from_millis(500))
                .send()
                .await
            else {
                continue;
            };
            let Ok(body) = response.json::<serde_json::Value>().await else {
                continue;
            };
            routes.lock().expect("routes lock").push(Route {
                t_ms,
                agent: agent.clone(),
                instances: endpoint_ids(&body),
            });
            if let (Some(stale), Some(age_ms)) = (&stale, body["age_ms"].as_u64()) {
                stale.lock().expect("stale answers lock").push(StaleAnswer {
                    t_ms,
                    agent: agent.clone(),
                    age_ms,
                    degraded: body["degraded"].as_bool().unwrap_or(false),
                    // The agent's own words (README, "Stale copies").
                    fallback: body["degraded_reason"]
                        .as_str()
                        .is_some_and(|r| r.contains("no endpoint has fresh local evidence")),
                });
            }
            if let (Some(answers), Some(region)) = (&answers, body["region"].as_str()) {
                answers.lock().expect("answers lock").push(RegionAnswer {
                    t_ms,
                    agent: agent.clone(),
                    region: region.to_owned(),
                    refused: body["failover"]["refused"].as_str().map(str::to_owned),
                });
            }
        }
    }
}

/// One value from the arbiter's Prometheus text.
async fn metric(cluster: &mut Cluster, name: &str) -> Option<f64> {
    let (admin, _) = running_admin(cluster)?;
    let url = format!("http://{admin}/metrics");
    let text = cluster.http.get(url).send().await.ok()?.text().await.ok()?;
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
}

fn arbiter_ips(cluster: &Cluster) -> Vec<Ipv4Addr> {
    cluster
        .arbiters
        .iter()
        .filter_map(|(quic, _)| match quic.ip() {
            std::net::IpAddr::V4(ip) => Some(ip),
            std::net::IpAddr::V6(_) => None,
        })
        .collect()
}

/// An audit entry with the services it changed.
struct Audited {
    entry: history::AuditEntry,
    services: Vec<String>,
}

/// The whole audit log, page by page; `None` if a running replica could
/// not be asked or answered something that is not the audit log.
async fn audit(cluster: &mut Cluster) -> Option<Vec<Audited>> {
    let (admin, token) = running_admin(cluster)?;
    let mut all: Vec<Audited> = Vec::new();
    loop {
        let since = all.last().map_or(0, |a| a.entry.revision);
        let url = format!("http://{admin}/v1/audit?limit=10000&since={since}");
        let body: Vec<serde_json::Value> = cluster
            .http
            .get(url)
            .bearer_auth(&token)
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        let page = body.len();
        for value in body {
            let services = value["services"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            all.push(Audited {
                entry: serde_json::from_value(value).ok()?,
                services,
            });
        }
        if page < 10_000 {
            return Some(all);
        }
    }
}

async fn step_once(
    cluster: &mut Cluster,
    spec: &Step,
    t0: Instant,
    events: &mut Vec<Event>,
) -> Result<(), RunError> {
    let (action, target) = (spec.action, spec.target.as_str());
    let t_ms = t0.elapsed().as_millis() as u64;
    let share = spec.share.unwrap_or(0.3);
    let wait = Duration::from_secs_f64(spec.duration_s.unwrap_or(5.0));
    let delay = Duration::from_millis(spec.delay_ms.unwrap_or(0));
    let step = |action: &str| Event::Step {
        t_ms,
        action: action.to_owned(),
        target: target.to_owned(),
    };
    match action {
        Action::Phase => events.push(Event::Phase {
            t_ms,
            name: target.to_owned(),
        }),
        Action::Rogue => {
            events.push(step("rogue"));
            let rogue = rogue::Rogue::new(cluster, Instant::now() + wait)?;
            cluster.rogue = Some(tokio::spawn(rogue.run()));
        }
        Action::Drain => {
            let (i, instance) = cluster.target(target)?;
            let instance = instance.ok_or_else(|| {
                RunError::Cluster(format!("drain needs node/instance, not {target:?}"))
            })?;
            cluster.cause(&instance, "drain");
            agent_call(
                cluster,
                i,
                reqwest::Method::PUT,
                &format!("/v1/agent/instances/{instance}/drain"),
                (WriteKind::Drain, &instance),
                &format!("draining {instance}"),
            )
            .await?;
            events.push(step("drain"));
        }
        Action::KillBackend | Action::FreezeBackend => {
            let (i, instance) = cluster.target(target)?;
            let instance = instance.ok_or_else(|| {
                RunError::Cluster(format!("{action:?} needs node/instance, not {target:?}"))
            })?;
            let (signal, fault) = match action {
                Action::KillBackend => ("-KILL", "kill-backend"),
                _ => ("-STOP", "freeze-backend"),
            };
            cluster.cause(&instance, fault);
            cluster.processes.signal(&instance, signal)?;
            if action == Action::KillBackend {
                killed(cluster, i, &instance);
            }
            events.push(Event::HardFailure {
                t_ms,
                instance,
                fault: fault.into(),
            });
        }
        Action::CrashNode => {
            let (i, _) = cluster.target(target)?;
            crash_node(cluster, i, t_ms, events)?;
        }
        Action::KillBackends => {
            let nodes: Vec<usize> = if target.is_empty() {
                (0..cluster.nodes.len()).collect()
            } else {
                vec![cluster.target(target)?.0]
            };
            for i in nodes {
                for instance in cluster.instances[i].clone() {
                    if !cluster.processes.running(&instance) {
                        continue;
                    }
                    cluster.cause(&instance, "kill-backend");
                    cluster.processes.signal(&instance, "-KILL")?;
                    killed(cluster, i, &instance);
                    events.push(Event::HardFailure {
                        t_ms,
                        instance,
                        fault: "kill-backend".into(),
                    });
                }
            }
        }
        Action::RestartBackends => {
            for (i, instance, port) in std::mem::take(&mut cluster.killed) {
                cluster.processes.children.retain(|(n, _)| *n != instance);
                start_echo(cluster, i, &instance, port)?;
                events.push(Event::Restarted {
                    t_ms,
                    instance: instance.clone(),
                });
            }
            events.push(step("restart-backends"));
        }
        Action::CutBridge => {
            regions::cut(cluster, target)?;
            events.push(step("cut-bridge"));
        }
        Action::HealBridge => {
            regions::heal(cluster, target)?;
            events.push(step("heal-bridge"));
        }
        Action::TransferWriter | Action::ForceWriter => {
            regions::transfer_writer(cluster, target, spec.reason.as_deref()).await?;
            events.push(step(if spec.reason.is_some() {
                "force-writer"
            } else {
                "transfer-writer"
            }));
        }
        Action::ReadWriters => {
            events.extend(regions::read_writers(cluster, t_ms).await);
            events.push(step("read-writers"));
        }
        Action::CrashNodes => {
            let nodes = cluster.nodes_named(target)?;
            for i in nodes {
                crash_node(cluster, i, t_ms, events)?;
            }
        }
        Action::RestartNode => {
            for i in cluster.nodes_named(target)? {
                restart_node(cluster, i, t0, events)?;
                events.push(Event::Step {
                    t_ms: t0.elapsed().as_millis() as u64,
                    action: "restart-node".into(),
                    target: cluster.nodes[i].clone(),
                });
            }
        }
        Action::CrashRounds | Action::PauseRounds => {
            rounds(cluster, spec, t0, events).await?;
        }
        Action::PauseAgent | Action::ResumeAgent => {
            let (i, _) = cluster.target(target)?;
            let signal = if action == Action::PauseAgent {
                "-STOP"
            } else {
                "-CONT"
            };
            cluster.processes.signal(&cluster.nodes[i], signal)?;
            events.push(step(if action == Action::PauseAgent {
                "pause-agent"
            } else {
                "resume-agent"
            }));
        }
        Action::PartitionNode => {
            let (i, _) = cluster.target(target)?;
            let ips: Vec<Ipv4Addr> = arbiter_ips(cluster);
            cut(cluster, i, ips)?;
            events.push(step("partition-node"));
        }
        Action::PartitionZone => {
            let members: Vec<usize> = (0..cluster.nodes.len())
                .filter(|i| cluster.zones[*i] == target)
                .collect();
            if members.is_empty() {
                return Err(RunError::Cluster(format!(
                    "partition_zone: no node is in zone {target:?} (zones are z1…zN)"
                )));
            }
            let ips: Vec<Ipv4Addr> = arbiter_ips(cluster);
            for i in members {
                cut(cluster, i, ips.clone())?;
            }
            events.push(step("partition-zone"));
        }
        Action::PartitionPeers => {
            let (i, _) = cluster.target(target)?;
            let peers: Vec<usize> = (0..cluster.nodes.len())
                .filter(|j| *j != i && cluster.zones[*j] == cluster.zones[i])
                .collect();
            let peer_ips = peers.iter().map(|j| cluster.node_ip(*j)).collect();
            cut(cluster, i, peer_ips)?;
            let ip = cluster.node_ip(i);
            for j in peers {
                cut(cluster, j, vec![ip])?;
            }
            events.push(step("partition-peers"));
        }
        Action::Heal => {
            for (i, ips) in std::mem::take(&mut cluster.cuts) {
                cluster.topology.heal(i, &ips)?;
            }
            for relay in &cluster.relays {
                relay.set_delay(Duration::ZERO);
            }
            for id in cluster.instances.iter().flatten() {
                let flag = not_ready_file(cluster, id);
                if flag.exists() {
                    std::fs::remove_file(&flag)
                        .map_err(io(format!("removing {}", flag.display())))?;
                }
            }
            events.push(step("heal"));
        }
        Action::DelayFollower => {
            if cluster.relays.is_empty() {
                return Err(RunError::Cluster(
                    "delay_follower needs arbiters = 3 or 5 (a follower to delay)".into(),
                ));
            }
            let k = if target.is_empty() {
                let leader = leader(cluster).await;
                (0..cluster.arbiters.len())
                    .find(|k| Some(*k) != leader)
                    .expect("a group of 3 or 5 has a follower")
            } else {
                target
                    .strip_prefix("arbiter-")
                    .and_then(|n| n.parse::<usize>().ok())
                    .filter(|n| (1..=cluster.arbiters.len()).contains(n))
                    .map(|n| n - 1)
                    .ok_or_else(|| {
                        RunError::Cluster(format!(
                            "delay_follower: {target:?} names no replica (arbiter-1…arbiter-{})",
                            cluster.arbiters.len()
                        ))
                    })?
            };
            cluster.relays[k].set_delay(delay);
            events.push(Event::Step {
                t_ms,
                action: "delay-follower".into(),
                target: format!("arbiter-{} +{} ms", k + 1, delay.as_millis()),
            });
        }
        Action::FailReadiness => {
            let (_, instance) = cluster.target(target)?;
            let instance = instance.ok_or_else(|| {
                RunError::Cluster(format!(
                    "fail_readiness needs node/instance, not {target:?}"
                ))
            })?;
            cluster.cause(&instance, "fail-readiness");
            let flag = not_ready_file(cluster, &instance);
            std::fs::write(&flag, b"").map_err(io(format!("creating {}", flag.display())))?;
            events.push(step("fail-readiness"));
        }
        Action::BadProbe => {
            // The same broken readiness answer on every instance at once,
            // as a bad check deployed to the whole service would give.
            let crashed = cluster.crashed.down();
            for i in (0..cluster.nodes.len()).filter(|i| !crashed.contains(i)) {
                for id in cluster.instances[i].clone() {
                    let flag = not_ready_file(cluster, &id);
                    cluster.cause(&id, "bad-probe");
                    std::fs::write(&flag, b"")
                        .map_err(io(format!("creating {}", flag.display())))?;
                    cluster.bad_probed.push(id);
                }
            }
            events.push(step("bad-probe"));
        }
        Action::RestartAgents => {
            let nodes: Vec<usize> = if target.is_empty() {
                let crashed = cluster.crashed.down();
                (0..cluster.nodes.len())
                    .filter(|i| !crashed.contains(i))
                    .collect()
            } else {
                vec![cluster.target(target)?.0]
            };
            // Every agent dies first, then all start together: the storm.
            for &i in &nodes {
                kill_agent(cluster, i)?;
            }
            for &i in &nodes {
                start_agent(cluster, i)?;
            }
            events.push(step("restart-agents"));
        }
        Action::WipeRestartAgents => {
            let crashed = cluster.crashed.down();
            let nodes: Vec<usize> = (0..cluster.nodes.len())
                .filter(|i| !crashed.contains(i))
                .collect();
            for &i in &nodes {
                kill_agent(cluster, i)?;
            }
            for &i in &nodes {
                let dir = cluster.work.join(&cluster.nodes[i]).join("cache");
                match std::fs::remove_dir_all(&dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io(format!("wiping {}", dir.display()))(e)),
                }
            }
            for &i in &nodes {
                start_agent(cluster, i)?;
            }
            events.push(step("restart-agents"));
        }
        Action::CorruptCache => {
            let (i, _) = cluster.target(target)?;
            kill_agent(cluster, i)?;
            let corrupted = corrupt_cache(&cluster.work.join(&cluster.nodes[i]).join("cache"))?;
            if corrupted == 0 {
                return Err(RunError::Cluster(format!(
                    "corrupt_cache: {target} has no cache file to corrupt"
                )));
            }
            start_agent(cluster, i)?;
            events.push(step("corrupt-cache"));
            cluster.corruption = Some(watch_corruption(cluster, i, corrupted as u64).await);
        }
        Action::StartInstances => {
            let (i, _) = cluster.target(target)?;
            let id = start_instance(cluster, i)?;
            register(
                cluster,
                i,
                &id,
                *cluster.ports[i].last().expect("just added"),
            )
            .await?;
            events.push(Event::Step {
                t_ms,
                action: "start-instance".into(),
                target: format!("{}/{id}", cluster.nodes[i]),
            });
        }
        Action::RollingDeploy => {
            // `count` waves, `every_s` apart (one wave by default).
            let every = Duration::from_secs_f64(spec.every_s.unwrap_or(0.0));
            let start = Instant::now();
            for wave in 0..spec.count.unwrap_or(1) {
                tokio::time::sleep_until((start + every * wave).into()).await;
                rolling_deploy(cluster, share, wait, t0, events).await?;
            }
        }
        Action::StopArbiters => {
            for k in 0..cluster.arbiters.len() {
                let name = format!("arbiter-{}", k + 1);
                if cluster.processes.running(&name) {
                    cluster.processes.signal(&name, "-KILL")?;
                }
            }
            events.push(step("stop-arbiters"));
        }
        Action::StartArbiters | Action::RestoreQuorum => {
            for k in 0..cluster.arbiters.len() {
                start_arbiter(cluster, k)?;
            }
            events.push(step(if action == Action::RestoreQuorum {
                "restore-quorum"
            } else {
                "start-arbiters"
            }));
        }
        Action::KillLeader => {
            let k = leader(cluster).await.ok_or_else(|| {
                RunError::Cluster("kill_leader: no running replica knows a leader".into())
            })?;
            cluster
                .processes
                .signal(&format!("arbiter-{}", k + 1), "-KILL")?;
            events.push(Event::Step {
                t_ms,
                action: "kill-leader".into(),
                target: format!("arbiter-{}", k + 1),
            });
            let killed = t0.elapsed().as_millis() as u64;
            if let Some(end) = first_commit(cluster, t0).await {
                cluster.election = Some((killed, end));
            }
        }
        Action::RemoveQuorum => {
            // Keep one replica (not a majority of three or five).
            let keep = leader(cluster).await.unwrap_or(0);
            for k in (0..cluster.arbiters.len()).filter(|k| *k != keep) {
                let name = format!("arbiter-{}", k + 1);
                if cluster.processes.running(&name) {
                    cluster.processes.signal(&name, "-KILL")?;
                }
            }
            events.push(step("remove-quorum"));
        }
    }
    Ok(())
}

/// Records that instance `instance` of node `i` was killed (it waits for
/// the exit), so `restart_backends` can start it again on its port.
fn killed(cluster: &mut Cluster, i: usize, instance: &str) {
    for (n, child) in cluster.processes.children.iter_mut() {
        if n == instance {
            let _ = child.wait();
        }
    }
    let port = cluster.instances[i]
        .iter()
        .position(|x| x == instance)
        .map(|k| cluster.ports[i][k]);
    if let Some(port) = port {
        cluster.killed.push((i, instance.to_owned(), port));
    }
}

/// A silent crash of node `i`: its agent and running backends freeze and
/// its link drops every packet (connects time out, nothing is reset).
fn crash_node(
    cluster: &mut Cluster,
    i: usize,
    t_ms: u64,
    events: &mut Vec<Event>,
) -> Result<(), RunError> {
    if cluster.crashed.down().contains(&i) {
        return Err(RunError::Cluster(format!(
            "crash: {} is already crashed",
            cluster.nodes[i]
        )));
    }
    cluster.crash_walls.push((i, now_ms()));
    events.push(Event::Step {
        t_ms,
        action: "crash-node".into(),
        target: cluster.nodes[i].clone(),
    });
    cluster.processes.signal(&cluster.nodes[i], "-STOP")?;
    for instance in cluster.instances[i].clone() {
        if !cluster.processes.running(&instance) {
            continue;
        }
        cluster.cause(&instance, "crash-node");
        cluster.processes.signal(&instance, "-STOP")?;
        events.push(Event::HardFailure {
            t_ms,
            instance,
            fault: "crash-node".into(),
        });
    }
    cluster.topology.set_link(i, false)?;
    cluster.crashed.start(i, t_ms);
    Ok(())
}

/// Brings crashed node `i` back as a reboot would: its frozen processes
/// are killed, its link restored, and its backends and agent start again
/// (the agent under a new epoch, re-registering from its data directory).
fn restart_node(
    cluster: &mut Cluster,
    i: usize,
    t0: Instant,
    events: &mut Vec<Event>,
) -> Result<(), RunError> {
    if !cluster.crashed.down().contains(&i) {
        return Err(RunError::Cluster(format!(
            "restart_node: {} is not crashed",
            cluster.nodes[i]
        )));
    }
    cluster.restart_walls.push((i, now_ms()));
    let mut names = vec![cluster.nodes[i].clone()];
    names.extend(
        cluster.instances[i]
            .iter()
            .filter(|id| cluster.processes.pid(id).is_some())
            .cloned(),
    );
    for (name, child) in cluster.processes.children.iter_mut() {
        if names.contains(name) && matches!(child.try_wait(), Ok(None)) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    cluster.topology.set_link(i, true)?;
    for k in 0..cluster.instances[i].len() {
        let (id, port) = (cluster.instances[i][k].clone(), cluster.ports[i][k]);
        if names.contains(&id) {
            cluster.processes.children.retain(|(n, _)| *n != id);
            start_echo(cluster, i, &id, port)?;
            events.push(Event::Restarted {
                t_ms: t0.elapsed().as_millis() as u64,
                instance: id,
            });
        }
    }
    start_agent(cluster, i)?;
    cluster.crashed.end(i, t0.elapsed().as_millis() as u64);
    Ok(())
}

/// `crash_rounds` or `pause_rounds`: `count` rounds `every_s` apart, each
/// faulting one live node the run's seed draws (among the target's, when
/// given) for `duration_s`, then undoing it.
async fn rounds(
    cluster: &mut Cluster,
    step: &Step,
    t0: Instant,
    events: &mut Vec<Event>,
) -> Result<(), RunError> {
    let count = step.count.unwrap_or(1);
    let every = Duration::from_secs_f64(step.every_s.unwrap_or(1.0));
    let fault = Duration::from_secs_f64(step.round_fault_s());
    let candidates: Vec<usize> = if step.target.is_empty() {
        (0..cluster.nodes.len()).collect()
    } else {
        cluster.nodes_named(&step.target)?
    };
    let start = Instant::now();
    for round in 0..count {
        tokio::time::sleep_until((start + every * round).into()).await;
        let down = cluster.crashed.down();
        let live: Vec<usize> = candidates
            .iter()
            .copied()
            .filter(|i| !down.contains(i))
            .collect();
        if live.is_empty() {
            return Err(RunError::Cluster(format!(
                "{}: no live node left to fault in round {round}",
                step.action
            )));
        }
        let i = live[(cluster.random() % live.len() as u64) as usize];
        let t_ms = t0.elapsed().as_millis() as u64;
        let node = cluster.nodes[i].clone();
        match step.action {
            Action::PauseRounds => {
                cluster.processes.signal(&node, "-STOP")?;
                events.push(Event::Step {
                    t_ms,
                    action: "pause-agent".into(),
                    target: node.clone(),
                });
                tokio::time::sleep(fault).await;
                cluster.processes.signal(&node, "-CONT")?;
                events.push(Event::Step {
                    t_ms: t0.elapsed().as_millis() as u64,
                    action: "resume-agent".into(),
                    target: node,
                });
            }
            _ => {
                crash_node(cluster, i, t_ms, events)?;
                tokio::time::sleep(fault).await;
                restart_node(cluster, i, t0, events)?;
                events.push(Event::Step {
                    t_ms: t0.elapsed().as_millis() as u64,
                    action: "restart-node".into(),
                    target: node,
                });
            }
        }
    }
    Ok(())
}

/// After a leader is killed: writes through the running replicas (a
/// policy of the service "election-probe", its `max_snapshot_age_ms`
/// changed each time so that every write commits) every 50 ms until one
/// is answered 200; returns that answer's time (run ms), the end of the
/// election as callers of the control plane see it.
async fn first_commit(cluster: &mut Cluster, t0: Instant) -> Option<u64> {
    let started = Instant::now();
    let mut attempt = 0u64;
    while started.elapsed() < PATIENCE {
        for k in 0..cluster.arbiters.len() {
            let name = format!("arbiter-{}", k + 1);
            if !cluster.processes.running(&name) {
                continue;
            }
            let Ok(token) = std::fs::read_to_string(cluster.work.join(&name).join("admin.token"))
            else {
                continue;
            };
            attempt += 1;
            let body = serde_json::json!({"policy": [{
                "service": "default/election-probe",
                "home_region": "r1",
                "max_snapshot_age_ms": 60_000 + attempt,
            }]});
            let url = format!("http://{}/v1/policies", cluster.arbiters[k].1);
            let answered = cluster
                .http
                .put(url)
                .bearer_auth(token.trim())
                .json(&body)
                .timeout(Duration::from_millis(1000))
                .send()
                .await
                .is_ok_and(|r| r.status() == reqwest::StatusCode::OK);
            if answered {
                return Some(t0.elapsed().as_millis() as u64);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// After node `i`'s agent restarted on `files` corrupted cache files:
/// asks it to resolve the service every 20 ms until an answer the arbiter
/// confirmed (within `PATIENCE`), counting the answers served from a cache
/// (`stale: true`: every cache file was corrupted, so one is a corrupt file
/// served), then reads the agent's count of corrupt files discarded.
async fn watch_corruption(cluster: &Cluster, i: usize, files: u64) -> Corruption {
    let path = format!("/v1/endpoints/{}", cluster.service);
    let started = Instant::now();
    let mut stale_answers = 0;
    while started.elapsed() < PATIENCE {
        if let Some(body) = cluster.agent_get(i, &path).await {
            match body["stale"].as_bool() {
                Some(true) => stale_answers += 1,
                Some(false) => break,
                None => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let url = format!("http://{}:{HTTP_PORT}/metrics", cluster.node_ip(i));
    let text = match cluster.http.get(url).send().await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    let detected = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("rollcall_agent_cache_discarded_total{reason=\"corrupt\"}")?
                .trim()
                .parse::<f64>()
                .ok()
        })
        .unwrap_or(0.0) as u64;
    Corruption {
        files,
        detected,
        stale_answers,
    }
}

/// Cuts node `i` off `ips` and remembers it for `heal`.
fn cut(cluster: &mut Cluster, i: usize, ips: Vec<Ipv4Addr>) -> Result<(), RunError> {
    cluster.topology.cut(i, &ips)?;
    cluster.cuts.push((i, ips));
    Ok(())
}

/// kill -9 node `i`'s agent and waits for it to be gone (its backends run
/// on).
fn kill_agent(cluster: &mut Cluster, i: usize) -> Result<(), RunError> {
    let name = cluster.nodes[i].clone();
    for (n, child) in cluster.processes.children.iter_mut() {
        if *n == name && matches!(child.try_wait(), Ok(None)) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    Ok(())
}

/// Overwrites the middle of every file in `dir` with garbage (its length
/// kept); returns how many files it corrupted.
fn corrupt_cache(dir: &Path) -> Result<usize, RunError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io(format!("reading {}", dir.display()))(e)),
    };
    let mut corrupted = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        if !path.is_file() {
            continue;
        }
        let mut bytes = std::fs::read(&path).map_err(io(format!("reading {}", path.display())))?;
        if bytes.is_empty() {
            continue;
        }
        let mid = bytes.len() / 2;
        let end = (mid + 16).min(bytes.len());
        for b in &mut bytes[mid..end] {
            *b ^= 0xA5;
        }
        std::fs::write(&path, &bytes).map_err(io(format!("writing {}", path.display())))?;
        corrupted += 1;
    }
    Ok(corrupted)
}

/// Starts a new echo backend on node `i` (the next free port, the next
/// instance number) and records it; returns its id. Not registered yet.
fn start_instance(cluster: &mut Cluster, i: usize) -> Result<String, RunError> {
    let k = cluster.instances[i].len();
    let id = format!("{}-{i}-{k}", cluster.service);
    let port = cluster.ports[i].iter().max().map_or(ECHO_PORT, |p| p + 1);
    start_echo(cluster, i, &id, port)?;
    cluster.instances[i].push(id.clone());
    cluster.ports[i].push(port);
    Ok(id)
}

/// One wave of a rolling deploy: `share` of the running instances (spread
/// over the nodes) are drained, left `wait` to finish their in-flight
/// connections, stopped and deregistered, and as many new instances are
/// started behind a readiness check, so they take traffic only once READY.
async fn rolling_deploy(
    cluster: &mut Cluster,
    share: f64,
    wait: Duration,
    t0: Instant,
    events: &mut Vec<Event>,
) -> Result<(), RunError> {
    let crashed = cluster.crashed.down();
    // Round robin over the nodes, so the wave is spread.
    let mut old: Vec<(usize, String)> = Vec::new();
    let most = cluster.instances.iter().map(Vec::len).max().unwrap_or(0);
    for k in 0..most {
        for i in (0..cluster.nodes.len()).filter(|i| !crashed.contains(i)) {
            if let Some(id) = cluster.instances[i].get(k) {
                if cluster.processes.running(id) {
                    old.push((i, id.clone()));
                }
            }
        }
    }
    let count = ((old.len() as f64 * share).ceil() as usize).clamp(1, old.len().max(1));
    old.truncate(count);
    for (i, id) in &old {
        cluster.cause(id, "rolling-deploy");
        let path = format!("/v1/agent/instances/{id}/drain");
        agent_call(
            cluster,
            *i,
            reqwest::Method::PUT,
            &path,
            (WriteKind::Drain, id),
            &format!("draining {id}"),
        )
        .await?;
        events.push(Event::Step {
            t_ms: t0.elapsed().as_millis() as u64,
            action: "drain".into(),
            target: format!("{}/{id}", cluster.nodes[*i]),
        });
    }
    tokio::time::sleep(wait).await;
    for (i, id) in &old {
        cluster.processes.signal(id, "-TERM")?;
        if let Some((_, child)) = cluster.processes.children.iter_mut().find(|(n, _)| n == id) {
            let _ = child.wait();
        }
        events.push(Event::BackendExit {
            t_ms: t0.elapsed().as_millis() as u64,
            instance: id.clone(),
        });
        let path = format!("/v1/agent/instances/{id}");
        agent_call(
            cluster,
            *i,
            reqwest::Method::DELETE,
            &path,
            (WriteKind::Deregister, id),
            &format!("deregistering {id}"),
        )
        .await?;
    }
    for (i, _) in &old {
        let id = start_instance(cluster, *i)?;
        let port = *cluster.ports[*i].last().expect("just added");
        register(cluster, *i, &id, port).await?;
        events.push(Event::Step {
            t_ms: t0.elapsed().as_millis() as u64,
            action: "start-instance".into(),
            target: format!("{}/{id}", cluster.nodes[*i]),
        });
    }
    Ok(())
}

/// Where a run's files go by default: `chaos-reports/<scenario>`.
pub fn default_dir(scenario: &Scenario) -> PathBuf {
    Path::new("chaos-reports").join(&scenario.name)
}
