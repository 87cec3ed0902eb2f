//! The open-loop traffic generator: opens new connections through every
//! agent's TCP proxy at a fixed rate, whatever happens to earlier ones (a
//! slow or failing path never slows the offered load down), and records
//! each: when it was opened, through which agent, which backend answered
//! (the echo backend's first line), and whether it failed.
//!
//! Bounded: it stops when told or after `max_duration`, opens at most
//! `rate × max_duration` connections per target, and gives each at most
//! `connect_timeout` to answer.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::sync::watch;

use crate::timeline::{Conn, Outcome};

/// One agent's proxy listener.
#[derive(Clone, Debug)]
pub struct Target {
    /// The agent's node id.
    pub agent: String,
    /// Its proxy's address.
    pub addr: SocketAddr,
}

/// How the generator runs.
#[derive(Clone, Debug)]
pub struct TrafficConfig {
    /// New connections per second, per target.
    pub rate_per_target: f64,
    /// How long a connection may take to deliver the backend's id.
    pub connect_timeout: Duration,
    /// Local address to open connections from (`None`: any).
    pub bind: Option<IpAddr>,
    /// Longest run; the generator stops by itself after it.
    pub max_duration: Duration,
}

/// A running generator.
pub struct Traffic {
    conns: Arc<Mutex<Vec<Conn>>>,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Traffic {
    /// Starts offering load to every target; times are recorded relative to
    /// `t0` (the run's start).
    pub fn start(targets: Vec<Target>, config: TrafficConfig, t0: Instant) -> Traffic {
        let conns = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = watch::channel(false);
        let tasks = targets
            .into_iter()
            .map(|target| {
                tokio::spawn(offer(
                    target,
                    config.clone(),
                    t0,
                    conns.clone(),
                    stopped.clone(),
                ))
            })
            .collect();
        Traffic { conns, stop, tasks }
    }

    /// Connections recorded so far (those still waiting for an answer are
    /// not yet among them).
    pub fn snapshot(&self) -> Vec<Conn> {
        self.conns.lock().expect("conns lock").clone()
    }

    /// Stops opening connections, waits for those in flight (at most one
    /// connect timeout) and returns every record ordered by opening time.
    pub async fn stop(self) -> Vec<Conn> {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
        let mut conns = std::mem::take(&mut *self.conns.lock().expect("conns lock"));
        conns.sort_by_key(|c| c.t_ms);
        conns
    }
}

/// One target's loop: a connection every 1/rate seconds until stopped.
async fn offer(
    target: Target,
    config: TrafficConfig,
    t0: Instant,
    conns: Arc<Mutex<Vec<Conn>>>,
    mut stopped: watch::Receiver<bool>,
) {
    let period = Duration::from_secs_f64(1.0 / config.rate_per_target.max(0.001));
    let limit = (config.max_duration.as_secs_f64() * config.rate_per_target).ceil() as u64 + 1;
    let deadline = tokio::time::Instant::now() + config.max_duration;
    let mut tick = tokio::time::interval(period);
    // Open loop: a late tick is not made up in a burst, nor does it delay
    // the schedule after it.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut in_flight = tokio::task::JoinSet::new();
    let mut opened = 0u64;
    while opened < limit {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stopped.changed() => break,
            _ = tokio::time::sleep_until(deadline) => break,
        }
        if *stopped.borrow() {
            break;
        }
        opened += 1;
        let t_ms = t0.elapsed().as_millis() as u64;
        let (target, config, conns) = (target.clone(), config.clone(), conns.clone());
        in_flight.spawn(async move {
            let backend = ask(target.addr, config.bind, config.connect_timeout).await;
            let outcome = if backend.is_some() {
                Outcome::Answered
            } else {
                Outcome::Failed
            };
            conns.lock().expect("conns lock").push(Conn {
                t_ms,
                agent: target.agent,
                backend,
                outcome,
            });
        });
        // Reap finished connections as we go, so the set stays small.
        while in_flight.try_join_next().is_some() {}
    }
    while in_flight.join_next().await.is_some() {}
}

/// Opens one connection from `bind` to `addr` and reads the backend's id
/// line; `None` on any failure or after `timeout`.
pub(crate) async fn ask(
    addr: SocketAddr,
    bind: Option<IpAddr>,
    timeout: Duration,
) -> Option<String> {
    let exchange = async {
        let socket = match addr {
            SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4().ok()?,
            SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6().ok()?,
        };
        if let Some(ip) = bind {
            socket.bind(SocketAddr::new(ip, 0)).ok()?;
        }
        let mut stream = socket.connect(addr).await.ok()?;
        // Closed with a reset, not a FIN: a socket bound to `bind` before
        // connecting takes a local port no other socket of that address
        // holds, and a client that closes first keeps its port in TIME_WAIT
        // for 60 s. At 32 agents × 18 connections/s that is 34,000 ports,
        // more than the kernel's 28,232, and then every connect failed for
        // seconds at a time (a full run from f8b2736: 114,721 failed).
        let _ = stream.set_zero_linger();
        let mut buf = Vec::with_capacity(64);
        let mut byte = [0u8; 1];
        while buf.len() < 256 {
            match stream.read(&mut byte).await {
                Ok(1) if byte[0] == b'\n' => break,
                Ok(1) => buf.push(byte[0]),
                _ => return None,
            }
        }
        String::from_utf8(buf).ok().filter(|id| !id.is_empty())
    };
    tokio::time::timeout(timeout, exchange).await.ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn records_answers_and_failures_at_the_offered_rate() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let live = listener.local_addr().unwrap();
        let server = tokio::spawn(crate::echo::serve_on(listener, "web-1".into(), false));
        let dead = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let config = TrafficConfig {
            rate_per_target: 50.0,
            connect_timeout: Duration::from_millis(500),
            bind: None,
            max_duration: Duration::from_secs(10),
        };
        let t0 = Instant::now();
        let traffic = Traffic::start(
            vec![
                Target {
                    agent: "a".into(),
                    addr: live,
                },
                Target {
                    agent: "b".into(),
                    addr: dead,
                },
            ],
            config,
            t0,
        );
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        let conns = traffic.stop().await;
        server.abort();
        let of = |agent: &str| {
            conns
                .iter()
                .filter(|c| c.agent == agent)
                .collect::<Vec<_>>()
        };
        let (a, b) = (of("a"), of("b"));
        // About 50 each in one second; loose bounds, this is not a timing test.
        assert!(a.len() >= 10 && a.len() <= 60, "{} through a", a.len());
        assert!(b.len() >= 10 && b.len() <= 60, "{} through b", b.len());
        assert!(a
            .iter()
            .all(|c| c.outcome == Outcome::Answered && c.backend.as_deref() == Some("web-1")));
        assert!(b
            .iter()
            .all(|c| c.outcome == Outcome::Failed && c.backend.is_none()));
        assert!(conns.windows(2).all(|w| w[0].t_ms <= w[1].t_ms));
    }

    #[tokio::test]
    async fn stops_by_itself_after_its_longest_run() {
        let dead = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let config = TrafficConfig {
            rate_per_target: 20.0,
            connect_timeout: Duration::from_millis(100),
            bind: None,
            max_duration: Duration::from_millis(300),
        };
        let traffic = Traffic::start(
            vec![Target {
                agent: "a".into(),
                addr: dead,
            }],
            config,
            Instant::now(),
        );
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        let before = traffic.snapshot().len();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            traffic.snapshot().len(),
            before,
            "nothing opened after the limit"
        );
        assert!(before <= 8, "at most rate x duration + 1: {before}");
        let _ = traffic.stop().await;
    }
}
