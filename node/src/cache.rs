//! The agent's on-disk cache of subscribed services (R7): each service's last
//! snapshot and revision, so a restarted agent can serve callers at once
//! (marked stale) while it resyncs with the arbiter.
//!
//! One file per service in `<agent data dir>/cache`, named
//! `<namespace>.<service>.<port_name>.snap`. Every part of a service key is a
//! DNS label, which cannot contain '.' or '/', so the name is a safe path
//! component and no two keys share a name. Files are written with
//! `durable::write_atomic` and hold a frame of the agent's own kind: the
//! identity of the catalog the view came from (`CatalogId`, so a view of a
//! rebuilt or another arbiter group is never resumed) and the
//! `codec::encode_service_snapshot` bytes. Files written before catalogs
//! had identities hold the snapshot bytes alone and load with no identity.
//!
//! A file that fails any check (durable checksum, codec decode with its
//! digest, view construction, or a name that does not match the service
//! inside) is deleted and reported, never served: the agent refetches that
//! service. This module does not decide staleness or talk to the arbiter.
//!
//! Beside them, `regions.rcr` keeps the arbiter's last regions message (the
//! followed services' policies and the other regions' summaries, R9) with
//! the time it arrived, so a restarted agent applies its services'
//! policies (staleness, failover) before the arbiter answers; the remote
//! views in it keep ageing from that time, so they are only fresh if the
//! restart was quick.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use rollcall_leases::codec::{self, CodecError, MAX_SERVICE_SNAPSHOT_BYTES};
use rollcall_leases::{CatalogId, RegionsUpdate, ServiceKey, ServiceView, ViewError, WriterEpoch};

use crate::durable::{self, DurableError};

/// The extension of cache files.
const EXTENSION: &str = "snap";

/// The file of the last regions message.
const REGIONS_FILE: &str = "regions.rcr";

/// The frame kind of a regions file written before writer epochs:
/// `(received_at_ms, update)`. Read (as holding no writer epoch), never
/// written.
const REGIONS_KIND_WITHOUT_WRITERS: u8 = 0x40;

/// The frame kind of a regions file (the agent's own kind; the leases
/// codec's frame checks apply): `(received_at_ms, update, writers)`.
const REGIONS_KIND: u8 = 0x42;

/// Largest regions file.
const MAX_REGIONS_BYTES: usize = 16 * 1024 * 1024;

/// The frame kind of a service file: `(Option<CatalogId>, snapshot bytes)`.
const SERVICE_KIND: u8 = 0x41;

/// The frame kind of a service file written before catalog identities:
/// the snapshot frame itself.
const LEGACY_SERVICE_KIND: u8 = 3;

/// Largest service file: a snapshot and the frame around it.
const MAX_SERVICE_FILE_BYTES: usize = MAX_SERVICE_SNAPSHOT_BYTES + 64;

/// Why the cache could not be opened or changed.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The cache directory could not be created; the OS error is the `source`.
    #[error("cannot create the cache directory {}", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// What the operating system said.
        source: io::Error,
    },
    /// A cache file could not be written or removed.
    #[error(transparent)]
    Durable(#[from] DurableError),
}

/// What [`ServiceCache::load_all`] found.
#[derive(Debug, Default)]
pub struct LoadReport {
    /// Every intact cached service with the catalog it came from, sorted by
    /// service key. Serve them as stale until the arbiter confirms or
    /// replaces them.
    pub views: Vec<(ServiceView, Option<CatalogId>)>,
    /// Cache files not served, each with the reason, sorted by path. Corrupt
    /// ones were deleted; ones that could not be read at all (an IO error)
    /// were left in place for an operator to look at.
    pub discarded: Vec<(PathBuf, String)>,
    /// How many of `discarded` were corrupt (and deleted).
    pub corrupt: usize,
}

/// The on-disk cache of subscribed services.
#[derive(Debug, Clone)]
pub struct ServiceCache {
    dir: PathBuf,
}

impl ServiceCache {
    /// Opens (creating it if needed) the cache under the agent's data
    /// directory: `<data_dir>/cache`.
    pub fn open(data_dir: &Path) -> Result<Self, CacheError> {
        let dir = data_dir.join("cache");
        fs::create_dir_all(&dir).map_err(|source| CacheError::CreateDir {
            path: dir.clone(),
            source,
        })?;
        Ok(ServiceCache { dir })
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file that holds `service`.
    pub fn path_of(&self, service: &ServiceKey) -> PathBuf {
        self.dir.join(file_name(service))
    }

    /// Persists `view`, which came from `catalog`, durably, replacing any
    /// earlier copy of its service.
    ///
    /// A view of a service that does not exist (never snapshotted, or
    /// deleted by the arbiter) has no snapshot to keep: its file is removed
    /// instead, so a restart never serves a deleted service as an existing
    /// empty one.
    pub fn store(&self, view: &ServiceView, catalog: Option<CatalogId>) -> Result<(), CacheError> {
        if !view.exists() {
            return self.remove(view.service());
        }
        let bytes = encode_service_file(view, catalog);
        durable::write_atomic(&self.path_of(view.service()), &bytes)?;
        Ok(())
    }

    /// Persists the last regions message and when it arrived (ms since the
    /// Unix epoch).
    pub fn store_regions(
        &self,
        update: &RegionsUpdate,
        received_at_ms: u64,
    ) -> Result<(), CacheError> {
        let bytes = encode_regions_file(update, received_at_ms);
        durable::write_atomic(&self.dir.join(REGIONS_FILE), &bytes)?;
        Ok(())
    }

    /// The persisted regions message and when it arrived; `None` when there
    /// is none. A damaged file is deleted and reported as the error.
    pub fn load_regions(&self) -> Result<Option<(RegionsUpdate, u64)>, String> {
        let path = self.dir.join(REGIONS_FILE);
        let bytes = match durable::read_verified(&path, MAX_REGIONS_BYTES as u64) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return Ok(None),
            Err(e) => {
                let _ = durable::remove(&path);
                return Err(e.to_string());
            }
        };
        match decode_regions_file(&bytes) {
            Ok(loaded) => Ok(Some(loaded)),
            Err(e) => {
                let _ = durable::remove(&path);
                Err(e.to_string())
            }
        }
    }

    /// Forgets `service` (no longer subscribed, or deleted). Removing a
    /// service that has no file is not an error.
    pub fn remove(&self, service: &ServiceKey) -> Result<(), CacheError> {
        durable::remove(&self.path_of(service))?;
        Ok(())
    }

    /// Reads every cached service, verifying each file, deleting corrupt ones
    /// and ignoring files that are not `*.snap` (such as temporary files a
    /// crash left behind). Each file not served is in `discarded` with its
    /// reason, for the caller to log once; this logs nothing about them.
    ///
    /// A cache is only a head start: if the directory cannot be listed this
    /// logs a warning and returns an empty report, and the agent fetches
    /// everything from the arbiter.
    pub fn load_all(&self) -> LoadReport {
        let mut report = LoadReport::default();
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(error) => {
                tracing::warn!(
                    path = %self.dir.display(),
                    %error,
                    "cannot list the service cache; starting without it"
                );
                return report;
            }
        };
        for entry in entries {
            let path = match entry {
                Ok(entry) => entry.path(),
                Err(error) => {
                    tracing::warn!(
                        path = %self.dir.display(),
                        %error,
                        "cannot list an entry of the service cache; skipping it"
                    );
                    continue;
                }
            };
            if path.extension().is_none_or(|ext| ext != EXTENSION) {
                continue;
            }
            // Not logged here: the caller logs each file of
            // `report.discarded` once, with its reason.
            match load_file(&path) {
                Ok(loaded) => report.views.push(loaded),
                Err(Unusable::Unreadable(reason)) => {
                    report
                        .discarded
                        .push((path, format!("cannot be read: {reason}")));
                }
                Err(Unusable::Corrupt(reason)) => {
                    let reason = match durable::remove(&path) {
                        Ok(_) => format!("corrupt, deleted: {reason}"),
                        Err(error) => {
                            format!("corrupt: {reason}; deleting it failed: {}", chain(&error))
                        }
                    };
                    report.discarded.push((path, reason));
                    report.corrupt += 1;
                }
            }
        }
        report
            .views
            .sort_by(|a, b| a.0.service().cmp(b.0.service()));
        report.discarded.sort();
        report
    }
}

/// Why the contents of a cache file (once `durable` verified them) cannot
/// be served.
#[derive(Debug, thiserror::Error)]
pub enum CacheFileError {
    /// The frame or the snapshot in it does not decode (or its digest does
    /// not match its records).
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// The snapshot decodes but a view refuses it.
    #[error(transparent)]
    View(#[from] ViewError),
}

/// The contents of the service file of `view`, which came from `catalog`
/// (what `ServiceCache::store` writes inside the durable frame).
pub fn encode_service_file(view: &ServiceView, catalog: Option<CatalogId>) -> Vec<u8> {
    let snapshot = codec::encode_service_snapshot(&view.to_snapshot());
    codec::frame_as(SERVICE_KIND, &(catalog, snapshot))
}

/// Reads the contents of a service file: the view it holds and the
/// catalog that view came from (`None` in files written before catalog
/// identities, which hold the snapshot frame alone). Pure, so the fuzz
/// target reaches exactly what `ServiceCache::load_all` decodes; checking
/// that the file name matches the service is the caller's.
pub fn decode_service_file(
    bytes: &[u8],
) -> Result<(ServiceView, Option<CatalogId>), CacheFileError> {
    let (catalog, snapshot) = match bytes.get(1) {
        Some(&LEGACY_SERVICE_KIND) => (None, codec::decode_service_snapshot(bytes)?),
        _ => {
            let (catalog, inner) = codec::unframe_as::<(Option<CatalogId>, Vec<u8>)>(
                bytes,
                SERVICE_KIND,
                "service cache file",
                MAX_SERVICE_FILE_BYTES,
            )?;
            (catalog, codec::decode_service_snapshot(&inner)?)
        }
    };
    Ok((ServiceView::from_snapshot(&snapshot)?, catalog))
}

/// The contents of the regions file: the last regions message and when it
/// arrived (ms since the Unix epoch).
pub fn encode_regions_file(update: &RegionsUpdate, received_at_ms: u64) -> Vec<u8> {
    codec::frame_as(REGIONS_KIND, &(received_at_ms, update, &update.writers))
}

/// Reads the contents of the regions file (once `durable` verified them):
/// the regions message and when it arrived.
pub fn decode_regions_file(bytes: &[u8]) -> Result<(RegionsUpdate, u64), CodecError> {
    const WHAT: &str = "regions file";
    if bytes.get(1) == Some(&REGIONS_KIND_WITHOUT_WRITERS) {
        let (at, update) = codec::unframe_as::<(u64, RegionsUpdate)>(
            bytes,
            REGIONS_KIND_WITHOUT_WRITERS,
            WHAT,
            MAX_REGIONS_BYTES,
        )?;
        return Ok((update, at));
    }
    let (at, mut update, writers) = codec::unframe_as::<(u64, RegionsUpdate, Vec<WriterEpoch>)>(
        bytes,
        REGIONS_KIND,
        WHAT,
        MAX_REGIONS_BYTES,
    )?;
    update.writers = writers;
    Ok((update, at))
}

/// `<namespace>.<service>.<port_name>.snap`.
fn file_name(service: &ServiceKey) -> String {
    format!(
        "{}.{}.{}.{EXTENSION}",
        service.namespace, service.service, service.port_name
    )
}

/// Why a cache file cannot be served.
enum Unusable {
    /// An IO error: the file may be fine, so it is left alone.
    Unreadable(String),
    /// The contents are wrong: the file is deleted.
    Corrupt(String),
}

/// An error with its sources, for a one-line log field.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

fn load_file(path: &Path) -> Result<(ServiceView, Option<CatalogId>), Unusable> {
    let bytes = match durable::read_verified(path, MAX_SERVICE_FILE_BYTES as u64) {
        Ok(Some(bytes)) => bytes,
        // Removed between listing and reading: there is nothing to serve.
        Ok(None) => return Err(Unusable::Unreadable("the file disappeared".to_string())),
        Err(error @ DurableError::Corrupt { .. }) => return Err(Unusable::Corrupt(chain(&error))),
        Err(error @ DurableError::Io { .. }) => return Err(Unusable::Unreadable(chain(&error))),
    };
    let (view, catalog) = decode_service_file(&bytes).map_err(|e| Unusable::Corrupt(chain(&e)))?;
    let expected = file_name(view.service());
    if path.file_name().is_none_or(|name| *name != *expected) {
        return Err(Unusable::Corrupt(format!(
            "it holds service {} whose file is {expected}",
            view.service()
        )));
    }
    Ok((view, catalog))
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use rollcall_leases::{
        AgentEpoch, Catalog, CatalogParams, Command, Envelope, Label, NodeId, Principal,
        PrincipalName, Registration, Role, State, Version, Weight,
    };

    use super::*;

    fn key(service: &str) -> ServiceKey {
        ServiceKey::new("shop", service, "http").unwrap()
    }

    #[test]
    fn the_regions_message_survives_a_restart_and_a_damaged_one_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ServiceCache::open(dir.path()).unwrap();
        assert_eq!(cache.load_regions(), Ok(None));
        let mut doc = rollcall_config::ServicePolicy::new("shop/web", "r1");
        doc.cross_region = true;
        doc.failover_order = vec!["r2".into()];
        let update = rollcall_leases::RegionsUpdate {
            policies: vec![rollcall_leases::HeldPolicy {
                policy: rollcall_leases::Policy::new(doc).unwrap(),
                home_revision: rollcall_leases::Revision(7),
            }],
            regions: vec![rollcall_leases::RegionEntry {
                region: Label::new("r2").unwrap(),
                age_ms: 300,
                max_age_ms: 10_000,
                version: rollcall_leases::Revision(9),
                ingress: vec![rollcall_leases::Ingress::new("10.0.0.9:7443").unwrap()],
                summaries: Vec::new(),
            }],
            writers: vec![rollcall_leases::WriterEpoch {
                service: "shop/web".parse().unwrap(),
                epoch: 2,
                owner: Label::new("r2").unwrap(),
                from: Some(Label::new("r1").unwrap()),
                settled: true,
                at_ms: 5,
                by: Principal {
                    role: Role::Operator,
                    name: PrincipalName::new("admin-token").unwrap(),
                },
                committed_in: Label::new("r1").unwrap(),
                forced: None,
            }],
        };
        // A file written before writer epochs reads as holding none.
        let mut legacy = update.clone();
        legacy.writers.clear();
        let old = codec::frame_as(REGIONS_KIND_WITHOUT_WRITERS, &(7u64, &legacy));
        assert_eq!(decode_regions_file(&old).unwrap(), (legacy, 7));
        cache.store_regions(&update, 123_456).unwrap();
        // Not a service snapshot: the service cache does not see it.
        assert!(cache.load_all().views.is_empty());
        assert_eq!(cache.load_regions(), Ok(Some((update, 123_456))));

        let path = dir.path().join("cache").join(REGIONS_FILE);
        let mut bytes = fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        fs::write(&path, &bytes).unwrap();
        assert!(cache.load_regions().is_err());
        assert!(!path.exists(), "a damaged regions file is deleted");
        assert_eq!(cache.load_regions(), Ok(None));
    }

    /// A catalog with one node lease and two instances in each service.
    fn views(services: &[&str]) -> Vec<ServiceView> {
        let mut catalog = Catalog::new(CatalogParams::with_region(Label::new("r1").unwrap()));
        let mut at_ms = 1_000_000;
        let mut run = |command: Command| {
            at_ms += 10;
            catalog
                .apply(&Envelope {
                    at_ms,
                    actor: Principal {
                        role: Role::Agent,
                        name: PrincipalName::new("node-1").unwrap(),
                    },
                    command,
                })
                .unwrap();
        };
        run(Command::GrantLease {
            node: NodeId::new("node-1").unwrap(),
            epoch: AgentEpoch(1),
            zone: Label::new("z1").unwrap(),
            ttl_ms: 10_000,
        });
        for (s, service) in services.iter().enumerate() {
            for i in 0..2u8 {
                run(Command::Register(Registration {
                    instance_id: format!("{service}-{i}").parse().unwrap(),
                    service: key(service),
                    node: NodeId::new("node-1").unwrap(),
                    epoch: AgentEpoch(1),
                    address: IpAddr::V4(Ipv4Addr::new(10, 0, s as u8, i)),
                    port: 8080,
                    zone: None,
                    version: Version::new("v1").unwrap(),
                    weight: Weight::DEFAULT,
                    labels: Vec::new(),
                    initial: State::Ready,
                }));
            }
        }
        services
            .iter()
            .map(|s| {
                ServiceView::from_snapshot(&catalog.service_snapshot(&key(s)).unwrap()).unwrap()
            })
            .collect()
    }

    #[test]
    fn store_then_load_round_trips() {
        let data = tempfile::tempdir().unwrap();
        let cache = ServiceCache::open(data.path()).unwrap();
        assert_eq!(cache.dir(), data.path().join("cache"));
        let stored = views(&["checkout", "cart"]);
        for view in &stored {
            cache.store(view, Some(CatalogId(9))).unwrap();
        }
        assert!(cache.path_of(&key("cart")).ends_with("shop.cart.http.snap"));

        let report = cache.load_all();
        assert!(report.discarded.is_empty(), "{:?}", report.discarded);
        assert_eq!(report.views.len(), 2);
        for (loaded, catalog) in &report.views {
            assert_eq!(*catalog, Some(CatalogId(9)));
            let original = stored
                .iter()
                .find(|v| v.service() == loaded.service())
                .unwrap();
            assert_eq!(loaded.revision(), original.revision());
            assert!(loaded.records().eq(original.records()));
            assert_eq!(loaded, original);
        }
        assert_eq!(report.views[0].0.service(), &key("cart"), "sorted by key");
    }

    #[test]
    fn a_file_written_before_catalog_identities_loads_with_none() {
        let data = tempfile::tempdir().unwrap();
        let cache = ServiceCache::open(data.path()).unwrap();
        let view = views(&["checkout"]).remove(0);
        let legacy = codec::encode_service_snapshot(&view.to_snapshot());
        durable::write_atomic(&cache.path_of(view.service()), &legacy).unwrap();
        let report = cache.load_all();
        assert!(report.discarded.is_empty(), "{:?}", report.discarded);
        assert_eq!(report.views, vec![(view, None)]);
    }

    #[test]
    fn a_corrupt_file_is_deleted_and_others_still_load() {
        let data = tempfile::tempdir().unwrap();
        let cache = ServiceCache::open(data.path()).unwrap();
        for view in views(&["checkout", "cart"]) {
            cache.store(&view, Some(CatalogId(9))).unwrap();
        }
        let bad = cache.path_of(&key("cart"));
        let mut bytes = fs::read(&bad).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        fs::write(&bad, &bytes).unwrap();

        // Issue 37, item 6: one log line per corrupt file, the caller's
        // (the agent logged each twice, here and from the report).
        let logged = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
        let sink = logged.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || Sink(sink.clone()))
            .finish();
        let report = tracing::subscriber::with_default(subscriber, || cache.load_all());
        let logged = String::from_utf8(logged.lock().unwrap().clone()).unwrap();
        assert_eq!(logged, "", "load_all logs nothing about a discarded file");
        assert_eq!(report.views.len(), 1);
        assert_eq!(report.views[0].0.service(), &key("checkout"));
        assert_eq!(report.discarded.len(), 1);
        assert_eq!(report.discarded[0].0, bad);
        assert!(
            report.discarded[0].1.contains("checksum"),
            "{:?}",
            report.discarded
        );
        assert!(!bad.exists(), "a corrupt file must be deleted");
    }

    /// A log writer into shared memory.
    struct Sink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_truncated_file_is_deleted() {
        let data = tempfile::tempdir().unwrap();
        let cache = ServiceCache::open(data.path()).unwrap();
        let view = views(&["checkout"]).remove(0);
        cache.store(&view, Some(CatalogId(9))).unwrap();
        let path = cache.path_of(view.service());
        let bytes = fs::read(&path).unwrap();
        fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();

        let report = cache.load_all();
        assert!(report.views.is_empty());
        assert!(
            report.discarded[0].1.contains("truncated"),
            "{:?}",
            report.discarded
        );
        assert!(!path.exists());
    }

    #[test]
    fn a_checksummed_file_with_a_bad_snapshot_is_deleted() {
        let data = tempfile::tempdir().unwrap();
        let cache = ServiceCache::open(data.path()).unwrap();
        let path = cache.path_of(&key("checkout"));
        durable::write_atomic(&path, b"not a snapshot").unwrap();

        let report = cache.load_all();
        assert!(report.views.is_empty());
        assert_eq!(report.discarded.len(), 1);
        assert!(!path.exists());
    }

    #[test]
    fn a_file_renamed_to_another_service_is_discarded() {
        let data = tempfile::tempdir().unwrap();
        let cache = ServiceCache::open(data.path()).unwrap();
        let view = views(&["checkout"]).remove(0);
        cache.store(&view, Some(CatalogId(9))).unwrap();
        let wrong = cache.path_of(&key("cart"));
        fs::rename(cache.path_of(view.service()), &wrong).unwrap();

        let report = cache.load_all();
        assert!(report.views.is_empty());
        assert_eq!(report.discarded.len(), 1);
        assert_eq!(report.discarded[0].0, wrong);
        assert!(
            report.discarded[0].1.contains("shop/checkout/http"),
            "{:?}",
            report.discarded
        );
        assert!(!wrong.exists());
    }

    #[test]
    fn files_that_are_not_snapshots_are_ignored() {
        let data = tempfile::tempdir().unwrap();
        let cache = ServiceCache::open(data.path()).unwrap();
        cache.store(&views(&["checkout"])[0], None).unwrap();
        let others = [
            cache.dir().join("README"),
            cache.dir().join("notes.txt"),
            cache.dir().join(".shop.checkout.http.snap.tmp.1.0"),
        ];
        for other in &others {
            fs::write(other, b"garbage").unwrap();
        }

        let report = cache.load_all();
        assert_eq!(report.views.len(), 1);
        assert!(report.discarded.is_empty(), "{:?}", report.discarded);
        assert!(others.iter().all(|p| p.exists()));
    }

    #[test]
    fn remove_and_storing_a_deleted_service_forget_it() {
        let data = tempfile::tempdir().unwrap();
        let cache = ServiceCache::open(data.path()).unwrap();
        let stored = views(&["checkout", "cart"]);
        for view in &stored {
            cache.store(view, Some(CatalogId(9))).unwrap();
        }
        cache.remove(&key("checkout")).unwrap();
        cache.remove(&key("checkout")).unwrap();
        let gone = ServiceView::empty(key("cart"), stored[1].to_snapshot().shard);
        cache.store(&gone, None).unwrap();

        let report = cache.load_all();
        assert!(report.views.is_empty());
        assert!(report.discarded.is_empty());
    }
}
