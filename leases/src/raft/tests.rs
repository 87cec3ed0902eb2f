//! The Raft storage against openraft's own storage suite, and the
//! replicated catalog against the plain one.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{CommittedLeaderId, EntryPayload, Membership, RaftLogReader, RaftSnapshotBuilder};
use proptest::prelude::*;
use tempfile::TempDir;

use super::*;
use crate::catalog::Catalog;
use crate::codec::encode_catalog_snapshot;
use crate::command::{Command, Envelope, Registration};
use crate::endpoint::{Principal, Role, State, Weight};
use crate::ids::{AgentEpoch, Generation};
use crate::name::{InstanceId, Label, NodeId, PrincipalName, Reason, ServiceKey, Version};

fn params() -> CatalogParams {
    CatalogParams::with_region(Label::new("r1").unwrap())
}

/// A fresh store in its own temporary directory per suite test.
struct TempStores;

impl StoreBuilder<CatalogRaft, LogStore, CatalogStateMachine, TempDir> for TempStores {
    async fn build(&self) -> Result<(TempDir, LogStore, CatalogStateMachine), StorageError> {
        let dir = tempfile::tempdir().unwrap();
        let (log, sm) = open(dir.path(), params(), 1).unwrap();
        Ok((dir, log, sm))
    }
}

#[test]
fn storage_passes_the_openraft_suite() {
    Suite::test_all(TempStores).unwrap();
}

fn log_id(term: u64, index: u64) -> LogId {
    LogId {
        leader_id: CommittedLeaderId::new(term, 1),
        index,
    }
}

fn normal(index: u64, envelope: Envelope) -> Entry {
    Entry {
        log_id: log_id(1, index),
        payload: EntryPayload::Normal(Proposal::one(envelope)),
    }
}

fn blank(index: u64) -> Entry {
    Entry {
        log_id: log_id(1, index),
        payload: EntryPayload::Blank,
    }
}

fn membership(index: u64, ids: &[u64]) -> Entry {
    let voters: BTreeSet<u64> = ids.iter().copied().collect();
    let nodes = ids
        .iter()
        .map(|id| (*id, openraft::BasicNode::new(format!("arbiter-{id}:7400"))));
    Entry {
        log_id: log_id(1, index),
        payload: EntryPayload::Membership(Membership::new(
            vec![voters],
            nodes.collect::<BTreeMap<_, _>>(),
        )),
    }
}

fn env(at_ms: u64, command: Command) -> Envelope {
    Envelope {
        at_ms,
        actor: Principal {
            role: Role::Agent,
            name: PrincipalName::new("node-4").unwrap(),
        },
        command,
    }
}

fn node(k: u8) -> NodeId {
    NodeId::new(&format!("node-{k}")).unwrap()
}

fn instance(i: u8) -> InstanceId {
    InstanceId::new(&format!("web-{i}")).unwrap()
}

/// One command from a small vocabulary, so random sequences hit leases,
/// registrations, transitions and rejections often.
fn command(pick: u8, a: u8, b: u8) -> Command {
    let k = a % 3;
    let i = b % 4;
    match pick % 8 {
        0 => Command::GrantLease {
            node: node(k),
            epoch: AgentEpoch(u64::from(b % 2) + 1),
            zone: Label::new("z1").unwrap(),
            ttl_ms: 10_000,
        },
        1 | 2 => Command::Register(Registration {
            instance_id: instance(i),
            service: ServiceKey::new("shop", if i % 2 == 0 { "web" } else { "api" }, "http")
                .unwrap(),
            node: node(k),
            epoch: AgentEpoch(1),
            address: IpAddr::V4(Ipv4Addr::new(10, 0, k, i)),
            port: 8080,
            zone: None,
            version: Version::new("v1").unwrap(),
            weight: Weight::DEFAULT,
            labels: Vec::new(),
            initial: if a % 2 == 0 {
                State::Ready
            } else {
                State::Starting
            },
        }),
        3 => Command::Transition {
            instance_id: instance(i),
            generation: Generation(u64::from(a % 2) + 1),
            to: if b % 2 == 0 {
                State::Ready
            } else {
                State::Draining
            },
            reason: Reason::new("operator").unwrap(),
        },
        4 => Command::Deregister {
            instance_id: instance(i),
            generation: Generation(1),
        },
        5 => Command::RevokeLease {
            node: node(k),
            epoch: AgentEpoch(1),
        },
        6 => Command::ExpireLease {
            node: node(k),
            epoch: AgentEpoch(1),
            silent_in_zone: 1,
        },
        _ => Command::Purge,
    }
}

/// A fixed story: leases, registrations, a stale call (rejected), changes.
fn story() -> Vec<Envelope> {
    [
        (0, 0, 0),
        (0, 1, 0),
        (1, 0, 0),
        (1, 1, 1),
        (2, 0, 2),
        (3, 1, 0),
        (3, 0, 1),
        (4, 0, 2),
        (6, 1, 0),
        (7, 0, 0),
    ]
    .into_iter()
    .enumerate()
    .map(|(n, (pick, a, b))| env(1_000 + 500 * n as u64, command(pick, a, b)))
    .collect()
}

/// The story as log entries from index 1, with openraft's own entries (a
/// leader's blank, a membership change) between the commands.
fn entries(envelopes: &[Envelope]) -> Vec<Entry> {
    let mut out = vec![blank(1), membership(2, &[1, 2, 3])];
    for (n, e) in envelopes.iter().enumerate() {
        out.push(normal(out.len() as u64 + 1, e.clone()));
        if n == 3 {
            out.push(blank(out.len() as u64 + 1));
        }
    }
    out
}

fn exported(catalog: &AppliedCatalog) -> Vec<u8> {
    catalog.read(|c| encode_catalog_snapshot(&c.export()))
}

#[tokio::test]
async fn a_batch_entry_applies_its_envelopes_in_order_with_one_result_each() {
    let dir = tempfile::tempdir().unwrap();
    let (_log, mut sm) = open(dir.path(), params(), 1).unwrap();
    let applied = sm.catalog();
    let envelopes = story();
    let batch = Entry {
        log_id: log_id(1, 1),
        payload: EntryPayload::Normal(Proposal {
            envelopes: envelopes.clone(),
        }),
    };
    let outcomes = sm.apply([wire(&batch)]).await.unwrap();

    let mut direct = Catalog::new(params());
    let expected: Vec<_> = envelopes.iter().map(|e| direct.apply(e)).collect();
    assert_eq!(outcomes.len(), 1);
    assert_eq!(outcomes[0].results, expected);
    assert_eq!(outcomes[0].revision, direct.revision());
    assert_eq!(
        exported(&applied),
        encode_catalog_snapshot(&direct.export())
    );
}

#[tokio::test]
async fn normal_entries_apply_as_the_catalog_applies_their_envelopes() {
    let dir = tempfile::tempdir().unwrap();
    let (_log, mut sm) = open(dir.path(), params(), 1).unwrap();
    let applied = sm.catalog();
    let mut marks = applied.watch();
    let envelopes = story();
    let entries = entries(&envelopes);
    let last = entries.last().unwrap().log_id;

    let outcomes = sm.apply(entries.clone()).await.unwrap();

    let mut direct = Catalog::new(params());
    let mut results = envelopes.iter().map(|e| direct.apply(e));
    assert_eq!(outcomes.len(), entries.len());
    for (entry, outcome) in entries.iter().zip(&outcomes) {
        match entry.payload {
            EntryPayload::Normal(_) => {
                assert_eq!(outcome.results, vec![results.next().unwrap()]);
            }
            _ => assert!(outcome.results.is_empty()),
        }
    }
    assert!(
        outcomes
            .iter()
            .any(|o| matches!(o.results.first(), Some(Err(_)))),
        "the story has a rejected command"
    );
    assert!(direct.revision().0 >= 5, "the story commits changes");
    assert_eq!(outcomes.last().unwrap().revision, direct.revision());
    assert_eq!(
        exported(&applied),
        encode_catalog_snapshot(&direct.export())
    );
    assert!(marks.has_changed().unwrap());
    assert_eq!(
        *marks.borrow_and_update(),
        AppliedMark {
            last_applied: Some(last),
            revision: direct.revision(),
            installs: 0,
        }
    );
    let (last_applied, members) = sm.applied_state().await.unwrap();
    assert_eq!(last_applied, Some(last));
    assert_eq!(members.log_id(), &Some(log_id(1, 2)));
}

#[tokio::test]
async fn a_snapshot_installed_on_a_fresh_replica_reproduces_the_catalog_byte_for_byte() {
    let leader_dir = tempfile::tempdir().unwrap();
    let (_leader_log, mut leader) = open(leader_dir.path(), params(), 1).unwrap();
    leader.apply(entries(&story())).await.unwrap();
    let snapshot = leader
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();

    let follower_dir = tempfile::tempdir().unwrap();
    let (_follower_log, mut follower) = open(follower_dir.path(), params(), 1).unwrap();
    let applied = follower.catalog();
    let mut received = follower.begin_receiving_snapshot().await.unwrap();
    *received = *snapshot.snapshot;
    follower
        .install_snapshot(&snapshot.meta, received)
        .await
        .unwrap();

    assert_eq!(exported(&applied), exported(&leader.catalog()));
    assert_eq!(
        follower.applied_state().await.unwrap(),
        leader.applied_state().await.unwrap()
    );
    assert_eq!(applied.mark().installs, 1);
    let current = follower.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta, snapshot.meta);
}

#[tokio::test]
async fn a_restarted_replica_keeps_its_log_vote_and_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let envelopes = story();
    let entries = entries(&envelopes);
    let (before, applied_state) = {
        let (mut log, mut sm) = open(dir.path(), params(), 1).unwrap();
        log.save_vote(&openraft::Vote::new_committed(3, 2))
            .await
            .unwrap();
        log.blocking_append(entries.clone()).await.unwrap();
        log.save_committed(Some(entries.last().unwrap().log_id))
            .await
            .unwrap();
        sm.apply(entries.clone()).await.unwrap();
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        (exported(&sm.catalog()), sm.applied_state().await.unwrap())
    };

    let (mut log, mut sm) = open(dir.path(), params(), 1).unwrap();
    assert_eq!(
        log.read_vote().await.unwrap(),
        Some(openraft::Vote::new_committed(3, 2))
    );
    assert_eq!(log.try_get_log_entries(..).await.unwrap(), entries);
    assert_eq!(
        log.read_committed().await.unwrap(),
        Some(entries.last().unwrap().log_id)
    );
    assert_eq!(sm.applied_state().await.unwrap(), applied_state);
    assert_eq!(exported(&sm.catalog()), before);
}

#[tokio::test]
async fn a_corrupt_log_entry_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut log, _sm) = open(dir.path(), params(), 1).unwrap();
        log.blocking_append(entries(&story())).await.unwrap();
    }
    {
        let db = redb::Database::create(dir.path().join(RAFT_DB_FILE)).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(db::LOG)
            .unwrap()
            .insert(3, [RAFT_VALUE_FORMAT, 0xff, 0xff].as_slice())
            .unwrap();
        txn.open_table(db::LOG)
            .unwrap()
            .insert(40, entry_bytes(&blank(41)).as_slice())
            .unwrap();
        txn.commit().unwrap();
    }
    let (mut log, _sm) = open(dir.path(), params(), 1).unwrap();
    let err = log.try_get_log_entries(1..5).await.unwrap_err();
    assert!(
        err.to_string().contains("raft_log entry 3 is corrupt"),
        "{err}"
    );
    let err = log.get_log_state().await.unwrap_err();
    assert!(err.to_string().contains("it holds entry"), "{err}");
    assert_eq!(log.try_get_log_entries(1..3).await.unwrap().len(), 2);
}

fn entry_bytes(entry: &Entry) -> Vec<u8> {
    postcard::to_extend(entry, vec![RAFT_VALUE_FORMAT]).unwrap()
}

#[tokio::test]
async fn a_snapshot_of_another_region_is_refused_and_changes_nothing() {
    let leader_dir = tempfile::tempdir().unwrap();
    let (_leader_log, mut leader) = open(leader_dir.path(), params(), 1).unwrap();
    leader.apply(entries(&story())).await.unwrap();
    let snapshot = leader
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();

    let other_dir = tempfile::tempdir().unwrap();
    let other = CatalogParams::with_region(Label::new("r2").unwrap());
    let (_other_log, mut replica) = open(other_dir.path(), other.clone(), 1).unwrap();
    let err = replica
        .install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("region r1"), "{err}");
    assert_eq!(replica.applied_state().await.unwrap().0, None);
    assert!(replica.get_current_snapshot().await.unwrap().is_none());
    assert_eq!(
        exported(&replica.catalog()),
        encode_catalog_snapshot(&Catalog::new(other).export())
    );
}

/// Applies `envelopes` through a state machine in two batches and directly
/// to a catalog, then moves the replica's snapshot to a fresh replica: all
/// three catalogs must encode identically.
async fn replicate(envelopes: &[Envelope]) {
    let leader_dir = tempfile::tempdir().unwrap();
    let (_leader_log, mut leader) = open(leader_dir.path(), params(), 1).unwrap();
    let mut entries = entries(envelopes);
    let second = entries.split_off(entries.len() / 2);
    leader.apply(entries).await.unwrap();
    leader.apply(second).await.unwrap();

    let mut direct = Catalog::new(params());
    for e in envelopes {
        let _ = direct.apply(e);
    }
    let expected = encode_catalog_snapshot(&direct.export());
    assert_eq!(exported(&leader.catalog()), expected);

    let snapshot = leader
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let follower_dir = tempfile::tempdir().unwrap();
    let (_follower_log, mut follower) = open(follower_dir.path(), params(), 1).unwrap();
    follower
        .install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await
        .unwrap();
    assert_eq!(exported(&follower.catalog()), expected);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn any_command_sequence_replicates_and_snapshots_identically(
        picks in prop::collection::vec((any::<u8>(), any::<u8>(), any::<u8>()), 1..48)
    ) {
        let envelopes: Vec<Envelope> = picks
            .into_iter()
            .enumerate()
            .map(|(n, (pick, a, b))| env(1_000 + 700 * n as u64, command(pick, a, b)))
            .collect();
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(replicate(&envelopes));
    }
}

/// An in-process network for whole-cluster tests: each RPC goes through
/// postcard, as it would on the wire, to the target's `Raft` handle.
#[derive(Clone, Default)]
struct Router {
    nodes: std::sync::Arc<std::sync::Mutex<BTreeMap<ReplicaId, CatalogRaftNode>>>,
}

struct Link {
    target: ReplicaId,
    router: Router,
}

type RpcError<E = openraft::error::Infallible> = openraft::error::RPCError<
    ReplicaId,
    openraft::BasicNode,
    openraft::error::RaftError<ReplicaId, E>,
>;

impl Link {
    fn target(&self) -> Result<CatalogRaftNode, openraft::error::Unreachable> {
        let nodes = self.router.nodes.lock().unwrap();
        nodes.get(&self.target).cloned().ok_or_else(|| {
            openraft::error::Unreachable::new(&std::io::Error::other("replica is down"))
        })
    }
}

/// The value as a peer decodes it.
fn wire<T: serde::Serialize + serde::de::DeserializeOwned>(value: &T) -> T {
    postcard::from_bytes(&postcard::to_allocvec(value).unwrap()).unwrap()
}

impl openraft::RaftNetworkFactory<CatalogRaft> for Router {
    type Network = Link;

    async fn new_client(&mut self, target: ReplicaId, _node: &openraft::BasicNode) -> Link {
        Link {
            target,
            router: self.clone(),
        }
    }
}

impl openraft::RaftNetwork<CatalogRaft> for Link {
    async fn append_entries(
        &mut self,
        rpc: openraft::raft::AppendEntriesRequest<CatalogRaft>,
        _option: openraft::network::RPCOption,
    ) -> Result<openraft::raft::AppendEntriesResponse<ReplicaId>, RpcError> {
        let raft = self.target()?;
        let answer = raft.append_entries(wire(&rpc)).await;
        answer.map_err(|e| openraft::error::RemoteError::new(self.target, e).into())
    }

    async fn install_snapshot(
        &mut self,
        rpc: openraft::raft::InstallSnapshotRequest<CatalogRaft>,
        _option: openraft::network::RPCOption,
    ) -> Result<
        openraft::raft::InstallSnapshotResponse<ReplicaId>,
        RpcError<openraft::error::InstallSnapshotError>,
    > {
        let raft = self.target()?;
        let answer = raft.install_snapshot(wire(&rpc)).await;
        answer.map_err(|e| openraft::error::RemoteError::new(self.target, e).into())
    }

    async fn vote(
        &mut self,
        rpc: openraft::raft::VoteRequest<ReplicaId>,
        _option: openraft::network::RPCOption,
    ) -> Result<openraft::raft::VoteResponse<ReplicaId>, RpcError> {
        let raft = self.target()?;
        let answer = raft.vote(wire(&rpc)).await;
        answer.map_err(|e| openraft::error::RemoteError::new(self.target, e).into())
    }
}

/// Generous: these waits bound a hang, they are not timing claims.
const PATIENCE: Option<std::time::Duration> = Some(std::time::Duration::from_secs(30));

async fn start(
    id: ReplicaId,
    router: &Router,
    config: &std::sync::Arc<openraft::Config>,
) -> (TempDir, CatalogRaftNode, AppliedCatalog) {
    let dir = tempfile::tempdir().unwrap();
    let (log, sm) = open(dir.path(), params(), 1).unwrap();
    let applied = sm.catalog();
    let raft = openraft::Raft::new(id, config.clone(), router.clone(), log, sm)
        .await
        .unwrap();
    router.nodes.lock().unwrap().insert(id, raft.clone());
    (dir, raft, applied)
}

fn replica(id: ReplicaId) -> openraft::BasicNode {
    openraft::BasicNode::new(format!("arbiter-{id}:7400"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_replicates_writes_and_a_new_replica_catches_up_from_a_snapshot() {
    let config = std::sync::Arc::new(
        openraft::Config {
            heartbeat_interval: 100,
            election_timeout_min: 300,
            election_timeout_max: 600,
            max_in_snapshot_log_to_keep: 0,
            purge_batch_size: 1,
            ..Default::default()
        }
        .validate()
        .unwrap(),
    );
    let router = Router::default();
    let (_d1, leader, applied1) = start(1, &router, &config).await;
    let (_d2, follower, applied2) = start(2, &router, &config).await;
    leader
        .initialize(BTreeMap::from([(1, replica(1)), (2, replica(2))]))
        .await
        .unwrap();
    leader
        .wait(PATIENCE)
        .current_leader(1, "replica 1 leads")
        .await
        .unwrap();

    let mut direct = Catalog::new(params());
    let mut last = None;
    for envelope in story() {
        let expected = direct.apply(&envelope);
        let written = leader.client_write(Proposal::one(envelope)).await.unwrap();
        assert_eq!(written.data.results, vec![expected]);
        assert_eq!(written.data.revision, direct.revision());
        last = Some(written.log_id.index);
    }

    // Compact the leader's log so the next replica can only catch up from
    // the snapshot.
    leader.trigger().snapshot().await.unwrap();
    leader
        .wait(PATIENCE)
        .metrics(|m| m.snapshot.map(|s| s.index) >= last, "snapshot built")
        .await
        .unwrap();
    leader.trigger().purge_log(last.unwrap()).await.unwrap();
    leader
        .wait(PATIENCE)
        .metrics(|m| m.purged.map(|p| p.index) >= last, "log purged")
        .await
        .unwrap();

    let (_d3, joiner, applied3) = start(3, &router, &config).await;
    leader.add_learner(3, replica(3), true).await.unwrap();
    for raft in [&follower, &joiner] {
        raft.wait(PATIENCE)
            .applied_index_at_least(last, "caught up")
            .await
            .unwrap();
    }

    let expected = encode_catalog_snapshot(&direct.export());
    for applied in [&applied1, &applied2, &applied3] {
        assert_eq!(exported(applied), expected);
    }
    assert_eq!(
        applied3.mark().installs,
        1,
        "replica 3 started from the snapshot"
    );
    assert_eq!(applied2.mark().installs, 0, "replica 2 followed the log");

    for raft in [leader, follower, joiner] {
        raft.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn the_shard_count_is_fixed_when_the_store_is_made() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut log, _sm) = open(dir.path(), params(), 3).unwrap();
        log.blocking_append(entries(&story())).await.unwrap();
    }
    // Another count is refused, naming both and what to do.
    let err = open(dir.path(), params(), 6).unwrap_err().to_string();
    assert!(err.contains("made for a catalog of 3 shard(s)"), "{err}");
    assert!(err.contains("arbiter.catalog.shards is 6"), "{err}");
    assert!(open(dir.path(), params(), 3).is_ok());
    // Each other shard's group lives in a file of its own, beside shard 0's.
    let shard2 = CatalogParams {
        shard: crate::ids::ShardId(2),
        ..params()
    };
    let (_log2, _sm2) = open(dir.path(), shard2, 3).unwrap();
    assert!(dir.path().join(shard_file(2)).exists());
    assert_eq!(shard_file(0), RAFT_DB_FILE);
}

#[tokio::test]
async fn a_store_made_before_shards_counts_as_one_shard() {
    let dir = tempfile::tempdir().unwrap();
    {
        // Written as a store of one group was before shard counts existed:
        // history, and no count recorded.
        let db = db::RaftDb::open(dir.path(), RAFT_DB_FILE).unwrap();
        let writer = writer::Writer::start(db.clone()).unwrap();
        let mut log = LogStore::new(db, writer);
        log.blocking_append(entries(&story())).await.unwrap();
    }
    let err = open(dir.path(), params(), 2).unwrap_err().to_string();
    assert!(err.contains("made for a catalog of 1 shard(s)"), "{err}");
    assert!(open(dir.path(), params(), 1).is_ok());
}
