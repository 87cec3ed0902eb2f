//! A service key as its `namespace/service/port_name` text: the serde
//! `with` module of the responses' `service` fields.

use rollcall_leases::ServiceKey;
use serde::{Deserialize, Deserializer, Serializer};

pub fn serialize<S: Serializer>(key: &ServiceKey, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(key)
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<ServiceKey, D::Error> {
    let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
    text.parse().map_err(serde::de::Error::custom)
}
