//! `rollcall drain`: drain an instance through its agent with the node
//! token, and say how far the change got.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use rollcall::targets::DevTargets;

#[derive(Debug, Args)]
pub(crate) struct DrainArgs {
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

pub(crate) async fn drain(args: DrainArgs) -> anyhow::Result<ExitCode> {
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
