//! The agent's membership in its zone's gossip (R4, R7): starts the gossip
//! driver (`rollcall_gossip::driver`) from the agent's `[gossip]` config
//! and hands foca's verdicts to the agent's state machine as messages.
//!
//! In two steps, like the rest of the agent's start-up (`process`):
//! [`prepare`] reads the key files, binds the socket and resolves the
//! seeds, and can fail; [`start`] only starts the driver, and cannot.

use actix::Recipient;
use rollcall_config::AgentConfig;
use rollcall_gossip::{
    GossipHandle, GossipListener, GossipOptions, GossipSocket, KeyFileError, ZoneKey,
};
use rollcall_leases::{AgentEpoch, NodeId};

use crate::agent_state::Input;

/// Why the agent could not join its zone's gossip.
#[derive(Debug, thiserror::Error)]
pub enum ZoneError {
    /// A key file is missing, unreadable or malformed (the message names
    /// the file and how to make one).
    #[error("gossip.{field}: {source}")]
    Key {
        /// `key_file` or `previous_key_file`.
        field: &'static str,
        /// What is wrong with the file.
        source: KeyFileError,
    },
    /// The gossip socket could not be bound.
    #[error("binding the gossip socket {listen}: {source}; free the port or change gossip.listen")]
    Bind {
        /// The configured address.
        listen: std::net::SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
}

/// What joining the zone needs, checked: the keys read, the socket bound,
/// the seeds resolved. Nothing runs yet.
pub struct Prepared {
    socket: GossipSocket,
    seeds: Vec<std::net::SocketAddr>,
    key: ZoneKey,
    previous_key: Option<ZoneKey>,
}

/// Reads the zone key files, binds the gossip socket and resolves the
/// seeds, when a zone key is configured (`None` without one).
pub async fn prepare(config: &AgentConfig) -> Result<Option<Prepared>, ZoneError> {
    let gossip = &config.gossip;
    let Some(key_file) = &gossip.key_file else {
        return Ok(None);
    };
    let key = ZoneKey::load(key_file).map_err(|source| ZoneError::Key {
        field: "key_file",
        source,
    })?;
    let previous_key = gossip
        .previous_key_file
        .as_deref()
        .map(ZoneKey::load)
        .transpose()
        .map_err(|source| ZoneError::Key {
            field: "previous_key_file",
            source,
        })?;
    let socket = GossipSocket::bind(gossip.listen)
        .await
        .map_err(|source| ZoneError::Bind {
            listen: gossip.listen,
            source,
        })?;
    let mut seeds = Vec::new();
    for seed in &gossip.seeds {
        match tokio::net::lookup_host(seed).await {
            Ok(mut addrs) => seeds.extend(addrs.next()),
            Err(e) => {
                tracing::warn!(seed = %seed, error = %e, "gossip seed does not resolve; skipped")
            }
        }
    }
    Ok(Some(Prepared {
        socket,
        seeds,
        key,
        previous_key,
    }))
}

/// Joins the zone's gossip as `node` in run `epoch`; verdicts go to `agent`.
pub fn start(
    prepared: Prepared,
    config: &AgentConfig,
    node: &NodeId,
    epoch: AgentEpoch,
    agent: Recipient<Input>,
) -> GossipHandle {
    let options = GossipOptions {
        node: node.clone(),
        epoch,
        socket: prepared.socket,
        seeds: prepared.seeds,
        settings: config.gossip.effective(),
        key: prepared.key,
        previous_key: prepared.previous_key,
    };
    let handle = rollcall_gossip::driver::start(options, AgentGossip(agent));
    tracing::info!(gossip = %handle.local_addr, preset = config.gossip.preset.name(), "gossip member started");
    handle
}

/// The gossip driver's verdicts, as messages to the agent actor.
struct AgentGossip(Recipient<Input>);

impl GossipListener for AgentGossip {
    fn down(&self, node: NodeId, epoch: AgentEpoch) {
        self.0.do_send(Input::PeerDown { node, epoch });
    }

    fn up(&self, node: NodeId) {
        self.0.do_send(Input::PeerUp { node });
    }
}
