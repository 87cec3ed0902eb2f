//! Instances in the catalog: registration (with the checks that come
//! with it), transitions, liveness, and the purge of what was removed.

use super::*;

impl Catalog {
    pub(super) fn register(
        &mut self,
        batch: &mut Batch,
        env: &Envelope,
        rev: Revision,
        reg: &Registration,
    ) -> Result<Effect, Rejection> {
        let lease = self.lease_of(&reg.node, reg.epoch)?;
        if lease.held_since_ms.is_some() {
            return Err(Rejection::LeaseHeld {
                node: reg.node.clone(),
            });
        }
        if let Some(given) = &reg.zone {
            if given != &lease.zone {
                return Err(Rejection::ZoneMismatch {
                    instance_id: reg.instance_id.clone(),
                    node: reg.node.clone(),
                    node_zone: lease.zone.clone(),
                    given: given.clone(),
                });
            }
        }
        if !matches!(reg.initial, State::Starting | State::Ready) {
            return Err(Rejection::BadInitialState { state: reg.initial });
        }
        let labels = self.check_labels(&reg.labels)?;
        let generation = self
            .generations
            .get(&reg.instance_id)
            .map_or(Generation(1), |g| g.generation.next());
        let replaced = match self.instances.get(&reg.instance_id) {
            Some(&old) => {
                let slot = self.slot(old);
                let replaced = Replaced {
                    node: slot.fixed.node_id.clone(),
                    generation: slot.fixed.generation,
                    state: slot.live.state,
                };
                self.remove_record(batch, old, env.at_ms);
                Some(replaced)
            }
            None => None,
        };
        let record = EndpointRecord {
            instance_id: reg.instance_id.clone(),
            generation,
            // The lease's own name: every record of a node shares it.
            node_id: lease.node.clone(),
            epoch: reg.epoch,
            lease: lease.id,
            address: reg.address,
            port: reg.port,
            region: self.params.region.clone(),
            zone: lease.zone.clone(),
            version: reg.version.clone(),
            weight: reg.weight,
            labels,
            state: reg.initial,
            reason: Reason::fixed("registered"),
            origin: env.actor.clone(),
            liveness: Liveness::Unknown,
            revision: rev,
            changed_at_ms: env.at_ms,
        };
        let (fixed, live) = Fixed::split(record);
        self.insert(batch, &reg.service, fixed, live);
        self.generations.insert(
            reg.instance_id.clone(),
            GenerationMemory {
                generation,
                released_at_ms: None,
            },
        );
        Ok(Effect::Registered {
            generation,
            state: reg.initial,
            replaced,
        })
    }

    pub(super) fn check_labels(&self, labels: &Labels) -> Result<Labels, Rejection> {
        if labels.len() > self.params.max_labels {
            return Err(Rejection::TooManyLabels {
                count: labels.len(),
                max: self.params.max_labels,
            });
        }
        let mut sorted = labels.clone();
        sorted.sort();
        for pair in sorted.windows(2) {
            if pair[0].0 == pair[1].0 {
                return Err(Rejection::DuplicateLabel {
                    key: pair[0].0.clone(),
                });
            }
        }
        if let Some((key, _)) = sorted
            .iter()
            .find(|(k, _)| !self.params.allowed_label_keys.contains(k))
        {
            let allowed = self
                .params
                .allowed_label_keys
                .iter()
                .map(|k| k.as_str())
                .collect::<Vec<_>>()
                .join(", ");
            return Err(Rejection::LabelNotAllowed {
                key: key.clone(),
                allowed,
            });
        }
        Ok(sorted)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn transition(
        &mut self,
        batch: &mut Batch,
        env: &Envelope,
        rev: Revision,
        id: &InstanceId,
        generation: Generation,
        to: State,
        reason: &Reason,
    ) -> Result<Effect, Rejection> {
        let s = self.live(id, generation)?;
        let slot = self.slot(s);
        let from = slot.live.state;
        if from == to {
            return Ok(Effect::Unchanged);
        }
        if !from.may_become(to) {
            return Err(Rejection::IllegalTransition {
                instance_id: id.clone(),
                from,
                to,
            });
        }
        if to == State::Ready && !self.leases.is_live(&slot.fixed.node_id, slot.fixed.lease) {
            return Err(Rejection::NotCovered {
                instance_id: id.clone(),
                node: slot.fixed.node_id.clone(),
            });
        }
        let live = Live {
            state: to,
            reason: reason.clone(),
            origin: env.actor.clone(),
            liveness: slot.live.liveness,
            revision: rev,
            changed_at_ms: env.at_ms,
        };
        self.update(batch, s, live);
        Ok(Effect::Changed)
    }

    pub(super) fn set_liveness(
        &mut self,
        batch: &mut Batch,
        env: &Envelope,
        rev: Revision,
        id: &InstanceId,
        generation: Generation,
        liveness: Liveness,
    ) -> Result<Effect, Rejection> {
        let s = self.live(id, generation)?;
        let slot = self.slot(s);
        if slot.live.liveness == liveness {
            return Ok(Effect::Unchanged);
        }
        let mut live = restamp(&slot.live, env, rev);
        live.liveness = liveness;
        self.update(batch, s, live);
        Ok(Effect::Changed)
    }

    /// The slot of the live record of `id`, if `generation` is its
    /// generation.
    pub(super) fn live(&self, id: &InstanceId, generation: Generation) -> Result<u32, Rejection> {
        let s = *self
            .instances
            .get(id)
            .ok_or_else(|| Rejection::UnknownInstance {
                instance_id: id.clone(),
            })?;
        let current = self.slot(s).fixed.generation;
        if current != generation {
            return Err(Rejection::StaleGeneration {
                instance_id: id.clone(),
                given: generation,
                current,
            });
        }
        Ok(s)
    }

    pub(super) fn purge(&mut self, batch: &mut Batch, at_ms: u64) -> Effect {
        let retention = self.params.expired_retention_ms;
        let mut victims: Vec<(&ServiceKey, &InstanceId, u32)> = Vec::new();
        for (s, slot) in self.slots.iter().enumerate() {
            let Some(slot) = slot else { continue };
            let f = &slot.fixed;
            let covered = self.leases.is_live(&f.node_id, f.lease);
            if !covered && at_ms >= slot.live.changed_at_ms.saturating_add(retention) {
                let key = key_at(&self.services, slot.service);
                victims.push((key, &f.instance_id, s as u32));
            }
        }
        victims.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        let victims: Vec<u32> = victims.into_iter().map(|(_, _, s)| s).collect();
        for &s in &victims {
            self.remove_record(batch, s, at_ms);
        }
        let keep = self.params.service_retention_ms;
        let before = self.generations.len();
        self.generations.retain(|_, g| {
            g.released_at_ms
                .is_none_or(|t| at_ms < t.saturating_add(keep))
        });
        let forgotten = before - self.generations.len();
        let mut dead: Vec<ServiceKey> = self
            .services
            .iter()
            .flatten()
            .filter(|s| {
                s.members.is_empty()
                    && s.emptied_at_ms
                        .is_some_and(|t| at_ms >= t.saturating_add(keep))
            })
            .map(|s| (*s.key).clone())
            .collect();
        dead.sort();
        for key in &dead {
            self.delete_service(batch, key);
        }
        if victims.is_empty() && forgotten == 0 && dead.is_empty() {
            Effect::Unchanged
        } else {
            Effect::Purged {
                records: victims.len(),
                generations: forgotten,
                services: dead.len(),
            }
        }
    }
}
