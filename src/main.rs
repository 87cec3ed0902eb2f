//! The `rollcall` command: parses arguments and dispatches to the library
//! crates. It holds no logic of its own beyond printing results and
//! choosing exit codes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use rollcall::targets::DevTargets;
use rollcall_config::{
    AgentConfig, ArbiterConfig, BridgeConfig, Budget, ConfigError, ConfigFile, TlsPaths,
};
use rollcall_leases::identity::Identity;
use rollcall_leases::{tls, Label, PrincipalName, Role};

/// Exit code when the command ran but found SLO violations.
const EXIT_VIOLATIONS: u8 = 1;
/// Exit code when the command could not run (bad config, unreadable file);
/// clap also uses 2 for usage errors.
const EXIT_UNUSABLE: u8 = 2;

/// What `--version` prints after the name: the version, then a line
/// `features: fault-injection` in builds with the wire fault points, which
/// the chaos harness looks for before a scenario that needs them.
const VERSION: &str = if rollcall_leases::FAULT_INJECTION {
    concat!(env!("CARGO_PKG_VERSION"), "\nfeatures: fault-injection")
} else {
    env!("CARGO_PKG_VERSION")
};

/// The commit this binary was built from, and whether its tree had
/// uncommitted changes (build.rs), for the chaos and simulation reports.
fn build_info() -> rollcall_chaos::report::Build {
    rollcall_chaos::report::Build {
        commit: env!("ROLLCALL_GIT_COMMIT").to_owned(),
        dirty: env!("ROLLCALL_GIT_DIRTY") == "true",
    }
}

/// rollcall: service discovery for fleets on VMs and bare metal.
///
/// Node agents register and probe local instances, lease arbiters keep the
/// catalog, and callers resolve through the agent on their own host.
#[derive(Debug, Parser)]
#[command(name = "rollcall", version = VERSION)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Compute the failure-detection budget of a configuration against the
    /// SLOs (leave ≤ 3 s after commit, silent crash ≤ 15 s, both p99).
    ///
    /// Exits 1 when a worst case exceeds its SLO, 2 when a config cannot
    /// be loaded.
    Budget(BudgetArgs),
    /// Issue mTLS certificates for control-plane identities (R10).
    ///
    /// Writes `<role>-<name>.crt` and `.key` for each identity into DIR,
    /// signed by DIR/ca.crt and DIR/ca.key, which are generated on first
    /// use and reused afterwards so certificates can be added later.
    /// Keys are written with mode 0600.
    Certs(CertsArgs),
    /// Run a lease arbiter replica (QUIC + mTLS for agents, admin HTTP for
    /// operators). Flags override the config file.
    Arbiter(ArbiterArgs),
    /// Run a node agent: local registration and resolve API, the node
    /// lease, the catalog cache.
    Agent(AgentArgs),
    /// Run a region bridge: sync service policies, per-service summaries
    /// and ingress addresses with the other regions' bridges (QUIC, mTLS)
    /// and hand what they say to this region's arbiter as a
    /// non-authoritative remote view.
    Bridge(BridgeArgs),
    /// Run an arbiter and an agent in one process on loopback with a
    /// throwaway CA: the quickest way to try rollcall.
    Dev(DevArgs),
    /// Print the arbiter's audit log: who changed what, at which revision.
    Audit(AuditArgs),
    /// Show or change the arbiter replica set (the Raft group) through any
    /// replica's admin endpoint; changes are handed to the leader.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Apply, show or delete service policies (cross-region routing,
    /// failover order, capacity limits, data boundary, single writer,
    /// staleness) through any replica of the policy's home region.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Drain an instance through its agent: READY → DRAINING now, no new
    /// traffic, deregistered after the agent's drain window.
    Drain(DrainArgs),
    /// This agent's state: arbiter session, catalog, lease, gossip members
    /// alive and down, and the services it follows with revision and age.
    Status(InspectArgs),
    /// The zone's members as this agent's gossip sees them (alive, down).
    Members(InspectArgs),
    /// The region's services with their READY and total endpoint counts,
    /// from the catalog through this agent (a service the arbiter's watch
    /// rules keep from this node is not listed); when the agent cannot
    /// reach the arbiter, the services it holds, said so.
    Services(InspectArgs),
    /// Resolve a service through the agent, as a caller would: the
    /// endpoints it would be given, or with --watch every change of them
    /// until Ctrl-C.
    Resolve(ResolveArgs),
    /// Print a fresh zone key line (`<key id> <64 hex digits>`) for the
    /// agents' `gossip.key_file`.
    GossipKey(GossipKeyArgs),
    /// The chaos harness: real processes in network namespaces, faults,
    /// traffic timelines and reports (needs root).
    #[command(subcommand)]
    Chaos(ChaosCommand),
    /// Benchmarks that size a region on this machine.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// A test backend for the chaos harness: a TCP server that answers
    /// every connection with one line, its instance id, then holds the
    /// connection until the client closes it.
    Echo(EchoArgs),
}

#[derive(Debug, Subcommand)]
enum ChaosCommand {
    /// Run a scenario (chaos/scenarios/<name>.toml): builds a cluster of
    /// `rollcall` processes in network namespaces, drives the scenario's
    /// faults while traffic flows through every agent's proxy, and writes
    /// report.json, report.md and timeline.json. Exits 0 when the scenario
    /// passes its criteria, 1 when it fails them, 2 when it cannot run.
    Run(ChaosRunArgs),
    /// Simulate a whole region in one deterministic process
    /// (chaos/scenarios/sim/<name>.toml): 5,000 agents and 100,000
    /// instances by default, the real state machines on a virtual clock.
    /// Writes report.json (with the history's digest), report.md, cdf.svg
    /// and load.svg. Exits 0 when the scenario passes, 1 when it fails, 2
    /// when it cannot run.
    Sim(ChaosSimArgs),
    /// The results table of a set of runs, from DIR/<run>/report.json
    /// (never typed): printed as Markdown, or written into a README
    /// between the lines `<!-- rollcall chaos summary: begin -->` and
    /// `<!-- rollcall chaos summary: end -->`. Exits 2 when a report cannot
    /// be read.
    Summary(ChaosSummaryArgs),
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Load a real arbiter (or Raft group) with thousands of real agent
    /// sessions: each simulated agent is the agent's own state machine on
    /// its own QUIC/mTLS session. Runs the setup (connect, register,
    /// follow), then the scenarios, and writes report.json, report.md and
    /// SVG plots. Exits 0 when every figure has its samples, 1 when the
    /// run measured less than it claims (undelivered changes, a phase cut
    /// short, no convergence), 2 when it cannot run. Targets missed are
    /// reported, not failed.
    Fleet(BenchFleetArgs),
    /// One worker process of `bench fleet` (started by it, not by hand).
    #[command(hide = true)]
    Worker(BenchWorkerArgs),
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum BenchScenario {
    Steady,
    Deploy,
    Storm,
    All,
}

#[derive(Debug, Args)]
struct BenchFleetArgs {
    /// An arbiter replica's QUIC address to load (repeatable); without it
    /// the bench starts its own group (--spawn).
    #[arg(long = "arbiter", value_name = "ADDR")]
    arbiters: Vec<String>,
    /// Start an arbiter group of N replicas (1 or 3) on loopback as real
    /// processes, and stop it at the end (the default: 1).
    #[arg(long, value_name = "N", conflicts_with = "arbiters")]
    spawn: Option<usize>,
    /// With --arbiter: the directory holding the region's ca.crt and
    /// ca.key (as `rollcall certs` writes them), from which each agent's
    /// certificate is issued.
    #[arg(long, value_name = "DIR", requires = "arbiters")]
    certs: Option<PathBuf>,
    /// With --arbiter: a replica's admin address, for its /metrics
    /// (repeatable, in the order of --arbiter).
    #[arg(long, value_name = "ADDR", requires = "arbiters")]
    admin: Vec<SocketAddr>,
    /// Simulated agents, one session each.
    #[arg(long, value_name = "N", default_value_t = 5_000)]
    agents: u32,
    /// Instances, spread over the agents.
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    instances: u32,
    /// Services, sized by a Zipf-like law as in the fleet simulation.
    #[arg(long, value_name = "N", default_value_t = 2_000)]
    services: u32,
    /// Services each agent follows, skewed towards the popular ones.
    #[arg(long, value_name = "N", default_value_t = 20)]
    follow: u32,
    /// What to run after the setup.
    #[arg(long, value_enum, default_value = "all")]
    scenario: BenchScenario,
    /// Length of steady, and the window the deploy's replacements are
    /// spread over, s.
    #[arg(long, value_name = "S", default_value_t = 120.0)]
    duration_s: f64,
    /// Report directory (its work/ holds configs and logs of the run).
    #[arg(long, value_name = "DIR", default_value = "bench-reports/fleet")]
    report: PathBuf,
    /// Seed of the plan (who runs and follows what, what is replaced).
    #[arg(long, value_name = "N", default_value_t = 1)]
    seed: u64,
    /// Worker processes that share the agents (the load generator's cores).
    #[arg(long, value_name = "K", default_value_t = 1)]
    procs: u32,
}

#[derive(Debug, Args)]
struct BenchWorkerArgs {
    /// The settings file the coordinator wrote.
    #[arg(long, value_name = "FILE")]
    settings: PathBuf,
    /// Which worker this is.
    #[arg(long, value_name = "K")]
    index: u32,
}

#[derive(Debug, Args)]
struct ChaosSummaryArgs {
    /// The directory of run directories (e.g. chaos/results).
    dir: PathBuf,
    /// Write the table into this README between its markers instead of
    /// printing it.
    #[arg(long, value_name = "FILE")]
    readme: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct ChaosSimArgs {
    /// The scenario file.
    scenario: PathBuf,
    /// Seed of everything random; the same seed and flags give the same
    /// history and report (but the `wall` figures).
    #[arg(long, value_name = "N", default_value_t = 1)]
    seed: u64,
    /// Report directory; default chaos-reports/sim-<scenario name>.
    #[arg(long, value_name = "DIR")]
    report: Option<PathBuf>,
    /// Override the scenario's agent count (instances and services scale).
    #[arg(long, value_name = "N")]
    agents: Option<u32>,
    /// The CI version of the scenario (about 200 agents, shorter).
    #[arg(long)]
    short: bool,
}

#[derive(Debug, Args)]
struct ChaosRunArgs {
    /// The scenario file.
    scenario: PathBuf,
    /// Report directory; default chaos-reports/<scenario name>.
    #[arg(long, value_name = "DIR")]
    report: Option<PathBuf>,
    /// Multiply every scenario duration by X (0.1 = ten times shorter); the
    /// system's own timers are never scaled.
    #[arg(long, value_name = "X")]
    time_scale: Option<f64>,
    /// Recorded in the report.
    #[arg(long, value_name = "N", default_value_t = 1)]
    seed: u64,
    /// Override the scenario's agent count.
    #[arg(long, value_name = "N")]
    agents: Option<u32>,
    /// The CI version of the scenario (fewer agents, its own time scale).
    #[arg(long)]
    short: bool,
    /// Run the agents with this gossip preset (lan, tolerant, wan) instead
    /// of the scenario's.
    #[arg(long, value_name = "PRESET")]
    gossip_preset: Option<String>,
}

#[derive(Debug, Args)]
struct EchoArgs {
    /// Where to listen (`host:port`).
    #[arg(long, value_name = "ADDR")]
    listen: SocketAddr,
    /// The instance id to answer with.
    #[arg(long, value_name = "ID")]
    id: String,
    /// Close each connection right after the id line instead of holding it.
    #[arg(long)]
    no_hold: bool,
    /// Also serve HTTP health on ADDR: `GET /ready` answers 200, or 503
    /// while the `--not-ready-file` exists; `GET /live` answers 200.
    #[arg(long, value_name = "ADDR")]
    health: Option<SocketAddr>,
    /// While this file exists, `GET /ready` answers 503 (how the chaos
    /// harness fails an instance's readiness).
    #[arg(long, value_name = "PATH", requires = "health")]
    not_ready_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct GossipKeyArgs {
    /// The key id (0-255); a rotation's new key needs another id than the
    /// current one.
    #[arg(long, default_value_t = 1)]
    id: u8,
}

/// Which agent a read-only command asks (no token needed).
#[derive(Debug, Args)]
struct InspectArgs {
    /// The agent's HTTP API. Default: the region's agent in
    /// `<data-dir>/dev.json` when a `rollcall dev` runs there, else
    /// http://127.0.0.1:7070.
    #[arg(long, value_name = "URL")]
    agent: Option<String>,
    /// With `rollcall dev --regions N`: the region whose agent to ask.
    #[arg(long, value_name = "R")]
    region: Option<String>,
    /// The data directory of a `rollcall dev` whose dev.json gives the
    /// default above.
    #[arg(long, value_name = "DIR", default_value = "./rollcall-data")]
    data_dir: PathBuf,
    /// Print the agent's JSON answer instead of a table.
    #[arg(long)]
    json: bool,
}

impl InspectArgs {
    /// The agent's API.
    fn api(&self) -> anyhow::Result<rollcall::inspect::AgentApi> {
        let region = DevTargets::region_in(&self.data_dir, self.region.as_deref())
            .map_err(anyhow::Error::msg)?;
        let agent = self
            .agent
            .clone()
            .or_else(|| region.map(|r| r.agent))
            .unwrap_or_else(|| "http://127.0.0.1:7070".to_owned());
        Ok(rollcall::inspect::AgentApi::new(&agent))
    }
}

#[derive(Debug, Args)]
struct ResolveArgs {
    /// The service: `namespace/service/port_name`, or `namespace/service`
    /// or `service` (namespace and port name `default`).
    #[arg(value_name = "SERVICE", value_parser = parse_service)]
    service: rollcall_leases::ServiceKey,
    /// Every record, whatever its state, not only the endpoints a caller
    /// would be given.
    #[arg(long)]
    all: bool,
    /// Print the answer again at every change (a blocking query on the
    /// answer's index), until Ctrl-C; errors are printed as they change
    /// and asked again every second.
    #[arg(long)]
    watch: bool,
    #[command(flatten)]
    target: InspectArgs,
}

#[derive(Debug, Args)]
struct DrainArgs {
    /// The instance to drain.
    instance_id: String,
    /// Its generation (the node token may omit it: the agent's current one).
    #[arg(long)]
    generation: Option<u64>,
    /// The agent's HTTP API. Default: the region's agent in
    /// `<data-dir>/dev.json` when a `rollcall dev` runs there, else
    /// http://127.0.0.1:7070.
    #[arg(long, value_name = "URL")]
    agent: Option<String>,
    /// The node token file (`agent.token` in the agent's data dir).
    /// Default: that agent's in dev.json, else
    /// ./rollcall-data/agent/agent.token.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// With `rollcall dev --regions N`: the region whose agent to ask.
    #[arg(long, value_name = "R")]
    region: Option<String>,
    /// The data directory of a `rollcall dev` whose dev.json gives the
    /// defaults above.
    #[arg(long, value_name = "DIR", default_value = "./rollcall-data")]
    data_dir: PathBuf,
    /// Return once committed, or once every subscribed agent applied it.
    #[arg(long, value_name = "WHEN", default_value = "propagated", value_parser = ["committed", "propagated"])]
    wait: String,
}

#[derive(Debug, Args)]
struct ArbiterArgs {
    /// Arbiter config file (see config/examples/arbiter.toml).
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// QUIC address for agents (overrides `listen`).
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Admin HTTP address (overrides `admin`).
    #[arg(long, value_name = "ADDR")]
    admin: Option<SocketAddr>,
    /// Data directory (overrides `data_dir`).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Region (overrides `region`).
    #[arg(long, value_name = "R")]
    region: Option<String>,
}

#[derive(Debug, Args)]
struct BridgeArgs {
    /// Bridge config file (see config/examples/bridge.toml).
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
}

#[derive(Debug, Args)]
struct AgentArgs {
    /// Agent config file (see config/examples/agent.toml).
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// HTTP API address (overrides `http_listen`).
    #[arg(long, value_name = "ADDR")]
    http: Option<SocketAddr>,
    /// Data directory (overrides `data_dir`).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct DevArgs {
    /// Data directory; the arbiter and the agent each get a subdirectory.
    #[arg(long, value_name = "DIR", default_value = "./rollcall-data")]
    data_dir: PathBuf,
    /// The agent's HTTP API.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7070")]
    http: SocketAddr,
    /// The arbiter's admin endpoint (replica k of `--replicas` uses the
    /// port k − 1 above it). Not with --regions.
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "127.0.0.1:7071",
        conflicts_with = "regions"
    )]
    admin: SocketAddr,
    /// The arbiter's QUIC address (replica k uses the port k − 1 above
    /// it; with --regions, region k's arbiter the port 10(k − 1) above it);
    /// free ports when omitted.
    #[arg(long, value_name = "ADDR")]
    quic: Option<SocketAddr>,
    /// Arbiter replicas in one Raft group: 1, 3 or 5. Not with --regions
    /// (one replica per region).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1,
        conflicts_with = "regions"
    )]
    replicas: u8,
    /// A TCP proxy listener for a service (`SERVICE=ADDR`, SERVICE as
    /// `service`, `namespace/service` or `namespace/service/port_name`);
    /// repeatable.
    #[arg(long, value_name = "SERVICE=ADDR", value_parser = parse_proxy)]
    proxy: Vec<rollcall_config::ProxyEntry>,
    /// The agent's DNS server (UDP and TCP). Not with --regions.
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "127.0.0.1:8600",
        conflicts_with = "regions"
    )]
    dns: SocketAddr,
    /// Run this many regions (r1, r2, …), each with an arbiter, an agent
    /// (also its region's ingress gateway) and a region bridge. Region k's
    /// agent HTTP API is on the `--http` port + 10(k−1), its arbiter admin
    /// on the next port, ingress +2, bridge +3, DNS +4, bridge metrics +5,
    /// and its arbiter QUIC on the `--quic` port + 10(k−1) (free ports
    /// without --quic); `--proxy` listeners run on r1's agent; `--admin`,
    /// `--dns` and `--replicas` are refused with it.
    #[arg(long, value_name = "N")]
    regions: Option<u8>,
}

/// Parses `--proxy SERVICE=ADDR`, completing the service key with the
/// "default" namespace and port name.
fn parse_proxy(value: &str) -> Result<rollcall_config::ProxyEntry, String> {
    let (service, addr) = value
        .split_once('=')
        .ok_or_else(|| format!("{value:?}: write SERVICE=ADDR, e.g. web=127.0.0.1:15001"))?;
    let key = match service.split('/').count() {
        1 => format!("default/{service}/default"),
        2 => format!("{service}/default"),
        _ => service.to_owned(),
    };
    key.parse::<rollcall_leases::ServiceKey>()
        .map_err(|e| e.to_string())?;
    let listen = addr
        .parse()
        .map_err(|e| format!("{addr:?} is not an address: {e}"))?;
    Ok(rollcall_config::ProxyEntry {
        service: key,
        listen,
        traffic: Default::default(),
    })
}

#[derive(Debug, Subcommand)]
enum ClusterCommand {
    /// List the replicas: id, QUIC address, voter or learner, leader, how
    /// far each trails the leader's log.
    Members(ClusterArgs),
    /// Add a replica (started with `raft.id = ID` and an empty data
    /// directory): it catches up as a learner, then becomes a voter.
    Add {
        #[command(flatten)]
        admin: ClusterArgs,
        /// The new replica's id.
        #[arg(long)]
        id: u64,
        /// Its QUIC address (`host:port`, its `listen`).
        #[arg(long, value_name = "HOST:PORT")]
        addr: String,
    },
    /// Remove a replica from the group (replace one: add the new, then
    /// remove the old).
    Remove {
        #[command(flatten)]
        admin: ClusterArgs,
        /// The replica's id.
        #[arg(long)]
        id: u64,
    },
}

#[derive(Debug, Subcommand)]
enum PolicyCommand {
    /// Validate a policy file (one `[[policy]]` table per service) and
    /// commit it. Nothing is applied when any policy breaks a rule or has
    /// another home region; a policy set as it already is commits nothing.
    Apply {
        /// The policy file.
        file: PathBuf,
        #[command(flatten)]
        admin: ClusterArgs,
    },
    /// Print a service's policy in the file format, with its revision.
    Show {
        /// `namespace/service` (or `service`, in namespace `default`).
        #[arg(value_name = "SERVICE", value_parser = parse_policy_key)]
        service: rollcall_leases::PolicyKey,
        #[command(flatten)]
        admin: ClusterArgs,
    },
    /// Delete a service's policy (in its home region).
    Delete {
        /// `namespace/service` (or `service`, in namespace `default`).
        #[arg(value_name = "SERVICE", value_parser = parse_policy_key)]
        service: rollcall_leases::PolicyKey,
        #[command(flatten)]
        admin: ClusterArgs,
    },
}

/// Parses a service key, completing `service` or `namespace/service` with
/// the "default" namespace and port name.
fn parse_service(value: &str) -> Result<rollcall_leases::ServiceKey, String> {
    let key = match value.split('/').count() {
        1 => format!("default/{value}/default"),
        2 => format!("{value}/default"),
        _ => value.to_owned(),
    };
    key.parse()
        .map_err(|e: rollcall_leases::NameError| e.to_string())
}

/// Parses a policy's SERVICE, completing a bare name with the "default"
/// namespace.
fn parse_policy_key(value: &str) -> Result<rollcall_leases::PolicyKey, String> {
    let key = if value.contains('/') {
        value.to_owned()
    } else {
        format!("default/{value}")
    };
    key.parse()
        .map_err(|e: rollcall_leases::NameError| e.to_string())
}

/// Which arbiter replica an operator command asks, and with which token.
#[derive(Debug, Args)]
struct ClusterArgs {
    /// Any replica's admin address. Default: the region's first replica in
    /// `<data-dir>/dev.json` when a `rollcall dev` runs there, else
    /// 127.0.0.1:7071.
    #[arg(long, value_name = "ADDR")]
    admin: Option<String>,
    /// The operator token file (`admin.token` in that replica's data dir).
    /// Default: that replica's in dev.json, else
    /// ./rollcall-data/arbiter/admin.token.
    #[arg(long, value_name = "F")]
    token_file: Option<PathBuf>,
    /// With `rollcall dev --regions N`: the region to ask (r1, r2, …).
    /// Default: the first.
    #[arg(long, value_name = "R")]
    region: Option<String>,
    /// The data directory of a `rollcall dev` whose dev.json gives the
    /// defaults above.
    #[arg(long, value_name = "DIR", default_value = "./rollcall-data")]
    data_dir: PathBuf,
}

impl ClusterArgs {
    /// The admin address and the operator token.
    fn target(&self) -> anyhow::Result<(String, String)> {
        let replica = DevTargets::region_in(&self.data_dir, self.region.as_deref())
            .map_err(anyhow::Error::msg)?
            .and_then(|r| r.arbiter(self.admin.as_deref()).cloned());
        let admin = self
            .admin
            .clone()
            .or_else(|| replica.as_ref().map(|r| r.admin.clone()))
            .unwrap_or_else(|| "127.0.0.1:7071".to_owned());
        let token_file = self
            .token_file
            .clone()
            .or_else(|| replica.map(|r| r.token_file))
            .unwrap_or_else(|| PathBuf::from("./rollcall-data/arbiter/admin.token"));
        let token = rollcall_leases::secret::read_token(&token_file)
            .with_context(|| format!("reading the operator token {}", token_file.display()))?;
        Ok((admin, token))
    }
}

#[derive(Debug, Args)]
struct AuditArgs {
    #[command(flatten)]
    target: ClusterArgs,
    /// Only changes to this service: `namespace/service/port_name`, or
    /// `namespace/service` or `service` (namespace and port name
    /// `default`).
    #[arg(long, value_name = "S", value_parser = parse_service)]
    service: Option<rollcall_leases::ServiceKey>,
    /// Only changes after this revision.
    #[arg(long, value_name = "REV")]
    since: Option<u64>,
    /// At most this many entries.
    #[arg(long, default_value_t = 1000)]
    limit: usize,
}

#[derive(Debug, Args)]
struct BudgetArgs {
    /// Agent config file; built-in defaults when omitted.
    #[arg(long = "config", value_name = "AGENT_TOML")]
    agent_config: Option<PathBuf>,
    /// Arbiter config file; built-in defaults when omitted.
    #[arg(long, value_name = "ARBITER_TOML")]
    arbiter_config: Option<PathBuf>,
}

#[derive(Debug, Args)]
#[command(group(
    clap::ArgGroup::new("identities")
        .required(true)
        .multiple(true)
        .args(["agent", "arbiter", "bridge", "controller", "operator", "renew", "rotate_ca", "retire_old_ca"])
))]
struct CertsArgs {
    /// Directory for the CA and certificates; created when missing.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Region of the CA and of every identity (a DNS label).
    #[arg(long, value_name = "REGION", value_parser = parse_region)]
    region: Label,
    /// Node agent identity (its node id), optionally with the node's
    /// addresses as IP SANs (`node-17=10.0.0.17,10.0.1.17`): the addresses
    /// an arbiter with `registration.addresses = "declared"` lets the node
    /// register; repeatable.
    #[arg(long, value_name = "NODE[=ADDR,...]", value_parser = parse_agent)]
    agent: Vec<(PrincipalName, Vec<std::net::IpAddr>)>,
    /// Arbiter replica identity; repeatable. Also valid for localhost,
    /// 127.0.0.1 and ::1.
    #[arg(long, value_name = "NAME", value_parser = parse_principal)]
    arbiter: Vec<PrincipalName>,
    /// Region bridge identity; repeatable. Also valid for localhost,
    /// 127.0.0.1 and ::1.
    #[arg(long, value_name = "NAME", value_parser = parse_principal)]
    bridge: Vec<PrincipalName>,
    /// Controller (orchestrator) identity; repeatable.
    #[arg(long, value_name = "NAME", value_parser = parse_principal)]
    controller: Vec<PrincipalName>,
    /// Operator identity; repeatable.
    #[arg(long, value_name = "NAME", value_parser = parse_principal)]
    operator: Vec<PrincipalName>,
    /// A DNS name agents use to reach the arbiters (or peers the bridges),
    /// added to arbiter and bridge certificates; repeatable.
    #[arg(long, value_name = "NAME")]
    dns: Vec<String>,
    /// An IP address likewise added to arbiter and bridge certificates;
    /// repeatable.
    #[arg(long, value_name = "ADDR")]
    ip: Vec<std::net::IpAddr>,
    /// Reissue every certificate in DIR from DIR's CA, each with a fresh
    /// key and the identity and names it had; the CA is never replaced.
    /// Processes reload the copied files by themselves.
    #[arg(long, conflicts_with_all = ["agent", "arbiter", "bridge", "controller", "operator", "dns", "ip", "rotate_ca", "retire_old_ca"])]
    renew: bool,
    /// Start a CA rotation: a new CA whose key becomes ca.key (the old key
    /// is kept as ca.key.previous) and whose certificate goes first in
    /// ca.crt, ahead of the old one, so processes given that ca.crt trust
    /// both. Then `--renew`, then `--retire-old-ca`.
    #[arg(long, conflicts_with_all = ["agent", "arbiter", "bridge", "controller", "operator", "dns", "ip", "retire_old_ca"])]
    rotate_ca: bool,
    /// End a CA rotation: ca.crt keeps only the CA of ca.key, ca.key.previous
    /// is deleted. Refused while a certificate in DIR is not that CA's
    /// (run `--renew` first).
    #[arg(long, conflicts_with_all = ["agent", "arbiter", "bridge", "controller", "operator", "dns", "ip"])]
    retire_old_ca: bool,
}

/// Validates `--region` at the edge, so clap reports a bad one as a usage
/// error naming the rule.
fn parse_region(value: &str) -> Result<Label, String> {
    Label::new(value).map_err(|error| format!("region: {error}"))
}

/// `NODE` or `NODE=ADDR,ADDR…` for `certs --agent`.
fn parse_agent(value: &str) -> Result<(PrincipalName, Vec<std::net::IpAddr>), String> {
    let (name, addresses) = match value.split_once('=') {
        Some((name, list)) => {
            let addresses = list
                .split(',')
                .map(|a| {
                    a.trim().parse::<std::net::IpAddr>().map_err(|_| {
                        format!("{a:?} is not an IP address; write NODE=ADDR[,ADDR...], e.g. node-17=10.0.0.17")
                    })
                })
                .collect::<Result<Vec<_>, String>>()?;
            (name, addresses)
        }
        None => (value, Vec::new()),
    };
    Ok((parse_principal(name)?, addresses))
}

/// Validates an identity's name at the edge, like `parse_region`.
fn parse_principal(value: &str) -> Result<PrincipalName, String> {
    PrincipalName::new(value).map_err(|error| error.to_string())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Budget(args) => budget(&args),
        Command::Certs(args) => certs(&args),
        Command::Arbiter(args) => serve(run_arbiter(args)),
        Command::Agent(args) => serve(run_agent(args)),
        Command::Bridge(args) => serve(run_bridge(args)),
        Command::Dev(args) => serve(run_dev(args)),
        Command::Audit(args) => serve(audit(args)),
        Command::Cluster(command) => serve(cluster(command)),
        Command::Policy(command) => serve(policy(command)),
        Command::Drain(args) => serve(drain(args)),
        Command::Status(args) => serve(status(args)),
        Command::Members(args) => serve(members(args)),
        Command::Services(args) => serve(services(args)),
        Command::Resolve(args) => serve(resolve(args)),
        Command::Chaos(ChaosCommand::Run(args)) => serve(chaos_run(args)),
        Command::Chaos(ChaosCommand::Sim(args)) => chaos_sim(args),
        Command::Chaos(ChaosCommand::Summary(args)) => chaos_summary(&args),
        Command::Bench(BenchCommand::Fleet(args)) => serve(bench_fleet(args)),
        Command::Bench(BenchCommand::Worker(args)) => {
            init_process();
            rollcall_chaos::bench::worker::run(&args.settings, args.index)
                .map(|()| ExitCode::SUCCESS)
                .map_err(anyhow::Error::from)
        }
        Command::Echo(args) => serve(async move {
            let data = rollcall_chaos::echo::serve(args.listen, args.id, !args.no_hold);
            match args.health {
                None => data
                    .await
                    .with_context(|| format!("echo on {}", args.listen))?,
                Some(health) => {
                    let health = rollcall_chaos::echo::serve_health(health, args.not_ready_file);
                    tokio::select! {
                        r = data => r.with_context(|| format!("echo on {}", args.listen))?,
                        r = health => r.context("echo health")?,
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }),
        Command::GossipKey(args) => {
            println!("{}", rollcall_gossip::ZoneKey::generate_line(args.id));
            Ok(ExitCode::SUCCESS)
        }
    };
    outcome.unwrap_or_else(|error| {
        eprintln!("error: {}", chain(&error));
        ExitCode::from(EXIT_UNUSABLE)
    })
}

/// `path` made absolute against the working directory (as it is when that
/// fails).
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_owned())
}

/// An error and its causes on one line, each cause once: an error whose
/// message already names its source (`binding …: Address already in use`)
/// is not followed by that source again.
fn chain(error: &anyhow::Error) -> String {
    let mut text = error.to_string();
    for cause in error.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

/// Prints the budget table to stdout, warnings and violations to stderr.
fn budget(args: &BudgetArgs) -> anyhow::Result<ExitCode> {
    let agent = load(args.agent_config.as_deref(), "agent", |p| {
        AgentConfig::load(p)
    })?;
    let arbiter = load(args.arbiter_config.as_deref(), "arbiter", |p| {
        ArbiterConfig::load(p)
    })?;
    let report = Budget::compute(&agent, &arbiter);
    print!("{report}");
    println!("\n{}", report.pause);
    for warning in &report.warnings {
        eprintln!("warning: {warning}");
    }
    let violations = report.violations();
    for violation in &violations {
        eprintln!("error: {violation}");
    }
    Ok(if violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_VIOLATIONS)
    })
}

/// Renews certificates, or starts or ends a CA rotation, and lists every
/// file written or deleted and what to do next.
fn rotation_step(args: &CertsArgs) -> anyhow::Result<ExitCode> {
    let (step, next) = if args.renew {
        (
            tls::renew_certs(&args.out, &args.region)?,
            "copy each renewed certificate and key to its host (ca.crt is unchanged); every process reloads them within [tls] check_interval_ms, or at once on SIGHUP",
        )
    } else if args.rotate_ca {
        (
            tls::rotate_ca(&args.out, &args.region)?,
            "copy ca.crt (now both CAs) to every host and to the other regions' bridges ([[peers]] ca); once every process has reloaded it, run `rollcall certs --renew` with the same --out and --region",
        )
    } else {
        (
            tls::retire_old_cas(&args.out, &args.region)?,
            "copy ca.crt (now the current CA alone) to every host and to the other regions' bridges",
        )
    };
    for file in &step.written {
        println!("wrote {}", file.display());
    }
    for file in &step.deleted {
        println!("deleted {}", file.display());
    }
    if step.written.is_empty() && step.deleted.is_empty() {
        println!(
            "nothing to do: {} holds one CA",
            args.out.join(tls::CA_CERT_FILE).display()
        );
    } else {
        println!(
            "{} holds {} CA certificate(s); next: {next}",
            args.out.join(tls::CA_CERT_FILE).display(),
            step.cas
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Issues the requested certificates and lists every file written.
fn certs(args: &CertsArgs) -> anyhow::Result<ExitCode> {
    if args.renew || args.rotate_ca || args.retire_old_ca {
        return rotation_step(args);
    }
    let agents: Vec<PrincipalName> = args.agent.iter().map(|(name, _)| name.clone()).collect();
    let identities: Vec<Identity> = [
        (Role::Agent, &agents),
        (Role::Arbiter, &args.arbiter),
        (Role::Bridge, &args.bridge),
        (Role::Controller, &args.controller),
        (Role::Operator, &args.operator),
    ]
    .into_iter()
    .flat_map(|(role, names)| {
        names
            .iter()
            .map(move |name| Identity::new(args.region.clone(), role, name.clone()))
    })
    .collect();
    // TlsError messages already name the file at fault and the remedy.
    let names = tls::ServerNames {
        dns: args.dns.clone(),
        ips: args.ip.clone(),
        agent_ips: args
            .agent
            .iter()
            .filter(|(_, ips)| !ips.is_empty())
            .map(|(name, ips)| (name.as_str().to_owned(), ips.clone()))
            .collect(),
    };
    let written = tls::write_certs(&args.out, &args.region, &identities, &names)?;
    if written.ca_reused {
        println!("reused CA {}", args.out.join(tls::CA_CERT_FILE).display());
    }
    for file in &written.files {
        println!("wrote {}", file.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Loads the file when one was given, else the defaults. Read and parse
/// errors name the file themselves; validation errors name the field.
fn load<T: Default>(
    path: Option<&Path>,
    kind: &str,
    load: impl Fn(&Path) -> Result<T, ConfigError>,
) -> anyhow::Result<T> {
    path.map_or_else(
        || Ok(T::default()),
        |path| load(path).with_context(|| format!("{kind} config")),
    )
}

/// Runs an async command on a multi-thread runtime, with logs on stderr
/// (`RUST_LOG` sets the level; default `info`, openraft's and hickory's own
/// at `warn`).
fn serve(
    command: impl std::future::Future<Output = anyhow::Result<ExitCode>>,
) -> anyhow::Result<ExitCode> {
    init_process();
    // An actix System over one multi-thread tokio runtime: the agent's
    // actors need the System, and everything else shares the runtime.
    rollcall_node::runtime::block_on(None, command)
}

/// The log filter without `RUST_LOG`. openraft's `core::raft_core` warns
/// only that it ignores a stale message (a vote answer or a replication
/// result from an earlier term or membership), which every election
/// produces, e.g. five at each `dev --replicas 3` start: errors only there.
const DEFAULT_LOG_FILTER: &str =
    "info,hickory_server=warn,openraft=warn,openraft::core::raft_core=error";

/// Logs on stderr and the one TLS crypto provider, once per process.
fn init_process() {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| DEFAULT_LOG_FILTER.into()),
        )
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal, never into a log file or pipe.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    tls::install_crypto_provider();
}

/// Waits for Ctrl-C or SIGTERM.
async fn stop_signal() {
    serve_until_stopped(&[]).await;
}

/// Waits for Ctrl-C or SIGTERM; each SIGHUP meanwhile reloads the TLS
/// material every one of `watchers` keeps (without watchers SIGHUP keeps
/// its default action, so `rollcall dev` still ends with its terminal).
async fn serve_until_stopped(watchers: &[tls::Watcher]) {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut term) = signal(SignalKind::terminate()) else {
            let _ = ctrl_c.await;
            return;
        };
        let mut hup = match watchers.is_empty() {
            true => None,
            false => signal(SignalKind::hangup()).ok(),
        };
        tokio::pin!(ctrl_c);
        loop {
            tokio::select! {
                _ = &mut ctrl_c => return,
                _ = term.recv() => return,
                Some(_) = async { hup.as_mut()?.recv().await } => {
                    tracing::info!(watchers = watchers.len(), "SIGHUP: reloading the TLS material");
                    for watcher in watchers {
                        watcher.reload_now();
                    }
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = watchers;
        let _ = ctrl_c.await;
    }
}

fn tls_files(paths: Option<&TlsPaths>, field: &str) -> anyhow::Result<tls::TlsFiles> {
    let paths = paths.with_context(|| format!("{field} is not set: generate certificates with `rollcall certs` and name them in [tls] (ca, cert, key)"))?;
    Ok(tls::TlsFiles {
        ca: paths.ca.clone(),
        cert: paths.cert.clone(),
        key: paths.key.clone(),
    })
}

/// Keeps `reload`'s material current: its files are read every
/// `[tls] check_interval_ms` (never when 0) and on SIGHUP.
fn tls_watcher(
    what: &'static str,
    reload: std::sync::Arc<dyn tls::Reload>,
    paths: Option<&TlsPaths>,
) -> tls::Watcher {
    let every = paths
        .map(|p| p.check_interval_ms)
        .filter(|ms| *ms > 0)
        .map(std::time::Duration::from_millis);
    tls::Watcher::spawn(what, reload, every)
}

/// Refuses `ROLLCALL_FAULTS` in a build without the fault points, rather
/// than run a chaos scenario that silently injects nothing. (An empty value
/// asks for no faults.)
fn check_fault_points() -> anyhow::Result<()> {
    let asked = std::env::var_os("ROLLCALL_FAULTS").is_some_and(|v| !v.is_empty());
    if asked && !rollcall_leases::FAULT_INJECTION {
        anyhow::bail!(
            "ROLLCALL_FAULTS is set but this binary was built without the fault-injection feature (cargo build --release --features fault-injection)"
        );
    }
    Ok(())
}

async fn run_arbiter(args: ArbiterArgs) -> anyhow::Result<ExitCode> {
    check_fault_points()?;
    let mut config = ArbiterConfig::load(&args.config).context("arbiter config")?;
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    if let Some(admin) = args.admin {
        config.admin = admin;
    }
    if let Some(dir) = args.data_dir {
        config.data_dir = dir;
    }
    if let Some(region) = args.region {
        config.region = region;
    }
    config
        .validate()
        .context("arbiter config after command-line overrides")?;
    let files = tls_files(config.tls.as_ref(), "arbiter.tls")?;
    let material = tls::TlsMaterial::load(&files)?;
    let paths = config.tls.clone();
    let server = rollcall_leases::server::ArbiterServer::start(config, &material).await?;
    println!(
        "arbiter serving: QUIC {}, admin http://{} (operator token in {})",
        server.quic_addr,
        server.admin_addr,
        server.token_file.display()
    );
    let reload = std::sync::Arc::new(tls::FileReload {
        files,
        live: server.tls().clone(),
    });
    serve_until_stopped(&[tls_watcher("arbiter", reload, paths.as_ref())]).await;
    server.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

async fn run_agent(args: AgentArgs) -> anyhow::Result<ExitCode> {
    let mut config = AgentConfig::load(&args.config).context("agent config")?;
    if let Some(http) = args.http {
        config.http_listen = http;
    }
    if let Some(dir) = args.data_dir {
        config.data_dir = dir;
    }
    config
        .validate()
        .context("agent config after command-line overrides")?;
    let files = match config.arbiters.is_empty() {
        true => None,
        false => Some(tls_files(config.tls.as_ref(), "agent.tls")?),
    };
    let material = files.as_ref().map(tls::TlsMaterial::load).transpose()?;
    let handle = rollcall_node::process::start(config.clone(), material.as_ref()).await?;
    println!(
        "agent serving: http://{} (node token in {})",
        handle.http_addr,
        config.data_dir.join("agent.token").display()
    );
    let watchers: Vec<tls::Watcher> = files
        .zip(handle.agent.tls().cloned())
        .map(|(files, live)| {
            tls_watcher(
                "agent",
                std::sync::Arc::new(tls::FileReload { files, live }),
                config.tls.as_ref(),
            )
        })
        .into_iter()
        .collect();
    serve_until_stopped(&watchers).await;
    handle.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

async fn run_bridge(args: BridgeArgs) -> anyhow::Result<ExitCode> {
    let config = BridgeConfig::load(&args.config).context("bridge config")?;
    let tls = rollcall_region_bridge::BridgeTls::load(&config)?;
    let peers: Vec<String> = config
        .peers
        .iter()
        .map(|p| format!("{} at {}", p.region, p.address))
        .collect();
    let bridge = rollcall_region_bridge::Bridge::start(config.clone(), tls).await?;
    println!(
        "bridge of region {} serving: QUIC {}; peers: {}; arbiter admin {}",
        config.region,
        bridge.listen_addr,
        if peers.is_empty() {
            "none".to_owned()
        } else {
            peers.join(", ")
        },
        config.arbiter.admin.join(", ")
    );
    let watcher = tls_watcher("bridge", bridge.tls_reload(), config.tls.as_ref());
    serve_until_stopped(&[watcher]).await;
    bridge.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

async fn run_dev(args: DevArgs) -> anyhow::Result<ExitCode> {
    check_fault_points()?;
    if let Some(n) = args.regions {
        let mut options =
            rollcall::dev_regions::RegionsOptions::new(n, args.data_dir.clone(), args.http);
        options.proxies = args.proxy;
        options.quic = args.quic;
        let dev = rollcall::dev_regions::DevRegions::start(options).await?;
        let targets = write_targets(&dev.targets(), &args.data_dir)?;
        println!("{}{targets}", dev.banner());
        stop_signal().await;
        DevTargets::remove(&args.data_dir);
        dev.shutdown().await;
        return Ok(ExitCode::SUCCESS);
    }
    let data_dir = args.data_dir.clone();
    let options = rollcall::dev::DevOptions {
        proxies: args.proxy,
        dns: args.dns,
        data_dir: args.data_dir,
        http: args.http,
        admin: args.admin,
        quic: args.quic,
        replicas: args.replicas,
    };
    let dev = rollcall::dev::Dev::start(options).await?;
    let targets = write_targets(&dev.targets(), &data_dir)?;
    println!("{}{targets}", dev.banner());
    stop_signal().await;
    DevTargets::remove(&data_dir);
    dev.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

/// Writes `dev.json` for the operator commands; the banner's line about it.
fn write_targets(targets: &DevTargets, data_dir: &Path) -> anyhow::Result<String> {
    // Absolute paths, so the commands find the tokens from any directory.
    let mut targets = targets.clone();
    for region in &mut targets.regions {
        region.agent_token_file = absolute(&region.agent_token_file);
        for arbiter in &mut region.arbiters {
            arbiter.token_file = absolute(&arbiter.token_file);
        }
    }
    let path = targets.write(data_dir).with_context(|| {
        format!(
            "writing {}",
            data_dir.join(rollcall::targets::FILE_NAME).display()
        )
    })?;
    Ok(format!(
        "
{}
",
        targets_hint(&path, data_dir)
    ))
}

/// The data directory the operator commands read `dev.json` from when
/// they are given no `--data-dir`.
const DEFAULT_DATA_DIR: &str = "./rollcall-data";

/// The banner's line about `dev.json` at `path` in `data_dir`: the
/// commands find it by themselves only from the directory whose
/// `./rollcall-data` it is; otherwise they need `--data-dir`.
fn targets_hint(path: &Path, data_dir: &Path) -> String {
    let dir = absolute(data_dir);
    let how = if dir == absolute(Path::new(DEFAULT_DATA_DIR)) {
        format!(
            "run them from this directory, or pass --data-dir {}",
            dir.display()
        )
    } else {
        format!("pass them --data-dir {}", dir.display())
    };
    format!(
        "rollcall status, members, services, resolve, drain, audit, cluster and policy read their addresses and token files from {} ({how})",
        path.display()
    )
}

async fn chaos_run(args: ChaosRunArgs) -> anyhow::Result<ExitCode> {
    let binary = std::env::current_exe().context("finding the rollcall binary")?;
    let run = rollcall_chaos::RunArgs {
        scenario: args.scenario,
        report: args.report,
        time_scale: args.time_scale,
        seed: args.seed,
        agents: args.agents,
        short: args.short,
        gossip_preset: args.gossip_preset,
        binary,
        build: build_info(),
    };
    // Ctrl-C or SIGTERM drops the run, which stops its processes and
    // removes its namespaces.
    let outcome = tokio::select! {
        outcome = rollcall_chaos::run(&run) => outcome?,
        _ = stop_signal() => anyhow::bail!("stopped; everything the run started was removed"),
    };
    let (report, dir) = outcome;
    println!(
        "{}: {} — leave p99 {} ms, crash p99 {} ms, failed connections {}; report in {}",
        report.scenario,
        if report.pass { "PASS" } else { "FAIL" },
        report
            .leave_ms
            .p99
            .map_or("-".into(), |v| format!("{v:.0}")),
        report
            .crash_ms
            .p99
            .map_or("-".into(), |v| format!("{v:.0}")),
        report.failed_conns,
        dir.display()
    );
    for failure in &report.failures {
        eprintln!("  {failure}");
    }
    Ok(if report.pass {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

async fn bench_fleet(args: BenchFleetArgs) -> anyhow::Result<ExitCode> {
    use rollcall_chaos::bench;
    let binary = std::env::current_exe().context("finding the rollcall binary")?;
    let fleet = bench::FleetArgs {
        spawn: args.spawn.unwrap_or(1),
        arbiters: args.arbiters,
        admin: args.admin,
        certs: args.certs,
        shape: bench::plan::Shape {
            agents: args.agents,
            instances: args.instances,
            services: args.services,
            follow: args.follow,
            zones: 3.min(args.agents.max(1)),
            deploy_share: 0.1,
            storm_share: 0.02,
            wipe_share: 0.1,
            seed: args.seed,
        },
        scenario: match args.scenario {
            BenchScenario::Steady => bench::Scenario::Steady,
            BenchScenario::Deploy => bench::Scenario::Deploy,
            BenchScenario::Storm => bench::Scenario::Storm,
            BenchScenario::All => bench::Scenario::All,
        },
        duration_s: args.duration_s,
        report: args.report.clone(),
        procs: args.procs,
        binary,
        build: build_info(),
    };
    // Ctrl-C or SIGTERM drops the run, which stops every process it started.
    let report = tokio::select! {
        report = bench::run(&fleet) => report?,
        _ = stop_signal() => anyhow::bail!("stopped; every process the bench started was stopped"),
    };
    let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1} ms"));
    println!(
        "fleet bench: {} — deploy leave p99 {}, commit → applied p99 {}, storm converged in {}; report in {}",
        if report.failures.is_empty() { "measured" } else { "INCOMPLETE" },
        ms(report.deploy.as_ref().and_then(|d| d.leave.p99_ms)),
        ms(report.deploy.as_ref().and_then(|d| d.applied.p99_ms)),
        report
            .storm
            .as_ref()
            .and_then(|s| s.converge_s)
            .map_or("-".into(), |s| format!("{s:.1} s")),
        args.report.display()
    );
    for failure in &report.failures {
        eprintln!("  {failure}");
    }
    Ok(if report.failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_VIOLATIONS)
    })
}

fn chaos_summary(args: &ChaosSummaryArgs) -> anyhow::Result<ExitCode> {
    use rollcall_chaos::summary;
    let reports = summary::reports(&args.dir)?;
    let table = summary::table(&reports);
    match &args.readme {
        Some(readme) => {
            summary::update_readme(readme, &table)?;
            println!(
                "{}: table of {} runs written",
                readme.display(),
                reports.len()
            );
        }
        None => print!("{table}"),
    }
    Ok(ExitCode::SUCCESS)
}

fn chaos_sim(args: ChaosSimArgs) -> anyhow::Result<ExitCode> {
    let sim = rollcall_chaos::sim::SimArgs {
        scenario: args.scenario,
        report: args.report,
        seed: args.seed,
        agents: args.agents,
        short: args.short,
        progress: true,
        build: build_info(),
    };
    let run = rollcall_chaos::sim::simulate(&sim)?;
    let dir = sim
        .report
        .clone()
        .unwrap_or_else(|| rollcall_chaos::sim::default_dir(&run.report.report.scenario));
    rollcall_chaos::sim::write(&dir, &run)?;
    let r = &run.report;
    let p99 = |s: &rollcall_chaos::report::Stats| s.p99.map_or("-".into(), |v| format!("{v:.0}"));
    println!(
        "{}: {} — leave p99 {} ms, crash p99 {} ms, false removals {}, digest {}, {:.1} s wall; report in {}",
        r.report.scenario,
        if r.report.pass { "PASS" } else { "FAIL" },
        p99(&r.report.leave_ms),
        p99(&r.report.crash_ms),
        r.report.false_removals,
        r.digest,
        r.wall.setup_s + r.wall.run_s,
        dir.display()
    );
    for failure in &r.report.failures {
        eprintln!("  {failure}");
    }
    Ok(if r.report.pass {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// One call to an arbiter's admin endpoint with the operator token: the
/// JSON answer, or an error carrying the arbiter's `detail`.
async fn admin_call(
    method: reqwest::Method,
    url: &str,
    token: &str,
    body: Option<serde_json::Value>,
) -> anyhow::Result<serde_json::Value> {
    let mut call = reqwest::Client::new()
        .request(method, url)
        .bearer_auth(token);
    if let Some(body) = body {
        call = call.json(&body);
    }
    let response = call.send().await.with_context(|| format!("asking {url}"))?;
    let status = response.status();
    let body: serde_json::Value = response.json().await.context("reading the answer")?;
    if !status.is_success() {
        anyhow::bail!(
            "the arbiter answered {status}: {}",
            body["detail"].as_str().unwrap_or("no detail")
        );
    }
    Ok(body)
}

async fn cluster(command: ClusterCommand) -> anyhow::Result<ExitCode> {
    let (args, request) = match &command {
        ClusterCommand::Members(args) => (args, None),
        ClusterCommand::Add { admin, id, addr } => (
            admin,
            Some((
                reqwest::Method::POST,
                "/v1/cluster/members".to_owned(),
                Some(serde_json::json!({"id": id, "addr": addr})),
            )),
        ),
        ClusterCommand::Remove { admin, id } => (
            admin,
            Some((
                reqwest::Method::DELETE,
                format!("/v1/cluster/members/{id}"),
                None,
            )),
        ),
    };
    let (admin, token) = args.target()?;
    let (method, path, body) =
        request.unwrap_or((reqwest::Method::GET, "/v1/cluster".to_owned(), None));
    let url = format!("http://{admin}{path}");
    let body = admin_call(method, &url, &token, body).await?;
    if let ClusterCommand::Remove { admin: args, id } = &command {
        forget_replica(args, *id)?;
    }
    println!(
        "term {}  leader {}  (asked replica {})",
        body["term"], body["leader"], body["id"]
    );
    println!(
        "{:>4}  {:<24}  {:<8}  {:<6}  lag",
        "id", "addr", "role", "leader"
    );
    let text = |v: &serde_json::Value| match v {
        serde_json::Value::Null => "-".to_owned(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    for m in body["members"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        println!(
            "{:>4}  {:<24}  {:<8}  {:<6}  {}",
            text(&m["id"]),
            text(&m["addr"]),
            if m["voter"] == true {
                "voter"
            } else {
                "learner"
            },
            if m["leader"] == true { "yes" } else { "" },
            text(&m["lag"]),
        );
    }
    if body["leader"] != body["id"] {
        println!("(lag is known on the leader; ask its admin address for it)");
    }
    Ok(ExitCode::SUCCESS)
}

/// After `cluster remove`: the `rollcall dev` whose dev.json gave the
/// defaults no longer lists the removed replica, so later commands do not
/// ask it (it answers only that it was removed).
fn forget_replica(args: &ClusterArgs, id: u64) -> anyhow::Result<()> {
    let Some(mut dev) = DevTargets::read(&args.data_dir).map_err(anyhow::Error::msg)? else {
        return Ok(());
    };
    let region = dev
        .region(args.region.as_deref())
        .map_err(anyhow::Error::msg)?
        .region
        .clone();
    let Some(targets) = dev.regions.iter_mut().find(|r| r.region == region) else {
        return Ok(());
    };
    let before = targets.arbiters.len();
    targets.arbiters.retain(|a| a.replica != id);
    if targets.arbiters.len() < before {
        let path = dev
            .write(&args.data_dir)
            .with_context(|| format!("updating {}", args.data_dir.display()))?;
        println!("{}: replica {id} is no longer listed", path.display());
    }
    Ok(())
}

async fn policy(command: PolicyCommand) -> anyhow::Result<ExitCode> {
    let (PolicyCommand::Apply { admin, .. }
    | PolicyCommand::Show { admin, .. }
    | PolicyCommand::Delete { admin, .. }) = &command;
    let (admin, token) = admin.target()?;
    let base = format!("http://{admin}/v1/policies");
    match &command {
        PolicyCommand::Apply { file, .. } => {
            let document = rollcall_config::PolicyFile::load(file)?;
            let body = serde_json::to_value(&document).context("encoding the policies")?;
            let body = admin_call(reqwest::Method::PUT, &base, &token, Some(body)).await?;
            for row in body["policies"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
            {
                println!(
                    "{}: revision {}{}",
                    row["service"].as_str().unwrap_or("?"),
                    row["revision"],
                    if row["changed"] == true {
                        ""
                    } else {
                        " (unchanged)"
                    }
                );
            }
        }
        PolicyCommand::Show { service, .. } => {
            let url = format!("{base}/{}/{}", service.namespace, service.service);
            let body = admin_call(reqwest::Method::GET, &url, &token, None).await?;
            let document: rollcall_config::ServicePolicy =
                serde_json::from_value(body["policy"].clone())
                    .context("reading the policy in the arbiter's answer")?;
            println!("{}", policy_header(&service, &body));
            let file = rollcall_config::PolicyFile {
                policy: vec![document],
            };
            print!("{}", file.to_toml());
        }
        PolicyCommand::Delete { service, .. } => {
            let url = format!("{base}/{}/{}", service.namespace, service.service);
            let body = admin_call(reqwest::Method::DELETE, &url, &token, None).await?;
            println!(
                "policy of {service} deleted at revision {}",
                body["revision"]
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn audit(args: AuditArgs) -> anyhow::Result<ExitCode> {
    let (admin, token) = args.target.target()?;
    let mut url = format!("http://{admin}/v1/audit?limit={}", args.limit);
    if let Some(service) = &args.service {
        url.push_str(&format!("&service={service}"));
    }
    if let Some(since) = args.since {
        url.push_str(&format!("&since={since}"));
    }
    let body = admin_call(reqwest::Method::GET, &url, &token, None).await?;
    println!(
        "{:>9}  {:<24}  {:<28}  {:<14}  {:<28}  {:<20}  detail",
        "revision", "time (UTC)", "actor", "command", "service", "instance"
    );
    for entry in body.as_array().map(Vec::as_slice).unwrap_or_default() {
        let services: Vec<&str> = entry["services"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter_map(|s| s.as_str())
            .collect();
        println!(
            "{:>9}  {:<24}  {:<28}  {:<14}  {:<28}  {:<20}  {}",
            entry["revision"].to_string(),
            entry["at_ms"]
                .as_u64()
                .map_or_else(|| "?".to_owned(), rfc3339),
            entry["actor"].as_str().unwrap_or(""),
            entry["command"].as_str().unwrap_or(""),
            if services.is_empty() {
                "-".to_owned()
            } else {
                services.join(",")
            },
            entry["instance"].as_str().unwrap_or("-"),
            entry["detail"].as_str().unwrap_or(""),
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Milliseconds since the Unix epoch as RFC 3339 in UTC, to the millisecond
/// (`2026-12-02T04:36:56.277Z`).
/// The comment line `policy show` prints above a policy, from the
/// arbiter's answer; times in RFC 3339, as `audit` prints them.
fn policy_header(service: &impl std::fmt::Display, body: &serde_json::Value) -> String {
    format!(
        "# {service}: revision {}, home region {}, set by {} at {}{}",
        body["revision"],
        body["home_region"].as_str().unwrap_or("?"),
        body["set_by"].as_str().unwrap_or("?"),
        body["set_at_ms"]
            .as_u64()
            .map_or_else(|| "?".to_owned(), rfc3339),
        if body["replicated"] == true {
            format!(
                "; replicated from its home region at home revision {}",
                body["home_revision"]
            )
        } else {
            String::new()
        },
    )
}

fn rfc3339(at_ms: u64) -> String {
    i64::try_from(at_ms)
        .ok()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map_or_else(
            || format!("{at_ms} ms"),
            |t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
        )
}

/// Prints `value` as pretty JSON.
fn print_json(value: &impl serde::Serialize) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).expect("answers always encode")
    );
}

async fn status(args: InspectArgs) -> anyhow::Result<ExitCode> {
    let status = args.api()?.status().await?;
    if args.json {
        print_json(&status);
    } else {
        print!("{}", rollcall::inspect::render_status(&status));
    }
    Ok(ExitCode::SUCCESS)
}

async fn members(args: InspectArgs) -> anyhow::Result<ExitCode> {
    let status = args.api()?.status().await?;
    if args.json {
        print_json(&serde_json::json!({
            "node": status.node,
            "zone": status.zone,
            "gossip": status.gossip,
        }));
    } else {
        print!("{}", rollcall::inspect::render_members(&status));
    }
    Ok(ExitCode::SUCCESS)
}

async fn services(args: InspectArgs) -> anyhow::Result<ExitCode> {
    let list = args.api()?.services().await?;
    if args.json {
        print_json(&list);
    } else {
        print!("{}", rollcall::inspect::render_services(&list));
    }
    Ok(ExitCode::SUCCESS)
}

/// One answer, or with --watch every change until Ctrl-C. Without
/// --watch an error answer ends the command (exit 2); with it, the error
/// is printed once while it lasts and the agent asked again every second.
async fn resolve(args: ResolveArgs) -> anyhow::Result<ExitCode> {
    let api = args.target.api()?;
    let query = rollcall::inspect::ResolveQuery {
        service: args.service.clone(),
        all: args.all,
    };
    let print = |answer: &rollcall_node::api_types::EndpointsResponse| {
        if args.target.json && args.watch {
            println!(
                "{}",
                serde_json::to_string(answer).expect("answers always encode")
            );
        } else if args.target.json {
            print_json(answer);
        } else {
            if args.watch {
                println!("--- {}", rfc3339(rollcall_leases::clock::now_ms()));
            }
            print!("{}", rollcall::inspect::render_endpoints(answer));
        }
    };
    if !args.watch {
        print(&api.resolve(&query, None).await?);
        return Ok(ExitCode::SUCCESS);
    }
    let mut index: Option<String> = None;
    let mut last_error: Option<String> = None;
    loop {
        match api.resolve(&query, index.as_deref()).await {
            Ok(answer) => {
                last_error = None;
                if index.as_deref() != Some(answer.index.as_str()) {
                    print(&answer);
                    index = Some(answer.index.clone());
                }
            }
            Err(e) => {
                let text = e.to_string();
                if last_error.as_deref() != Some(text.as_str()) {
                    eprintln!("error: {text} (asking again every second)");
                    last_error = Some(text);
                }
                index = None;
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }
    }
}

async fn drain(args: DrainArgs) -> anyhow::Result<ExitCode> {
    let region = DevTargets::region_in(&args.data_dir, args.region.as_deref())
        .map_err(anyhow::Error::msg)?;
    let agent = args
        .agent
        .clone()
        .or_else(|| region.as_ref().map(|r| r.agent.clone()))
        .unwrap_or_else(|| "http://127.0.0.1:7070".to_owned());
    let token_file = args
        .token_file
        .clone()
        .or_else(|| region.map(|r| r.agent_token_file))
        .unwrap_or_else(|| PathBuf::from("./rollcall-data/agent/agent.token"));
    let token = rollcall_leases::secret::read_token(&token_file)
        .with_context(|| format!("reading the node token {}", token_file.display()))?;
    let mut url = format!(
        "{}/v1/agent/instances/{}/drain?wait={}",
        agent.trim_end_matches('/'),
        args.instance_id,
        args.wait
    );
    if let Some(generation) = args.generation {
        url.push_str(&format!("&generation={generation}"));
    }
    let response = reqwest::Client::new()
        .put(&url)
        .bearer_auth(token)
        .send()
        .await
        .with_context(|| format!("asking {url}"))?;
    let status = response.status();
    let body: serde_json::Value = response
        .json()
        .await
        .context("reading the agent's answer")?;
    if !status.is_success() {
        anyhow::bail!(
            "the agent answered {status}: {}",
            body["detail"].as_str().unwrap_or("no detail")
        );
    }
    if body["pending"] == true {
        println!("drain of {} accepted locally (the arbiter is unreachable): this agent no longer routes to it; it commits when the arbiter returns", args.instance_id);
    } else {
        println!(
            "drain of {} committed at revision {}",
            args.instance_id, body["revision"]
        );
        if let Some(p) = body.get("propagated").filter(|p| !p.is_null()) {
            println!(
                "applied by {} of {} subscribed agents{}",
                p["acked"],
                p["total"],
                if p["complete"] == true {
                    ""
                } else {
                    " (timed out waiting for the rest)"
                }
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_show_prints_its_time_as_audit_does() {
        let body = serde_json::json!({
            "revision": 9, "home_region": "r1", "set_by": "operator:admin",
            "set_at_ms": 1_000_000_000_007u64, "replicated": false,
        });
        assert_eq!(
            policy_header(&"shop/checkout", &body),
            "# shop/checkout: revision 9, home region r1, set by operator:admin at 2001-09-09T01:46:40.007Z"
        );
    }

    #[test]
    fn audit_times_are_rfc3339_utc_to_the_millisecond() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_000_000_000_007), "2001-09-09T01:46:40.007Z");
        assert_eq!(rfc3339(u64::MAX), format!("{} ms", u64::MAX));
    }

    #[test]
    fn a_service_flag_completes_the_default_namespace_and_port() {
        let key = |s: &str| parse_service(s).unwrap().to_string();
        assert_eq!(key("web"), "default/web/default");
        assert_eq!(key("shop/web"), "shop/web/default");
        assert_eq!(key("shop/web/http"), "shop/web/http");
        assert!(parse_service("Web").is_err());
    }
}
