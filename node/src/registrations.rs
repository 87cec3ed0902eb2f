//! The agent's own registrations, kept on disk (R7): what each local
//! instance registered, the generation the arbiter gave it, and what the
//! agent wants for it (serve, drain, leave) until the arbiter has committed
//! that. After a restart or reconnect the agent replays what is not yet
//! committed and reconciles the rest with the catalog by instance id and
//! generation.
//!
//! This module keeps the records (`Registrations`, plain data the agent's
//! state machine owns) and their file (`RegistrationsFile`, which the
//! agent's store actor writes); talking to the arbiter is the state
//! machine's job.

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

impl Intent {
    /// Its name in the local API (`serve`, `drain`, `leave`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Intent::Serve => "serve",
            Intent::Drain => "drain",
            Intent::Leave => "leave",
        }
    }
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

/// The file's name in the data directory. Its payload is JSON behind a
/// binary checksum header (`durable`), so the name says what it is, the
/// agent's state, and not a format to edit by hand: an edited file fails
/// its checksum and the agent refuses to start.
pub const FILE_NAME: &str = "registrations.state";

/// The name agents before issue 37 wrote the same file under, moved to
/// [`FILE_NAME`] at the first start.
pub const OLD_FILE_NAME: &str = "registrations.json";

/// The registrations file of a data directory.
#[derive(Clone, Debug)]
pub struct RegistrationsFile {
    path: PathBuf,
    old: PathBuf,
}

impl RegistrationsFile {
    /// `data_dir/registrations.state`.
    pub fn new(data_dir: &Path) -> Self {
        RegistrationsFile {
            path: data_dir.join(FILE_NAME),
            old: data_dir.join(OLD_FILE_NAME),
        }
    }

    /// Loads the file (checksummed), or nothing when there is none. A file
    /// under the old name with none under the new one is first renamed
    /// (the upgrade path; its bytes are the same format); with both, the
    /// new one is used and the old one left alone, with a warning.
    pub fn load(&self) -> Result<Registrations, RegistrationsError> {
        match (self.path.exists(), self.old.exists()) {
            (false, true) => {
                durable::rename(&self.old, &self.path)?;
                tracing::info!(from = %self.old.display(), to = %self.path.display(), "registrations file renamed to its new name");
            }
            (true, true) => tracing::warn!(
                used = %self.path.display(),
                ignored = %self.old.display(),
                "two registrations files: the one under the old name is ignored; remove it"
            ),
            _ => {}
        }
        match durable::read_verified(&self.path, MAX_FILE_BYTES)? {
            None => Ok(Registrations::default()),
            Some(bytes) => Registrations::decode(&bytes).map_err(|e| RegistrationsError::Parse {
                path: self.path.clone(),
                detail: e.to_string(),
            }),
        }
    }

    /// Writes what `Registrations::encode` gave (temp file, fsync, rename,
    /// directory fsync).
    pub fn write(&self, bytes: &[u8]) -> Result<(), RegistrationsError> {
        durable::write_atomic(&self.path, bytes)?;
        Ok(())
    }
}

/// The local instances.
#[derive(Clone, Debug, Default)]
pub struct Registrations {
    items: BTreeMap<InstanceId, LocalInstance>,
}

impl Registrations {
    /// The file's contents for these registrations.
    pub fn encode(&self) -> Vec<u8> {
        let list: Vec<&LocalInstance> = self.items.values().collect();
        serde_json::to_vec_pretty(&list).expect("registrations always serialize")
    }

    /// Reads the file's contents (what `encode` wrote, once `durable`
    /// verified them). A later entry for an instance id replaces an
    /// earlier one.
    pub fn decode(bytes: &[u8]) -> Result<Registrations, serde_json::Error> {
        let list: Vec<LocalInstance> = serde_json::from_slice(bytes)?;
        let items = list
            .into_iter()
            .map(|i| (i.registration.instance_id.clone(), i))
            .collect();
        Ok(Registrations { items })
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
        let file = RegistrationsFile::new(dir.path());
        let mut regs = file.load().unwrap();
        regs.put(instance("a"));
        let mut b = instance("b");
        b.generation = None;
        b.committed = false;
        regs.put(b.clone());
        file.write(&regs.encode()).unwrap();
        let back = file.load().unwrap();
        assert_eq!(
            back.get(&InstanceId::new("a").unwrap()),
            Some(&instance("a"))
        );
        assert_eq!(back.pending(), vec![b]);
    }

    #[test]
    fn a_corrupt_file_is_an_error_never_an_empty_list() {
        let dir = tempfile::tempdir().unwrap();
        let file = RegistrationsFile::new(dir.path());
        let mut regs = file.load().unwrap();
        regs.put(instance("a"));
        file.write(&regs.encode()).unwrap();
        let path = dir.path().join(FILE_NAME);
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 2;
        bytes[last] ^= 0x40;
        std::fs::write(&path, bytes).unwrap();
        let err = file.load().unwrap_err();
        assert!(err.to_string().contains("move it away"), "{err}");
    }

    /// Issue 37, item 6: a data directory of an earlier agent keeps its
    /// registrations: `registrations.json` is renamed at the first load,
    /// and written under the new name from then on.
    #[test]
    fn a_file_under_the_old_name_is_moved_to_the_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join(OLD_FILE_NAME);
        let mut regs = Registrations::default();
        regs.put(instance("a"));
        durable::write_atomic(&old, &regs.encode()).unwrap();
        let file = RegistrationsFile::new(dir.path());
        let back = file.load().unwrap();
        assert_eq!(
            back.get(&InstanceId::new("a").unwrap()),
            Some(&instance("a"))
        );
        assert!(!old.exists());
        assert!(dir.path().join(FILE_NAME).exists());
        // Both present (a downgrade, then an upgrade): the new one counts.
        durable::write_atomic(&old, &Registrations::default().encode()).unwrap();
        let back = file.load().unwrap();
        assert!(back.get(&InstanceId::new("a").unwrap()).is_some());
        assert!(old.exists(), "the old file is left alone");
    }
}
