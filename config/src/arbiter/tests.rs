//! The arbiter file's tests: defaults, bounds, the example file.

use super::*;

#[test]
fn empty_file_gives_defaults() {
    assert_eq!(
        ArbiterConfig::from_toml_str("").expect("empty is valid"),
        ArbiterConfig::default()
    );
}

#[test]
fn example_file_shows_every_default() {
    let text = include_str!("../../examples/arbiter.toml");
    assert_eq!(
        ArbiterConfig::from_toml_str(text).expect("example must load"),
        ArbiterConfig::default()
    );
}

/// The example file with every `# <start>…` line uncommented.
fn uncommented_example(starts: &[&str]) -> String {
    crate::uncommented(include_str!("../../examples/arbiter.toml"), starts)
}

fn pattern(text: &str) -> crate::ServicePattern {
    crate::ServicePattern::try_from(text.to_owned()).expect("valid pattern")
}

fn node_pattern(text: &str) -> crate::NodePattern {
    crate::NodePattern::try_from(text.to_owned()).expect("valid node pattern")
}

#[test]
fn registration_rules_name_their_nodes_and_match_by_prefix() {
    let rule: RegistrationRule =
        toml::from_str("nodes = [\"edge-*\", \"db-1\"]\nservices = [\"default/web/*\"]\n")
            .expect("a rule parses");
    assert!(rule.applies_to("edge-7", None));
    assert!(rule.applies_to("db-1", Some("z1")));
    assert!(!rule.applies_to("db-10", Some("z1")));
    assert!(rule.lists("default", "web", "http"));
    assert!(!rule.lists("default", "api", "http"));
    let zoned: RegistrationRule =
        toml::from_str("zones = [\"dmz\"]\nservices = [\"*\"]\n").expect("a rule parses");
    assert!(zoned.applies_to("any-node", Some("dmz")));
    assert!(!zoned.applies_to("any-node", Some("z1")));
    assert!(!zoned.applies_to("any-node", None));

    for (text, says) in [
        ("services = [\"*\"]\n", "must name the nodes (or zones)"),
        (
            "nodes = [\"a\"]\nservices = []\n",
            "at least one service pattern",
        ),
        (
            "zones = [\"Bad_Zone\"]\nservices = [\"*\"]\n",
            "registration_rules[0].zones[0]",
        ),
    ] {
        let config = format!("[[registration_rules]]\n{text}");
        let err = ArbiterConfig::from_toml_str(&config)
            .expect_err(text)
            .to_string();
        assert!(err.contains(says), "{text}: {err}");
    }
    let err = ArbiterConfig::from_toml_str(
        "[[registration_rules]]\nnodes = [\"Edge*\"]\nservices = [\"*\"]\n",
    )
    .expect_err("a bad node pattern is refused")
    .to_string();
    assert!(err.contains("node pattern \"Edge*\" is invalid"), "{err}");
    let err = ArbiterConfig::from_toml_str("[registration]\naddresses = \"some\"\n")
        .expect_err("an unknown address rule is refused")
        .to_string();
    assert!(err.contains("addresses"), "{err}");
}

/// The example shows the optional `[tls]`, `[[controllers]]` and
/// `[[watch_rules]]` tables commented out; uncommented they must parse,
/// validate and change nothing else.
#[test]
fn example_optional_tables_parse_and_validate() {
    let text = uncommented_example(
        &[
            &crate::security::TLS_EXAMPLE_LINES[..],
            &[
                "[[controllers]]",
                "name = ",
                "services = ",
                "[[watch_rules]]",
                "nodes = ",
                "[[registration_rules]]",
                "zones = ",
                "any_address = ",
                "[[node_zones]]",
                "zone = ",
                "max_weight = ",
            ],
        ]
        .concat(),
    );
    let mut config = ArbiterConfig::from_toml_str(&text).expect("uncommented example must load");
    assert_eq!(
        config.tls.take(),
        Some(TlsPaths::new(
            PathBuf::from("/etc/rollcall/certs/ca.crt"),
            PathBuf::from("/etc/rollcall/certs/arbiter-arbiter-1.crt"),
            PathBuf::from("/etc/rollcall/certs/arbiter-arbiter-1.key"),
        ))
    );
    assert_eq!(
        std::mem::take(&mut config.controllers),
        vec![ControllerGrant {
            name: "deployer".to_owned(),
            services: vec![pattern("default/web/*"), pattern("shop/*")],
        }]
    );
    assert_eq!(
        std::mem::take(&mut config.watch_rules),
        vec![WatchRule {
            nodes: vec!["edge-1".to_owned(), "edge-2".to_owned()],
            services: vec![pattern("default/web/*"), pattern("shop/cart/http")],
        }]
    );
    assert_eq!(
        std::mem::take(&mut config.registration_rules),
        vec![RegistrationRule {
            nodes: vec![node_pattern("edge-*")],
            zones: vec!["dmz".to_owned()],
            services: vec![pattern("default/web/*")],
            any_address: false,
        }]
    );
    assert_eq!(
        std::mem::take(&mut config.node_zones),
        vec![crate::NodeZone {
            nodes: vec![node_pattern("edge-*")],
            zone: "dmz".to_owned(),
            max_weight: Some(500),
        }]
    );
    assert_eq!(config, ArbiterConfig::default());
}

/// Every key of the config appears in the example (set or commented
/// out), so a key added later cannot be forgotten there.
#[test]
fn example_names_every_key() {
    let example = include_str!("../../examples/arbiter.toml");
    let config = ArbiterConfig {
        tls: Some(TlsPaths::new("ca".into(), "cert".into(), "key".into())),
        controllers: vec![ControllerGrant {
            name: "c".to_owned(),
            services: vec![pattern("*")],
        }],
        watch_rules: vec![WatchRule {
            nodes: vec!["n".to_owned()],
            services: vec![pattern("*")],
        }],
        node_zones: vec![crate::NodeZone {
            nodes: vec![node_pattern("n")],
            zone: "z".to_owned(),
            max_weight: Some(1),
        }],
        registration_rules: vec![RegistrationRule {
            nodes: vec![node_pattern("n")],
            zones: vec!["z".to_owned()],
            services: vec![pattern("*")],
            any_address: true,
        }],
        ..ArbiterConfig::default()
    };
    let full = toml::to_string(&config).expect("serializable");
    for line in full.lines().filter(|l| !l.is_empty()) {
        let key = line.split(" = ").next().expect("a key or header");
        let shown = example
            .lines()
            .map(|l| l.strip_prefix("# ").unwrap_or(l))
            .any(|l| l == key || l.starts_with(&format!("{key} = ")));
        assert!(shown, "{key} is not in examples/arbiter.toml");
    }
}

#[test]
fn raft_errors_name_the_field() {
    let cases = [
        ("[raft]\nid = 0", "arbiter.raft.id"),
        (
            "[raft]\nid = 4\n[[raft.replicas]]\nid = 1\naddr = \"a:1\"",
            "arbiter.raft.replicas",
        ),
        (
            "[[raft.replicas]]\nid = 1\naddr = \"no-port\"",
            "arbiter.raft.replicas[0].addr",
        ),
        (
            "[[raft.replicas]]\nid = 1\naddr = \"a:1\"\n[[raft.replicas]]\nid = 1\naddr = \"b:1\"",
            "arbiter.raft.replicas[1].id",
        ),
        (
            "[raft]\nelection_min_ms = 50",
            "arbiter.raft.election_min_ms",
        ),
        (
            "[raft]\nwrite_timeout_ms = 400",
            "arbiter.raft.write_timeout_ms",
        ),
    ];
    for (text, field) in cases {
        let err = ArbiterConfig::from_toml_str(text)
            .expect_err(text)
            .to_string();
        assert!(err.contains(field), "{text:?}: {err}");
    }
}

#[test]
fn default_round_trips_through_toml() {
    let text = toml::to_string(&ArbiterConfig::default()).expect("serializable");
    assert_eq!(
        ArbiterConfig::from_toml_str(&text).expect("round trip"),
        ArbiterConfig::default()
    );
}

#[test]
fn coalesce_window_above_bound_is_rejected() {
    let err =
        ArbiterConfig::from_toml_str("[distribution]\ncoalesce_window_ms = 400\n").unwrap_err();
    assert_eq!(
        err.to_string(),
        "arbiter.distribution.coalesce_window_ms = 400 must be at most 250"
    );
}

#[test]
fn resend_after_outside_its_range_is_rejected() {
    for (value, expected) in [
        (
            99,
            "arbiter.distribution.resend_after_ms = 99 must be at least 100",
        ),
        (
            60_001,
            "arbiter.distribution.resend_after_ms = 60001 must be at most 60000",
        ),
    ] {
        let text = format!("[distribution]\nresend_after_ms = {value}\n");
        let err = ArbiterConfig::from_toml_str(&text).unwrap_err();
        assert_eq!(err.to_string(), expected);
    }
    for value in [100, 60_000] {
        let text = format!("[distribution]\nresend_after_ms = {value}\n");
        let config = ArbiterConfig::from_toml_str(&text).expect("within the range");
        assert_eq!(config.distribution.resend_after_ms, value);
    }
}

#[test]
fn udp_receive_buffer_is_the_kernels_or_within_its_range() {
    for value in [1, 65_535, 268_435_457] {
        let err = ArbiterConfig::from_toml_str(&format!("udp_recv_buffer_bytes = {value}\n"))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("arbiter.udp_recv_buffer_bytes = {value} must be 0 (the kernel's default) or from 65536 to 268435456")
        );
    }
    for value in [0, 65_536, 4_194_304, 268_435_456] {
        let config = ArbiterConfig::from_toml_str(&format!("udp_recv_buffer_bytes = {value}\n"))
            .expect("0 or within the range");
        assert_eq!(config.udp_recv_buffer_bytes, value);
    }
}

#[test]
fn bad_values_name_their_fields() {
    type Breaks = fn(&mut ArbiterConfig);
    let cases: [(&str, Breaks); 10] = [
        ("arbiter.name", |c| c.name = "-a".to_owned()),
        ("arbiter.admin", |c| c.admin = c.listen),
        ("arbiter.lease.sweep_interval_ms", |c| {
            c.lease.sweep_interval_ms = c.lease.ttl_ms
        }),
        ("arbiter.lease.silence_ms", |c| c.lease.silence_ms = 20_000),
        ("arbiter.lease.probe_timeout_ms", |c| {
            c.lease.probe_timeout_ms = c.lease.ttl_ms / 2 + 1
        }),
        ("arbiter.lease.probe_timeout_ms", |c| {
            c.lease.probe_timeout_ms = 0
        }),
        ("arbiter.guard.max_share", |c| c.guard.max_share = 0.0),
        ("arbiter.guard.max_share", |c| c.guard.max_share = 1.5),
        ("arbiter.catalog.allowed_label_keys[1]", |c| {
            c.catalog.allowed_label_keys = vec!["tier".to_owned(), "tier".to_owned()]
        }),
        ("arbiter.delta_log.max_entries", |c| {
            c.delta_log.max_entries = 0
        }),
    ];
    for (field, breaks) in cases {
        let mut config = ArbiterConfig::default();
        breaks(&mut config);
        let message = config.validate().unwrap_err().to_string();
        assert!(message.starts_with(&format!("{field} = ")), "{message}");
    }
}
