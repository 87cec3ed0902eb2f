//! Node leases in the catalog: grants, expiries and the end of a lease
//! with the records it fenced.

use super::*;

impl Catalog {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn grant(
        &mut self,
        batch: &mut Batch,
        env: &Envelope,
        rev: Revision,
        node: &NodeId,
        epoch: AgentEpoch,
        zone: &Label,
        ttl_ms: u64,
    ) -> Result<Effect, Rejection> {
        if !LEASE_TTL_RANGE_MS.contains(&ttl_ms) {
            return Err(Rejection::BadTtl { ttl_ms });
        }
        if let Some(current) = self.leases.get(node) {
            if epoch < current.epoch {
                return Err(Rejection::StaleEpoch {
                    node: node.clone(),
                    current: current.epoch,
                    given: epoch,
                });
            }
            if epoch == current.epoch {
                if &current.zone != zone {
                    return Err(Rejection::ZoneChanged {
                        node: node.clone(),
                        epoch,
                        current: current.zone.clone(),
                        given: zone.clone(),
                    });
                }
                let (held, same_ttl, id) = (
                    current.held_since_ms.is_some(),
                    current.ttl_ms == ttl_ms,
                    current.id,
                );
                if !held && same_ttl {
                    // The leader renews its deadline when this commits.
                    return Ok(Effect::Unchanged);
                }
                let lease = self.leases.get_mut(node).expect("the lease was just found");
                lease.held_since_ms = None;
                lease.ttl_ms = ttl_ms;
                lease.granted_at_ms = env.at_ms;
                return Ok(if held {
                    Effect::LeaseReinstated
                } else {
                    Effect::LeaseGranted {
                        lease: id,
                        moved: 0,
                    }
                });
            }
            self.leases.remove(node);
        }
        let id = LeaseId(rev.0);
        self.leases.insert(Lease {
            id,
            node: node.clone(),
            epoch,
            zone: zone.clone(),
            ttl_ms,
            granted_at_ms: env.at_ms,
            held_since_ms: None,
        });
        // The node's records that are not expired move under the new grant:
        // a restarted agent reconciles them by instance id and generation,
        // keeping their generations (R7).
        let mut moved = 0;
        for s in self.node_records(node) {
            let slot = self.slot(s);
            if slot.live.state == State::Expired || slot.fixed.lease == id {
                continue;
            }
            let fixed = slot.fixed.moved(epoch, id, zone.clone());
            let live = restamp(&slot.live, env, rev);
            self.replace(batch, s, fixed, live);
            moved += 1;
        }
        Ok(Effect::LeaseGranted { lease: id, moved })
    }

    pub(super) fn lease_of(&self, node: &NodeId, epoch: AgentEpoch) -> Result<Lease, Rejection> {
        let lease = self
            .leases
            .get(node)
            .ok_or_else(|| Rejection::NoLease { node: node.clone() })?;
        if lease.epoch != epoch {
            return Err(Rejection::OtherEpoch {
                node: node.clone(),
                current: lease.epoch,
                given: epoch,
            });
        }
        Ok(lease.clone())
    }

    pub(super) fn expire(
        &mut self,
        batch: &mut Batch,
        env: &Envelope,
        rev: Revision,
        node: &NodeId,
        epoch: AgentEpoch,
        silent_in_zone: u32,
    ) -> Result<Effect, Rejection> {
        let lease = self.lease_of(node, epoch)?;
        let reason = match lease.held_since_ms {
            Some(since) if env.at_ms.saturating_sub(since) < self.params.guard.max_hold_ms => {
                return Ok(Effect::Unchanged)
            }
            Some(_) => "lease expired after the mass-expiry guard's maximum hold",
            None => {
                let live = self.leases.in_zone(&lease.zone);
                match self.guard.decide(
                    &lease.zone,
                    live,
                    silent_in_zone,
                    env.at_ms,
                    &self.params.guard,
                ) {
                    GuardDecision::Hold => {
                        self.leases
                            .get_mut(node)
                            .expect("the lease was just found")
                            .held_since_ms = Some(env.at_ms);
                        return Ok(Effect::ExpiryHeld);
                    }
                    GuardDecision::Expire => "lease expired",
                }
            }
        };
        self.guard.record(&lease.zone, env.at_ms);
        let marked = self.end_lease(
            batch,
            env,
            rev,
            lease,
            State::Expired,
            Reason::fixed(reason),
        );
        Ok(Effect::LeaseEnded { marked })
    }

    /// Removes a lease and moves the records it covered to `to`: EXPIRED for
    /// revocation and expiry (everything), UNHEALTHY for a down verdict
    /// (STARTING and READY records; DRAINING ones are already leaving).
    pub(super) fn end_lease(
        &mut self,
        batch: &mut Batch,
        env: &Envelope,
        rev: Revision,
        lease: Lease,
        to: State,
        reason: Reason,
    ) -> usize {
        self.leases.remove(&lease.node);
        let mut marked = 0;
        for s in self.node_records(&lease.node) {
            let slot = self.slot(s);
            let state = slot.live.state;
            let affected = slot.fixed.lease == lease.id
                && match to {
                    State::Expired => state != State::Expired,
                    _ => matches!(state, State::Starting | State::Ready),
                };
            if !affected {
                continue;
            }
            let mut live = restamp(&slot.live, env, rev);
            live.state = to;
            live.reason = reason.clone();
            self.update(batch, s, live);
            marked += 1;
        }
        marked
    }
}
