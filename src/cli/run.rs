//! The long-running processes: `rollcall arbiter`, `agent`, `bridge`, and
//! `dev` (a whole cluster in one process, with the `dev.json` it leaves
//! for the operator commands). Each loads its config, starts, and waits.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use rollcall::targets::DevTargets;
use rollcall_config::{AgentConfig, ArbiterConfig, BridgeConfig, ConfigFile, TlsPaths};
use rollcall_leases::tls;

use super::runtime::{serve_until_stopped, stop_signal};

#[derive(Debug, Args)]
pub(crate) struct ArbiterArgs {
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
pub(crate) struct BridgeArgs {
    /// Bridge config file (see config/examples/bridge.toml).
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
}

#[derive(Debug, Args)]
pub(crate) struct AgentArgs {
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
pub(crate) struct DevArgs {
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

/// Runs an arbiter replica until Ctrl-C or SIGTERM.
pub(crate) async fn arbiter(args: ArbiterArgs) -> anyhow::Result<ExitCode> {
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
    if config.catalog.shards > 1 {
        // The groups run (leaders placed, membership, status), but agents'
        // sessions are served from shard 0 alone so far: a store made now
        // with more shards would hold services in the wrong group.
        anyhow::bail!(
            "arbiter.catalog.shards = {}: a catalog in several shards is not served to agents yet (issue 35); use 1",
            config.catalog.shards
        );
    }
    let files = tls_files(config.tls.as_ref(), "arbiter.tls")?;
    let material = tls::TlsMaterial::load(&files)?;
    let paths = config.tls.clone();
    warn_permissive(&config);
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

/// Says at start what a node's certificate lets it do beyond its own
/// instances (README "Security model"): the defaults are permissive.
fn warn_permissive(config: &ArbiterConfig) {
    if config.registration_rules.is_empty() {
        tracing::warn!("any node may register any service: no [[registration_rules]] (README \"Security model\")");
    }
    if config.node_zones.is_empty()
        && config.registration.zones == rollcall_config::ZoneRule::Declared
    {
        tracing::warn!("every node is in the zone its agent declares: no [[node_zones]] (README \"Security model\")");
    }
}

/// Runs a node agent until Ctrl-C or SIGTERM.
pub(crate) async fn agent(args: AgentArgs) -> anyhow::Result<ExitCode> {
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

/// Runs a region bridge until Ctrl-C or SIGTERM.
pub(crate) async fn bridge(args: BridgeArgs) -> anyhow::Result<ExitCode> {
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

/// Runs `rollcall dev` until Ctrl-C or SIGTERM.
pub(crate) async fn dev(args: DevArgs) -> anyhow::Result<ExitCode> {
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

/// `path` made absolute against the working directory (as it is when that
/// fails).
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_owned())
}
