//! Driving a run: traffic on, the scenario's steps in time, the catalog
//! watched, then every figure gathered for the report.

use super::*;

/// Runs the steps while the traffic flows; returns the timeline.
pub(super) async fn drive(
    cluster: &mut Cluster,
    scenario: &Scenario,
) -> Result<RunResult, RunError> {
    let targets: Vec<Target> = (0..cluster.nodes.len())
        .map(|i| Target {
            agent: cluster.nodes[i].clone(),
            addr: SocketAddr::new(cluster.node_ip(i).into(), PROXY_PORT),
        })
        .collect();
    let duration = Duration::from_secs_f64(scenario.duration_s);
    let t0 = Instant::now();
    let t0_wall = now_ms();
    let traffic = Traffic::start(
        targets,
        TrafficConfig {
            rate_per_target: scenario.traffic_rate_per_agent,
            connect_timeout: Duration::from_millis(scenario.connect_timeout_ms),
            bind: Some(cluster.traffic_ip.into()),
            max_duration: duration + Duration::from_secs(5),
        },
        t0,
    );
    let routes: std::sync::Arc<std::sync::Mutex<Vec<Route>>> = Default::default();
    let region_answers: std::sync::Arc<std::sync::Mutex<Vec<RegionAnswer>>> = Default::default();
    let views: std::sync::Arc<std::sync::Mutex<Vec<Route>>> = Default::default();
    let stale_answers: Records<StaleAnswer> = Default::default();
    let watchers: Vec<tokio::task::JoinHandle<()>> = (0..cluster.nodes.len())
        .map(|i| {
            tokio::spawn(watch_view(
                views.clone(),
                (i, cluster.nodes[i].clone(), cluster.node_ip(i)),
                scenario.service.clone(),
                cluster.crashed.clone(),
                t0,
                duration + Duration::from_secs(5),
            ))
        })
        .collect();
    let sampler = tokio::spawn(sample_routes(
        (
            routes.clone(),
            (!cluster.regions.is_empty()).then(|| region_answers.clone()),
            scenario
                .pass
                .degraded_max_age_ms
                .map(|_| stale_answers.clone()),
        ),
        cluster.http.clone(),
        (0..cluster.nodes.len())
            .map(|i| (cluster.nodes[i].clone(), cluster.node_ip(i)))
            .collect(),
        scenario.service.clone(),
        cluster.crashed.clone(),
        t0,
        duration + Duration::from_secs(5),
    ));
    // Every instance was READY when the traffic started (`start` waits
    // for every agent to route to all of them).
    let mut events: Vec<Event> = cluster
        .instances
        .iter()
        .flatten()
        .map(|id| Event::Ready {
            t_ms: 0,
            instance: id.clone(),
        })
        .collect();
    let mut outage: Option<(u64, Option<u64>)> = None;
    let mut steps: Vec<_> = scenario.steps.iter().collect();
    steps.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    // The run's progress on stderr (drawn only on a terminal).
    let bar = indicatif::ProgressBar::new(duration.as_millis() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{prefix} [{bar:40}] {elapsed_precise}/{duration_precise} {msg}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    bar.set_prefix(scenario.name.clone());
    let ticker = {
        let bar = bar.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            loop {
                tick.tick().await;
                bar.set_position(t0.elapsed().as_millis() as u64);
            }
        })
    };
    for step in steps {
        let at = t0 + Duration::from_secs_f64(step.at_s);
        tokio::time::sleep_until(at.into()).await;
        bar.set_message(format!("{} {}", step.action, step.target));
        let t_ms = t0.elapsed().as_millis() as u64;
        step_once(cluster, step, t0, &mut events).await?;
        match step.action {
            Action::StopArbiters | Action::RemoveQuorum => outage = Some((t_ms, None)),
            Action::StartArbiters | Action::RestoreQuorum => {
                if let Some((start, None)) = outage {
                    outage = Some((start, Some(t_ms)));
                }
            }
            _ => {}
        }
    }
    tokio::time::sleep_until((t0 + duration).into()).await;
    let mut rogue = match cluster.rogue.take() {
        Some(attacks) => attacks.await.ok(),
        None => None,
    };
    ticker.abort();
    bar.finish_and_clear();
    let duration_ms = t0.elapsed().as_millis() as u64;
    let mut conns = traffic.stop().await;
    sampler.abort();
    let _ = sampler.await;
    for watcher in watchers {
        watcher.abort();
        let _ = watcher.await;
    }
    let routes = std::mem::take(&mut *routes.lock().expect("routes lock"));
    let region_answers = std::mem::take(&mut *region_answers.lock().expect("answers lock"));
    let backend_regions = if cluster.regions.is_empty() {
        Default::default()
    } else {
        cluster
            .instances
            .iter()
            .flatten()
            .map(|i| (i.clone(), "r1".to_owned()))
            .chain(
                cluster
                    .regions
                    .iter()
                    .flat_map(|r| r.instances.iter().map(|(i, _)| (i.clone(), r.name.clone()))),
            )
            .collect()
    };
    let views = std::mem::take(&mut *views.lock().expect("views lock"));
    let crashes = cluster.crashed.all();
    conns.retain(|c| {
        !crashes.iter().any(|k| {
            cluster.nodes[k.node] == c.agent
                && c.t_ms >= k.from
                && k.to.is_none_or(|to| c.t_ms < to)
        })
    });
    let outage = outage.map(|(start, end)| (start, end.unwrap_or(duration_ms)));
    let max_concurrent_snapshots = metric(cluster, "rollcall_arbiter_snapshots_in_flight_max")
        .await
        .unwrap_or(0.0) as u64;
    let snapshots_refused = metric(cluster, "rollcall_arbiter_snapshots_refused")
        .await
        .unwrap_or(0.0) as u64;
    // The audit log (the arbiter is back if the scenario restarted it),
    // then the final catalog as a live agent serves it once it holds the
    // last audited change, and the history check over both.
    let mut crash_commit_ms = Vec::new();
    let mut history_figures = None;
    let mut false_removals = 0;
    if let Some(audit) = audit(cluster).await {
        let service_key = format!("default/{}/default", scenario.service);
        let last_revision = audit
            .iter()
            .filter(|e| {
                e.services.contains(&service_key)
                    || e.entry
                        .instance
                        .as_deref()
                        .is_some_and(|i| cluster.instances.iter().flatten().any(|x| x == i))
            })
            .map(|e| e.entry.revision)
            .max()
            .unwrap_or(0);
        let entries: Vec<history::AuditEntry> = audit.into_iter().map(|e| e.entry).collect();
        if let Some(rogue) = &mut rogue {
            rogue.foreign_changes = rogue::foreign_changes(&entries);
        }
        let final_catalog = final_catalog(cluster, last_revision).await;
        let nodes: std::collections::BTreeMap<String, Vec<String>> = cluster
            .nodes
            .iter()
            .cloned()
            .zip(cluster.instances.iter().cloned())
            .collect();
        let writes = cluster.writes.lock().expect("writes lock").clone();
        let checked = history::check(
            &entries,
            &nodes,
            &cluster.causes,
            &writes,
            &cluster.bad_probed,
            final_catalog.as_ref(),
            t0_wall,
        );
        for (at, instance) in &checked.ready {
            if *at >= t0_wall {
                events.push(Event::Ready {
                    t_ms: at - t0_wall,
                    instance: instance.clone(),
                });
            }
        }
        for (at, instance) in &checked.leaves {
            if *at >= t0_wall {
                events.push(Event::LeaveCommitted {
                    t_ms: at - t0_wall,
                    instance: instance.clone(),
                });
            }
        }
        // Crash → the first commit that took the node's records out
        // before the node restarted; a crash with none (its records
        // replaced by the next epoch's) is no sample, and `crash_view_ms`
        // counts it missing too.
        for (i, at) in &cluster.crash_walls {
            let node = format!(" {} epoch ", cluster.nodes[*i]);
            let restarted = cluster
                .restart_walls
                .iter()
                .filter(|(j, r)| j == i && r >= at)
                .map(|(_, r)| *r)
                .min()
                .unwrap_or(u64::MAX);
            let commit = entries
                .iter()
                .filter(|e| {
                    e.at_ms >= *at
                        && e.at_ms < restarted
                        && matches!(e.command.as_str(), "node-down" | "expire-lease")
                        && format!(" {}", e.detail).contains(&node)
                        && e.detail.contains(" records ")
                })
                .map(|e| e.at_ms)
                .min();
            if let Some(commit) = commit {
                crash_commit_ms.push(commit - at);
            }
        }
        false_removals = checked.false_removals.len() as u64;
        history_figures = Some(HistoryFigures {
            writes_checked: checked.writes_checked,
            lost_writes: checked.lost_writes,
            false_removals: checked
                .false_removals
                .iter()
                .map(|r| {
                    format!(
                        "{} at {} ms: {}",
                        r.instance,
                        r.at_ms.saturating_sub(t0_wall),
                        r.how
                    )
                })
                .collect(),
        });
    }
    events.sort_by_key(Event::t_ms);
    Ok(RunResult {
        timeline: Timeline {
            conns,
            routes,
            views,
            region_answers,
            backend_regions,
            events,
            duration_ms,
        },
        false_removals,
        history: history_figures,
        rogue,
        crash_commit_ms,
        election: cluster.election,
        cache_corruption: cluster.corruption.clone(),
        degraded: scenario.pass.degraded_max_age_ms.map(|max_age_ms| {
            let down: Vec<String> = cluster
                .crashed
                .down()
                .into_iter()
                .map(|i| cluster.nodes[i].clone())
                .collect();
            degraded::figures(
                &stale_answers.lock().expect("stale answers lock"),
                max_age_ms,
                &down,
            )
        }),
        outage,
        max_concurrent_snapshots,
        snapshots_refused,
        configs: (
            cluster.work.join(format!("{}.toml", cluster.nodes[0])),
            cluster.work.join("arbiter-1.toml"),
        ),
    })
}
