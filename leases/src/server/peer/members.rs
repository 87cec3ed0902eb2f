//! Which replicas of the group a peer connection may speak for (issue 38,
//! item 4): a certificate naming an arbiter of this region is not enough,
//! it must also name the address of a replica in the group's membership.
//!
//! Every member already holds such a certificate: a replica dials a member
//! at the host its membership entry names, and the TLS handshake checks
//! that the member's certificate answers to that host. So requiring it of
//! whoever connects refuses no member, and refuses an arbiter certificate
//! that names none of them (a retired replica's address, another group's).
//! How sharply it tells replicas apart depends on how certificates were
//! issued: one per replica with its own address (`rollcall certs --arbiter
//! NAME=ADDR`) binds each to one member; names shared by every arbiter
//! certificate (`--ip`, `--dns`) bind each to all of them.
//!
//! A Raft call (vote, append, snapshot) names the replica that sends it;
//! that replica must be one the certificate covers, so a replica cannot
//! campaign or lead under another's id. A replica that knows no group yet
//! (new, wiped, or added but not yet reached by its leader) admits any
//! arbiter of its region: its first leader is how it learns the group.

use std::collections::BTreeSet;
use std::net::IpAddr;

use openraft::{BasicNode, Membership};

use crate::ids::ReplicaId;
use crate::peer_protocol::{PeerRequest, ShardRpc};

/// The names a peer's certificate answers to: its IP and DNS SANs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CertNames {
    /// IP SANs.
    pub ips: Vec<IpAddr>,
    /// DNS SANs.
    pub dns: Vec<String>,
}

impl CertNames {
    /// The names of the leaf certificate a verified peer presented.
    pub fn of(conn: &quinn::Connection) -> CertNames {
        let leaf = conn
            .peer_identity()
            .and_then(|any| {
                any.downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
                    .ok()
            })
            .and_then(|chain| chain.first().cloned());
        leaf.map_or_else(CertNames::default, |leaf| CertNames {
            ips: crate::identity::ip_sans_from_cert_der(&leaf),
            dns: crate::identity::dns_sans_from_cert_der(&leaf),
        })
    }

    /// Whether these names include `host` (an IP address or a DNS name).
    fn cover(&self, host: &str) -> bool {
        match host.parse::<IpAddr>() {
            Ok(ip) => self
                .ips
                .iter()
                .any(|own| own.to_canonical() == ip.to_canonical()),
            Err(_) => {
                let host = host.trim_end_matches('.');
                self.dns.iter().any(|own| own.eq_ignore_ascii_case(host))
            }
        }
    }
}

/// The host of a member's `host:port` address (brackets of an IPv6
/// literal removed).
fn host(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Whom a peer connection speaks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// This replica knows no group yet: any arbiter of its region.
    Joining,
    /// The members (voters and learners) whose address the certificate
    /// names.
    Members(BTreeSet<ReplicaId>),
}

/// Whom a peer whose certificate answers to `names` may speak for in the
/// group `membership`, or why it may not speak at all.
pub fn admit(
    membership: &Membership<ReplicaId, BasicNode>,
    names: &CertNames,
) -> Result<Admission, String> {
    let mut nodes = membership.nodes().peekable();
    if nodes.peek().is_none() {
        return Ok(Admission::Joining);
    }
    let mut covered = BTreeSet::new();
    let mut listed = Vec::new();
    for (id, node) in nodes {
        if names.cover(host(&node.addr)) {
            covered.insert(*id);
        }
        listed.push(format!("{id} at {}", node.addr));
    }
    if covered.is_empty() {
        return Err(format!(
            "its certificate names {} and none of the group's replicas ({}): only a member \
             of the group may speak on the peer link (add it with `rollcall cluster add`, \
             and issue its certificate with its own address: `rollcall certs --arbiter NAME=ADDR`)",
            describe(names),
            listed.join(", ")
        ));
    }
    Ok(Admission::Members(covered))
}

/// The replica a Raft call says it comes from: the candidate of a vote,
/// the leader of an append or a snapshot. Other requests name none.
pub fn sender(request: &PeerRequest) -> Option<ReplicaId> {
    let vote = match request {
        PeerRequest::Vote(rpc) => &rpc.vote,
        PeerRequest::AppendEntries(rpc) => &rpc.vote,
        PeerRequest::InstallSnapshot(rpc) => &rpc.vote,
        PeerRequest::Shard { rpc, .. } => match rpc {
            ShardRpc::Vote(rpc) => &rpc.vote,
            ShardRpc::AppendEntries(rpc) => &rpc.vote,
            ShardRpc::InstallSnapshot(rpc) => &rpc.vote,
            ShardRpc::Campaign { .. } | ShardRpc::Membership(_) => return None,
        },
        _ => return None,
    };
    vote.leader_id().voted_for()
}

/// Whether a peer admitted as `admission` may send `request`, or why not.
pub fn may_send(admission: &Admission, request: &PeerRequest) -> Result<(), String> {
    let (Admission::Members(ids), Some(sender)) = (admission, sender(request)) else {
        return Ok(());
    };
    if ids.contains(&sender) {
        return Ok(());
    }
    let ids: Vec<String> = ids.iter().map(ToString::to_string).collect();
    Err(format!(
        "a Raft call as replica {sender} on a connection whose certificate names replica {} \
         only: a replica may speak only as itself",
        ids.join(", ")
    ))
}

fn describe(names: &CertNames) -> String {
    let mut all: Vec<String> = names.ips.iter().map(ToString::to_string).collect();
    all.extend(names.dns.iter().cloned());
    if all.is_empty() {
        "no address".to_owned()
    } else {
        all.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use openraft::{BasicNode, Membership};

    use super::*;

    fn group(members: &[(ReplicaId, &str)]) -> Membership<ReplicaId, BasicNode> {
        let ids: BTreeSet<ReplicaId> = members.iter().map(|(id, _)| *id).collect();
        let nodes: BTreeMap<ReplicaId, BasicNode> = members
            .iter()
            .map(|(id, addr)| (*id, BasicNode::new(*addr)))
            .collect();
        Membership::new(vec![ids], nodes)
    }

    fn names(ips: &[&str], dns: &[&str]) -> CertNames {
        CertNames {
            ips: ips.iter().map(|ip| ip.parse().expect("ip")).collect(),
            dns: dns.iter().map(|d| (*d).to_owned()).collect(),
        }
    }

    #[test]
    fn a_certificate_naming_no_member_is_refused_and_one_naming_a_member_speaks_for_it() {
        let membership = group(&[
            (1, "10.0.0.1:7000"),
            (2, "10.0.0.2:7000"),
            (3, "arb-3.r1.example:7000"),
        ]);
        let retired = admit(
            &membership,
            &names(&["127.0.0.1", "10.0.0.9"], &["localhost"]),
        )
        .expect_err("a retired replica's address is no member's");
        assert!(retired.contains("10.0.0.9"), "{retired}");
        assert!(retired.contains("2 at 10.0.0.2:7000"), "{retired}");
        assert_eq!(
            admit(&membership, &names(&["10.0.0.2"], &[])),
            Ok(Admission::Members([2].into()))
        );
        assert_eq!(
            admit(&membership, &names(&[], &["ARB-3.r1.example"])),
            Ok(Admission::Members([3].into()))
        );
        // Shared names bind a certificate to every member they name.
        assert_eq!(
            admit(&membership, &names(&["10.0.0.1", "10.0.0.2"], &[])),
            Ok(Admission::Members([1, 2].into()))
        );
        // IPv6 literals and IPv4-mapped names compare as addresses.
        let v6 = group(&[(1, "[::ffff:10.0.0.1]:7000")]);
        assert_eq!(
            admit(&v6, &names(&["10.0.0.1"], &[])),
            Ok(Admission::Members([1].into()))
        );
    }

    #[test]
    fn a_replica_that_knows_no_group_admits_any_arbiter_of_its_region() {
        let empty = Membership::<ReplicaId, BasicNode>::new(vec![], BTreeMap::new());
        assert_eq!(admit(&empty, &names(&[], &[])), Ok(Admission::Joining));
    }

    #[test]
    fn a_raft_call_as_another_replica_is_refused() {
        use openraft::raft::VoteRequest;
        use openraft::Vote;
        let vote = |id| PeerRequest::Vote(VoteRequest::new(Vote::new(7, id), None));
        let as_two = Admission::Members([2].into());
        assert_eq!(may_send(&as_two, &vote(2)), Ok(()));
        let refused = may_send(&as_two, &vote(1)).expect_err("speaks as replica 1");
        assert!(refused.contains("as replica 1"), "{refused}");
        assert_eq!(may_send(&Admission::Joining, &vote(1)), Ok(()));
    }
}
