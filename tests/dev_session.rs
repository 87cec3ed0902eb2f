//! The first session of a new user, as real processes (issue 22): `rollcall
//! dev`, then `rollcall dev --replicas 3` in the same directory, driven
//! through the HTTP API and the operator commands with their defaults.

use std::io::Read;
use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const PATIENCE: Duration = Duration::from_secs(60);

/// A loopback port free for TCP and UDP, and the `n - 1` after it, below
/// Linux's ephemeral range (32768–60999), so no client socket of a test
/// running alongside is handed one of them before `dev` binds it.
fn free_ports(n: u16) -> u16 {
    let mut seed = std::process::id() as u64
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
    for _ in 0..1_000 {
        // xorshift: no rand dependency in this package's tests.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let base = 20_000 + (seed % 12_000) as u16;
        let all_free = (0..n).all(|k| {
            TcpListener::bind(("127.0.0.1", base + k)).is_ok()
                && UdpSocket::bind(("127.0.0.1", base + k)).is_ok()
        });
        if all_free {
            return base;
        }
    }
    panic!("no {n} free consecutive ports");
}

/// One `rollcall dev`; killed when dropped, its logs printed if the test
/// failed.
struct Dev {
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            for log in [&self.stdout, &self.stderr] {
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

impl Dev {
    /// Starts `rollcall dev ARGS` in `dir` and waits for its banner.
    fn start(dir: &Path, run: &str, args: &[String]) -> Dev {
        let stdout = dir.join(format!("{run}.out"));
        let stderr = dir.join(format!("{run}.err"));
        let child = Command::new(env!("CARGO_BIN_EXE_rollcall"))
            .arg("dev")
            .args(args)
            .current_dir(dir)
            .env_remove("RUST_LOG")
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        let mut dev = Dev {
            child,
            stdout,
            stderr,
        };
        wait_for("the dev banner", || {
            assert!(
                dev.child.try_wait().unwrap().is_none(),
                "rollcall dev exited"
            );
            std::fs::read_to_string(&dev.stdout)
                .unwrap_or_default()
                .contains("rollcall dev is running")
        });
        dev
    }

    /// Ctrl-C, then the process must end by itself; its stderr.
    fn stop(mut self) -> String {
        let pid = self.child.id().to_string();
        // The shell's own kill: no procps needed on a fresh machine.
        let sent = Command::new("sh")
            .args(["-c", &format!("kill -INT {pid}")])
            .status()
            .unwrap();
        assert!(sent.success());
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "rollcall dev did not stop on Ctrl-C"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "rollcall dev exited with {status}");
        let mut text = String::new();
        std::fs::File::open(&self.stderr)
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        text
    }
}

fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < PATIENCE, "gave up waiting: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One HTTP call; the status and the JSON body.
fn call(
    method: reqwest::Method,
    url: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut req = reqwest::Client::new().request(method, url);
        if let Some(token) = token {
            req = req.bearer_auth(token);
        }
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    })
}

/// `rollcall ARGS` in `dir`: its stdout, or a panic with its stderr.
fn cli(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_rollcall"))
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "rollcall {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn ready_ids(http: u16) -> Option<(Vec<String>, bool, u64)> {
    let (status, body) = call(
        reqwest::Method::GET,
        &format!("http://127.0.0.1:{http}/v1/endpoints/web"),
        None,
        None,
    );
    if status != 200 {
        return None;
    }
    let mut ids: Vec<String> = body["endpoints"]
        .as_array()?
        .iter()
        .filter_map(|e| e["instance_id"].as_str().map(str::to_owned))
        .collect();
    ids.sort();
    Some((ids, body["stale"] == true, body["revision"].as_u64()?))
}

/// Logs a user can read in a file: no colour codes, and no ERROR for what
/// happens at every start and stop.
fn assert_clean_log(stderr: &str) {
    assert!(
        !stderr.contains('\u{1b}'),
        "colour codes in a log file:\n{stderr}"
    );
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains(" ERROR ")).collect();
    assert!(errors.is_empty(), "ERROR lines:\n{}", errors.join("\n"));
}

#[test]
fn dev_then_dev_with_three_replicas_in_one_directory() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let http = free_ports(1);
    let dns = free_ports(1);
    let admin = free_ports(3);
    let args = |replicas: &str| -> Vec<String> {
        [
            "--http",
            &format!("127.0.0.1:{http}"),
            "--dns",
            &format!("127.0.0.1:{dns}"),
            "--admin",
            &format!("127.0.0.1:{admin}"),
            "--replicas",
            replicas,
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let agent = format!("http://127.0.0.1:{http}/v1/agent/instances");
    let register = |token: &str, id: &str| {
        call(
            reqwest::Method::PUT,
            &agent,
            Some(token),
            Some(
                json!({"service": "web", "instance_id": id, "address": "127.0.0.1", "port": 8080}),
            ),
        )
    };

    // A plain `dev`: web goes to a revision well past 10.
    let dev = Dev::start(d, "first", &args("1"));
    let token = std::fs::read_to_string(d.join("rollcall-data/agent/agent.token")).unwrap();
    let token = token.trim();
    for i in 1..=6 {
        let (status, body) = register(token, &format!("old-{i}"));
        assert_eq!(
            (status, body["pending"].clone()),
            (200, json!(false)),
            "{body}"
        );
    }
    for i in 2..=6 {
        let (status, body) = call(
            reqwest::Method::DELETE,
            &format!("{agent}/old-{i}?generation=1"),
            Some(token),
            None,
        );
        assert_eq!(status, 200, "{body}");
    }
    wait_for("web is old-1 only", || {
        ready_ids(http).is_some_and(|(ids, stale, _)| ids == ["old-1"] && !stale)
    });
    let (_, _, old_revision) = ready_ids(http).unwrap();
    assert!(old_revision >= 12, "{old_revision}");
    // The operator commands find the arbiter and its token by themselves,
    // and `--service web` means default/web/default.
    let audit = cli(d, &["audit", "--service", "web"]);
    let register_line = audit
        .lines()
        .find(|l| l.contains(" register "))
        .unwrap_or_else(|| panic!("no register entry:\n{audit}"));
    assert!(register_line.contains("default/web/default"), "{audit}");
    assert!(
        register_line
            .split_whitespace()
            .nth(1)
            .is_some_and(|t| t.len() == 24 && t.ends_with('Z') && t.as_bytes()[10] == b'T'),
        "the time is RFC 3339 in UTC: {register_line}"
    );
    // The read-only commands too, with no flags at all (issue 37).
    let services = cli(d, &["services"]);
    assert!(
        services
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()[..3]
                == ["default/web/default", "1", "1"]),
        "{services}"
    );
    let resolved = cli(d, &["resolve", "web"]);
    assert!(resolved.contains("old-1"), "{resolved}");
    let status = cli(d, &["status"]);
    assert!(status.contains("arbiter  connected to"), "{status}");
    assert_clean_log(&dev.stop());

    // Three replicas in the same directory: a new catalog. The agent's cache
    // of the old one (web at a higher revision) must not hide it.
    let dev = Dev::start(d, "second", &args("3"));
    let (status, body) = register(token, "new-1");
    assert_eq!(
        (status, body["pending"].clone()),
        (200, json!(false)),
        "the first write after the banner commits: {body}"
    );
    // old-1 is the agent's own registration: registered again in the new
    // catalog.
    wait_for("web is the new catalog's, current", || {
        ready_ids(http).is_some_and(|(ids, stale, _)| ids == ["new-1", "old-1"] && !stale)
    });
    let members = cli(d, &["cluster", "members"]);
    assert_eq!(
        members.lines().filter(|l| l.contains(" voter ")).count(),
        3,
        "{members}"
    );
    // Issue 37, item 2: a removed replica knows it, says so and names the
    // leader; dev.json no longer lists it, so the defaults ask the others.
    let removed = cli(d, &["cluster", "remove", "--id", "3"]);
    assert!(
        removed.contains("replica 3 is no longer listed"),
        "{removed}"
    );
    let third = format!("127.0.0.1:{}", admin + 2);
    let token3 = d.join("rollcall-data/arbiter-3/admin.token");
    wait_for("replica 3 knows it was removed", || {
        Command::new(env!("CARGO_BIN_EXE_rollcall"))
            .args(["cluster", "members", "--admin", &third, "--token-file"])
            .arg(&token3)
            .current_dir(d)
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stderr).contains("was removed"))
    });
    let (code, stderr) = cli_fails(
        d,
        &[
            "cluster",
            "members",
            "--admin",
            &third,
            "--token-file",
            token3.to_str().unwrap(),
        ],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("410") && stderr.contains("ask another replica"),
        "{stderr}"
    );
    let members = cli(d, &["cluster", "members"]);
    assert_eq!(
        members.lines().filter(|l| l.contains(" voter ")).count(),
        2,
        "{members}"
    );
    let targets = std::fs::read_to_string(d.join("rollcall-data/dev.json")).unwrap();
    assert_eq!(targets.matches("\"replica\"").count(), 2, "{targets}");
    let audit = cli(d, &["audit", "--service", "default/web"]);
    assert!(audit.contains("new-1"), "{audit}");
    let stderr = dev.stop();
    assert_clean_log(&stderr);
    // Issue 37, item 6: an election's stale messages are not warnings.
    assert!(!stderr.contains("vote changed"), "{stderr}");
    assert!(
        !d.join("rollcall-data/dev.json").exists(),
        "a stopped dev leaves no targets file"
    );
}

/// An agent with no arbiters says at start what that means, and a port in
/// use is reported with its cause once (it was printed twice).
#[test]
fn start_up_messages_say_what_is_wrong_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let http = free_ports(1);
    let dns = free_ports(1);
    let config = d.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = \"{}\"\nhttp_listen = \"127.0.0.1:{http}\"\ndns_listen = \"127.0.0.1:{dns}\"\narbiters = []\n",
            d.join("agent").display()
        ),
    )
    .unwrap();
    let stderr = d.join("agent.err");
    let mut agent = Command::new(env!("CARGO_BIN_EXE_rollcall"))
        .args(["agent", "--config"])
        .arg(&config)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    wait_for("the warning about no arbiters", || {
        std::fs::read_to_string(&stderr)
            .unwrap_or_default()
            .contains("agent.arbiters is empty")
    });

    // The agent holds the HTTP port: a dev on it cannot start.
    let out = Command::new(env!("CARGO_BIN_EXE_rollcall"))
        .args(["dev", "--http", &format!("127.0.0.1:{http}")])
        .current_dir(d)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let _ = agent.kill();
    let _ = agent.wait();
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    let line = text
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line:\n{text}"));
    assert!(line.contains(&format!("127.0.0.1:{http}")), "{line}");
    assert_eq!(
        line.matches("Address already in use").count(),
        1,
        "the cause once: {line}"
    );
}

/// `rollcall CMD ARGS` in `dir` that must fail: its exit code and stderr.
fn cli_fails(dir: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rollcall"))
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success(), "rollcall {args:?} succeeded");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Issue 37, item 1: `status`, `members`, `services` and `resolve`
/// against a `rollcall dev` whose data directory is elsewhere: the banner
/// names the `--data-dir` to pass, and the commands work with it or with
/// `--agent`; `resolve --watch` prints every change until it is stopped.
#[test]
fn the_read_commands_list_what_the_agent_holds() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let elsewhere = tempfile::tempdir().unwrap();
    let data = elsewhere.path().join("state");
    let http = free_ports(1);
    let dns = free_ports(1);
    let admin = free_ports(1);
    let args: Vec<String> = [
        "--http",
        &format!("127.0.0.1:{http}"),
        "--dns",
        &format!("127.0.0.1:{dns}"),
        "--admin",
        &format!("127.0.0.1:{admin}"),
        "--data-dir",
        data.to_str().unwrap(),
    ]
    .map(str::to_owned)
    .to_vec();
    let dev = Dev::start(d, "read", &args);
    let banner = std::fs::read_to_string(&dev.stdout).unwrap();
    assert!(
        banner.contains(&format!("pass them --data-dir {}", data.display())),
        "{banner}"
    );
    for command in ["status", "members", "services", "resolve"] {
        let help = cli(d, &[command, "--help"]);
        assert!(help.contains("--agent <URL>"), "{command}: {help}");
        assert!(help.contains("--json"), "{command}: {help}");
    }
    assert!(cli(d, &["resolve", "--help"]).contains("--watch"));
    let by_dir = ["--data-dir", data.to_str().unwrap()];
    let agent = format!("http://127.0.0.1:{http}");
    let by_url = ["--agent", agent.as_str()];

    let status = cli(d, &[&["status"][..], &by_dir].concat());
    assert!(status.starts_with("node     dev-node (zone z1"), "{status}");
    assert!(
        status.contains("arbiter  connected to 127.0.0.1:"),
        "{status}"
    );
    assert!(
        status.contains("gossip   off (no gossip.key_file)"),
        "{status}"
    );
    let members = cli(d, &[&["members"][..], &by_url].concat());
    assert!(
        members.starts_with("gossip is off on node dev-node"),
        "{members}"
    );
    let services = cli(d, &[&["services"][..], &by_url].concat());
    assert_eq!(
        services, "the region has no service this node may watch\n",
        "the region's catalog is empty yet"
    );

    let token = std::fs::read_to_string(data.join("agent/agent.token")).unwrap();
    let token = token.trim();
    for (id, port) in [("web-1", 8081), ("web-2", 8082)] {
        let (status, body) = call(
            reqwest::Method::PUT,
            &format!("{agent}/v1/agent/instances"),
            Some(token),
            Some(
                json!({"service": "web", "instance_id": id, "address": "127.0.0.1", "port": port}),
            ),
        );
        assert_eq!(status, 200, "{body}");
    }
    let resolved = cli(d, &[&["resolve", "web"][..], &by_url].concat());
    let lines: Vec<&str> = resolved.lines().collect();
    assert!(
        lines[0].starts_with("default/web/default  region r1  revision "),
        "{resolved}"
    );
    assert!(lines[0].ends_with("mode normal"), "{resolved}");
    assert_eq!(
        lines[1].split_whitespace().next(),
        Some("INSTANCE"),
        "{resolved}"
    );
    assert!(
        lines[2].starts_with("web-1     127.0.0.1:8081  z1    READY"),
        "{resolved}"
    );
    assert!(
        lines[3].starts_with("web-2     127.0.0.1:8082  z1    READY"),
        "{resolved}"
    );
    let json: Value = serde_json::from_str(&cli(
        d,
        &[&["resolve", "default/web", "--json"][..], &by_url].concat(),
    ))
    .unwrap();
    assert_eq!(json["endpoints"].as_array().unwrap().len(), 2, "{json}");
    let services = cli(d, &[&["services", "--json"][..], &by_dir].concat());
    let services: Value = serde_json::from_str(&services).unwrap();
    assert_eq!(services["source"], "catalog", "{services}");
    assert_eq!(services["services"][0]["service"], "default/web/default");
    assert_eq!(
        (
            &services["services"][0]["ready"],
            &services["services"][0]["total"]
        ),
        (&json!(2), &json!(2))
    );

    // --watch: the first answer, then one line per change.
    let out = d.join("watch.out");
    let mut watch = Command::new(env!("CARGO_BIN_EXE_rollcall"))
        .args(["resolve", "web", "--watch", "--json", "--agent", &agent])
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let answers = || -> Vec<Value> {
        std::fs::read_to_string(&out)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    wait_for("the first answer", || answers().len() == 1);
    let (status, body) = call(
        reqwest::Method::PUT,
        &format!("{agent}/v1/agent/instances/web-2/drain?wait=committed"),
        Some(token),
        None,
    );
    assert_eq!(status, 200, "{body}");
    wait_for("the answer without web-2", || {
        answers()
            .last()
            .is_some_and(|a| a["endpoints"].as_array().unwrap().len() == 1)
    });
    let _ = watch.kill();
    let _ = watch.wait();
    let seen = answers();
    assert_eq!(seen[seen.len() - 1]["endpoints"][0]["instance_id"], "web-1");
    // Each line is a change: no two the same in a row.
    assert!(seen.windows(2).all(|w| w[0]["index"] != w[1]["index"]));

    // An operator frees the drained web-2's id (issue 38, item 1); a
    // second free finds nothing to free.
    let freed = cli(d, &[&["instance", "free", "web-2"][..], &by_dir].concat());
    assert!(
        freed.starts_with("freed web-2 (generation 1 on node dev-node) at revision "),
        "{freed}"
    );
    let (code, stderr) = cli_fails(d, &[&["instance", "free", "web-2"][..], &by_dir].concat());
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("404") && stderr.contains("nothing to free"),
        "{stderr}"
    );

    // Bad input is named; nothing is asked.
    let (code, stderr) = cli_fails(d, &[&["resolve", "nope"][..], &by_url].concat());
    assert_eq!(code, Some(2));
    assert!(
        stderr.contains("404") && stderr.contains("does not exist"),
        "{stderr}"
    );
    let (code, stderr) = cli_fails(d, &["resolve", "Web!"]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("'Web!'"), "{stderr}");
    let (code, stderr) = cli_fails(d, &["status", "--region", "r2"]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("--region needs the dev.json"), "{stderr}");
    assert_clean_log(&dev.stop());
}

/// Issue 37, item 5: with `--regions`, `--quic` pins every arbiter's QUIC
/// port (region k's 10(k − 1) above it), and a flag `--regions` does not
/// take is refused naming it, starting nothing.
#[test]
fn dev_regions_pins_every_port_and_refuses_what_it_does_not_take() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for flag in [
        ["--admin", "127.0.0.1:1"],
        ["--dns", "127.0.0.1:1"],
        ["--replicas", "3"],
    ] {
        let (code, stderr) = cli_fails(d, &[&["dev", "--regions", "2"][..], &flag].concat());
        assert_eq!(code, Some(2), "{flag:?}: {stderr}");
        assert!(
            stderr.contains(&format!("'{} <", flag[0])) && stderr.contains("'--regions <N>'"),
            "{flag:?}: {stderr}"
        );
    }
    assert!(!d.join("rollcall-data").exists(), "nothing started");

    let http = free_ports(16);
    let quic = free_ports(11);
    let args: Vec<String> = [
        "--regions",
        "2",
        "--http",
        &format!("127.0.0.1:{http}"),
        "--quic",
        &format!("127.0.0.1:{quic}"),
    ]
    .map(str::to_owned)
    .to_vec();
    let dev = Dev::start(d, "regions", &args);
    let banner = std::fs::read_to_string(&dev.stdout).unwrap();
    for k in [0, 10] {
        assert!(
            banner.contains(&format!("QUIC 127.0.0.1:{}", quic + k)),
            "{banner}"
        );
    }
    assert_clean_log(&dev.stop());
}
