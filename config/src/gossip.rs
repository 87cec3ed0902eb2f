//! `[gossip]`: the SWIM settings of the agent's zone membership (R4), as a
//! named preset plus optional per-setting overrides. It only resolves and
//! validates numbers; it must not start foca or touch sockets (the `gossip`
//! crate does, from [`SwimSettings`]).

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{rules, ConfigError};

/// A named set of SWIM settings, chosen for a kind of network. All members
/// of a zone should use the same preset: SWIM's guarantees assume everyone
/// probes and suspects on the same schedule.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GossipPreset {
    /// One data centre, sub-millisecond RTTs, nodes that never stall for
    /// long. Fastest detection, tuned so that a silent crash is out of every
    /// survivor's view within 3 s at p99 (32 agents): it probes every 350 ms
    /// and suspects for 1.2 s. In the zone simulator (32 members, 150
    /// crashes) the first down verdict came at p50 1.8 s / p99 2.8 s, against
    /// 2.3 s / 4.7 s with the earlier 500/200/1500 ms settings; the
    /// real-process `node-crash` scenario measures it end to end. Zero false
    /// downs across 1.0, 1.2 and 1.5-s process pauses (120 each, simulated),
    /// but a 2-s pause (long GC, VM migration) gets a live node declared
    /// down (the real-process `pauses-2s` run on `lan`: 106 of 150 paused
    /// nodes recorded UNHEALTHY): use `tolerant` there. `max_transmissions` is 12, not foca's
    /// `Config::new_lan` 6: with 6 a tail of survivors never hears the Down
    /// update at all.
    #[default]
    Lan,
    /// Survives 2-s pauses of a member (a long GC, CPU steal, a VM's live
    /// migration) without false downs, and still detects a crash within
    /// about 4 s: it probes more often than `lan` (every 300 ms, so a dead
    /// member's first probe comes sooner) and suspects longer (2.3 s, so a
    /// paused member has time to refute once it runs again). Measured in
    /// the zone simulator (32 members, 240 pauses per length): no false
    /// down for 2.0 and 2.3 s pauses, first down verdict p99 ≈ 4 s after a
    /// crash; the real-process `pauses-2s` and `node-crash` scenarios
    /// measure it end to end. The price is packets: 3.3 probes per member
    /// per second instead of 2.9.
    Tolerant,
    /// High-latency or lossy links between members (stretched zones). Long
    /// RTT allowance and suspicion, at a price: the gossip path alone takes
    /// over 15 s at p99, so the node lease (`arbiter.lease.ttl_ms`) must
    /// carry the hard-failure SLO; check `rollcall budget` before using it.
    Wan,
}

impl GossipPreset {
    /// The settings this preset stands for.
    pub const fn settings(self) -> SwimSettings {
        match self {
            Self::Lan => SwimSettings {
                probe_period_ms: 350,
                probe_rtt_ms: 150,
                num_indirect_probes: 3,
                suspect_to_down_ms: 1_200,
                periodic_gossip_ms: 200,
                announce_ms: 30_000,
                max_transmissions: 12,
            },
            Self::Tolerant => SwimSettings {
                probe_period_ms: 300,
                probe_rtt_ms: 150,
                num_indirect_probes: 3,
                suspect_to_down_ms: 2_300,
                periodic_gossip_ms: 200,
                announce_ms: 30_000,
                max_transmissions: 16,
            },
            Self::Wan => SwimSettings {
                probe_period_ms: 2_000,
                probe_rtt_ms: 800,
                num_indirect_probes: 4,
                suspect_to_down_ms: 6_000,
                periodic_gossip_ms: 500,
                announce_ms: 60_000,
                max_transmissions: 24,
            },
        }
    }

    /// The name as written in the config file.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Lan => "lan",
            Self::Tolerant => "tolerant",
            Self::Wan => "wan",
        }
    }
}

impl fmt::Display for GossipPreset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The resolved SWIM settings handed to the gossip crate (foca's `Config`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwimSettings {
    /// How often each member probes one random member, in ms. Detection of a
    /// dead member takes about 1.6 periods on average and 4.6 at p99 before
    /// its first probe, plus one period for the probe to fail.
    pub probe_period_ms: u64,
    /// How long a direct probe may wait for its ack before indirect probes
    /// are sent, in ms. Must be below the period. Too low for the network's
    /// RTT makes healthy members look suspect.
    pub probe_rtt_ms: u64,
    /// Members asked to probe on our behalf when a direct probe fails. More
    /// rides out a single bad link between two members, at more packets.
    pub num_indirect_probes: u32,
    /// How long a member stays suspect (and may refute) before it is declared
    /// down, in ms. Adds directly to crash detection; too short turns process
    /// pauses into false downs.
    pub suspect_to_down_ms: u64,
    /// How often each member pushes pending updates to a few others, in ms.
    /// Bounds how fast a Down verdict spreads through the zone.
    pub periodic_gossip_ms: u64,
    /// How often a member re-announces itself to the seeds, in ms, so split
    /// membership views heal. No effect on detection time.
    pub announce_ms: u64,
    /// How many times each update is piggybacked before it is dropped. Too
    /// few leaves some members never hearing it (foca's LAN default of 6
    /// does at 1,000 members); more costs only packet space.
    pub max_transmissions: u8,
}

/// `[gossip]`: membership of this agent's zone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GossipConfig {
    /// Named set of SWIM settings: `"lan"` (default), `"tolerant"` or `"wan"`;
    /// see [`GossipPreset`] for their trade-offs. The fields below override
    /// single settings of the preset.
    pub preset: GossipPreset,
    /// Overrides [`SwimSettings::probe_period_ms`] (ms). Default: the preset's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe_period_ms: Option<u64>,
    /// Overrides [`SwimSettings::probe_rtt_ms`] (ms). Default: the preset's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe_rtt_ms: Option<u64>,
    /// Overrides [`SwimSettings::num_indirect_probes`]. Default: the preset's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_indirect_probes: Option<u32>,
    /// Overrides [`SwimSettings::suspect_to_down_ms`] (ms). Default: the preset's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suspect_to_down_ms: Option<u64>,
    /// Overrides [`SwimSettings::periodic_gossip_ms`] (ms). Default: the preset's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub periodic_gossip_ms: Option<u64>,
    /// Overrides [`SwimSettings::announce_ms`] (ms). Default: the preset's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub announce_ms: Option<u64>,
    /// Overrides [`SwimSettings::max_transmissions`]. Default: the preset's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_transmissions: Option<u8>,
    /// UDP address the gossip transport binds. Default `127.0.0.1:7946`
    /// (loopback, so a development agent is not reachable from outside).
    pub listen: SocketAddr,
    /// `host:port` of members to announce to when joining. Default empty: a
    /// lone member (development); production lists a few agents of the zone.
    pub seeds: Vec<String>,
    /// The zone key file: one line `<key id 0-255> <64 hex digits>`, as
    /// `rollcall gossip-key` prints. Every packet is sealed with it
    /// (ChaCha20-Poly1305, R10). Gossip runs only when this is set.
    /// Default none.
    pub key_file: Option<PathBuf>,
    /// The previous zone key file, still accepted while a rotation rolls
    /// out (its key id must differ). Default none.
    pub previous_key_file: Option<PathBuf>,
}

impl Default for GossipConfig {
    fn default() -> Self {
        Self {
            preset: GossipPreset::default(),
            probe_period_ms: None,
            probe_rtt_ms: None,
            num_indirect_probes: None,
            suspect_to_down_ms: None,
            periodic_gossip_ms: None,
            announce_ms: None,
            max_transmissions: None,
            listen: SocketAddr::from(([127, 0, 0, 1], 7946)),
            seeds: Vec::new(),
            key_file: None,
            previous_key_file: None,
        }
    }
}

impl GossipConfig {
    /// The preset's settings with every override applied.
    pub fn effective(&self) -> SwimSettings {
        let base = self.preset.settings();
        SwimSettings {
            probe_period_ms: self.probe_period_ms.unwrap_or(base.probe_period_ms),
            probe_rtt_ms: self.probe_rtt_ms.unwrap_or(base.probe_rtt_ms),
            num_indirect_probes: self.num_indirect_probes.unwrap_or(base.num_indirect_probes),
            suspect_to_down_ms: self.suspect_to_down_ms.unwrap_or(base.suspect_to_down_ms),
            periodic_gossip_ms: self.periodic_gossip_ms.unwrap_or(base.periodic_gossip_ms),
            announce_ms: self.announce_ms.unwrap_or(base.announce_ms),
            max_transmissions: self.max_transmissions.unwrap_or(base.max_transmissions),
        }
    }

    /// How to show an effective value to an operator: as is when it was
    /// overridden, else with the preset it came from, e.g. `350 (preset lan)`.
    pub(crate) fn shown<T: fmt::Display>(&self, overridden: Option<T>, effective: T) -> String {
        match overridden {
            Some(_) => effective.to_string(),
            None => format!("{effective} (preset {})", self.preset),
        }
    }

    /// Validates the effective settings. Presets are valid by themselves, so
    /// a broken rule always involves an override; the error names the
    /// overridden field.
    pub fn validate(&self, prefix: &str) -> Result<(), ConfigError> {
        let s = self.effective();
        let field = |name: &str| format!("{prefix}.{name}");
        rules::at_least(&field("probe_period_ms"), s.probe_period_ms, 1)?;
        rules::at_least(&field("probe_rtt_ms"), s.probe_rtt_ms, 1)?;
        if s.probe_rtt_ms >= s.probe_period_ms {
            let shown_period = self.shown(self.probe_period_ms, s.probe_period_ms);
            let shown_rtt = self.shown(self.probe_rtt_ms, s.probe_rtt_ms);
            return Err(if self.probe_rtt_ms.is_some() {
                ConfigError::invalid(
                    field("probe_rtt_ms"),
                    s.probe_rtt_ms,
                    format!("must be below probe_period_ms = {shown_period}"),
                )
            } else {
                ConfigError::invalid(
                    field("probe_period_ms"),
                    s.probe_period_ms,
                    format!("must be above probe_rtt_ms = {shown_rtt}"),
                )
            });
        }
        rules::at_least(&field("num_indirect_probes"), s.num_indirect_probes, 1)?;
        if s.suspect_to_down_ms < s.probe_period_ms {
            let shown_period = self.shown(self.probe_period_ms, s.probe_period_ms);
            return Err(ConfigError::invalid(
                field("suspect_to_down_ms"),
                s.suspect_to_down_ms,
                format!(
                    "must be at least probe_period_ms = {shown_period}: a suspect member \
                     needs a probe period to refute the suspicion"
                ),
            ));
        }
        rules::at_least(&field("periodic_gossip_ms"), s.periodic_gossip_ms, 1)?;
        rules::at_least(&field("announce_ms"), s.announce_ms, 1)?;
        rules::at_least(&field("max_transmissions"), s.max_transmissions, 1)?;
        rules::host_ports(&field("seeds"), &self.seeds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_is_valid() {
        for preset in [GossipPreset::Lan, GossipPreset::Tolerant, GossipPreset::Wan] {
            let config = GossipConfig {
                preset,
                ..GossipConfig::default()
            };
            config
                .validate("agent.gossip")
                .expect("preset must validate");
            assert_eq!(config.effective(), preset.settings());
        }
    }

    #[test]
    fn overrides_replace_single_settings() {
        let config: GossipConfig =
            toml::from_str("preset = \"tolerant\"\nsuspect_to_down_ms = 2500\n").expect("valid");
        let expected = SwimSettings {
            suspect_to_down_ms: 2500,
            ..GossipPreset::Tolerant.settings()
        };
        assert_eq!(config.effective(), expected);
    }

    #[test]
    fn rtt_not_below_period_blames_the_override() {
        let rtt = GossipConfig {
            probe_rtt_ms: Some(600),
            ..GossipConfig::default()
        };
        assert_eq!(
            rtt.validate("agent.gossip").unwrap_err().to_string(),
            "agent.gossip.probe_rtt_ms = 600 must be below probe_period_ms = 350 (preset lan)"
        );
        let period = GossipConfig {
            probe_period_ms: Some(100),
            suspect_to_down_ms: Some(1500),
            ..GossipConfig::default()
        };
        assert_eq!(
            period.validate("agent.gossip").unwrap_err().to_string(),
            "agent.gossip.probe_period_ms = 100 must be above probe_rtt_ms = 150 (preset lan)"
        );
    }

    #[test]
    fn unknown_preset_is_a_parse_error() {
        let err = toml::from_str::<GossipConfig>("preset = \"fast\"\n").unwrap_err();
        assert!(err.to_string().contains("fast"), "{err}");
    }
}
