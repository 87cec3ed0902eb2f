//! The wire types of the agent's local HTTP API (JSON): request bodies, their
//! validation into typed values, responses and the error body.
//!
//! These names and shapes are a public contract with every workload and tool
//! on the host: change them only additively. Requests deny unknown fields so
//! a typo is an error, not a silently ignored setting, and every validation
//! error names the field (`checks.readiness.timeout_ms = 6000 must be below
//! interval_ms = 5000`). This module only describes and validates; it must
//! not hold agent state, call the arbiter or read clocks.

//!
//! One file per part: `error` (the error body and parsing a request body),
//! `registration` (the registration body and its validation), `checks`
//! (the checks of a registration and theirs), `responses` (every answer)
//! and `key_text` (a serde helper of the responses).

mod checks;
mod error;
mod key_text;
mod registration;
mod responses;

pub use checks::{
    Check, CheckKind, CheckRequest, ChecksRequest, ValidChecks, MAX_CHECK_PATH_LEN,
    MAX_CHECK_TTL_MS,
};
pub use error::{parse_json, ApiError};
pub use registration::{RegisterRequest, ValidRegistration, DEFAULT_NAME};
pub use responses::{
    ArbiterStatus, DrainResponse, EndpointJson, EndpointsResponse, FailoverJson, GossipStatus,
    InstancesResponse, LeaseStatus, LocalInstanceJson, Propagated, RegionsPolicy, RegionsResponse,
    RegisterResponse, ServiceJson, ServicesResponse, StatusResponse, SubscriptionStatus,
    WriterJson,
};
