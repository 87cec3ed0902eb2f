//! The simulated Raft group around the replicas' machines: what openraft
//! and the replicas' peer connections do between them, modelled the way
//! the rest of the simulator models the network and fsync. Each replica is
//! the shipped machine ([`rollcall_leases::replica::ReplicaState`]) over a
//! catalog of its own; this file only decides what openraft would say.
//!
//! Modelled here:
//! - the log: a batch the leader proposes commits `commit_latency_ms`
//!   later while a quorum of replicas runs (in order; a batch still
//!   uncommitted after `raft.write_timeout_ms` is answered `TimedOut`, and
//!   commits later if the quorum returns, as openraft's would). The leader
//!   applies it at once, each follower one peer latency later, a stopped
//!   replica when it starts again (it catches up from the log);
//! - elections: a leader that dies is replaced after an election timeout
//!   drawn in [`raft.election_min_ms`, `raft.election_max_ms`) plus a
//!   vote round trip, by a running replica chosen at random, when a quorum
//!   runs; until then its followers still name it. Its uncommitted batches
//!   are lost with it;
//! - quorum contact: while fewer than a majority run, the leader's view
//!   says how long ago its quorum last answered (`quorum_ack_ms_ago`);
//! - peer calls between the replicas (`peers`);
//! - a replica's death: `silent` (the host is gone: its agents notice when
//!   a message they send gets nothing back within `agent.arbiter_silence_ms`,
//!   a connect to it fails at the agent's connect timeout) or, for the whole group's outage, refusing (every session
//!   closed, every connect refused).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use rand::RngExt;
use rollcall_leases::distribution::DistParams;
use rollcall_leases::raft::AppliedMark;
use rollcall_leases::replica::{BatchId, BatchOutcome, Input, RaftView, ReplicaState, ReplyId};
use rollcall_leases::{Applied, Catalog, Envelope, Rejection};

use super::peers::{Call, Sums};
use super::world::*;

/// The machine's counts as last added to the sim's.
#[derive(Default)]
pub(super) struct Seen {
    pub(super) renewals: u64,
    pub(super) down_reports_ignored: u64,
}

/// One replica: its machine, its catalog as applied, its connections and
/// its one CPU core.
pub(super) struct Arbiter {
    pub(super) up: bool,
    /// Down with its host: nothing answers (not refused).
    pub(super) silent: bool,
    /// Runs of this replica: what an earlier run asked is not answered.
    pub(super) run: u64,
    /// The catalog as applied here (the Raft state machine).
    pub(super) catalog: Catalog,
    /// The log index applied here.
    pub(super) applied: u64,
    /// The replica's machine: every decision the arbiter makes.
    pub(super) machine: ReplicaState,
    /// What the machine draws from (seeded from the scenario's seed).
    pub(super) rng: rand::rngs::StdRng,
    /// Its counts as last added to the sim's.
    pub(super) seen: Seen,
    /// What the Raft view last given to the machine said (`view_key`).
    pub(super) view: Option<ViewKey>,
    /// The wake-up asked for, ms.
    pub(super) wake_at: Option<u64>,
    /// Each agent request's agent and its number there, by the reply id
    /// the machine answers.
    pub(super) replies: BTreeMap<ReplyId, (u32, u64)>,
    /// Each peer call's number, by the reply id the machine answers.
    pub(super) peer_replies: BTreeMap<ReplyId, u64>,
    pub(super) next_reply: ReplyId,
    pub(super) dist_params: DistParams,
    /// Each connection's agent.
    pub(super) conns: BTreeMap<u64, u32>,
    pub(super) max_snapshots_seen: usize,
    /// When the replica's one core is free again (`[arbiter]` CPU costs).
    pub(super) cpu_until: Time,
    /// CPU charged so far, µs.
    pub(super) cpu_busy_us: u64,
    /// The longest a send waited for the core, µs.
    pub(super) cpu_max_wait_us: u64,
}

/// What a replica's Raft view says: term, whether it leads, the leader
/// it names, its quorum contact age (ms). A view is given to the machine
/// when this changes.
pub(super) type ViewKey = (u64, bool, Option<usize>, Option<u64>);

/// openraft's side of the group.
#[derive(Default)]
pub(super) struct Group {
    /// The leader in office; `None` from its death to the next election.
    pub(super) leader: Option<usize>,
    /// The leader its followers name (the dead one until an election).
    pub(super) known_leader: Option<usize>,
    pub(super) term: u64,
    /// Leader changes: a commit scheduled under an earlier leader is
    /// dropped.
    pub(super) generation: u64,
    /// Proposed and not committed: (log index, proposer, batch, commands).
    pub(super) pending: VecDeque<(u64, usize, BatchId, Vec<Envelope>)>,
    /// Committed and not yet applied by every replica, by log index.
    pub(super) log: VecDeque<(u64, Arc<Vec<Envelope>>)>,
    pub(super) last_index: u64,
    pub(super) committed_index: u64,
    /// Since when fewer than a majority run.
    pub(super) quorum_lost_at: Option<Time>,
    pub(super) election_due: bool,
    pub(super) calls: BTreeMap<u64, Call>,
    pub(super) sums: BTreeMap<u64, Sums>,
    pub(super) next_call: u64,
}

impl World {
    /// Replica `r`'s QUIC address, as the agents and its peers dial it.
    pub(super) fn replica_address(&self, r: usize) -> String {
        if self.arbs.len() == 1 {
            super::arbiter::ADDRESS.to_owned()
        } else {
            format!("sim-arbiter-{}:7000", r + 1)
        }
    }

    /// The replica at `address`.
    pub(super) fn replica_at(&self, address: &str) -> Option<usize> {
        (0..self.arbs.len()).find(|&r| self.replica_address(r) == address)
    }

    /// The catalog measurements read: the leader's, else the most
    /// advanced running replica's.
    pub(super) fn catalog(&self) -> &Catalog {
        let r = self.group.leader.unwrap_or_else(|| {
            (0..self.arbs.len())
                .max_by_key(|&r| (self.arbs[r].up, self.arbs[r].applied))
                .unwrap_or(0)
        });
        &self.arbs[r].catalog
    }

    fn quorum(&self) -> bool {
        let up = self.arbs.iter().filter(|a| a.up).count();
        up * 2 > self.arbs.len()
    }

    /// What openraft's view of the group from replica `r` says.
    pub(super) fn view_key(&self, r: usize) -> ViewKey {
        let leads = self.group.leader == Some(r);
        let leader = if leads {
            Some(r)
        } else {
            self.group.known_leader.filter(|&l| l != r)
        };
        let quorum_ack_ms_ago = leads.then(|| {
            self.group
                .quorum_lost_at
                .map_or(0, |since| ms(self.now - since))
        });
        (self.group.term, leads, leader, quorum_ack_ms_ago)
    }

    /// openraft's view of the group from replica `r`.
    pub(super) fn raft_view(&self, r: usize) -> RaftView {
        let (term, leads, leader, quorum_ack_ms_ago) = self.view_key(r);
        RaftView {
            term,
            leads,
            leader: leader.map(|l| (l as u64 + 1, self.replica_address(l))),
            others: (0..self.arbs.len())
                .filter(|&o| o != r)
                .map(|o| (o as u64 + 1, self.replica_address(o)))
                .collect(),
            quorum_ack_ms_ago,
        }
    }

    /// A new machine for replica `r` over its catalog as applied,
    /// following no one until it is told otherwise.
    pub(super) fn new_machine(&self, r: usize) -> ReplicaState {
        ReplicaState::new(
            self.arbiter_config.clone(),
            r as u64 + 1,
            &self.arbs[r].catalog,
            self.applied_mark(r),
            self.now_ms(),
        )
    }

    /// Replica `r` is told openraft's view now.
    pub(super) fn tell_view(&mut self, r: usize) {
        if self.arbs[r].up {
            self.arbiter_wake(r, Vec::new());
        }
    }

    /// `leader` takes office: a new term, the others follow it.
    pub(super) fn elect(&mut self, leader: usize) {
        self.group.leader = Some(leader);
        self.group.known_leader = Some(leader);
        self.group.term += 1;
        self.group.generation += 1;
        self.group.pending.clear();
        self.group.election_due = false;
        self.hash(&[0xe1, leader as u64, self.group.term, self.now_ms()]);
        for r in 0..self.arbs.len() {
            self.tell_view(r);
        }
    }

    /// An election, if one is due and a quorum runs: a running replica at
    /// random wins it.
    pub(super) fn election(&mut self) {
        if self.group.leader.is_some() || !self.quorum() {
            return;
        }
        let up: Vec<usize> = (0..self.arbs.len()).filter(|&r| self.arbs[r].up).collect();
        let winner = up[self.rng.random_range(0..up.len())];
        self.elect(winner);
    }

    fn schedule_election(&mut self) {
        if self.group.election_due {
            return;
        }
        self.group.election_due = true;
        let raft = &self.arbiter_config.raft;
        let timeout = self
            .rng
            .random_range(raft.election_min_ms..raft.election_max_ms.max(raft.election_min_ms + 1));
        let vote = 2 * self.arbiter_latency();
        self.after(timeout * 1_000 + vote, Ev::Elect);
    }

    // ----- the log -----

    /// The leader proposed a batch: it commits after the commit latency
    /// while a quorum runs, or is answered `TimedOut` at the write
    /// timeout. A proposal from a replica that does not lead is refused.
    pub(super) fn propose(
        &mut self,
        r: usize,
        batch: BatchId,
        envelopes: Vec<Envelope>,
        inbox: &mut VecDeque<Input>,
    ) {
        if self.group.leader != Some(r) {
            inbox.push_back(Input::Committed {
                batch,
                outcome: BatchOutcome::NotLeader("this replica does not lead".into()),
            });
            return;
        }
        self.group.last_index += 1;
        let index = self.group.last_index;
        self.group.pending.push_back((index, r, batch, envelopes));
        let generation = self.group.generation;
        if self.quorum() {
            self.after(
                self.sc.arbiter.commit_latency_ms * 1_000,
                Ev::Commit { generation },
            );
        }
        let timeout = self.arbiter_config.raft.write_timeout_ms;
        self.after(
            timeout * 1_000,
            Ev::WriteTimeout {
                replica: r,
                run: self.arbs[r].run,
                index,
                batch,
            },
        );
    }

    /// The oldest pending batch commits, if a quorum runs: applied by the
    /// leader now (each command measured), by each follower one peer
    /// latency later.
    pub(super) fn commit(&mut self, generation: u64) {
        if generation != self.group.generation || !self.quorum() {
            return;
        }
        let Some(leader) = self.group.leader else {
            return;
        };
        let Some((index, proposer, batch, envelopes)) = self.group.pending.pop_front() else {
            return;
        };
        self.group.committed_index = index;
        self.group.log.push_back((index, Arc::new(envelopes)));
        let results = self
            .apply_through(leader, index)
            .expect("the leader applies its own entry");
        let envelopes = self.group.log.back().expect("pushed").1.clone();
        for (env, result) in envelopes.iter().zip(&results) {
            if let Ok(applied) = result {
                self.after_commit(env, applied);
            }
        }
        let mark = self.applied_mark(leader);
        let mut inputs = vec![Input::Applied(mark)];
        if proposer == leader {
            inputs.push(Input::Committed {
                batch,
                outcome: BatchOutcome::Applied(results),
            });
        }
        self.arbiter_wake(leader, inputs);
        for r in 0..self.arbs.len() {
            if r == leader || !self.arbs[r].up {
                continue;
            }
            let latency = self.arbiter_latency();
            self.after(latency, Ev::CatchUp { replica: r });
        }
        self.trim_log();
    }

    /// A batch not committed by the write timeout is answered so.
    pub(super) fn write_timeout(&mut self, r: usize, run: u64, index: u64, batch: BatchId) {
        let still = self.group.pending.iter().any(|(i, ..)| *i == index);
        if still && self.arbs[r].up && self.arbs[r].run == run {
            self.counters.batches_timed_out += 1;
            self.arbiter_wake(
                r,
                vec![Input::Committed {
                    batch,
                    outcome: BatchOutcome::TimedOut,
                }],
            );
        }
    }

    /// Replica `r` applies what was committed since it last did, and its
    /// machine hears of it.
    pub(super) fn catch_up(&mut self, r: usize) {
        if !self.arbs[r].up {
            return;
        }
        let through = self.group.committed_index;
        if self.apply_through(r, through).is_some() {
            let mark = self.applied_mark(r);
            self.arbiter_wake(r, vec![Input::Applied(mark)]);
        }
        self.trim_log();
    }

    /// Applies the log up to `index` on replica `r`'s catalog; the last
    /// entry's results, if it applied any.
    fn apply_through(&mut self, r: usize, index: u64) -> Option<Vec<Result<Applied, Rejection>>> {
        let mut last = None;
        let from = self.arbs[r].applied;
        for (i, envelopes) in self.group.log.iter() {
            if *i <= from || *i > index {
                continue;
            }
            let catalog = &mut self.arbs[r].catalog;
            last = Some(envelopes.iter().map(|e| catalog.apply(e)).collect());
            self.arbs[r].applied = *i;
        }
        last
    }

    /// Drops the entries every replica applied (a stopped one catches up
    /// from what is left when it starts).
    fn trim_log(&mut self) {
        let lowest = self.arbs.iter().map(|a| a.applied).min().unwrap_or(0);
        while self.group.log.front().is_some_and(|(i, _)| *i <= lowest) {
            self.group.log.pop_front();
        }
    }

    pub(super) fn applied_mark(&self, r: usize) -> AppliedMark {
        AppliedMark {
            last_applied: None,
            revision: self.arbs[r].catalog.revision(),
            installs: 0,
        }
    }

    // ----- replicas stopping and starting -----

    /// Replica `r` dies with its host: its memory and uncommitted work are
    /// gone, and nothing answers for it. Its agents notice when a message
    /// they send gets nothing back within `agent.arbiter_silence_ms`
    /// (`World::watch_silence`), at the latest at the QUIC idle timeout.
    pub(super) fn kill_replica(&mut self, r: usize) {
        if !self.arbs[r].up {
            return;
        }
        self.hash(&[0xd1, r as u64, self.now_ms()]);
        self.stop_replica(r, true);
        let sessions: Vec<(u64, u32)> = std::mem::take(&mut self.arbs[r].conns)
            .into_iter()
            .collect();
        for (session, a) in sessions {
            self.after(
                IDLE_TIMEOUT_MS * 1_000,
                Ev::SessionLost { agent: a, session },
            );
        }
        if self.group.leader == Some(r) {
            self.group.leader = None;
            self.group.generation += 1;
            self.group.pending.clear();
        }
        if !self.quorum() {
            self.group.quorum_lost_at.get_or_insert(self.now);
        }
        if self.group.leader.is_none() {
            self.schedule_election();
        }
    }

    /// Replica `r`'s process stops: its machine (with its memory) is
    /// dropped and replaced by one that waits for its start.
    pub(super) fn stop_replica(&mut self, r: usize, silent: bool) {
        let arb = &mut self.arbs[r];
        arb.up = false;
        arb.silent = silent;
        arb.run += 1;
        arb.replies.clear();
        arb.peer_replies.clear();
        arb.wake_at = None;
        arb.view = None;
        self.arbs[r].machine = self.new_machine(r);
        self.arbs[r].seen = Default::default();
    }

    /// Replica `r` starts again: it catches up from the log and a new
    /// machine over its catalog follows the leader its peers name (or
    /// wins the election a returning quorum holds).
    pub(super) fn start_replica(&mut self, r: usize) {
        if self.arbs[r].up {
            return;
        }
        self.hash(&[0x5a, r as u64, self.now_ms()]);
        self.apply_through(r, self.group.committed_index);
        self.arbs[r].up = true;
        self.arbs[r].silent = false;
        self.arbs[r].machine = self.new_machine(r);
        if self.group.quorum_lost_at.is_some() && self.quorum() {
            self.group.quorum_lost_at = None;
            // What waited for the quorum commits now, in order.
            let generation = self.group.generation;
            for _ in 0..self.group.pending.len() {
                self.after(
                    self.sc.arbiter.commit_latency_ms * 1_000,
                    Ev::Commit { generation },
                );
            }
            if self.group.leader.is_none() {
                self.schedule_election();
            }
        }
        self.tell_view(r);
        self.trim_log();
    }

    /// The catalog and machine each replica starts with.
    pub(super) fn replicas(
        count: usize,
        catalog: Catalog,
        config: &rollcall_config::ArbiterConfig,
        seed: u64,
    ) -> Vec<Arbiter> {
        use rand::SeedableRng;
        (0..count)
            .map(|r| {
                let mark = AppliedMark {
                    last_applied: None,
                    revision: catalog.revision(),
                    installs: 0,
                };
                Arbiter {
                    up: true,
                    silent: false,
                    run: 0,
                    // Stands in until the world is built.
                    machine: ReplicaState::new(config.clone(), r as u64 + 1, &catalog, mark, 0),
                    catalog: catalog.clone(),
                    applied: 0,
                    // The machines' own draws (a new catalog's identity)
                    // do not shift the network's; one replica draws as
                    // the single arbiter did.
                    rng: rand::rngs::StdRng::seed_from_u64(seed ^ 0xa7b1_7e70 ^ ((r as u64) << 32)),
                    seen: Default::default(),
                    view: None,
                    wake_at: None,
                    replies: BTreeMap::new(),
                    peer_replies: BTreeMap::new(),
                    next_reply: 0,
                    dist_params: DistParams::from(config),
                    conns: BTreeMap::new(),
                    max_snapshots_seen: 0,
                    cpu_until: 0,
                    cpu_busy_us: 0,
                    cpu_max_wait_us: 0,
                }
            })
            .collect()
    }
}
