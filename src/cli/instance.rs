//! `rollcall instance free`: an operator frees an instance id that a node
//! holds (issue 38, item 1) through any replica's admin endpoint.

use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::cluster::{admin_call, ClusterArgs};

#[derive(Debug, Subcommand)]
pub(crate) enum InstanceCommand {
    /// Free an instance id: deregister its record whichever node holds it,
    /// so that another node may register the id. An instance id belongs to
    /// the node that holds it live until that node deregisters it or it
    /// expires; this is for a node that cannot (gone for good, or the id
    /// was claimed by mistake). Audited as the operator's.
    Free(FreeArgs),
}

#[derive(Debug, Args)]
pub(crate) struct FreeArgs {
    #[command(flatten)]
    target: ClusterArgs,
    /// The instance id.
    instance_id: String,
    /// Free only this generation (refused if the record moved on).
    #[arg(long, value_name = "N")]
    generation: Option<u64>,
}

pub(crate) async fn instance(command: InstanceCommand) -> anyhow::Result<ExitCode> {
    match command {
        InstanceCommand::Free(args) => {
            let (admin, token) = args.target.target()?;
            let id = rollcall_leases::InstanceId::new(&args.instance_id)
                .map_err(|e| anyhow::anyhow!("instance id {:?}: {e}", args.instance_id))?;
            let mut url = format!("http://{admin}/v1/instances/{id}");
            if let Some(generation) = args.generation {
                url.push_str(&format!("?generation={generation}"));
            }
            let body = admin_call(reqwest::Method::DELETE, &url, &token, None).await?;
            println!(
                "freed {} (generation {} on node {}) at revision {}",
                id,
                body["generation"],
                body["node"].as_str().unwrap_or("?"),
                body["revision"]
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}
