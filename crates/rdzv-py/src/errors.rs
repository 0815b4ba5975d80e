//! The Python exceptions of rdzv, and the mapping of rdzv's Rust errors to them (the kinds
//! mirror each other: `RendezvousError::Closed` is `RendezvousClosedError`, …).

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

use rdzv::{RendezvousError as RustRendezvousError, StoreError as RustStoreError};

create_exception!(_rdzv, Error, PyException, "Base of every rdzv error.");
create_exception!(_rdzv, RendezvousError, Error, "A rendezvous failed (base of the rendezvous errors).");
create_exception!(_rdzv, RendezvousClosedError, RendezvousError, "The run was closed; no round will form.");
create_exception!(
    _rdzv,
    RendezvousTimeoutError,
    RendezvousError,
    "The call did not complete by its deadline."
);
create_exception!(
    _rdzv,
    RendezvousUnavailableError,
    RendezvousError,
    "The backend could not be reached (retryable)."
);
create_exception!(_rdzv, RendezvousConfigError, RendezvousError, "A bad URL or option.");
create_exception!(_rdzv, RendezvousStateError, RendezvousError, "A value under the run's keys is corrupt.");
create_exception!(
    _rdzv,
    RendezvousLeaseLostError,
    RendezvousError,
    "This worker's session lease was lost; it must rejoin."
);
create_exception!(_rdzv, RendezvousShutdownError, RendezvousError, "The handle was shut down.");
create_exception!(_rdzv, StoreError, Error, "A Store operation failed (base of the Store errors).");
create_exception!(
    _rdzv,
    StoreTimeoutError,
    StoreError,
    "A Store operation did not complete within its timeout."
);
create_exception!(_rdzv, StoreQueueEmptyError, StoreError, "A non-blocking queue_pop found the queue empty.");
create_exception!(
    _rdzv,
    StoreUnavailableError,
    StoreError,
    "The Store's backend could not be reached (retryable)."
);

pub(crate) fn rendezvous_err(e: RustRendezvousError) -> PyErr {
    let message = e.to_string();
    match e {
        RustRendezvousError::Closed { outcome, .. } => {
            let err = RendezvousClosedError::new_err(message);
            // How the job ended, if the closer said so: `"succeeded"`, `"failed"` or `None`.
            let outcome = outcome.map(rdzv::RunOutcome::as_str);
            Python::attach(|py| match err.value(py).setattr("outcome", outcome) {
                Ok(()) => err,
                Err(e) => e,
            })
        }
        RustRendezvousError::Timeout { .. } => RendezvousTimeoutError::new_err(message),
        RustRendezvousError::Unavailable(_) => RendezvousUnavailableError::new_err(message),
        RustRendezvousError::Config(_) => RendezvousConfigError::new_err(message),
        RustRendezvousError::State { .. } => RendezvousStateError::new_err(message),
        RustRendezvousError::LeaseLost => RendezvousLeaseLostError::new_err(message),
        RustRendezvousError::Shutdown => RendezvousShutdownError::new_err(message),
        _ => RendezvousError::new_err(message),
    }
}

pub(crate) fn store_err(e: RustStoreError) -> PyErr {
    let message = e.to_string();
    match e {
        RustStoreError::Timeout { .. } => StoreTimeoutError::new_err(message),
        RustStoreError::QueueEmpty { .. } => StoreQueueEmptyError::new_err(message),
        e if e.is_retryable() => StoreUnavailableError::new_err(message),
        _ => StoreError::new_err(message),
    }
}
