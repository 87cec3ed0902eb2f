//! `rollcall certs` as an operator runs it: the built binary writing into a
//! real directory, then the files checked the way a process loading them
//! would read them.

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use rollcall_leases::identity::{identity_from_cert_der, Identity};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

fn rollcall_certs(out: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rollcall"))
        .arg("certs")
        .arg("--out")
        .arg(out)
        .args(args)
        .output()
        .expect("the rollcall binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn identity_in(cert: &Path) -> Identity {
    let pem = fs::read(cert).expect("certificate file exists");
    let der = CertificateDer::from_pem_slice(&pem).expect("certificate file holds PEM");
    identity_from_cert_der(&der).expect("certificate names an identity")
}

#[cfg(unix)]
fn assert_owner_only(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mode = fs::metadata(path).expect("key exists").permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{}", path.display());
}

#[test]
fn writes_a_ca_and_one_bundle_per_identity() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("certs");
    let output = rollcall_certs(
        &out,
        &[
            "--region",
            "r1",
            "--agent",
            "node-17",
            "--agent",
            "node-18",
            "--arbiter",
            "arb-1",
            "--operator",
            "alice",
        ],
    );
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{}", text(&output.stderr));

    for (file, uri) in [
        ("agent-node-17", "rollcall://r1/agent/node-17"),
        ("agent-node-18", "rollcall://r1/agent/node-18"),
        ("arbiter-arb-1", "rollcall://r1/arbiter/arb-1"),
        ("operator-alice", "rollcall://r1/operator/alice"),
    ] {
        let cert = out.join(format!("{file}.crt"));
        let key = out.join(format!("{file}.key"));
        assert!(key.is_file(), "{} missing", key.display());
        assert_eq!(identity_in(&cert).to_uri(), uri);
        assert!(stdout.contains(&cert.display().to_string()), "{stdout}");
        #[cfg(unix)]
        assert_owner_only(&key);
    }
    assert!(out.join("ca.crt").is_file());
    #[cfg(unix)]
    assert_owner_only(&out.join("ca.key"));
    assert!(!stdout.contains("reused"), "{stdout}");
}

#[test]
fn a_second_run_adds_certificates_under_the_same_ca() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path();
    let first = rollcall_certs(out, &["--region", "r1", "--agent", "node-1"]);
    assert!(first.status.success(), "{}", text(&first.stderr));
    let ca_before = fs::read(out.join("ca.crt")).expect("ca.crt written");

    let second = rollcall_certs(out, &["--region", "r1", "--agent", "node-2"]);
    let stdout = text(&second.stdout);
    assert!(second.status.success(), "{}", text(&second.stderr));
    assert!(stdout.contains("reused CA"), "{stdout}");
    assert!(
        !stdout
            .lines()
            .any(|line| line.starts_with("wrote") && line.contains("ca.")),
        "{stdout}"
    );
    assert_eq!(
        fs::read(out.join("ca.crt")).expect("ca.crt kept"),
        ca_before
    );
    assert_eq!(
        identity_in(&out.join("agent-node-2.crt")).to_uri(),
        "rollcall://r1/agent/node-2"
    );
    assert!(out.join("agent-node-1.crt").is_file());
}

#[test]
fn a_bad_name_is_refused_with_the_rule() {
    let dir = tempfile::tempdir().expect("temp dir");
    let output = rollcall_certs(dir.path(), &["--region", "r1", "--agent", "Bad Name"]);
    let stderr = text(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("Bad Name"), "{stderr}");
    assert!(stderr.contains("lowercase letters"), "{stderr}");
    assert!(!dir.path().join("ca.crt").exists(), "nothing written");
}

#[test]
fn a_bad_region_is_refused_with_the_rule() {
    let dir = tempfile::tempdir().expect("temp dir");
    let output = rollcall_certs(dir.path(), &["--region", "R_1", "--agent", "node-1"]);
    let stderr = text(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("region"), "{stderr}");
    assert!(stderr.contains("R_1"), "{stderr}");
}

#[test]
fn at_least_one_identity_is_required() {
    let dir = tempfile::tempdir().expect("temp dir");
    let output = rollcall_certs(dir.path(), &["--region", "r1"]);
    let stderr = text(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("--agent"), "{stderr}");
}

#[test]
fn a_ca_of_another_region_is_not_reused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let first = rollcall_certs(dir.path(), &["--region", "r1", "--agent", "node-1"]);
    assert!(first.status.success(), "{}", text(&first.stderr));
    let output = rollcall_certs(dir.path(), &["--region", "r2", "--agent", "node-1"]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("region r1"), "{stderr}");
}

#[test]
fn an_agent_given_addresses_gets_them_as_ip_sans_and_a_bad_one_is_named() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("certs");
    let output = rollcall_certs(
        &out,
        &[
            "--region",
            "r1",
            "--agent",
            "node-17=10.0.0.17,fd00::17",
            "--agent",
            "node-18",
        ],
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    let sans = |name: &str| {
        let pem = fs::read(out.join(name)).expect("certificate file exists");
        let der = CertificateDer::from_pem_slice(&pem).expect("certificate file holds PEM");
        rollcall_leases::identity::ip_sans_from_cert_der(&der)
    };
    assert_eq!(
        sans("agent-node-17.crt"),
        vec![
            "10.0.0.17".parse::<std::net::IpAddr>().unwrap(),
            "fd00::17".parse().unwrap()
        ]
    );
    assert_eq!(
        identity_in(&out.join("agent-node-17.crt")).to_string(),
        "rollcall://r1/agent/node-17"
    );
    assert!(sans("agent-node-18.crt").is_empty());

    let bad = dir.path().join("bad");
    let output = rollcall_certs(&bad, &["--region", "r1", "--agent", "node-17=10.0.0.x"]);
    assert!(!output.status.success());
    assert!(
        text(&output.stderr).contains("\"10.0.0.x\" is not an IP address"),
        "{}",
        text(&output.stderr)
    );
    assert!(
        !bad.join("ca.crt").exists(),
        "a refused command writes nothing"
    );
}

/// Every certificate in a PEM file.
fn certs_in(path: &Path) -> Vec<CertificateDer<'static>> {
    let pem = fs::read(path).expect("file exists");
    CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .expect("PEM certificates")
}

fn serial(path: &Path) -> String {
    rollcall_leases::tls::CertStatus::of(&certs_in(path)[0])
        .expect("a certificate")
        .serial
}

#[test]
fn renew_reissues_every_certificate_and_keeps_the_ca() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path();
    let first = rollcall_certs(
        out,
        &["--region", "r1", "--agent", "node-1", "--arbiter", "arb-1"],
    );
    assert!(first.status.success(), "{}", text(&first.stderr));
    let ca_before = fs::read(out.join("ca.crt")).expect("ca.crt");
    let agent = out.join("agent-node-1.crt");
    let serial_before = serial(&agent);

    let renewed = rollcall_certs(out, &["--region", "r1", "--renew"]);
    let stdout = text(&renewed.stdout);
    assert!(renewed.status.success(), "{}", text(&renewed.stderr));
    for file in ["agent-node-1.crt", "agent-node-1.key", "arbiter-arb-1.crt"] {
        assert!(stdout.contains(file), "{file}: {stdout}");
    }
    assert!(stdout.contains("holds 1 CA"), "{stdout}");
    assert_eq!(fs::read(out.join("ca.crt")).expect("ca.crt"), ca_before);
    assert_ne!(serial(&agent), serial_before);
    assert_eq!(identity_in(&agent).to_uri(), "rollcall://r1/agent/node-1");
    #[cfg(unix)]
    assert_owner_only(&out.join("agent-node-1.key"));

    // Renewing names no identity: they come from the directory.
    let mixed = rollcall_certs(out, &["--region", "r1", "--renew", "--agent", "node-2"]);
    assert!(!mixed.status.success());
    assert!(
        text(&mixed.stderr).contains("--renew"),
        "{}",
        text(&mixed.stderr)
    );
    // And needs a CA to renew from.
    let empty = tempfile::tempdir().expect("temp dir");
    let none = rollcall_certs(empty.path(), &["--region", "r1", "--renew"]);
    assert_eq!(none.status.code(), Some(2));
    assert!(
        text(&none.stderr).contains("holds no CA"),
        "{}",
        text(&none.stderr)
    );
}

#[test]
fn a_ca_rotation_is_rotate_renew_retire() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path();
    let first = rollcall_certs(out, &["--region", "r1", "--agent", "node-1"]);
    assert!(first.status.success(), "{}", text(&first.stderr));
    let old_ca = certs_in(&out.join("ca.crt"));

    let rotated = rollcall_certs(out, &["--region", "r1", "--rotate-ca"]);
    assert!(rotated.status.success(), "{}", text(&rotated.stderr));
    let bundle = certs_in(&out.join("ca.crt"));
    assert_eq!(bundle.len(), 2);
    assert_eq!(bundle[1], old_ca[0], "the old CA stays trusted, second");
    assert!(out.join("ca.key.previous").is_file());
    assert!(
        text(&rotated.stdout).contains("--renew"),
        "{}",
        text(&rotated.stdout)
    );

    // Retiring now would cut node-1 off: refused, nothing changed.
    let early = rollcall_certs(out, &["--region", "r1", "--retire-old-ca"]);
    let stderr = text(&early.stderr);
    assert_eq!(early.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("agent-node-1.crt"), "{stderr}");
    assert!(stderr.contains("--renew"), "{stderr}");
    assert_eq!(certs_in(&out.join("ca.crt")).len(), 2);

    let renewed = rollcall_certs(out, &["--region", "r1", "--renew"]);
    assert!(renewed.status.success(), "{}", text(&renewed.stderr));
    let retired = rollcall_certs(out, &["--region", "r1", "--retire-old-ca"]);
    assert!(retired.status.success(), "{}", text(&retired.stderr));
    assert_eq!(certs_in(&out.join("ca.crt")), vec![bundle[0].clone()]);
    assert!(!out.join("ca.key.previous").exists());
    // Identities issued later come from the new CA.
    let added = rollcall_certs(out, &["--region", "r1", "--agent", "node-2"]);
    assert!(added.status.success(), "{}", text(&added.stderr));
    assert!(text(&added.stdout).contains("reused CA"));
}
