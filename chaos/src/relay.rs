//! A UDP relay in front of one arbiter replica's QUIC port, for the
//! follower-lag fault: the other replicas dial the relay, which forwards
//! every datagram both ways after an adjustable delay (0 = at once). This
//! host's kernel has no `tc netem`, so the delay is added here, in user
//! space; QUIC sees the same thing (late packets, a longer round trip).
//!
//! Each client address gets its own upstream socket, so replies find their
//! way back. Order is kept per direction: datagrams leave in the order they
//! arrived, each no earlier than its arrival plus the delay at arrival.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Largest datagram relayed (QUIC's are far smaller).
const MAX_DATAGRAM: usize = 65_535;

/// Datagrams queued per direction before new ones are dropped (as a full
/// link would).
const QUEUE: usize = 4_096;

/// A running relay; stops when dropped.
pub struct Relay {
    /// Where peers send to.
    pub addr: SocketAddr,
    delay_ms: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// Binds `listen` and relays to `upstream`.
    pub async fn start(listen: SocketAddr, upstream: SocketAddr) -> std::io::Result<Relay> {
        let socket = Arc::new(UdpSocket::bind(listen).await?);
        let addr = socket.local_addr()?;
        let delay_ms = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(run(socket, upstream, delay_ms.clone()));
        Ok(Relay {
            addr,
            delay_ms,
            task,
        })
    }

    /// Sets the one-way delay for datagrams arriving from now on.
    pub fn set_delay(&self, delay: Duration) {
        self.delay_ms
            .store(delay.as_millis() as u64, Ordering::Relaxed);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Sends each queued datagram on `socket` to `to` once it is due.
async fn deliver(
    socket: Arc<UdpSocket>,
    mut queue: mpsc::Receiver<(Instant, Vec<u8>, SocketAddr)>,
) {
    while let Some((due, bytes, to)) = queue.recv().await {
        tokio::time::sleep_until(due).await;
        let _ = socket.send_to(&bytes, to).await;
    }
}

async fn run(listen: Arc<UdpSocket>, upstream: SocketAddr, delay_ms: Arc<AtomicU64>) {
    let (to_clients, queue) = mpsc::channel(QUEUE);
    let back = tokio::spawn(deliver(listen.clone(), queue));
    let mut sessions: HashMap<SocketAddr, mpsc::Sender<(Instant, Vec<u8>, SocketAddr)>> =
        HashMap::new();
    let mut tasks = Vec::new();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let due = |delay_ms: &AtomicU64| {
        Instant::now() + Duration::from_millis(delay_ms.load(Ordering::Relaxed))
    };
    loop {
        let Ok((len, client)) = listen.recv_from(&mut buf).await else {
            break;
        };
        if let std::collections::hash_map::Entry::Vacant(vacant) = sessions.entry(client) {
            let bind = SocketAddr::new(listen.local_addr().map_or(upstream.ip(), |a| a.ip()), 0);
            let Ok(socket) = UdpSocket::bind(bind).await else {
                continue;
            };
            let socket = Arc::new(socket);
            let (tx, rx) = mpsc::channel(QUEUE);
            tasks.push(tokio::spawn(deliver(socket.clone(), rx)));
            // Replies from the replica go back to this client, delayed too.
            let (replies, delay, to_clients) =
                (socket.clone(), delay_ms.clone(), to_clients.clone());
            tasks.push(tokio::spawn(async move {
                let mut buf = vec![0u8; MAX_DATAGRAM];
                while let Ok((len, _)) = replies.recv_from(&mut buf).await {
                    let _ = to_clients.try_send((due(&delay), buf[..len].to_vec(), client));
                }
            }));
            vacant.insert(tx);
        }
        let _ = sessions[&client].try_send((due(&delay_ms), buf[..len].to_vec(), upstream));
    }
    back.abort();
    for task in tasks {
        task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn relays_both_ways_and_delays_when_told() {
        let server = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let upstream = server.local_addr().unwrap();
        let relay = Relay::start("127.0.0.1:0".parse().unwrap(), upstream)
            .await
            .unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let mut buf = [0u8; 16];

        client.send_to(b"ping", relay.addr).await.unwrap();
        let (n, from) = server.recv_from(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"ping");
        server.send_to(b"pong", from).await.unwrap();
        let (n, back) = client.recv_from(&mut buf).await.unwrap();
        assert_eq!((&buf[..n], back), (&b"pong"[..], relay.addr));

        relay.set_delay(Duration::from_millis(300));
        let sent = std::time::Instant::now();
        client.send_to(b"late", relay.addr).await.unwrap();
        let (n, _) = server.recv_from(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"late");
        // At least the delay (a lower bound; never an upper one).
        assert!(sent.elapsed() >= Duration::from_millis(300));
    }
}
