//! One scenario step carried out against the cluster: crashes, restarts,
//! drains, cuts, pauses and the rest of `Action`.

use super::*;

pub(super) async fn step_once(
    cluster: &mut Cluster,
    spec: &Step,
    t0: Instant,
    events: &mut Vec<Event>,
) -> Result<(), RunError> {
    let (action, target) = (spec.action, spec.target.as_str());
    let t_ms = t0.elapsed().as_millis() as u64;
    let share = spec.share.unwrap_or(0.3);
    let wait = Duration::from_secs_f64(spec.duration_s.unwrap_or(5.0));
    let delay = Duration::from_millis(spec.delay_ms.unwrap_or(0));
    let step = |action: &str| Event::Step {
        t_ms,
        action: action.to_owned(),
        target: target.to_owned(),
    };
    match action {
        Action::Phase => events.push(Event::Phase {
            t_ms,
            name: target.to_owned(),
        }),
        Action::Rogue => {
            events.push(step("rogue"));
            let rogue = rogue::Rogue::new(cluster, Instant::now() + wait)?;
            cluster.rogue = Some(tokio::spawn(rogue.run()));
        }
        Action::Drain => {
            let (i, instance) = cluster.target(target)?;
            let instance = instance.ok_or_else(|| {
                RunError::Cluster(format!("drain needs node/instance, not {target:?}"))
            })?;
            cluster.cause(&instance, "drain");
            agent_call(
                cluster,
                i,
                reqwest::Method::PUT,
                &format!("/v1/agent/instances/{instance}/drain"),
                (WriteKind::Drain, &instance),
                &format!("draining {instance}"),
            )
            .await?;
            events.push(step("drain"));
        }
        Action::KillBackend | Action::FreezeBackend => {
            let (i, instance) = cluster.target(target)?;
            let instance = instance.ok_or_else(|| {
                RunError::Cluster(format!("{action:?} needs node/instance, not {target:?}"))
            })?;
            let (signal, fault) = match action {
                Action::KillBackend => ("-KILL", "kill-backend"),
                _ => ("-STOP", "freeze-backend"),
            };
            cluster.cause(&instance, fault);
            cluster.processes.signal(&instance, signal)?;
            if action == Action::KillBackend {
                killed(cluster, i, &instance);
            }
            events.push(Event::HardFailure {
                t_ms,
                instance,
                fault: fault.into(),
            });
        }
        Action::CrashNode => {
            let (i, _) = cluster.target(target)?;
            crash_node(cluster, i, t_ms, events)?;
        }
        Action::KillBackends => {
            let nodes: Vec<usize> = if target.is_empty() {
                (0..cluster.nodes.len()).collect()
            } else {
                vec![cluster.target(target)?.0]
            };
            for i in nodes {
                for instance in cluster.instances[i].clone() {
                    if !cluster.processes.running(&instance) {
                        continue;
                    }
                    cluster.cause(&instance, "kill-backend");
                    cluster.processes.signal(&instance, "-KILL")?;
                    killed(cluster, i, &instance);
                    events.push(Event::HardFailure {
                        t_ms,
                        instance,
                        fault: "kill-backend".into(),
                    });
                }
            }
        }
        Action::RestartBackends => {
            for (i, instance, port) in std::mem::take(&mut cluster.killed) {
                cluster.processes.children.retain(|(n, _)| *n != instance);
                start_echo(cluster, i, &instance, port)?;
                events.push(Event::Restarted {
                    t_ms,
                    instance: instance.clone(),
                });
            }
            events.push(step("restart-backends"));
        }
        Action::CutBridge => {
            regions::cut(cluster, target)?;
            events.push(step("cut-bridge"));
        }
        Action::HealBridge => {
            regions::heal(cluster, target)?;
            events.push(step("heal-bridge"));
        }
        Action::TransferWriter | Action::ForceWriter => {
            regions::transfer_writer(cluster, target, spec.reason.as_deref()).await?;
            events.push(step(if spec.reason.is_some() {
                "force-writer"
            } else {
                "transfer-writer"
            }));
        }
        Action::ReadWriters => {
            events.extend(regions::read_writers(cluster, t_ms).await);
            events.push(step("read-writers"));
        }
        Action::CrashNodes => {
            let nodes = cluster.nodes_named(target)?;
            for i in nodes {
                crash_node(cluster, i, t_ms, events)?;
            }
        }
        Action::RestartNode => {
            for i in cluster.nodes_named(target)? {
                restart_node(cluster, i, t0, events)?;
                events.push(Event::Step {
                    t_ms: t0.elapsed().as_millis() as u64,
                    action: "restart-node".into(),
                    target: cluster.nodes[i].clone(),
                });
            }
        }
        Action::CrashRounds | Action::PauseRounds => {
            rounds(cluster, spec, t0, events).await?;
        }
        Action::PauseAgent | Action::ResumeAgent => {
            let (i, _) = cluster.target(target)?;
            let signal = if action == Action::PauseAgent {
                "-STOP"
            } else {
                "-CONT"
            };
            cluster.processes.signal(&cluster.nodes[i], signal)?;
            events.push(step(if action == Action::PauseAgent {
                "pause-agent"
            } else {
                "resume-agent"
            }));
        }
        Action::PartitionNode => {
            let (i, _) = cluster.target(target)?;
            let ips: Vec<Ipv4Addr> = arbiter_ips(cluster);
            cut(cluster, i, ips)?;
            events.push(step("partition-node"));
        }
        Action::PartitionZone => {
            let members: Vec<usize> = (0..cluster.nodes.len())
                .filter(|i| cluster.zones[*i] == target)
                .collect();
            if members.is_empty() {
                return Err(RunError::Cluster(format!(
                    "partition_zone: no node is in zone {target:?} (zones are z1…zN)"
                )));
            }
            let ips: Vec<Ipv4Addr> = arbiter_ips(cluster);
            for i in members {
                cut(cluster, i, ips.clone())?;
            }
            events.push(step("partition-zone"));
        }
        Action::PartitionPeers => {
            let (i, _) = cluster.target(target)?;
            let peers: Vec<usize> = (0..cluster.nodes.len())
                .filter(|j| *j != i && cluster.zones[*j] == cluster.zones[i])
                .collect();
            let peer_ips = peers.iter().map(|j| cluster.node_ip(*j)).collect();
            cut(cluster, i, peer_ips)?;
            let ip = cluster.node_ip(i);
            for j in peers {
                cut(cluster, j, vec![ip])?;
            }
            events.push(step("partition-peers"));
        }
        Action::Heal => {
            for (i, ips) in std::mem::take(&mut cluster.cuts) {
                cluster.topology.heal(i, &ips)?;
            }
            for relay in &cluster.relays {
                relay.set_delay(Duration::ZERO);
            }
            for id in cluster.instances.iter().flatten() {
                let flag = not_ready_file(cluster, id);
                if flag.exists() {
                    std::fs::remove_file(&flag)
                        .map_err(io(format!("removing {}", flag.display())))?;
                }
            }
            events.push(step("heal"));
        }
        Action::DelayFollower => {
            if cluster.relays.is_empty() {
                return Err(RunError::Cluster(
                    "delay_follower needs arbiters = 3 or 5 (a follower to delay)".into(),
                ));
            }
            let k = if target.is_empty() {
                let leader = leader(cluster).await;
                (0..cluster.arbiters.len())
                    .find(|k| Some(*k) != leader)
                    .expect("a group of 3 or 5 has a follower")
            } else {
                target
                    .strip_prefix("arbiter-")
                    .and_then(|n| n.parse::<usize>().ok())
                    .filter(|n| (1..=cluster.arbiters.len()).contains(n))
                    .map(|n| n - 1)
                    .ok_or_else(|| {
                        RunError::Cluster(format!(
                            "delay_follower: {target:?} names no replica (arbiter-1…arbiter-{})",
                            cluster.arbiters.len()
                        ))
                    })?
            };
            cluster.relays[k].set_delay(delay);
            events.push(Event::Step {
                t_ms,
                action: "delay-follower".into(),
                target: format!("arbiter-{} +{} ms", k + 1, delay.as_millis()),
            });
        }
        Action::FailReadiness => {
            let (_, instance) = cluster.target(target)?;
            let instance = instance.ok_or_else(|| {
                RunError::Cluster(format!(
                    "fail_readiness needs node/instance, not {target:?}"
                ))
            })?;
            cluster.cause(&instance, "fail-readiness");
            let flag = not_ready_file(cluster, &instance);
            std::fs::write(&flag, b"").map_err(io(format!("creating {}", flag.display())))?;
            events.push(step("fail-readiness"));
        }
        Action::BadProbe => {
            // The same broken readiness answer on every instance at once,
            // as a bad check deployed to the whole service would give.
            let crashed = cluster.crashed.down();
            for i in (0..cluster.nodes.len()).filter(|i| !crashed.contains(i)) {
                for id in cluster.instances[i].clone() {
                    let flag = not_ready_file(cluster, &id);
                    cluster.cause(&id, "bad-probe");
                    std::fs::write(&flag, b"")
                        .map_err(io(format!("creating {}", flag.display())))?;
                    cluster.bad_probed.push(id);
                }
            }
            events.push(step("bad-probe"));
        }
        Action::RestartAgents => {
            let nodes: Vec<usize> = if target.is_empty() {
                let crashed = cluster.crashed.down();
                (0..cluster.nodes.len())
                    .filter(|i| !crashed.contains(i))
                    .collect()
            } else {
                vec![cluster.target(target)?.0]
            };
            // Every agent dies first, then all start together: the storm.
            for &i in &nodes {
                kill_agent(cluster, i)?;
            }
            for &i in &nodes {
                start_agent(cluster, i)?;
            }
            events.push(step("restart-agents"));
        }
        Action::WipeRestartAgents => {
            let crashed = cluster.crashed.down();
            let nodes: Vec<usize> = (0..cluster.nodes.len())
                .filter(|i| !crashed.contains(i))
                .collect();
            for &i in &nodes {
                kill_agent(cluster, i)?;
            }
            for &i in &nodes {
                let dir = cluster.work.join(&cluster.nodes[i]).join("cache");
                match std::fs::remove_dir_all(&dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io(format!("wiping {}", dir.display()))(e)),
                }
            }
            for &i in &nodes {
                start_agent(cluster, i)?;
            }
            events.push(step("restart-agents"));
        }
        Action::CorruptCache => {
            let (i, _) = cluster.target(target)?;
            kill_agent(cluster, i)?;
            let corrupted = corrupt_cache(&cluster.work.join(&cluster.nodes[i]).join("cache"))?;
            if corrupted == 0 {
                return Err(RunError::Cluster(format!(
                    "corrupt_cache: {target} has no cache file to corrupt"
                )));
            }
            start_agent(cluster, i)?;
            events.push(step("corrupt-cache"));
            cluster.corruption = Some(watch_corruption(cluster, i, corrupted as u64).await);
        }
        Action::StartInstances => {
            let (i, _) = cluster.target(target)?;
            let id = start_instance(cluster, i)?;
            register(
                cluster,
                i,
                &id,
                *cluster.ports[i].last().expect("just added"),
            )
            .await?;
            events.push(Event::Step {
                t_ms,
                action: "start-instance".into(),
                target: format!("{}/{id}", cluster.nodes[i]),
            });
        }
        Action::RollingDeploy => {
            // `count` waves, `every_s` apart (one wave by default).
            let every = Duration::from_secs_f64(spec.every_s.unwrap_or(0.0));
            let start = Instant::now();
            for wave in 0..spec.count.unwrap_or(1) {
                tokio::time::sleep_until((start + every * wave).into()).await;
                rolling_deploy(cluster, share, wait, t0, events).await?;
            }
        }
        Action::StopArbiters => {
            for k in 0..cluster.arbiters.len() {
                let name = format!("arbiter-{}", k + 1);
                if cluster.processes.running(&name) {
                    cluster.processes.signal(&name, "-KILL")?;
                }
            }
            events.push(step("stop-arbiters"));
        }
        Action::StartArbiters | Action::RestoreQuorum => {
            for k in 0..cluster.arbiters.len() {
                start_arbiter(cluster, k)?;
            }
            events.push(step(if action == Action::RestoreQuorum {
                "restore-quorum"
            } else {
                "start-arbiters"
            }));
        }
        Action::KillLeader => {
            let k = leader(cluster).await.ok_or_else(|| {
                RunError::Cluster("kill_leader: no running replica knows a leader".into())
            })?;
            cluster
                .processes
                .signal(&format!("arbiter-{}", k + 1), "-KILL")?;
            events.push(Event::Step {
                t_ms,
                action: "kill-leader".into(),
                target: format!("arbiter-{}", k + 1),
            });
            let killed = t0.elapsed().as_millis() as u64;
            if let Some(end) = first_commit(cluster, t0).await {
                cluster.election = Some((killed, end));
            }
        }
        Action::RemoveQuorum => {
            // Keep one replica (not a majority of three or five).
            let keep = leader(cluster).await.unwrap_or(0);
            for k in (0..cluster.arbiters.len()).filter(|k| *k != keep) {
                let name = format!("arbiter-{}", k + 1);
                if cluster.processes.running(&name) {
                    cluster.processes.signal(&name, "-KILL")?;
                }
            }
            events.push(step("remove-quorum"));
        }
    }
    Ok(())
}

/// Records that instance `instance` of node `i` was killed (it waits for
/// the exit), so `restart_backends` can start it again on its port.
pub(super) fn killed(cluster: &mut Cluster, i: usize, instance: &str) {
    for (n, child) in cluster.processes.children.iter_mut() {
        if n == instance {
            let _ = child.wait();
        }
    }
    let port = cluster.instances[i]
        .iter()
        .position(|x| x == instance)
        .map(|k| cluster.ports[i][k]);
    if let Some(port) = port {
        cluster.killed.push((i, instance.to_owned(), port));
    }
}

/// A silent crash of node `i`: its agent and running backends freeze and
/// its link drops every packet (connects time out, nothing is reset).
pub(super) fn crash_node(
    cluster: &mut Cluster,
    i: usize,
    t_ms: u64,
    events: &mut Vec<Event>,
) -> Result<(), RunError> {
    if cluster.crashed.down().contains(&i) {
        return Err(RunError::Cluster(format!(
            "crash: {} is already crashed",
            cluster.nodes[i]
        )));
    }
    cluster.crash_walls.push((i, now_ms()));
    events.push(Event::Step {
        t_ms,
        action: "crash-node".into(),
        target: cluster.nodes[i].clone(),
    });
    cluster.processes.signal(&cluster.nodes[i], "-STOP")?;
    for instance in cluster.instances[i].clone() {
        if !cluster.processes.running(&instance) {
            continue;
        }
        cluster.cause(&instance, "crash-node");
        cluster.processes.signal(&instance, "-STOP")?;
        events.push(Event::HardFailure {
            t_ms,
            instance,
            fault: "crash-node".into(),
        });
    }
    cluster.topology.set_link(i, false)?;
    cluster.crashed.start(i, t_ms);
    Ok(())
}

/// Brings crashed node `i` back as a reboot would: its frozen processes
/// are killed, its link restored, and its backends and agent start again
/// (the agent under a new epoch, re-registering from its data directory).
pub(super) fn restart_node(
    cluster: &mut Cluster,
    i: usize,
    t0: Instant,
    events: &mut Vec<Event>,
) -> Result<(), RunError> {
    if !cluster.crashed.down().contains(&i) {
        return Err(RunError::Cluster(format!(
            "restart_node: {} is not crashed",
            cluster.nodes[i]
        )));
    }
    cluster.restart_walls.push((i, now_ms()));
    let mut names = vec![cluster.nodes[i].clone()];
    names.extend(
        cluster.instances[i]
            .iter()
            .filter(|id| cluster.processes.pid(id).is_some())
            .cloned(),
    );
    for (name, child) in cluster.processes.children.iter_mut() {
        if names.contains(name) && matches!(child.try_wait(), Ok(None)) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    cluster.topology.set_link(i, true)?;
    for k in 0..cluster.instances[i].len() {
        let (id, port) = (cluster.instances[i][k].clone(), cluster.ports[i][k]);
        if names.contains(&id) {
            cluster.processes.children.retain(|(n, _)| *n != id);
            start_echo(cluster, i, &id, port)?;
            events.push(Event::Restarted {
                t_ms: t0.elapsed().as_millis() as u64,
                instance: id,
            });
        }
    }
    start_agent(cluster, i)?;
    cluster.crashed.end(i, t0.elapsed().as_millis() as u64);
    Ok(())
}
