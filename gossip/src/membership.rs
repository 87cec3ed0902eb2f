//! The zone membership state machine: foca's SWIM behind one sans-IO
//! door. Datagrams, fired timers and join requests go in; sealed datagrams
//! to send, timers to set and membership events come out of
//! [`Membership::drain_outputs`].
//!
//! It never touches a socket, a clock or an unseeded RNG: the driver (or
//! the simulator) owns those. Nothing that fails [`Sealer::open`] reaches
//! foca.
//!
//! It also carries the workaround for a foca 2.0.0 bug (issue 5, item 3):
//! when a `ChangeSuspectToDown` timer fires for a member that already
//! refuted the suspicion, foca does not declare it down but still sends it
//! `TurnUndead`, and the healthy member then believes the zone declared it
//! down. See [`Gateway::send_to`].

use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroU8, NonZeroUsize};
use std::time::Duration;

use foca::{Codec, Config, Foca, Message, NoCustomBroadcast, Notification, PeriodicParams};
use foca::{Member, PostcardCodec, Runtime, State, Timer};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rollcall_config::SwimSettings;
use rollcall_leases::NodeId;

use crate::identity::MemberId;
use crate::seal::{OpenDrops, OpenError, Sealer, MAX_PAYLOAD};

/// The foca instance this crate runs.
type Swim = Foca<MemberId, PostcardCodec, StdRng, NoCustomBroadcast>;

/// What happened to the zone's membership, as seen by this member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MembershipEvent {
    /// A member became active in our view (joined, or came back under a
    /// newer identity).
    Up(MemberId),
    /// A member we held active was declared down. This is the verdict the
    /// agent reports to the arbiter (node and epoch, R4).
    Down(MemberId),
    /// A newer identity replaced an older one at the same address (an
    /// agent restart, or a rejoin after being declared down). No Down is
    /// emitted for `old` when both were active.
    Renamed {
        /// The identity that was replaced.
        old: MemberId,
        /// The identity that replaced it.
        new: MemberId,
    },
    /// The zone declared this member down, and it came back under `0`, the
    /// next rejoin number of the same agent run.
    Rejoined(MemberId),
    /// The zone declared this member down and it could not rejoin. Only a
    /// new [`Membership`] (an agent restart) brings it back.
    Defunct,
    /// Every member we knew is down or gone: this member is alone. The
    /// driver should [`Membership::join`] the seeds again from time to
    /// time, since foca's periodic announce only runs while connected.
    Idle,
}

/// Something the driver must do for the state machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Send this datagram (already sealed) to this address.
    Send {
        /// Destination gossip address.
        to: SocketAddr,
        /// Sealed datagram, at most [`crate::seal::MAX_PACKET`] bytes.
        bytes: Vec<u8>,
    },
    /// Call [`Membership::handle_timer`] with `timer` after `after`.
    /// Every timer must be delivered, late rather than never.
    Timer {
        /// Delay from now.
        after: Duration,
        /// The timer to hand back.
        timer: Timer<MemberId>,
    },
    /// A membership change to act on.
    Event(MembershipEvent),
}

/// Why an incoming datagram was dropped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DropReason {
    /// It failed the seal: oversized, truncated, unknown key or forged.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// It was authentic but foca refused it (does not decode, comes from
    /// ourselves, malformed). A zone member sending these runs another
    /// version or is broken.
    #[error("authenticated gossip packet refused by foca: {reason}")]
    Refused {
        /// foca's error, as text.
        reason: String,
    },
}

/// Counts of dropped incoming datagrams, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Drops {
    /// Refused by the seal.
    pub open: OpenDrops,
    /// Authentic but refused by foca.
    pub refused: u64,
}

/// One member's view of its zone: foca plus the seal, sans-IO.
pub struct Membership {
    foca: Swim,
    outbox: Outbox,
    refused: u64,
    stale_undead_fix: bool,
}

/// What foca's runtime writes to, kept apart from `foca` so both can be
/// borrowed during one call.
struct Outbox {
    sealer: Sealer,
    outputs: Vec<Output>,
    stale_undead_dropped: u64,
}

/// Builds foca's configuration from the zone's SWIM settings. Starts from
/// `Config::new_lan` and overrides every setting rollcall has an opinion
/// on; in particular `max_transmissions` comes from the settings (the `lan`
/// preset uses 12, not `new_lan`'s 6 at 32 members, issue 5 item 3).
pub fn foca_config(settings: &SwimSettings) -> Config {
    let mut config = Config::new_lan(NonZeroU32::MIN);
    config.probe_period = Duration::from_millis(settings.probe_period_ms);
    config.probe_rtt = Duration::from_millis(settings.probe_rtt_ms);
    config.num_indirect_probes = nonzero_usize(settings.num_indirect_probes as usize);
    config.suspect_to_down_after = Duration::from_millis(settings.suspect_to_down_ms);
    config.max_transmissions = NonZeroU8::new(settings.max_transmissions).unwrap_or(NonZeroU8::MIN);
    config.max_packet_size = nonzero_usize(MAX_PAYLOAD);
    // Down members are remembered for foca's default of a day, so stale
    // news about them cannot resurrect them; restarts come back as new
    // identities anyway.
    config.notify_down_members = true;
    config.periodic_gossip = Some(PeriodicParams {
        frequency: Duration::from_millis(settings.periodic_gossip_ms),
        num_members: nonzero_usize(3),
    });
    config.periodic_announce = Some(PeriodicParams {
        frequency: Duration::from_millis(settings.announce_ms),
        num_members: nonzero_usize(1),
    });
    // Announcing to members we hold down makes a member that is down in
    // *their* view answer TurnUndead, which pushes healthy members into a
    // rejoin. A member cut off by a partition comes back through its own
    // periodic announce (or, when idle, the driver's join).
    config.periodic_announce_to_down_members = None;
    config
}

fn nonzero_usize(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n).unwrap_or(NonZeroUsize::MIN)
}

impl Membership {
    /// A member of the zone under `id`, not yet joined. `rng_seed` seeds
    /// foca's choices and the seal's nonce prefixes (OS randomness in the
    /// agent, the scenario seed in tests).
    pub fn new(id: MemberId, settings: &SwimSettings, sealer: Sealer, rng_seed: u64) -> Self {
        Membership {
            foca: Foca::new(
                id,
                foca_config(settings),
                StdRng::seed_from_u64(rng_seed),
                PostcardCodec,
            ),
            outbox: Outbox {
                sealer,
                outputs: Vec::new(),
                stale_undead_dropped: 0,
            },
            refused: 0,
            stale_undead_fix: true,
        }
    }

    /// Turns the foca 2.0.0 TurnUndead workaround off. Exists only so a
    /// regression test can show the bug it works around; never call it in
    /// an agent.
    #[doc(hidden)]
    pub fn disable_stale_undead_fix(&mut self) {
        self.stale_undead_fix = false;
    }

    /// This member's current identity (its rejoin number grows when the
    /// zone declared it down and it came back).
    pub fn id(&self) -> &MemberId {
        self.foca.identity()
    }

    /// Announces this member to each seed address. The seeds' identities
    /// are unknown before they answer, so the announce is addressed to a
    /// placeholder identity at the seed's address: foca accepts an
    /// Announce for any identity at its own address.
    pub fn join(&mut self, seeds: &[SocketAddr]) {
        for &addr in seeds {
            if addr == self.id().addr {
                continue;
            }
            let placeholder = MemberId::new(seed_node(), addr, Default::default());
            let gateway = Gateway::new(&mut self.outbox, None);
            let result = self.foca.announce(placeholder, gateway);
            log_local_error("announce", result);
        }
    }

    /// Learns these members as alive without telling anyone (foca's
    /// `apply_many` without broadcast), as if a feed had brought them:
    /// for simulations that start from a zone that has run for a while.
    /// The probe cycle starts when the first member is known.
    pub fn preload(&mut self, members: Vec<MemberId>) {
        let gateway = Gateway::new(&mut self.outbox, None);
        let updates = members.into_iter().map(Member::alive);
        let result = self.foca.apply_many(updates, false, gateway);
        log_local_error("preload", result);
    }

    /// Feeds one received datagram. Refused datagrams are counted and
    /// never reach foca.
    pub fn handle_packet(&mut self, from: SocketAddr, packet: &[u8]) -> Result<(), DropReason> {
        let payload = self.outbox.sealer.open(packet).inspect_err(|error| {
            tracing::debug!(%from, %error, "gossip packet dropped");
        })?;
        let gateway = Gateway::new(&mut self.outbox, None);
        let result = self.foca.handle_data(&payload, gateway);
        result.map_err(|error| {
            self.refused += 1;
            tracing::debug!(%from, %error, "gossip packet refused by foca");
            DropReason::Refused {
                reason: error.to_string(),
            }
        })
    }

    /// Hands back a timer from an earlier [`Output::Timer`] once it is due.
    pub fn handle_timer(&mut self, timer: Timer<MemberId>) {
        let guard = match &timer {
            Timer::ChangeSuspectToDown { member_id, .. } if self.stale_undead_fix => {
                Some(SuspectTimerGuard {
                    suspect: member_id.clone(),
                    declared_down: false,
                })
            }
            _ => None,
        };
        let gateway = Gateway::new(&mut self.outbox, guard);
        let result = self.foca.handle_timer(timer, gateway);
        log_local_error("timer", result);
    }

    /// Everything the state machine wants done since the last drain, in
    /// order.
    pub fn drain_outputs(&mut self) -> Vec<Output> {
        std::mem::take(&mut self.outbox.outputs)
    }

    /// The members this member holds active (alive or suspect).
    pub fn members(&self) -> impl Iterator<Item = &MemberId> {
        self.foca.iter_members().map(|member| member.id())
    }

    /// The members this member currently suspects.
    pub fn suspects(&self) -> impl Iterator<Item = &MemberId> {
        self.foca
            .iter_membership_state()
            .filter(|member| member.state() == State::Suspect)
            .map(|member| member.id())
    }

    /// Dropped incoming datagrams so far, by reason.
    pub fn drops(&self) -> Drops {
        Drops {
            open: self.outbox.sealer.drops(),
            refused: self.refused,
        }
    }

    /// How many stale `TurnUndead` messages the workaround suppressed.
    pub fn stale_undead_dropped(&self) -> u64 {
        self.outbox.stale_undead_dropped
    }
}

/// foca's errors on timers and announces are about our own state (a timer
/// for a member that left, a probe cycle cut short); they change nothing and
/// are logged only.
fn log_local_error(during: &'static str, result: Result<(), foca::Error>) {
    if let Err(error) = result {
        tracing::debug!(during, %error, "foca refused a local request");
    }
}

/// The node id of the placeholder identity seeds are announced to; never
/// seen by anyone, since foca replaces it with the seed's real identity.
fn seed_node() -> NodeId {
    NodeId::new("seed").expect("\"seed\" is a valid node id")
}

/// State of the TurnUndead workaround during one `ChangeSuspectToDown`
/// timer call.
struct SuspectTimerGuard {
    suspect: MemberId,
    declared_down: bool,
}

/// foca's [`Runtime`] for one call: seals outgoing payloads and collects
/// everything into the membership's outputs.
struct Gateway<'a> {
    outbox: &'a mut Outbox,
    guard: Option<SuspectTimerGuard>,
}

impl<'a> Gateway<'a> {
    fn new(outbox: &'a mut Outbox, guard: Option<SuspectTimerGuard>) -> Self {
        Gateway { outbox, guard }
    }

    fn event(&mut self, event: MembershipEvent) {
        self.outbox.outputs.push(Output::Event(event));
    }

    /// True when `data` is the foca 2.0.0 stale `TurnUndead`: sent during a
    /// `ChangeSuspectToDown` timer call to the suspect, although the same
    /// call did not declare it down (its incarnation had moved on: it
    /// refuted). The message kind is read by decoding the foca header of
    /// the outgoing payload with the same `PostcardCodec` foca encoded it
    /// with; foca has no other way to expose the kind of a message it sends.
    fn is_stale_turn_undead(&self, to: &MemberId, data: &[u8]) -> bool {
        let Some(guard) = &self.guard else {
            return false;
        };
        if guard.declared_down || *to != guard.suspect {
            return false;
        }
        let header = Codec::<MemberId>::decode_header(&mut PostcardCodec, data);
        matches!(header, Ok(header) if header.message == Message::TurnUndead)
    }
}

impl Runtime<MemberId> for Gateway<'_> {
    fn notify(&mut self, notification: Notification<'_, MemberId>) {
        match notification {
            Notification::MemberUp(id) => self.event(MembershipEvent::Up(id.clone())),
            Notification::MemberDown(id) => {
                if let Some(guard) = &mut self.guard {
                    if *id == guard.suspect {
                        guard.declared_down = true;
                    }
                }
                self.event(MembershipEvent::Down(id.clone()));
            }
            Notification::Rename(old, new) => self.event(MembershipEvent::Renamed {
                old: old.clone(),
                new: new.clone(),
            }),
            Notification::Rejoin(id) => self.event(MembershipEvent::Rejoined(id.clone())),
            Notification::Defunct => self.event(MembershipEvent::Defunct),
            Notification::Idle => self.event(MembershipEvent::Idle),
            Notification::Active => tracing::debug!("joined the zone's membership"),
        }
    }

    fn send_to(&mut self, to: MemberId, data: &[u8]) {
        if self.is_stale_turn_undead(&to, data) {
            self.outbox.stale_undead_dropped += 1;
            tracing::debug!(member = %to, "dropped stale TurnUndead to a member that refuted");
            return;
        }
        match self.outbox.sealer.seal(data) {
            Some(bytes) => self
                .outbox
                .outputs
                .push(Output::Send { to: to.addr, bytes }),
            None => tracing::warn!(
                len = data.len(),
                "foca payload over the sealed size limit; not sent"
            ),
        }
    }

    fn submit_after(&mut self, timer: Timer<MemberId>, after: Duration) {
        self.outbox.outputs.push(Output::Timer { after, timer });
    }
}

#[cfg(test)]
mod tests {
    use rollcall_config::GossipPreset;

    use super::*;

    #[test]
    fn foca_config_follows_the_settings() {
        let settings = GossipPreset::Lan.settings();
        let config = foca_config(&settings);
        assert_eq!(config.probe_period, Duration::from_millis(350));
        assert_eq!(config.probe_rtt, Duration::from_millis(150));
        assert_eq!(config.suspect_to_down_after, Duration::from_millis(1_200));
        assert_eq!(config.max_transmissions.get(), 12);
        assert_eq!(config.max_packet_size.get(), MAX_PAYLOAD);
        let announce = config.periodic_announce.expect("periodic announce on");
        assert_eq!(announce.frequency, Duration::from_secs(30));
        let gossip = config.periodic_gossip.expect("periodic gossip on");
        assert_eq!(gossip.frequency, Duration::from_millis(200));
    }
}
