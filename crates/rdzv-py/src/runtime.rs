//! The process's tokio runtime, and how a blocking call runs on it: with the GIL released, in
//! slices between which Python's signals are checked, so Ctrl-C interrupts it.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use pyo3::prelude::*;

use crate::errors::RendezvousError;

/// How long a blocking call waits with the GIL released before it checks for signals.
const SLICE: Duration = Duration::from_millis(100);

/// The process's runtime and the process it was made in. A forked child has the parent's
/// memory but none of its threads, so it gets a runtime of its own; the parent's is leaked
/// there, because dropping it would wait for worker threads that do not exist.
static RUNTIME: Mutex<Option<(u32, &'static tokio::runtime::Runtime)>> = Mutex::new(None);

fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    let mut slot = RUNTIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let pid = std::process::id();
    if let Some((owner, rt)) = *slot
        && owner == pid
    {
        return Ok(rt);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("rdzv")
        .enable_all()
        .build()
        .map_err(|e| RendezvousError::new_err(format!("could not start rdzv's tokio runtime: {e}")))?;
    let rt: &'static tokio::runtime::Runtime = Box::leak(Box::new(rt));
    *slot = Some((pid, rt));
    Ok(rt)
}

/// Runs `fut` to completion with the GIL released, checking for signals every [`SLICE`]
/// (a pending `KeyboardInterrupt` drops, so cancels, the future and is raised).
pub(crate) fn block<F>(py: Python<'_>, fut: F) -> PyResult<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    let rt = runtime()?;
    let mut fut = Box::pin(fut);
    loop {
        let step = py.detach(|| rt.block_on(async { tokio::time::timeout(SLICE, fut.as_mut()).await.ok() }));
        if let Some(out) = step {
            return Ok(out);
        }
        if let Err(interrupted) = py.check_signals() {
            // Dropped inside the runtime: what the cancelled call wrote (a join, waiting or
            // `setup` key) is withdrawn by a task it spawns as it drops, which needs a runtime
            // to spawn on. Dropped outside, it stayed for as long as the session lived.
            let _entered = rt.enter();
            drop(fut);
            return Err(interrupted);
        }
    }
}

/// Refuses a handle used in another process than the one that made it: after `fork`, the
/// parent's connections belong to a runtime whose threads the child does not have.
pub(crate) fn same_process(created_in: u32, what: &str) -> PyResult<()> {
    if created_in == std::process::id() {
        Ok(())
    } else {
        Err(RendezvousError::new_err(format!(
            "this {what} was created in process {created_in}, before a fork; create a new one in this process \
             (rdzv.connect or rdzv.open_store)"
        )))
    }
}
