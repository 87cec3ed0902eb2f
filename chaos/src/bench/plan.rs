//! Who is who in a fleet bench, from the settings and the seed alone, so
//! that the coordinator and every worker process compute the same plan
//! without exchanging it: each service's instances and the agent that
//! runs each one, the services each agent follows, the instances the
//! deploy replaces and in which order, the agents whose state the storm
//! wipes, and the instances of the churn nodes that write the storm's
//! deltas while every agent is cut off.
//!
//! The fleet has the fleet simulation's shape (`crate::shape`): services
//! sized by a Zipf-like law (skew 0.8), instances placed on agents at
//! random, each agent following `follow` services skewed towards the
//! popular ones (skew 0.5). Pure: no IO, no clock.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rollcall_leases::{InstanceId, Label, NodeId, ServiceKey};

use crate::shape::{service_sizes, Zipf};

/// The size of a fleet bench and the seed of its choices.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Shape {
    /// Simulated agents (sessions).
    pub agents: u32,
    /// Instances, over every agent and the churn node.
    pub instances: u32,
    /// Services.
    pub services: u32,
    /// Services each agent follows.
    pub follow: u32,
    /// Zones the agents are spread over, in equal blocks.
    pub zones: u32,
    /// Share of the instances the deploy replaces (0.1: the problem
    /// statement's 10,000 of 100,000).
    pub deploy_share: f64,
    /// Share of the instances the churn nodes run, each replaced once
    /// while the agents are cut off (the simulation's outage-and-storm
    /// replaces 2 % over its 10-minute outage).
    pub storm_share: f64,
    /// Share of the agents that come back from the storm with their cache
    /// wiped (they need a snapshot of every service they follow).
    pub wipe_share: f64,
    /// Seed of every choice.
    pub seed: u64,
}

/// Why a shape cannot be benched.
#[derive(Debug, thiserror::Error)]
#[error("--{flag} = {value}: {reason}")]
pub struct ShapeError {
    flag: &'static str,
    value: String,
    reason: &'static str,
}

/// The most agents one bench drives: their addresses come from one /14
/// (10.64.0.0 to 10.67.255.255, as the fleet simulation's).
pub const MAX_AGENTS: u32 = 1 << 18;

/// Instances per churn node: a node writes three times that in the storm
/// (register, drain, deregister each), within what the arbiter lets one
/// connection send at once (`limits.request_burst`, 500), so the storm's
/// deltas arrive as fast as the arbiter commits, as a fleet's many
/// writers would send them.
pub const CHURN_PER_NODE: u32 = 100;

impl Shape {
    /// Checks the sizes before anything starts; the error names the flag.
    pub fn validate(&self) -> Result<(), ShapeError> {
        let fail = |flag, value: &dyn ToString, reason| {
            Err(ShapeError {
                flag,
                value: value.to_string(),
                reason,
            })
        };
        if self.agents == 0 || self.agents >= MAX_AGENTS {
            return fail("agents", &self.agents, "must be 1 to 262,143");
        }
        if self.services == 0 {
            return fail("services", &self.services, "must be at least 1");
        }
        if self.instances < self.services {
            return fail(
                "instances",
                &self.instances,
                "must be at least --services (every service has an instance)",
            );
        }
        if self.follow == 0 || self.follow > self.services {
            return fail("follow", &self.follow, "must be 1 to --services");
        }
        if self.zones == 0 || self.zones > self.agents {
            return fail("zones", &self.zones, "must be 1 to --agents");
        }
        for (flag, share) in [
            ("deploy-share", self.deploy_share),
            ("storm-share", self.storm_share),
            ("wipe-share", self.wipe_share),
        ] {
            if !(0.0..=0.5).contains(&share) {
                return fail(flag, &share, "must be 0 to 0.5");
            }
        }
        Ok(())
    }
}

/// One instance of the plan.
#[derive(Clone, Debug)]
pub struct Instance {
    /// Its id before the deploy.
    pub id: InstanceId,
    /// Its id after the deploy replaced it (`<id>-b`).
    pub replacement: InstanceId,
    /// Index of its service.
    pub service: u32,
    /// Index of the agent that runs it (a churn node's index, from
    /// `shape.agents` on, for the churn's).
    pub agent: u32,
    /// Its port (its agent's address is the instance's).
    pub port: u16,
}

/// Everything a bench run does, decided up front.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The shape it was made from.
    pub shape: Shape,
    /// Every service, by index.
    pub services: Vec<ServiceKey>,
    /// Every instance, by index.
    pub instances: Vec<Instance>,
    /// Each agent's instances (and, last, each churn node's).
    pub by_agent: Vec<Vec<u32>>,
    /// Each agent's followed services, ascending (none for the churn
    /// nodes, last).
    pub follows: Vec<Vec<u32>>,
    /// Each service's followers, ascending.
    pub followers: Vec<Vec<u32>>,
    /// The instances the deploy replaces, in the order it does.
    pub deploy: Vec<u32>,
    /// Whether the storm wipes each agent's cache (never a churn node's,
    /// last).
    pub wiped: Vec<bool>,
}

/// How many churn nodes a shape has: one per `CHURN_PER_NODE` of the
/// churn's expected instances, at least one.
fn churn_nodes(shape: &Shape) -> u32 {
    let expected = (f64::from(shape.instances) * shape.storm_share).ceil() as u32;
    expected.div_ceil(CHURN_PER_NODE).max(1)
}

impl Plan {
    /// The plan of `shape` (validated).
    pub fn new(shape: &Shape) -> Plan {
        let mut rng = StdRng::seed_from_u64(shape.seed);
        let services: Vec<ServiceKey> = (0..shape.services)
            .map(|k| {
                ServiceKey::new("bench", &format!("s{k:04}"), "http")
                    .expect("bench service names are valid")
            })
            .collect();
        let churn_nodes = churn_nodes(shape);
        let mut by_agent: Vec<Vec<u32>> = vec![Vec::new(); (shape.agents + churn_nodes) as usize];
        let mut churned = 0;
        let mut instances = Vec::with_capacity(shape.instances as usize);
        let sizes = service_sizes(shape.services, shape.instances, 0.8);
        for (s, &size) in sizes.iter().enumerate() {
            for _ in 0..size {
                let k = instances.len() as u32;
                let agent = if rng.random_range(0.0..1.0) < shape.storm_share {
                    churned += 1;
                    shape.agents + churned % churn_nodes
                } else {
                    rng.random_range(0..shape.agents)
                };
                let port = 20_000 + (by_agent[agent as usize].len() % 40_000) as u16;
                by_agent[agent as usize].push(k);
                let id = format!("s{s:04}-{k:06}");
                instances.push(Instance {
                    id: InstanceId::new(&id).expect("bench instance ids are valid"),
                    replacement: InstanceId::new(&format!("{id}-b"))
                        .expect("bench instance ids are valid"),
                    service: s as u32,
                    agent,
                    port,
                });
            }
        }
        let popularity = Zipf::new(shape.services, 0.5);
        let mut followers: Vec<Vec<u32>> = vec![Vec::new(); shape.services as usize];
        let mut follows = Vec::with_capacity(shape.agents as usize);
        for a in 0..shape.agents {
            let mut chosen = BTreeSet::new();
            // A skewed draw finds the last few of a large share slowly:
            // after a bounded number of draws the rest come in rank order.
            let mut tries = 0;
            while chosen.len() < shape.follow as usize && tries < shape.follow * 50 {
                tries += 1;
                chosen.insert(popularity.pick(&mut rng));
            }
            let mut next = 0;
            while chosen.len() < shape.follow as usize {
                chosen.insert(next);
                next += 1;
            }
            for &s in &chosen {
                followers[s as usize].push(a);
            }
            follows.push(chosen.into_iter().collect());
        }
        let mut candidates: Vec<u32> = (0..shape.instances)
            .filter(|&k| instances[k as usize].agent < shape.agents)
            .collect();
        candidates.shuffle(&mut rng);
        candidates.truncate((f64::from(shape.instances) * shape.deploy_share).round() as usize);
        let mut wiped: Vec<bool> = (0..shape.agents)
            .map(|_| rng.random_range(0.0..1.0) < shape.wipe_share)
            .collect();
        // Churn nodes follow nothing and are never cut.
        for _ in 0..churn_nodes {
            follows.push(Vec::new());
            wiped.push(false);
        }
        Plan {
            shape: shape.clone(),
            services,
            instances,
            by_agent,
            follows,
            followers,
            deploy: candidates,
            wiped,
        }
    }

    /// The churn nodes' indices (after the last agent).
    pub fn churn_nodes(&self) -> std::ops::Range<u32> {
        self.shape.agents..self.by_agent.len() as u32
    }

    /// Whether `a` is a churn node.
    pub fn is_churn(&self, a: u32) -> bool {
        a >= self.shape.agents
    }

    /// Every node: the agents, then the churn nodes.
    pub fn nodes(&self) -> std::ops::Range<u32> {
        0..self.by_agent.len() as u32
    }

    /// Node `a`'s name (`b00042`; churn nodes `churn-000`).
    pub fn node(&self, a: u32) -> NodeId {
        let name = if self.is_churn(a) {
            format!("churn-{:03}", a - self.shape.agents)
        } else {
            format!("b{a:05}")
        };
        NodeId::new(&name).expect("bench node names are valid")
    }

    /// Node `a`'s zone: agents in equal blocks over the zones; churn nodes
    /// in the first.
    pub fn zone(&self, a: u32) -> Label {
        let z = if self.is_churn(a) {
            0
        } else {
            u64::from(a) * u64::from(self.shape.zones) / u64::from(self.shape.agents)
        };
        Label::new(&format!("z{}", z + 1)).expect("zone labels are valid")
    }

    /// Agent `a`'s address: its instances' and its certificate's IP SAN.
    pub fn address(&self, a: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(0x0a40_0000 + a))
    }

    /// How many instances service `s` holds before the deploy, after it,
    /// and at any time outside a replacement (the same: each replacement
    /// registers one and removes one).
    pub fn size(&self, s: u32) -> usize {
        self.instances.iter().filter(|i| i.service == s).count()
    }

    /// Every service's size (`size` for all at once).
    pub fn sizes(&self) -> Vec<usize> {
        let mut sizes = vec![0; self.services.len()];
        for inst in &self.instances {
            sizes[inst.service as usize] += 1;
        }
        sizes
    }

    /// Subscriptions over all agents.
    pub fn subscriptions(&self) -> usize {
        self.follows.iter().map(Vec::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape {
            agents: 50,
            instances: 1_000,
            services: 40,
            follow: 5,
            zones: 3,
            deploy_share: 0.1,
            storm_share: 0.02,
            wipe_share: 0.1,
            seed: 3,
        }
    }

    #[test]
    fn a_plan_is_a_function_of_its_shape() {
        let (a, b) = (Plan::new(&shape()), Plan::new(&shape()));
        assert_eq!(a.follows, b.follows);
        assert_eq!(a.deploy, b.deploy);
        let other = Plan::new(&Shape { seed: 4, ..shape() });
        assert_ne!(a.follows, other.follows);
    }

    #[test]
    fn every_instance_has_one_owner_and_every_agent_follows_its_share() {
        let plan = Plan::new(&shape());
        assert_eq!(plan.instances.len(), 1_000);
        let owned: usize = plan.by_agent.iter().map(Vec::len).sum();
        assert_eq!(owned, 1_000);
        assert!(plan.follows[..50].iter().all(|f| f.len() == 5));
        assert_eq!(plan.churn_nodes(), 50..51);
        assert!(plan.follows[50].is_empty());
        assert_eq!(plan.subscriptions(), 250);
        assert_eq!(plan.deploy.len(), 100);
        assert!(plan
            .deploy
            .iter()
            .all(|&k| !plan.is_churn(plan.instances[k as usize].agent)));
        assert_eq!(plan.sizes().iter().sum::<usize>(), 1_000);
        for (s, followers) in plan.followers.iter().enumerate() {
            for a in followers {
                assert!(plan.follows[*a as usize].contains(&(s as u32)));
            }
        }
    }

    #[test]
    fn the_churn_is_spread_over_nodes_of_about_a_hundred_instances() {
        let plan = Plan::new(&Shape {
            agents: 200,
            instances: 20_000,
            services: 100,
            storm_share: 0.05,
            ..shape()
        });
        assert_eq!(plan.churn_nodes(), 200..210);
        let churn: Vec<usize> = plan
            .churn_nodes()
            .map(|n| plan.by_agent[n as usize].len())
            .collect();
        assert!(churn.iter().all(|&n| n > 50 && n < 150), "{churn:?}");
        assert_eq!(plan.node(203).as_str(), "churn-003");
        assert!(plan
            .churn_nodes()
            .all(|n| plan.follows[n as usize].is_empty()));
    }

    #[test]
    fn a_bad_shape_names_its_flag() {
        let bad = Shape {
            instances: 10,
            ..shape()
        };
        let error = bad.validate().unwrap_err().to_string();
        assert!(error.starts_with("--instances = 10"), "{error}");
        assert!(Shape {
            follow: 41,
            ..shape()
        }
        .validate()
        .is_err());
        assert!(shape().validate().is_ok());
    }
}
