//! The lease reaper: a task that sleeps until the next lease deadline and expires what is
//! due, so that leases end (with delete events) even when nobody calls the store.
//!
//! With no lease pending it waits on a [`Notify`] rather than a timer, so it never makes a
//! paused tokio clock auto-advance on its own account. It holds only a `Weak` to the store
//! and ends when the store is dropped (or when its runtime shuts down; the next lease call
//! then starts a new one).

use std::sync::Weak;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::shared::Shared;

/// How the store talks to its reaper.
#[derive(Debug, Default)]
pub(crate) struct ReaperSignal {
    /// A reaper task is alive.
    pub(crate) running: AtomicBool,
    /// The store was dropped.
    pub(crate) closed: AtomicBool,
    /// Wakes the reaper to re-read the deadlines (or notice `closed`).
    pub(crate) notify: Notify,
}

/// Clears `running` when the task ends for any reason, including its runtime dropping it.
struct Running(std::sync::Arc<ReaperSignal>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.store(false, Ordering::SeqCst);
    }
}

pub(crate) fn spawn(shared: Weak<Shared>, signal: std::sync::Arc<ReaperSignal>) {
    let running = Running(signal);
    tokio::spawn(async move {
        let signal = running.0.clone();
        loop {
            if signal.closed.load(Ordering::SeqCst) {
                return;
            }
            let next = {
                let Some(shared) = shared.upgrade() else {
                    return;
                };
                let mut state = shared.lock();
                state.expire_leases(Instant::now())
            };
            match next {
                Some(deadline) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(deadline) => {}
                        _ = signal.notify.notified() => {}
                    }
                }
                None => signal.notify.notified().await,
            }
        }
    });
}
