//! The `rollcall` command: parses arguments and dispatches to the library
//! crates. It holds no logic of its own beyond printing results and
//! choosing exit codes. Each command's arguments, and the function that
//! runs it, live in a module of `cli/`; this file holds the command list.

mod cli;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use cli::audit::AuditArgs;
use cli::bench::BenchCommand;
use cli::budget::BudgetArgs;
use cli::certs::{CertsArgs, GossipKeyArgs};
use cli::chaos::{ChaosCommand, EchoArgs};
use cli::cluster::ClusterCommand;
use cli::drain::DrainArgs;
use cli::inspect::{InspectArgs, ResolveArgs};
use cli::instance::InstanceCommand;
use cli::policy::PolicyCommand;
use cli::run::{AgentArgs, ArbiterArgs, BridgeArgs, DevArgs};
use cli::runtime::serve;
use cli::{audit, bench, budget, certs, chaos, cluster, drain, inspect, instance, policy, run};

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
    /// Operator actions on one instance record through any replica's
    /// admin endpoint (`free`: release an instance id a node holds).
    #[command(subcommand)]
    Instance(InstanceCommand),
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Budget(args) => budget::budget(&args),
        Command::Certs(args) => certs::certs(&args),
        Command::Arbiter(args) => serve(run::arbiter(args)),
        Command::Agent(args) => serve(run::agent(args)),
        Command::Bridge(args) => serve(run::bridge(args)),
        Command::Dev(args) => serve(run::dev(args)),
        Command::Audit(args) => serve(audit::audit(args)),
        Command::Cluster(command) => serve(cluster::cluster(command)),
        Command::Policy(command) => serve(policy::policy(command)),
        Command::Instance(command) => serve(instance::instance(command)),
        Command::Drain(args) => serve(drain::drain(args)),
        Command::Status(args) => serve(inspect::status(args)),
        Command::Members(args) => serve(inspect::members(args)),
        Command::Services(args) => serve(inspect::services(args)),
        Command::Resolve(args) => serve(inspect::resolve(args)),
        Command::Chaos(ChaosCommand::Run(args)) => serve(chaos::run(args)),
        Command::Chaos(ChaosCommand::Sim(args)) => chaos::sim(args),
        Command::Chaos(ChaosCommand::Summary(args)) => chaos::summary(&args),
        Command::Bench(BenchCommand::Fleet(args)) => serve(bench::fleet(args)),
        Command::Bench(BenchCommand::Worker(args)) => bench::worker(&args),
        Command::Echo(args) => serve(chaos::echo(args)),
        Command::GossipKey(args) => certs::gossip_key(&args),
    };
    outcome.unwrap_or_else(|error| {
        eprintln!("error: {}", chain(&error));
        ExitCode::from(EXIT_UNUSABLE)
    })
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
