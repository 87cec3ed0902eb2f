//! A deterministic simulated zone: real [`Membership`] state machines over
//! a simulated network, driven by a virtual clock and one seeded RNG, so a
//! failing seed replays exactly (the FoundationDB / TigerBeetle approach).
//!
//! Faults: per-packet latency and loss, partitions, pauses (a stopped
//! process: nothing runs, its socket buffer holds up to a bound of
//! datagrams, delivered at resume) and kills (gone for good).
//!
//! It must stay a driver: everything SWIM does is the real foca inside
//! [`Membership`]; this module only moves bytes and fires timers.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::net::SocketAddr;

use foca::Timer;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rollcall_config::{GossipPreset, SwimSettings};
use rollcall_leases::{AgentEpoch, NodeId};

use crate::identity::MemberId;
use crate::membership::{DropReason, Membership, MembershipEvent, Output};
use crate::seal::{Sealer, ZoneKey};

/// How a simulated zone behaves.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// SWIM settings of every member.
    pub settings: SwimSettings,
    /// Seed of everything random: latencies, losses, every member's foca.
    pub seed: u64,
    /// One-way latency of each datagram, drawn uniformly, in µs.
    pub latency_us: (u64, u64),
    /// Probability that a datagram is lost.
    pub loss: f64,
    /// Datagrams a paused member's socket buffer holds; more are dropped.
    pub pause_buffer: usize,
    /// How many members (the first ones) every member announces to when
    /// joining.
    pub seeds: usize,
    /// The foca 2.0.0 stale-TurnUndead workaround; off only in its
    /// regression test.
    pub stale_undead_fix: bool,
    /// Start every member already knowing the whole zone (as an agent
    /// restarting on a zone that has run for a while would after its first
    /// feed), with its probe cycle starting at a random point of the first
    /// probe period, instead of joining through the seeds. The fleet
    /// simulator uses it: a cold join of 1,666 members at once is a storm
    /// no real zone sees.
    pub warm_start: bool,
}

impl SimConfig {
    /// The `lan` preset on a LAN: 0.2–1 ms latency, no loss.
    pub fn lan(seed: u64) -> Self {
        SimConfig {
            settings: GossipPreset::Lan.settings(),
            seed,
            latency_us: (200, 1_000),
            loss: 0.0,
            pause_buffer: 1_024,
            seeds: 3,
            stale_undead_fix: true,
            warm_start: false,
        }
    }
}

/// One membership event, with when and where it was seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// Virtual time, in µs since the start.
    pub at_us: u64,
    /// Index of the member that saw it.
    pub observer: usize,
    /// What it saw.
    pub event: MembershipEvent,
}

/// Whether a simulated member runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Processing packets and timers.
    Running,
    /// Stopped until the given virtual time (µs); holds what arrives.
    Paused {
        /// When it resumes, in µs.
        until_us: u64,
    },
    /// Gone for good.
    Killed,
}

enum Action {
    Deliver { from: SocketAddr, bytes: Vec<u8> },
    Timer(Timer<MemberId>),
    Join,
    Preload,
    Resume,
}

struct Scheduled {
    due_us: u64,
    member: usize,
    action: Action,
}

/// The queue's key: the action itself waits in a slot of `Sim::slots`, so
/// the heap moves 24 bytes instead of whole actions.
#[derive(PartialEq, Eq)]
struct Key {
    due_us: u64,
    seq: u64,
    slot: usize,
}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Key {
    /// Reversed, so the `BinaryHeap` pops the earliest (then first
    /// scheduled) action.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.due_us, other.seq).cmp(&(self.due_us, self.seq))
    }
}

struct Node {
    membership: Membership,
    addr: SocketAddr,
    status: Status,
    group: u32,
    held: Vec<Scheduled>,
    held_packets: usize,
}

/// Counters of what the simulated network did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Datagrams handed to the network.
    pub sent: u64,
    /// Datagrams lost at random.
    pub lost: u64,
    /// Datagrams dropped by a partition.
    pub partitioned: u64,
    /// Datagrams dropped because a paused member's buffer was full.
    pub overflowed: u64,
    /// Datagrams to killed members.
    pub to_dead: u64,
    /// Datagrams a member refused.
    pub refused: u64,
    /// Bytes of the datagrams handed to the network.
    pub bytes: u64,
}

/// A simulated zone of members; see the module comment.
pub struct Sim {
    config: SimConfig,
    now_us: u64,
    rng: StdRng,
    seq: u64,
    queue: BinaryHeap<Key>,
    slots: Vec<Option<Scheduled>>,
    free: Vec<usize>,
    nodes: Vec<Node>,
    by_addr: HashMap<SocketAddr, usize>,
    events: Vec<Recorded>,
    stats: NetStats,
}

/// The zone key every simulated member holds.
pub fn sim_key() -> ZoneKey {
    ZoneKey::new(1, [0x5a; 32])
}

/// The gossip address of simulated member `index`.
pub fn sim_addr(index: usize) -> SocketAddr {
    let [_, _, hi, lo] = (index as u32).to_be_bytes();
    SocketAddr::from(([10, 1, hi, lo], 7946))
}

impl Sim {
    /// `members` members, member `i` joining at `i` ms by announcing to the
    /// first `config.seeds` members.
    pub fn new(members: usize, config: SimConfig) -> Self {
        let names = (0..members)
            .map(|index| NodeId::new(&format!("node-{index}")).expect("valid node id"))
            .collect();
        Self::with_names(names, config)
    }

    /// Like [`Sim::new`] with one member per node id given (member `i`
    /// is `names[i]`), so several zones can share one namespace of nodes.
    pub fn with_names(names: Vec<NodeId>, config: SimConfig) -> Self {
        let members = names.len();
        let mut nodes = Vec::with_capacity(members);
        let mut by_addr = HashMap::with_capacity(members);
        for (index, node) in names.into_iter().enumerate() {
            let addr = sim_addr(index);
            let id = MemberId::new(node, addr, AgentEpoch(1));
            let member_seed = config.seed ^ (index as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let sealer = Sealer::new(sim_key(), None, member_seed.rotate_left(17));
            let mut membership = Membership::new(id, &config.settings, sealer, member_seed);
            if !config.stale_undead_fix {
                membership.disable_stale_undead_fix();
            }
            by_addr.insert(addr, index);
            nodes.push(Node {
                membership,
                addr,
                status: Status::Running,
                group: 0,
                held: Vec::new(),
                held_packets: 0,
            });
        }
        let mut sim = Sim {
            rng: StdRng::seed_from_u64(config.seed),
            config,
            now_us: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            nodes,
            by_addr,
            events: Vec::new(),
            stats: NetStats::default(),
        };
        if sim.config.warm_start {
            let period_us = sim.config.settings.probe_period_ms.max(1) * 1_000;
            for index in 0..members {
                let offset = sim.rng.random_range(0..period_us);
                sim.schedule(offset, index, Action::Preload);
            }
        } else {
            for index in 0..members {
                sim.schedule(index as u64 * 1_000, index, Action::Join);
            }
        }
        sim
    }

    /// When the next action is due, in µs; `None` when nothing is queued.
    pub fn next_due_us(&self) -> Option<u64> {
        self.queue.peek().map(|key| key.due_us)
    }

    /// Runs every action due up to `us` (virtual), then sets the clock
    /// there.
    pub fn run_until_us(&mut self, end_us: u64) {
        while self.queue.peek().is_some_and(|next| next.due_us <= end_us) {
            let Some(key) = self.queue.pop() else { break };
            let next = self.slots[key.slot]
                .take()
                .expect("a queued slot holds its action");
            self.free.push(key.slot);
            self.now_us = next.due_us;
            self.dispatch(next);
        }
        self.now_us = self.now_us.max(end_us);
    }

    /// Takes the membership events recorded since the last call (or the
    /// start), in order.
    pub fn take_events(&mut self) -> Vec<Recorded> {
        std::mem::take(&mut self.events)
    }

    /// Virtual time now, in ms.
    pub fn now_ms(&self) -> u64 {
        self.now_us / 1_000
    }

    /// Virtual time now, in µs.
    pub fn now_us(&self) -> u64 {
        self.now_us
    }

    /// Number of members, killed ones included.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True for a zone without members.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Member `index`'s state machine.
    pub fn member(&self, index: usize) -> &Membership {
        &self.nodes[index].membership
    }

    /// Member `index`'s status.
    pub fn status(&self, index: usize) -> Status {
        self.nodes[index].status
    }

    /// Every membership event so far, in order.
    pub fn events(&self) -> &[Recorded] {
        &self.events
    }

    /// What the network did so far.
    pub fn stats(&self) -> NetStats {
        self.stats
    }

    /// Which member a node id belongs to.
    pub fn index_of(&self, id: &MemberId) -> Option<usize> {
        self.by_addr.get(&id.addr).copied()
    }

    /// Runs every action due up to `ms` (virtual), then sets the clock
    /// there.
    pub fn run_until(&mut self, ms: u64) {
        self.run_until_us(ms * 1_000);
    }

    /// Runs for `ms` more virtual milliseconds.
    pub fn run_for(&mut self, ms: u64) {
        self.run_until(self.now_ms() + ms);
    }

    /// Stops member `index` for good: it processes and answers nothing.
    pub fn kill(&mut self, index: usize) {
        let node = &mut self.nodes[index];
        node.status = Status::Killed;
        node.held.clear();
    }

    /// Stops member `index` for `ms` (like SIGSTOP then SIGCONT). Pausing
    /// a paused member extends the pause.
    pub fn pause(&mut self, index: usize, ms: u64) {
        let until_us = self.now_us + ms * 1_000;
        let node = &mut self.nodes[index];
        match node.status {
            Status::Killed => {}
            Status::Paused { until_us: old } if old >= until_us => {}
            _ => {
                node.status = Status::Paused { until_us };
                self.schedule(ms * 1_000, index, Action::Resume);
            }
        }
    }

    /// Cuts `isolated` off from everyone else: datagrams between the two
    /// sides are dropped until [`Sim::heal`].
    pub fn partition(&mut self, isolated: &[usize]) {
        for &index in isolated {
            self.nodes[index].group = 1;
        }
    }

    /// Removes every partition.
    pub fn heal(&mut self) {
        for node in &mut self.nodes {
            node.group = 0;
        }
    }

    /// Hands member `to` a raw datagram from `from` right now, bypassing the
    /// network, and returns what it made of it. For tests of the seal.
    pub fn inject(&mut self, to: usize, from: SocketAddr, bytes: &[u8]) -> Result<(), DropReason> {
        let result = self.nodes[to].membership.handle_packet(from, bytes);
        self.collect(to);
        result
    }

    /// True when every running or paused member holds exactly the other
    /// non-killed members active.
    pub fn converged(&self) -> bool {
        let live: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].status != Status::Killed)
            .collect();
        live.iter().all(|&i| {
            let seen = self.nodes[i].membership.members().count();
            seen == live.len() - 1
                && self.nodes[i].membership.members().all(|id| {
                    self.index_of(id)
                        .is_some_and(|j| self.nodes[j].status != Status::Killed)
                })
        })
    }

    fn schedule(&mut self, after_us: u64, member: usize, action: Action) {
        self.seq += 1;
        let due_us = self.now_us + after_us;
        let scheduled = Scheduled {
            due_us,
            member,
            action,
        };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot] = Some(scheduled);
                slot
            }
            None => {
                self.slots.push(Some(scheduled));
                self.slots.len() - 1
            }
        };
        self.queue.push(Key {
            due_us,
            seq: self.seq,
            slot,
        });
    }

    fn dispatch(&mut self, scheduled: Scheduled) {
        let index = scheduled.member;
        match (self.nodes[index].status, &scheduled.action) {
            (Status::Killed, Action::Deliver { .. }) => {
                self.stats.to_dead += 1;
                return;
            }
            (Status::Killed, _) => return,
            (Status::Paused { .. }, Action::Resume) => {}
            (Status::Paused { until_us }, _) => {
                let is_packet = matches!(scheduled.action, Action::Deliver { .. });
                let node = &mut self.nodes[index];
                if is_packet && node.held_packets >= self.config.pause_buffer {
                    self.stats.overflowed += 1;
                } else {
                    node.held_packets += usize::from(is_packet);
                    node.held.push(scheduled);
                }
                debug_assert!(until_us >= self.now_us);
                return;
            }
            (Status::Running, _) => {}
        }
        let node = &mut self.nodes[index];
        match scheduled.action {
            Action::Deliver { from, bytes } => {
                let from_group = self.by_addr.get(&from).map(|&i| self.nodes[i].group);
                if from_group != Some(self.nodes[index].group) {
                    self.stats.partitioned += 1;
                    return;
                }
                if self.nodes[index]
                    .membership
                    .handle_packet(from, &bytes)
                    .is_err()
                {
                    self.stats.refused += 1;
                }
            }
            Action::Timer(timer) => node.membership.handle_timer(timer),
            Action::Preload => {
                let zone: Vec<MemberId> = self
                    .nodes
                    .iter()
                    .enumerate()
                    .filter(|(other, _)| *other != index)
                    .map(|(_, other)| other.membership.id().clone())
                    .collect();
                self.nodes[index].membership.preload(zone);
            }
            Action::Join => {
                let seeds: Vec<SocketAddr> = (0..self.config.seeds.min(self.nodes.len()))
                    .map(sim_addr)
                    .collect();
                self.nodes[index].membership.join(&seeds);
            }
            Action::Resume => {
                if let Status::Paused { until_us } = node.status {
                    if until_us > self.now_us {
                        // An extended pause; its own Resume comes later.
                        return;
                    }
                }
                node.status = Status::Running;
                node.held_packets = 0;
                let held = std::mem::take(&mut node.held);
                for action in held {
                    self.schedule(0, index, action.action);
                }
            }
        }
        self.collect(index);
    }

    fn collect(&mut self, index: usize) {
        for output in self.nodes[index].membership.drain_outputs() {
            match output {
                Output::Send { to, bytes } => self.send(index, to, bytes),
                Output::Timer { after, timer } => {
                    let after_us = u64::try_from(after.as_micros()).unwrap_or(u64::MAX / 2);
                    self.schedule(after_us, index, Action::Timer(timer));
                }
                Output::Event(event) => self.events.push(Recorded {
                    at_us: self.now_us,
                    observer: index,
                    event,
                }),
            }
        }
    }

    fn send(&mut self, from: usize, to: SocketAddr, bytes: Vec<u8>) {
        self.stats.sent += 1;
        self.stats.bytes += bytes.len() as u64;
        let Some(&target) = self.by_addr.get(&to) else {
            self.stats.to_dead += 1;
            return;
        };
        if self.config.loss > 0.0 && self.rng.random_bool(self.config.loss) {
            self.stats.lost += 1;
            return;
        }
        let (low, high) = self.config.latency_us;
        let latency = self.rng.random_range(low..=high.max(low));
        let from = self.nodes[from].addr;
        self.schedule(latency, target, Action::Deliver { from, bytes });
    }
}
