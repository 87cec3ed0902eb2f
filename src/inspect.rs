//! The read-only commands an operator runs against a node agent's local
//! API (issue 37): `status`, `members`, `services` and `resolve`. Each
//! fetches one answer (`/v1/status`, `/v1/services`, `/v1/endpoints/…`)
//! and renders it as a table; the rendering is pure, so it is tested
//! without an agent. Nothing here writes, and nothing needs a token: the
//! agent's reads are open to anyone on its host.

use std::fmt::Write as _;

use rollcall_leases::ServiceKey;
use rollcall_node::api_types::{EndpointsResponse, GossipStatus, ServicesResponse, StatusResponse};
use serde::de::DeserializeOwned;

/// Why a command got no answer it could show.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// Nothing answered at the address.
    #[error("cannot reach the agent at {url}: {source}; is it running? (pass --agent URL, or run this where `rollcall dev` runs, or pass its --data-dir)")]
    Unreachable {
        /// What was asked.
        url: String,
        /// The transport's error.
        source: reqwest::Error,
    },
    /// The agent answered with an error.
    #[error("the agent answered {status} ({code}): {detail}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The JSON error's `error` code.
        code: String,
        /// Its `detail`.
        detail: String,
    },
    /// The answer is not what this command expects (another program on
    /// that port, or an agent of another version).
    #[error("{url} answered something that is not the agent's {what}: {detail}")]
    Malformed {
        /// What was asked.
        url: String,
        /// The answer expected.
        what: &'static str,
        /// The decoder's complaint.
        detail: String,
    },
}

/// A node agent's local HTTP API, for reads.
#[derive(Clone, Debug)]
pub struct AgentApi {
    base: String,
    client: reqwest::Client,
}

/// What `resolve` asks for.
#[derive(Clone, Debug)]
pub struct ResolveQuery {
    /// The service.
    pub service: ServiceKey,
    /// Every record, whatever its state (`all=true`), not only the
    /// endpoints a caller would be given.
    pub all: bool,
}

impl AgentApi {
    /// The API at `base` (`http://host:port`).
    pub fn new(base: &str) -> AgentApi {
        AgentApi {
            base: base.trim_end_matches('/').to_owned(),
            client: reqwest::Client::new(),
        }
    }

    async fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
        what: &'static str,
    ) -> Result<T, InspectError> {
        // Every value is a validated label or an index of hex digits:
        // nothing to percent-encode.
        let mut url = format!("{}{path}", self.base);
        for (n, (name, value)) in query.iter().enumerate() {
            let _ = write!(url, "{}{name}={value}", if n == 0 { '?' } else { '&' });
        }
        let response =
            self.client
                .get(&url)
                .send()
                .await
                .map_err(|source| InspectError::Unreachable {
                    url: url.clone(),
                    source,
                })?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|source| InspectError::Unreachable {
                url: url.clone(),
                source,
            })?;
        if !status.is_success() {
            let body: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            return Err(InspectError::Refused {
                status: status.as_u16(),
                code: body["error"].as_str().unwrap_or("?").to_owned(),
                detail: body["detail"]
                    .as_str()
                    .map_or_else(|| text.trim().to_owned(), str::to_owned),
            });
        }
        serde_json::from_str(&text).map_err(|e| InspectError::Malformed {
            url,
            what,
            detail: e.to_string(),
        })
    }

    /// `GET /v1/status`.
    pub async fn status(&self) -> Result<StatusResponse, InspectError> {
        self.get("/v1/status", &[], "status").await
    }

    /// `GET /v1/services`.
    pub async fn services(&self) -> Result<ServicesResponse, InspectError> {
        self.get("/v1/services", &[], "service list").await
    }

    /// `GET /v1/endpoints/{service}`; with `index`, a blocking query that
    /// answers once the answer differs from that index (or after the
    /// agent's default wait, with the same answer).
    pub async fn resolve(
        &self,
        q: &ResolveQuery,
        index: Option<&str>,
    ) -> Result<EndpointsResponse, InspectError> {
        let key = &q.service;
        let mut query = vec![
            ("namespace", key.namespace.to_string()),
            ("port_name", key.port_name.to_string()),
        ];
        if q.all {
            query.push(("all", "true".to_owned()));
        }
        if let Some(index) = index {
            query.push(("index", index.to_owned()));
        }
        let path = format!("/v1/endpoints/{}", key.service);
        self.get(&path, &query, "endpoint answer").await
    }
}

/// Columns aligned on the widest cell, two spaces apart; the first row is
/// the header.
fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut text = String::new();
    for row in rows {
        let mut line = String::new();
        for (cell, width) in row.iter().zip(&widths) {
            let _ = write!(line, "{cell:<width$}  ");
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.to_owned()
}

/// A duration in ms as an operator reads it.
fn age(ms: u64) -> String {
    match ms {
        0..=999 => format!("{ms} ms"),
        1_000..=119_999 => format!("{:.1} s", ms as f64 / 1_000.0),
        _ => format!("{} min", ms / 60_000),
    }
}

/// What `rollcall status` prints.
pub fn render_status(s: &StatusResponse) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "node     {} (zone {}, agent run {})",
        s.node, s.zone, s.agent_epoch
    );
    let a = &s.arbiter;
    let contact = match a.last_contact_ms {
        Some(0) if a.connected => "in session".to_owned(),
        Some(ms) => format!("last contact {} ago", age(ms)),
        None => "never reached".to_owned(),
    };
    let _ = writeln!(
        text,
        "arbiter  {} {} ({contact}), catalog {}",
        if a.connected {
            "connected to"
        } else {
            "NOT connected; last tried"
        },
        a.address.as_deref().unwrap_or("none yet"),
        a.catalog.as_deref().unwrap_or("not known yet"),
    );
    if let Some(reason) = &a.last_end {
        let _ = writeln!(text, "         last session ended: {reason}");
    }
    let _ = writeln!(
        text,
        "lease    {}",
        s.lease.map_or_else(
            || "none held".to_owned(),
            |l| format!("{} (ttl {})", l.id, age(l.ttl_ms))
        )
    );
    let _ = writeln!(text, "gossip   {}", gossip_line(s.gossip.as_ref()));
    let _ = writeln!(
        text,
        "writes   {} accepted here and not committed yet",
        s.pending_writes
    );
    if s.subscriptions.is_empty() {
        text.push_str("services none followed yet (a service is followed from its first lookup, or from agent.services)\n");
    } else {
        let _ = writeln!(text, "services {} followed:", s.subscriptions.len());
        let mut rows = vec![vec![
            "  SERVICE".to_owned(),
            "REVISION".to_owned(),
            "LAG".to_owned(),
            "STALE".to_owned(),
            "AGE".to_owned(),
        ]];
        for sub in &s.subscriptions {
            rows.push(vec![
                format!("  {}", sub.service),
                sub.revision.to_string(),
                sub.lag.to_string(),
                yes_no(sub.stale),
                age(sub.age_ms),
            ]);
        }
        text.push_str(&table(&rows));
    }
    text
}

fn gossip_line(gossip: Option<&GossipStatus>) -> String {
    match gossip {
        None => "off (no gossip.key_file): a silent node is found by its lease alone".to_owned(),
        Some(g) if g.alive.is_empty() && g.down.is_empty() => {
            "on, no other member of the zone heard of".to_owned()
        }
        Some(g) => format!(
            "on, {} other member(s) alive, {} down",
            g.alive.len(),
            g.down.len()
        ),
    }
}

/// What `rollcall members` prints: this node, then its zone's members as
/// its gossip sees them.
pub fn render_members(s: &StatusResponse) -> String {
    let Some(gossip) = &s.gossip else {
        return format!(
            "gossip is off on node {} (no gossip.key_file in its config): it knows no zone members; set gossip.key_file (from `rollcall gossip-key`) and gossip.seeds to join its zone\n",
            s.node
        );
    };
    let mut rows = vec![vec![
        "NODE".to_owned(),
        "ZONE".to_owned(),
        "STATUS".to_owned(),
    ]];
    rows.push(vec![
        s.node.to_string(),
        s.zone.to_string(),
        "alive (this node)".to_owned(),
    ]);
    for node in &gossip.alive {
        rows.push(vec![
            node.to_string(),
            s.zone.to_string(),
            "alive".to_owned(),
        ]);
    }
    for node in &gossip.down {
        rows.push(vec![
            node.to_string(),
            s.zone.to_string(),
            "down".to_owned(),
        ]);
    }
    table(&rows)
}

/// What `rollcall services` prints: the region's services as the arbiter
/// listed them, or (said on the first line) only the copies this agent
/// holds when the arbiter could not be asked.
pub fn render_services(list: &ServicesResponse) -> String {
    let held = list.source == "held";
    let mut text = String::new();
    if held {
        text.push_str(
            "the arbiter could not be asked: these are only the services this agent holds\n",
        );
    }
    if list.services.is_empty() {
        text.push_str(if held {
            "this agent holds no service (it follows a service from its first lookup, or from agent.services)\n"
        } else {
            "the region has no service this node may watch\n"
        });
        return text;
    }
    let mut rows = vec![vec![
        "SERVICE".to_owned(),
        "READY".to_owned(),
        "TOTAL".to_owned(),
        "REVISION".to_owned(),
        "STALE".to_owned(),
    ]];
    for s in &list.services {
        rows.push(vec![
            s.service.to_string(),
            s.ready.to_string(),
            s.total.to_string(),
            s.revision.to_string(),
            if s.stale {
                format!("yes ({} old)", age(s.age_ms))
            } else {
                "no".to_owned()
            },
        ]);
    }
    text.push_str(&table(&rows));
    if list.truncated {
        text.push_str("(more services than one answer lists; these are the first in key order)\n");
    }
    text
}

/// What `rollcall resolve` prints: a line about the answer, then one row
/// per endpoint.
pub fn render_endpoints(e: &EndpointsResponse) -> String {
    let mut text = format!(
        "{}/{}/{}  region {}  revision {}  mode {}",
        e.namespace, e.service, e.port_name, e.region, e.revision, e.mode
    );
    if e.stale {
        let _ = write!(text, "  STALE ({} old)", age(e.age_ms));
    }
    if e.degraded {
        let _ = write!(
            text,
            "  DEGRADED: {}",
            e.degraded_reason
                .as_deref()
                .unwrap_or("past its maximum age")
        );
    }
    text.push('\n');
    if let Some(f) = &e.failover {
        let _ = writeln!(text, "failover: {}", f.detail);
        if !f.ingress.is_empty() {
            let _ = writeln!(text, "ingress:  {}", f.ingress.join(", "));
        }
    }
    if e.endpoints.is_empty() {
        text.push_str("no endpoints\n");
        return text;
    }
    let mut rows = vec![vec![
        "INSTANCE".to_owned(),
        "ADDRESS".to_owned(),
        "ZONE".to_owned(),
        "STATE".to_owned(),
        "WEIGHT".to_owned(),
        "GENERATION".to_owned(),
        "VERSION".to_owned(),
    ]];
    for p in &e.endpoints {
        rows.push(vec![
            p.instance_id.to_string(),
            std::net::SocketAddr::new(p.address, p.port).to_string(),
            p.zone.to_string(),
            p.state.clone(),
            p.weight.to_string(),
            p.generation.to_string(),
            p.version.to_string(),
        ]);
    }
    text.push_str(&table(&rows));
    text
}

#[cfg(test)]
mod tests {
    use rollcall_leases::{Label, NodeId};
    use rollcall_node::api_types::{ArbiterStatus, ServiceJson};

    use super::*;

    fn status(gossip: Option<GossipStatus>) -> StatusResponse {
        StatusResponse {
            node: NodeId::new("node-a").unwrap(),
            zone: Label::new("z1").unwrap(),
            agent_epoch: 3,
            arbiter: ArbiterStatus {
                connected: false,
                address: Some("127.0.0.1:7072".into()),
                last_contact_ms: Some(2_500),
                catalog: None,
                last_end: Some("the arbiter closed the session".into()),
            },
            lease: None,
            subscriptions: Vec::new(),
            pending_writes: 2,
            gossip,
            tls: None,
        }
    }

    #[test]
    fn status_says_what_is_off_and_what_is_not_reached() {
        let text = render_status(&status(None));
        assert!(
            text.contains("NOT connected; last tried 127.0.0.1:7072 (last contact 2.5 s ago)"),
            "{text}"
        );
        assert!(
            text.contains("last session ended: the arbiter closed the session"),
            "{text}"
        );
        assert!(text.contains("gossip   off (no gossip.key_file)"), "{text}");
        assert!(text.contains("writes   2 accepted here"), "{text}");
        let alone = render_status(&status(Some(GossipStatus {
            alive: Vec::new(),
            down: Vec::new(),
        })));
        assert!(alone.contains("gossip   on, no other member"), "{alone}");
    }

    #[test]
    fn members_lists_this_node_first_then_alive_then_down() {
        let text = render_members(&status(Some(GossipStatus {
            alive: vec![NodeId::new("node-b").unwrap()],
            down: vec![NodeId::new("node-c").unwrap()],
        })));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "NODE    ZONE  STATUS",
                "node-a  z1    alive (this node)",
                "node-b  z1    alive",
                "node-c  z1    down",
            ]
        );
        assert!(render_members(&status(None)).starts_with("gossip is off on node node-a"));
    }

    #[test]
    fn services_are_a_table_with_counts() {
        let service = |stale| ServiceJson {
            service: "default/web/default".parse().unwrap(),
            revision: 12,
            ready: 1,
            total: 2,
            stale,
            age_ms: if stale { 61_000 } else { 0 },
        };
        let list = |source: &str, services| ServicesResponse {
            source: source.to_owned(),
            revision: (source == "catalog").then_some(40),
            truncated: false,
            services,
        };
        assert_eq!(
            render_services(&list("catalog", vec![service(false)])),
            "SERVICE              READY  TOTAL  REVISION  STALE\n\
             default/web/default  1      2      12        no\n"
        );
        assert_eq!(
            render_services(&list("held", vec![service(true)])),
            "the arbiter could not be asked: these are only the services this agent holds\n\
             SERVICE              READY  TOTAL  REVISION  STALE\n\
             default/web/default  1      2      12        yes (61.0 s old)\n"
        );
        assert!(render_services(&list("held", vec![])).ends_with("this agent holds no service (it follows a service from its first lookup, or from agent.services)\n"));
        assert_eq!(
            render_services(&list("catalog", vec![])),
            "the region has no service this node may watch\n"
        );
    }
}
