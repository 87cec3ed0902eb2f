use super::*;
use crate::report::{compute, ReportInput};
use crate::scenario::Pass;
use crate::timeline::{Conn, Route};

fn conn(t_ms: u64, agent: &str, backend: Option<&str>) -> Conn {
    Conn {
        t_ms,
        agent: agent.to_owned(),
        backend: backend.map(str::to_owned),
        outcome: if backend.is_some() {
            Outcome::Answered
        } else {
            Outcome::Failed
        },
    }
}

/// A small rolling deploy: web-1 and web-2 answer, web-1 drains and
/// exits, web-3 is killed, with a partition and a heal.
fn deploy() -> Timeline {
    let mut conns = Vec::new();
    for t in (0..10_000).step_by(50) {
        let backend = match (t / 50) % 3 {
            0 if t < 4_200 => Some("web-1"),
            0 | 1 => Some("web-2"),
            _ if t < 6_000 => Some("web-3"),
            _ if t < 6_400 => None,
            _ => Some("web-2"),
        };
        conns.push(conn(t, "node-0", backend));
    }
    Timeline {
        views: Vec::new(),
        region_answers: Vec::new(),
        backend_regions: Default::default(),
        conns,
        routes: vec![Route {
            t_ms: 100,
            agent: "node-0".into(),
            instances: vec!["web-1".into(), "web-2".into(), "web-3".into()],
        }],
        events: vec![
            Event::Phase {
                t_ms: 0,
                name: "steady".into(),
            },
            Event::LeaveCommitted {
                t_ms: 3_000,
                instance: "web-1".into(),
            },
            Event::BackendExit {
                t_ms: 7_000,
                instance: "web-1".into(),
            },
            Event::Step {
                t_ms: 5_000,
                action: "partition-node".into(),
                target: "node-1".into(),
            },
            Event::HardFailure {
                t_ms: 6_000,
                instance: "web-3".into(),
                fault: "kill-backend".into(),
            },
            Event::Step {
                t_ms: 8_000,
                action: "heal".into(),
                target: String::new(),
            },
            Event::LeaveCommitted {
                t_ms: 5_500,
                instance: "web-2".into(),
            },
            // Left without a connection after its commit: a 0 ms bar.
            Event::LeaveCommitted {
                t_ms: 9_000,
                instance: "web-4".into(),
            },
        ],
        duration_ms: 10_000,
    }
}

fn report_of(timeline: &Timeline) -> Report {
    compute(&ReportInput::default(), timeline, &Pass::default())
}

fn read_svg(dir: &Path, file: &str) -> String {
    let svg = std::fs::read_to_string(dir.join(file)).expect("plot written");
    assert!(
        svg.starts_with("<svg") || svg.starts_with("<?xml"),
        "{file}: {}",
        &svg[..svg.len().min(80)]
    );
    assert!(svg.trim_end().ends_with("</svg>"), "{file} is closed");
    svg
}

#[test]
fn writes_the_three_plots_of_a_deploy() {
    let timeline = deploy();
    let report = report_of(&timeline);
    let dir = tempfile::tempdir().expect("temp dir");
    let written = write_all(dir.path(), &report, &timeline).expect("plots written");
    assert_eq!(written, [TRAFFIC, CDF, STAGES]);

    let traffic = read_svg(dir.path(), TRAFFIC);
    for text in [
        "answered: READY",
        "answered: leaving",
        "failed (lower panel)",
        "steady",
        "leave web-1",
        "kill-backend web-3",
        "partition-node node-1",
        "\nheal\n",
        "| hard failure (1)",
    ] {
        assert!(traffic.contains(text), "traffic.svg lacks {text:?}");
    }

    let cdf = read_svg(dir.path(), CDF);
    let p99 = report.leave_ms.p99.expect("leave samples");
    assert!(cdf.contains(&format!("leave n=3, p99 {p99} ms")), "{cdf}");
    assert!(cdf.contains("crash n=1"), "{cdf}");

    let stages = read_svg(dir.path(), STAGES);
    for sample in &report::samples(&timeline).leave {
        assert!(stages.contains(&sample.instance), "{stages}");
        assert!(
            stages.contains(&format!("\n{} ms\n", sample.ms)),
            "{stages}"
        );
    }
    assert!(!stages.contains("web-3"), "only instances that left");
    assert!(stages.contains("backend exits: 1"), "{stages}");
}

#[test]
fn an_empty_timeline_says_there_is_no_data() {
    let timeline = Timeline::default();
    let report = report_of(&timeline);
    let dir = tempfile::tempdir().expect("temp dir");
    let written = write_all(dir.path(), &report, &timeline).expect("plots written");
    assert_eq!(written, [TRAFFIC, CDF], "no stages without a leave");
    assert!(!dir.path().join(STAGES).exists());
    assert!(read_svg(dir.path(), TRAFFIC).contains("no data"));
    assert!(read_svg(dir.path(), CDF).contains("no data"));
}

#[test]
fn every_instance_that_left_has_a_labelled_row() {
    let names: Vec<String> = (0..13).map(|i| format!("i{i:02}")).collect();
    let timeline = Timeline {
        events: names
            .iter()
            .enumerate()
            .map(|(i, name)| Event::LeaveCommitted {
                t_ms: 1_000 * i as u64,
                instance: name.clone(),
            })
            .collect(),
        duration_ms: 20_000,
        ..Timeline::default()
    };
    let svg = stages(&timeline, &report::samples(&timeline)).expect("drawn");
    for name in &names {
        assert!(svg.contains(&format!("\n{name}\n")), "{name}: {svg}");
    }
}

#[test]
fn a_kind_without_samples_is_named_in_the_cdf_title() {
    let mut timeline = deploy();
    timeline
        .events
        .retain(|e| !matches!(e, Event::HardFailure { .. }));
    let svg = cdf(&report_of(&timeline), &report::samples(&timeline)).expect("drawn");
    assert!(svg.contains("no crash samples"), "{svg}");
    assert!(svg.contains("leave n=3"), "{svg}");
}

#[test]
fn the_cdf_is_a_step_function_of_the_samples() {
    let sample = |ms| Sample {
        instance: "x".into(),
        start_ms: 0,
        ms,
    };
    assert_eq!(
        steps(&[sample(300), sample(100)]),
        [
            (0.0, 0.0),
            (100.0, 0.0),
            (100.0, 0.5),
            (300.0, 0.5),
            (300.0, 1.0)
        ]
    );
}

#[test]
fn a_large_cdf_is_thinned_and_keeps_its_ends() {
    let us: Vec<u64> = (1..=100_000).rev().map(|i| i * 10).collect();
    let points = cdf_steps(&us, 1_000.0, 0.01);
    assert!(
        points.len() <= 2 * MAX_STEPS + 3,
        "{} corners",
        points.len()
    );
    assert_eq!(points[0], (0.01, 0.0));
    assert_eq!(points[1], (0.01, 0.0), "10 µs is drawn at the floor");
    assert_eq!(*points.last().unwrap(), (1_000.0, 1.0), "the largest, 1 s");
    assert!(
        points
            .windows(2)
            .all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1),
        "corners rise"
    );
}

#[test]
fn timelines_without_backend_exits_still_parse() {
    let old = r#"{"conns":[],"events":[{"kind":"ready","t_ms":5,"instance":"a"}],"duration_ms":9}"#;
    let timeline: Timeline = serde_json::from_str(old).expect("an older timeline parses");
    assert_eq!(timeline.events.len(), 1);
    let exit = Event::BackendExit {
        t_ms: 7,
        instance: "a".into(),
    };
    let json = serde_json::to_value(&exit).expect("serializable");
    assert_eq!(
        json,
        serde_json::json!({"kind": "backend_exit", "t_ms": 7, "instance": "a"})
    );
}
