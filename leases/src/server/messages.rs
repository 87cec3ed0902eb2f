//! What reaches the arbiter's core: the messages of connections, the admin
//! endpoint and peer replicas, and what a connection's writer is told. The
//! core, the connections and the peer handlers all speak these; none of
//! them imports another's internals.

use tokio::sync::{mpsc, oneshot};

use crate::command::Command;
use crate::endpoint::Principal;
use crate::identity::Identity;
use crate::ids::AgentId;
use crate::peer_protocol::{PeerRequest, PeerResponse};
use crate::protocol::{Request, Response, SessionDown, SessionUp};

/// What a connection's writer must do.
#[derive(Debug)]
pub enum Outbound {
    /// Write this message; when `notify`, report `CoreMsg::Sent` after it is
    /// written (only the distributor's updates are accounted for).
    Message {
        /// The message.
        message: SessionDown,
        /// Report completion.
        notify: bool,
    },
    /// Close the connection with this reason.
    Close(String),
}

/// A question from the admin endpoint.
pub enum AdminQuery {
    /// `GET /v1/status`.
    Status(oneshot::Sender<serde_json::Value>),
    /// `GET /v1/remote`: every other region's view, with its age.
    Remote(oneshot::Sender<serde_json::Value>),
    /// `PUT /v1/remote/{region}`: one region's whole view (memory only).
    PutRemote {
        /// The view.
        view: crate::remote::RegionView,
        /// How long ago the bridge last heard that region, ms.
        heard_ms_ago: u64,
        /// Past this age the view counts as unknown, ms.
        max_age_ms: u64,
        /// The refusal, if the view does not check.
        reply: oneshot::Sender<Result<(), String>>,
    },
    /// `POST /v1/remote/{region}/heard`: the view held at `version` is
    /// still current; answers whether one is held at that version.
    RemoteHeard {
        /// The region.
        region: crate::name::Label,
        /// The version confirmed.
        version: crate::ids::Revision,
        /// As of when, in that region's time, ms.
        as_of_ms: u64,
        /// How long ago the bridge heard it, ms.
        heard_ms_ago: u64,
        /// Whether a view at that version is held.
        reply: oneshot::Sender<bool>,
    },
    /// `GET /metrics`: refresh the gauges, then answer.
    RefreshMetrics(oneshot::Sender<()>),
    /// An operator's catalog write (`PUT /v1/policies`): proposed like an
    /// agent's request, stamped with the time here, answered once committed
    /// and applied on this replica.
    Propose {
        /// Who asks.
        actor: Principal,
        /// What to change.
        command: Command,
        /// Where the answer goes.
        reply: oneshot::Sender<Response>,
    },
}

/// Everything the core hears.
pub enum CoreMsg {
    /// A connection completed its handshake.
    Connected {
        /// Its number.
        agent: AgentId,
        /// The identity its certificate names.
        identity: Identity,
        /// Its certificate's IP SANs: the addresses its node may register
        /// (`[registration]`).
        certified: Vec<std::net::IpAddr>,
        /// Where to send its messages.
        tx: mpsc::UnboundedSender<Outbound>,
    },
    /// A message on its session stream.
    Session {
        /// The connection.
        agent: AgentId,
        /// The message.
        msg: SessionUp,
    },
    /// A request on a stream of its own.
    Request {
        /// The connection.
        agent: AgentId,
        /// The request.
        request: Request,
        /// Where the answer goes.
        reply: oneshot::Sender<Response>,
    },
    /// An update message marked `notify` was written.
    Sent {
        /// The connection.
        agent: AgentId,
    },
    /// The connection is gone.
    Closed {
        /// The connection.
        agent: AgentId,
    },
    /// An admin question.
    Admin(AdminQuery),
    /// What a peer replica hands this one (not Raft's own messages, which go
    /// straight to openraft).
    Peer {
        /// The request.
        request: PeerRequest,
        /// Where the answer goes.
        reply: oneshot::Sender<PeerResponse>,
    },
}
