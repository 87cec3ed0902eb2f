//! The file `rollcall dev` leaves in its data directory, `dev.json`: every
//! region's agent HTTP API and node token file, and every arbiter
//! replica's admin address and operator token file. The operator commands
//! (`audit`, `cluster`, `policy`, `drain`) read it for the addresses and
//! tokens not given on their command line, so they work against `dev`,
//! `dev --replicas N` and `dev --regions N` alike. `dev` removes it when it
//! stops.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The file's name in the data directory.
pub const FILE_NAME: &str = "dev.json";

/// What a running `rollcall dev` serves.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DevTargets {
    /// Each region, r1 first.
    pub regions: Vec<RegionTargets>,
}

/// One region of a `rollcall dev`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegionTargets {
    /// The region.
    pub region: String,
    /// The agent's HTTP API, `http://host:port`.
    pub agent: String,
    /// The agent's node token file.
    pub agent_token_file: PathBuf,
    /// The arbiter replicas, replica 1 first.
    pub arbiters: Vec<ArbiterTargets>,
}

/// One arbiter replica of a `rollcall dev`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArbiterTargets {
    /// The Raft replica id.
    pub replica: u64,
    /// Its admin address, `host:port`.
    pub admin: String,
    /// Its operator token file.
    pub token_file: PathBuf,
}

impl DevTargets {
    /// Writes `dev.json` into `data_dir`, replacing any earlier one; the
    /// path written.
    pub fn write(&self, data_dir: &Path) -> std::io::Result<PathBuf> {
        let path = data_dir.join(FILE_NAME);
        let text = serde_json::to_string_pretty(self).expect("always encodes");
        std::fs::create_dir_all(data_dir)?;
        std::fs::write(&path, text + "\n")?;
        Ok(path)
    }

    /// Reads `dev.json` from `data_dir`: `Ok(None)` when there is none (no
    /// `rollcall dev` runs there), an error naming the file when it does
    /// not parse.
    pub fn read(data_dir: &Path) -> Result<Option<DevTargets>, String> {
        let path = data_dir.join(FILE_NAME);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("reading {}: {e}", path.display())),
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| format!("{} is not a dev targets file: {e}", path.display()))
    }

    /// Removes `dev.json` from `data_dir` (a stopped `dev` serves nothing).
    pub fn remove(data_dir: &Path) {
        let _ = std::fs::remove_file(data_dir.join(FILE_NAME));
    }

    /// The region `region` (the first when `None`) of the `rollcall dev`
    /// whose `dev.json` is in `data_dir`; `Ok(None)` when there is none and
    /// no region was asked for (the commands' own defaults apply).
    pub fn region_in(
        data_dir: &Path,
        region: Option<&str>,
    ) -> Result<Option<RegionTargets>, String> {
        match (DevTargets::read(data_dir)?, region) {
            (Some(dev), region) => dev.region(region).cloned().map(Some),
            (None, Some(_)) => Err(format!(
                "--region needs the dev.json of a running `rollcall dev --regions N` in {}",
                data_dir.display()
            )),
            (None, None) => Ok(None),
        }
    }

    /// The region named `region`, or the first when `None`.
    pub fn region(&self, region: Option<&str>) -> Result<&RegionTargets, String> {
        match region {
            None => self
                .regions
                .first()
                .ok_or_else(|| "the dev targets file lists no region".to_owned()),
            Some(name) => self
                .regions
                .iter()
                .find(|r| r.region == name)
                .ok_or_else(|| {
                    let known: Vec<&str> = self.regions.iter().map(|r| r.region.as_str()).collect();
                    format!(
                        "no region {name} in this dev run (it runs {})",
                        known.join(", ")
                    )
                }),
        }
    }
}

impl RegionTargets {
    /// The replica serving `admin`, or the first when `None`.
    pub fn arbiter(&self, admin: Option<&str>) -> Option<&ArbiterTargets> {
        match admin {
            None => self.arbiters.first(),
            Some(admin) => self.arbiters.iter().find(|a| a.admin == admin),
        }
    }
}
