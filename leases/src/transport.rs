//! The one QUIC transport configuration of rollcall's connections: who
//! sends keep-alives, how long a silent connection lives, and flow-control
//! windows sized for what rollcall sends (quinn's defaults, 1.25 MB per
//! stream and 10 MB per connection, are sized for bulk transfer, not for
//! thousands of small sessions). Built here once, per kind of link, for
//! the agent, the arbiter, the replicas' peer links and the region bridge.
//!
//! Liveness is not timed by QUIC (R4): the arbiter probes a node's session
//! when a down report needs its own signal. Only the agent's end of a
//! session sends keep-alives, at `agent.keepalive_ms`, to keep NAT
//! bindings open and to notice a dead arbiter within the idle timeout; the
//! arbiter's end sends none, so 5,000 sessions cost it no timer traffic.
//!
//! Windows are credit, not memory: quinn buffers only what arrives. They
//! bound what one connection may have in flight.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quinn::{IdleTimeout, TransportConfig, VarInt};

/// What a connection is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    /// An agent's (or another client's) connection to an arbiter: it
    /// alone sends keep-alives, at this interval.
    Agent {
        /// The keep-alive interval (`agent.keepalive_ms`).
        keepalive: Duration,
    },
    /// The arbiter's end of agents' connections: no keep-alives, and at
    /// most `send_window` bytes queued per connection
    /// (`distribution.max_queued_bytes_per_agent`: a slower agent stalls
    /// and is disconnected).
    Arbiter {
        /// Bytes one connection may have unacknowledged.
        send_window: u64,
    },
    /// The replicas' links to one another: Raft entries and snapshot
    /// chunks (`snapshot_max_chunk_size`, 4 MiB) and forwarded writes;
    /// keep-alives every 500 ms and a 5 s idle timeout, so a dead replica
    /// is noticed well inside an election.
    Peer,
    /// The region bridge's links between regions: a few connections,
    /// keep-alives every second at both ends.
    Bridge,
}

/// QUIC idle timeout of agent and bridge connections
/// (`rollcall_config::QUIC_IDLE_TIMEOUT_MS`).
pub const IDLE_TIMEOUT: Duration = Duration::from_millis(rollcall_config::QUIC_IDLE_TIMEOUT_MS);

/// QUIC idle timeout of the replicas' peer links.
pub const PEER_IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// Keep-alive interval of the replicas' peer links.
pub const PEER_KEEP_ALIVE: Duration = Duration::from_millis(500);

/// Keep-alive interval of the region bridge's links.
pub const BRIDGE_KEEP_ALIVE: Duration = Duration::from_secs(1);

/// Receive window of one stream of a session: the largest update message
/// an agent takes in at once (service snapshots go in one message; a
/// larger one flows as the agent reads).
const SESSION_STREAM_WINDOW: u32 = 1024 * 1024;
/// Receive window of one agent connection, all streams.
const SESSION_CONNECTION_WINDOW: u32 = 2 * 1024 * 1024;
/// What an arbiter takes in per stream of an agent's connection: session
/// messages and requests are small (a request is at most 64 KiB).
const ARBITER_STREAM_WINDOW: u32 = 256 * 1024;
/// What an arbiter takes in per agent connection, all streams.
const ARBITER_CONNECTION_WINDOW: u32 = 1024 * 1024;
/// Receive window of one stream of a peer link: a snapshot chunk (4 MiB)
/// and some.
const PEER_STREAM_WINDOW: u32 = 8 * 1024 * 1024;
/// Receive window of one peer link, all streams.
const PEER_CONNECTION_WINDOW: u32 = 16 * 1024 * 1024;

/// The transport configuration of one kind of link.
pub fn config(link: Link) -> Arc<TransportConfig> {
    let mut t = TransportConfig::default();
    let (keepalive, idle, stream, connection) = match link {
        Link::Agent { keepalive } => (
            Some(keepalive),
            IDLE_TIMEOUT,
            SESSION_STREAM_WINDOW,
            SESSION_CONNECTION_WINDOW,
        ),
        Link::Arbiter { send_window } => {
            t.send_window(send_window);
            (
                None,
                IDLE_TIMEOUT,
                ARBITER_STREAM_WINDOW,
                ARBITER_CONNECTION_WINDOW,
            )
        }
        Link::Peer => (
            Some(PEER_KEEP_ALIVE),
            PEER_IDLE_TIMEOUT,
            PEER_STREAM_WINDOW,
            PEER_CONNECTION_WINDOW,
        ),
        Link::Bridge => (
            Some(BRIDGE_KEEP_ALIVE),
            IDLE_TIMEOUT,
            SESSION_STREAM_WINDOW,
            SESSION_CONNECTION_WINDOW,
        ),
    };
    t.keep_alive_interval(keepalive);
    t.max_idle_timeout(Some(idle_timeout(idle)));
    t.stream_receive_window(VarInt::from_u32(stream));
    t.receive_window(VarInt::from_u32(connection));
    Arc::new(t)
}

/// A UDP socket bound to `addr` for a QUIC endpoint, asking the kernel
/// for `recv_buffer` bytes of receive buffer (`SO_RCVBUF`; `None` keeps
/// the kernel's default), and the size the kernel granted. Linux caps the
/// request at `net.core.rmem_max` and reports twice what it keeps (its
/// bookkeeping overhead); the caller compares the grant with the request.
pub fn bind_udp(
    addr: SocketAddr,
    recv_buffer: Option<usize>,
) -> std::io::Result<(std::net::UdpSocket, usize)> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if let Some(bytes) = recv_buffer {
        socket.set_recv_buffer_size(bytes)?;
    }
    socket.bind(&addr.into())?;
    socket.set_nonblocking(true)?;
    let granted = socket.recv_buffer_size()?;
    Ok((socket.into(), granted))
}

fn idle_timeout(d: Duration) -> IdleTimeout {
    IdleTimeout::from(VarInt::from_u32(
        u32::try_from(d.as_millis()).expect("an idle timeout of seconds fits a VarInt"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_agents_end_of_a_session_sends_keep_alives() {
        // Debug output is the one view quinn gives of a config.
        let shown = |link| format!("{:?}", config(link));
        let agent = shown(Link::Agent {
            keepalive: Duration::from_secs(5),
        });
        let arbiter = shown(Link::Arbiter { send_window: 1 });
        assert!(agent.contains("keep_alive_interval: Some(5s)"), "{agent}");
        assert!(arbiter.contains("keep_alive_interval: None"), "{arbiter}");
        assert!(shown(Link::Peer).contains("keep_alive_interval: Some(500ms)"));
    }

    #[test]
    fn a_bound_socket_gets_the_receive_buffer_it_asks_for_up_to_the_kernels_cap() {
        let small = bind_udp(([127, 0, 0, 1], 0).into(), Some(64 * 1024)).unwrap();
        let large = bind_udp(([127, 0, 0, 1], 0).into(), Some(1024 * 1024)).unwrap();
        let default = bind_udp(([127, 0, 0, 1], 0).into(), None).unwrap();
        assert!(default.1 > 0);
        assert!(small.0.local_addr().unwrap().port() > 0);
        // Whatever the cap, asking for more never grants less, and the
        // smaller request is granted at least what it asked for.
        assert!(small.1 >= 64 * 1024, "granted {}", small.1);
        assert!(large.1 >= small.1, "{} < {}", large.1, small.1);
    }
}
