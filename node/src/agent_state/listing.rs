//! `GET /v1/services`: the region's services are the arbiter's to list
//! (its applied catalog, filtered by the watch rules); the agent asks on
//! its session and passes the answer on. Without an answer (no session,
//! the session ended, nothing within `agent.write_answer_ms`) the call is
//! answered `Reply::Services(None)` and the API lists the copies this
//! agent holds instead, saying so.

use rollcall_leases::protocol::{RejectKind, Request, Response};

use super::calls::{CallId, Refusal, RegionServices, Reply};
use super::writes::reply;
use super::{AgentState, Output, Purpose};

impl AgentState {
    /// Asks the arbiter for the region's services, or answers at once
    /// that it cannot be asked.
    pub(super) fn list_services(&mut self, call: CallId, out: &mut Vec<Output>) {
        if !self
            .link
            .request(Request::Services, Purpose::Services(call), out)
        {
            reply(out, call, Ok(Reply::Services(None)));
        }
    }
}

/// The arbiter's answer to a listing.
pub(super) fn answered(call: CallId, result: Result<Response, String>, out: &mut Vec<Output>) {
    let answer = match result {
        Ok(Response::Services {
            services,
            revision,
            truncated,
        }) => Ok(Reply::Services(Some(RegionServices {
            services,
            revision,
            truncated,
        }))),
        Ok(Response::Rejected { kind, message }) if kind != RejectKind::Unavailable => {
            Err(Refusal::by_arbiter(kind, message))
        }
        // The replica has no catalog to list yet: as if not asked.
        Ok(Response::Rejected { .. }) | Err(_) => Ok(Reply::Services(None)),
        Ok(other) => {
            tracing::warn!(answer = ?other, "the arbiter answered a service listing with something else");
            Ok(Reply::Services(None))
        }
    };
    reply(out, call, answer);
}
