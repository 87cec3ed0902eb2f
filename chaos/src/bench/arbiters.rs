//! The arbiters a fleet bench loads, and the processes it watches: a
//! group it starts itself (`--spawn N`: real `rollcall arbiter`
//! processes on loopback, with their redb stores and fsync, stopped at
//! the end) or one it is pointed at (`--arbiter ADDR`); CPU time and
//! resident memory of every process sampled from `/proc`; the arbiter's
//! own metrics read from its admin endpoint.

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rollcall_leases::identity::Identity;
use rollcall_leases::tls::{self, Ca};
use rollcall_leases::{Label, PrincipalName, Role};
use serde::{Deserialize, Serialize};

use super::records::now_us;
use super::BenchError;

/// One arbiter replica the bench talks to.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Replica {
    /// Its QUIC address, as agents dial it.
    pub quic: String,
    /// Its admin endpoint, when known (`/metrics`).
    pub admin: Option<SocketAddr>,
    /// Its process, when on this machine and found.
    pub pid: Option<u32>,
}

/// A process started by the bench; killed if still running when dropped.
pub struct Started {
    /// What it is (`arbiter-1`, `worker-0`).
    pub name: String,
    /// The process.
    pub child: Child,
}

impl Drop for Started {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BenchError {
    let what = what.into();
    move |source| BenchError::Io { what, source }
}

/// A free port on 127.0.0.1 for a TCP listener.
fn free_tcp() -> Result<SocketAddr, BenchError> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(io("finding a free TCP port"))
}

/// A free port on 127.0.0.1 for a UDP socket.
fn free_udp() -> Result<SocketAddr, BenchError> {
    UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map_err(io("finding a free UDP port"))
}

/// Makes a region CA in `certs` and a certificate for each of `n`
/// replicas, as `rollcall certs` does.
pub fn make_certs(certs: &Path, n: usize) -> Result<Ca, BenchError> {
    std::fs::create_dir_all(certs).map_err(io(format!("creating {}", certs.display())))?;
    let region = Label::new("r1").expect("valid region");
    let ca = Ca::generate(&region).map_err(|e| BenchError::Tls(e.to_string()))?;
    ca.write(certs)
        .map_err(|e| BenchError::Tls(e.to_string()))?;
    for k in 1..=n {
        let identity = Identity::new(
            region.clone(),
            Role::Arbiter,
            PrincipalName::new(&format!("arbiter-{k}")).expect("valid name"),
        );
        let issued = ca
            .issue(&identity, &[], &[])
            .map_err(|e| BenchError::Tls(e.to_string()))?;
        tls::write_bundle(certs, &tls::bundle_name(&identity), &issued)
            .map_err(|e| BenchError::Tls(e.to_string()))?;
    }
    Ok(ca)
}

/// Starts `n` arbiter replicas (one Raft group when `n` > 1) of the binary
/// `binary` in `work`, each with its config, data directory and log; the
/// arbiters' defaults are what is measured.
pub fn spawn(
    binary: &Path,
    work: &Path,
    certs: &Path,
    n: usize,
) -> Result<(Vec<Replica>, Vec<Started>), BenchError> {
    let mut addrs = Vec::with_capacity(n);
    for _ in 0..n {
        addrs.push((free_udp()?, free_tcp()?));
    }
    let replicas_toml: String = if n == 1 {
        String::new()
    } else {
        addrs
            .iter()
            .enumerate()
            .map(|(k, (quic, _))| format!("[[raft.replicas]]\nid = {}\naddr = \"{quic}\"\n", k + 1))
            .collect()
    };
    let mut replicas = Vec::with_capacity(n);
    let mut started = Vec::with_capacity(n);
    for (k, (quic, admin)) in addrs.into_iter().enumerate() {
        let id = k + 1;
        let name = format!("arbiter-{id}");
        let toml = format!(
            "name = \"{name}\"\nlisten = \"{quic}\"\nadmin = \"{admin}\"\ndata_dir = \"{data}\"\n[tls]\nca = \"{c}/ca.crt\"\ncert = \"{c}/arbiter-arbiter-{id}.crt\"\nkey = \"{c}/arbiter-arbiter-{id}.key\"\n[raft]\nid = {id}\n{replicas_toml}",
            data = work.join(&name).display(),
            c = certs.display(),
        );
        let config = work.join(format!("{name}.toml"));
        std::fs::write(&config, toml).map_err(io(format!("writing {}", config.display())))?;
        let log = std::fs::File::create(work.join(format!("{name}.log")))
            .map_err(io(format!("creating {name}.log")))?;
        let child = Command::new(binary)
            .arg("arbiter")
            .arg("--config")
            .arg(&config)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(io(format!("starting {name}")))?;
        replicas.push(Replica {
            quic: quic.to_string(),
            admin: Some(admin),
            pid: Some(child.id()),
        });
        started.push(Started { name, child });
    }
    Ok((replicas, started))
}

/// Waits until every replica's admin endpoint answers and one of them
/// leads, so the first write commits (bounded: a group that does not come
/// up is an error naming the log to read).
pub async fn wait_ready(
    http: &reqwest::Client,
    replicas: &[Replica],
    work: &Path,
) -> Result<(), BenchError> {
    let until = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut up = 0;
        let mut leader = false;
        for r in replicas {
            let Some(admin) = r.admin else {
                continue;
            };
            if let Ok(text) = metrics_text(http, admin).await {
                up += 1;
                leader |= metric(&text, "rollcall_arbiter_raft_is_leader").unwrap_or(0.0) > 0.0;
            }
        }
        if up == replicas.len() && leader {
            return Ok(());
        }
        if std::time::Instant::now() > until {
            return Err(BenchError::Arbiter(format!(
                "the arbiter group did not come up within 60 s ({up} of {} replicas answer, leader: {leader}); see {}/arbiter-*.log",
                replicas.len(),
                work.display()
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Stops the replicas the bench started: SIGTERM (a graceful stop), then
/// a kill after 10 s.
pub async fn stop(started: &mut [Started]) {
    for s in started.iter() {
        let _ = Command::new("kill")
            .args(["-TERM", &s.child.id().to_string()])
            .stderr(Stdio::null())
            .status();
    }
    let until = std::time::Instant::now() + Duration::from_secs(10);
    for s in started.iter_mut() {
        while matches!(s.child.try_wait(), Ok(None)) && std::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The arbiter's `/metrics` text.
pub async fn metrics_text(http: &reqwest::Client, admin: SocketAddr) -> Result<String, String> {
    let url = format!("http://{admin}/metrics");
    let response = http
        .get(&url)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !response.status().is_success() {
        return Err(format!("{url}: {}", response.status()));
    }
    response.text().await.map_err(|e| e.to_string())
}

/// The value of an unlabelled metric in Prometheus text, or of the sum of
/// a histogram's `_sum`/`_count` lines when `name` names one of those.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (key, value) = l.rsplit_once(' ')?;
        (key == name).then(|| value.parse().ok()).flatten()
    })
}

/// The sockets bound to UDP `port` on this machine (loopback or any
/// address), from `/proc/net/udp{,6}`: each one's inode and the
/// datagrams the kernel dropped at it since it was bound (its receive
/// buffer was full).
fn udp_sockets(port: u16) -> Vec<(String, u64)> {
    let mut found = Vec::new();
    for table in ["/proc/net/udp", "/proc/net/udp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let Some((_, hex_port)) = fields.get(1).and_then(|l| l.rsplit_once(':')) else {
                continue;
            };
            if u16::from_str_radix(hex_port, 16).ok() != Some(port) {
                continue;
            }
            if let Some(inode) = fields.get(9) {
                let drops = fields.get(12).and_then(|d| d.parse().ok()).unwrap_or(0);
                found.push(((*inode).to_owned(), drops));
            }
        }
    }
    found
}

/// Datagrams the kernel dropped at the sockets bound to UDP `port` on
/// this machine since they were bound; `None` when none is found
/// (another machine).
pub fn udp_drops(port: u16) -> Option<u64> {
    let sockets = udp_sockets(port);
    (!sockets.is_empty()).then(|| sockets.iter().map(|(_, d)| d).sum())
}

/// The pid of the process on this machine bound to UDP `port` on
/// loopback or any address, found through `/proc/net/udp{,6}` and the
/// processes' socket links; `None` when not found (another machine, or
/// another user's process).
pub fn pid_of_udp_port(port: u16) -> Option<u32> {
    let inodes: Vec<String> = udp_sockets(port)
        .into_iter()
        .map(|(inode, _)| format!("socket:[{inode}]"))
        .collect();
    if inodes.is_empty() {
        return None;
    }
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(link) = std::fs::read_link(fd.path()) {
                if inodes.iter().any(|i| link.as_os_str() == i.as_str()) {
                    return Some(pid);
                }
            }
        }
    }
    None
}

/// One reading of a process.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reading {
    /// When, wall µs.
    pub at_us: u64,
    /// User + system CPU time so far, in clock ticks of `USER_HZ`.
    pub cpu_ticks: u64,
    /// Resident memory, KiB.
    pub rss_kib: u64,
}

/// The kernel's `USER_HZ`, the unit of `/proc/<pid>/stat`'s CPU times:
/// 100 on every Linux architecture rollcall runs on.
pub const USER_HZ: f64 = 100.0;

/// One reading of `pid`, or `None` once it is gone.
pub fn read(pid: u32) -> Option<Reading> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces: fields count from after its ')'.
    let after = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Some(Reading {
        at_us: now_us(),
        cpu_ticks: utime + stime,
        rss_kib,
    })
}

/// Every reading of one watched process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Watched {
    /// What it is (`arbiter-1`, `worker-0`).
    pub name: String,
    /// Its pid.
    pub pid: u32,
    /// Its readings, in time order.
    pub readings: Vec<Reading>,
}

/// Samples watched processes every `every` until dropped.
pub struct Sampler {
    watched: Arc<Mutex<Vec<Watched>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    /// Starts sampling (no process yet).
    pub fn start(every: Duration) -> Sampler {
        let watched: Arc<Mutex<Vec<Watched>>> = Arc::default();
        let shared = watched.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                let mut w = shared.lock().expect("sampler lock");
                for process in w.iter_mut() {
                    if let Some(reading) = read(process.pid) {
                        process.readings.push(reading);
                    }
                }
            }
        });
        Sampler { watched, task }
    }

    /// Watches `pid` from now on.
    pub fn watch(&self, name: &str, pid: u32) {
        let first = read(pid).into_iter().collect();
        self.watched.lock().expect("sampler lock").push(Watched {
            name: name.to_owned(),
            pid,
            readings: first,
        });
    }

    /// Reads every process once more now (a phase boundary).
    pub fn mark(&self) {
        let mut w = self.watched.lock().expect("sampler lock");
        for process in w.iter_mut() {
            if let Some(reading) = read(process.pid) {
                process.readings.push(reading);
            }
        }
    }

    /// Stops sampling; every reading taken.
    pub fn finish(self) -> Vec<Watched> {
        self.task.abort();
        std::mem::take(&mut *self.watched.lock().expect("sampler lock"))
    }
}

/// Where a spawned group's files are.
pub fn certs_dir(work: &Path) -> PathBuf {
    work.join("certs")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_reads_itself() {
        let me = read(std::process::id()).expect("our own /proc entry");
        assert!(me.rss_kib > 0);
    }

    #[test]
    fn a_bound_udp_port_leads_to_its_process() {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = socket.local_addr().unwrap().port();
        assert_eq!(pid_of_udp_port(port), Some(std::process::id()));
    }

    #[test]
    fn metrics_are_read_by_exact_name() {
        let text =
            "# HELP x\nrollcall_arbiter_commits_total 42\nrollcall_arbiter_commits_total_x 1\n";
        assert_eq!(metric(text, "rollcall_arbiter_commits_total"), Some(42.0));
        assert_eq!(metric(text, "rollcall_arbiter_missing"), None);
    }
}
