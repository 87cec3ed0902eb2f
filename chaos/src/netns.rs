//! The chaos harness's network: one Linux network namespace per node (its
//! agent and its backends), each joined by a veth pair to one bridge in the
//! root namespace, where the arbiters and the traffic generator run. Built
//! with `ip` (iproute2); needs root.
//!
//! Faults act on packets, not sockets: a crashed node's link is set down
//! (its packets are dropped, so connects time out instead of being reset);
//! a partition points the node's neighbour entries for the cut addresses at
//! a hardware address nobody has (packets vanish, no error anywhere). Every name carries the run's id,
//! and `teardown` (also on drop) removes the namespaces and the bridge, so a
//! stopped or failed run leaves nothing behind.

use std::net::Ipv4Addr;
use std::process::Command;

/// Why the network could not be built or changed.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// `ip` could not be run.
    #[error("running `ip {args}`: {source} (the chaos harness needs iproute2 and root)")]
    Spawn {
        /// Its arguments.
        args: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// `ip` refused.
    #[error("`ip {args}` failed: {stderr}")]
    Failed {
        /// Its arguments.
        args: String,
        /// What it printed.
        stderr: String,
    },
    /// The run id or node count cannot name interfaces.
    #[error("{0}")]
    Invalid(String),
}

/// A locally administered hardware address no interface has.
const NOWHERE_MAC: &str = "02:00:00:00:de:ad";

/// One node's namespace.
#[derive(Clone, Debug)]
pub struct NodeNet {
    /// The node id (the agent's `node_id`).
    pub node: String,
    /// The namespace's name.
    pub netns: String,
    /// The node's address on the bridge.
    pub ip: Ipv4Addr,
    /// The host end of its veth pair (in the root namespace).
    veth_host: String,
    /// The node end (in its namespace).
    veth_node: String,
}

/// The bridge and every node's namespace of one run.
#[derive(Debug)]
pub struct Topology {
    run: String,
    bridge: String,
    /// The root namespace's address on the bridge (arbiters listen here).
    pub host_ip: Ipv4Addr,
    /// The nodes, in the order given.
    pub nodes: Vec<NodeNet>,
    /// The kernel's neighbour-table limits before `create` raised them, to
    /// put back at teardown.
    raised: Option<NeighbourLimits>,
    torn_down: bool,
}

/// `net.ipv4.neigh.default.gc_thresh2` and `gc_thresh3`: how many
/// neighbour (ARP) entries the kernel keeps before it garbage-collects
/// (2) and the hard maximum (3). One table serves every namespace, and
/// the defaults (512 and 1,024) are sized for one host: 32 nodes that
/// each talk to every other hold about 32 × 38 entries, so the table is
/// full, a node whose entries were flushed (its link went down) cannot
/// resolve its peers until old entries age out, and its arbiter session
/// and connections stall for seconds (what the 32-agent runs measured as
/// a restarted agent's 7 s handshake before the harness raised these).
/// Real hosts each have their own table, so the harness gives the shared
/// one room for all of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct NeighbourLimits {
    gc_thresh2: u64,
    gc_thresh3: u64,
}

const NEIGH_DIR: &str = "/proc/sys/net/ipv4/neigh/default";

impl NeighbourLimits {
    fn read() -> Option<NeighbourLimits> {
        let get = |name: &str| {
            std::fs::read_to_string(format!("{NEIGH_DIR}/{name}"))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        Some(NeighbourLimits {
            gc_thresh2: get("gc_thresh2")?,
            gc_thresh3: get("gc_thresh3")?,
        })
    }

    fn write(self) -> Result<(), NetError> {
        // Raise the maximum first and lower it last, so 2 ≤ 3 throughout.
        let order = [
            ("gc_thresh3", self.gc_thresh3),
            ("gc_thresh2", self.gc_thresh2),
        ];
        for (name, value) in order {
            let path = format!("{NEIGH_DIR}/{name}");
            std::fs::write(&path, value.to_string()).map_err(|e| NetError::Failed {
                args: format!("write {value} to {path}"),
                stderr: e.to_string(),
            })?;
        }
        Ok(())
    }

    /// Room for `nodes` namespaces that each reach every other node and a
    /// few host addresses, twice over; `None` when the current limits
    /// already give it (nothing to raise or restore).
    fn raise_for(nodes: usize) -> Result<Option<NeighbourLimits>, NetError> {
        let Some(current) = NeighbourLimits::read() else {
            return Ok(None);
        };
        let n = nodes as u64 + 1;
        let needed = 2 * n * (n + 8);
        if current.gc_thresh3 >= needed {
            return Ok(None);
        }
        NeighbourLimits {
            gc_thresh2: current.gc_thresh2.max(needed / 2),
            gc_thresh3: needed,
        }
        .write()?;
        Ok(Some(current))
    }
}

/// Runs `ip` with `args`.
fn ip(args: &[&str]) -> Result<(), NetError> {
    let joined = args.join(" ");
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|source| NetError::Spawn {
            args: joined.clone(),
            source,
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(NetError::Failed {
            args: joined,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

impl Topology {
    /// Builds the bridge `rc<run>b` on 10.`subnet`.0.1/24 and one namespace
    /// per node (`rc<run>-<i>`, address 10.`subnet`.0.(10 + i)). `run` is 1
    /// to 6 lowercase letters or digits, unique among runs on this machine;
    /// `subnet` picks the /24 (pick one no other network here uses).
    pub fn create(run: &str, subnet: u8, nodes: &[String]) -> Result<Topology, NetError> {
        if run.is_empty()
            || run.len() > 6
            || !run
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        {
            return Err(NetError::Invalid(format!(
                "run id {run:?}: use 1 to 6 lowercase letters or digits (it names interfaces of at most 15 characters)"
            )));
        }
        if nodes.len() > 200 {
            return Err(NetError::Invalid(format!(
                "{} nodes: at most 200 fit one /24",
                nodes.len()
            )));
        }
        let bridge = format!("rc{run}b");
        let host_ip = Ipv4Addr::new(10, subnet, 0, 1);
        let mut topology = Topology {
            run: run.to_owned(),
            bridge: bridge.clone(),
            host_ip,
            nodes: Vec::new(),
            raised: None,
            torn_down: false,
        };
        topology.raised = NeighbourLimits::raise_for(nodes.len())?;
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        ip(&["addr", "add", &format!("{host_ip}/24"), "dev", &bridge])?;
        ip(&["link", "set", &bridge, "up"])?;
        for (i, node) in nodes.iter().enumerate() {
            let netns = format!("rc{run}-{i}");
            let veth_host = format!("rc{run}h{i}");
            let veth_node = format!("rc{run}n{i}");
            let node_ip = Ipv4Addr::new(10, subnet, 0, 10 + i as u8);
            ip(&["netns", "add", &netns])?;
            topology.nodes.push(NodeNet {
                node: node.clone(),
                netns: netns.clone(),
                ip: node_ip,
                veth_host: veth_host.clone(),
                veth_node: veth_node.clone(),
            });
            ip(&[
                "link", "add", &veth_host, "type", "veth", "peer", "name", &veth_node,
            ])?;
            ip(&["link", "set", &veth_node, "netns", &netns])?;
            ip(&["link", "set", &veth_host, "master", &bridge])?;
            ip(&["link", "set", &veth_host, "up"])?;
            let inside = |args: &[&str]| {
                let mut full = vec!["-n", netns.as_str()];
                full.extend_from_slice(args);
                ip(&full)
            };
            inside(&["addr", "add", &format!("{node_ip}/24"), "dev", &veth_node])?;
            inside(&["link", "set", &veth_node, "up"])?;
            inside(&["link", "set", "lo", "up"])?;
        }
        Ok(topology)
    }

    /// Adds 10.`subnet`.0.`last` to the bridge, another root-namespace
    /// address (the traffic generator sends from one the arbiters do not
    /// listen on, so cutting a node from the arbiters leaves its traffic).
    pub fn add_host_ip(&self, last: u8) -> Result<Ipv4Addr, NetError> {
        let [a, b, c, _] = self.host_ip.octets();
        let addr = Ipv4Addr::new(a, b, c, last);
        ip(&["addr", "add", &format!("{addr}/24"), "dev", &self.bridge])?;
        Ok(addr)
    }

    /// The run id.
    pub fn run(&self) -> &str {
        &self.run
    }

    /// A command that runs `program` inside node `i`'s namespace.
    pub fn command(&self, i: usize, program: &str) -> Command {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.nodes[i].netns])
            .arg(program);
        command
    }

    /// Drops every packet to and from node `i` (a crash, as the network
    /// sees it: no reset, connects time out), or restores it.
    pub fn set_link(&self, i: usize, up: bool) -> Result<(), NetError> {
        let state = if up { "up" } else { "down" };
        ip(&["link", "set", &self.nodes[i].veth_host, state])
    }

    /// Node `i`'s packets to the addresses `to` (on the bridge) go to a
    /// hardware address nobody has, so they vanish without an error: a
    /// partition between the node and those addresses, in both directions
    /// for any exchange the node starts (an agent's arbiter session).
    pub fn cut(&self, i: usize, to: &[Ipv4Addr]) -> Result<(), NetError> {
        let node = &self.nodes[i];
        for addr in to {
            ip(&[
                "-n",
                &node.netns,
                "neigh",
                "replace",
                &addr.to_string(),
                "lladdr",
                NOWHERE_MAC,
                "dev",
                &node.veth_node,
                "nud",
                "permanent",
            ])?;
        }
        Ok(())
    }

    /// Undoes `cut` for `to`.
    pub fn heal(&self, i: usize, to: &[Ipv4Addr]) -> Result<(), NetError> {
        let node = &self.nodes[i];
        for addr in to {
            let _ = ip(&[
                "-n",
                &node.netns,
                "neigh",
                "del",
                &addr.to_string(),
                "dev",
                &node.veth_node,
            ]);
        }
        Ok(())
    }

    /// Removes every namespace and the bridge. Idempotent; errors are
    /// ignored (a half-built topology is torn down as far as it exists).
    pub fn teardown(&mut self) {
        if self.torn_down {
            return;
        }
        self.torn_down = true;
        for node in &self.nodes {
            // Deleting the namespace deletes its veth end and so the pair.
            let _ = ip(&["netns", "del", &node.netns]);
            let _ = ip(&["link", "del", &node.veth_host]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
        if let Some(limits) = self.raised.take() {
            let _ = limits.write();
        }
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// Whether this process can build namespaces (runs as root).
pub fn have_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exists(kind: &[&str], name: &str) -> bool {
        let out = Command::new("ip").args(kind).output().unwrap();
        String::from_utf8_lossy(&out.stdout).contains(name)
    }

    #[test]
    fn bad_run_ids_are_refused_before_anything_is_built() {
        for run in ["", "UPPER", "toolongid", "a-b"] {
            let err = Topology::create(run, 250, &[]).unwrap_err();
            assert!(err.to_string().contains("run id"), "{err}");
        }
    }

    /// Needs root, which CI has (the chaos harness cannot run without it).
    #[test]
    fn nodes_reach_the_host_until_their_link_is_cut_and_teardown_removes_everything() {
        assert!(
            have_root(),
            "the chaos harness tests need root (CI runs as root)"
        );
        let nodes = vec!["node-a".to_owned(), "node-b".to_owned()];
        let mut topology = Topology::create("t1", 251, &nodes).unwrap();
        let host = topology.host_ip;
        let listener = std::net::TcpListener::bind((host, 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        // A node connects to the host over the bridge (bash's /dev/tcp: no
        // client tools needed in the namespace).
        let connect = |i: usize| {
            topology
                .command(i, "timeout")
                .args([
                    "2",
                    "bash",
                    "-c",
                    &format!("exec 3<>/dev/tcp/{host}/{port}"),
                ])
                .status()
                .unwrap()
                .success()
        };
        assert!(connect(0), "node-a reaches the host");
        topology.cut(0, &[host]).unwrap();
        assert!(!connect(0), "a cut node's packets to the host are dropped");
        topology.heal(0, &[host]).unwrap();
        assert!(connect(0), "healed");
        topology.set_link(1, false).unwrap();
        assert!(!connect(1), "a crashed node's link drops its packets");
        topology.set_link(1, true).unwrap();
        // A link set up again may take a moment to forward (the bridge port
        // and the neighbour entry come back); a bounded wait, not a sleep.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !connect(1) {
            assert!(
                std::time::Instant::now() < deadline,
                "a node whose link is up again reaches the host"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }

        topology.teardown();
        assert!(!exists(&["netns", "list"], "rct1-0"));
        assert!(!exists(&["link", "show"], "rct1b"));
    }
}
