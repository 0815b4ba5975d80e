//! Python bindings of rdzv: the native module `rdzv._rdzv` behind the `rdzv` Python package
//! (see `python/rdzv/__init__.py` and the stubs in `python/rdzv/_rdzv.pyi`).
//!
//! Every blocking call runs its future on one tokio runtime per process (created lazily, and
//! again in a forked child), with the GIL released, in slices of 100 ms between which it
//! checks for Python signals, so Ctrl-C interrupts it with `KeyboardInterrupt` (the future is
//! dropped, which cancels it: a cancelled `next_rendezvous` withdraws what it wrote).
//!
//! Event callbacks (`Rendezvous.on_event`) run on a thread of their own per callback, which
//! takes the GIL for each event: rdzv's runtime threads only queue the event, so a slow
//! callback or a held GIL never delays a lease refresh, and a blocking call (which releases
//! the GIL) never waits for a callback.
//!
//! The files: `runtime.rs` (the runtime and the blocking call), `errors.rs` (the exceptions,
//! and Rust's errors as them), `convert.rs` (Python values as Rust ones), `rendezvous.rs`,
//! `round.rs` and `store.rs` (the classes); here, the module and its two functions.

mod convert;
mod errors;
mod rendezvous;
mod round;
mod runtime;
mod store;

use pyo3::prelude::*;

use errors::{
    Error, RendezvousClosedError, RendezvousConfigError, RendezvousError, RendezvousLeaseLostError,
    RendezvousShutdownError, RendezvousStateError, RendezvousTimeoutError, RendezvousUnavailableError,
    StoreError, StoreQueueEmptyError, StoreTimeoutError, StoreUnavailableError, rendezvous_err,
};
use rendezvous::Rendezvous;
use round::{Participant, Round};
use runtime::block;
use store::Store;

/// Joins the run named by `url` as one worker (see the README for URLs and options).
#[pyfunction]
fn connect(py: Python<'_>, url: String) -> PyResult<Rendezvous> {
    let inner = block(py, rdzv::connect(&url))?.map_err(rendezvous_err)?;
    Ok(Rendezvous { inner, pid: std::process::id() })
}

/// A Store on its own, without a rendezvous, under the run named by `url`.
#[pyfunction]
fn open_store(py: Python<'_>, url: String) -> PyResult<Store> {
    let store = block(py, rdzv::open_store(&url))?.map_err(rendezvous_err)?;
    Ok(Store::new(store))
}

/// The native module `rdzv._rdzv`.
#[pymodule]
fn _rdzv(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_function(wrap_pyfunction!(connect, m)?)?;
    m.add_function(wrap_pyfunction!(open_store, m)?)?;
    m.add_class::<Rendezvous>()?;
    m.add_class::<Round>()?;
    m.add_class::<Participant>()?;
    m.add_class::<Store>()?;
    m.add("Error", py.get_type::<Error>())?;
    m.add("RendezvousError", py.get_type::<RendezvousError>())?;
    m.add("RendezvousClosedError", py.get_type::<RendezvousClosedError>())?;
    m.add("RendezvousTimeoutError", py.get_type::<RendezvousTimeoutError>())?;
    m.add("RendezvousUnavailableError", py.get_type::<RendezvousUnavailableError>())?;
    m.add("RendezvousConfigError", py.get_type::<RendezvousConfigError>())?;
    m.add("RendezvousStateError", py.get_type::<RendezvousStateError>())?;
    m.add("RendezvousLeaseLostError", py.get_type::<RendezvousLeaseLostError>())?;
    m.add("RendezvousShutdownError", py.get_type::<RendezvousShutdownError>())?;
    m.add("StoreError", py.get_type::<StoreError>())?;
    m.add("StoreTimeoutError", py.get_type::<StoreTimeoutError>())?;
    m.add("StoreQueueEmptyError", py.get_type::<StoreQueueEmptyError>())?;
    m.add("StoreUnavailableError", py.get_type::<StoreUnavailableError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
