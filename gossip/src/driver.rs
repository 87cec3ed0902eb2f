//! The gossip driver: owns the UDP socket and the timers of one agent's
//! `Membership`, and hands membership changes to a listener (the agent).
//! Thin: every decision is foca's or the seal's.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rollcall_config::SwimSettings;
use rollcall_leases::{AgentEpoch, NodeId};
use tokio::net::UdpSocket;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::identity::MemberId;
use crate::membership::{Drops, Membership, MembershipEvent, Output};
use crate::seal::{OpenDrops, Sealer, ZoneKey, MAX_PACKET};

/// What the driver tells its owner.
pub trait GossipListener: Send + Sync + 'static {
    /// The zone declared `node` (in agent run `epoch`) down.
    fn down(&self, node: NodeId, epoch: AgentEpoch);
    /// `node` is an active member (again).
    fn up(&self, node: NodeId);
}

/// How to run one member.
pub struct GossipOptions {
    /// This agent's node.
    pub node: NodeId,
    /// This agent run.
    pub epoch: AgentEpoch,
    /// The member's socket, bound.
    pub socket: GossipSocket,
    /// Members to join through.
    pub seeds: Vec<SocketAddr>,
    /// SWIM settings (a preset plus overrides).
    pub settings: SwimSettings,
    /// The zone key packets are sealed with.
    pub key: ZoneKey,
    /// The previous zone key, still accepted during a rotation.
    pub previous_key: Option<ZoneKey>,
}

/// A member's UDP socket, bound and not in use yet: the agent binds it
/// before it starts anything, so an address in use stops it before
/// anything ran.
pub struct GossipSocket {
    socket: UdpSocket,
    /// The bound address (this member's identity address).
    pub local_addr: SocketAddr,
}

impl GossipSocket {
    /// Binds `listen` (port 0: any free port).
    pub async fn bind(listen: SocketAddr) -> std::io::Result<Self> {
        let socket = UdpSocket::bind(listen).await?;
        let local_addr = socket.local_addr()?;
        Ok(GossipSocket { socket, local_addr })
    }
}

/// A running member.
pub struct GossipHandle {
    /// The bound UDP address (this member's identity address).
    pub local_addr: SocketAddr,
    blocked: Arc<AtomicBool>,
    drops: Arc<SharedDrops>,
    task: JoinHandle<()>,
}

/// The member's drop counts, published by its task after every incoming
/// packet for whoever exports them (the agent's metrics).
#[derive(Debug, Default)]
pub struct SharedDrops {
    too_large: AtomicU64,
    too_short: AtomicU64,
    unknown_key: AtomicU64,
    forged: AtomicU64,
    replay: AtomicU64,
    refused: AtomicU64,
}

impl SharedDrops {
    fn publish(&self, drops: Drops) {
        let o = drops.open;
        for (cell, value) in [
            (&self.too_large, o.too_large),
            (&self.too_short, o.too_short),
            (&self.unknown_key, o.unknown_key),
            (&self.forged, o.forged),
            (&self.replay, o.replay),
            (&self.refused, drops.refused),
        ] {
            cell.store(value, Ordering::Relaxed);
        }
    }

    /// The counts so far.
    pub fn get(&self) -> Drops {
        let load = |cell: &AtomicU64| cell.load(Ordering::Relaxed);
        Drops {
            open: OpenDrops {
                too_large: load(&self.too_large),
                too_short: load(&self.too_short),
                unknown_key: load(&self.unknown_key),
                forged: load(&self.forged),
                replay: load(&self.replay),
            },
            refused: load(&self.refused),
        }
    }
}

impl GossipHandle {
    /// Incoming datagrams dropped so far, by reason (oversized, truncated,
    /// sealed with an unknown key, forged, replayed, refused by foca).
    pub fn drops(&self) -> Arc<SharedDrops> {
        self.drops.clone()
    }

    /// Drops every packet in and out while `blocked` (for tests: a node
    /// whose gossip is cut while its arbiter session lives).
    pub fn block(&self, blocked: bool) {
        self.blocked.store(blocked, Ordering::SeqCst);
    }

    /// Stops the member (no leave message: a stop looks like a crash).
    pub async fn shutdown(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// How soon a member that knows nobody asks its seeds again, in ms; the
/// wait doubles with every unanswered attempt up to [`MAX_ALONE_WAIT_MS`]
/// (or the announce interval, if shorter).
/// A join sent before the seed's socket was bound (nodes started together)
/// is lost, and a member left alone gossips with no one: it must not wait a
/// whole announce interval to try again.
const FIRST_REJOIN_MS: u64 = 500;

/// The longest wait between two attempts of a lone member to rejoin, in
/// ms: after a partition heals, the member is back within this. Its cost
/// is one small packet per seed and former member per attempt.
const MAX_ALONE_WAIT_MS: u64 = 4_000;

/// Most addresses of former members a lone member also asks to rejoin.
const MAX_KNOWN: usize = 64;

/// Joins the seeds and runs until shut down.
pub fn start(options: GossipOptions, listener: impl GossipListener) -> GossipHandle {
    let GossipSocket { socket, local_addr } = options.socket;
    let id = MemberId::new(options.node.clone(), local_addr, options.epoch);
    let sealer = Sealer::new(
        options.key.clone(),
        options.previous_key.clone(),
        rand::random(),
    );
    let mut membership = Membership::new(id, &options.settings, sealer, rand::random());
    membership.join(&options.seeds);
    let blocked = Arc::new(AtomicBool::new(false));
    let drops = Arc::new(SharedDrops::default());
    let rejoin = Duration::from_millis(options.settings.announce_ms.max(FIRST_REJOIN_MS));
    let task = tokio::spawn(run(
        socket,
        membership,
        options.seeds,
        rejoin,
        (blocked.clone(), drops.clone()),
        listener,
    ));
    GossipHandle {
        local_addr,
        blocked,
        drops,
        task,
    }
}

/// A timer due at an instant; ordered by due time, then arrival.
struct Due(Instant, u64, foca::Timer<MemberId>);

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        (self.0, self.1) == (other.0, other.1)
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Due {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.0, self.1).cmp(&(other.0, other.1))
    }
}

async fn run(
    socket: UdpSocket,
    mut membership: Membership,
    seeds: Vec<SocketAddr>,
    rejoin: Duration,
    (blocked, drops): (Arc<AtomicBool>, Arc<SharedDrops>),
    listener: impl GossipListener,
) {
    let mut timers: BinaryHeap<Reverse<Due>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut buf = vec![0u8; MAX_PACKET + 1];
    let first_rejoin = Duration::from_millis(FIRST_REJOIN_MS);
    let mut alone_wait = first_rejoin;
    let mut next_rejoin = Instant::now() + alone_wait;
    // Addresses of members seen alive: a member left alone asks them too,
    // not only its seeds. Otherwise a seed cut off from its zone (its only
    // seed is itself) would never find the zone again after the partition
    // heals, since the others hold it down and do not call it.
    let mut known: Vec<SocketAddr> = Vec::new();
    loop {
        for output in membership.drain_outputs() {
            match output {
                Output::Send { to, bytes } => {
                    if !blocked.load(Ordering::SeqCst) {
                        let _ = socket.send_to(&bytes, to).await;
                    }
                }
                Output::Timer { after, timer } => {
                    seq += 1;
                    timers.push(Reverse(Due(Instant::now() + after, seq, timer)));
                }
                Output::Event(MembershipEvent::Idle) => {
                    // Alone: foca's periodic announce has stopped, so the
                    // driver joins the seeds again at the next rejoin tick.
                    tracing::info!("gossip: every known member is down; rejoining the seeds");
                    alone_wait = first_rejoin;
                    next_rejoin = Instant::now();
                }
                Output::Event(event) => {
                    let seen = match &event {
                        MembershipEvent::Up(member) => Some(member.addr),
                        MembershipEvent::Renamed { new, .. } => Some(new.addr),
                        _ => None,
                    };
                    if let Some(addr) = seen.filter(|a| !known.contains(a)) {
                        if known.len() == MAX_KNOWN {
                            known.remove(0);
                        }
                        known.push(addr);
                    }
                    deliver(&listener, event)
                }
            }
        }
        let next_timer = timers.peek().map(|Reverse(d)| d.0).unwrap_or(next_rejoin);
        tokio::select! {
            received = socket.recv_from(&mut buf) => {
                let Ok((len, from)) = received else { continue };
                if blocked.load(Ordering::SeqCst) {
                    continue;
                }
                if let Err(reason) = membership.handle_packet(from, &buf[..len]) {
                    tracing::debug!(from = %from, reason = %reason, "gossip packet dropped");
                }
                drops.publish(membership.drops());
            }
            _ = tokio::time::sleep_until(next_timer.min(next_rejoin)) => {
                let now = Instant::now();
                while timers.peek().is_some_and(|Reverse(d)| d.0 <= now) {
                    let Reverse(Due(_, _, timer)) = timers.pop().expect("peeked");
                    membership.handle_timer(timer);
                }
                if now >= next_rejoin {
                    // A member left alone merges again with its seeds, soon
                    // at first, then backing off to the announce interval.
                    if membership.members().next().is_none() {
                        let mut targets = seeds.clone();
                        targets.extend(known.iter().filter(|a| !seeds.contains(a)));
                        membership.join(&targets);
                        next_rejoin = now + alone_wait;
                        alone_wait = (alone_wait * 2)
                            .min(rejoin)
                            .min(Duration::from_millis(MAX_ALONE_WAIT_MS));
                    } else {
                        alone_wait = first_rejoin;
                        next_rejoin = now + rejoin;
                    }
                }
            }
        }
    }
}

fn deliver(listener: &impl GossipListener, event: MembershipEvent) {
    match event {
        MembershipEvent::Down(member) => listener.down(member.node.clone(), member.epoch),
        MembershipEvent::Up(member) => listener.up(member.node.clone()),
        MembershipEvent::Renamed { new, .. } => listener.up(new.node.clone()),
        MembershipEvent::Rejoined(_) | MembershipEvent::Defunct | MembershipEvent::Idle => {
            tracing::info!(event = ?event, "gossip membership");
        }
    }
}
