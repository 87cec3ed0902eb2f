//! The runtime an agent runs in: an actix System (the agent's actors need
//! one) over one multi-thread tokio runtime, which quinn, hickory, axum and
//! the data plane's tasks share.

use std::future::Future;

/// A new actix System over a multi-thread tokio runtime with
/// `worker_threads` workers (tokio's default, one per core, when `None`).
/// Panics if the runtime cannot be built (the OS refused a thread), which
/// only happens at a process's start.
pub fn system(worker_threads: Option<usize>) -> actix::SystemRunner {
    actix::System::with_tokio_rt(move || {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.enable_all();
        if let Some(n) = worker_threads {
            builder.worker_threads(n);
        }
        builder.build().expect("building the tokio runtime")
    })
}

/// Runs `f` to completion in a new `system(worker_threads)`.
pub fn block_on<F: Future>(worker_threads: Option<usize>, f: F) -> F::Output {
    system(worker_threads).block_on(f)
}
