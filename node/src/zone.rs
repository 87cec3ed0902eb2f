//! The agent's membership in its zone's gossip (R4, R7): starts the gossip
//! driver (`rollcall_gossip::driver`) from the agent's `[gossip]` config
//! and hands foca's verdicts to the agent's state machine as messages.

use actix::Recipient;
use rollcall_config::AgentConfig;
use rollcall_gossip::{GossipHandle, GossipListener, GossipOptions, ZoneKey};
use rollcall_leases::{AgentEpoch, NodeId};

use crate::agent_state::Input;

/// Why the agent could not join its zone's gossip.
#[derive(Debug, thiserror::Error)]
pub enum ZoneError {
    /// A key file is unusable.
    #[error("{0}")]
    Key(String),
    /// The gossip socket could not be bound.
    #[error("binding the gossip socket {listen}: {source}")]
    Bind {
        /// The configured address.
        listen: std::net::SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Joins the zone's gossip when a zone key is configured.
pub async fn start(
    config: &AgentConfig,
    node: &NodeId,
    epoch: AgentEpoch,
    agent: Recipient<Input>,
) -> Result<Option<GossipHandle>, ZoneError> {
    let gossip = &config.gossip;
    let Some(key_file) = &gossip.key_file else {
        return Ok(None);
    };
    let key = ZoneKey::load(key_file).map_err(|e| ZoneError::Key(e.to_string()))?;
    let previous_key = gossip
        .previous_key_file
        .as_deref()
        .map(ZoneKey::load)
        .transpose()
        .map_err(|e| ZoneError::Key(e.to_string()))?;
    let mut seeds = Vec::new();
    for seed in &gossip.seeds {
        match tokio::net::lookup_host(seed).await {
            Ok(mut addrs) => seeds.extend(addrs.next()),
            Err(e) => {
                tracing::warn!(seed = %seed, error = %e, "gossip seed does not resolve; skipped")
            }
        }
    }
    let options = GossipOptions {
        node: node.clone(),
        epoch,
        listen: gossip.listen,
        seeds,
        settings: gossip.effective(),
        key,
        previous_key,
    };
    let handle = rollcall_gossip::driver::start(options, AgentGossip(agent))
        .await
        .map_err(|source| ZoneError::Bind {
            listen: gossip.listen,
            source,
        })?;
    tracing::info!(gossip = %handle.local_addr, preset = gossip.preset.name(), "gossip member started");
    Ok(Some(handle))
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
