//! The agent's files as an actor: the catalog cache, the registrations
//! file and the regions file. Each write runs off the actors' thread (an
//! fsync may take a while), one at a time and in order, so an older write
//! never lands after a newer; a registrations save is answered to the
//! state machine (`Input::Saved`), which answers its caller only then.

use actix::prelude::*;
use rollcall_leases::ServiceKey;

use crate::agent_state::Input;
use crate::cache::ServiceCache;
use crate::registrations::RegistrationsFile;

/// Write views to the cache, delete cache files.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StoreViews {
    /// Views to write, each with the catalog it came from.
    pub views: Vec<(
        std::sync::Arc<rollcall_leases::ServiceView>,
        Option<rollcall_leases::CatalogId>,
    )>,
    /// Services whose files go.
    pub forget: Vec<ServiceKey>,
}

/// Write the registrations file.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SaveRegistrations {
    /// The save.
    pub save: u64,
    /// The file's contents.
    pub bytes: Vec<u8>,
}

/// Keep the regions message.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SaveRegions {
    /// The message.
    pub update: rollcall_leases::RegionsUpdate,
    /// When it arrived, ms.
    pub received_at_ms: u64,
}

/// Answered once every write asked for before it is done.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Barrier;

/// Owns the data directory's files. Each write runs off the actors'
/// thread (an fsync may take a while), one at a time and in order: an
/// older write never lands after a newer.
pub struct StoreActor {
    cache: ServiceCache,
    registrations: RegistrationsFile,
    agent: Recipient<Input>,
}

impl StoreActor {
    /// The files of one data directory; saves are answered to `agent`.
    pub fn new(
        cache: ServiceCache,
        registrations: RegistrationsFile,
        agent: Recipient<Input>,
    ) -> Self {
        StoreActor {
            cache,
            registrations,
            agent,
        }
    }
}

impl Actor for StoreActor {
    type Context = Context<Self>;
}

impl StoreActor {
    /// Runs `write` off the actors' thread, holding the mailbox until it
    /// is done.
    fn write<T: Send + 'static>(
        &mut self,
        ctx: &mut Context<Self>,
        write: impl FnOnce() -> T + Send + 'static,
        then: impl FnOnce(T, &mut Self) + 'static,
    ) {
        let done = tokio::task::spawn_blocking(write);
        ctx.wait(done.into_actor(self).map(|result, act, _| match result {
            Ok(value) => then(value, act),
            Err(e) => tracing::error!(error = %e, "a file write panicked"),
        }));
    }
}

impl Handler<StoreViews> for StoreActor {
    type Result = ();

    fn handle(&mut self, StoreViews { views, forget }: StoreViews, ctx: &mut Context<Self>) {
        let cache = self.cache.clone();
        self.write(
            ctx,
            move || {
                for (view, catalog) in &views {
                    if let Err(e) = cache.store(view, *catalog) {
                        tracing::warn!(service = %view.service(), error = %e, "cache write failed");
                    }
                }
                for service in &forget {
                    if let Err(e) = cache.remove(service) {
                        tracing::warn!(service = %service, error = %e, "cache removal failed");
                    }
                }
            },
            |_, _| {},
        );
    }
}

impl Handler<SaveRegistrations> for StoreActor {
    type Result = ();

    fn handle(
        &mut self,
        SaveRegistrations { save, bytes }: SaveRegistrations,
        ctx: &mut Context<Self>,
    ) {
        let file = self.registrations.clone();
        self.write(
            ctx,
            move || file.write(&bytes).map_err(|e| e.to_string()),
            move |result, act| {
                act.agent.do_send(Input::Saved { save, result });
            },
        );
    }
}

impl Handler<SaveRegions> for StoreActor {
    type Result = ();

    fn handle(&mut self, message: SaveRegions, ctx: &mut Context<Self>) {
        let cache = self.cache.clone();
        self.write(
            ctx,
            move || {
                if let Err(e) = cache.store_regions(&message.update, message.received_at_ms) {
                    tracing::warn!(error = %e, "saving the regions message failed; a restart waits for the arbiter's");
                }
            },
            |_, _| {},
        );
    }
}

impl Handler<Barrier> for StoreActor {
    type Result = ();

    fn handle(&mut self, _: Barrier, _: &mut Context<Self>) {}
}
