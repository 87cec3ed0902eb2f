//! The digest of a service's record set: a multiset hash (the wrapping sum
//! of each record's 128-bit hash), so one change updates it in O(1) and the
//! same set gives the same digest whatever order it was built in. Agents
//! compare it after applying a delta to detect divergence (R2, R6).
//!
//! It detects accidents (lost or reordered deltas, bugs), not forgery: the
//! links are authenticated by mTLS.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use xxhash_rust::xxh3::xxh3_128;

use crate::endpoint::EndpointRecord;

/// A service's record-set digest.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Digest(u128);

impl Digest {
    /// The digest of an empty set.
    pub const EMPTY: Digest = Digest(0);

    /// The hash of one record: xxh3-128 of its postcard encoding, which is
    /// canonical (fields in declaration order, no maps).
    pub fn of_record(record: &EndpointRecord) -> u128 {
        Digest::of_record_in(record, &mut Vec::new())
    }

    /// `of_record`, encoding into a buffer the caller reuses.
    pub fn of_record_in(record: &EndpointRecord, buf: &mut Vec<u8>) -> u128 {
        buf.clear();
        let bytes =
            postcard::to_extend(record, std::mem::take(buf)).expect("records always encode");
        let hash = xxh3_128(&bytes);
        *buf = bytes;
        hash
    }

    /// Adds a record hash to the set.
    pub fn add(&mut self, hash: u128) {
        self.0 = self.0.wrapping_add(hash);
    }

    /// Removes a record hash from the set.
    pub fn remove(&mut self, hash: u128) {
        self.0 = self.0.wrapping_sub(hash);
    }

    /// The digest of a set of records.
    pub fn of_records<'a>(records: impl IntoIterator<Item = &'a EndpointRecord>) -> Digest {
        let mut d = Digest::EMPTY;
        for r in records {
            d.add(Digest::of_record(r));
        }
        d
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "digest:{self}")
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.to_le_bytes().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Digest(u128::from_le_bytes(<[u8; 16]>::deserialize(d)?)))
    }
}
