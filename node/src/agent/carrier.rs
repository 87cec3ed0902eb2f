//! The agent actor as its machine's driver ([`Carry`]): each output goes
//! to the session actor, the prober, the store, the data plane's view, a
//! local caller's answer or the actor's timer.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use rollcall_leases::protocol::{Request, SessionUp};
use rollcall_leases::{
    AgentEpoch, CatalogId, Generation, InstanceId, NodeId, RegionsUpdate, ServiceKey, ServiceView,
};

use super::AgentActor;
use crate::agent_state::{CallId, Input, Refusal, Reply, RequestId, SaveId, SessionId};
use crate::carry::Carry;
use crate::failover::Regions;
use crate::health::ProbeTask;
use crate::prober::{Reach, RunProbe};
use crate::session::SessionActor;
use crate::store::{SaveRegions, SaveRegistrations, StoreViews};
use crate::view::Published;

/// The agent actor as the machine's driver: the session actor, the
/// prober, the store, the data plane's view, the local callers' answers
/// and a timer.
pub(super) struct ActorCarry<'a> {
    pub(super) act: &'a mut AgentActor,
    pub(super) ctx: &'a mut Context<AgentActor>,
    pub(super) now_ms: u64,
}

impl Carry for ActorCarry<'_> {
    fn connect(&mut self, session: SessionId, address: String) {
        let Some(client) = self.act.client.clone() else {
            return;
        };
        let actor = SessionActor::new(
            session,
            address,
            client,
            self.act.hello.clone(),
            self.ctx.address().recipient(),
        );
        self.act.session.open(session, actor);
    }

    fn close(&mut self, session: SessionId, reason: String) {
        self.act.session.close(session, reason);
    }

    fn send(&mut self, session: SessionId, message: SessionUp) {
        self.act.session.send(session, message);
    }

    fn request(&mut self, session: SessionId, request: RequestId, body: Request) {
        if !self.act.session.ask(session, request, body) {
            self.ctx.notify(Input::Answer {
                request,
                result: Err("the arbiter session ended".into()),
            });
        }
    }

    fn reply(&mut self, call: CallId, reply: Result<Reply, Refusal>) {
        if let Some(tx) = self.act.calls.remove(&call) {
            let _ = tx.send(reply);
        }
    }

    fn save_registrations(&mut self, save: SaveId, bytes: Vec<u8>) {
        self.act.store.do_send(SaveRegistrations { save, bytes });
    }

    fn witness(&mut self, node: NodeId, epoch: AgentEpoch, addresses: Vec<SocketAddr>) {
        self.act.prober.do_send(Reach {
            node,
            epoch,
            addresses,
        });
    }

    fn probe(&mut self, instance: InstanceId, generation: Option<Generation>, task: ProbeTask) {
        self.act.prober.do_send(RunProbe {
            instance,
            generation,
            task,
        });
    }

    fn wake_at(&mut self, at_ms: u64) {
        if let Some(handle) = self.act.wake.take() {
            self.ctx.cancel_future(handle);
        }
        let after = Duration::from_millis(at_ms.saturating_sub(self.now_ms));
        self.act.wake = Some(self.ctx.run_later(after, |act, ctx| {
            act.wake = None;
            act.feed(Input::Tick, ctx);
        }));
    }

    fn store_views(
        &mut self,
        views: Vec<(Arc<ServiceView>, Option<CatalogId>)>,
        forget: Vec<ServiceKey>,
    ) {
        self.act.store.do_send(StoreViews { views, forget });
    }

    fn save_regions(&mut self, update: RegionsUpdate, received_at_ms: u64) {
        self.act.store.do_send(SaveRegions {
            update,
            received_at_ms,
        });
    }

    fn publish(&mut self, published: Published) {
        self.act.views.publish(published, self.now_ms);
    }

    fn changed(&mut self, service: ServiceKey) {
        if let Some(published) = self.act.state.published(&service) {
            self.act.views.publish(published, self.now_ms);
        }
    }

    fn publish_down(&mut self, nodes: BTreeSet<NodeId>) {
        self.act.views.set_down(nodes);
    }

    fn publish_alive(&mut self, nodes: BTreeSet<NodeId>) {
        self.act.views.set_alive(nodes);
    }

    fn publish_connected(&mut self, up: bool) {
        self.act.views.set_connected(up);
    }

    fn publish_regions(&mut self, regions: Regions) {
        self.act.views.set_regions(regions);
    }

    fn lift_ejections(&mut self, node: NodeId) {
        self.act.views.lift_node(&node);
    }

    fn unpublish(&mut self, service: ServiceKey) {
        self.act.views.unpublish(&service);
    }
}
