//! The service policies (R9): set here when this region is a service's
//! home, replicated from the home region otherwise, and read.

use super::*;

impl Catalog {
    pub(super) fn set_policy(
        &mut self,
        env: &Envelope,
        rev: Revision,
        policy: &Policy,
    ) -> Result<Effect, Rejection> {
        let key = policy.key();
        let here = &self.params.region;
        if policy.home_region() != here {
            return Err(Rejection::NotHomeRegion {
                service: key.clone(),
                home: policy.home_region().clone(),
                here: here.clone(),
            });
        }
        match self.home_policy(key) {
            Ok(stored) if stored.policy == *policy => return Ok(Effect::Unchanged),
            Ok(_) | Err(Rejection::UnknownPolicy { .. }) => {}
            Err(other) => return Err(other),
        }
        self.policies.insert(
            key.clone(),
            StoredPolicy {
                policy: policy.clone(),
                revision: rev,
                set_at_ms: env.at_ms,
                set_by: env.actor.clone(),
            },
        );
        Ok(Effect::PolicyChanged)
    }

    /// Stores another region's policy as its home committed it; never goes
    /// back to an older home revision.
    pub(super) fn replicate_policy(
        &mut self,
        env: &Envelope,
        rev: Revision,
        remote: &RemotePolicy,
    ) -> Result<Effect, Rejection> {
        let key = remote.policy.key();
        let home = remote.policy.home_region();
        let here = &self.params.region;
        if home == here {
            return Err(Rejection::HomeHere {
                service: key.clone(),
                here: here.clone(),
            });
        }
        let conflict = |held: &Label| Rejection::HomeConflict {
            service: key.clone(),
            held: held.clone(),
            given: home.clone(),
        };
        if self.policies.contains_key(key) {
            return Err(conflict(here));
        }
        if let Some(held) = self.replicated.get(key) {
            if held.remote.policy.home_region() != home {
                return Err(conflict(held.remote.policy.home_region()));
            }
            if held.remote.home_revision >= remote.home_revision {
                return Ok(Effect::Unchanged);
            }
        }
        self.replicated.insert(
            key.clone(),
            ReplicatedPolicy {
                remote: remote.clone(),
                revision: rev,
                set_at_ms: env.at_ms,
                set_by: env.actor.clone(),
            },
        );
        Ok(Effect::PolicyChanged)
    }

    /// The policy of `key`, which this region must be the home of.
    pub(super) fn home_policy(&self, key: &PolicyKey) -> Result<&StoredPolicy, Rejection> {
        let here = &self.params.region;
        if let Some(held) = self.replicated.get(key) {
            return Err(Rejection::NotHomeRegion {
                service: key.clone(),
                home: held.remote.policy.home_region().clone(),
                here: here.clone(),
            });
        }
        let stored = self
            .policies
            .get(key)
            .ok_or_else(|| Rejection::UnknownPolicy {
                service: key.clone(),
                region: here.clone(),
            })?;
        if stored.policy.home_region() != here {
            return Err(Rejection::NotHomeRegion {
                service: key.clone(),
                home: stored.policy.home_region().clone(),
                here: here.clone(),
            });
        }
        Ok(stored)
    }

    /// The policy of one service, if one is set.
    pub fn policy(&self, key: &PolicyKey) -> Option<&StoredPolicy> {
        self.policies.get(key)
    }

    /// Every service policy homed in this region, in key order.
    pub fn policies(&self) -> impl Iterator<Item = &StoredPolicy> {
        self.policies.values()
    }

    /// The replicated policy (homed in another region) of one service, if
    /// one is held.
    pub fn replicated_policy(&self, key: &PolicyKey) -> Option<&ReplicatedPolicy> {
        self.replicated.get(key)
    }

    /// Every replicated policy (homed in other regions), in key order.
    pub fn replicated_policies(&self) -> impl Iterator<Item = &ReplicatedPolicy> {
        self.replicated.values()
    }
}
