//! Numeric identities of the catalog: revisions, generations, agent epochs,
//! lease ids and shard ids. Plain newtypes, so a revision can never be passed
//! where a generation is expected.

use std::fmt;

use serde::{Deserialize, Serialize};

macro_rules! number_type {
    ($(#[$doc:meta])* $name:ident($inner:ty), $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub $inner);

        impl $name {
            /// The raw number.
            pub fn get(self) -> $inner {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

number_type!(
    /// A catalog revision: a per-shard counter assigned when a change commits.
    /// Revision 0 is the empty catalog; the first change is revision 1.
    Revision(u64),
    "r"
);

number_type!(
    /// Which registration of an instance id this is: the state machine gives
    /// each registration the previous generation + 1 (the first is 1), so a
    /// late call from a replaced process is recognised as stale (R2).
    Generation(u64),
    "g"
);

number_type!(
    /// One run of a node agent: a fresh value at every agent start, so a
    /// verdict about an agent's old life cannot touch its new one (R4).
    AgentEpoch(u64),
    "e"
);

number_type!(
    /// A lease grant: the revision at which it was granted, unique per shard.
    LeaseId(u64),
    "lease"
);

number_type!(
    /// A catalog shard. One shard by default; services map to shards by key.
    ShardId(u16),
    "shard"
);

/// The identity of one catalog: drawn at random by the first leader of a
/// newly bootstrapped arbiter group and committed as the catalog's first
/// change it makes (`Command::Identify`), so every replica and every
/// snapshot of that group carries the same one, and a rebuilt or restored
/// group (an empty store bootstrapped again) gets another. Agents compare it
/// with the one their cache was filled from (Welcome, cache files): a cache
/// of another catalog is discarded, never served as current.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CatalogId(pub u64);

impl CatalogId {
    /// Parses the 16 hex digits `Display` writes.
    pub fn parse(text: &str) -> Option<CatalogId> {
        if text.len() != 16 {
            return None;
        }
        u64::from_str_radix(text, 16).ok().map(CatalogId)
    }
}

impl fmt::Display for CatalogId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl fmt::Debug for CatalogId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "catalog-{:016x}", self.0)
    }
}

impl Revision {
    /// The revision after this one.
    pub fn next(self) -> Revision {
        Revision(self.0 + 1)
    }
}

impl Generation {
    /// The generation a new registration of the same instance id gets.
    pub fn next(self) -> Generation {
        Generation(self.0 + 1)
    }
}

/// A connection to an arbiter replica (an agent's, a controller's, a
/// bridge's), numbered by the replica that accepted it.
pub type AgentId = u64;

/// A replica's id in its Raft group. Stable for the replica's life: a wiped
/// replica that rejoins keeps it, a replacement gets a new one.
pub type ReplicaId = u64;
