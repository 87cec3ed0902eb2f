//! `rollcall audit`: the arbiter's audit log (who changed what, at which
//! revision) as a table.

use std::process::ExitCode;

use clap::Args;

use super::cluster::{admin_call, ClusterArgs};
use super::{parse_service, rfc3339};

#[derive(Debug, Args)]
pub(crate) struct AuditArgs {
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

pub(crate) async fn audit(args: AuditArgs) -> anyhow::Result<ExitCode> {
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
        // A shard other than 0 is named before its revision (`3:1207`);
        // a catalog of one shard prints as it always did.
        let revision = match entry["shard"].as_u64() {
            Some(shard) if shard > 0 => format!("{shard}:{}", entry["revision"]),
            _ => entry["revision"].to_string(),
        };
        println!(
            "{:>9}  {:<24}  {:<28}  {:<14}  {:<28}  {:<20}  {}",
            revision,
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
