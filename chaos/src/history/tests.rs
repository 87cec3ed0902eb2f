use super::*;

fn entry(
    revision: u64,
    at_ms: u64,
    command: &str,
    instance: Option<&str>,
    detail: &str,
) -> AuditEntry {
    AuditEntry {
        revision,
        at_ms,
        actor: "agent:n1".to_owned(),
        command: command.to_owned(),
        instance: instance.map(str::to_owned),
        detail: detail.to_owned(),
    }
}

fn register(revision: u64, at_ms: u64, instance: &str, generation: u64) -> AuditEntry {
    entry(
        revision,
        at_ms,
        "register",
        Some(instance),
        &format!("registered generation {generation} READY on n1 at 10.0.0.1:9000 version v1"),
    )
}

fn nodes() -> BTreeMap<String, Vec<String>> {
    BTreeMap::from([
        ("n1".to_owned(), vec!["a".to_owned(), "b".to_owned()]),
        ("n2".to_owned(), vec!["c".to_owned()]),
    ])
}

fn write(sent_ms: u64, kind: WriteKind, instance: &str, answer: Answer) -> Write {
    Write {
        sent_ms,
        kind,
        instance: instance.to_owned(),
        answer,
    }
}

fn cause(at_ms: u64, instance: &str) -> Cause {
    Cause {
        at_ms,
        instance: instance.to_owned(),
        what: "drain".to_owned(),
    }
}

fn started() -> Vec<AuditEntry> {
    vec![
        register(1, 100, "a", 1),
        register(2, 110, "b", 1),
        register(3, 120, "c", 1),
    ]
}

#[test]
fn a_node_down_about_a_node_the_scenario_left_alone_is_a_false_removal() {
    let mut audit = started();
    audit.push(entry(
        4,
        1000,
        "node-down",
        None,
        "node down n1 epoch 2 reported by n2: 2 records UNHEALTHY",
    ));
    let h = check(&audit, &nodes(), &[], &[], &[], None, 0);
    let removed: Vec<&str> = h
        .false_removals
        .iter()
        .map(|r| r.instance.as_str())
        .collect();
    assert_eq!(removed, ["a", "b"]);
    // Crashing the node first makes it the scenario's doing.
    let causes = [cause(900, "a"), cause(900, "b")];
    let h = check(&audit, &nodes(), &causes, &[], &[], None, 0);
    assert!(h.false_removals.is_empty(), "{:?}", h.false_removals);
}

#[test]
fn a_transition_nobody_caused_is_a_false_removal_until_ready_again() {
    let mut audit = started();
    audit.push(entry(
        4,
        1000,
        "transition",
        Some("c"),
        "-> UNHEALTHY (generation 1): readiness http GET /ready: timed out",
    ));
    audit.push(entry(
        5,
        2000,
        "transition",
        Some("c"),
        "-> READY (generation 1): readiness passed",
    ));
    let h = check(&audit, &nodes(), &[cause(500, "c")], &[], &[], None, 0);
    assert!(h.false_removals.is_empty());
    assert_eq!(h.leaves, [(1000, "c".to_owned())]);
    assert_eq!(h.ready.last(), Some(&(2000, "c".to_owned())));
    // The cause is spent once it is READY again: a second fall is false.
    audit.push(entry(
        6,
        3000,
        "transition",
        Some("c"),
        "-> UNHEALTHY (generation 1): readiness",
    ));
    let h = check(&audit, &nodes(), &[cause(500, "c")], &[], &[], None, 0);
    assert_eq!(h.false_removals.len(), 1);
    assert_eq!(h.false_removals[0].at_ms, 3000);
    // Before the judged window, nothing counts.
    let h = check(&audit, &nodes(), &[cause(500, "c")], &[], &[], None, 5000);
    assert!(h.false_removals.is_empty());
}

#[test]
fn bad_probe_failures_are_not_leaves() {
    let mut audit = started();
    audit.push(entry(
        4,
        1000,
        "transition",
        Some("a"),
        "-> UNHEALTHY (generation 1): readiness",
    ));
    let h = check(
        &audit,
        &nodes(),
        &[cause(900, "a")],
        &[],
        &["a".to_owned()],
        None,
        0,
    );
    assert!(h.leaves.is_empty());
}

#[test]
fn committed_and_pending_writes_must_be_in_the_log_in_order() {
    let mut audit = started();
    audit.push(entry(
        4,
        1000,
        "transition",
        Some("a"),
        "-> DRAINING (generation 1): drain requested",
    ));
    audit.push(entry(
        5,
        1500,
        "deregister",
        Some("a"),
        "deregistered generation 1",
    ));
    let committed = Answer::Committed { generation: None };
    let writes = vec![
        write(
            90,
            WriteKind::Register,
            "a",
            Answer::Committed {
                generation: Some(1),
            },
        ),
        write(990, WriteKind::Drain, "a", committed),
        write(1400, WriteKind::Deregister, "a", Answer::Pending),
    ];
    let h = check(&audit, &nodes(), &[], &writes, &[], None, 0);
    assert_eq!(
        (h.writes_checked, h.lost_writes.len()),
        (3, 0),
        "{:?}",
        h.lost_writes
    );

    // A committed drain the log does not hold is lost.
    let mut lost = writes.clone();
    lost.push(write(1600, WriteKind::Drain, "b", committed));
    let h = check(&audit, &nodes(), &[], &lost, &[], None, 0);
    assert_eq!(h.lost_writes.len(), 1, "{:?}", h.lost_writes);
    assert!(
        h.lost_writes[0].contains("b: a drain answered committed"),
        "{}",
        h.lost_writes[0]
    );

    // A second drain of an instance already DRAINING changes nothing
    // (the arbiter commits no revision for it): not lost. The same
    // drain sent before the first one committed would be.
    let mut again = writes[..2].to_vec();
    again.push(write(1200, WriteKind::Drain, "a", committed));
    let h = check(&audit, &nodes(), &[], &again, &[], None, 0);
    assert_eq!(
        (h.writes_checked, h.lost_writes.len()),
        (3, 0),
        "{:?}",
        h.lost_writes
    );
    again[2].sent_ms = 900;
    again.swap(1, 2);
    let h = check(&audit, &nodes(), &[], &again, &[], None, 0);
    assert_eq!(h.lost_writes.len(), 1, "{:?}", h.lost_writes);

    // Out of order: the drain after the deregistration was answered
    // first, so the log's order contradicts the client's.
    let swapped = vec![writes[0].clone(), writes[2].clone(), writes[1].clone()];
    let h = check(&audit, &nodes(), &[], &swapped, &[], None, 0);
    assert_eq!(h.lost_writes.len(), 1, "{:?}", h.lost_writes);

    // A registration answered with another generation.
    let wrong = vec![write(
        90,
        WriteKind::Register,
        "a",
        Answer::Committed {
            generation: Some(2),
        },
    )];
    let h = check(&audit, &nodes(), &[], &wrong, &[], None, 0);
    assert_eq!(h.lost_writes.len(), 1, "{:?}", h.lost_writes);

    // Refused writes are not checked.
    let refused = vec![write(90, WriteKind::Drain, "c", Answer::Refused)];
    let h = check(&audit, &nodes(), &[], &refused, &[], None, 0);
    assert_eq!((h.writes_checked, h.lost_writes.len()), (0, 0));
}

#[test]
fn a_pending_write_made_moot_by_a_recorded_end_is_not_lost() {
    let mut audit = started();
    audit.push(entry(
        4,
        2000,
        "expire-lease",
        None,
        "lease expired n2 epoch 1: 1 records EXPIRED",
    ));
    let writes = vec![write(1000, WriteKind::Drain, "c", Answer::Pending)];
    let h = check(&audit, &nodes(), &[], &writes, &[], None, 0);
    assert!(h.lost_writes.is_empty(), "{:?}", h.lost_writes);
    let h = check(&started(), &nodes(), &[], &writes, &[], None, 0);
    assert_eq!(h.lost_writes.len(), 1);
}

#[test]
fn the_final_catalog_must_be_the_replay() {
    let mut audit = started();
    audit.push(entry(
        4,
        1000,
        "node-down",
        None,
        "node down n2 epoch 1 reported by n1: 1 records UNHEALTHY",
    ));
    let record = |generation, state: &str| FinalRecord {
        generation,
        state: state.to_owned(),
    };
    let mut catalog = BTreeMap::from([
        ("a".to_owned(), record(1, "READY")),
        ("b".to_owned(), record(1, "READY")),
        ("c".to_owned(), record(1, "UNHEALTHY")),
    ]);
    let h = check(
        &audit,
        &nodes(),
        &[cause(900, "c")],
        &[],
        &[],
        Some(&catalog),
        0,
    );
    assert!(h.lost_writes.is_empty(), "{:?}", h.lost_writes);
    catalog.remove("b");
    catalog.insert("ghost".to_owned(), record(1, "READY"));
    catalog.insert("c".to_owned(), record(1, "READY"));
    let h = check(
        &audit,
        &nodes(),
        &[cause(900, "c")],
        &[],
        &[],
        Some(&catalog),
        0,
    );
    assert_eq!(h.lost_writes.len(), 3, "{:?}", h.lost_writes);
}
