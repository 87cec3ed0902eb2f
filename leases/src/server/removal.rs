//! A replica removed from its group knows it (issue 37). openraft does not
//! tell it: the entry that leaves it out is replicated to the members that
//! stay, so a removed replica keeps its last membership, still thinks it a
//! voter and campaigns at ever higher terms, and would go on answering
//! sessions and admin reads as a member, frozen at an old revision.
//!
//! So the leader tells it: once the removal commits, it sends the removed
//! replica `PeerRequest::Removed` (best effort, over the peer transport).
//! The removed replica writes `removed.json` in its data directory (fsync,
//! then rename, so a restart knows too) and from then on serves no agent
//! session (each is closed with the reason, and the agent moves on to its
//! next arbiter) and answers every admin call but `/metrics` with
//! `410 removed`, naming the replica that removed it and the leader it last
//! knew. A replica that was down, or cut off, when its removal committed
//! is not told: its operator stops it (README, "Replication").
//!
//! This module does IO (the marker file); what a removed replica refuses
//! is decided where each request arrives (`connection`, `admin`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::raft::ReplicaId;

/// The marker file's name in the data directory.
pub const MARKER: &str = "removed.json";

/// Who removed this replica, and when.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Removal {
    /// This replica.
    pub replica: ReplicaId,
    /// The leader that committed the removal.
    pub by: ReplicaId,
    /// That leader's QUIC address, as the membership named it.
    pub leader_addr: String,
    /// When the removal committed, on the leader's clock, ms since the epoch.
    pub at_ms: u64,
}

impl Removal {
    /// What a removed replica answers, in words.
    pub fn describe(&self) -> String {
        let at = chrono::DateTime::<chrono::Utc>::from_timestamp_millis(self.at_ms as i64)
            .map_or_else(|| format!("{} ms", self.at_ms), |t| t.to_rfc3339());
        format!(
            "replica {} was removed from its Raft group by replica {} at {at}: it serves nothing as a member; ask another replica (the leader it last knew is replica {} at {})",
            self.replica, self.by, self.by, self.leader_addr
        )
    }
}

/// Whether this replica was removed: shared by the peer server (which
/// records it), the session server and the admin API (which refuse).
#[derive(Clone)]
pub struct Removed {
    dir: PathBuf,
    state: Arc<watch::Sender<Option<Arc<Removal>>>>,
}

impl Removed {
    /// Reads the marker in `dir`, if any.
    pub fn load(dir: &Path) -> std::io::Result<Removed> {
        let path = dir.join(MARKER);
        let removal = match std::fs::read(&path) {
            Ok(bytes) => Some(Arc::new(serde_json::from_slice::<Removal>(&bytes).map_err(
                |e| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("{}: {e}; it records this replica's removal from its group (delete it only to rejoin with an empty data directory)", path.display()),
                    )
                },
            )?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        Ok(Removed {
            dir: dir.to_owned(),
            state: Arc::new(watch::Sender::new(removal)),
        })
    }

    /// The removal, if this replica was removed.
    pub fn get(&self) -> Option<Arc<Removal>> {
        self.state.borrow().clone()
    }

    /// Records the removal durably, then makes it known.
    pub fn record(&self, removal: Removal) -> std::io::Result<()> {
        let path = self.dir.join(MARKER);
        let temporary = self.dir.join(format!(".{MARKER}.tmp"));
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(&serde_json::to_vec_pretty(&removal).expect("always encodes"))?;
        file.sync_all()?;
        std::fs::rename(&temporary, &path)?;
        std::fs::File::open(&self.dir)?.sync_all()?;
        self.state.send_replace(Some(Arc::new(removal)));
        Ok(())
    }

    /// Completes once this replica is removed.
    pub async fn wait(&self) -> Arc<Removal> {
        let mut rx = self.state.subscribe();
        loop {
            if let Some(removal) = rx.borrow_and_update().clone() {
                return removal;
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_removal_is_durable_and_wakes_its_waiters() {
        let dir = tempfile::tempdir().unwrap();
        let removed = Removed::load(dir.path()).unwrap();
        assert!(removed.get().is_none());
        let waiter = tokio::spawn({
            let removed = removed.clone();
            async move { removed.wait().await }
        });
        let removal = Removal {
            replica: 3,
            by: 1,
            leader_addr: "127.0.0.1:7443".into(),
            at_ms: 1_700_000_000_000,
        };
        removed.record(removal.clone()).unwrap();
        assert_eq!(*waiter.await.unwrap(), removal);
        // A restart reads it back.
        let again = Removed::load(dir.path()).unwrap();
        assert_eq!(again.get().as_deref(), Some(&removal));
        assert!(removal.describe().contains("ask another replica"));
        // A marker that does not decode is an error naming the file.
        std::fs::write(dir.path().join(MARKER), b"{").unwrap();
        let err = Removed::load(dir.path()).err().unwrap();
        assert!(err.to_string().contains(MARKER), "{err}");
    }
}
