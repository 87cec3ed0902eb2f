//! The compact form of snapshots (R6's size budget): the strings many
//! records share (node ids, zones, versions, reasons, origins, label
//! sets) stored once in tables that records refer to by index; instance
//! ids, sorted, as what differs from the previous id; times as offsets
//! from the snapshot's earliest time. Decoding checks every index and
//! every digest.

use super::*;

/// Encodes one service's snapshot in the compact form.
pub fn encode_service_snapshot(snap: &ServiceSnapshot) -> Vec<u8> {
    let mut tables = TableBuilder::new(&snap.records);
    let service = tables.service(
        &snap.service,
        snap.revision,
        None,
        snap.digest,
        &snap.records,
    );
    let wire = ServiceSnapshotWire {
        shard: snap.shard,
        base_ms: tables.base_ms,
        tables: tables.finish(),
        service,
    };
    frame(FrameKind::ServiceSnapshot, &wire)
}

/// `encode_service_snapshot`, shared: what the distributor hands every
/// agent that needs the same snapshot.
pub fn shared_service_snapshot(snap: &ServiceSnapshot) -> std::sync::Arc<[u8]> {
    encode_service_snapshot(snap).into()
}

/// Decodes one service's snapshot, checking its digest.
pub fn decode_service_snapshot(bytes: &[u8]) -> Result<ServiceSnapshot, CodecError> {
    const WHAT: &str = "service snapshot";
    let wire: ServiceSnapshotWire = unframe(
        bytes,
        FrameKind::ServiceSnapshot,
        MAX_SERVICE_SNAPSHOT_BYTES,
    )?;
    let tables = Tables::check(wire.tables, WHAT)?;
    let entry = tables.service(wire.service, wire.base_ms, WHAT)?;
    Ok(ServiceSnapshot {
        shard: wire.shard,
        service: entry.service,
        revision: entry.revision,
        digest: entry.digest,
        records: entry.records,
    })
}

/// Encodes a whole shard in the compact form.
pub fn encode_catalog_snapshot(snap: &CatalogSnapshot) -> Vec<u8> {
    let all: Vec<Arc<EndpointRecord>> = snap
        .services
        .iter()
        .flat_map(|s| s.records.iter().cloned())
        .collect();
    let mut tables = TableBuilder::new(&all);
    let services = snap
        .services
        .iter()
        .map(|s| {
            tables.service(
                &s.service,
                s.revision,
                s.emptied_at_ms,
                s.digest,
                &s.records,
            )
        })
        .collect();
    let wire = CatalogSnapshotWire {
        shard: snap.shard,
        region: snap.region.clone(),
        revision: snap.revision,
        base_ms: tables.base_ms,
        tables: tables.finish(),
        services,
        leases: snap.leases.clone(),
        generations: snap.generations.clone(),
        guard: snap.guard.clone(),
    };
    frame(
        FrameKind::CatalogSnapshot,
        &(
            wire,
            &snap.policies,
            &snap.replicated_policies,
            snap.identity,
            &snap.writers,
        ),
    )
}

/// Decodes a whole shard, checking every service's digest and policy. A
/// snapshot written before service policies existed (frame kind 4) decodes
/// as a shard without policies, one written before replicated policies
/// existed (kind 11) as a shard without replicated policies, one written
/// before catalog identities existed (kind 12) as a shard without one, one
/// written before writer epochs existed (kind 13) as a shard without them.
pub fn decode_catalog_snapshot(bytes: &[u8]) -> Result<CatalogSnapshot, CodecError> {
    const WHAT: &str = "catalog snapshot";
    type Body = (
        CatalogSnapshotWire,
        Vec<StoredPolicy>,
        Vec<ReplicatedPolicy>,
        Option<CatalogId>,
        Vec<StoredWriter>,
    );
    let limit = MAX_CATALOG_SNAPSHOT_BYTES;
    let kind = bytes.get(1).copied();
    let (wire, policies, replicated_policies, identity, writers): Body = match kind {
        Some(k) if k == FrameKind::CatalogSnapshotWithoutPolicies as u8 => {
            let wire = unframe(bytes, FrameKind::CatalogSnapshotWithoutPolicies, limit)?;
            (wire, Vec::new(), Vec::new(), None, Vec::new())
        }
        Some(k) if k == FrameKind::CatalogSnapshotWithoutReplicas as u8 => {
            let (wire, policies) =
                unframe(bytes, FrameKind::CatalogSnapshotWithoutReplicas, limit)?;
            (wire, policies, Vec::new(), None, Vec::new())
        }
        Some(k) if k == FrameKind::CatalogSnapshotWithoutIdentity as u8 => {
            let (wire, policies, replicated) =
                unframe(bytes, FrameKind::CatalogSnapshotWithoutIdentity, limit)?;
            (wire, policies, replicated, None, Vec::new())
        }
        Some(k) if k == FrameKind::CatalogSnapshotWithoutWriters as u8 => {
            let (wire, policies, replicated, identity) =
                unframe(bytes, FrameKind::CatalogSnapshotWithoutWriters, limit)?;
            (wire, policies, replicated, identity, Vec::new())
        }
        _ => unframe(bytes, FrameKind::CatalogSnapshot, limit)?,
    };
    let tables = Tables::check(wire.tables, WHAT)?;
    let services = wire
        .services
        .into_iter()
        .map(|s| tables.service(s, wire.base_ms, WHAT))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(CatalogSnapshot {
        shard: wire.shard,
        region: wire.region,
        revision: wire.revision,
        services,
        leases: wire.leases,
        generations: wire.generations,
        guard: wire.guard,
        policies,
        replicated_policies,
        identity,
        writers,
    })
}

#[derive(Serialize, Deserialize)]
struct ServiceSnapshotWire {
    shard: ShardId,
    base_ms: u64,
    tables: TablesWire,
    service: ServiceWire,
}

#[derive(Serialize, Deserialize)]
struct CatalogSnapshotWire {
    shard: ShardId,
    region: Label,
    revision: Revision,
    base_ms: u64,
    tables: TablesWire,
    services: Vec<ServiceWire>,
    leases: Vec<Lease>,
    generations: Vec<(InstanceId, GenerationMemory)>,
    guard: Vec<(Label, Vec<u64>)>,
}

/// Values shared by many records, each stored once.
#[derive(Serialize, Deserialize)]
struct TablesWire {
    strings: Vec<Arc<str>>,
    /// (node id string, epoch, lease id)
    nodes: Vec<(u32, u64, u64)>,
    /// (role, name string)
    principals: Vec<(Role, u32)>,
    /// (key string, value string) pairs
    label_sets: Vec<Vec<(u32, u32)>>,
}

#[derive(Serialize, Deserialize)]
struct ServiceWire {
    service: ServiceKey,
    revision: Revision,
    emptied_at_ms: Option<u64>,
    digest: Digest,
    records: Vec<RecordWire>,
}

#[derive(Serialize, Deserialize)]
enum AddrWire {
    V4([u8; 4]),
    V6([u8; 16]),
}

#[derive(Serialize, Deserialize)]
struct RecordWire {
    /// Bytes shared with the previous instance id in the service.
    shared: u8,
    /// The rest of the instance id.
    suffix: String,
    generation: Generation,
    node: u32,
    address: AddrWire,
    port: u16,
    region: u32,
    zone: u32,
    version: u32,
    weight: u32,
    labels: u32,
    state: State,
    reason: u32,
    origin: u32,
    liveness: Liveness,
    revision: Revision,
    /// Offset from the snapshot's `base_ms`.
    changed_at: u64,
}

struct TableBuilder {
    base_ms: u64,
    strings: Vec<Arc<str>>,
    string_index: HashMap<Arc<str>, u32>,
    nodes: Vec<(u32, u64, u64)>,
    node_index: HashMap<(u32, u64, u64), u32>,
    principals: Vec<(Role, u32)>,
    principal_index: HashMap<(Role, u32), u32>,
    label_sets: Vec<Vec<(u32, u32)>>,
    label_index: HashMap<Vec<(u32, u32)>, u32>,
}

fn intern<K: std::hash::Hash + Eq + Clone>(
    list: &mut Vec<K>,
    index: &mut HashMap<K, u32>,
    key: K,
) -> u32 {
    *index.entry(key.clone()).or_insert_with(|| {
        list.push(key);
        (list.len() - 1) as u32
    })
}

impl TableBuilder {
    fn new(records: &[Arc<EndpointRecord>]) -> Self {
        TableBuilder {
            base_ms: records.iter().map(|r| r.changed_at_ms).min().unwrap_or(0),
            strings: Vec::new(),
            string_index: HashMap::default(),
            nodes: Vec::new(),
            node_index: HashMap::default(),
            principals: Vec::new(),
            principal_index: HashMap::default(),
            label_sets: Vec::new(),
            label_index: HashMap::default(),
        }
    }

    fn string(&mut self, s: &Arc<str>) -> u32 {
        intern(&mut self.strings, &mut self.string_index, s.clone())
    }

    fn service(
        &mut self,
        key: &ServiceKey,
        revision: Revision,
        emptied_at_ms: Option<u64>,
        digest: Digest,
        records: &[Arc<EndpointRecord>],
    ) -> ServiceWire {
        let mut previous: &str = "";
        let mut out = Vec::with_capacity(records.len());
        for r in records {
            let id = r.instance_id.as_str();
            let shared = common_prefix(previous, id).min(u8::MAX as usize);
            previous = id;
            let node_name = self.string(r.node_id.as_arc());
            let node = intern(
                &mut self.nodes,
                &mut self.node_index,
                (node_name, r.epoch.0, r.lease.0),
            );
            let origin_name = self.string(r.origin.name.as_arc());
            let origin = intern(
                &mut self.principals,
                &mut self.principal_index,
                (r.origin.role, origin_name),
            );
            let set: Vec<(u32, u32)> = r
                .labels
                .iter()
                .map(|(k, v)| (self.string(k.as_arc()), self.string(v.as_arc())))
                .collect();
            let labels = intern(&mut self.label_sets, &mut self.label_index, set);
            out.push(RecordWire {
                shared: shared as u8,
                suffix: id[shared..].to_string(),
                generation: r.generation,
                node,
                address: match r.address {
                    IpAddr::V4(a) => AddrWire::V4(a.octets()),
                    IpAddr::V6(a) => AddrWire::V6(a.octets()),
                },
                port: r.port,
                region: self.string(r.region.as_arc()),
                zone: self.string(r.zone.as_arc()),
                version: self.string(r.version.as_arc()),
                weight: r.weight.get(),
                labels,
                state: r.state,
                reason: self.string(r.reason.as_arc()),
                origin,
                liveness: r.liveness,
                revision: r.revision,
                changed_at: r.changed_at_ms - self.base_ms,
            });
        }
        ServiceWire {
            service: key.clone(),
            revision,
            emptied_at_ms,
            digest,
            records: out,
        }
    }

    fn finish(self) -> TablesWire {
        TablesWire {
            strings: self.strings,
            nodes: self.nodes,
            principals: self.principals,
            label_sets: self.label_sets,
        }
    }
}

/// Byte length of the longest common prefix, on a character boundary.
fn common_prefix(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .take_while(|((_, x), y)| x == y)
        .map(|((i, x), _)| i + x.len_utf8())
        .last()
        .unwrap_or(0)
}

/// Decoded tables, checked for every index before use.
struct Tables {
    wire: TablesWire,
    what: &'static str,
}

impl Tables {
    fn check(wire: TablesWire, what: &'static str) -> Result<Tables, CodecError> {
        let n = wire.strings.len();
        let bad = |i: u32| (i as usize) >= n;
        if wire.nodes.iter().any(|(s, _, _)| bad(*s))
            || wire.principals.iter().any(|(_, s)| bad(*s))
            || wire
                .label_sets
                .iter()
                .flatten()
                .any(|(k, v)| bad(*k) || bad(*v))
        {
            return Err(malformed(
                what,
                "a table entry names a string beyond the string table",
            ));
        }
        Ok(Tables { wire, what })
    }

    fn get<T>(&self, list: &'static str, items: &[T], i: u32) -> Result<usize, CodecError> {
        if (i as usize) < items.len() {
            Ok(i as usize)
        } else {
            Err(malformed(
                self.what,
                format!(
                    "a record names {list} entry {i} but the table has {}",
                    items.len()
                ),
            ))
        }
    }

    fn string(&self, i: u32) -> Result<Arc<str>, CodecError> {
        let at = self.get("string", &self.wire.strings, i)?;
        Ok(self.wire.strings[at].clone())
    }

    fn typed<T>(
        &self,
        i: u32,
        make: fn(Arc<str>) -> Result<T, crate::name::NameError>,
    ) -> Result<T, CodecError> {
        make(self.string(i)?).map_err(|e| malformed(self.what, e))
    }

    fn service(
        &self,
        s: ServiceWire,
        base_ms: u64,
        what: &'static str,
    ) -> Result<ServiceEntry, CodecError> {
        let mut records = Vec::with_capacity(s.records.len());
        let mut previous = String::new();
        for w in s.records {
            let shared = w.shared as usize;
            if shared > previous.len() || !previous.is_char_boundary(shared) {
                return Err(malformed(
                    what,
                    format!(
                        "instance id shares {shared} bytes with a {}-byte predecessor",
                        previous.len()
                    ),
                ));
            }
            let id = format!("{}{}", &previous[..shared], w.suffix);
            let instance_id = InstanceId::new(&id).map_err(|e| malformed(what, e))?;
            previous = id;
            let (node_name, epoch, lease) =
                self.wire.nodes[self.get("node", &self.wire.nodes, w.node)?];
            let (role, origin_name) =
                self.wire.principals[self.get("principal", &self.wire.principals, w.origin)?];
            let set =
                &self.wire.label_sets[self.get("label set", &self.wire.label_sets, w.labels)?];
            let labels: Labels = set
                .iter()
                .map(|(k, v)| {
                    Ok((
                        self.typed(*k, Label::from_arc)?,
                        self.typed(*v, LabelValue::from_arc)?,
                    ))
                })
                .collect::<Result<_, CodecError>>()?;
            let changed_at_ms = base_ms
                .checked_add(w.changed_at)
                .ok_or_else(|| malformed(what, "a record time overflows"))?;
            records.push(Arc::new(EndpointRecord {
                instance_id,
                generation: w.generation,
                node_id: self.typed(node_name, NodeId::from_arc)?,
                epoch: AgentEpoch(epoch),
                lease: LeaseId(lease),
                address: match w.address {
                    AddrWire::V4(a) => IpAddr::V4(Ipv4Addr::from(a)),
                    AddrWire::V6(a) => IpAddr::V6(Ipv6Addr::from(a)),
                },
                port: w.port,
                region: self.typed(w.region, Label::from_arc)?,
                zone: self.typed(w.zone, Label::from_arc)?,
                version: self.typed(w.version, Version::from_arc)?,
                weight: Weight::new(w.weight).map_err(|e| malformed(what, e))?,
                labels,
                state: w.state,
                reason: self.typed(w.reason, Reason::from_arc)?,
                origin: Principal {
                    role,
                    name: self.typed(origin_name, PrincipalName::from_arc)?,
                },
                liveness: w.liveness,
                revision: w.revision,
                changed_at_ms,
            }));
        }
        if records
            .windows(2)
            .any(|p| p[0].instance_id >= p[1].instance_id)
        {
            return Err(malformed(
                what,
                format!("records of {} are not sorted by instance id", s.service),
            ));
        }
        let computed = Digest::of_records(records.iter().map(|r| &**r));
        if computed != s.digest {
            return Err(malformed(
                what,
                format!(
                    "service {} digest {} does not match its records ({computed})",
                    s.service, s.digest
                ),
            ));
        }
        Ok(ServiceEntry {
            service: s.service,
            revision: s.revision,
            emptied_at_ms: s.emptied_at_ms,
            digest: s.digest,
            records,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_prefix_respects_char_boundaries() {
        assert_eq!(
            common_prefix("checkout-7d9f8b6c4-x2k9p", "checkout-7d9f8b6c4-a1b2c"),
            19
        );
        assert_eq!(common_prefix("", "abc"), 0);
        assert_eq!(common_prefix("abc", "abc"), 3);
    }
}
