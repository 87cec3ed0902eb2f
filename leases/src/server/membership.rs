//! Membership changes on the leader (`rollcall cluster add|remove`): an
//! added replica first catches up as a learner, then joins the voters; a
//! removed one leaves both and is told so (`removal`). Reached from the
//! admin API and from followers handing a change to the leader.
//!
//! With several shards every shard's group has the same members: shard 0's
//! leader makes the change in its group, then in every other shard's
//! group, itself when it leads that shard and through the shard's leader
//! otherwise (`ShardRpc::Membership`), in shard order.

use std::time::Duration;

use openraft::error::RaftError;
use openraft::BasicNode;

use super::connection::PeerContext;
use super::peer::Peers;
use super::shards::{ShardGroup, Shards};
use crate::ids::ShardId;
use crate::peer_protocol::{MembershipChange, PeerRequest, PeerResponse, ShardRpc};
use crate::protocol::{RejectKind, Response};
use crate::raft::{CatalogRaftNode, ReplicaId};

/// Applies a membership change on the leader: an added replica first
/// catches up as a learner, then joins the voters; a removed one leaves
/// both. Answers `Committed` with no revision, or why not.
pub async fn change_membership(
    shards: &Shards,
    peers: &Peers,
    change: MembershipChange,
    timeout: Duration,
) -> Response {
    let raft = &shards.get(ShardId(0)).expect("a catalog has shard 0").raft;
    // The removed replica's address, while the membership still names it.
    let removed_addr = match &change {
        MembershipChange::Remove { id } => addr_of(raft, *id),
        MembershipChange::Add { .. } => None,
    };
    let mut answer = apply_membership(raft, change.clone(), timeout).await;
    if let Response::Committed { .. } = answer {
        let mut failed = Vec::new();
        for group in shards.iter().skip(1) {
            if let Err(reason) = change_shard(group, peers, &change, timeout).await {
                failed.push(format!("shard {}: {reason}", group.shard));
            }
        }
        if !failed.is_empty() {
            answer = crate::answers::unavailable(format!(
                "the change was made in shard 0's group but not in every shard's ({}); \
                 run the same command again to finish it",
                failed.join("; ")
            ));
        }
    }
    if let (MembershipChange::Remove { id }, Response::Committed { .. }) = (&change, &answer) {
        tell_removed(raft, peers, *id, removed_addr, timeout).await;
    }
    answer
}

/// Makes `change` in another shard's group: here when this replica leads
/// it, else through its leader; asked again (a few times, within about a
/// second) while the shard is between leaders. A removal the group already
/// made counts as made, so running a half-finished change again finishes it.
async fn change_shard(
    group: &ShardGroup,
    peers: &Peers,
    change: &MembershipChange,
    timeout: Duration,
) -> Result<(), String> {
    let mut last = String::new();
    for _ in 0..SHARD_ATTEMPTS {
        match change_shard_once(group, peers, change, timeout).await {
            Response::Committed { .. } => return Ok(()),
            Response::Rejected {
                kind: RejectKind::NotFound,
                ..
            } if matches!(change, MembershipChange::Remove { .. }) => return Ok(()),
            Response::Rejected {
                kind: RejectKind::Unavailable,
                message,
            } => last = message,
            Response::Rejected { message, .. } => return Err(message),
            other => return Err(format!("{other:?}")),
        }
        tokio::time::sleep(SHARD_RETRY).await;
    }
    Err(last)
}

/// How often, and how far apart, a shard between leaders is asked again.
const SHARD_ATTEMPTS: usize = 6;
const SHARD_RETRY: Duration = Duration::from_millis(200);

async fn change_shard_once(
    group: &ShardGroup,
    peers: &Peers,
    change: &MembershipChange,
    timeout: Duration,
) -> Response {
    let (me, leader) = {
        let metrics = group.raft.metrics();
        let metrics = metrics.borrow();
        (metrics.id, metrics.current_leader)
    };
    match leader {
        None => crate::answers::unavailable("the shard has no leader now".into()),
        Some(leader) if leader == me => {
            apply_membership(&group.raft, change.clone(), timeout).await
        }
        Some(leader) => {
            // The shard's own membership: shard 0's may already have lost
            // the replica that leads this shard.
            let Some(addr) = addr_of(&group.raft, leader) else {
                return crate::answers::unavailable(format!(
                    "its leader, replica {leader}, is not a member"
                ));
            };
            let request = PeerRequest::Shard {
                shard: group.shard,
                rpc: ShardRpc::Membership(change.clone()),
            };
            match peers.call(&addr, &request, timeout * 21).await {
                Ok(PeerResponse::Answer(answer)) => answer,
                Ok(_) => crate::answers::unavailable(format!(
                    "its leader at {addr} answered out of protocol"
                )),
                Err(e) => crate::answers::unavailable(e.to_string()),
            }
        }
    }
}

/// Replica `id`'s address in the membership this replica holds.
fn addr_of(raft: &CatalogRaftNode, id: ReplicaId) -> Option<String> {
    raft.metrics()
        .borrow()
        .membership_config
        .nodes()
        .find(|(m, _)| **m == id)
        .map(|(_, node)| node.addr.clone())
}

/// Tells replica `id`, whose removal just committed here, that it is out
/// of the group (best effort: a replica that is down is not told).
async fn tell_removed(
    raft: &CatalogRaftNode,
    peers: &Peers,
    id: ReplicaId,
    addr: Option<String>,
    timeout: Duration,
) {
    let Some(addr) = addr else {
        tracing::warn!(
            replica = id,
            "the removed replica's address is not known here; it is not told it was removed"
        );
        return;
    };
    let own = raft.metrics().borrow().id;
    let removal = crate::server::removal::Removal {
        replica: id,
        by: own,
        leader_addr: addr_of(raft, own).unwrap_or_default(),
        at_ms: crate::clock::now_ms(),
    };
    match peers
        .call(&addr, &PeerRequest::Removed(removal), timeout)
        .await
    {
        Ok(_) => tracing::info!(replica = id, addr = %addr, "the removed replica was told"),
        Err(e) => {
            tracing::warn!(replica = id, addr = %addr, error = %e, "the removed replica could not be told it was removed; stop it")
        }
    }
}

/// Records this replica's removal (the leader's word, over an
/// authenticated peer connection of this region).
pub(super) fn removed(context: &PeerContext, removal: crate::server::removal::Removal) -> Response {
    let own = context.raft.metrics().borrow().id;
    if removal.replica != own {
        return Response::Rejected {
            kind: RejectKind::Invalid,
            message: format!("this is replica {own}, not replica {}", removal.replica),
        };
    }
    match context.removed.record(removal.clone()) {
        Ok(()) => {
            tracing::warn!(reason = %removal.describe(), "removed from the Raft group: serving no session or admin call as a member from now on");
            Response::Committed {
                revision: None,
                generation: None,
                state: None,
            }
        }
        Err(e) => crate::answers::unavailable(format!("recording the removal failed: {e}")),
    }
}

/// Applies a membership change on the leader (see [`change_membership`]);
/// also what another shard's leader asks of this replica's group of that
/// shard (`ShardRpc::Membership`).
pub(super) async fn apply_membership(
    raft: &CatalogRaftNode,
    change: MembershipChange,
    timeout: Duration,
) -> Response {
    if let MembershipChange::Remove { id } = &change {
        let known = raft
            .metrics()
            .borrow()
            .membership_config
            .nodes()
            .any(|(n, _)| n == id);
        if !known {
            return Response::Rejected {
                kind: RejectKind::NotFound,
                message: format!("replica {id} is not a member of the group; nothing changed"),
            };
        }
    }
    let work = async {
        let voters: std::collections::BTreeSet<ReplicaId> = raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .collect();
        match change {
            MembershipChange::Add { id, addr } => {
                raft.add_learner(id, BasicNode::new(addr), true).await?;
                let mut next = voters;
                next.insert(id);
                raft.change_membership(next, false).await?;
            }
            MembershipChange::Remove { id } => {
                if voters.contains(&id) {
                    let mut next = voters;
                    next.remove(&id);
                    raft.change_membership(next, false).await?;
                } else {
                    let gone = openraft::ChangeMembers::RemoveNodes([id].into());
                    raft.change_membership(gone, false).await?;
                }
            }
        }
        Ok::<(), RaftError<ReplicaId, openraft::error::ClientWriteError<ReplicaId, BasicNode>>>(())
    };
    // Catching a new replica up can take a while; the membership change
    // itself is bounded like any write once it starts.
    match tokio::time::timeout(timeout * 20, work).await {
        Ok(Ok(())) => Response::Committed {
            revision: None,
            generation: None,
            state: None,
        },
        Ok(Err(RaftError::APIError(openraft::error::ClientWriteError::ForwardToLeader(f)))) => {
            crate::answers::unavailable(match f.leader_node {
                Some(n) => format!(
                    "this replica is not the leader; the leader is replica {} at {}",
                    f.leader_id.unwrap_or_default(),
                    n.addr
                ),
                None => "there is no leader now (no quorum?); retry".into(),
            })
        }
        Ok(Err(RaftError::APIError(e))) => Response::Rejected {
            kind: RejectKind::Invalid,
            message: e.to_string(),
        },
        Ok(Err(e)) => crate::answers::unavailable(e.to_string()),
        Err(_) => crate::answers::unavailable(format!(
            "the membership change did not complete within {} ms; check `rollcall cluster members`",
            (timeout * 20).as_millis()
        )),
    }
}
