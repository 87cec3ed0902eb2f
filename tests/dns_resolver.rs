//! The agent's DNS through the host's own resolver (glibc `getaddrinfo`),
//! as a caller without an SDK uses it: `rollcall dev` runs in a network
//! namespace of this test's with its DNS on 127.0.0.1:53, and the
//! namespace's resolv.conf (`ip netns exec` mounts /etc/netns/NS/) names
//! it as the only nameserver. The first lookups of names the agent does
//! not follow yet must answer what the arbiter says — "no such name"
//! (EAI_NONAME), or the address of a service registered through the API —
//! and never "temporary failure" (EAI_AGAIN, what a SERVFAIL becomes).
//!
//! Needs root and iproute2 (CI runs as root, like the chaos scenarios).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const PATIENCE: Duration = Duration::from_secs(60);

/// The namespace, its resolv.conf and the dev process; all removed when
/// dropped, so a failing test leaves nothing behind.
struct Sandbox {
    netns: String,
    etc: std::path::PathBuf,
    dev: Option<Child>,
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if let Some(mut dev) = self.dev.take() {
            let _ = dev.kill();
            let _ = dev.wait();
        }
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.netns])
            .status();
        let _ = std::fs::remove_dir_all(&self.etc);
    }
}

fn ip(args: &[&str]) {
    let status = Command::new("ip").args(args).status().expect("running ip");
    assert!(
        status.success(),
        "ip {args:?} failed (root and iproute2 are needed)"
    );
}

/// Runs `script` with python3 inside the namespace; its stdout.
fn python_in(netns: &str, script: &str) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", netns, "python3", "-c", script])
        .output()
        .expect("running python3 in the namespace");
    assert!(
        out.status.success(),
        "python3 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn first_lookups_through_glibc_never_fail_temporarily() {
    let netns = format!("rcdns-{}", std::process::id());
    let etc = Path::new("/etc/netns").join(&netns);
    let mut sandbox = Sandbox {
        netns: netns.clone(),
        etc: etc.clone(),
        dev: None,
    };
    ip(&["netns", "add", &netns]);
    ip(&["netns", "exec", &netns, "ip", "link", "set", "lo", "up"]);
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::write(
        etc.join("resolv.conf"),
        "nameserver 127.0.0.1\noptions attempts:1 timeout:5\n",
    )
    .unwrap();
    let data = tempfile::tempdir().unwrap();
    let log = std::fs::File::create(data.path().join("dev.log")).unwrap();
    sandbox.dev = Some(
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &netns,
                env!("CARGO_BIN_EXE_rollcall"),
                "dev",
            ])
            .arg("--data-dir")
            .arg(data.path())
            .args(["--dns", "127.0.0.1:53", "--http", "127.0.0.1:7070"])
            .args(["--admin", "127.0.0.1:7071"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    // Wait for the agent, register one instance of pay, then ask glibc.
    let token_file = data.path().join("agent/agent.token");
    let started = Instant::now();
    while !token_file.exists() {
        assert!(started.elapsed() < PATIENCE, "rollcall dev did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    let script = format!(
        r#"
import json, socket, time, urllib.request
token = open({token:?}).read().strip()
deadline = time.time() + 60
while True:
    try:
        status = json.load(urllib.request.urlopen("http://127.0.0.1:7070/v1/status"))
        if status["arbiter"]["connected"]:
            break
    except OSError:
        pass
    assert time.time() < deadline, "the agent never connected"
    time.sleep(0.1)
body = json.dumps({{"service": "pay", "instance_id": "pay-1", "address": "127.0.0.9", "port": 9000}}).encode()
req = urllib.request.Request("http://127.0.0.1:7070/v1/agent/instances", data=body, method="PUT",
                             headers={{"Authorization": "Bearer " + token}})
assert urllib.request.urlopen(req).status == 200
def lookup(name):
    try:
        return sorted({{a[4][0] for a in socket.getaddrinfo(name, 80, socket.AF_INET)}})
    except socket.gaierror as e:
        return {{socket.EAI_NONAME: "EAI_NONAME", socket.EAI_AGAIN: "EAI_AGAIN"}}.get(e.errno, str(e))
out = {{"pay": lookup("pay.default.svc.rollcall")}}
for n in range(12):
    out["nosuch-%d" % n] = lookup("nosuch-%d.default.svc.rollcall" % n)
print(json.dumps(out))
"#,
        token = token_file.display().to_string()
    );
    let out: serde_json::Value = serde_json::from_str(python_in(&netns, &script).trim())
        .expect("the script prints one JSON object");
    assert_eq!(
        out["pay"],
        serde_json::json!(["127.0.0.9"]),
        "the first lookup of a registered service: {out}"
    );
    for n in 0..12 {
        assert_eq!(
            out[format!("nosuch-{n}")],
            "EAI_NONAME",
            "the first lookup of an unknown name must be 'no such name': {out}"
        );
    }
}
