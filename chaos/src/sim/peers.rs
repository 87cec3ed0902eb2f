//! Peer calls between the simulated replicas: what a replica's machine
//! hands another (a follower's forwarded writes and heard reports, the
//! witnesses' answers it passes on, propagation questions) and the
//! answers, carried as the shipped peer client would: one peer latency
//! each way, the target's core charged `recv_cpu_us`, and a call to a
//! replica that is gone ended `Unreachable` after the peer handshake
//! bound or by its wait.

use rollcall_leases::peer_protocol::{PeerRequest, PeerResponse};
use rollcall_leases::replica::{propagation_sums, AwaitId, ForwardId, Forwarded, Input, ReplyId};

use super::world::*;

/// How long a peer call to a replica that is gone waits for a handshake
/// before it is `Unreachable` (the shipped peer client's bound), ms.
pub(super) const PEER_HANDSHAKE_MS: u64 = 500;

/// What a peer call was for, and where its answer goes.
#[derive(Clone, Copy, Debug)]
pub(super) enum CallKind {
    Forward(ForwardId),
    Heard,
    Tell,
    /// One replica's part of a propagation question (the sum's number).
    Propagation(u64),
}

pub(super) struct Call {
    pub(super) from: usize,
    pub(super) from_run: u64,
    pub(super) to: Option<usize>,
    pub(super) address: String,
    pub(super) kind: CallKind,
}

/// A propagation question's sums so far.
pub(super) struct Sums {
    from: usize,
    from_run: u64,
    wait: AwaitId,
    remaining: usize,
    acked: u32,
    total: u32,
}

impl World {
    /// Replica `from` calls the replica at `address`.
    pub(super) fn peer_call(
        &mut self,
        from: usize,
        address: String,
        request: PeerRequest,
        kind: CallKind,
        wait_ms: u64,
    ) {
        self.group.next_call += 1;
        let id = self.group.next_call;
        let to = self.replica_at(&address);
        self.group.calls.insert(
            id,
            Call {
                from,
                from_run: self.arbs[from].run,
                to,
                address,
                kind,
            },
        );
        self.after(wait_ms * 1_000, Ev::PeerTimeout { call: id });
        let latency = self.arbiter_latency();
        self.after(latency, Ev::PeerArrive { call: id, request });
    }

    /// A peer call reaches its replica: its machine takes it, or it finds
    /// nothing there.
    pub(super) fn peer_arrive(&mut self, id: u64, request: PeerRequest) {
        let Some(call) = self.group.calls.get(&id) else {
            return;
        };
        let Some(t) = call.to.filter(|&t| self.arbs[t].up) else {
            // Nothing answers the handshake.
            self.after(PEER_HANDSHAKE_MS * 1_000, Ev::PeerUnreachable { call: id });
            return;
        };
        self.arbiter_cpu(t, self.sc.arbiter.recv_cpu_us);
        let arb = &mut self.arbs[t];
        arb.next_reply += 1;
        let reply = arb.next_reply;
        arb.peer_replies.insert(reply, id);
        self.arbiter_wake(t, vec![Input::Peer { request, reply }]);
    }

    /// Replica `t` answered a peer call: the answer travels back.
    pub(super) fn peer_answered(&mut self, t: usize, reply: ReplyId, response: PeerResponse) {
        let Some(id) = self.arbs[t].peer_replies.remove(&reply) else {
            return;
        };
        let latency = self.arbiter_latency();
        self.after(latency, Ev::PeerAnswer { call: id, response });
    }

    /// A peer call ends: answered, unreachable or out of time; its caller
    /// hears how (if it still runs as it did).
    pub(super) fn peer_end(&mut self, id: u64, response: Result<PeerResponse, String>) {
        let Some(call) = self.group.calls.remove(&id) else {
            return;
        };
        let from_runs = self.arbs[call.from].up && self.arbs[call.from].run == call.from_run;
        let input = match call.kind {
            CallKind::Forward(forward) => Some(Input::Forwarded {
                forward,
                outcome: match response {
                    Ok(response) => Forwarded::from_answer(&call.address, response),
                    Err(unreachable) => Forwarded::Unreachable(unreachable),
                },
            }),
            CallKind::Heard => response.ok().and_then(Input::heard_answered),
            CallKind::Tell => None,
            CallKind::Propagation(sum) => {
                let sums = response
                    .ok()
                    .and_then(|r| propagation_sums(&r))
                    .unwrap_or((0, 0));
                self.add_sums(sum, sums);
                None
            }
        };
        if let (Some(input), true) = (input, from_runs) {
            self.arbiter_wake(call.from, vec![input]);
        }
    }

    /// A forwarded call's wait ran out before any answer.
    pub(super) fn peer_timeout(&mut self, id: u64) {
        if let Some(call) = self.group.calls.get(&id) {
            let address = call.address.clone();
            let response = match call.kind {
                CallKind::Forward(_) => {
                    Ok(PeerResponse::Answer(rollcall_leases::answers::unavailable(
                        format!("the leader at {address} did not answer in time; retry"),
                    )))
                }
                _ => Err(String::new()),
            };
            self.peer_end(id, response);
        }
    }

    /// A propagation question to `to` replicas: each answers its sums.
    pub(super) fn ask_propagation(
        &mut self,
        from: usize,
        wait: AwaitId,
        to: Vec<String>,
        request: PeerRequest,
        wait_ms: u64,
    ) {
        self.group.next_call += 1;
        let sum = self.group.next_call;
        self.group.sums.insert(
            sum,
            Sums {
                from,
                from_run: self.arbs[from].run,
                wait,
                remaining: to.len(),
                acked: 0,
                total: 0,
            },
        );
        if to.is_empty() {
            self.add_sums(sum, (0, 0));
        }
        for address in to {
            self.peer_call(
                from,
                address,
                request.clone(),
                CallKind::Propagation(sum),
                wait_ms,
            );
        }
    }

    fn add_sums(&mut self, sum: u64, (acked, total): (u32, u32)) {
        let Some(s) = self.group.sums.get_mut(&sum) else {
            return;
        };
        s.acked += acked;
        s.total += total;
        s.remaining = s.remaining.saturating_sub(1);
        if s.remaining > 0 {
            return;
        }
        let s = self.group.sums.remove(&sum).expect("present");
        if self.arbs[s.from].up && self.arbs[s.from].run == s.from_run {
            self.arbiter_wake(
                s.from,
                vec![Input::Propagated {
                    wait: s.wait,
                    acked: s.acked,
                    total: s.total,
                }],
            );
        }
    }
}
