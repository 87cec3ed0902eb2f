//! Start-up failures as a new user meets them (issue 33): the built
//! `rollcall` binary started with a port already in use, a gossip key file
//! or certificate missing or malformed, or a data directory it cannot use. Each run must
//! print one error that names the port or file, exit 2, and never panic
//! (it used to panic with "there is no reactor running" when an actor
//! started on the failed path was dropped after the runtime).

use std::net::{TcpListener, UdpSocket};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a start that fails may take; it never needs more than a
/// moment, so reaching this means the process went on running.
const PATIENCE: Duration = Duration::from_secs(60);

/// What a finished run printed, and how it exited.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `rollcall ARGS…` with `RUST_LOG=info` and its output in `dir`;
/// kills it after [`PATIENCE`].
fn rollcall(dir: &Path, args: &[&str]) -> Run {
    let (out, err) = (dir.join("stdout.log"), dir.join("stderr.log"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_rollcall"))
        .args(args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("the rollcall binary runs");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > PATIENCE {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "rollcall {args:?} still runs after {PATIENCE:?}; stderr:\n{}",
                std::fs::read_to_string(&err).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Run {
        code: status.code(),
        stdout: std::fs::read_to_string(&out).unwrap(),
        stderr: std::fs::read_to_string(&err).unwrap(),
    }
}

/// The run exited 2 with one error line naming every one of `names`, and
/// nothing panicked. Answers the error line.
fn failed_naming(run: &Run, names: &[&str]) -> String {
    let all = format!("{}{}", run.stdout, run.stderr);
    assert!(!all.contains("panicked"), "a panic:\n{all}");
    assert_eq!(run.code, Some(2), "exit code; output:\n{all}");
    let errors: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.starts_with("error: ") || l.contains(" ERROR "))
        .collect();
    assert_eq!(errors.len(), 1, "one error; stderr:\n{}", run.stderr);
    for name in names {
        assert!(errors[0].contains(name), "{name} not named: {}", errors[0]);
    }
    errors[0].to_owned()
}

/// A loopback TCP port nothing listens on (free when asked).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Writes an agent config without arbiters (no certificates needed) with
/// `extra` appended, and answers its path.
fn agent_config(dir: &Path, extra: &str) -> String {
    let toml = format!(
        "node_id = \"n1\"\ndata_dir = \"{data}\"\nhttp_listen = \"127.0.0.1:0\"\narbiters = []\n{extra}",
        data = dir.join("agent").display(),
    );
    let path = dir.join("agent.toml");
    std::fs::write(&path, toml).unwrap();
    path.display().to_string()
}

#[test]
fn dev_with_its_http_port_in_use_exits_2_naming_the_port() {
    let dir = tempfile::tempdir().unwrap();
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let http = taken.local_addr().unwrap().to_string();
    let data = dir.path().join("data");
    let run = rollcall(
        dir.path(),
        &[
            "dev",
            "--data-dir",
            data.to_str().unwrap(),
            "--http",
            &http,
            "--admin",
            "127.0.0.1:0",
            "--dns",
            "127.0.0.1:0",
        ],
    );
    failed_naming(&run, &[&http, "--http"]);
    // Checked before anything started: no arbiter ran.
    assert!(!run.stderr.contains("arbiter serving"), "{}", run.stderr);
}

#[test]
fn agent_without_its_gossip_key_file_exits_2_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("zone.key");
    let config = agent_config(
        dir.path(),
        &format!(
            "dns_listen = \"127.0.0.1:{}\"\n[gossip]\nlisten = \"127.0.0.1:0\"\nkey_file = \"{}\"\n",
            free_port(),
            key.display()
        ),
    );
    let run = rollcall(dir.path(), &["agent", "--config", &config]);
    failed_naming(&run, &[key.to_str().unwrap(), "rollcall gossip-key"]);
    // Nothing started, nothing written.
    assert!(!dir.path().join("agent").exists());
}

#[test]
fn agent_with_a_malformed_gossip_key_file_exits_2_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("zone.key");
    std::fs::write(&key, "7 not-hex\n").unwrap();
    let config = agent_config(
        dir.path(),
        &format!(
            "dns_listen = \"127.0.0.1:{}\"\n[gossip]\nlisten = \"127.0.0.1:0\"\nkey_file = \"{}\"\n",
            free_port(),
            key.display()
        ),
    );
    let run = rollcall(dir.path(), &["agent", "--config", &config]);
    failed_naming(&run, &[key.to_str().unwrap(), "rollcall gossip-key"]);
    assert!(!dir.path().join("agent").exists());
}

#[test]
fn agent_with_its_dns_port_in_use_exits_2_naming_the_port() {
    // Taken over UDP, then (UDP free) over TCP: DNS needs both.
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    for (protocol, taken) in [
        ("UDP", udp.local_addr().unwrap()),
        ("TCP", tcp.local_addr().unwrap()),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let config = agent_config(dir.path(), &format!("dns_listen = \"{taken}\"\n"));
        let run = rollcall(dir.path(), &["agent", "--config", &config]);
        let error = failed_naming(&run, &[&taken.to_string(), "agent.dns_listen"]);
        assert!(error.contains(protocol), "{error}");
        assert!(!dir.path().join("agent").exists());
    }
}

#[test]
fn agent_whose_data_directory_is_a_file_exits_2_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("agent"), "not a directory").unwrap();
    let config = agent_config(
        dir.path(),
        &format!("dns_listen = \"127.0.0.1:{}\"\n", free_port()),
    );
    let run = rollcall(dir.path(), &["agent", "--config", &config]);
    let data = dir.path().join("agent");
    failed_naming(&run, &[data.to_str().unwrap(), "agent.data_dir"]);
}

#[test]
fn agent_with_its_certificate_files_missing_or_malformed_exits_2_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let tls = |file: &str| certs.join(file).display().to_string();
    let toml = format!(
        "node_id = \"n1\"\ndata_dir = \"{data}\"\nhttp_listen = \"127.0.0.1:0\"\ndns_listen = \"127.0.0.1:{dns}\"\narbiters = [\"127.0.0.1:9\"]\n[tls]\nca = \"{ca}\"\ncert = \"{cert}\"\nkey = \"{key}\"\n",
        data = dir.path().join("agent").display(),
        dns = free_port(),
        ca = tls("ca.crt"),
        cert = tls("agent-n1.crt"),
        key = tls("agent-n1.key"),
    );
    let config = dir.path().join("agent.toml");
    std::fs::write(&config, toml).unwrap();
    let config = config.to_str().unwrap();
    let run = rollcall(dir.path(), &["agent", "--config", config]);
    failed_naming(&run, &[&tls("ca.crt")]);
    std::fs::create_dir(&certs).unwrap();
    for file in ["ca.crt", "agent-n1.crt", "agent-n1.key"] {
        std::fs::write(certs.join(file), "not PEM\n").unwrap();
    }
    let run = rollcall(dir.path(), &["agent", "--config", config]);
    failed_naming(&run, &[&tls("ca.crt"), "rollcall certs"]);
    assert!(!dir.path().join("agent").exists());
}

/// The agent's unix socket is bound with its other listeners, before
/// anything starts: a data directory whose socket path is too long for a
/// unix socket address fails `rollcall dev` before its arbiter starts.
#[test]
fn dev_whose_agent_socket_path_is_too_long_exits_2_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d".repeat(110));
    let run = rollcall(
        dir.path(),
        &[
            "dev",
            "--data-dir",
            data.to_str().unwrap(),
            "--http",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--dns",
            "127.0.0.1:0",
        ],
    );
    failed_naming(&run, &["agent.sock", "--data-dir"]);
    assert!(!run.stderr.contains("arbiter serving"), "{}", run.stderr);
}

/// `rollcall dev --regions 2` from base port B: region r2's agent HTTP
/// port (B + 10) in use stops it before anything started; region r1's
/// bridge metrics port (B + 5) in use fails once r1's arbiter and agent
/// run, and they are stopped before the process exits.
#[test]
fn dev_regions_with_a_port_in_use_exits_2_and_stops_what_started() {
    // Below Linux's ephemeral range (32768–60999), with the ports the two
    // regions use around it free: the other tests' processes bind port 0
    // at the same time, and the kernel hands them ports next to each
    // other, so a free port taken from that range often had a neighbour
    // in use.
    let (_taken, port) = (21_000..32_000u16)
        .step_by(40)
        .find_map(|port| {
            let around = (port - 10..=port + 25)
                .all(|p| p == port || TcpListener::bind(("127.0.0.1", p)).is_ok());
            let taken = TcpListener::bind(("127.0.0.1", port)).ok()?;
            around.then_some((taken, port))
        })
        .expect("a free block of ports below the ephemeral range");
    for (offset, setting, started) in [(10, "--http", false), (5, "metrics_listen", true)] {
        let dir = tempfile::tempdir().unwrap();
        let base = format!("127.0.0.1:{}", port - offset);
        let data = dir.path().join("data");
        let run = rollcall(
            dir.path(),
            &[
                "dev",
                "--regions",
                "2",
                "--data-dir",
                data.to_str().unwrap(),
                "--http",
                &base,
            ],
        );
        failed_naming(&run, &[&format!("127.0.0.1:{port}"), setting]);
        assert_eq!(
            run.stderr.contains("arbiter serving"),
            started,
            "{}",
            run.stderr
        );
        if started {
            assert!(run.stderr.contains("arbiter stopped"), "{}", run.stderr);
        }
    }
}
