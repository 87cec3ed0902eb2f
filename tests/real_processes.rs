//! Real processes on loopback (issue 5): `rollcall arbiter` and eight
//! `rollcall agent` processes with certificates from `rollcall certs` and a
//! zone key from `rollcall gossip-key`. SIGSTOP of one agent across a
//! gossip down report about it: the arbiter's probe of its session is
//! answered when it resumes, nothing is removed. kill -9 of another: its
//! instance leaves every other agent's resolve answer through a gossip
//! down verdict the arbiter confirmed with its own signal, a probe of the
//! node's session that went unanswered.

use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const AGENTS: usize = 8;
const PATIENCE: Duration = Duration::from_secs(60);

fn rollcall() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rollcall"))
}

/// A port free now, below Linux's ephemeral range (32768–60999): the
/// kernel never hands one of these to a socket bound to port 0, so another
/// process's ephemeral bind (an agent's QUIC or DNS socket) cannot take it
/// before the process it is meant for binds it (a CI run lost agent-0's
/// gossip port that way). One counter for the whole test binary, so its
/// tests never pick the same port.
fn free_port(free: impl Fn(u16) -> bool) -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let offset = std::process::id() % 6_000 * 2;
    for _ in 0..12_000 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = 20_000 + ((offset + n) % 12_000) as u16;
        if free(port) {
            return port;
        }
    }
    panic!("no free port between 20000 and 32000");
}

fn free_tcp() -> u16 {
    free_port(|port| TcpListener::bind(("127.0.0.1", port)).is_ok())
}

fn free_udp() -> u16 {
    free_port(|port| UdpSocket::bind(("127.0.0.1", port)).is_ok())
}

/// Kills every process it holds when dropped, so a failing test leaves none;
/// a failing test also prints the end of every process's log (the logs live
/// in a temporary directory that goes with the test).
struct Processes(Vec<Child>, Vec<PathBuf>);

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            for log in &self.1 {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                eprintln!("----- {} (last 60 lines) -----", log.display());
                for line in &lines[lines.len().saturating_sub(60)..] {
                    eprintln!("{line}");
                }
            }
        }
    }
}

fn spawn(args: &[&str], log: &Path) -> Child {
    let log = std::fs::File::create(log).unwrap();
    rollcall()
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

fn get(url: &str) -> Option<serde_json::Value> {
    get_as(url, None)
}

/// `GET url`, with a bearer token when one is given.
fn get_as(url: &str, token: Option<&str>) -> Option<serde_json::Value> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let request = reqwest::Client::new().get(url);
        let request = match token {
            Some(token) => request.bearer_auth(token),
            None => request,
        };
        request.send().await.ok()?.json().await.ok()
    })
}

fn ready_ids(http: u16) -> Option<Vec<String>> {
    let body = get(&format!("http://127.0.0.1:{http}/v1/endpoints/web"))?;
    Some(
        body["endpoints"]
            .as_array()?
            .iter()
            .filter_map(|e| e["instance_id"].as_str().map(str::to_owned))
            .collect(),
    )
}

fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < PATIENCE, "gave up waiting: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn kill_9_of_an_agent_removes_its_instances_from_every_other_agent() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let certs = d.join("certs");
    let mut args: Vec<String> = vec![
        "certs".into(),
        "--out".into(),
        certs.display().to_string(),
        "--region".into(),
        "r1".into(),
        "--arbiter".into(),
        "arbiter-1".into(),
    ];
    for i in 0..AGENTS {
        args.extend(["--agent".into(), format!("node-{i}")]);
    }
    assert!(rollcall()
        .args(&args)
        .stdout(Stdio::null())
        .status()
        .unwrap()
        .success());
    let key = rollcall()
        .args(["gossip-key", "--id", "1"])
        .output()
        .unwrap();
    std::fs::write(d.join("zone.key"), &key.stdout).unwrap();

    let (quic, admin) = (free_udp(), free_tcp());
    // A lease outlives the gossip path by far (a 30 s TTL), so on a loaded
    // machine the node lease never removes the instance before gossip and
    // the arbiter's probe do: that path is what this test is about. The
    // probe waits 1.5 s: gossip reports a paused agent at least 0.7 s into
    // its pause (below), so a 1.5 s pause always ends within the wait.
    let arbiter_toml = format!(
        "listen = \"127.0.0.1:{quic}\"\nadmin = \"127.0.0.1:{admin}\"\ndata_dir = \"{}\"\n[lease]\nttl_ms = 30000\nprobe_timeout_ms = 1500\n[tls]\nca = \"{c}/ca.crt\"\ncert = \"{c}/arbiter-arbiter-1.crt\"\nkey = \"{c}/arbiter-arbiter-1.key\"\n",
        d.join("arbiter").display(),
        c = certs.display()
    );
    std::fs::write(d.join("arbiter.toml"), arbiter_toml).unwrap();
    let mut processes = Processes(
        vec![spawn(
            &[
                "arbiter",
                "--config",
                d.join("arbiter.toml").to_str().unwrap(),
            ],
            &d.join("arbiter.log"),
        )],
        vec![d.join("arbiter.log")],
    );

    let gossip: Vec<u16> = (0..AGENTS).map(|_| free_udp()).collect();
    let http: Vec<u16> = (0..AGENTS).map(|_| free_tcp()).collect();
    for i in 0..AGENTS {
        let toml = format!(
            "node_id = \"node-{i}\"\ndata_dir = \"{data}\"\nhttp_listen = \"127.0.0.1:{h}\"\ndns_listen = \"127.0.0.1:0\"\narbiters = [\"127.0.0.1:{quic}\"]\nreconnect_min_ms = 50\nreconnect_max_ms = 500\n\
             [tls]\nca = \"{c}/ca.crt\"\ncert = \"{c}/agent-node-{i}.crt\"\nkey = \"{c}/agent-node-{i}.key\"\n\
             [gossip]\nlisten = \"127.0.0.1:{g}\"\nseeds = [\"127.0.0.1:{seed}\"]\nkey_file = \"{k}\"\nprobe_period_ms = 200\nsuspect_to_down_ms = 500\n",
            data = d.join(format!("agent-{i}")).display(),
            h = http[i],
            c = certs.display(),
            g = gossip[i],
            seed = gossip[0],
            k = d.join("zone.key").display(),
        );
        let path = d.join(format!("agent-{i}.toml"));
        std::fs::write(&path, toml).unwrap();
        processes.0.push(spawn(
            &["agent", "--config", path.to_str().unwrap()],
            &d.join(format!("agent-{i}.log")),
        ));
        processes.1.push(d.join(format!("agent-{i}.log")));
    }
    // Register one instance per agent through its own API.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for (i, &port) in http.iter().enumerate() {
        let token_file = d.join(format!("agent-{i}")).join("agent.token");
        wait_for("agent connected", || {
            get(&format!("http://127.0.0.1:{port}/v1/status"))
                .is_some_and(|s| s["arbiter"]["connected"] == true)
        });
        let token = std::fs::read_to_string(&token_file).unwrap();
        let body = serde_json::json!({"service": "web", "instance_id": format!("web-{i}"), "address": "127.0.0.1", "port": 9000 + i});
        let status = rt.block_on(async {
            reqwest::Client::new()
                .put(format!("http://127.0.0.1:{port}/v1/agent/instances"))
                .bearer_auth(token.trim())
                .json(&body)
                .send()
                .await
                .unwrap()
                .status()
        });
        assert!(status.is_success(), "register on agent {i}: {status}");
    }
    for &h in &http {
        wait_for("every agent sees every instance", || {
            ready_ids(h).is_some_and(|ids| ids.len() == AGENTS)
        });
    }

    // The zone's gossip must know node-3 before it dies, or nobody could
    // report it (agents started together may lose their first join and try
    // again half a second later); only its lease would remove it then.
    for &h in &http {
        wait_for("every agent's gossip knows every other node", || {
            get(&format!("http://127.0.0.1:{h}/v1/status")).is_some_and(|s| {
                s["gossip"]["alive"]
                    .as_array()
                    .is_some_and(|alive| alive.len() == AGENTS - 1)
            })
        });
    }

    // SIGSTOP agent 5 for 1.5 s: gossip (200 ms probes, 500 ms suspicion)
    // reports node-5 down during the pause; the arbiter probes its session,
    // and node-5 answers when it resumes: a partition, nothing removed.
    let metric = |name: &str| -> f64 {
        rt.block_on(async {
            let text = reqwest::get(format!("http://127.0.0.1:{admin}/metrics"))
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            text.lines()
                .filter(|l| !l.starts_with('#'))
                .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
                .unwrap_or_else(|| panic!("no {name}"))
        })
    };
    let ignored_before = metric("rollcall_arbiter_down_reports_ignored_total");
    let pid = processes.0[1 + 5].id() as libc::pid_t;
    // SAFETY: kill(2) on a child this test spawned and still holds.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    std::thread::sleep(Duration::from_millis(1_500));
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    wait_for(
        "the report about paused node-5 refused as a partition",
        || metric("rollcall_arbiter_down_reports_ignored_total") > ignored_before,
    );
    for &h in &http {
        wait_for("every agent sees web-5 again", || {
            ready_ids(h).is_some_and(|ids| ids.len() == AGENTS)
        });
    }

    // kill -9 agent 3: no leave, no close; its gossip and session go silent.
    processes.0[1 + 3].kill().unwrap();
    for (i, &h) in http.iter().enumerate().filter(|(i, _)| *i != 3) {
        wait_for(&format!("web-3 gone from agent {i}"), || {
            ready_ids(h)
                .is_some_and(|ids| ids.len() == AGENTS - 1 && !ids.contains(&"web-3".to_owned()))
        });
    }
    // The answers drop web-3 as soon as gossip does (agents hold a
    // gossip-down node out locally); the arbiter commits once its probe of
    // node-3's session went unanswered for `probe_timeout_ms` too, which
    // is later: wait for the first removal the audit log records, then
    // check it (paused node-5 was never removed).
    let token = std::fs::read_to_string(d.join("arbiter").join("admin.token")).unwrap();
    let fetch_audit = || -> serde_json::Value {
        rt.block_on(async {
            reqwest::Client::new()
                .get(format!("http://127.0.0.1:{admin}/v1/audit?limit=1000"))
                .bearer_auth(token.trim())
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap()
        })
    };
    let removed = |audit: &serde_json::Value| {
        audit.as_array().is_some_and(|entries| {
            entries
                .iter()
                .any(|e| e["command"] == "node-down" || e["command"] == "expire-lease")
        })
    };
    wait_for("a node-down or lease expiry in the audit log", || {
        removed(&fetch_audit())
    });
    let audit = fetch_audit();
    let verdicts: Vec<_> = audit
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["command"] == "node-down")
        .collect();
    assert_eq!(verdicts.len(), 1, "{audit}");
    assert!(verdicts[0]["detail"].as_str().unwrap().contains("node-3"));
    let paused_removed = audit.as_array().unwrap().iter().any(|e| {
        (e["command"] == "node-down" || e["command"] == "expire-lease")
            // "node down NODE epoch …", "lease expired NODE epoch …"
            && e["detail"]
                .as_str()
                .is_some_and(|d| d.split_whitespace().nth(2) == Some("node-5"))
    });
    assert!(!paused_removed, "paused node-5 was never removed: {audit}");
    assert!(metric("rollcall_arbiter_probes_sent_total") >= 2.0);
}

/// `rollcall certs --out DIR --region r1 ARGS…`, which must succeed.
fn certs(dir: &Path, args: &[&str]) {
    let output = rollcall()
        .arg("certs")
        .arg("--out")
        .arg(dir)
        .args(["--region", "r1"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "rollcall certs {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The serial of the certificate in `path`.
fn serial_of(path: &Path) -> String {
    let pem = std::fs::read(path).unwrap();
    let der =
        <rustls::pki_types::CertificateDer as rustls::pki_types::pem::PemObject>::from_pem_slice(
            &pem,
        )
        .unwrap();
    rollcall_leases::tls::CertStatus::of(&der).unwrap().serial
}

/// Issue 20, item 3: a CA rotation of a running cluster (three arbiter
/// replicas, three agents; real processes, files and QUIC) through the
/// operator's interfaces: `rollcall certs --rotate-ca`, `--renew` and
/// `--retire-old-ca` in the directory every process reads its files from.
/// Two agents and the replicas notice the files change; the third checks
/// no files and reloads on SIGHUP. After each step every process shows the
/// new material in `/v1/status`; every agent stays connected throughout
/// (never reconnects), its writes commit at the end, and a certificate of
/// the retired CA no longer gets in.
#[test]
fn a_ca_rotation_keeps_every_agent_connected() {
    const REPLICAS: usize = 3;
    const NODES: usize = 3;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let c = d.join("certs");
    let mut identities: Vec<String> = Vec::new();
    for k in 1..=REPLICAS {
        identities.extend(["--arbiter".into(), format!("arbiter-{k}")]);
    }
    for i in 0..NODES {
        identities.extend(["--agent".into(), format!("node-{i}")]);
    }
    let identities: Vec<&str> = identities.iter().map(String::as_str).collect();
    certs(&c, &identities);
    // node-0's first certificate, kept to try once its CA is retired.
    let old = d.join("old");
    std::fs::create_dir(&old).unwrap();
    for file in ["ca.crt", "agent-node-0.crt", "agent-node-0.key"] {
        std::fs::copy(c.join(file), old.join(file)).unwrap();
    }

    let quic: Vec<u16> = (0..REPLICAS).map(|_| free_udp()).collect();
    let admin: Vec<u16> = (0..REPLICAS).map(|_| free_tcp()).collect();
    let replicas: String = (0..REPLICAS)
        .map(|k| {
            format!(
                "[[raft.replicas]]\nid = {}\naddr = \"127.0.0.1:{}\"\n",
                k + 1,
                quic[k]
            )
        })
        .collect();
    let tls = |name: &str, check_ms: u64| {
        format!(
            "[tls]\nca = \"{c}/ca.crt\"\ncert = \"{c}/{name}.crt\"\nkey = \"{c}/{name}.key\"\ncheck_interval_ms = {check_ms}\n",
            c = c.display()
        )
    };
    let mut processes = Processes(Vec::new(), Vec::new());
    for k in 0..REPLICAS {
        let toml = format!(
            "name = \"arbiter-{n}\"\nlisten = \"127.0.0.1:{q}\"\nadmin = \"127.0.0.1:{a}\"\ndata_dir = \"{data}\"\n[raft]\nid = {n}\n{replicas}{tls}",
            n = k + 1,
            q = quic[k],
            a = admin[k],
            data = d.join(format!("arbiter-{}", k + 1)).display(),
            tls = tls(&format!("arbiter-arbiter-{}", k + 1), 200),
        );
        let path = d.join(format!("arbiter-{}.toml", k + 1));
        std::fs::write(&path, toml).unwrap();
        let log = d.join(format!("arbiter-{}.log", k + 1));
        processes.0.push(spawn(
            &["arbiter", "--config", path.to_str().unwrap()],
            &log,
        ));
        processes.1.push(log);
    }
    let arbiters: Vec<String> = quic.iter().map(|q| format!("\"127.0.0.1:{q}\"")).collect();
    let http: Vec<u16> = (0..NODES).map(|_| free_tcp()).collect();
    for (i, h) in http.iter().enumerate() {
        // node-2 checks no files: it reloads on SIGHUP only.
        let check_ms = if i == NODES - 1 { 0 } else { 200 };
        let toml = format!(
            "node_id = \"node-{i}\"\ndata_dir = \"{data}\"\nhttp_listen = \"127.0.0.1:{h}\"\ndns_listen = \"127.0.0.1:0\"\narbiters = [{arbiters}]\nreconnect_min_ms = 50\nreconnect_max_ms = 500\n{tls}",
            data = d.join(format!("agent-{i}")).display(),
            arbiters = arbiters.join(", "),
            tls = tls(&format!("agent-node-{i}"), check_ms),
        );
        let path = d.join(format!("agent-{i}.toml"));
        std::fs::write(&path, toml).unwrap();
        let log = d.join(format!("agent-{i}.log"));
        processes
            .0
            .push(spawn(&["agent", "--config", path.to_str().unwrap()], &log));
        processes.1.push(log);
    }
    let hup = processes.0[REPLICAS + NODES - 1].id().to_string();

    let agent_status = |i: usize| get(&format!("http://127.0.0.1:{}/v1/status", http[i]));
    let arbiter_status = |k: usize| {
        let token =
            std::fs::read_to_string(d.join(format!("arbiter-{}/admin.token", k + 1))).ok()?;
        get_as(
            &format!("http://127.0.0.1:{}/v1/status", admin[k]),
            Some(token.trim()),
        )
    };
    for i in 0..NODES {
        wait_for("agent connected", || {
            agent_status(i).is_some_and(|s| s["arbiter"]["connected"] == true)
        });
    }
    // One instance per agent, to write through at the end.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let call = |i: usize, method: reqwest::Method, path: &str, body: Option<serde_json::Value>| {
        let token =
            std::fs::read_to_string(d.join(format!("agent-{i}")).join("agent.token")).unwrap();
        rt.block_on(async {
            let request = reqwest::Client::new()
                .request(method, format!("http://127.0.0.1:{}{path}", http[i]))
                .bearer_auth(token.trim());
            let request = match body {
                Some(body) => request.json(&body),
                None => request,
            };
            request.send().await.unwrap().status()
        })
    };
    for i in 0..NODES {
        let body = serde_json::json!({"service": "web", "instance_id": format!("web-{i}"), "address": "127.0.0.1", "port": 9000 + i});
        let status = call(i, reqwest::Method::PUT, "/v1/agent/instances", Some(body));
        assert_eq!(status, reqwest::StatusCode::OK, "register on agent {i}");
    }

    // Each step: the files change; node-2 gets SIGHUP; every process shows
    // the new material, and no agent's session ever drops meanwhile.
    let step = |args: &[&str], what: &str, shows: &dyn Fn(&serde_json::Value, &Path) -> bool| {
        certs(&c, args);
        let signal = Command::new("kill").args(["-HUP", &hup]).status().unwrap();
        assert!(signal.success());
        for k in 0..REPLICAS {
            let cert = c.join(format!("arbiter-arbiter-{}.crt", k + 1));
            wait_for(&format!("arbiter-{} {what}", k + 1), || {
                arbiter_status(k).is_some_and(|s| shows(&s["tls"], &cert))
            });
        }
        for i in 0..NODES {
            let cert = c.join(format!("agent-node-{i}.crt"));
            wait_for(&format!("agent {i} {what}"), || {
                let status = agent_status(i).expect("the agent answers");
                assert_eq!(
                    status["arbiter"]["connected"], true,
                    "agent {i} lost its session during the rotation ({what})"
                );
                shows(&status["tls"], &cert)
            });
        }
    };
    let cas = |n: usize| {
        move |tls: &serde_json::Value, _: &Path| tls["cas"].as_array().map(Vec::len) == Some(n)
    };
    step(&["--rotate-ca"], "trusts both CAs", &cas(2));
    step(
        &["--renew"],
        "presents its renewed certificate",
        &|tls, cert| tls["leaf"]["serial"].as_str() == Some(serial_of(cert).as_str()),
    );
    step(&["--retire-old-ca"], "trusts the new CA alone", &cas(1));

    for (i, h) in http.iter().enumerate() {
        let metrics = rt.block_on(async {
            reqwest::get(format!("http://127.0.0.1:{h}/metrics"))
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        });
        let reconnects = metrics
            .lines()
            .find_map(|l| l.strip_prefix("rollcall_agent_reconnects_total "))
            .unwrap_or_else(|| panic!("agent {i} has no reconnect counter"));
        assert_eq!(reconnects.trim(), "0", "agent {i} reconnected");
        let drained = call(
            i,
            reqwest::Method::PUT,
            &format!("/v1/agent/instances/web-{i}/drain"),
            None,
        );
        assert_eq!(
            drained,
            reqwest::StatusCode::OK,
            "a drain through agent {i} commits"
        );
    }

    // A new handshake: the renewed certificate gets in, the retired CA's
    // does not (the arbiter presents the new CA's certificate, so the old
    // leaf is offered with the new bundle to reach the arbiter's check).
    let current = rollcall_leases::tls::TlsMaterial::load(&rollcall_leases::tls::TlsFiles {
        ca: c.join("ca.crt"),
        cert: c.join("agent-node-0.crt"),
        key: c.join("agent-node-0.key"),
    })
    .unwrap();
    let retired = rollcall_leases::tls::TlsMaterial::load(&rollcall_leases::tls::TlsFiles {
        ca: old.join("ca.crt"),
        cert: old.join("agent-node-0.crt"),
        key: old.join("agent-node-0.key"),
    })
    .unwrap();
    let retired = rollcall_leases::tls::TlsMaterial {
        cas: current.cas.clone(),
        ..retired
    };
    let address = format!("127.0.0.1:{}", quic[0]);
    let answer = |material: &rollcall_leases::tls::TlsMaterial| {
        rt.block_on(async {
            let client = rollcall_leases::client::ArbiterClient::new(material).ok()?;
            let conn = tokio::time::timeout(PATIENCE, client.connect(&address))
                .await
                .ok()?
                .ok()?;
            tokio::time::timeout(
                PATIENCE,
                conn.request(&rollcall_leases::protocol::Request::NodeInstances),
            )
            .await
            .ok()?
            .ok()
        })
    };
    assert!(
        answer(&current).is_some(),
        "the renewed certificate gets an answer"
    );
    assert!(
        answer(&retired).is_none(),
        "the retired CA's certificate gets none"
    );

    // Issue 38, item 6: revoking node-1 in the certificate directory cuts
    // it off at the replicas' next file check (200 ms): its session is
    // closed and its handshakes refused; the other agents keep theirs.
    certs(&c, &["--revoke", "agent:node-1"]);
    wait_for("node-1 cut off", || {
        agent_status(1).is_some_and(|s| s["arbiter"]["connected"] == false)
    });
    for _ in 0..10 {
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert_eq!(
            agent_status(1).expect("the agent answers")["arbiter"]["connected"],
            false,
            "a revoked agent got a session"
        );
    }
    for i in [0, 2] {
        assert_eq!(
            agent_status(i).expect("the agent answers")["arbiter"]["connected"],
            true,
            "agent {i} lost its session"
        );
    }
    assert!(
        answer(&current).is_some(),
        "node-0's certificate still gets an answer"
    );
}
