//! A fleet bench worker process (`rollcall bench worker`, started by the
//! coordinator, never by hand): it runs its share of the plan's agents
//! (agent `a` when `a % procs == index`; the churn nodes in worker 0) as
//! [`FleetAgent`] actors in one actix System, carries out the
//! coordinator's orders one phase at a time from standard input, reports
//! progress on standard output, and writes its records at the end.
//!
//! Every wait is bounded: a phase that does not finish in its time ends
//! short, with the reason, and the coordinator reports it.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use rollcall_config::AgentConfig;
use rollcall_leases::client::ArbiterClient;
use rollcall_leases::identity::Identity;
use rollcall_leases::tls::{Ca, TlsMaterial};
use rollcall_leases::{PrincipalName, Role};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncBufReadExt;

use super::agent::{
    Close, Cut, FleetAgent, FollowAll, Heal, Progress, Query, RegisterAll, Replace, Shared, Want,
};
use super::plan::{Plan, Shape};
use super::records::{now_us, Answer, Order, Records};
use super::BenchError;

/// What every worker is started with (the coordinator writes it to a file).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerSettings {
    /// The fleet.
    pub shape: Shape,
    /// How many workers share it.
    pub procs: u32,
    /// The arbiter replicas' QUIC addresses (`host:port`).
    pub arbiters: Vec<String>,
    /// The directory with the region's `ca.crt` and `ca.key`, from which
    /// each agent's certificate is issued.
    pub ca_dir: PathBuf,
    /// Tokio worker threads besides the actors' thread.
    pub threads: usize,
}

/// Agents started per 100 ms at `Connect` (per worker): the fleet comes up
/// over a few seconds, as a region's agents do, not in one instant.
const CONNECTS_PER_TICK: usize = 100;
/// How often a phase's progress is asked and printed.
const POLL: Duration = Duration::from_millis(250);

/// Runs worker `index` of the settings in `file` until `Finish`.
pub fn run(file: &Path, index: u32) -> Result<(), BenchError> {
    let text = std::fs::read(file).map_err(|source| BenchError::Io {
        what: format!("reading {}", file.display()),
        source,
    })?;
    let settings: WorkerSettings = serde_json::from_slice(&text)
        .map_err(|e| BenchError::Worker(format!("{}: {e}", file.display())))?;
    settings
        .shape
        .validate()
        .map_err(|e| BenchError::Worker(e.to_string()))?;
    if index >= settings.procs {
        return Err(BenchError::Worker(format!(
            "worker index {index} is not below procs {}",
            settings.procs
        )));
    }
    let plan = Arc::new(Plan::new(&settings.shape));
    let ca = Ca::read(&settings.ca_dir).map_err(|e| BenchError::Worker(e.to_string()))?;
    let mine: Vec<u32> = plan
        .nodes()
        .filter(|&a| {
            if plan.is_churn(a) {
                index == 0
            } else {
                a % settings.procs == index
            }
        })
        .collect();
    // Every agent's certificate, from the region's CA: its node identity,
    // with its address as IP SAN (what it may register).
    let mut clients = Vec::with_capacity(mine.len());
    for &a in &mine {
        let identity = Identity::new(
            ca.region().clone(),
            Role::Agent,
            PrincipalName::new(plan.node(a).as_str()).expect("node names are principal names"),
        );
        let issued = ca
            .issue(&identity, &[], &[plan.address(a)])
            .map_err(|e| BenchError::Worker(e.to_string()))?;
        clients.push((a, TlsMaterial::from_issued(&ca, &issued)));
    }
    let config = AgentConfig {
        region: ca.region().to_string(),
        arbiters: settings.arbiters.clone(),
        ..AgentConfig::default()
    };
    let shared = Arc::new(Shared {
        index: plan
            .services
            .iter()
            .enumerate()
            .map(|(s, key)| (key.clone(), s as u32))
            .collect(),
        sizes: plan.sizes(),
        plan,
        config,
        records: Mutex::new(Records {
            worker: index,
            ..Records::default()
        }),
    });
    rollcall_node::runtime::block_on(Some(settings.threads), drive(shared, clients))
}

/// The source address of agent `a`'s QUIC socket: its own loopback
/// address, 127.64.0.0 + a.
fn source(a: u32) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::from(0x7f40_0000 + a)), 0)
}

fn say(answer: &Answer) {
    println!(
        "{}",
        serde_json::to_string(answer).expect("answers serialize")
    );
}

async fn drive(shared: Arc<Shared>, clients: Vec<(u32, TlsMaterial)>) -> Result<(), BenchError> {
    let plan = shared.plan.clone();
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut agents: Vec<(u32, Addr<FleetAgent>)> = Vec::new();
    let mut clients = clients.into_iter();
    let fail = |e: &dyn std::fmt::Display| BenchError::Worker(e.to_string());
    while let Some(line) = lines.next_line().await.map_err(|e| fail(&e))? {
        let order: Order =
            serde_json::from_str(&line).map_err(|e| fail(&format!("order {line:?}: {e}")))?;
        match order {
            Order::Connect => {
                for chunk in clients
                    .by_ref()
                    .collect::<Vec<_>>()
                    .chunks(CONNECTS_PER_TICK)
                {
                    for (a, material) in chunk {
                        let client =
                            ArbiterClient::bound(material, source(*a)).map_err(|e| fail(&e))?;
                        agents.push((*a, FleetAgent::new(*a, shared.clone(), client).start()));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                let deadline = Duration::from_secs(60 + agents.len() as u64 / 50);
                wait(&agents, Want::Connected, None, deadline).await;
            }
            Order::Register => {
                let due: usize = agents
                    .iter()
                    .map(|(a, _)| plan.by_agent[*a as usize].len())
                    .sum();
                let deadline = Duration::from_secs(120 + due as u64 / 200);
                in_waves(&agents, Step::Register, due as u64, deadline).await;
            }
            Order::Follow => {
                let due: usize = agents
                    .iter()
                    .map(|(a, _)| plan.follows[*a as usize].len())
                    .sum();
                let deadline = Duration::from_secs(120 + due as u64 / 500);
                in_waves(&agents, Step::Follow, due as u64, deadline).await;
            }
            Order::Deploy {
                start_us,
                window_us,
                drain_ms,
            } => {
                let by_agent: HashMap<u32, Addr<FleetAgent>> = agents.iter().cloned().collect();
                let count = plan.deploy.len() as u64;
                let mut due = 0;
                for (j, &k) in plan.deploy.iter().enumerate() {
                    let Some(addr) = by_agent.get(&plan.instances[k as usize].agent) else {
                        continue;
                    };
                    due += 1;
                    let at = start_us + j as u64 * window_us / count.max(1);
                    let addr = addr.clone();
                    actix::spawn(async move {
                        tokio::time::sleep(Duration::from_micros(at.saturating_sub(now_us())))
                            .await;
                        addr.do_send(Replace { k, drain_ms });
                    });
                }
                let deadline = Duration::from_micros(start_us.saturating_sub(now_us()) + window_us)
                    + Duration::from_millis(drain_ms)
                    + Duration::from_secs(60);
                wait(&agents, Want::Replaced, Some(due), deadline).await;
            }
            Order::Cut => {
                for (a, addr) in &agents {
                    if !plan.is_churn(*a) {
                        addr.do_send(Cut {
                            wipe: plan.wiped[*a as usize],
                        });
                    }
                }
                wait(&agents, Want::Cut, None, Duration::from_secs(60)).await;
            }
            Order::Churn { concurrency } => {
                churn(&shared, &agents, concurrency).await;
            }
            Order::Heal {
                required,
                deadline_ms,
            } => {
                for (a, addr) in &agents {
                    if !plan.is_churn(*a) {
                        addr.do_send(Heal);
                    }
                }
                let required = Arc::new(required.into_iter().collect());
                wait(
                    &agents,
                    Want::AtLeast(required),
                    None,
                    Duration::from_millis(deadline_ms),
                )
                .await;
            }
            Order::Finish { records } => {
                // Each agent records its return from the storm as it
                // closes, all at once; an agent still behind on its mail
                // after CLOSE_WAIT loses only its own return, never the
                // worker's records.
                let mut closes = tokio::task::JoinSet::new();
                for (_, addr) in &agents {
                    closes.spawn(addr.send(Close));
                }
                let _ = tokio::time::timeout(CLOSE_WAIT, async {
                    while closes.join_next().await.is_some() {}
                })
                .await;
                // The sessions' close frames go out before the process ends.
                tokio::time::sleep(Duration::from_millis(300)).await;
                let records_json = {
                    let r = shared.records.lock().expect("records lock");
                    serde_json::to_vec(&*r).map_err(|e| fail(&e))?
                };
                std::fs::write(&records, records_json).map_err(|source| BenchError::Io {
                    what: format!("writing {}", records.display()),
                    source,
                })?;
                say(&Answer::Done {
                    done: 1,
                    total: 1,
                    at_us: now_us(),
                    short: None,
                    required: Vec::new(),
                });
                break;
            }
        }
    }
    System::current().stop();
    Ok(())
}

/// Asks every agent how far it is with `want` until all are done (the sum
/// reaches `total`, or the agents' own totals) or `deadline` passes;
/// prints progress, then `Done`.
async fn wait(
    agents: &[(u32, Addr<FleetAgent>)],
    want: Want,
    total: Option<u64>,
    deadline: Duration,
) {
    let until = tokio::time::Instant::now() + deadline;
    loop {
        let progress = ask(agents, &want).await;
        let total = total.unwrap_or(progress.total);
        if progress.done >= total {
            return say(&Answer::Done {
                done: progress.done,
                total,
                at_us: now_us(),
                short: None,
                required: Vec::new(),
            });
        }
        if tokio::time::Instant::now() >= until {
            return say(&Answer::Done {
                done: progress.done,
                total,
                at_us: now_us(),
                short: Some(format!(
                    "{}: {} of {total} after {:.0} s",
                    want.name(),
                    progress.done,
                    deadline.as_secs_f64()
                )),
                required: Vec::new(),
            });
        }
        say(&Answer::Progress {
            done: progress.done,
            total,
        });
        tokio::time::sleep(POLL).await;
    }
}

/// The sum of every agent's progress (an agent whose mailbox is gone
/// counts nothing done).
///
/// Asked of every agent at once: an agent behind on its mail must not
/// hold up the question to the others.
async fn ask(agents: &[(u32, Addr<FleetAgent>)], want: &Want) -> Progress {
    let mut asks = tokio::task::JoinSet::new();
    for (_, addr) in agents {
        asks.spawn(addr.send(Query(want.clone())));
    }
    let mut sum = Progress::default();
    while let Some(answer) = asks.join_next().await {
        let p = answer.ok().and_then(|a| a.ok()).unwrap_or_default();
        sum.done += p.done;
        sum.total += p.total;
    }
    sum
}

/// How long `Finish` waits for the agents to close before it writes the
/// records anyway.
const CLOSE_WAIT: Duration = Duration::from_secs(60);

/// Agents that register their instances, or fetch their followed
/// views, at once per worker: a region's agents come up over minutes,
/// not in one instant. A worker that verifies a hundred thousand
/// snapshots at once, or an arbiter handed a hundred thousand
/// registrations in one go, falls behind on every session's keep-alives,
/// and silent sessions are what the arbiter acts on. The setup is not
/// what the bench measures; its phases are.
const WAVE: usize = 250;

/// A setup step done a wave at a time.
#[derive(Clone, Copy, Debug)]
enum Step {
    Register,
    Follow,
}

/// Every agent does `step`, a wave of `WAVE` agents at a time, each wave
/// until it is done.
async fn in_waves(agents: &[(u32, Addr<FleetAgent>)], step: Step, due: u64, deadline: Duration) {
    let until = tokio::time::Instant::now() + deadline;
    let want = match step {
        Step::Register => Want::Registered,
        Step::Follow => Want::Complete,
    };
    let mut finished = 0;
    for wave in agents.chunks(WAVE) {
        for (_, addr) in wave {
            match step {
                Step::Register => addr.do_send(RegisterAll),
                Step::Follow => addr.do_send(FollowAll),
            }
        }
        loop {
            let progress = ask(wave, &want).await;
            if progress.done >= progress.total {
                finished += progress.done;
                break;
            }
            if tokio::time::Instant::now() >= until {
                return say(&Answer::Done {
                    done: finished + progress.done,
                    total: due,
                    at_us: now_us(),
                    short: Some(format!(
                        "{want:?}: {} of {due} after {:.0} s",
                        finished + progress.done,
                        deadline.as_secs_f64()
                    )),
                    required: Vec::new(),
                });
            }
            say(&Answer::Progress {
                done: finished + progress.done,
                total: due,
            });
            tokio::time::sleep(POLL).await;
        }
    }
    say(&Answer::Done {
        done: finished,
        total: due,
        at_us: now_us(),
        short: None,
        required: Vec::new(),
    });
}

/// The last revision the churn nodes committed in each service.
fn churned(shared: &Shared) -> Vec<(u32, u64)> {
    let plan = &shared.plan;
    let mut last: HashMap<u32, u64> = HashMap::new();
    for c in &shared.records.lock().expect("records lock").commits {
        if plan.is_churn(c.agent) {
            let rev = last.entry(c.service).or_default();
            *rev = (*rev).max(c.revision);
        }
    }
    let mut required: Vec<(u32, u64)> = last.into_iter().collect();
    required.sort_unstable();
    required
}

/// Every churn node of this worker replaces each of its instances,
/// `concurrency` at a time per node, as fast as the arbiter commits.
async fn churn(shared: &Shared, agents: &[(u32, Addr<FleetAgent>)], concurrency: u32) {
    let plan = &shared.plan;
    let nodes: Vec<(&Addr<FleetAgent>, &Vec<u32>)> = agents
        .iter()
        .filter(|(a, _)| plan.is_churn(*a))
        .map(|(a, addr)| (addr, &plan.by_agent[*a as usize]))
        .collect();
    let total: u64 = nodes.iter().map(|(_, mine)| mine.len() as u64).sum();
    let until = tokio::time::Instant::now() + Duration::from_secs(120 + total / 50);
    let mut sent = vec![0usize; nodes.len()];
    let mut told = tokio::time::Instant::now();
    loop {
        let mut done = 0;
        for (n, (node, mine)) in nodes.iter().enumerate() {
            let replaced = node
                .send(Query(Want::Replaced))
                .await
                .unwrap_or_default()
                .done as usize;
            done += replaced as u64;
            while sent[n] < mine.len() && sent[n] - replaced.min(sent[n]) < concurrency as usize {
                node.do_send(Replace {
                    k: mine[sent[n]],
                    drain_ms: 0,
                });
                sent[n] += 1;
            }
        }
        let late = tokio::time::Instant::now() >= until;
        if done >= total || late {
            return say(&Answer::Done {
                done,
                total,
                at_us: now_us(),
                short: late.then(|| format!("churn: {done} of {total} replaced")),
                required: churned(shared),
            });
        }
        if told.elapsed() >= POLL {
            told = tokio::time::Instant::now();
            say(&Answer::Progress { done, total });
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
