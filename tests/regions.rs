//! Issue 8, failover between regions (R9), with three real regions in one
//! process (`rollcall dev --regions 3`'s code): per region an arbiter, an
//! agent that is also the region's ingress gateway, and a region bridge,
//! the bridges talking QUIC with mutual TLS on loopback. Backends are real
//! TCP listeners; callers connect through r1's proxy or ask its resolve
//! API. Waits poll with a generous deadline and assert what happens, never
//! how fast.

#[path = "../node/tests/common/mod.rs"]
mod common;
#[path = "../node/tests/named/mod.rs"]
mod named;

use std::net::SocketAddr;

use common::{eventually, Http};
use named::{backend, line, through};
use rollcall::dev_regions::{DevRegions, RegionsOptions};
use rollcall_config::{ConnTraffic, ProxyEntry};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

/// One admin call to a region's arbiter with its operator token.
async fn admin(
    dev: &DevRegions,
    k: usize,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let arbiter = &dev.regions[k].arbiter;
    let token = std::fs::read_to_string(&arbiter.token_file).unwrap();
    let mut request = reqwest::Client::new()
        .request(method, format!("http://{}{path}", arbiter.admin_addr))
        .bearer_auth(token.trim());
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn apply(dev: &DevRegions, k: usize, policies: Value) -> (u16, Value) {
    admin(
        dev,
        k,
        reqwest::Method::PUT,
        "/v1/policies",
        Some(json!({ "policy": policies })),
    )
    .await
}

/// The resolve answer of `service` on r1's agent with `traffic`.
async fn resolve(r1: &Http, service: &str, traffic: ConnTraffic) -> Value {
    let (status, body) = r1
        .send(
            reqwest::Method::GET,
            &format!(
                "/v1/endpoints/{service}?namespace=shop&traffic={}",
                traffic.as_str()
            ),
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    body
}

/// Waits until r1's answer for `service` fails over to `region` (or, with
/// `None`, is refused), and returns it.
async fn wait_failover(
    r1: &Http,
    service: &str,
    traffic: ConnTraffic,
    region: Option<&str>,
) -> Value {
    eventually(
        &format!("{service} ({traffic:?}) failing over to {region:?}"),
        || async {
            let body = resolve(r1, service, traffic).await;
            let f = &body["failover"];
            let matches = match region {
                Some(r) => f["region"] == r && body["region"] == r,
                None => f.is_object() && f["region"].is_null(),
            };
            matches.then_some(body)
        },
    )
    .await
}

/// Asks `server` for the A records of `name` over UDP: the addresses
/// answered and the TXT records of the additional section.
async fn dns_a(server: SocketAddr, name: &str) -> (Vec<std::net::IpAddr>, Vec<String>) {
    use hickory_proto::op::{Message, Query};
    use hickory_proto::rr::{Name, RData, RecordType};
    let mut query = Message::query();
    query.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    query.metadata.recursion_desired = false;
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    socket
        .send_to(&query.to_vec().unwrap(), server)
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let (len, _) = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        socket.recv_from(&mut buf),
    )
    .await
    .expect("a DNS answer within 5 s")
    .unwrap();
    let answer = Message::from_vec(&buf[..len]).unwrap();
    let ips = answer
        .answers
        .iter()
        .filter_map(|r| r.data.ip_addr())
        .collect();
    let txt = answer
        .additionals
        .iter()
        .filter_map(|r| match &r.data {
            RData::TXT(t) => Some(t.to_string()),
            _ => None,
        })
        .collect();
    (ips, txt)
}

/// The IP of region `k`'s ingress gateway.
fn ingress_ip(dev: &DevRegions, k: usize) -> std::net::IpAddr {
    dev.regions[k].agent.ingress_addr.unwrap().ip()
}

fn register(service: &str, id: &str, port: u16) -> Value {
    json!({"service": service, "namespace": "shop", "instance_id": id, "address": "127.0.0.1", "port": port})
}

async fn put_instance(agent: &Http, body: Value) {
    let (status, answer) = agent
        .send(reqwest::Method::PUT, "/v1/agent/instances", Some(body))
        .await;
    assert_eq!(status, 200, "{answer}");
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn failover_follows_the_policy_freshness_and_single_writer_rules() {
    let dir = tempfile::tempdir().unwrap();
    let mut options =
        RegionsOptions::new(3, dir.path().to_path_buf(), "127.0.0.1:0".parse().unwrap());
    options.sync_interval_ms = 200;
    options.summary_max_age_ms = 3_000;
    options.proxies = vec![ProxyEntry {
        service: "shop/web/default".into(),
        listen: "127.0.0.1:0".parse().unwrap(),
        traffic: ConnTraffic::ReadWrite,
    }];
    let mut dev = DevRegions::start(options).await.unwrap();
    let agents: Vec<Http> = dev.regions.iter().map(|r| Http::of(&r.agent)).collect();
    for a in &agents {
        a.wait_connected().await;
    }
    let (r1, r2, r3) = (&agents[0], &agents[1], &agents[2]);
    let proxy = dev.regions[0].agent.proxies[0].local_addr;

    // Instances: web everywhere, search and ledger in r1 and r2, vault in
    // r1 and r3 only.
    let (web1, web1_task) = backend("web-r1").await;
    let (web2, _t) = backend("web-r2").await;
    let (web3, _t) = backend("web-r3").await;
    let (other, _t) = backend("other").await;
    put_instance(r1, register("web", "web-r1", web1)).await;
    put_instance(r2, register("web", "web-r2", web2)).await;
    put_instance(r3, register("web", "web-r3", web3)).await;
    for (agent, id) in [(r1, "search-r1"), (r2, "search-r2")] {
        put_instance(agent, register("search", id, other)).await;
    }
    for (agent, id) in [(r1, "ledger-r1"), (r2, "ledger-r2")] {
        put_instance(agent, register("ledger", id, other)).await;
    }
    for (agent, id) in [(r1, "vault-r1"), (r3, "vault-r3")] {
        put_instance(agent, register("vault", id, other)).await;
    }

    // Policies, all homed in r1.
    let web = json!({"service": "shop/web", "home_region": "r1", "cross_region": true,
        "failover_traffic": "all", "failover_order": ["r2", "r3"],
        // Each region can take all of r1's load (the default is half).
        "capacity_limits": {"r2": 1.0, "r3": 1.0}});
    let search = json!({"service": "shop/search", "home_region": "r1", "cross_region": false});
    let vault = json!({"service": "shop/vault", "home_region": "r1", "cross_region": true,
        "failover_traffic": "all", "failover_order": ["r2"], "data_boundary": ["r3"]});
    let ledger = json!({"service": "shop/ledger", "home_region": "r1", "cross_region": true,
        "failover_traffic": "all", "failover_order": ["r2"],
        "single_writer": {"owner": "r1"}});
    let (status, body) = apply(&dev, 0, json!([web, search, vault, ledger])).await;
    assert_eq!(status, 200, "{body}");
    let web_revision = body["policies"][0]["revision"].as_u64().unwrap();

    // A change attempted outside the home region is refused there.
    let (status, body) = apply(&dev, 1, json!([web])).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"], "not_home_region");

    // The policy reaches the other regions' agents (those following web).
    for (agent, region) in [(r2, "r2"), (r3, "r3")] {
        assert_eq!(agent.resolve("web?namespace=shop").await.0, 200);
        eventually(&format!("web's policy at {region}'s agent"), || async {
            let (_, body) = agent.send(reqwest::Method::GET, "/v1/regions", None).await;
            body["policies"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["policy"]["service"] == "shop/web" && p["home_revision"] == web_revision)
                .then_some(())
        })
        .await;
    }

    // Served locally while web-r1 is there.
    assert_eq!(through(proxy).await.as_deref(), Some("web-r1"));
    let body = resolve(r1, "web", ConnTraffic::ReadWrite).await;
    assert_eq!(body["region"], "r1");
    assert!(body.get("failover").is_none(), "{body}");

    // Drained: new connections fail over to r2's ingress, and come back
    // as soon as a local instance is READY again.
    let (status, body) = r1.drain("web-r1", "").await;
    assert_eq!(status, 200, "{body}");
    let body = wait_failover(r1, "web", ConnTraffic::ReadWrite, Some("r2")).await;
    assert_eq!(
        body["failover"]["ingress"][0],
        dev.regions[1].agent.ingress_addr.unwrap().to_string()
    );
    assert_eq!(through(proxy).await.as_deref(), Some("web-r2"));
    // Real DNS on r1's agent: r2's ingress, and a TXT record naming r2.
    let (ips, regions) = dns_a(dev.regions[0].agent.dns_addr, "web.shop.svc.rollcall.").await;
    assert_eq!(ips, vec![ingress_ip(&dev, 1)], "{regions:?}");
    assert_eq!(regions, vec!["rollcall-region=r2".to_owned()]);
    put_instance(r1, register("web", "web-r1b", web1)).await;
    eventually("web back on r1", || async {
        (through(proxy).await.as_deref() == Some("web-r1")).then_some(())
    })
    .await;

    // Killed (still READY in the catalog, its port refusing): the
    // connection fails over once every local connect failed.
    web1_task.abort();
    let _ = web1_task.await;
    eventually("a connection to a killed web-r1b failing over", || async {
        (through(proxy).await.as_deref() == Some("web-r2")).then_some(())
    })
    .await;

    // No failover when the policy forbids cross-region traffic.
    r1.drain("search-r1", "").await;
    let body = wait_failover(r1, "search", ConnTraffic::ReadOnly, None).await;
    assert_eq!(body["failover"]["refused"], "cross_region_off", "{body}");

    // No failover into the data boundary: r3 has vault, r2 does not.
    r1.drain("vault-r1", "").await;
    let body = wait_failover(r1, "vault", ConnTraffic::ReadOnly, None).await;
    assert_eq!(body["failover"]["refused"], "no_capacity", "{body}");

    // A single writer's writes never move without a declared transfer;
    // its reads do. r2's gateway refuses a write sent there anyway.
    r1.drain("ledger-r1", "").await;
    wait_failover(r1, "ledger", ConnTraffic::ReadOnly, Some("r2")).await;
    let body = wait_failover(r1, "ledger", ConnTraffic::ReadWrite, None).await;
    assert_eq!(body["failover"]["refused"], "single_writer", "{body}");
    let ingress2 = dev.regions[1].agent.ingress_addr.unwrap();
    let gateway = |traffic: ConnTraffic| async move {
        let mut conn = tokio::net::TcpStream::connect(ingress2).await.unwrap();
        let preamble = format!(
            "ROLLCALL-INGRESS/1 shop/ledger/default {}\n",
            traffic.as_str()
        );
        conn.write_all(preamble.as_bytes()).await.unwrap();
        line(&mut conn).await
    };
    assert_eq!(gateway(ConnTraffic::ReadWrite).await, None);
    assert_eq!(
        gateway(ConnTraffic::ReadOnly).await.as_deref(),
        Some("other")
    );
    // `transfer_to` in a file is superseded by the transfer command.
    let mut declared = ledger.clone();
    declared["single_writer"]["transfer_to"] = json!("r2");
    let (status, body) = apply(&dev, 0, json!([declared])).await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("rollcall policy transfer"),
        "{body}"
    );
    // Only the owner region's arbiter moves the writes; r2's refuses
    // without --force, naming the owner.
    let transfer_path = "/v1/policies/shop/ledger/transfer";
    let (status, body) = admin(
        &dev,
        1,
        reqwest::Method::POST,
        transfer_path,
        Some(json!({"to": "r2"})),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("owned by region r1"),
        "{body}"
    );
    let before = resolve(r1, "ledger", ConnTraffic::ReadWrite).await;
    assert_eq!(before["writer"]["epoch"], 1, "{before}");
    assert_eq!(before["writer"]["owner"], "r1", "{before}");
    let (status, body) = admin(
        &dev,
        0,
        reqwest::Method::POST,
        transfer_path,
        Some(json!({"to": "r2"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["writer"]["epoch"], 2, "{body}");
    assert_eq!(body["writer"]["settled"], false, "{body}");
    // Once r2's arbiter stored the epoch (settled) and it came back, r1's
    // writes go to r2; r2 serves its own; the fencing token is epoch 2.
    let moved = wait_failover(r1, "ledger", ConnTraffic::ReadWrite, Some("r2")).await;
    assert_eq!(moved["mode"], "writer", "{moved}");
    assert_eq!(moved["writer"]["epoch"], 2, "{moved}");
    assert_eq!(moved["writer"]["settled"], true, "{moved}");
    eventually("r2 serving its own ledger writes at epoch 2", || async {
        let body = resolve(r2, "ledger", ConnTraffic::ReadWrite).await;
        (body["writer"]["epoch"] == 2 && body["mode"] != "writer").then_some(())
    })
    .await;
    eventually(
        "r2's gateway taking ledger writes after the transfer",
        || async {
            (gateway(ConnTraffic::ReadWrite).await.as_deref() == Some("other")).then_some(())
        },
    )
    .await;
    // A write stamped with the old epoch is refused at the gateway.
    let stale_write = async {
        let mut conn = tokio::net::TcpStream::connect(ingress2).await.unwrap();
        conn.write_all(b"ROLLCALL-INGRESS/1 shop/ledger/default read_write writer-epoch=1\n")
            .await
            .unwrap();
        line(&mut conn).await
    };
    assert_eq!(stale_write.await, None);
    // The audit logs say who moved the writes, in both regions.
    let (_, audit) = admin(&dev, 0, reqwest::Method::GET, "/v1/audit?limit=200", None).await;
    assert!(
        audit
            .to_string()
            .contains("writes of shop/ledger transferred to r2"),
        "{audit}"
    );
    let (_, audit) = admin(&dev, 1, reqwest::Method::GET, "/v1/audit?limit=200", None).await;
    assert!(audit.to_string().contains("confirmed here"), "{audit}");

    // A partition between bridges: r2's summaries age past their limit at
    // r1 and r2 is never a target; web moves on to r3, then nowhere.
    // (web-r1b, killed without a health check, stays READY until removed.)
    let (status, body) = r1.deregister("web-r1b", "").await;
    assert_eq!(status, 200, "{body}");
    wait_failover(r1, "web", ConnTraffic::ReadWrite, Some("r2")).await;
    dev.stop_bridge(1).await;
    wait_failover(r1, "web", ConnTraffic::ReadWrite, Some("r3")).await;
    assert_eq!(through(proxy).await.as_deref(), Some("web-r3"));
    dev.stop_bridge(2).await;
    let body = wait_failover(r1, "web", ConnTraffic::ReadWrite, None).await;
    assert_eq!(body["failover"]["refused"], "stale", "{body}");
    assert_eq!(through(proxy).await, None);
    let (_, regions) = r1.send(reqwest::Method::GET, "/v1/regions", None).await;
    assert!(
        regions["regions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["fresh"] == false),
        "{regions}"
    );

    // r1 cut off from both regions: a transfer back to r1 is refused
    // there (r2 owns the writes) unless forced with a reason; forced, it
    // is settled at once and audited as forced.
    let back = json!({"to": "r1"});
    let (status, body) = admin(&dev, 0, reqwest::Method::POST, transfer_path, Some(back)).await;
    assert_eq!(status, 409, "{body}");
    let forced = json!({"to": "r1", "force": true, "reason": "r2 cut off in the drill"});
    let (status, body) = admin(&dev, 0, reqwest::Method::POST, transfer_path, Some(forced)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["writer"]["epoch"], 3, "{body}");
    assert_eq!(
        body["writer"]["forced"], "r2 cut off in the drill",
        "{body}"
    );
    eventually("r1 serving its own ledger writes at epoch 3", || async {
        let body = resolve(r1, "ledger", ConnTraffic::ReadWrite).await;
        (body["writer"]["epoch"] == 3 && body["mode"] != "writer").then_some(())
    })
    .await;
    let (_, audit) = admin(&dev, 0, reqwest::Method::GET, "/v1/audit?limit=200", None).await;
    assert!(
        audit
            .to_string()
            .contains("FORCED past an unreachable owner"),
        "{audit}"
    );

    // Decisions and refusals are counted by reason.
    let (_, metrics) = r1.send(reqwest::Method::GET, "/metrics", None).await;
    let metrics = metrics.as_str().unwrap().to_owned();
    for needle in [
        "rollcall_agent_failover_decisions_total{service=\"shop/web/default\",region=\"r2\"}",
        "rollcall_agent_failover_decisions_total{service=\"shop/web/default\",region=\"r3\"}",
        "rollcall_agent_failover_refusals_total{service=\"shop/web/default\",reason=\"stale\"}",
        "rollcall_agent_failover_refusals_total{service=\"shop/ledger/default\",reason=\"single_writer\"}",
        "rollcall_agent_policy_revision{region=\"r1\"}",
    ] {
        assert!(metrics.contains(needle), "{needle} missing from\n{metrics}");
    }

    // r2, the owner cut off when the forced transfer committed, comes
    // back: its arbiter moves to the newer epoch (never back), says so in
    // its audit log, and its agent sends its writes to r1 from then on.
    dev.start_bridge(1).await.unwrap();
    eventually("r2 holding the forced epoch 3", || async {
        let body = resolve(r2, "ledger", ConnTraffic::ReadWrite).await;
        (body["writer"]["epoch"] == 3 && body["writer"]["owner"] == "r1").then_some(body)
    })
    .await;
    let (_, audit) = admin(&dev, 1, reqwest::Method::GET, "/v1/audit?limit=200", None).await;
    assert!(
        audit
            .to_string()
            .contains("FORCED: r2 cut off in the drill"),
        "{audit}"
    );
    let (status, body) = admin(
        &dev,
        1,
        reqwest::Method::POST,
        transfer_path,
        Some(json!({"to": "r2"})),
    )
    .await;
    assert_eq!(status, 409, "r2 no longer owns the writes: {body}");
    dev.shutdown().await;
}
