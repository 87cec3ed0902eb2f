//! Who may write which local instance, and which generation a call names:
//! the checks every local API call passes before it changes anything.
//! Operators (the node token) may write anything on this node; a workload
//! only what its `[[workloads]]` grants name, and only by naming the
//! instance's generation.

use rollcall_leases::{Generation, InstanceId, Revision, ServiceKey};

use super::calls::{Caller, Refusal, Refused};
use super::AgentState;

impl AgentState {
    /// Whether `caller` may write instances of `service`: operators may
    /// write anything on this node; a workload only the services its
    /// `[[workloads]]` grants name.
    pub(super) fn authorize(&self, caller: &Caller, service: &ServiceKey) -> Result<(), Refusal> {
        let Caller::Workload { uid, gid } = *caller else {
            return Ok(());
        };
        let allowed = self
            .settings
            .config
            .workloads
            .iter()
            .filter(|w| w.uid.is_none_or(|u| u == uid) && w.gid.is_none_or(|g| g == gid))
            .flat_map(|w| &w.services)
            .any(|p| {
                p.matches(
                    service.namespace.as_str(),
                    service.service.as_str(),
                    service.port_name.as_str(),
                )
            });
        if allowed {
            Ok(())
        } else {
            Err(Refusal::new(Refused::Forbidden, format!("uid {uid} gid {gid} may not write instances of {service} (agent [[workloads]] grants)")))
        }
    }

    /// The service an instance belongs to, from the local registrations or
    /// the views.
    pub(super) fn service_of(&self, id: &InstanceId) -> Option<ServiceKey> {
        if let Some(local) = self.writes.regs.get(id) {
            return Some(local.registration.service.clone());
        }
        self.following
            .sync
            .iter()
            .find(|(_, t)| {
                t.view
                    .as_ref()
                    .is_some_and(|v| v.records().any(|r| &r.instance_id == id))
            })
            .map(|(k, _)| k.clone())
    }

    /// Authorizes a call about an existing instance and resolves the
    /// generation it names. Workloads must name the generation; only the
    /// node token may omit it.
    pub(super) fn authorize_instance(
        &self,
        caller: &Caller,
        id: &InstanceId,
        given: Option<u64>,
    ) -> Result<Option<Generation>, Refusal> {
        let service = self.service_of(id).ok_or_else(|| {
            Refusal::new(
                Refused::NotFound,
                format!("instance {id} is not known to this agent"),
            )
        })?;
        self.authorize(caller, &service)?;
        if given.is_none() && matches!(caller, Caller::Workload { .. }) {
            return Err(Refusal::new(
                Refused::BadRequest,
                "generation: required for workload callers; only the node token may omit it",
            ));
        }
        self.generation_for(id, given)
    }

    /// Resolves the generation a call names against the local registration
    /// (refused when it is not the current one) or, for instances this
    /// agent did not register, against its views.
    pub(super) fn generation_for(
        &self,
        id: &InstanceId,
        given: Option<u64>,
    ) -> Result<Option<Generation>, Refusal> {
        let local = self.writes.regs.get(id);
        let current = match local {
            Some(local) => local.generation,
            None => self.record_of(id).map(|(generation, _)| generation),
        };
        let known = local.is_some() || current.is_some();
        match (given, current) {
            (Some(g), Some(c)) if c.get() != g => Err(Refusal::new(
                Refused::StaleGeneration,
                format!("instance {id} is at generation {c}, not {g}; nothing was changed"),
            )),
            (Some(g), _) => Ok(Some(Generation(g))),
            (None, c) if known => Ok(c),
            (None, _) => Err(Refusal::new(
                Refused::NotFound,
                format!("instance {id} is not registered through this agent; give its generation"),
            )),
        }
    }

    /// The generation and revision of the record of `id` in the views.
    pub(super) fn record_of(&self, id: &InstanceId) -> Option<(Generation, Revision)> {
        self.following.sync.iter().find_map(|(_, t)| {
            t.view
                .as_ref()?
                .records()
                .find(|r| &r.instance_id == id)
                .map(|r| (r.generation, r.revision))
        })
    }
}
