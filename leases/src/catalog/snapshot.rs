//! The whole shard out and in: `export` (sorted, byte-identical across
//! replicas with one history) and `import` (checked before it is used).

use super::*;

impl Catalog {
    /// Exports the whole shard, every collection sorted, so two replicas with
    /// the same history export byte-identical snapshots.
    pub fn export(&self) -> CatalogSnapshot {
        let mut services: Vec<ServiceEntry> = self
            .services
            .iter()
            .flatten()
            .map(|s| ServiceEntry {
                service: (*s.key).clone(),
                revision: s.revision,
                emptied_at_ms: s.emptied_at_ms,
                digest: s.digest,
                records: self.sorted_records(s),
            })
            .collect();
        services.sort_by(|a, b| a.service.cmp(&b.service));
        let mut generations: Vec<(InstanceId, GenerationMemory)> = self
            .generations
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        generations.sort_by(|a, b| a.0.cmp(&b.0));
        CatalogSnapshot {
            shard: self.params.shard,
            region: self.params.region.clone(),
            revision: self.revision,
            services,
            leases: self.leases.sorted().into_iter().cloned().collect(),
            generations,
            guard: self.guard.export(),
            policies: self.policies.values().cloned().collect(),
            replicated_policies: self.replicated.values().cloned().collect(),
            writers: self.writers.values().cloned().collect(),
            identity: self.identity,
        }
    }

    /// Rebuilds a shard from a snapshot, checking it is consistent (digests,
    /// unique instance ids, revisions). The delta log starts empty at the
    /// snapshot's revision. Lease deadlines are the leader's memory, not
    /// the catalog's (`lease::Deadlines`).
    pub fn import(params: CatalogParams, snap: CatalogSnapshot) -> Result<Catalog, SnapshotError> {
        if snap.shard != params.shard {
            return Err(SnapshotError::Inconsistent(format!(
                "snapshot is of shard {} but this catalog is shard {}",
                snap.shard, params.shard
            )));
        }
        let mut cat = Catalog::new(params);
        cat.revision = snap.revision;
        cat.identity = snap.identity;
        cat.log = DeltaLog::new(snap.revision, cat.params.delta_log.clone());
        let mut batch = Batch::default();
        for entry in snap.services {
            if entry.revision > snap.revision {
                return Err(SnapshotError::Inconsistent(format!(
                    "service {} is at revision {} beyond the snapshot's {}",
                    entry.service, entry.revision, snap.revision
                )));
            }
            if cat.service_index.contains_key(&entry.service) {
                return Err(SnapshotError::Inconsistent(format!(
                    "service {} appears twice",
                    entry.service
                )));
            }
            let ix = cat.service_ix(&entry.service);
            for record in entry.records {
                let id = record.instance_id.clone();
                if cat.instances.contains_key(&id) {
                    return Err(SnapshotError::Inconsistent(format!(
                        "instance {id} appears twice"
                    )));
                }
                let (fixed, live) = Fixed::split(Arc::unwrap_or_clone(record));
                cat.insert(&mut batch, &entry.service, fixed, live);
            }
            batch.changes.clear();
            let svc = cat.services[ix as usize].as_mut().expect("just created");
            svc.revision = entry.revision;
            svc.emptied_at_ms = entry.emptied_at_ms;
            if svc.digest != entry.digest {
                return Err(SnapshotError::Inconsistent(format!(
                    "service {} digest {} does not match its records ({})",
                    entry.service, entry.digest, svc.digest
                )));
            }
        }
        for lease in snap.leases {
            if cat.leases.get(&lease.node).is_some() {
                return Err(SnapshotError::Inconsistent(format!(
                    "node {} holds two leases",
                    lease.node
                )));
            }
            cat.leases.insert(lease);
        }
        for (id, memory) in snap.generations {
            cat.generations.insert(id, memory);
        }
        for (id, s) in &cat.instances {
            let live = cat.slot(*s).fixed.generation;
            if cat.generations.get(id).is_none_or(|g| g.generation < live) {
                return Err(SnapshotError::Inconsistent(format!(
                    "instance {id} is at generation {live} but the generation memory is behind"
                )));
            }
        }
        cat.guard = ExpiryGuard::import(snap.guard);
        for stored in snap.policies {
            let key = stored.policy.key().clone();
            if stored.revision > snap.revision {
                return Err(SnapshotError::Inconsistent(format!(
                    "the policy of {key} is at revision {} beyond the snapshot's {}",
                    stored.revision, snap.revision
                )));
            }
            if stored.policy.home_region() != &cat.params.region {
                return Err(SnapshotError::Inconsistent(format!(
                    "the policy of {key} has home region {}, not this catalog's {}",
                    stored.policy.home_region(),
                    cat.params.region
                )));
            }
            if cat.policies.insert(key.clone(), stored).is_some() {
                return Err(SnapshotError::Inconsistent(format!(
                    "the policy of {key} appears twice"
                )));
            }
        }
        for held in snap.replicated_policies {
            let key = held.remote.policy.key().clone();
            if held.revision > snap.revision {
                return Err(SnapshotError::Inconsistent(format!(
                    "the replicated policy of {key} is at revision {} beyond the snapshot's {}",
                    held.revision, snap.revision
                )));
            }
            if held.remote.policy.home_region() == &cat.params.region {
                return Err(SnapshotError::Inconsistent(format!(
                    "the replicated policy of {key} has this catalog's own region {} as home",
                    cat.params.region
                )));
            }
            if cat.policies.contains_key(&key) || cat.replicated.insert(key.clone(), held).is_some()
            {
                return Err(SnapshotError::Inconsistent(format!(
                    "the policy of {key} appears twice"
                )));
            }
        }
        cat.import_writers(snap.writers)?;
        cat.policy_revision = snap.revision;
        Ok(cat)
    }
}
