//! The arbiter store against real files: recovery reproduces the catalog,
//! compaction keeps it, a log that does not replay is refused, the audit
//! log answers queries and keeps its bound, and a second opener is refused.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use rollcall_leases::store::{AuditEntry, AuditQuery, LogEntry, Store, StoreError, StoreOptions};
use rollcall_leases::{
    AgentEpoch, Catalog, CatalogParams, Command, Envelope, Generation, InstanceId, Label, Liveness,
    NodeId, Principal, PrincipalName, Reason, Registration, Revision, Role, ServiceKey, State,
    Version, Weight,
};

const NODES: u64 = 6;
const INSTANCES: u64 = 30;
const SERVICES: u64 = 4;

fn params() -> CatalogParams {
    let mut p = CatalogParams::with_region(Label::new("r1").unwrap());
    p.expired_retention_ms = 5_000;
    p.service_retention_ms = 20_000;
    p
}

fn node(i: u64) -> NodeId {
    NodeId::new(&format!("node-{i}")).unwrap()
}
fn instance(i: u64) -> InstanceId {
    InstanceId::new(&format!("checkout-7d9f8b6c4-x{i}")).unwrap()
}
fn service(i: u64) -> ServiceKey {
    ServiceKey::new("shop", &format!("svc{i}"), "http").unwrap()
}

/// A small fleet that proposes a realistic mix of commands (leases, agent
/// restarts, registrations, transitions, down verdicts, expiries, purges),
/// applies them and keeps the log entries of those that committed.
struct Fleet {
    cat: Catalog,
    now: u64,
    seed: u64,
    epochs: [u64; NODES as usize],
    logged: Vec<LogEntry>,
}

impl Fleet {
    fn new(seed: u64) -> Self {
        Fleet {
            cat: Catalog::new(params()),
            now: 1_700_000_000_000,
            seed,
            epochs: [1; NODES as usize],
            logged: Vec::new(),
        }
    }

    fn roll(&mut self, n: u64) -> u64 {
        // xorshift64*: deterministic, no dependency.
        self.seed ^= self.seed >> 12;
        self.seed ^= self.seed << 25;
        self.seed ^= self.seed >> 27;
        self.seed.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }

    fn actor(&self, role: Role, name: &str) -> Principal {
        Principal {
            role,
            name: PrincipalName::new(name).unwrap(),
        }
    }

    fn generation(&self, i: u64) -> Generation {
        self.cat
            .instance(&instance(i))
            .map_or(Generation(1), |r| r.generation)
    }

    fn propose(&mut self) -> (Principal, Command) {
        let n = self.roll(NODES);
        let i = self.roll(INSTANCES);
        let agent = self.actor(Role::Agent, &format!("node-{n}"));
        let arbiter = self.actor(Role::Arbiter, "arbiter-1");
        let epoch = AgentEpoch(self.epochs[n as usize]);
        match self.roll(100) {
            0..=11 => {
                if self.roll(10) == 0 {
                    self.epochs[n as usize] += 1;
                }
                let command = Command::GrantLease {
                    node: node(n),
                    epoch: AgentEpoch(self.epochs[n as usize]),
                    zone: Label::new(&format!("z{}", n % 3)).unwrap(),
                    ttl_ms: 10_000 + 1_000 * self.roll(2),
                };
                (agent, command)
            }
            12..=39 => {
                let home = i % NODES;
                let reg = Registration {
                    instance_id: instance(i),
                    service: service(i % SERVICES),
                    node: node(home),
                    epoch: AgentEpoch(self.epochs[home as usize]),
                    address: IpAddr::V4(Ipv4Addr::new(10, 1, home as u8, i as u8)),
                    port: 8080,
                    zone: None,
                    version: Version::new(if self.roll(4) == 0 { "v2" } else { "v1" }).unwrap(),
                    weight: Weight::DEFAULT,
                    labels: Vec::new(),
                    initial: if self.roll(2) == 0 {
                        State::Starting
                    } else {
                        State::Ready
                    },
                };
                let actor = self.actor(Role::Agent, &format!("node-{home}"));
                (actor, Command::Register(reg))
            }
            40..=74 => {
                let (to, why) = match self.roll(4) {
                    0 | 1 => (State::Ready, "startup and readiness passed"),
                    2 => (State::Draining, "drain requested"),
                    _ => (State::Unhealthy, "readiness failed 3 times"),
                };
                let command = Command::Transition {
                    instance_id: instance(i),
                    generation: self.generation(i),
                    to,
                    reason: Reason::new(why).unwrap(),
                };
                (agent, command)
            }
            75..=81 => {
                let liveness = if self.roll(2) == 0 {
                    Liveness::Passing
                } else {
                    Liveness::Failing
                };
                let command = Command::SetLiveness {
                    instance_id: instance(i),
                    generation: self.generation(i),
                    liveness,
                };
                (agent, command)
            }
            82..=88 => {
                let command = Command::Deregister {
                    instance_id: instance(i),
                    generation: self.generation(i),
                };
                (agent, command)
            }
            89..=91 => {
                let reporters = vec![node((n + 1) % NODES), node((n + 2) % NODES)];
                let command = Command::NodeDown {
                    node: node(n),
                    epoch,
                    reporters,
                };
                (arbiter, command)
            }
            92..=94 => {
                let command = Command::ExpireLease {
                    node: node(n),
                    epoch,
                    silent_in_zone: 1,
                };
                (arbiter, command)
            }
            95..=96 => (
                agent,
                Command::RevokeLease {
                    node: node(n),
                    epoch,
                },
            ),
            _ => {
                self.now += 6_000;
                (arbiter, Command::Purge)
            }
        }
    }

    /// Proposes and applies one command; returns its entry if it committed.
    fn step(&mut self) -> Option<LogEntry> {
        self.now += 5 + self.roll(200);
        let (actor, command) = self.propose();
        let env = Envelope {
            at_ms: self.now,
            actor,
            command,
        };
        let applied = self.cat.apply(&env).ok()?;
        let entry = LogEntry::committed(&env, &applied)?;
        assert_eq!(Some(entry.revision), applied.revision);
        self.logged.push(entry.clone());
        Some(entry)
    }

    /// Runs until `count` commands committed; returns their entries.
    fn commit(&mut self, count: usize) -> Vec<LogEntry> {
        let mut out = Vec::with_capacity(count);
        while out.len() < count {
            out.extend(self.step());
        }
        out
    }

    /// Appends `entries` in batches of varying size, as a server would.
    fn append_in_batches(&mut self, store: &Store, entries: &[LogEntry]) {
        let mut rest = entries;
        while !rest.is_empty() {
            let n = (1 + self.roll(40) as usize).min(rest.len());
            store.append(&rest[..n]).unwrap();
            rest = &rest[n..];
        }
    }
}

fn open(dir: &std::path::Path) -> Store {
    Store::open(dir, StoreOptions::default()).unwrap()
}

#[test]
fn a_reopened_store_recovers_the_same_catalog() {
    let dir = tempfile::tempdir().unwrap();
    let mut fleet = Fleet::new(7);
    let entries = fleet.commit(400);
    {
        let store = open(dir.path());
        fleet.append_in_batches(&store, &entries);
        assert_eq!(store.last_revision().unwrap(), fleet.cat.revision());
    }
    let store = open(dir.path());
    let recovered = store.recover(params()).unwrap();
    assert_eq!(recovered.catalog.export(), fleet.cat.export());
    assert_eq!(recovered.catalog.revision(), Revision(400));
    assert_eq!(recovered.replayed, 400);
    assert_eq!(recovered.snapshot_revision, Revision(0));
    assert_eq!(store.log_len().unwrap(), 400);

    // The sequence exercised more than registrations.
    let kinds: std::collections::BTreeSet<&str> =
        entries.iter().map(|e| e.command.command.kind()).collect();
    for kind in [
        "grant-lease",
        "register",
        "transition",
        "deregister",
        "node-down",
    ] {
        assert!(kinds.contains(kind), "{kind} missing from {kinds:?}");
    }
}

#[test]
fn an_empty_store_recovers_an_empty_catalog() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path().join("nested/data").as_path());
    let recovered = store.recover(params()).unwrap();
    assert_eq!(recovered.catalog.export(), Catalog::new(params()).export());
    assert_eq!(recovered.replayed, 0);
    assert_eq!(store.last_revision().unwrap(), Revision(0));
    store.append(&[]).unwrap();
}

#[test]
fn a_compacted_store_recovers_from_snapshot_plus_log() {
    let dir = tempfile::tempdir().unwrap();
    let mut fleet = Fleet::new(11);
    let options = StoreOptions {
        compact_every: 250,
        ..StoreOptions::default()
    };
    let first = fleet.commit(300);
    let middle = fleet.cat.export();
    {
        let store = Store::open(dir.path(), options.clone()).unwrap();
        fleet.append_in_batches(&store, &first);
        assert!(store.needs_compaction().unwrap());
        store.compact(&middle).unwrap();
        assert_eq!(store.log_len().unwrap(), 0);
        assert!(!store.needs_compaction().unwrap());
        assert_eq!(store.last_revision().unwrap(), Revision(300));
        let second = fleet.commit(200);
        fleet.append_in_batches(&store, &second);
        assert_eq!(store.log_len().unwrap(), 200);
    }
    let store = Store::open(dir.path(), options).unwrap();
    let recovered = store.recover(params()).unwrap();
    assert_eq!(recovered.catalog.export(), fleet.cat.export());
    assert_eq!(recovered.snapshot_revision, Revision(300));
    assert_eq!(recovered.replayed, 200);

    // Compacting again at the end empties the log and still recovers.
    store.compact(&fleet.cat.export()).unwrap();
    assert_eq!(store.log_len().unwrap(), 0);
    let again = store.recover(params()).unwrap();
    assert_eq!(again.catalog.export(), fleet.cat.export());
    assert_eq!(again.replayed, 0);

    // An older snapshot, or one of changes not yet logged, is refused.
    assert!(matches!(
        store.compact(&middle),
        Err(StoreError::SnapshotBehind { .. })
    ));
    fleet.commit(1);
    assert!(matches!(
        store.compact(&fleet.cat.export()),
        Err(StoreError::SnapshotAhead { .. })
    ));
}

#[test]
fn a_store_entry_that_no_longer_replays_fails_recovery_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut fleet = Fleet::new(3);
    let entries = fleet.commit(50);
    let store = open(dir.path());
    store.append(&entries).unwrap();

    // Hand-made: a transition of an instance that was never registered,
    // logged as if it had committed revision 51.
    let env = Envelope {
        at_ms: fleet.now + 1,
        actor: fleet.actor(Role::Operator, "ops"),
        command: Command::Transition {
            instance_id: InstanceId::new("ghost-1").unwrap(),
            generation: Generation(1),
            to: State::Draining,
            reason: Reason::new("drain requested").unwrap(),
        },
    };
    let audit = AuditEntry {
        revision: Revision(51),
        at_ms: env.at_ms,
        actor: env.actor.clone(),
        command: "transition".into(),
        services: Vec::new(),
        instance: None,
        detail: "forged".into(),
    };
    let forged = LogEntry {
        revision: Revision(51),
        command: env,
        audit,
    };
    store.append(&[forged]).unwrap();
    let err = store.recover(params()).unwrap_err();
    match &err {
        StoreError::Replay { revision, detail } => {
            assert_eq!(*revision, Revision(51));
            assert!(detail.contains("rejected"), "{detail}");
        }
        other => panic!("expected Replay, got {other}"),
    }
    assert!(err.to_string().contains("revision 51"), "{err}");
}

#[test]
fn a_store_refuses_entries_that_break_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    let mut fleet = Fleet::new(5);
    let entries = fleet.commit(10);
    let store = open(dir.path());
    store.append(&entries[..4]).unwrap();
    // A gap: nothing of the batch is written.
    let err = store.append(&[entries[4].clone(), entries[6].clone()]);
    assert!(matches!(
        err,
        Err(StoreError::OutOfOrder {
            expected: Revision(6),
            got: Revision(7)
        })
    ));
    assert_eq!(store.last_revision().unwrap(), Revision(4));
    // A replay of something already logged.
    assert!(matches!(
        store.append(&entries[3..5]),
        Err(StoreError::OutOfOrder { .. })
    ));
    // An audit entry of another revision.
    let mut wrong = entries[4].clone();
    wrong.audit.revision = Revision(9);
    assert!(matches!(
        store.append(&[wrong]),
        Err(StoreError::AuditMismatch { .. })
    ));
    store.append(&entries[4..]).unwrap();
    assert_eq!(store.last_revision().unwrap(), Revision(10));
}

#[test]
fn store_audit_filters_by_service_and_since_and_keeps_its_bound() {
    let dir = tempfile::tempdir().unwrap();
    let mut fleet = Fleet::new(13);
    let options = StoreOptions {
        audit_max_entries: 120,
        ..StoreOptions::default()
    };
    let store = Store::open(dir.path(), options).unwrap();
    let entries = fleet.commit(300);
    fleet.append_in_batches(&store, &entries);
    let kept: Vec<AuditEntry> = entries[180..].iter().map(|e| e.audit.clone()).collect();

    let all = store
        .audit(&AuditQuery {
            service: None,
            since: None,
            limit: usize::MAX,
        })
        .unwrap();
    assert_eq!(all, kept, "retention keeps exactly the newest 120");

    let since = store
        .audit(&AuditQuery {
            service: None,
            since: Some(Revision(250)),
            limit: 10,
        })
        .unwrap();
    let revisions: Vec<u64> = since.iter().map(|e| e.revision.0).collect();
    assert_eq!(revisions, (251..=260).collect::<Vec<_>>());

    let svc = service(1);
    let filtered = store
        .audit(&AuditQuery {
            service: Some(svc.clone()),
            since: Some(Revision(200)),
            limit: usize::MAX,
        })
        .unwrap();
    let expected: Vec<AuditEntry> = kept
        .iter()
        .filter(|e| e.revision > Revision(200) && e.services.contains(&svc))
        .cloned()
        .collect();
    assert!(!expected.is_empty());
    assert_eq!(filtered, expected);
    let limited = store
        .audit(&AuditQuery {
            service: Some(svc),
            since: Some(Revision(200)),
            limit: 2,
        })
        .unwrap();
    assert_eq!(limited, expected[..2]);

    // Entries say who did what to which instance.
    let transition = all
        .iter()
        .find(|e| e.command == "transition")
        .expect("a transition was audited");
    assert!(transition.instance.is_some());
    assert!(
        transition.detail.starts_with("-> "),
        "{}",
        transition.detail
    );
}

#[test]
fn a_second_open_of_the_same_store_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let _first = open(dir.path());
    let err = Store::open(dir.path(), StoreOptions::default()).unwrap_err();
    assert!(matches!(err, StoreError::Locked { .. }), "{err}");
    assert!(err.to_string().contains("--data-dir"), "{err}");
}

#[test]
fn store_options_are_validated_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions {
        audit_max_entries: 0,
        ..StoreOptions::default()
    };
    let err = Store::open(dir.path(), options).unwrap_err();
    assert!(err.to_string().contains("audit_max_entries"), "{err}");
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Group-commit cost on this machine's disk. Not a pass/fail test: run with
/// `cargo test --release -p rollcall-leases --test store -- --ignored --nocapture`.
#[test]
#[ignore = "measurement; prints timings"]
fn store_append_and_recovery_timings() {
    const RUNS: usize = 50;
    const BATCH: usize = 256;
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut fleet = Fleet::new(17);
    let entries = fleet.commit(RUNS + RUNS * BATCH + 20_000);
    let (singles, rest) = entries.split_at(RUNS);
    let (batched, tail) = rest.split_at(RUNS * BATCH);

    let one: Vec<Duration> = singles
        .iter()
        .map(|e| {
            let start = Instant::now();
            store.append(std::slice::from_ref(e)).unwrap();
            start.elapsed()
        })
        .collect();
    let many: Vec<Duration> = batched
        .chunks(BATCH)
        .map(|chunk| {
            let start = Instant::now();
            store.append(chunk).unwrap();
            start.elapsed()
        })
        .collect();
    for chunk in tail.chunks(BATCH) {
        store.append(chunk).unwrap();
    }
    let total = store.log_len().unwrap();
    let start = Instant::now();
    let recovered = store.recover(params()).unwrap();
    let replay = start.elapsed();
    assert_eq!(recovered.catalog.export(), fleet.cat.export());

    let start = Instant::now();
    store.compact(&fleet.cat.export()).unwrap();
    let compact = start.elapsed();
    let bytes = std::fs::metadata(store.path()).unwrap().len();
    drop(store);
    let start = Instant::now();
    let reopened = open(dir.path());
    let reopen = start.elapsed();
    drop(reopened);

    let m1 = median(one);
    let mb = median(many);
    println!("append 1 entry (fsync):      median {m1:?} over {RUNS} runs");
    println!(
        "append {BATCH} entries (fsync): median {mb:?} over {RUNS} runs ({:?} per entry)",
        mb / BATCH as u32
    );
    println!("recover {total} log entries:   {replay:?}");
    println!("compact:                     {compact:?}");
    println!("reopen with integrity check: {reopen:?} (file {bytes} bytes)");
}
