use std::net::{IpAddr, SocketAddr};

use super::*;
use crate::endpoint::Role;
use crate::name::PrincipalName;

/// Bounds every network step so a broken handshake fails the test
/// instead of hanging it; generous because the machine may be busy.
const STEP: Duration = Duration::from_secs(20);

fn region(name: &str) -> Label {
    Label::new(name).expect("valid region")
}

fn id(region_name: &str, role: Role, name: &str) -> Identity {
    Identity::new(
        region(region_name),
        role,
        PrincipalName::new(name).expect("valid name"),
    )
}

fn material(ca: &Ca, identity: &Identity) -> TlsMaterial {
    let issued = ca.issue(identity, &[], &[]).expect("issue");
    TlsMaterial::from_issued(ca, &issued)
}

/// What each side saw of one connection attempt.
struct Outcome {
    /// The client's identity as the server saw it, or why it failed.
    server: Result<Identity, String>,
    /// The server's identity and the echoed bytes, or why it failed.
    client: Result<(Identity, Vec<u8>), String>,
}

/// Runs an echo server with `server` material and connects to it with
/// `client_config`, sending `hello` over one bi stream.
async fn exchange(server: &TlsMaterial, client: quinn::ClientConfig, name: &str) -> Outcome {
    let listen: SocketAddr = "127.0.0.1:0".parse().expect("address");
    let endpoint = quinn::Endpoint::server(server_config(server).expect("server config"), listen)
        .expect("server endpoint");
    let addr = endpoint.local_addr().expect("bound address");
    let server_task = tokio::spawn(async move {
        let incoming = tokio::time::timeout(STEP, endpoint.accept())
            .await
            .map_err(|_| "no connection arrived".to_owned())?
            .ok_or("endpoint closed")?;
        let conn = tokio::time::timeout(STEP, incoming)
            .await
            .map_err(|_| "handshake timed out".to_owned())?
            .map_err(|e| format!("handshake failed: {e}"))?;
        let identity = peer_identity(&conn).map_err(|e| e.to_string())?;
        let (mut send, mut recv) = conn.accept_bi().await.map_err(|e| e.to_string())?;
        let data = recv.read_to_end(64).await.map_err(|e| e.to_string())?;
        send.write_all(&data).await.map_err(|e| e.to_string())?;
        send.finish().map_err(|e| e.to_string())?;
        let _ = tokio::time::timeout(STEP, conn.closed()).await;
        Ok::<_, String>(identity)
    });

    let mut client_endpoint =
        quinn::Endpoint::client("127.0.0.1:0".parse().expect("address")).expect("client");
    client_endpoint.set_default_client_config(client);
    let client_result = tokio::time::timeout(STEP, async {
        let conn = client_endpoint
            .connect(addr, name)
            .map_err(|e| e.to_string())?
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let server_identity = peer_identity(&conn).map_err(|e| e.to_string())?;
        let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
        send.write_all(b"hello").await.map_err(|e| e.to_string())?;
        send.finish().map_err(|e| e.to_string())?;
        let echoed = recv.read_to_end(64).await.map_err(|e| e.to_string())?;
        conn.close(0u32.into(), b"done");
        Ok::<_, String>((server_identity, echoed))
    })
    .await
    .unwrap_or_else(|_| Err("client timed out".to_owned()));
    client_endpoint.close(0u32.into(), b"done");

    let server_result = server_task.await.expect("server task ran");
    Outcome {
        server: server_result,
        client: client_result,
    }
}

#[tokio::test]
async fn mutual_tls_handshake_echoes_and_names_both_ends() {
    let ca = Ca::generate(&region("r1")).expect("CA");
    let arbiter = id("r1", Role::Arbiter, "arb-1");
    let agent = id("r1", Role::Agent, "node-1");
    let server = material(&ca, &arbiter);
    let client = client_config(&material(&ca, &agent)).expect("client config");

    let outcome = exchange(&server, client, "127.0.0.1").await;
    assert_eq!(outcome.server, Ok(agent.clone()));
    assert_eq!(outcome.client, Ok((arbiter.clone(), b"hello".to_vec())));
    assert_eq!(
        outcome.server.expect("checked").to_uri(),
        "rollcall://r1/agent/node-1"
    );

    let client = client_config(&material(&ca, &agent)).expect("client config");
    let outcome = exchange(&server, client, "localhost").await;
    assert_eq!(outcome.server, Ok(agent));
}

#[tokio::test]
async fn client_certificate_from_another_ca_is_refused() {
    let ca = Ca::generate(&region("r1")).expect("CA");
    let impostor_ca = Ca::generate(&region("r1")).expect("other CA");
    let server = material(&ca, &id("r1", Role::Arbiter, "arb-1"));
    let impostor = material(&impostor_ca, &id("r1", Role::Agent, "node-1"));
    // The impostor trusts the real CA, so only the server can refuse.
    let client = client_config(&TlsMaterial {
        cas: vec![ca.cert_der().clone()],
        ..impostor
    })
    .expect("client config");

    let outcome = exchange(&server, client, "127.0.0.1").await;
    assert!(
        outcome.server.is_err(),
        "server accepted {:?}",
        outcome.server
    );
    assert!(outcome.client.is_err(), "client got {:?}", outcome.client);
}

#[tokio::test]
async fn client_without_certificate_is_refused() {
    install_crypto_provider();
    let ca = Ca::generate(&region("r1")).expect("CA");
    let server = material(&ca, &id("r1", Role::Arbiter, "arb-1"));
    let mut roots = RootCertStore::empty();
    roots.add(ca.cert_der().clone()).expect("CA is a root");
    let mut tls = rustls::ClientConfig::builder_with_protocol_versions(&[&rustls::version::TLS13])
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).expect("QUIC-capable config");
    let client = quinn::ClientConfig::new(Arc::new(quic));

    let outcome = exchange(&server, client, "127.0.0.1").await;
    assert!(
        outcome.server.is_err(),
        "server accepted {:?}",
        outcome.server
    );
    assert!(outcome.client.is_err(), "client got {:?}", outcome.client);
}

#[tokio::test]
async fn server_certificate_from_another_ca_is_refused_by_the_client() {
    let ca = Ca::generate(&region("r1")).expect("CA");
    let impostor_ca = Ca::generate(&region("r1")).expect("other CA");
    let server = material(&impostor_ca, &id("r1", Role::Arbiter, "arb-1"));
    let client =
        client_config(&material(&ca, &id("r1", Role::Agent, "node-1"))).expect("client config");

    let outcome = exchange(&server, client, "127.0.0.1").await;
    assert!(outcome.client.is_err(), "client got {:?}", outcome.client);
    assert!(
        outcome.server.is_err(),
        "server accepted {:?}",
        outcome.server
    );
}

#[tokio::test]
async fn reloaded_ca_issues_certificates_the_original_trusts() {
    let ca = Ca::generate(&region("r1")).expect("CA");
    let (cert_pem, key_pem) = ca.to_pem();
    let reloaded = Ca::from_pem(&cert_pem, &key_pem).expect("reload");
    assert_eq!(reloaded.region(), &region("r1"));
    assert_eq!(reloaded.cert_der(), ca.cert_der());

    let server = material(&ca, &id("r1", Role::Arbiter, "arb-1"));
    let agent = id("r1", Role::Agent, "node-2");
    let client = client_config(&material(&reloaded, &agent)).expect("client config");
    let outcome = exchange(&server, client, "127.0.0.1").await;
    assert_eq!(outcome.server, Ok(agent));
}

/// The SANs of a certificate, written as `URI(..)`, `DNS(..)`, `IP(..)`.
fn sans(der: &[u8]) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) = x509_parser::parse_x509_certificate(der).expect("X.509");
    let Some(ext) = cert
        .subject_alternative_name()
        .expect("SAN extension parses")
    else {
        return Vec::new();
    };
    ext.value
        .general_names
        .iter()
        .map(|name| match name {
            GeneralName::URI(uri) => format!("URI({uri})"),
            GeneralName::DNSName(dns) => format!("DNS({dns})"),
            GeneralName::IPAddress(bytes) => {
                let ip = match bytes.len() {
                    4 => IpAddr::from(<[u8; 4]>::try_from(*bytes).expect("4 bytes")),
                    _ => IpAddr::from(<[u8; 16]>::try_from(*bytes).expect("16 bytes")),
                };
                format!("IP({ip})")
            }
            other => format!("{other}"),
        })
        .collect()
}

#[test]
fn write_certs_puts_server_names_in_server_certificates_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let names = ServerNames {
        dns: vec!["arb-1.r1.example".to_owned()],
        ips: vec!["10.0.0.5".parse().expect("ip")],
        agent_ips: [("node-2".to_owned(), vec!["10.0.0.12".parse().expect("ip")])].into(),
        arbiter_ips: [("arb-1".to_owned(), vec!["10.0.0.21".parse().expect("ip")])].into(),
    };
    let arbiter = id("r1", Role::Arbiter, "arb-1");
    let agent = id("r1", Role::Agent, "node-1");
    let addressed = id("r1", Role::Agent, "node-2");
    let other = id("r1", Role::Arbiter, "arb-2");
    write_certs(
        dir.path(),
        &region("r1"),
        &[
            arbiter.clone(),
            agent.clone(),
            addressed.clone(),
            other.clone(),
        ],
        &names,
    )
    .expect("write");
    let der = |identity: &Identity| {
        let files = TlsFiles::in_dir(dir.path(), identity);
        TlsMaterial::load(&files).expect("load").cert_chain[0].to_vec()
    };
    let arbiter_sans = sans(&der(&arbiter));
    assert!(
        arbiter_sans.contains(&"DNS(arb-1.r1.example)".to_owned()),
        "{arbiter_sans:?}"
    );
    assert!(
        arbiter_sans.contains(&"IP(10.0.0.5)".to_owned()),
        "{arbiter_sans:?}"
    );
    // An arbiter given its own address gets it, and only it does.
    assert!(
        arbiter_sans.contains(&"IP(10.0.0.21)".to_owned()),
        "{arbiter_sans:?}"
    );
    let other_sans = sans(&der(&other));
    assert!(
        other_sans.contains(&"IP(10.0.0.5)".to_owned())
            && !other_sans.contains(&"IP(10.0.0.21)".to_owned()),
        "{other_sans:?}"
    );
    let agent_sans = sans(&der(&agent));
    assert!(
        !agent_sans
            .iter()
            .any(|s| s.contains("arb-1.r1.example") || s.contains("10.0.0.5")),
        "{agent_sans:?}"
    );
    // An agent given addresses gets them, and only its own.
    assert!(
        !agent_sans.iter().any(|s| s.contains("10.0.0.12")),
        "{agent_sans:?}"
    );
    let leaf = der(&addressed);
    assert_eq!(
        crate::identity::ip_sans_from_cert_der(&leaf),
        vec!["10.0.0.12".parse::<IpAddr>().expect("ip")]
    );
}

#[test]
fn servers_get_loopback_names_and_agents_do_not() {
    let ca = Ca::generate(&region("r1")).expect("CA");
    let arbiter = ca
        .issue(
            &id("r1", Role::Arbiter, "arb-1"),
            &["arb-1.example.net".to_owned(), "localhost".to_owned()],
            &["10.0.0.7".parse().expect("ip")],
        )
        .expect("issue");
    let names = sans(&arbiter.cert_der);
    for expected in [
        "URI(rollcall://r1/arbiter/arb-1)",
        "DNS(arb-1.example.net)",
        "DNS(localhost)",
        "IP(127.0.0.1)",
        "IP(::1)",
        "IP(10.0.0.7)",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} not in {names:?}"
        );
    }
    assert_eq!(names.iter().filter(|n| *n == "DNS(localhost)").count(), 1);

    let bridge = ca
        .issue(&id("r1", Role::Bridge, "br-1"), &[], &[])
        .expect("issue");
    assert!(sans(&bridge.cert_der).contains(&"IP(127.0.0.1)".to_owned()));

    let agent = ca
        .issue(&id("r1", Role::Agent, "node-1"), &[], &[])
        .expect("issue");
    assert_eq!(
        sans(&agent.cert_der),
        vec!["URI(rollcall://r1/agent/node-1)"]
    );
    assert_eq!(
        identity_from_cert_der(&agent.cert_der),
        Ok(id("r1", Role::Agent, "node-1"))
    );
}

#[test]
fn issue_refuses_bad_dns_names_and_other_regions() {
    let ca = Ca::generate(&region("r1")).expect("CA");
    let error = ca
        .issue(&id("r1", Role::Arbiter, "a"), &["bad name".to_owned()], &[])
        .expect_err("space in DNS name");
    assert!(matches!(error, TlsError::BadDnsName { .. }), "{error}");

    let error = ca
        .issue(&id("r2", Role::Agent, "a"), &[], &[])
        .expect_err("other region");
    assert!(error.to_string().contains("region r1"), "{error}");
}

#[test]
fn from_pem_refuses_leaves_and_mismatched_keys() {
    let ca = Ca::generate(&region("r1")).expect("CA");
    let other = Ca::generate(&region("r1")).expect("CA");
    let (cert_pem, _) = ca.to_pem();
    let (_, other_key) = other.to_pem();
    let error = Ca::from_pem(&cert_pem, &other_key).expect_err("wrong key");
    assert!(matches!(error, TlsError::CaKeyMismatch { .. }), "{error}");

    let leaf = ca
        .issue(&id("r1", Role::Agent, "a"), &[], &[])
        .expect("issue");
    let error = Ca::from_pem(&leaf.cert_pem, &leaf.key_pem).expect_err("leaf");
    assert!(matches!(error, TlsError::NotOurCa { .. }), "{error}");

    let error = Ca::from_pem("garbage", "garbage").expect_err("garbage");
    assert!(matches!(error, TlsError::NotOurCa { .. }), "{error}");
}

#[test]
fn write_certs_then_load_and_reuse_the_ca() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("certs");
    let agent = id("r1", Role::Agent, "node-17");
    let written = write_certs(
        &out,
        &region("r1"),
        &[agent.clone(), agent.clone()],
        &ServerNames::default(),
    )
    .expect("write");
    assert!(!written.ca_reused);
    let names: Vec<_> = written
        .files
        .iter()
        .map(|p| p.file_name().expect("file").to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        ["ca.crt", "ca.key", "agent-node-17.crt", "agent-node-17.key"]
    );

    #[cfg(unix)]
    for key in ["ca.key", "agent-node-17.key"] {
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(out.join(key))
            .expect("key exists")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{key}");
    }

    let loaded = TlsMaterial::load(&TlsFiles::in_dir(&out, &agent)).expect("load");
    assert_eq!(loaded.identity().expect("identity"), agent);
    client_config(&loaded).expect("loaded material makes a client config");

    let ca_before = fs::read(out.join("ca.crt")).expect("ca.crt");
    let arbiter = id("r1", Role::Arbiter, "arb-1");
    let written = write_certs(
        &out,
        &region("r1"),
        std::slice::from_ref(&arbiter),
        &ServerNames::default(),
    )
    .expect("again");
    assert!(written.ca_reused);
    assert_eq!(written.files.len(), 2);
    assert_eq!(fs::read(out.join("ca.crt")).expect("ca.crt"), ca_before);
    let loaded = TlsMaterial::load(&TlsFiles::in_dir(&out, &arbiter)).expect("load");
    server_config(&loaded).expect("loaded material makes a server config");

    let error = write_certs(
        &out,
        &region("r2"),
        &[id("r2", Role::Agent, "a")],
        &ServerNames::default(),
    )
    .expect_err("CA of r1");
    assert!(matches!(error, TlsError::CaOfOtherRegion { .. }), "{error}");
    let error = write_certs(
        &out,
        &region("r1"),
        &[id("r2", Role::Agent, "a")],
        &ServerNames::default(),
    )
    .expect_err("identity of r2");
    assert!(matches!(error, TlsError::RegionMismatch { .. }), "{error}");
}

#[test]
fn half_a_ca_is_refused_and_a_ca_is_never_overwritten() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = Ca::generate(&region("r1")).expect("CA");
    ca.write(dir.path()).expect("write CA");
    let error = ca.write(dir.path()).expect_err("second write");
    assert!(matches!(error, TlsError::CaExists { .. }), "{error}");

    fs::remove_file(dir.path().join("ca.key")).expect("remove key");
    let error = write_certs(
        dir.path(),
        &region("r1"),
        &[id("r1", Role::Agent, "a")],
        &ServerNames::default(),
    )
    .expect_err("key missing");
    assert!(matches!(error, TlsError::IncompleteCa { .. }), "{error}");
    assert!(error.to_string().contains("ca.key"), "{error}");
}

#[test]
fn write_bundle_refuses_names_that_are_not_plain_files() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = Ca::generate(&region("r1")).expect("CA");
    let issued = ca
        .issue(&id("r1", Role::Agent, "a"), &[], &[])
        .expect("issue");
    for name in ["ca", "../x", "a/b", "", ".", ".."] {
        let error = write_bundle(dir.path(), name, &issued).expect_err(name);
        assert!(
            matches!(error, TlsError::BadFileName { .. }),
            "{name}: {error}"
        );
    }
}

#[test]
fn load_errors_name_the_file_and_the_remedy() {
    let dir = tempfile::tempdir().expect("temp dir");
    let agent = id("r1", Role::Agent, "a");
    write_certs(
        dir.path(),
        &region("r1"),
        std::slice::from_ref(&agent),
        &ServerNames::default(),
    )
    .expect("write");
    let files = TlsFiles::in_dir(dir.path(), &agent);

    fs::write(&files.cert, "no pem here\n").expect("overwrite cert");
    let error = TlsMaterial::load(&files).expect_err("empty cert file");
    let message = error.to_string();
    assert!(matches!(error, TlsError::NoCertificate { .. }), "{message}");
    assert!(message.contains("agent-a.crt"), "{message}");
    assert!(message.contains("rollcall certs"), "{message}");

    fs::write(&files.key, "").expect("overwrite key");
    let files = TlsFiles {
        cert: files.ca.clone(),
        ..files
    };
    let error = TlsMaterial::load(&files).expect_err("empty key file");
    assert!(matches!(error, TlsError::NoKey { .. }), "{error}");
    assert!(error.to_string().contains("agent-a.key"), "{error}");

    let missing = TlsFiles {
        ca: dir.path().join("nope.crt"),
        ..files
    };
    let error = TlsMaterial::load(&missing).expect_err("missing CA");
    assert!(error.to_string().contains("nope.crt"), "{error}");
}

#[test]
fn load_takes_a_bundle_and_checks_key_issuer_and_validity() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (agent, other) = (id("r1", Role::Agent, "a"), id("r1", Role::Agent, "b"));
    write_certs(
        dir.path(),
        &region("r1"),
        &[agent.clone(), other.clone()],
        &ServerNames::default(),
    )
    .expect("write");
    let files = TlsFiles::in_dir(dir.path(), &agent);
    let ca_pem = fs::read_to_string(&files.ca).expect("ca.crt");
    let second = Ca::generate(&region("r1")).expect("CA");
    let (second_pem, _) = second.to_pem();

    // A bundle of two CAs: both are trusted.
    fs::write(&files.ca, format!("{second_pem}{ca_pem}")).expect("bundle");
    let loaded = TlsMaterial::load(&files).expect("a bundle loads");
    assert_eq!(loaded.cas.len(), 2);
    // And `rollcall certs` keeps issuing from the CA of ca.key.
    let reread = Ca::read(dir.path()).expect("the bundle's CA of ca.key");
    assert_eq!(reread.cert_der(), &loaded.cas[1]);

    // A leaf in the bundle is refused, naming its place.
    let leaf_pem = fs::read_to_string(&files.cert).expect("leaf");
    fs::write(&files.ca, format!("{ca_pem}{leaf_pem}")).expect("bad bundle");
    let error = TlsMaterial::load(&files).expect_err("a leaf is no CA");
    assert!(
        matches!(error, TlsError::NotACa { position: 2, .. }),
        "{error}"
    );
    fs::write(&files.ca, &ca_pem).expect("restore");

    // Another identity's key.
    let mismatched = TlsFiles {
        key: TlsFiles::in_dir(dir.path(), &other).key,
        ..files.clone()
    };
    let error = TlsMaterial::load(&mismatched).expect_err("not its key");
    assert!(matches!(error, TlsError::KeyMismatch { .. }), "{error}");
    assert!(error.to_string().contains("agent-b.key"), "{error}");

    // A certificate no CA of the bundle signed.
    let strangers = dir.path().join("second.crt");
    fs::write(&strangers, &second_pem).expect("other CA");
    let untrusted = TlsFiles {
        ca: strangers,
        ..files.clone()
    };
    let error = TlsMaterial::load(&untrusted).expect_err("unknown issuer");
    assert!(matches!(error, TlsError::NotTrusted { .. }), "{error}");

    // An expired certificate (checked as of two years from now).
    let material = TlsMaterial::load(&files).expect("valid now");
    let later = SystemTime::now() + Duration::from_secs(2 * 365 * 24 * 3_600);
    let error = material.check(&files, later).expect_err("expired by then");
    assert!(matches!(error, TlsError::NotTrusted { .. }), "{error}");
    assert!(
        error.to_string().to_lowercase().contains("expired"),
        "{error}"
    );
}

#[test]
fn install_crypto_provider_is_idempotent() {
    install_crypto_provider();
    install_crypto_provider();
    assert!(rustls::crypto::CryptoProvider::get_default().is_some());
}
