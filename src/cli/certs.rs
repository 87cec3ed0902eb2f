//! The key material an operator hands out: `rollcall certs` issues, renews
//! and rotates mTLS certificates; `rollcall gossip-key` prints a zone key.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use rollcall_leases::identity::Identity;
use rollcall_leases::{tls, Label, PrincipalName, Role};

#[derive(Debug, Args)]
#[command(group(
    clap::ArgGroup::new("identities")
        .required(true)
        .multiple(true)
        .args(["agent", "arbiter", "bridge", "controller", "operator", "renew", "rotate_ca", "retire_old_ca", "revoke"])
))]
pub(crate) struct CertsArgs {
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
    #[arg(long, value_name = "NODE[=ADDR,...]", value_parser = parse_addressed)]
    agent: Vec<(PrincipalName, Vec<std::net::IpAddr>)>,
    /// Arbiter replica identity, optionally with the replica's own
    /// addresses as IP SANs (`arb-1=10.0.0.1`): the address its peers and
    /// agents dial, in its certificate only, so its peers know which member
    /// of the group it is (a peer naming no member's address is refused).
    /// Repeatable. Also valid for localhost, 127.0.0.1, ::1 and every
    /// `--dns` and `--ip`.
    #[arg(long, value_name = "NAME[=ADDR,...]", value_parser = parse_addressed)]
    arbiter: Vec<(PrincipalName, Vec<std::net::IpAddr>)>,
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
    /// Revoke a certificate: `ROLE:NAME` (every certificate of that
    /// identity, e.g. `agent:node-7`) or `serial:HEX` (one certificate).
    /// Added to DIR/revoked.txt, beside ca.crt; arbiters, agents and
    /// bridges given that ca.crt reload it with their TLS files (within
    /// their check interval, or at once on SIGHUP): its handshakes are
    /// refused and its sessions closed. Repeatable.
    #[arg(long, value_name = "ROLE:NAME|serial:HEX", conflicts_with_all = ["agent", "arbiter", "bridge", "controller", "operator", "dns", "ip", "renew", "rotate_ca", "retire_old_ca"])]
    revoke: Vec<String>,
}

/// Validates `--region` at the edge, so clap reports a bad one as a usage
/// error naming the rule.
fn parse_region(value: &str) -> Result<Label, String> {
    Label::new(value).map_err(|error| format!("region: {error}"))
}

/// `NAME` or `NAME=ADDR,ADDR…` for `certs --agent` and `--arbiter`.
fn parse_addressed(value: &str) -> Result<(PrincipalName, Vec<std::net::IpAddr>), String> {
    let (name, addresses) = match value.split_once('=') {
        Some((name, list)) => {
            let addresses = list
                .split(',')
                .map(|a| {
                    a.trim().parse::<std::net::IpAddr>().map_err(|_| {
                        format!("{a:?} is not an IP address; write NAME=ADDR[,ADDR...], e.g. node-17=10.0.0.17")
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
pub(crate) fn certs(args: &CertsArgs) -> anyhow::Result<ExitCode> {
    if args.renew || args.rotate_ca || args.retire_old_ca {
        return rotation_step(args);
    }
    if !args.revoke.is_empty() {
        for entry in &args.revoke {
            let entry = revocation_entry(&args.region, entry)?;
            let file = tls::revoked::append(&args.out, &entry)?;
            println!("revoked {entry} in {}", file.display());
        }
        return Ok(ExitCode::SUCCESS);
    }
    let named = |list: &[(PrincipalName, Vec<std::net::IpAddr>)]| -> Vec<PrincipalName> {
        list.iter().map(|(name, _)| name.clone()).collect()
    };
    let with_ips = |list: &[(PrincipalName, Vec<std::net::IpAddr>)]| {
        list.iter()
            .filter(|(_, ips)| !ips.is_empty())
            .map(|(name, ips)| (name.as_str().to_owned(), ips.clone()))
            .collect()
    };
    let (agents, arbiters) = (named(&args.agent), named(&args.arbiter));
    let identities: Vec<Identity> = [
        (Role::Agent, &agents),
        (Role::Arbiter, &arbiters),
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
        agent_ips: with_ips(&args.agent),
        arbiter_ips: with_ips(&args.arbiter),
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

/// `--revoke`'s value as a deny-list line: `serial:HEX` as given,
/// `ROLE:NAME` as the identity URI in `region`.
fn revocation_entry(region: &Label, value: &str) -> anyhow::Result<String> {
    if value.starts_with("serial:") {
        return Ok(value.to_owned());
    }
    let (role, name) = value.split_once(':').ok_or_else(|| {
        anyhow::anyhow!("--revoke {value:?}: write ROLE:NAME (e.g. agent:node-7) or serial:HEX")
    })?;
    let uri = format!("rollcall://{region}/{role}/{name}");
    Identity::parse_uri(&uri).map_err(|e| anyhow::anyhow!("--revoke {value:?}: {e}"))?;
    Ok(uri)
}

#[derive(Debug, Args)]
pub(crate) struct GossipKeyArgs {
    /// The key id (0-255); a rotation's new key needs another id than the
    /// current one.
    #[arg(long, default_value_t = 1)]
    id: u8,
}

/// Prints a fresh zone key line.
pub(crate) fn gossip_key(args: &GossipKeyArgs) -> anyhow::Result<ExitCode> {
    println!("{}", rollcall_gossip::ZoneKey::generate_line(args.id));
    Ok(ExitCode::SUCCESS)
}
