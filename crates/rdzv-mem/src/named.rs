//! Named shared instances, for `mem://<name>/…` URLs: every caller in the process that asks
//! for the same name gets the same store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rdzv_core::per_process::PerProcess;

use crate::MemKv;

/// This process's named stores. A forked child starts with none: the copies of its parent's
/// would expire no lease and wake no watcher (their tasks ran on the parent's threads).
fn registry() -> &'static Mutex<HashMap<String, Arc<MemKv>>> {
    static REGISTRY: PerProcess<Mutex<HashMap<String, Arc<MemKv>>>> = PerProcess::new(Default::default);
    REGISTRY.get()
}

impl MemKv {
    /// The process-wide store called `name`, created empty on first use.
    ///
    /// Lifetime: the registry keeps every named store alive until the process exits or
    /// [`MemKv::forget`] removes it, so workers that connect one after another (each with its
    /// own `mem://name/…` URL) share one store even if none holds it in between.
    pub fn named(name: &str) -> Arc<MemKv> {
        let mut map = registry().lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.entry(name.to_owned()).or_insert_with(|| Arc::new(MemKv::new())).clone()
    }

    /// Removes the store called `name` from the registry (holders keep their `Arc`; the next
    /// [`MemKv::named`] creates a fresh, empty store). Returns whether it existed.
    pub fn forget(name: &str) -> bool {
        registry().lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(name).is_some()
    }
}
