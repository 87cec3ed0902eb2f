//! What the simulation measures, and the faults it injects on nodes:
//!
//! - leave: from the commit that takes an instance out of READY to the
//!   moment the last live agent subscribed to its service applied that
//!   revision;
//! - silent crash: from a node's kill to the moment the last live agent
//!   that routed to its instances stopped (it applied the down verdict's
//!   revision, or, cut off from the arbiter, its own gossip held the node
//!   down);
//! - the sampled traffic, through each agent's own endpoint view
//!   (`rollcall_node::view`, with its local drains, down set, ejection,
//!   protection and panic) and the proxy's selector;
//! - the end-of-run checks (convergence, lost registrations).
//!
//! Outstanding agents are bitsets, so a change followed by thousands of
//! agents costs a few words per apply.

use std::collections::BTreeSet;

use rand::RngExt;
use rollcall_leases::Revision;
use rollcall_node::selector;
use rollcall_node::view::Lookup;

use super::world::*;

impl World {
    pub(super) fn crash(&mut self, a: u32) {
        let now = self.now;
        self.counters.nodes_killed += 1;
        self.hash(&[0xc7, u64::from(a), ms(now)]);
        let agent = &mut self.agents[a as usize];
        agent.dead = true;
        let (zone, index) = (agent.zone as usize, agent.zone_index);
        self.zones[zone].kill(index);
        let instances = agent.instances.clone();
        // Who routes to this node's instances now: every live follower.
        let mut by_service: BTreeSet<u32> = BTreeSet::new();
        for &k in &instances {
            let inst = &mut self.insts[k as usize];
            if inst.alive && !inst.leaving {
                by_service.insert(inst.service);
            }
            inst.alive = false;
        }
        // The node no longer counts in anything it was waiting for.
        self.forget_agent(a);
        let mut tracked = Vec::new();
        for s in by_service {
            let (outstanding, count) = self.live_followers(s, Some(a));
            if count > 0 {
                tracked.push((
                    s,
                    Tracked {
                        revision: None,
                        start: now,
                        outstanding,
                        count,
                    },
                ));
            }
        }
        if tracked.is_empty() {
            self.crash_samples.push(0);
        } else {
            self.crash_last.insert(a, (now, now, tracked.len() as u32));
            self.crashes.insert(a, tracked);
        }
    }

    pub(super) fn live_followers(&self, service: u32, except: Option<u32>) -> (Vec<u64>, u32) {
        let mut bits = vec![0u64; self.agents.len().div_ceil(64)];
        let mut count = 0;
        for &f in &self.followers[service as usize] {
            if Some(f) == except || self.agents[f as usize].dead {
                continue;
            }
            bits[f as usize / 64] |= 1 << (f % 64);
            count += 1;
        }
        (bits, count)
    }

    pub(super) fn forget_agent(&mut self, a: u32) {
        let now = self.now;
        let word = a as usize / 64;
        let bit = 1u64 << (a % 64);
        let mut done_leaves = Vec::new();
        for (s, list) in &mut self.leaves {
            for t in list.iter_mut() {
                if t.outstanding[word] & bit != 0 {
                    t.outstanding[word] &= !bit;
                    t.count -= 1;
                }
            }
            if list.iter().any(|t| t.count == 0) {
                done_leaves.push(*s);
            }
        }
        for s in done_leaves {
            let list = self.leaves.get_mut(&s).expect("listed");
            for t in list.iter().filter(|t| t.count == 0) {
                self.leave_samples.push(ms(now.saturating_sub(t.start)));
            }
            list.retain(|t| t.count > 0);
        }
        let nodes: Vec<u32> = self.crashes.keys().copied().collect();
        for node in nodes {
            self.eject(node, a, None);
        }
    }

    /// Agent `a` no longer routes to node `node`'s instances in the
    /// services listed (all when `None`).
    pub(super) fn eject(&mut self, node: u32, a: u32, only: Option<(u32, Revision)>) {
        let now = self.now;
        let Some(list) = self.crashes.get_mut(&node) else {
            return;
        };
        let word = a as usize / 64;
        let bit = 1u64 << (a % 64);
        let mut finished = 0;
        for (s, t) in list.iter_mut() {
            if let Some((service, revision)) = only {
                if *s != service || t.revision.is_none_or(|r| revision < r) {
                    continue;
                }
            }
            if t.outstanding[word] & bit != 0 {
                t.outstanding[word] &= !bit;
                t.count -= 1;
                if t.count == 0 {
                    finished += 1;
                }
            }
        }
        if finished > 0 {
            list.retain(|(_, t)| t.count > 0);
            let empty = list.is_empty();
            let entry = self.crash_last.get_mut(&node).expect("tracked");
            entry.1 = now;
            if empty {
                let (start, last, _) = self.crash_last.remove(&node).expect("tracked");
                self.crashes.remove(&node);
                self.crash_samples.push(ms(last - start));
                self.hash(&[0xe1, u64::from(node), ms(last - start)]);
            }
        }
    }

    /// Agent `a` applied service `s` up to `revision`.
    pub(super) fn applied(&mut self, a: u32, s: u32, revision: Revision) {
        let now = self.now;
        self.hash(&[0xa9, u64::from(a), u64::from(s), revision.0, ms(now)]);
        let word = a as usize / 64;
        let bit = 1u64 << (a % 64);
        if let Some(list) = self.leaves.get_mut(&s) {
            let mut done = false;
            for t in list.iter_mut() {
                if t.revision.is_some_and(|r| r <= revision) && t.outstanding[word] & bit != 0 {
                    t.outstanding[word] &= !bit;
                    t.count -= 1;
                    done |= t.count == 0;
                }
            }
            if done {
                for t in list.iter().filter(|t| t.count == 0) {
                    self.leave_samples.push(ms(now - t.start));
                }
                list.retain(|t| t.count > 0);
                if list.is_empty() {
                    self.leaves.remove(&s);
                }
            }
        }
        if !self.crashes.is_empty() {
            let nodes: Vec<u32> = self.crashes.keys().copied().collect();
            for node in nodes {
                self.eject(node, a, Some((s, revision)));
            }
        }
    }

    // ----- traffic -----

    pub(super) fn traffic(&mut self) {
        let gap = (1e6 / self.sc.conns_per_s).max(1.0) as Time;
        self.after(gap, Ev::Traffic);
        let a = self.rng.random_range(0..self.agents.len()) as u32;
        let agent = &self.agents[a as usize];
        if agent.dead
            || agent.machine.is_none()
            || agent.paused_until > self.now
            || agent.follows.is_empty()
        {
            return;
        }
        let s = agent.follows[self.rng.random_range(0..agent.follows.len())];
        let key = self.services[s as usize].clone();
        let now_ms = self.now_ms();
        let (views, zone) = (agent.views.clone(), agent.zone as usize);
        self.agents[a as usize].publish_pending(&key, now_ms);
        let view = views.service(&key);
        let Lookup::Serve(answer) = view.lookup(&views, now_ms) else {
            return;
        };
        let selection = answer.selection;
        let zone = self.zone_labels[zone].clone();
        let p = self.agent_config.data_plane.clone();
        let mut tried = BTreeSet::new();
        let mut answered = None;
        for _ in 0..=p.retries {
            let Some(i) = selector::choose(
                &selection.candidates,
                &zone,
                &|_| 0,
                &tried,
                p.local_zone_min_share,
                &mut self.rng,
            ) else {
                break;
            };
            let id = selection.candidates[i].record.instance_id.clone();
            let k = parse_inst(id.as_str()).unwrap_or(u32::MAX);
            let up = self.insts.get(k as usize).is_some_and(|inst| inst.alive);
            if up {
                view.connect_succeeded(&id);
                answered = Some(k);
                break;
            }
            view.connect_failed(&views, &id, now_ms);
            self.counters.failed_attempts += 1;
            tried.insert(id);
        }
        self.counters.conns += 1;
        let phase = self.phases.last_mut().expect("a first phase");
        phase.2 += 1;
        match answered {
            Some(k) => {
                let inst = &self.insts[k as usize];
                if inst
                    .left_at_ms
                    .is_some_and(|t| now_ms > t + crate::report::DRAIN_GRACE_MS)
                {
                    self.counters.new_conns_to_drained += 1;
                }
                if !inst.ever_ready {
                    self.counters.new_conns_to_not_ready += 1;
                }
            }
            None if !selection.candidates.is_empty() => {
                self.counters.failed_conns += 1;
                phase.3 += 1;
                if self.outage.is_some_and(|(s, e)| now_ms >= s && now_ms < e) && tried.is_empty() {
                    self.counters.failed_conns_in_outage += 1;
                }
            }
            None => {}
        }
    }

    // ----- checks at the end -----

    /// Every live, connected agent holds every followed service at the
    /// catalog's revision of it, and no write is waiting.
    pub fn converged(&self) -> bool {
        self.agents.iter().all(|agent| {
            if agent.dead {
                return true;
            }
            let Some(machine) = agent.machine.as_ref() else {
                return false;
            };
            agent.session.is_some()
                && machine.writes_waiting() == 0
                && agent.follows.iter().all(|&s| {
                    let key = &self.services[s as usize];
                    let want = self.catalog().service(key).map(|i| i.revision);
                    let have = machine.view(key).map(|v| v.revision());
                    want == have
                })
        })
    }

    /// Instances alive and registered by their agent whose record is
    /// missing, of another generation, or not READY though they passed
    /// their readiness check and are not leaving.
    pub fn lost_registrations(&self) -> u64 {
        (0..self.insts.len() as u32)
            .filter(|&k| {
                let inst = &self.insts[k as usize];
                inst.alive && !inst.leaving && !self.agents[inst.agent as usize].dead
            })
            .filter(|&k| !self.held_as_registered(k))
            .count() as u64
    }

    /// Leaves and crashes still being timed at the end.
    pub fn unresolved(&self) -> (u64, u64) {
        (
            self.leaves.values().map(|l| l.len() as u64).sum(),
            self.crashes.len() as u64,
        )
    }

    /// Agents that reconnected after the outage, and of those the ones
    /// that took no full snapshot (resumed every service by delta).
    pub fn resume_by_delta(&self) -> (u64, u64) {
        let back: Vec<&Agent> = self
            .agents
            .iter()
            .filter(|a| a.reconnected_after_outage && !a.dead)
            .collect();
        let by_delta = back
            .iter()
            .filter(|a| a.snapshots_since_outage == 0)
            .count();
        (back.len() as u64, by_delta as u64)
    }

    /// Most full snapshots in flight at once, and the bound.
    pub fn snapshots(&self) -> (u64, u64, u64, u64) {
        // Each replica's distributor has its own bound: the most any one
        // held at once, and the refusals of all.
        let (mut most, mut refused) = (0, 0);
        for arb in &self.arbs {
            let stats = arb.machine.distributor().stats();
            most = most
                .max(arb.max_snapshots_seen)
                .max(stats.max_concurrent_snapshots_seen);
            refused += stats.snapshots_refused;
        }
        (
            most as u64,
            self.arbs[0].dist_params.max_concurrent_snapshots as u64,
            self.counters.snapshots_applied,
            refused,
        )
    }

    /// Final catalog facts hashed into the digest.
    pub fn seal(&mut self) {
        let rev = self.catalog().revision().0;
        self.hash(&[0xff, rev, self.gossip_packets, self.gossip_bytes]);
        let services = self.services.clone();
        for s in services {
            if let Some(info) = self.catalog().service(&s) {
                self.hasher.update(format!("{}", info.digest).as_bytes());
            }
        }
    }

    /// Subscriptions over all agents, and the records they hold.
    pub fn follow_stats(&self) -> (u64, u64) {
        let subs: u64 = self.agents.iter().map(|a| a.follows.len() as u64).sum();
        let records: u64 = self
            .agents
            .iter()
            .filter_map(|a| a.machine.as_ref().map(|m| (a, m)))
            .map(|(a, m)| {
                a.follows
                    .iter()
                    .filter_map(|&s| m.view(&self.services[s as usize]))
                    .map(|v| v.records().count() as u64)
                    .sum::<u64>()
            })
            .sum();
        (subs, records)
    }

    /// The busiest replica's CPU charged over the run, µs.
    pub fn busiest_cpu_us(&self) -> u64 {
        self.arbs.iter().map(|a| a.cpu_busy_us).max().unwrap_or(0)
    }

    /// The longest any replica's send waited for its core, µs.
    pub fn longest_cpu_wait_us(&self) -> u64 {
        self.arbs
            .iter()
            .map(|a| a.cpu_max_wait_us)
            .max()
            .unwrap_or(0)
    }

    /// The catalog's record count.
    pub fn catalog_records(&self) -> u64 {
        self.services
            .iter()
            .filter_map(|s| self.catalog().service(s))
            .map(|i| i.records as u64)
            .sum()
    }
}
