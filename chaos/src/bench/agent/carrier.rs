//! A fleet bench agent as its machine's driver ([`Carry`]): a real
//! session, no data plane, no files, and records of what the coordinator
//! measures.

use std::net::SocketAddr;
use std::time::Duration;

use actix::prelude::*;
use rollcall_leases::clock::now_ms;
use rollcall_leases::protocol::{Request, SessionUp};
use rollcall_leases::{AgentEpoch, Generation, InstanceId, NodeId};
use rollcall_node::agent_state::{CallId, Input, Refusal, Reply, RequestId, SaveId, SessionId};
use rollcall_node::carry::Carry;
use rollcall_node::health::ProbeTask;
use rollcall_node::session::SessionActor;

use super::{FleetAgent, CUT_CONNECT_FAILS_AFTER};
use crate::bench::records::{now_us, Apply};

/// The bench as an agent's driver: a real session, no data plane, no
/// files, and records of what the coordinator measures.
pub(super) struct BenchCarry<'a> {
    pub(super) act: &'a mut FleetAgent,
    pub(super) ctx: &'a mut Context<FleetAgent>,
}

impl Carry for BenchCarry<'_> {
    fn connect(&mut self, session: SessionId, address: String) {
        if self.act.cut {
            // The network is cut: the handshake never gets an answer (the
            // agent's machine waits its backoff).
            self.ctx
                .run_later(CUT_CONNECT_FAILS_AFTER, move |act, ctx| {
                    act.feed(
                        Input::SessionEnded {
                            session,
                            reason: "bench: the network to the arbiters is cut".into(),
                        },
                        ctx,
                    )
                });
            return;
        }
        let actor = SessionActor::new(
            session,
            address,
            self.act.client.clone(),
            self.act.hello.clone(),
            self.ctx.address().recipient(),
        );
        self.act.session.open(session, actor);
    }

    fn close(&mut self, session: SessionId, reason: String) {
        self.act.session.close(session, reason);
    }

    fn send(&mut self, session: SessionId, message: SessionUp) {
        let act = &mut *self.act;
        let apply = match &message {
            SessionUp::Ack { service, revision } => act
                .shared
                .index
                .get(service)
                .map(|&s| Apply(act.index, s, revision.0, now_us())),
            _ => None,
        };
        if act.session.send(session, message) {
            if let Some(apply) = apply {
                act.shared.record(|r| r.applies.push(apply));
            }
        }
    }

    fn request(&mut self, session: SessionId, request: RequestId, body: Request) {
        let (what, at) = (self.act.what(&body), now_us());
        if self.act.session.ask(session, request, body) {
            if let Some((kind, service)) = what {
                self.act.requests.insert(request, (kind, service, at));
            }
        } else {
            self.ctx.notify(Input::Answer {
                request,
                result: Err("the arbiter session ended".into()),
            });
        }
    }

    fn reply(&mut self, call: CallId, reply: Result<Reply, Refusal>) {
        if let Some(step) = self.act.calls.remove(&call) {
            self.act.answered(step, reply, self.ctx);
        }
    }

    fn save_registrations(&mut self, save: SaveId, _bytes: Vec<u8>) {
        self.ctx.notify(Input::Saved {
            save,
            result: Ok(()),
        });
    }

    fn witness(&mut self, node: NodeId, epoch: AgentEpoch, _addresses: Vec<SocketAddr>) {
        self.ctx.notify(Input::Reached {
            node,
            epoch,
            reachable: true,
        });
    }

    fn probe(&mut self, instance: InstanceId, generation: Option<Generation>, task: ProbeTask) {
        self.ctx.notify(Input::Probed {
            instance,
            generation,
            which: task.which,
            passed: true,
            detail: "bench: every instance passes".into(),
        });
    }

    fn wake_at(&mut self, at: u64) {
        if let Some(handle) = self.act.wake.take() {
            self.ctx.cancel_future(handle);
        }
        let after = Duration::from_millis(at.saturating_sub(now_ms()));
        self.act.wake = Some(self.ctx.run_later(after, |act, ctx| {
            act.wake = None;
            act.feed(Input::Tick, ctx);
        }));
    }
}
