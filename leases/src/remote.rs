//! The remote view (R9): what this region knows of the other regions, as
//! its region bridge reports it. Per region: per-service summaries (READY
//! count, summed READY weight, the revision they were read at, when), the
//! region's declared ingress addresses (edge gateways), and how old the
//! whole is. Nothing here describes an instance.
//!
//! Non-authoritative: an arbiter keeps it in memory only, never in the Raft
//! log. The bridge re-sends it, so a restarted arbiter holds none until the
//! bridge's next report. This module holds data and its checks; it decides
//! nothing about failover (the agents will, from the view delivered with
//! their subscriptions).
//!
//! Ages use local clocks only: the bridge says how long ago it last heard
//! the other region confirm the view, and the arbiter counts from when it
//! received that, so a clock skew between regions (or between the bridge's
//! host and the arbiter's) never makes a view look fresher than it is.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::Revision;
use crate::name::{Label, ServiceKey};

/// Most ingress addresses one region may declare.
pub const MAX_INGRESS: usize = 16;

/// Longest ingress address, in bytes (a DNS name is at most 253, plus the port).
pub const MAX_INGRESS_CHARS: usize = 261;

/// Most service summaries one region's view may hold (about 2,000 services
/// per region, with room).
pub const MAX_REGION_SUMMARIES: usize = 100_000;

/// Why a remote view, or a part of it, was refused. A refused view changes
/// nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemoteError {
    /// An ingress address is not `host:port`.
    #[error("ingress address {value:?} is invalid: write host:port with a port from 1 to 65535, at most {MAX_INGRESS_CHARS} characters, no spaces")]
    BadIngress {
        /// The refused text, cut to 80 characters.
        value: String,
    },
    /// A list is over its bound.
    #[error("{what} lists {count} entries; at most {limit} are accepted")]
    TooMany {
        /// Which list.
        what: &'static str,
        /// How many it has.
        count: usize,
        /// The bound.
        limit: usize,
    },
    /// Summaries must be sorted by service, each service once.
    #[error("service {service} is summarized twice or out of order; send summaries sorted by service, each once")]
    Unsorted {
        /// The service found out of place.
        service: ServiceKey,
    },
    /// A region's arbiter never holds a remote view of its own region.
    #[error(
        "region {region} is this arbiter's own region; a remote view is of other regions only"
    )]
    OwnRegion {
        /// The region.
        region: Label,
    },
}

/// An ingress address: `host:port` of one of a region's edge gateways,
/// where another region may send failed-over connections. Validated on the
/// way in (also when decoded).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Ingress(String);

impl Ingress {
    /// Validates `text` as `host:port`. Host names are not resolved here.
    pub fn new(text: &str) -> Result<Ingress, RemoteError> {
        let port_ok = text.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
        });
        let clean = !text.chars().any(|c| c.is_whitespace() || c.is_control());
        if port_ok && clean && text.len() <= MAX_INGRESS_CHARS {
            Ok(Ingress(text.to_owned()))
        } else {
            Err(RemoteError::BadIngress {
                value: text.chars().take(80).collect(),
            })
        }
    }

    /// The address as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Ingress {
    type Error = RemoteError;
    fn try_from(text: String) -> Result<Self, RemoteError> {
        Ingress::new(&text)
    }
}

impl From<Ingress> for String {
    fn from(ingress: Ingress) -> String {
        ingress.0
    }
}

impl fmt::Display for Ingress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Ingress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// One service of one region, summarized: how much READY capacity it has
/// there. Never an instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceSummary {
    /// The service, written `namespace/service/port_name`.
    #[serde(with = "service_text")]
    pub service: ServiceKey,
    /// The revision of the service's last change in its region's catalog.
    pub revision: Revision,
    /// READY instances.
    pub ready: u32,
    /// The summed weight of the READY instances (capacity).
    pub weight: u64,
    /// When the region's bridge read this summary from its arbiter, ms
    /// since the Unix epoch by that bridge's clock (informative: ages are
    /// kept per region, see `HeldView`).
    pub taken_at_ms: u64,
}

/// A service key as its text `namespace/service/port_name` (in JSON and on
/// the wire alike), parsed and validated on the way in.
mod service_text {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::name::ServiceKey;

    pub fn serialize<S: Serializer>(key: &ServiceKey, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(key)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<ServiceKey, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Everything one region tells the others: its summaries and ingress
/// addresses, complete up to `version`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionView {
    /// The region described.
    pub region: Label,
    /// That region's catalog revision this view is complete up to: what
    /// the bridge resumes from after a reconnect or restart.
    pub version: Revision,
    /// When that region's bridge last read its arbiter, ms since the Unix
    /// epoch by its clock (informative).
    pub as_of_ms: u64,
    /// The region's declared ingress addresses.
    pub ingress: Vec<Ingress>,
    /// Per-service summaries, sorted by service, each once.
    pub summaries: Vec<ServiceSummary>,
}

impl RegionView {
    /// A view of `region` holding nothing (version 0).
    pub fn empty(region: Label) -> RegionView {
        RegionView {
            region,
            version: Revision(0),
            as_of_ms: 0,
            ingress: Vec::new(),
            summaries: Vec::new(),
        }
    }

    /// Checks the bounds and the order of summaries.
    pub fn validate(&self) -> Result<(), RemoteError> {
        if self.ingress.len() > MAX_INGRESS {
            return Err(RemoteError::TooMany {
                what: "ingress",
                count: self.ingress.len(),
                limit: MAX_INGRESS,
            });
        }
        if self.summaries.len() > MAX_REGION_SUMMARIES {
            return Err(RemoteError::TooMany {
                what: "summaries",
                count: self.summaries.len(),
                limit: MAX_REGION_SUMMARIES,
            });
        }
        if let Some(pair) = self
            .summaries
            .windows(2)
            .find(|pair| pair[0].service >= pair[1].service)
        {
            return Err(RemoteError::Unsorted {
                service: pair[1].service.clone(),
            });
        }
        Ok(())
    }

    /// The summary of one service, if the region has it.
    pub fn summary(&self, service: &ServiceKey) -> Option<&ServiceSummary> {
        self.summaries
            .binary_search_by(|s| s.service.cmp(service))
            .ok()
            .map(|i| &self.summaries[i])
    }
}

/// A region's view as an arbiter holds it, with its age.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldView {
    /// The view.
    pub view: RegionView,
    /// When the bridge last heard the region confirm it, in this arbiter's
    /// clock (ms since the Unix epoch).
    pub heard_at_ms: u64,
    /// The bridge's freshness limit (`summary_max_age_ms`): an older view
    /// counts as unknown and is never a failover target.
    pub max_age_ms: u64,
}

impl HeldView {
    /// How long ago the view was last confirmed, at `now_ms`.
    pub fn age_ms(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.heard_at_ms)
    }

    /// Whether the view is within its freshness limit at `now_ms`.
    pub fn fresh(&self, now_ms: u64) -> bool {
        self.age_ms(now_ms) <= self.max_age_ms
    }
}

/// The views of every other region this arbiter was told about, in region
/// order. Sans-IO: times come in as arguments.
#[derive(Clone, Debug)]
pub struct RemoteViews {
    here: Label,
    views: BTreeMap<Label, HeldView>,
    generation: u64,
}

impl RemoteViews {
    /// No views yet, in an arbiter of region `here`.
    pub fn new(here: Label) -> RemoteViews {
        RemoteViews {
            here,
            views: BTreeMap::new(),
            generation: 0,
        }
    }

    /// Replaces the view of `view.region`. `heard_ms_ago`: how long before
    /// `now_ms` the bridge last heard that region confirm it. A refused
    /// view changes nothing.
    pub fn put(
        &mut self,
        view: RegionView,
        heard_ms_ago: u64,
        max_age_ms: u64,
        now_ms: u64,
    ) -> Result<(), RemoteError> {
        if view.region == self.here {
            return Err(RemoteError::OwnRegion {
                region: view.region,
            });
        }
        view.validate()?;
        self.generation += 1;
        self.views.insert(
            view.region.clone(),
            HeldView {
                view,
                heard_at_ms: now_ms.saturating_sub(heard_ms_ago),
                max_age_ms,
            },
        );
        Ok(())
    }

    /// The region confirmed that its view at `version` is still current
    /// (as of `as_of_ms` by its bridge's clock). Returns false, changing
    /// nothing, when the view held is not at `version` (or none is held):
    /// the bridge then sends the whole view.
    pub fn confirm(
        &mut self,
        region: &Label,
        version: Revision,
        as_of_ms: u64,
        heard_ms_ago: u64,
        now_ms: u64,
    ) -> bool {
        match self.views.get_mut(region) {
            Some(held) if held.view.version == version => {
                held.view.as_of_ms = as_of_ms;
                held.heard_at_ms = now_ms.saturating_sub(heard_ms_ago);
                true
            }
            _ => false,
        }
    }

    /// Counts the views put so far: it changes whenever any view's content
    /// may have (a confirmation only refreshes ages and leaves it).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The view of one region.
    pub fn get(&self, region: &Label) -> Option<&HeldView> {
        self.views.get(region)
    }

    /// Every view held, in region order.
    pub fn iter(&self) -> impl Iterator<Item = &HeldView> {
        self.views.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn label(s: &str) -> Label {
        Label::new(s).unwrap()
    }

    fn summary(service: &str, ready: u32) -> ServiceSummary {
        ServiceSummary {
            service: service.parse().unwrap(),
            revision: Revision(7),
            ready,
            weight: u64::from(ready) * 100,
            taken_at_ms: 1_000,
        }
    }

    fn view(region: &str, version: u64) -> RegionView {
        RegionView {
            region: label(region),
            version: Revision(version),
            as_of_ms: 1_000,
            ingress: vec![Ingress::new("edge.r1.example:443").unwrap()],
            summaries: vec![summary("shop/cart/http", 2), summary("shop/web/http", 3)],
        }
    }

    #[test]
    fn ingress_is_host_port_and_decoding_checks_it() {
        for good in ["edge:443", "10.0.0.1:8443", "[::1]:443"] {
            assert!(Ingress::new(good).is_ok(), "{good}");
        }
        for bad in ["edge", ":443", "edge:0", "edge:70000", "ed ge:443", ""] {
            assert!(Ingress::new(bad).is_err(), "{bad:?} accepted");
        }
        let bytes = postcard::to_allocvec(&"no-port").unwrap();
        assert!(postcard::from_bytes::<Ingress>(&bytes).is_err());
    }

    #[test]
    fn views_must_be_sorted_and_bounded() {
        let mut v = view("r1", 3);
        assert!(v.validate().is_ok());
        assert_eq!(
            v.summary(&"shop/web/http".parse().unwrap())
                .map(|s| s.ready),
            Some(3)
        );
        v.summaries.push(summary("shop/cart/http", 1));
        assert!(matches!(v.validate(), Err(RemoteError::Unsorted { .. })));
        let mut v = view("r1", 3);
        v.ingress = vec![Ingress::new("e:1").unwrap(); MAX_INGRESS + 1];
        assert!(matches!(v.validate(), Err(RemoteError::TooMany { .. })));
    }

    #[test]
    fn ages_count_from_the_last_confirmation_in_local_time() {
        let mut views = RemoteViews::new(label("r2"));
        views.put(view("r1", 3), 200, 30_000, 10_000).unwrap();
        let held = views.get(&label("r1")).unwrap();
        assert_eq!(held.age_ms(10_000), 200);
        assert!(held.fresh(39_800));
        assert!(!held.fresh(39_801));

        // A confirmation of the version held refreshes it; of another
        // version it changes nothing.
        assert!(views.confirm(&label("r1"), Revision(3), 2_000, 0, 50_000));
        assert_eq!(views.get(&label("r1")).unwrap().age_ms(50_000), 0);
        assert_eq!(views.get(&label("r1")).unwrap().view.as_of_ms, 2_000);
        assert!(!views.confirm(&label("r1"), Revision(4), 3_000, 0, 60_000));
        assert!(!views.confirm(&label("r3"), Revision(3), 3_000, 0, 60_000));
        assert_eq!(views.get(&label("r1")).unwrap().heard_at_ms, 50_000);
    }

    #[test]
    fn an_arbiter_holds_no_view_of_its_own_region() {
        let mut views = RemoteViews::new(label("r1"));
        assert!(matches!(
            views.put(view("r1", 3), 0, 1, 1),
            Err(RemoteError::OwnRegion { .. })
        ));
        let mut unsorted = view("r3", 1);
        unsorted.summaries.reverse();
        assert!(views.put(unsorted, 0, 1, 1).is_err());
        assert_eq!(views.iter().count(), 0);
    }
}
