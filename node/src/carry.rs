//! The one door [`AgentState`](crate::agent_state::AgentState)'s outputs
//! go through, as foca's `Runtime` is for its SWIM machine: a driver
//! implements [`Carry`] (what each output means where it runs) and hands
//! the outputs of every input to [`carry`], the single loop that takes
//! them apart. The agent's actor, the fleet bench's agents and the fleet
//! simulator are the three drivers; none of them matches on [`Output`]
//! itself, so an output added to the machine is a method every driver
//! must answer (or, for the data plane and the disk, knowingly ignore).
//!
//! Nothing here does IO: the implementations do.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;

use rollcall_leases::protocol::{Request, SessionUp};
use rollcall_leases::{
    AgentEpoch, CatalogId, Generation, InstanceId, NodeId, RegionsUpdate, ServiceKey, ServiceView,
};

use crate::agent_state::{CallId, Output, Refusal, Reply, RequestId, SaveId, SessionId};
use crate::failover::Regions;
use crate::health::ProbeTask;
use crate::view::Published;

/// What a driver does with each of the machine's outputs (see
/// [`Output`] for what each one asks). The session, the local API, the
/// registrations file, probes, witness connects and the wake-up are every
/// driver's to carry; the data plane's view and the disk cache have
/// defaults that drop them, for drivers that keep neither.
pub trait Carry {
    /// `Output::Connect`.
    fn connect(&mut self, session: SessionId, address: String);
    /// `Output::Close`.
    fn close(&mut self, session: SessionId, reason: String);
    /// `Output::Send`.
    fn send(&mut self, session: SessionId, message: SessionUp);
    /// `Output::Request`.
    fn request(&mut self, session: SessionId, request: RequestId, body: Request);
    /// `Output::Reply`.
    fn reply(&mut self, call: CallId, reply: Result<Reply, Refusal>);
    /// `Output::SaveRegistrations`.
    fn save_registrations(&mut self, save: SaveId, bytes: Vec<u8>);
    /// `Output::Witness`.
    fn witness(&mut self, node: NodeId, epoch: AgentEpoch, addresses: Vec<SocketAddr>);
    /// `Output::Probe`.
    fn probe(&mut self, instance: InstanceId, generation: Option<Generation>, task: ProbeTask);
    /// `Output::WakeAt`.
    fn wake_at(&mut self, at_ms: u64);

    /// `Output::StoreViews`.
    fn store_views(
        &mut self,
        _views: Vec<(Arc<ServiceView>, Option<CatalogId>)>,
        _forget: Vec<ServiceKey>,
    ) {
    }
    /// `Output::SaveRegions`.
    fn save_regions(&mut self, _update: RegionsUpdate, _received_at_ms: u64) {}
    /// `Output::Publish`.
    fn publish(&mut self, _published: Published) {}
    /// `Output::Changed`.
    fn changed(&mut self, _service: ServiceKey) {}
    /// `Output::PublishDown`.
    fn publish_down(&mut self, _nodes: BTreeSet<NodeId>) {}
    /// `Output::PublishAlive`.
    fn publish_alive(&mut self, _nodes: BTreeSet<NodeId>) {}
    /// `Output::PublishConnected`.
    fn publish_connected(&mut self, _up: bool) {}
    /// `Output::PublishRegions`.
    fn publish_regions(&mut self, _regions: Regions) {}
    /// `Output::LiftEjections`.
    fn lift_ejections(&mut self, _node: NodeId) {}
    /// `Output::Unpublish`.
    fn unpublish(&mut self, _service: ServiceKey) {}
}

/// Carries `outputs`, in order, through `to`.
pub fn carry(outputs: impl IntoIterator<Item = Output>, to: &mut impl Carry) {
    for output in outputs {
        match output {
            Output::Connect { session, address } => to.connect(session, address),
            Output::Close { session, reason } => to.close(session, reason),
            Output::Send { session, message } => to.send(session, message),
            Output::Request {
                session,
                request,
                body,
            } => to.request(session, request, body),
            Output::Reply { call, reply } => to.reply(call, reply),
            Output::StoreViews { views, forget } => to.store_views(views, forget),
            Output::SaveRegistrations { save, bytes } => to.save_registrations(save, bytes),
            Output::SaveRegions {
                update,
                received_at_ms,
            } => to.save_regions(update, received_at_ms),
            Output::Witness {
                node,
                epoch,
                addresses,
            } => to.witness(node, epoch, addresses),
            Output::Probe {
                instance,
                generation,
                task,
            } => to.probe(instance, generation, task),
            Output::Publish(published) => to.publish(published),
            Output::Changed(service) => to.changed(service),
            Output::PublishDown(nodes) => to.publish_down(nodes),
            Output::PublishAlive(nodes) => to.publish_alive(nodes),
            Output::PublishConnected(up) => to.publish_connected(up),
            Output::PublishRegions(regions) => to.publish_regions(regions),
            Output::LiftEjections(node) => to.lift_ejections(node),
            Output::Unpublish(service) => to.unpublish(service),
            Output::WakeAt(at_ms) => to.wake_at(at_ms),
        }
    }
}
