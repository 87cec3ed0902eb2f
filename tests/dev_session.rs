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
    let audit = cli(d, &["audit", "--service", "default/web"]);
    assert!(audit.contains("new-1"), "{audit}");
    assert_clean_log(&dev.stop());
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
