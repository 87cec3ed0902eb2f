//! The parameters of the catalog state machine. They change what `apply`
//! does, so every replica of a shard must run with the same values: they come
//! from the arbiter config, never from anything local to one replica.

use rollcall_config::ArbiterConfig;

use crate::ids::ShardId;
use crate::name::{Label, NameError};

/// Mass-expiry guard settings (R3).
#[derive(Clone, Debug, PartialEq)]
pub struct GuardParams {
    /// Most share of one zone's nodes whose leases may expire within one
    /// window; beyond it expiries are held. At least one node may always
    /// expire.
    pub max_share: f64,
    /// The window over which expiries are counted, in milliseconds.
    pub window_ms: u64,
    /// How long an expiry may be held before it proceeds anyway, in ms.
    pub max_hold_ms: u64,
}

/// Delta log retention.
#[derive(Clone, Debug, PartialEq)]
pub struct DeltaLogParams {
    /// Most service deltas kept.
    pub max_entries: usize,
    /// Most revisions between the oldest and newest kept delta.
    pub max_revision_span: u64,
}

/// Everything that shapes `apply`.
#[derive(Clone, Debug, PartialEq)]
pub struct CatalogParams {
    /// The region whose arbiter owns this catalog; stamped on every record.
    pub region: Label,
    /// This catalog's shard.
    pub shard: ShardId,
    /// The mass-expiry guard.
    pub guard: GuardParams,
    /// Records no live lease covers are purged this long after their last
    /// change, in milliseconds.
    pub expired_retention_ms: u64,
    /// A service stays known this long after its last record was purged, and
    /// a removed instance's generation is remembered as long, in ms.
    pub service_retention_ms: u64,
    /// The label keys registrations may use.
    pub allowed_label_keys: Vec<Label>,
    /// Most labels on one record.
    pub max_labels: usize,
    /// Delta log retention.
    pub delta_log: DeltaLogParams,
}

/// Shortest and longest lease time to live a grant may ask for, in ms.
pub const LEASE_TTL_RANGE_MS: std::ops::RangeInclusive<u64> = 1_000..=3_600_000;

impl CatalogParams {
    /// Defaults for region `region`, matching the arbiter config's defaults.
    pub fn with_region(region: Label) -> Self {
        let label = |s: &str| Label::new(s).expect("built-in label keys are valid");
        CatalogParams {
            region,
            shard: ShardId(0),
            guard: GuardParams {
                max_share: 0.3,
                window_ms: 60_000,
                max_hold_ms: 600_000,
            },
            expired_retention_ms: 900_000,
            service_retention_ms: 86_400_000,
            allowed_label_keys: ["track", "canary", "tier", "shard", "cell", "arch"]
                .map(label)
                .to_vec(),
            max_labels: 8,
            delta_log: DeltaLogParams {
                max_entries: 180_000,
                max_revision_span: 180_000,
            },
        }
    }
}

impl CatalogParams {
    /// The parameters an arbiter config gives shard `shard`. The config was
    /// validated when it was loaded; names are checked again here because
    /// this crate accepts only its own validated types.
    pub fn from_config(config: &ArbiterConfig, shard: ShardId) -> Result<Self, NameError> {
        let allowed_label_keys = config
            .catalog
            .allowed_label_keys
            .iter()
            .map(|k| Label::new(k))
            .collect::<Result<_, _>>()?;
        Ok(CatalogParams {
            region: Label::new(&config.region)?,
            shard,
            guard: GuardParams {
                max_share: config.guard.max_share,
                window_ms: config.guard.window_ms,
                max_hold_ms: config.guard.max_hold_ms,
            },
            expired_retention_ms: config.catalog.expired_retention_ms,
            service_retention_ms: config.catalog.service_retention_ms,
            allowed_label_keys,
            max_labels: config.catalog.max_labels as usize,
            delta_log: DeltaLogParams {
                max_entries: config.delta_log.max_entries as usize,
                max_revision_span: config.delta_log.max_revision_span,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_defaults_match_the_arbiter_configs() {
        let from_config =
            CatalogParams::from_config(&ArbiterConfig::default(), ShardId(0)).unwrap();
        assert_eq!(
            from_config,
            CatalogParams::with_region(Label::new("r1").unwrap())
        );
    }
}
