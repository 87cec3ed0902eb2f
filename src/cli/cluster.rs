//! `rollcall cluster`: show or change the arbiter replica set. Also the
//! door every operator command shares to an arbiter's admin endpoint:
//! which replica to ask, with which token (`ClusterArgs`), and the call.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use rollcall::targets::DevTargets;

#[derive(Debug, Subcommand)]
pub(crate) enum ClusterCommand {
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

/// Which arbiter replica an operator command asks, and with which token.
#[derive(Debug, Args)]
pub(crate) struct ClusterArgs {
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
    pub(crate) fn target(&self) -> anyhow::Result<(String, String)> {
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

/// One call to an arbiter's admin endpoint with the operator token: the
/// JSON answer, or an error carrying the arbiter's `detail`.
pub(crate) async fn admin_call(
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

pub(crate) async fn cluster(command: ClusterCommand) -> anyhow::Result<ExitCode> {
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
    print_shards(&body["shards"]);
    Ok(ExitCode::SUCCESS)
}

/// With several shards: each shard's leader, term, revision, applied log
/// index and its members' largest lag (known where the asked replica leads
/// that shard).
fn print_shards(shards: &serde_json::Value) {
    let shards = shards.as_array().map(Vec::as_slice).unwrap_or_default();
    if shards.len() < 2 {
        return;
    }
    let text = |v: &serde_json::Value| match v {
        serde_json::Value::Null => "-".to_owned(),
        other => other.to_string(),
    };
    println!();
    println!(
        "{:>5}  {:>6}  {:>6}  {:>9}  {:>9}  lag",
        "shard", "leader", "term", "revision", "applied"
    );
    for shard in shards {
        let raft = &shard["raft"];
        let lag = raft["members"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter_map(|m| m["lag"].as_u64())
            .max();
        println!(
            "{:>5}  {:>6}  {:>6}  {:>9}  {:>9}  {}",
            text(&shard["shard"]),
            text(&raft["leader"]),
            text(&raft["term"]),
            text(&shard["revision"]),
            text(&raft["applied_index"]),
            lag.map_or("-".to_owned(), |l| l.to_string()),
        );
    }
    let mut led: std::collections::BTreeMap<String, usize> = Default::default();
    for shard in shards {
        *led.entry(text(&shard["raft"]["leader"])).or_default() += 1;
    }
    let spread: Vec<String> = led
        .iter()
        .map(|(leader, n)| format!("replica {leader}: {n}"))
        .collect();
    println!(
        "shards led: {}  (lag is known for the shards the asked replica leads)",
        spread.join(", ")
    );
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
