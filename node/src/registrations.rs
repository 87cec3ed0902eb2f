//! The agent's own registrations, kept on disk (R7): what each local
//! instance registered, the generation the arbiter gave it, and what the
//! agent wants for it (serve, drain, leave) until the arbiter has committed
//! that. After a restart or reconnect the agent replays what is not yet
//! committed and reconciles the rest with the catalog by instance id and
//! generation.
//!
//! This module keeps the records and their file; talking to the arbiter is
//! the agent's job.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rollcall_leases::{Generation, InstanceId};
use serde::{Deserialize, Serialize};

use crate::api_types::ValidRegistration;
use crate::durable::{self, DurableError};

/// Largest registrations file read (about 100 bytes per instance; a node
/// runs hundreds at most).
const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;

/// What the agent wants for a local instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Intent {
    /// Registered and serving (READY when it has no checks).
    Serve,
    /// Drained: no new traffic.
    Drain,
    /// Deregistered: gone once the arbiter commits it.
    Leave,
}

/// One local instance.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LocalInstance {
    /// What was registered.
    pub registration: ValidRegistration,
    /// The generation the arbiter gave it; `None` while the registration
    /// itself is pending.
    pub generation: Option<Generation>,
    /// What the agent wants for it.
    pub intent: Intent,
    /// Whether the arbiter has committed `intent`.
    pub committed: bool,
}

/// Why the registrations file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationsError {
    /// Reading or writing failed, or the file is corrupt. A corrupt file is
    /// never discarded silently: without it the agent would forget what its
    /// node runs.
    #[error("{0}; if the file is beyond repair, move it away: the agent then starts with no local registrations and deregisters what agents registered on this node")]
    File(#[from] DurableError),
    /// The file checks but does not parse.
    #[error("{path} does not parse: {detail}; move it away to start with no local registrations")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
}

/// The local instances and their file.
#[derive(Debug)]
pub struct Registrations {
    path: PathBuf,
    items: BTreeMap<InstanceId, LocalInstance>,
}

impl Registrations {
    /// Loads `data_dir/registrations.json` (checksummed), or starts empty.
    pub fn open(data_dir: &Path) -> Result<Self, RegistrationsError> {
        let path = data_dir.join("registrations.json");
        let items = match durable::read_verified(&path, MAX_FILE_BYTES)? {
            None => BTreeMap::new(),
            Some(bytes) => {
                let list: Vec<LocalInstance> =
                    serde_json::from_slice(&bytes).map_err(|e| RegistrationsError::Parse {
                        path: path.clone(),
                        detail: e.to_string(),
                    })?;
                list.into_iter()
                    .map(|i| (i.registration.instance_id.clone(), i))
                    .collect()
            }
        };
        Ok(Registrations { path, items })
    }

    /// Writes the file (temp file, fsync, rename, directory fsync).
    pub fn save(&self) -> Result<(), RegistrationsError> {
        let list: Vec<&LocalInstance> = self.items.values().collect();
        let bytes = serde_json::to_vec_pretty(&list).expect("registrations always serialize");
        durable::write_atomic(&self.path, &bytes)?;
        Ok(())
    }

    /// One local instance.
    pub fn get(&self, id: &InstanceId) -> Option<&LocalInstance> {
        self.items.get(id)
    }

    /// One local instance, to change it (then `save`).
    pub fn get_mut(&mut self, id: &InstanceId) -> Option<&mut LocalInstance> {
        self.items.get_mut(id)
    }

    /// Adds or replaces an instance.
    pub fn put(&mut self, instance: LocalInstance) {
        self.items
            .insert(instance.registration.instance_id.clone(), instance);
    }

    /// Removes an instance.
    pub fn remove(&mut self, id: &InstanceId) -> Option<LocalInstance> {
        self.items.remove(id)
    }

    /// Every local instance, in id order.
    pub fn iter(&self) -> impl Iterator<Item = &LocalInstance> {
        self.items.values()
    }

    /// Instances whose intent the arbiter has not committed yet.
    pub fn pending(&self) -> Vec<LocalInstance> {
        self.items
            .values()
            .filter(|i| !i.committed)
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use rollcall_leases::{ServiceKey, Version, Weight};

    use super::*;

    fn instance(id: &str) -> LocalInstance {
        LocalInstance {
            registration: ValidRegistration {
                service: ServiceKey::new("default", "web", "default").unwrap(),
                instance_id: InstanceId::new(id).unwrap(),
                address: IpAddr::V4(Ipv4Addr::LOCALHOST),
                port: 8080,
                zone: None,
                version: Version::new("v1").unwrap(),
                weight: Weight::DEFAULT,
                labels: Vec::new(),
                checks: None,
            },
            generation: Some(Generation(3)),
            intent: Intent::Serve,
            committed: true,
        }
    }

    #[test]
    fn registrations_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let mut regs = Registrations::open(dir.path()).unwrap();
        regs.put(instance("a"));
        let mut b = instance("b");
        b.generation = None;
        b.committed = false;
        regs.put(b.clone());
        regs.save().unwrap();
        let back = Registrations::open(dir.path()).unwrap();
        assert_eq!(
            back.get(&InstanceId::new("a").unwrap()),
            Some(&instance("a"))
        );
        assert_eq!(back.pending(), vec![b]);
    }

    #[test]
    fn a_corrupt_file_is_an_error_never_an_empty_list() {
        let dir = tempfile::tempdir().unwrap();
        let mut regs = Registrations::open(dir.path()).unwrap();
        regs.put(instance("a"));
        regs.save().unwrap();
        let path = dir.path().join("registrations.json");
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 2;
        bytes[last] ^= 0x40;
        std::fs::write(&path, bytes).unwrap();
        let err = Registrations::open(dir.path()).unwrap_err();
        assert!(err.to_string().contains("move it away"), "{err}");
    }
}
