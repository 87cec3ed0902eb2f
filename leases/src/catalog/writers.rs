//! The catalog's writer epochs (R9, `crate::writer`): transfers committed
//! here, epochs replicated from other regions, what a service's writer is
//! now, and their place in snapshots.

use super::{Catalog, Effect, Rejection};
use crate::command::Envelope;
use crate::ids::Revision;
use crate::policy::{Policy, PolicyKey};
use crate::snapshot::SnapshotError;
use crate::writer::{self, StoredWriter, Transfer, TransferRefusal, WriterEpoch};

impl Catalog {
    /// The policy of `key` this region holds, homed here or replicated.
    pub fn any_policy(&self, key: &PolicyKey) -> Option<&Policy> {
        self.policies
            .get(key)
            .map(|s| &s.policy)
            .or_else(|| self.replicated.get(key).map(|r| &r.remote.policy))
    }

    /// The writer epoch of `key` as this region holds it: the last
    /// transfer stored, else the policy's first owner (epoch 1, set when
    /// the policy was); `None` for a service with no single writer.
    pub fn writer(&self, key: &PolicyKey) -> Option<WriterEpoch> {
        let policy = self.any_policy(key)?;
        policy.document().single_writer.as_ref()?;
        if let Some(held) = self.writers.get(key) {
            return Some(held.writer.clone());
        }
        let (at_ms, by) = match (self.policies.get(key), self.replicated.get(key)) {
            (Some(s), _) => (s.set_at_ms, s.set_by.clone()),
            (None, Some(r)) => (r.remote.home_set_at_ms, r.set_by.clone()),
            (None, None) => return None,
        };
        WriterEpoch::first(policy, at_ms, &by)
    }

    /// Every stored writer epoch (past the first), in key order, with the
    /// local revision that stored it: what the region bridge publishes.
    pub fn writers(&self) -> impl Iterator<Item = &StoredWriter> {
        self.writers.values()
    }

    pub(super) fn transfer_writer(
        &mut self,
        env: &Envelope,
        rev: Revision,
        request: &Transfer,
    ) -> Result<Effect, Rejection> {
        let here = &self.params.region;
        let no_writer = || TransferRefusal::NoSingleWriter {
            service: request.service.clone(),
            here: here.clone(),
        };
        let policy = self.any_policy(&request.service).ok_or_else(no_writer)?;
        let held = self.writer(&request.service).ok_or_else(no_writer)?;
        let next = writer::transfer(policy, &held, request, here, env.at_ms, &env.actor)?;
        let effect = Effect::WriterChanged {
            epoch: next.epoch,
            settled: next.settled,
        };
        self.writers.insert(
            request.service.clone(),
            StoredWriter {
                writer: next,
                revision: rev,
            },
        );
        Ok(effect)
    }

    pub(super) fn replicate_writer(&mut self, rev: Revision, remote: &WriterEpoch) -> Effect {
        let held = self.writer(&remote.service);
        let held = held
            .as_ref()
            .or(self.writers.get(&remote.service).map(|s| &s.writer));
        match writer::adopt(held, remote, &self.params.region) {
            Some(adopted) => {
                let effect = Effect::WriterChanged {
                    epoch: adopted.epoch,
                    settled: adopted.settled,
                };
                self.writers.insert(
                    remote.service.clone(),
                    StoredWriter {
                        writer: adopted,
                        revision: rev,
                    },
                );
                effect
            }
            None => Effect::Unchanged,
        }
    }

    pub(super) fn import_writers(
        &mut self,
        writers: Vec<StoredWriter>,
    ) -> Result<(), SnapshotError> {
        for stored in writers {
            let key = stored.writer.service.clone();
            if stored.revision > self.revision {
                return Err(SnapshotError::Inconsistent(format!(
                    "the writer epoch of {key} is at revision {} beyond the snapshot's {}",
                    stored.revision, self.revision
                )));
            }
            if self.writers.insert(key.clone(), stored).is_some() {
                return Err(SnapshotError::Inconsistent(format!(
                    "the writer epoch of {key} appears twice"
                )));
            }
        }
        Ok(())
    }
}
