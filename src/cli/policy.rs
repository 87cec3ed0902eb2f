//! `rollcall policy`: apply, show, transfer the writes of, or delete
//! service policies through an arbiter's admin endpoint; the arbiter
//! validates and commits them.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use rollcall_config::ConfigFile;

use super::cluster::{admin_call, ClusterArgs};
use super::rfc3339;

#[derive(Debug, Subcommand)]
pub(crate) enum PolicyCommand {
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
    /// Move a single-writer service's writes to another region: a new
    /// writer epoch, committed by the owner region's arbiter (point
    /// `--admin` there). Writes go nowhere until the new owner's arbiter
    /// has stored the epoch (through the region bridges); then only to it.
    /// While the owner region is unreachable, `--force --reason TEXT` sent
    /// to another region's arbiter commits the epoch there instead; it is
    /// audited in both regions and wins when the old owner comes back.
    Transfer {
        /// `namespace/service` (or `service`, in namespace `default`).
        #[arg(value_name = "SERVICE", value_parser = parse_policy_key)]
        service: rollcall_leases::PolicyKey,
        /// The region to take the writes: the policy's home region or one
        /// of its `failover_order`.
        #[arg(long, value_name = "REGION")]
        to: String,
        /// Commit the transfer at this arbiter although its region does not
        /// own the writes (the owner region is unreachable). Needs
        /// `--reason`.
        #[arg(long, requires = "reason")]
        force: bool,
        /// Why the transfer is forced, for every region's audit log.
        #[arg(long, value_name = "TEXT", requires = "force")]
        reason: Option<String>,
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

pub(crate) async fn policy(command: PolicyCommand) -> anyhow::Result<ExitCode> {
    let (PolicyCommand::Apply { admin, .. }
    | PolicyCommand::Show { admin, .. }
    | PolicyCommand::Transfer { admin, .. }
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
            if let Some(summary) = body["writer"]["summary"].as_str() {
                println!("# {summary}");
            }
            let file = rollcall_config::PolicyFile {
                policy: vec![document],
            };
            print!("{}", file.to_toml());
        }
        PolicyCommand::Transfer {
            service,
            to,
            force,
            reason,
            ..
        } => {
            let url = format!("{base}/{}/{}/transfer", service.namespace, service.service);
            let mut request = serde_json::json!({"to": to, "force": force});
            if let Some(reason) = reason {
                request["reason"] = serde_json::json!(reason);
            }
            let body = admin_call(reqwest::Method::POST, &url, &token, Some(request))
                .await
                .with_context(|| {
                    if *force {
                        format!("transferring the writes of {service} to {to} (forced)")
                    } else {
                        format!("transferring the writes of {service} to {to}; if the owner region's arbiter cannot be reached, run the transfer against another region's arbiter with --force --reason TEXT")
                    }
                })?;
            println!(
                "{service}: {} (revision {})",
                body["writer"]["summary"].as_str().unwrap_or("?"),
                body["revision"]
            );
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
}
