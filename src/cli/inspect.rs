//! The read-only commands against a node agent: `rollcall status`,
//! `members`, `services` and `resolve`. They print what `rollcall::inspect`
//! fetches and renders, as a table or as JSON; none needs a token.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use rollcall::targets::DevTargets;

use super::{parse_service, rfc3339};

/// Which agent a read-only command asks (no token needed).
#[derive(Debug, Args)]
pub(crate) struct InspectArgs {
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
pub(crate) struct ResolveArgs {
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

/// Prints `value` as pretty JSON.
fn print_json(value: &impl serde::Serialize) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).expect("answers always encode")
    );
}

pub(crate) async fn status(args: InspectArgs) -> anyhow::Result<ExitCode> {
    let status = args.api()?.status().await?;
    if args.json {
        print_json(&status);
    } else {
        print!("{}", rollcall::inspect::render_status(&status));
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn members(args: InspectArgs) -> anyhow::Result<ExitCode> {
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

pub(crate) async fn services(args: InspectArgs) -> anyhow::Result<ExitCode> {
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
pub(crate) async fn resolve(args: ResolveArgs) -> anyhow::Result<ExitCode> {
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
