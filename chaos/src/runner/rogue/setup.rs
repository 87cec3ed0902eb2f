//! What a run with a rogue step sets up around it, and what it reads
//! after: the rogue's certificates (its own and a revoked one), every
//! node's zone bound in the replicas' config, and the rogue's committed
//! changes from the audit log.

use std::net::Ipv4Addr;

use super::{MAX_WEIGHT, NODE, REVOKED};
use crate::runner::{io, Cluster, RunError};

/// The certificates the rogue holds, issued with everyone's: `rollcall
/// certs` arguments for its own and the revoked identity at `ip`.
pub(in crate::runner) fn cert_args(ip: Ipv4Addr) -> Vec<String> {
    [NODE, REVOKED]
        .iter()
        .flat_map(|name| ["--agent".to_owned(), format!("{name}={ip}")])
        .collect()
}

/// Revokes [`REVOKED`] in `certs` (before any replica starts, so every
/// replica reads the deny list with its TLS files).
pub(in crate::runner) fn revoke(
    cluster: &Cluster,
    certs: &std::path::Path,
) -> Result<(), RunError> {
    let status = std::process::Command::new(&cluster.binary)
        .args(["certs", "--out"])
        .arg(certs)
        .args(["--region", "r1", "--revoke", &format!("agent:{REVOKED}")])
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(io("rollcall certs --revoke"))?;
    if !status.success() {
        return Err(RunError::Cluster("rollcall certs --revoke failed".into()));
    }
    Ok(())
}

/// `[[node_zones]]` binding every node of the run to its zone, the rogue
/// to the first zone with its weight cap: a Hello declaring another zone
/// is refused.
pub(in crate::runner) fn node_zones(cluster: &Cluster) -> String {
    let mut zones: Vec<&String> = cluster.zones.iter().collect();
    zones.sort();
    zones.dedup();
    let mut toml = format!(
        "\n[[node_zones]]\nnodes = [\"{NODE}\"]\nzone = \"{}\"\nmax_weight = {MAX_WEIGHT}\n",
        cluster.zones[0]
    );
    for zone in zones {
        let nodes: Vec<String> = (0..cluster.nodes.len())
            .filter(|i| cluster.zones[*i] == *zone)
            .map(|i| format!("\"{}\"", cluster.nodes[i]))
            .collect();
        toml.push_str(&format!(
            "\n[[node_zones]]\nnodes = [{}]\nzone = \"{zone}\"\n",
            nodes.join(", ")
        ));
    }
    toml
}

/// Committed changes by the rogue's identity to records it does not own
/// (instances not named `rogue-…`, and any node's down verdict), from the
/// audit log.
pub(in crate::runner) fn foreign_changes(entries: &[crate::history::AuditEntry]) -> Vec<String> {
    entries
        .iter()
        .filter(|e| e.actor == format!("agent:{NODE}"))
        .filter(|e| {
            e.command == "node-down"
                || e.instance
                    .as_deref()
                    .is_some_and(|i| !i.starts_with("rogue-"))
        })
        .map(|e| format!("revision {}: {} {}", e.revision, e.command, e.detail))
        .collect()
}
