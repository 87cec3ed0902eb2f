//! The longer actions a step starts: rounds of crashes, a rolling deploy,
//! cuts, killed agents and corrupted caches, and what they wait on.

use super::*;

/// `crash_rounds` or `pause_rounds`: `count` rounds `every_s` apart, each
/// faulting one live node the run's seed draws (among the target's, when
/// given) for `duration_s`, then undoing it.
pub(super) async fn rounds(
    cluster: &mut Cluster,
    step: &Step,
    t0: Instant,
    events: &mut Vec<Event>,
) -> Result<(), RunError> {
    let count = step.count.unwrap_or(1);
    let every = Duration::from_secs_f64(step.every_s.unwrap_or(1.0));
    let fault = Duration::from_secs_f64(step.round_fault_s());
    let candidates: Vec<usize> = if step.target.is_empty() {
        (0..cluster.nodes.len()).collect()
    } else {
        cluster.nodes_named(&step.target)?
    };
    let start = Instant::now();
    for round in 0..count {
        tokio::time::sleep_until((start + every * round).into()).await;
        let down = cluster.crashed.down();
        let live: Vec<usize> = candidates
            .iter()
            .copied()
            .filter(|i| !down.contains(i))
            .collect();
        if live.is_empty() {
            return Err(RunError::Cluster(format!(
                "{}: no live node left to fault in round {round}",
                step.action
            )));
        }
        let i = live[(cluster.random() % live.len() as u64) as usize];
        let t_ms = t0.elapsed().as_millis() as u64;
        let node = cluster.nodes[i].clone();
        match step.action {
            Action::PauseRounds => {
                cluster.processes.signal(&node, "-STOP")?;
                events.push(Event::Step {
                    t_ms,
                    action: "pause-agent".into(),
                    target: node.clone(),
                });
                tokio::time::sleep(fault).await;
                cluster.processes.signal(&node, "-CONT")?;
                events.push(Event::Step {
                    t_ms: t0.elapsed().as_millis() as u64,
                    action: "resume-agent".into(),
                    target: node,
                });
            }
            _ => {
                crash_node(cluster, i, t_ms, events)?;
                tokio::time::sleep(fault).await;
                restart_node(cluster, i, t0, events)?;
                events.push(Event::Step {
                    t_ms: t0.elapsed().as_millis() as u64,
                    action: "restart-node".into(),
                    target: node,
                });
            }
        }
    }
    Ok(())
}

/// After a leader is killed: writes through the running replicas (a
/// policy of the service "election-probe", its `max_snapshot_age_ms`
/// changed each time so that every write commits) every 50 ms until one
/// is answered 200; returns that answer's time (run ms), the end of the
/// election as callers of the control plane see it.
pub(super) async fn first_commit(cluster: &mut Cluster, t0: Instant) -> Option<u64> {
    let started = Instant::now();
    let mut attempt = 0u64;
    while started.elapsed() < PATIENCE {
        for (admin, token) in running_admins(cluster) {
            attempt += 1;
            let body = serde_json::json!({"policy": [{
                "service": "default/election-probe",
                "home_region": "r1",
                "max_snapshot_age_ms": 60_000 + attempt,
            }]});
            let url = format!("http://{admin}/v1/policies");
            let answered = cluster
                .http
                .put(url)
                .bearer_auth(&token)
                .json(&body)
                .timeout(Duration::from_millis(1000))
                .send()
                .await
                .is_ok_and(|r| r.status() == reqwest::StatusCode::OK);
            if answered {
                return Some(t0.elapsed().as_millis() as u64);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// After node `i`'s agent restarted on `files` corrupted cache files:
/// asks it to resolve the service every 20 ms until an answer the arbiter
/// confirmed (within `PATIENCE`), counting the answers served from a cache
/// (`stale: true`: every cache file was corrupted, so one is a corrupt file
/// served), then reads the agent's count of corrupt files discarded.
pub(super) async fn watch_corruption(cluster: &Cluster, i: usize, files: u64) -> Corruption {
    let path = format!("/v1/endpoints/{}", cluster.service);
    let started = Instant::now();
    let mut stale_answers = 0;
    while started.elapsed() < PATIENCE {
        if let Some(body) = cluster.agent_get(i, &path).await {
            match body["stale"].as_bool() {
                Some(true) => stale_answers += 1,
                Some(false) => break,
                None => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let url = format!("http://{}:{HTTP_PORT}/metrics", cluster.node_ip(i));
    let text = match cluster.http.get(url).send().await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    let detected = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("rollcall_agent_cache_discarded_total{reason=\"corrupt\"}")?
                .trim()
                .parse::<f64>()
                .ok()
        })
        .unwrap_or(0.0) as u64;
    Corruption {
        files,
        detected,
        stale_answers,
    }
}

/// Cuts node `i` off `ips` and remembers it for `heal`.
pub(super) fn cut(cluster: &mut Cluster, i: usize, ips: Vec<Ipv4Addr>) -> Result<(), RunError> {
    cluster.topology.cut(i, &ips)?;
    cluster.cuts.push((i, ips));
    Ok(())
}

/// kill -9 node `i`'s agent and waits for it to be gone (its backends run
/// on).
pub(super) fn kill_agent(cluster: &mut Cluster, i: usize) -> Result<(), RunError> {
    let name = cluster.nodes[i].clone();
    for (n, child) in cluster.processes.children.iter_mut() {
        if *n == name && matches!(child.try_wait(), Ok(None)) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    Ok(())
}

/// Overwrites the middle of every file in `dir` with garbage (its length
/// kept); returns how many files it corrupted.
pub(super) fn corrupt_cache(dir: &Path) -> Result<usize, RunError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io(format!("reading {}", dir.display()))(e)),
    };
    let mut corrupted = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        if !path.is_file() {
            continue;
        }
        let mut bytes = std::fs::read(&path).map_err(io(format!("reading {}", path.display())))?;
        if bytes.is_empty() {
            continue;
        }
        let mid = bytes.len() / 2;
        let end = (mid + 16).min(bytes.len());
        for b in &mut bytes[mid..end] {
            *b ^= 0xA5;
        }
        std::fs::write(&path, &bytes).map_err(io(format!("writing {}", path.display())))?;
        corrupted += 1;
    }
    Ok(corrupted)
}

/// Starts a new echo backend on node `i` (the next free port, the next
/// instance number) and records it; returns its id. Not registered yet.
pub(super) fn start_instance(cluster: &mut Cluster, i: usize) -> Result<String, RunError> {
    let k = cluster.instances[i].len();
    let id = format!("{}-{i}-{k}", cluster.service);
    let port = cluster.ports[i].iter().max().map_or(ECHO_PORT, |p| p + 1);
    start_echo(cluster, i, &id, port)?;
    cluster.instances[i].push(id.clone());
    cluster.ports[i].push(port);
    Ok(id)
}

/// One wave of a rolling deploy: `share` of the running instances (spread
/// over the nodes) are drained, left `wait` to finish their in-flight
/// connections, stopped and deregistered, and as many new instances are
/// started behind a readiness check, so they take traffic only once READY.
pub(super) async fn rolling_deploy(
    cluster: &mut Cluster,
    share: f64,
    wait: Duration,
    t0: Instant,
    events: &mut Vec<Event>,
) -> Result<(), RunError> {
    let crashed = cluster.crashed.down();
    // Round robin over the nodes, so the wave is spread.
    let mut old: Vec<(usize, String)> = Vec::new();
    let most = cluster.instances.iter().map(Vec::len).max().unwrap_or(0);
    for k in 0..most {
        for i in (0..cluster.nodes.len()).filter(|i| !crashed.contains(i)) {
            if let Some(id) = cluster.instances[i].get(k) {
                if cluster.processes.running(id) {
                    old.push((i, id.clone()));
                }
            }
        }
    }
    let count = ((old.len() as f64 * share).ceil() as usize).clamp(1, old.len().max(1));
    old.truncate(count);
    for (i, id) in &old {
        cluster.cause(id, "rolling-deploy");
        let path = format!("/v1/agent/instances/{id}/drain");
        agent_call(
            cluster,
            *i,
            reqwest::Method::PUT,
            &path,
            (WriteKind::Drain, id),
            &format!("draining {id}"),
        )
        .await?;
        events.push(Event::Step {
            t_ms: t0.elapsed().as_millis() as u64,
            action: "drain".into(),
            target: format!("{}/{id}", cluster.nodes[*i]),
        });
    }
    tokio::time::sleep(wait).await;
    for (i, id) in &old {
        cluster.processes.signal(id, "-TERM")?;
        if let Some((_, child)) = cluster.processes.children.iter_mut().find(|(n, _)| n == id) {
            let _ = child.wait();
        }
        events.push(Event::BackendExit {
            t_ms: t0.elapsed().as_millis() as u64,
            instance: id.clone(),
        });
        let path = format!("/v1/agent/instances/{id}");
        agent_call(
            cluster,
            *i,
            reqwest::Method::DELETE,
            &path,
            (WriteKind::Deregister, id),
            &format!("deregistering {id}"),
        )
        .await?;
    }
    for (i, _) in &old {
        let id = start_instance(cluster, *i)?;
        let port = *cluster.ports[*i].last().expect("just added");
        register(cluster, *i, &id, port).await?;
        events.push(Event::Step {
            t_ms: t0.elapsed().as_millis() as u64,
            action: "start-instance".into(),
            target: format!("{}/{id}", cluster.nodes[*i]),
        });
    }
    Ok(())
}
