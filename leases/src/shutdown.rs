//! One shutdown signal for every task and actor of a process (an agent,
//! an arbiter, a bridge; mini-redis's `shutdown`): the listeners stop accepting, open work
//! finishes within its bound, files are flushed and the session is closed
//! with a reason. Nothing is aborted half-way.

use tokio::sync::watch;

/// Fires the signal.
#[derive(Debug)]
pub struct Trigger {
    tx: watch::Sender<bool>,
}

/// Observes the signal. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Shutdown {
    rx: watch::Receiver<bool>,
}

/// A new signal, not fired.
pub fn channel() -> (Trigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (Trigger { tx }, Shutdown { rx })
}

impl Trigger {
    /// Tells every observer to stop.
    pub fn fire(&self) {
        self.tx.send_replace(true);
    }
}

impl Shutdown {
    /// Returns once the signal has fired (at once if it already has, or if
    /// its trigger is gone).
    pub async fn fired(&mut self) {
        let _ = self.rx.wait_for(|fired| *fired).await;
    }

    /// Whether the signal has fired.
    pub fn is_fired(&self) -> bool {
        *self.rx.borrow()
    }
}
