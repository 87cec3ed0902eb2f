//! The arbiter link: which replica to try next, the reconnect backoff
//! (full jitter), the session's state, lease renewals, and the requests in
//! flight on the session with what each is for. No periodic keep-alive:
//! the arbiter probes the session when it needs to know (R4), and the
//! session actor answers those probes itself; QUIC's own keep-alives
//! (`agent.keepalive_ms`) keep the connection open.
//!
//! It sends only the link's own messages (connect, renew, close); the other sub-machines send requests through
//! [`ArbiterLink::request`] and get their answers back by purpose.

use std::collections::BTreeMap;

use rand::Rng;
use rollcall_config::AgentConfig;
use rollcall_leases::protocol::{Request, SessionDown, SessionUp};
use rollcall_leases::{CatalogId, LeaseId, NodeId, RegionsUpdate, Revision};

use super::{AgentState, Output, Purpose, RequestId, SessionId};
use crate::link::{renew_after_ms, Backoff};

/// Where the link is.
#[derive(Clone, Debug)]
enum Stage {
    /// No arbiters configured.
    Off,
    /// The next attempt is due then.
    Waiting { until_ms: u64 },
    /// Handshake in progress.
    Connecting {
        session: SessionId,
        address: String,
        since_ms: u64,
    },
    /// A session holds the lease.
    Up {
        session: SessionId,
        since_ms: u64,
        lease: LeaseId,
        ttl_ms: u64,
        next_renew_ms: u64,
    },
}

/// The agent's link with its region's arbiter group.
pub(super) struct ArbiterLink {
    stage: Stage,
    backoff: Backoff,
    /// The next replica to try, as an index into `arbiters` (mod its
    /// length).
    attempt: usize,
    next_session: SessionId,
    /// Sessions that came up so far.
    sessions: u64,
    last_contact_ms: Option<u64>,
    /// The replica of the current (or last) session.
    address: Option<String>,
    /// Why the last session (or handshake) ended.
    last_end: Option<String>,
    next_request: RequestId,
    in_flight: BTreeMap<RequestId, (SessionId, Purpose)>,
}

impl ArbiterLink {
    pub(super) fn new(config: &AgentConfig, node: &NodeId, now_ms: u64) -> ArbiterLink {
        ArbiterLink {
            stage: if config.arbiters.is_empty() {
                Stage::Off
            } else {
                Stage::Waiting { until_ms: now_ms }
            },
            backoff: Backoff::new(config.reconnect_min_ms, config.reconnect_max_ms),
            // Agents spread over the replicas (any replica serves watches),
            // each starting at a place fixed by its node id.
            attempt: xxhash_rust::xxh3::xxh3_64(node.as_str().as_bytes()) as usize,
            next_session: 0,
            sessions: 0,
            last_contact_ms: None,
            address: None,
            last_end: None,
            next_request: 0,
            in_flight: BTreeMap::new(),
        }
    }

    /// The session connecting or up.
    pub(super) fn session_id(&self) -> Option<SessionId> {
        match &self.stage {
            Stage::Connecting { session, .. } | Stage::Up { session, .. } => Some(*session),
            Stage::Off | Stage::Waiting { .. } => None,
        }
    }

    /// The session that holds the lease.
    pub(super) fn up_session(&self) -> Option<SessionId> {
        match &self.stage {
            Stage::Up { session, .. } => Some(*session),
            _ => None,
        }
    }

    pub(super) fn is_connected(&self) -> bool {
        self.up_session().is_some()
    }

    /// The replica of the current (or last) session.
    pub(super) fn address(&self) -> Option<&str> {
        self.address.as_deref()
    }

    /// When the arbiter was last heard, ms.
    pub(super) fn last_contact_ms(&self) -> Option<u64> {
        self.last_contact_ms
    }

    /// The lease the session holds and its time to live, ms.
    pub(super) fn lease(&self) -> Option<(LeaseId, u64)> {
        match &self.stage {
            Stage::Up { lease, ttl_ms, .. } => Some((*lease, *ttl_ms)),
            _ => None,
        }
    }

    /// Something arrived on the session.
    pub(super) fn heard(&mut self, now_ms: u64) {
        self.last_contact_ms = Some(now_ms);
    }

    /// The Welcome of `session`: `None` when it is not the session being
    /// opened; otherwise the session is up, and whether it is a reconnect.
    pub(super) fn up<R: Rng + ?Sized>(
        &mut self,
        session: SessionId,
        lease: LeaseId,
        ttl_ms: u64,
        now_ms: u64,
        rng: &mut R,
    ) -> Option<bool> {
        let Stage::Connecting {
            session: expected,
            address,
            since_ms,
        } = &self.stage
        else {
            return None;
        };
        if *expected != session {
            return None;
        }
        let (address, since_ms) = (address.clone(), *since_ms);
        self.stage = Stage::Up {
            session,
            since_ms,
            lease,
            ttl_ms,
            next_renew_ms: now_ms + renew_after_ms(ttl_ms, rng),
        };
        self.address = Some(address);
        self.last_contact_ms = Some(now_ms);
        self.sessions += 1;
        Some(self.sessions > 1)
    }

    /// The session ended (or its handshake failed): the next attempt waits
    /// out the backoff. When a session had been up, the purposes of its
    /// requests, which get no answer now; `None` when none was up.
    pub(super) fn down<R: Rng + ?Sized>(
        &mut self,
        now_ms: u64,
        rng: &mut R,
    ) -> Option<Vec<Purpose>> {
        let (session, lasted, was_up) = match &self.stage {
            Stage::Up {
                session, since_ms, ..
            } => (*session, now_ms.saturating_sub(*since_ms), true),
            Stage::Connecting { session, .. } => (*session, 0, false),
            Stage::Off | Stage::Waiting { .. } => return None,
        };
        let wait = self.backoff.next_wait(lasted, rng);
        self.stage = Stage::Waiting {
            until_ms: now_ms + wait,
        };
        if !was_up {
            return None;
        }
        let ended: Vec<RequestId> = self
            .in_flight
            .iter()
            .filter(|(_, (s, _))| *s == session)
            .map(|(id, _)| *id)
            .collect();
        Some(
            ended
                .into_iter()
                .filter_map(|id| self.in_flight.remove(&id).map(|(_, p)| p))
                .collect(),
        )
    }

    /// Records why the session (or its handshake) ended, for `/v1/status`.
    pub(super) fn ended_because(&mut self, reason: String) {
        self.last_end = Some(reason);
    }

    /// Why the last session (or handshake) ended, if one did.
    pub(super) fn last_end(&self) -> Option<&str> {
        self.last_end.as_deref()
    }

    /// Sends a request on the session; false when none is up.
    pub(super) fn request(
        &mut self,
        body: Request,
        purpose: Purpose,
        out: &mut Vec<Output>,
    ) -> bool {
        let Some(session) = self.up_session() else {
            return false;
        };
        self.next_request += 1;
        let request = self.next_request;
        self.in_flight.insert(request, (session, purpose));
        out.push(Output::Request {
            session,
            request,
            body,
        });
        true
    }

    /// What the answered request was for; `None` for a request of an ended
    /// session.
    pub(super) fn answered(&mut self, request: RequestId) -> Option<Purpose> {
        self.in_flight.remove(&request).map(|(_, p)| p)
    }

    /// The purposes of the requests in flight.
    pub(super) fn in_flight(&self) -> impl Iterator<Item = &Purpose> + '_ {
        self.in_flight.values().map(|(_, p)| p)
    }

    /// A due attempt or renewal.
    pub(super) fn tick<R: Rng + ?Sized>(
        &mut self,
        arbiters: &[String],
        now_ms: u64,
        rng: &mut R,
        out: &mut Vec<Output>,
    ) {
        match &mut self.stage {
            Stage::Waiting { until_ms } if *until_ms <= now_ms => {
                let address = arbiters[self.attempt % arbiters.len()].clone();
                self.attempt += 1;
                self.next_session += 1;
                let session = self.next_session;
                self.stage = Stage::Connecting {
                    session,
                    address: address.clone(),
                    since_ms: now_ms,
                };
                out.push(Output::Connect { session, address });
            }
            Stage::Up {
                session,
                ttl_ms,
                next_renew_ms,
                ..
            } if *next_renew_ms <= now_ms => {
                *next_renew_ms = now_ms + renew_after_ms(*ttl_ms, rng);
                out.push(Output::Send {
                    session: *session,
                    message: SessionUp::Renew,
                });
            }
            _ => {}
        }
    }

    pub(super) fn next_wake(&self) -> Option<u64> {
        match &self.stage {
            Stage::Waiting { until_ms } => Some(*until_ms),
            Stage::Up { next_renew_ms, .. } => Some(*next_renew_ms),
            Stage::Off | Stage::Connecting { .. } => None,
        }
    }

    /// Closes the session for good (a shutdown).
    pub(super) fn close(&mut self, reason: &str, out: &mut Vec<Output>) {
        if let Some(session) = self.session_id() {
            out.push(Output::Close {
                session,
                reason: reason.to_owned(),
            });
        }
        self.stage = Stage::Off;
    }
}

impl AgentState {
    /// The session came up: the views are checked against its catalog and
    /// subscribed again, and the reconcile plan starts.
    pub(super) fn connected<R: Rng + ?Sized>(
        &mut self,
        catalog: Option<CatalogId>,
        revision: Revision,
        now_ms: u64,
        rng: &mut R,
        out: &mut Vec<Output>,
    ) {
        let arbiter = self.link.address().unwrap_or_default().to_owned();
        tracing::info!(arbiter = %arbiter, epoch = %self.settings.epoch, "arbiter session up");
        out.push(Output::PublishConnected(true));
        self.peers.changed();
        let session = self.link.up_session();
        self.following
            .connected(&arbiter, (catalog, revision), session, now_ms, rng, out);
        self.start_plan(out);
    }

    /// The session ended, or its handshake failed.
    pub(super) fn disconnected<R: Rng + ?Sized>(
        &mut self,
        now_ms: u64,
        rng: &mut R,
        out: &mut Vec<Output>,
    ) {
        let Some(ended) = self.link.down(now_ms, rng) else {
            return;
        };
        self.following.disconnected(now_ms);
        self.peers.disconnected();
        self.reconcile.stop();
        self.writes.retry_cancelled();
        out.push(Output::PublishConnected(false));
        // Requests of the ended session get no answer now.
        for purpose in ended {
            let result = Err("the arbiter session ended".to_owned());
            self.answer(purpose, result, now_ms, rng, out);
        }
    }

    /// A message on the session stream.
    /// A regions message: held, persisted when anything but the ages
    /// changed, and published to the data plane.
    fn regions(&mut self, update: RegionsUpdate, now_ms: u64, out: &mut Vec<Output>) {
        if self.following.regions_update(&update, now_ms) {
            out.push(Output::SaveRegions {
                update,
                received_at_ms: now_ms,
            });
        }
        out.push(Output::PublishRegions(self.following.regions.clone()));
    }

    pub(super) fn message<R: Rng + ?Sized>(
        &mut self,
        session: SessionId,
        message: SessionDown,
        now_ms: u64,
        rng: &mut R,
        out: &mut Vec<Output>,
    ) {
        self.link.heard(now_ms);
        match message {
            SessionDown::Update(items) => {
                self.following
                    .update(items, Some(session), now_ms, rng, out)
            }
            SessionDown::Regions(update) => self.regions(update, now_ms, out),
            SessionDown::RegionsWithWriters(mut update, writers) => {
                update.writers = writers;
                self.regions(update, now_ms, out)
            }
            SessionDown::Refused { reason } => {
                tracing::warn!(reason = %reason, "the arbiter refused the session");
                out.push(Output::Close {
                    session,
                    reason: format!("refused: {reason}"),
                });
                self.disconnected(now_ms, rng, out);
            }
            SessionDown::Welcome { .. } => {}
            SessionDown::Witness {
                node,
                epoch,
                addresses,
            } => self.witness(node, epoch, addresses, out),
            // The agent's session actor answers probes itself, at once,
            // and hands none here; a driver without one (the fleet
            // simulator) gets the same answer from the machine.
            SessionDown::Probe { nonce } => out.push(Output::Send {
                session,
                message: SessionUp::Alive { nonce },
            }),
        }
    }
}
