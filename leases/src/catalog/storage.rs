//! Record storage: the only code that touches the indexes (slots,
//! services, nodes), the digests and the batch of changes.

use super::*;

impl Catalog {
    pub(super) fn slot(&self, s: u32) -> &Slot {
        self.slots[s as usize]
            .as_ref()
            .expect("an indexed slot holds a record")
    }

    pub(super) fn service_state(&self, key: &ServiceKey) -> Option<&ServiceState> {
        let ix = *self.service_index.get(key)?;
        self.services[ix as usize].as_ref()
    }

    /// The slots of every record on `node`, in instance id order.
    pub(super) fn node_records(&self, node: &NodeId) -> Vec<u32> {
        let Some(ids) = self.nodes.get(node) else {
            return Vec::new();
        };
        ids.iter().map(|id| self.instances[id]).collect()
    }

    /// The index of service `key`, created (empty, revision 0) if unknown.
    pub(super) fn service_ix(&mut self, key: &ServiceKey) -> u32 {
        if let Some(&ix) = self.service_index.get(key) {
            return ix;
        }
        let state = ServiceState {
            key: Arc::new(key.clone()),
            members: Vec::new(),
            revision: Revision(0),
            digest: Digest::EMPTY,
            ready: 0,
            emptied_at_ms: None,
            log_last: self.log.unpark(key),
        };
        let ix = place(&mut self.services, &mut self.free_services, state);
        self.service_index.insert(key.clone(), ix);
        ix
    }

    /// Removes an empty service; its deletion is committed as a delta.
    pub(super) fn delete_service(&mut self, batch: &mut Batch, key: &ServiceKey) {
        let ix = self.service_index.remove(key).expect("the service exists");
        let svc = self.services[ix as usize]
            .take()
            .expect("an indexed service exists");
        self.free_services.push(ix);
        batch.deleted.push((svc.key, svc.revision, svc.log_last));
    }

    /// Adds a record new to the catalog (its instance id holds no record).
    pub(super) fn insert(&mut self, batch: &mut Batch, key: &ServiceKey, fixed: Fixed, live: Live) {
        let ix = self.service_ix(key);
        let hash = fixed.hash(&live, &mut self.scratch);
        let fixed = Arc::new(fixed);
        let svc = self.services[ix as usize]
            .as_mut()
            .expect("an indexed service exists");
        svc.digest.add(hash);
        if live.state.is_routable() {
            svc.ready += 1;
        }
        svc.emptied_at_ms = None;
        let slot = Slot {
            fixed: fixed.clone(),
            live: live.clone(),
            hash,
            service: ix,
            member: svc.members.len() as u32,
        };
        let s = place(&mut self.slots, &mut self.free_slots, slot);
        svc.members.push(s);
        self.nodes
            .entry(fixed.node_id.clone())
            .or_default()
            .insert(fixed.instance_id.clone());
        self.instances.insert(fixed.instance_id.clone(), s);
        batch.changes.push((ix, LogChange::Upsert(fixed, live)));
    }

    /// Replaces the record in slot `s` whole (same instance, service and
    /// node: a grant moved it under a new lease).
    pub(super) fn replace(&mut self, batch: &mut Batch, s: u32, fixed: Fixed, live: Live) {
        let slot = self.slots[s as usize]
            .as_mut()
            .expect("an indexed slot holds a record");
        slot.fixed = Arc::new(fixed);
        let hash = slot.fixed.hash(&live, &mut self.scratch);
        let svc = self.services[slot.service as usize]
            .as_mut()
            .expect("an indexed service exists");
        swap_hash(svc, (slot.hash, slot.live.state), (hash, live.state));
        slot.hash = hash;
        slot.live = live.clone();
        batch
            .changes
            .push((slot.service, LogChange::Upsert(slot.fixed.clone(), live)));
    }

    /// Changes the live part of the record in slot `s`, in place.
    pub(super) fn update(&mut self, batch: &mut Batch, s: u32, live: Live) {
        let slot = self.slots[s as usize]
            .as_mut()
            .expect("an indexed slot holds a record");
        let hash = slot.fixed.hash(&live, &mut self.scratch);
        let svc = self.services[slot.service as usize]
            .as_mut()
            .expect("an indexed service exists");
        swap_hash(svc, (slot.hash, slot.live.state), (hash, live.state));
        slot.hash = hash;
        batch.changes.push((
            slot.service,
            LogChange::Upsert(slot.fixed.clone(), live.clone()),
        ));
        slot.live = live;
    }

    pub(super) fn remove_record(&mut self, batch: &mut Batch, s: u32, at_ms: u64) {
        let slot = self.slots[s as usize]
            .take()
            .expect("an indexed slot holds a record");
        self.free_slots.push(s);
        let svc = self.services[slot.service as usize]
            .as_mut()
            .expect("an indexed service exists");
        svc.digest.remove(slot.hash);
        if slot.live.state.is_routable() {
            svc.ready -= 1;
        }
        let member = slot.member as usize;
        svc.members.swap_remove(member);
        if let Some(&moved) = svc.members.get(member) {
            self.slots[moved as usize]
                .as_mut()
                .expect("a member slot holds a record")
                .member = member as u32;
        }
        if svc.members.is_empty() {
            svc.emptied_at_ms = Some(at_ms);
        }
        let id = &slot.fixed.instance_id;
        self.unindex_node(&slot.fixed.node_id, id);
        self.instances.remove(id);
        if let Some(g) = self.generations.get_mut(id) {
            g.released_at_ms = Some(at_ms);
        }
        batch.changes.push((
            slot.service,
            LogChange::Remove(id.clone(), slot.fixed.generation),
        ));
    }

    pub(super) fn unindex_node(&mut self, node: &NodeId, id: &InstanceId) {
        if let Some(ids) = self.nodes.get_mut(node) {
            ids.remove(id);
            if ids.is_empty() {
                self.nodes.remove(node);
            }
        }
    }

    /// The record in slot `s`, whole.
    pub(super) fn record(&self, s: u32) -> Arc<EndpointRecord> {
        let slot = self.slot(s);
        materialize(&slot.fixed, &slot.live)
    }

    /// A service's records, whole, sorted by instance id.
    pub(super) fn sorted_records(&self, svc: &ServiceState) -> Vec<Arc<EndpointRecord>> {
        let mut slots = svc.members.clone();
        slots.sort_by(|a, b| {
            self.slot(*a)
                .fixed
                .instance_id
                .cmp(&self.slot(*b).fixed.instance_id)
        });
        slots.into_iter().map(|s| self.record(s)).collect()
    }
}
