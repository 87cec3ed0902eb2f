//! The catalog's shards on one replica (issue 35): one openraft group per
//! shard, each with its own store file (`raft::open`) and its own applied
//! catalog, all over the replica's one QUIC peer transport (`RaftNet`
//! tags every other shard's messages with its number), and the placement
//! of their leaders.
//!
//! Placement. A new region's groups are initialized by its members in turn
//! (`shard::initializer`), so each starts led by a different replica.
//! Afterwards every replica runs `balance`: once a period it reads each
//! group's leader, and once they have all held for two periods, if it
//! leads more than ceil(K / live voters) shards it hands one to the voter
//! leading fewest (`shard::next_move`). openraft 0.9
//! has no leadership transfer, and its voters refuse a candidate while the
//! leader's lease (`raft.election_max_ms`) holds; so the hand-over is an
//! election triggered deliberately: the leader stops its heartbeats for
//! that shard, tells the target to campaign once the lease has lapsed
//! (`ShardRpc::Campaign`), and resumes them when the shard has another
//! leader or the attempt timed out. Meanwhile no new write starts on the
//! shard (`ShardGroup::write` waits): an entry would refresh the voters'
//! lease and defeat the election. So a hand-over holds the shard's new
//! writes for about `election_max_ms` plus a few heartbeats.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rollcall_config::ArbiterConfig;

use super::peer::{Peers, RaftNet};
use super::ServerError;
use crate::ids::ShardId;
use crate::params::CatalogParams;
use crate::peer_protocol::{PeerRequest, PeerResponse, ShardRpc};
use crate::raft::{self, AppliedCatalog, CatalogRaftNode, Proposal, ReplicaId};
use crate::shard;

/// One shard's group on this replica.
#[derive(Clone)]
pub struct ShardGroup {
    /// The shard.
    pub shard: ShardId,
    /// Its Raft node.
    pub raft: CatalogRaftNode,
    /// Its applied catalog.
    pub catalog: AppliedCatalog,
    /// True while this replica hands the shard's leadership over (`balance`).
    handing_over: Arc<tokio::sync::watch::Sender<bool>>,
}

impl ShardGroup {
    /// Proposes `proposal` in this shard's group. While this replica hands
    /// the shard's leadership over it waits first (at most the hand-over's
    /// bound): a new entry would refresh the voters' leader lease and
    /// defeat the hand-over, so no write starts meanwhile, and the target,
    /// caught up on what was written before, wins its election. Every
    /// writer of a shard (the core, and benchmarks) proposes through here.
    pub async fn write(
        &self,
        proposal: Proposal,
    ) -> Result<
        openraft::raft::ClientWriteResponse<crate::raft::CatalogRaft>,
        openraft::error::RaftError<
            ReplicaId,
            openraft::error::ClientWriteError<ReplicaId, openraft::BasicNode>,
        >,
    > {
        let mut handing_over = self.handing_over.subscribe();
        let _ = handing_over.wait_for(|busy| !*busy).await;
        self.raft.client_write(proposal).await
    }
}

/// Every shard's group on this replica, by shard number (shard 0 first).
#[derive(Clone)]
pub struct Shards(Arc<Vec<ShardGroup>>);

impl Shards {
    /// The groups, shard 0 first.
    pub fn new(groups: Vec<ShardGroup>) -> Shards {
        Shards(Arc::new(groups))
    }

    /// Shard `shard`'s group, if this replica runs it.
    pub fn get(&self, shard: ShardId) -> Option<&ShardGroup> {
        self.0.get(usize::from(shard.0))
    }

    /// Every group, shard 0 first.
    pub fn iter(&self) -> impl Iterator<Item = &ShardGroup> {
        self.0.iter()
    }

    /// How many shards the catalog has.
    pub fn count(&self) -> u16 {
        u16::try_from(self.0.len()).expect("at most MAX_SHARDS groups")
    }

    /// Sets the per-shard gauges of `metrics` from each group (at a scrape).
    pub fn set_metrics(&self, metrics: &super::metrics::Metrics) {
        for group in self.iter() {
            let label = super::metrics::ShardLabel {
                shard: group.shard.0.to_string(),
            };
            let raft = group.raft.metrics().borrow().clone();
            let gauge = |family: &prometheus_client::metrics::family::Family<
                _,
                prometheus_client::metrics::gauge::Gauge,
            >,
                         value: u64| {
                family
                    .get_or_create(&label)
                    .set(i64::try_from(value).unwrap_or(i64::MAX));
            };
            gauge(&metrics.shard_revision, group.catalog.mark().revision.0);
            gauge(&metrics.shard_term, raft.current_term);
            gauge(&metrics.shard_leader, raft.current_leader.unwrap_or(0));
            gauge(
                &metrics.shard_is_leader,
                u64::from(raft.current_leader == Some(raft.id)),
            );
            gauge(
                &metrics.shard_applied_index,
                raft.last_applied.map_or(0, |l| l.index),
            );
        }
    }

    /// Every shard as `/v1/status` and `/v1/cluster` show it: its number,
    /// revision, catalog identity and services, and its group as
    /// `status::raft_json` shows one (leader, term, members, and their
    /// lag where this replica leads).
    pub fn status_json(&self) -> serde_json::Value {
        let shards: Vec<serde_json::Value> = self
            .iter()
            .map(|group| {
                let (revision, catalog, services) = {
                    let cat = group.catalog.lock();
                    (
                        cat.revision().0,
                        cat.identity().map(|c| c.to_string()),
                        cat.services().len(),
                    )
                };
                let raft = group.raft.metrics().borrow().clone();
                serde_json::json!({
                    "shard": group.shard.0,
                    "revision": revision,
                    "catalog": catalog,
                    "services": services,
                    "raft": super::status::raft_json(&raft),
                })
            })
            .collect();
        serde_json::Value::Array(shards)
    }

    /// Each shard's leader as this replica knows it.
    pub fn leaders(&self) -> Vec<(ShardId, Option<ReplicaId>)> {
        self.iter()
            .map(|g| (g.shard, g.raft.metrics().borrow().current_leader))
            .collect()
    }
}

/// Longest wait a `Campaign` may ask for.
const MAX_CAMPAIGN_WAIT_MS: u64 = 60_000;

/// Serves a peer's message to shard `shard`'s group; a membership change
/// is bounded by `timeout` as any write.
pub(super) async fn serve(
    shards: &Shards,
    shard: ShardId,
    rpc: ShardRpc,
    timeout: Duration,
) -> PeerResponse {
    let Some(group) = shards.get(shard).filter(|_| shard.0 > 0) else {
        return PeerResponse::Answer(crate::answers::unavailable(format!(
            "this replica runs {} shard(s) and has no group for shard {shard} on this path; \
             check that every replica runs with the same arbiter.catalog.shards",
            shards.count()
        )));
    };
    let raft = &group.raft;
    match rpc {
        ShardRpc::AppendEntries(rpc) => PeerResponse::AppendEntries(raft.append_entries(rpc).await),
        ShardRpc::Vote(rpc) => PeerResponse::Vote(raft.vote(rpc).await),
        ShardRpc::InstallSnapshot(rpc) => {
            PeerResponse::InstallSnapshot(raft.install_snapshot(rpc).await)
        }
        ShardRpc::Campaign { after_ms } => {
            let raft = raft.clone();
            let wait = Duration::from_millis(after_ms.min(MAX_CAMPAIGN_WAIT_MS));
            tokio::spawn(async move {
                tokio::time::sleep(wait).await;
                tracing::info!(%shard, "campaigning for the shard's leadership, as its leader asked");
                if let Err(e) = raft.trigger().elect().await {
                    tracing::warn!(%shard, error = %e, "could not call an election");
                }
            });
            PeerResponse::Refused(Vec::new())
        }
        ShardRpc::Membership(change) => PeerResponse::Answer(
            super::membership::apply_membership(&group.raft, change, timeout).await,
        ),
    }
}

/// Opens shard `shard`'s store in the data directory and starts its Raft
/// node over `peers`.
pub(super) async fn open_group(
    config: &ArbiterConfig,
    shard: ShardId,
    peers: &Arc<Peers>,
    raft_config: Arc<openraft::Config>,
) -> Result<ShardGroup, ServerError> {
    let params = CatalogParams::from_config(config, shard)
        .map_err(|e| ServerError::Config(e.to_string()))?;
    let (log, state_machine) = raft::open(&config.data_dir, params, config.catalog.shards)?;
    let state_machine = state_machine.with_audit_limit(config.store.audit_max_entries);
    let catalog = state_machine.catalog();
    let net = RaftNet {
        peers: peers.clone(),
        shard,
    };
    let raft = openraft::Raft::new(config.raft.id, raft_config, net, log, state_machine)
        .await
        .map_err(|e| ServerError::Raft(format!("shard {shard}: {e}")))?;
    Ok(ShardGroup {
        shard,
        raft,
        catalog,
        handing_over: Arc::new(tokio::sync::watch::channel(false).0),
    })
}

/// How long the initializer of a new group waits for its peers to answer
/// before it initializes the group anyway.
const GROUP_START_WAIT: Duration = Duration::from_secs(10);

/// Initializes a new group from the replica whose turn it is
/// (`shard::initializer`); a group of one is waited for until it elected
/// itself, so the first sessions are not refused for want of a leader.
pub(super) async fn bootstrap(
    group: &ShardGroup,
    id: ReplicaId,
    members: &[(ReplicaId, String)],
    peers: &Arc<Peers>,
    election_max_ms: u64,
) -> Result<(), ServerError> {
    let node = &group.raft;
    let shard = group.shard;
    let first = shard::initializer(shard, members.iter().map(|(id, _)| *id).collect()) == Some(id);
    let initialized = node
        .is_initialized()
        .await
        .map_err(|e| ServerError::Raft(e.to_string()))?;
    if first && !initialized {
        let nodes: BTreeMap<ReplicaId, openraft::BasicNode> = members
            .iter()
            .map(|(id, addr)| (*id, openraft::BasicNode::new(addr.clone())))
            .collect();
        if members.len() == 1 {
            tracing::info!(replica = id, %shard, "initializing a new Raft group of one");
            node.initialize(nodes).await.map_err(|e| {
                ServerError::Raft(format!("initializing shard {shard}'s group: {e}"))
            })?;
        } else {
            // The first election asks every peer for its vote: wait
            // (bounded) until they answer a handshake, so replicas started
            // together do not fail each other's first vote.
            let (node, peers) = (node.clone(), peers.clone());
            let others: Vec<String> = members
                .iter()
                .filter(|(m, _)| *m != id)
                .map(|(_, addr)| addr.clone())
                .collect();
            tokio::spawn(async move {
                let deadline = tokio::time::Instant::now() + GROUP_START_WAIT;
                for addr in &others {
                    while !peers.reachable(addr).await && tokio::time::Instant::now() < deadline {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
                tracing::info!(replica = id, %shard, members = ?nodes.keys().collect::<Vec<_>>(), "initializing a new Raft group");
                if let Err(e) = node.initialize(nodes).await {
                    tracing::error!(replica = id, %shard, error = %e, "initializing the Raft group failed");
                }
            });
        }
    }
    if members.len() == 1 && members[0].0 == id {
        let _ = node
            .wait(Some(Duration::from_millis(election_max_ms * 10)))
            .current_leader(id, "a group of one elects itself")
            .await;
    }
    Ok(())
}

/// How long a replica that could not be asked to lead is passed over.
const UNREACHABLE_FOR: Duration = Duration::from_secs(3);

/// Moves shard leadership away from this replica while it leads more than
/// its share (module doc), one shard at a time, until `stopping` fires.
pub(super) async fn balance(
    shards: Shards,
    peers: Arc<Peers>,
    me: ReplicaId,
    raft: rollcall_config::RaftConfig,
    mut stopping: crate::shutdown::Shutdown,
) {
    if shards.count() < 2 {
        // One shard: its leader is wherever the group elects it.
        return;
    }
    let period = Duration::from_millis(raft.election_max_ms.max(1_000));
    // The voters' leader lease is openraft's `election_timeout_max` from
    // the last entry or heartbeat they got; the target campaigns a few
    // heartbeats (at least 200 ms) after it lapsed, so entries still in
    // flight when writes stopped do not defeat it.
    let lease_ms = raft.election_max_ms + (2 * raft.heartbeat_ms).max(200);
    let give_up = Duration::from_millis(lease_ms + 3 * raft.election_max_ms);
    let mut unreachable: BTreeMap<ReplicaId, Instant> = BTreeMap::new();
    let settle = 2 * period;
    let (mut seen, mut settled_since) = (shards.leaders(), Instant::now());
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = stopping.fired() => return,
        }
        // A replica that failed a hand-over is passed over for a while.
        unreachable.retain(|_, since| since.elapsed() < UNREACHABLE_FOR);
        // Moves wait until every shard's leader held for a while: right
        // after a replica died its shards elect new leaders one by one,
        // and a hand-over then would hold a shard's writes again just as
        // they came back (and could pick a target that is about to win
        // another election).
        let leaders = shards.leaders();
        if leaders != seen {
            seen = leaders;
            settled_since = Instant::now();
        }
        if settled_since.elapsed() < settle {
            continue;
        }
        let Some(zero) = shards.get(ShardId(0)) else {
            return;
        };
        let members: BTreeMap<ReplicaId, String> = {
            let metrics = zero.raft.metrics();
            let metrics = metrics.borrow();
            let membership = metrics.membership_config.membership();
            membership
                .voter_ids()
                .filter_map(|v| membership.get_node(&v).map(|n| (v, n.addr.clone())))
                .collect()
        };
        let voters: Vec<ReplicaId> = members.keys().copied().collect();
        // Within its share of every voter, a replica never moves whoever
        // is away: ask nobody.
        let led = seen.iter().filter(|(_, l)| *l == Some(me)).count();
        if led <= seen.len().div_ceil(voters.len().max(1)) {
            continue;
        }
        // The share is counted over the voters that answer a handshake
        // (a cached connection answers at once, a dead replica within the
        // connect timeout).
        let mut away: Vec<ReplicaId> = unreachable.keys().copied().collect();
        for (voter, addr) in &members {
            if *voter != me && !away.contains(voter) && !peers.reachable(addr).await {
                away.push(*voter);
            }
        }
        let Some((shard, target)) = shard::next_move(me, &voters, &seen, &away) else {
            continue;
        };
        let (Some(group), Some(addr)) = (shards.get(shard), members.get(&target)) else {
            continue;
        };
        tracing::info!(%shard, from = me, to = target, "handing the shard's leadership over: this replica leads more than its share");
        group.handing_over.send_replace(true);
        group.raft.runtime_config().heartbeat(false);
        let asked = peers
            .call(
                addr,
                &PeerRequest::Shard {
                    shard,
                    rpc: ShardRpc::Campaign { after_ms: lease_ms },
                },
                Duration::from_millis(2_000),
            )
            .await;
        // The target agrees with `Refused(vec![])`; anything else (it is
        // gone, or runs no group for the shard) passes it over a while.
        let refusal = match asked {
            Ok(PeerResponse::Refused(_)) => None,
            Ok(PeerResponse::Answer(crate::protocol::Response::Rejected { message, .. })) => {
                Some(message)
            }
            Ok(_) => Some("it answered out of protocol".to_owned()),
            Err(e) => Some(e.to_string()),
        };
        if let Some(reason) = refusal {
            group.raft.runtime_config().heartbeat(true);
            group.handing_over.send_replace(false);
            tracing::warn!(%shard, to = target, reason = %reason, "the replica to lead the shard could not be asked; trying others for a while");
            unreachable.insert(target, Instant::now());
            continue;
        }
        let moved = group
            .raft
            .wait(Some(give_up))
            .metrics(
                |m| m.current_leader != Some(me),
                "the shard has another leader",
            )
            .await
            .map(|m| m.current_leader);
        group.raft.runtime_config().heartbeat(true);
        group.handing_over.send_replace(false);
        match moved {
            Ok(leader) => {
                tracing::info!(%shard, from = me, to = ?leader, "the shard's leadership moved")
            }
            Err(_) => tracing::warn!(
                %shard,
                to = target,
                "the shard's leadership did not move in time; this replica keeps leading it"
            ),
        }
    }
}
