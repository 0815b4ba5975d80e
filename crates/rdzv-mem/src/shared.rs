//! [`Shared`]: the locked state that the store, its lease reaper and its watch streams all
//! reach (the last two through a `Weak`, so that they never keep a dropped store alive).

use std::sync::{Mutex, MutexGuard};

use crate::state::State;

/// The state of one store behind its lock.
#[derive(Debug)]
pub(crate) struct Shared {
    state: Mutex<State>,
}

impl Shared {
    /// Wraps a fresh state.
    pub(crate) fn new(state: State) -> Shared {
        Shared { state: Mutex::new(state) }
    }

    /// Locks the state. A panic while holding the lock cannot leave the state torn (every
    /// mutation completes before anything can panic), so a poisoned lock is taken over.
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
