//! [`PerProcess`]: process-wide state of which a forked child gets a fresh copy.

use std::sync::OnceLock;

/// A value each process has its own of, for `static`s: a process forked from one that used
/// it gets a fresh value on first use instead of its parent's.
///
/// A forked child has its parent's memory but only the thread that forked. What the parent's
/// other threads were doing is frozen in that memory: a lock one of them held stays held
/// forever, and tasks meant for a runtime thread of the parent wait for a thread that does
/// not exist. Tables of process-wide state (clients, keep-alive drivers) and the runtimes
/// they use must therefore start anew in the child; `PerProcess` does that by remembering
/// which process made the value (its pid), and is itself free of locks a parent's thread
/// could hold at the fork (one-time initialisations only).
///
/// ```
/// use std::sync::Mutex;
/// use rdzv_core::per_process::PerProcess;
///
/// static NAMES: PerProcess<Mutex<Vec<String>>> = PerProcess::new(|| Mutex::new(Vec::new()));
/// NAMES.get().lock().unwrap().push("in this process".into());
/// assert_eq!(NAMES.get().lock().unwrap().len(), 1);
/// ```
pub struct PerProcess<T> {
    first: OnceLock<Generation<T>>,
    init: fn() -> T,
}

/// The value of one process, and the one of a child forked from it (in the child's memory).
struct Generation<T> {
    pid: u32,
    value: T,
    next: OnceLock<Box<Generation<T>>>,
}

impl<T> Generation<T> {
    fn new(init: fn() -> T) -> Generation<T> {
        Generation { pid: std::process::id(), value: init(), next: OnceLock::new() }
    }
}

impl<T> PerProcess<T> {
    /// A value made by `init` in each process, on its first [`get`](PerProcess::get) there.
    pub const fn new(init: fn() -> T) -> PerProcess<T> {
        PerProcess { first: OnceLock::new(), init }
    }

    /// This process's value. The values of the processes this one was forked from stay
    /// where they are, untouched (and leaked with them).
    pub fn get(&self) -> &T {
        let pid = std::process::id();
        let mut generation = self.first.get_or_init(|| Generation::new(self.init));
        // The chain holds one generation per fork, each appended by the process it is
        // for: the last is this process's unless this process has not used it yet.
        while let Some(next) = generation.next.get() {
            generation = next;
        }
        if generation.pid == pid {
            return &generation.value;
        }
        &generation.next.get_or_init(|| Box::new(Generation::new(self.init))).value
    }
}

impl<T> std::fmt::Debug for PerProcess<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerProcess").finish_non_exhaustive()
    }
}
