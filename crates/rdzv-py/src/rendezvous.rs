//! `rdzv.Rendezvous`: one worker's handle on a run, and the thread that hands its events to a
//! Python callback.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use rdzv::RoundBroken;

use crate::convert::duration_of;
use crate::errors::{RendezvousError, rendezvous_err};
use crate::round::Round;
use crate::runtime::{block, same_process};

/// One worker's handle on a run.
#[pyclass(module = "rdzv._rdzv", frozen)]
pub(crate) struct Rendezvous {
    pub(crate) inner: rdzv::Rendezvous,
    pub(crate) pid: u32,
}

impl Rendezvous {
    fn handle(&self) -> PyResult<rdzv::Rendezvous> {
        same_process(self.pid, "Rendezvous")?;
        Ok(self.inner.clone())
    }
}

#[pymethods]
impl Rendezvous {
    /// Blocks until a round completes with this worker in it.
    fn next_rendezvous(&self, py: Python<'_>) -> PyResult<Round> {
        let handle = self.handle()?;
        let round = block(py, async move { handle.next_rendezvous().await })?.map_err(rendezvous_err)?;
        Round::new(py, round)
    }

    /// Whether the run is closed.
    fn is_closed(&self, py: Python<'_>) -> PyResult<bool> {
        let handle = self.handle()?;
        block(py, async move { handle.is_closed().await })?.map_err(rendezvous_err)
    }

    /// Closes the run for every worker; `outcome` (`"succeeded"` or `"failed"`) says how the
    /// job ended, which the workers still waiting learn with their `RendezvousClosedError`. A
    /// closed run keeps its outcome, except that `"failed"` replaces `"succeeded"`.
    #[pyo3(signature = (outcome=None))]
    fn set_closed(&self, py: Python<'_>, outcome: Option<&str>) -> PyResult<()> {
        let handle = self.handle()?;
        let outcome = match outcome {
            None => None,
            Some("succeeded") => Some(rdzv::RunOutcome::Succeeded),
            Some("failed") => Some(rdzv::RunOutcome::Failed),
            Some(other) => {
                return Err(PyValueError::new_err(format!(
                    "outcome must be \"succeeded\", \"failed\" or None, not {other:?}"
                )));
            }
        };
        block(py, async move {
            match outcome {
                Some(outcome) => handle.set_closed_with(outcome).await,
                None => handle.set_closed().await,
            }
        })?
        .map_err(rendezvous_err)
    }

    /// How the job ended, as the run's close says: `"succeeded"`, `"failed"`, or `None` while
    /// the run is open (or was closed without saying).
    fn run_outcome(&self, py: Python<'_>) -> PyResult<Option<&'static str>> {
        let handle = self.handle()?;
        let outcome = block(py, async move { handle.run_outcome().await })?.map_err(rendezvous_err)?;
        Ok(outcome.map(rdzv::RunOutcome::as_str))
    }

    /// How many waiting workers the next round could admit while the current one runs (0 for
    /// a full, intact round: the workers beyond `max_workers` are spares).
    fn num_nodes_waiting(&self, py: Python<'_>) -> PyResult<usize> {
        let handle = self.handle()?;
        block(py, async move { handle.num_nodes_waiting().await })?.map_err(rendezvous_err)
    }

    /// Leaves the run (does not close it).
    fn shutdown(&self, py: Python<'_>) -> PyResult<()> {
        let handle = self.handle()?;
        block(py, async move { handle.shutdown().await })?.map_err(rendezvous_err)
    }

    /// Calls `callback(event)` with each event of this worker from now on, on a thread of its
    /// own, one at a time and in order; `event` is a dict: `time`, `run_id`, `node`, `event`
    /// and the event's fields (docs/OBSERVABILITY.md). A callback that raises is logged (the
    /// `rdzv` logger), and called again for the next event.
    fn on_event(&self, callback: &Bound<'_, PyAny>) -> PyResult<()> {
        let handle = self.handle()?;
        if !callback.is_callable() {
            return Err(PyTypeError::new_err("on_event needs a callable"));
        }
        let callback = callback.clone().unbind();
        let (lines, received) = std::sync::mpsc::channel::<String>();
        std::thread::Builder::new()
            .name("rdzv-events".into())
            .spawn(move || call_back(callback, received))
            .map_err(|e| RendezvousError::new_err(format!("cannot start the event callback's thread: {e}")))?;
        handle.on_event(move |event| {
            let _ = lines.send(event.json_line());
        });
        Ok(())
    }

    /// Waits until this worker's round is over and returns why, or `None` after `timeout`.
    #[pyo3(signature = (timeout=None))]
    fn round_broken(
        &self,
        py: Python<'_>,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<&'static str>> {
        let handle = self.handle()?;
        let timeout = duration_of(timeout, "timeout")?;
        let reason = block(py, async move {
            match timeout {
                Some(t) => tokio::time::timeout(t, handle.round_broken()).await.ok(),
                None => Some(handle.round_broken().await),
            }
        })?;
        Ok(reason.map(|r| match r {
            RoundBroken::MemberGone { .. } => "member_gone",
            RoundBroken::Ended => "ended",
            RoundBroken::Closed => "closed",
            RoundBroken::LeaseLost => "lease_lost",
            RoundBroken::Left => "left",
            RoundBroken::NoRound => "no_round",
            RoundBroken::Unhealthy { .. } => "unhealthy",
        }))
    }

    /// The run id.
    #[getter]
    fn run_id(&self) -> String {
        self.inner.run_id().to_string()
    }

    /// This worker's node id.
    #[getter]
    fn node_id(&self) -> String {
        self.inner.participant().node.clone()
    }

    /// The address this worker advertises.
    #[getter]
    fn local_addr(&self) -> String {
        self.inner.participant().addr.clone()
    }

    /// The backend's name.
    #[getter]
    fn backend(&self) -> &'static str {
        self.inner.backend_name()
    }

    /// The deadline of one `next_rendezvous`, in seconds.
    #[getter]
    fn timeout(&self) -> f64 {
        self.inner.params().timeout.as_secs_f64()
    }

    /// The keep-alive TTL, in seconds.
    #[getter]
    fn keep_alive_ttl(&self) -> f64 {
        self.inner.params().keep_alive_ttl.as_secs_f64()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _ty: Option<&Bound<'_, PyAny>>,
        _value: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        self.shutdown(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!(
            "Rendezvous(run_id={:?}, node_id={:?}, backend={:?})",
            self.inner.run_id(),
            self.inner.participant().node,
            self.inner.backend_name()
        )
    }
}

/// Hands each event (a JSON line) to `callback` as a dict, with the GIL, until the handler is
/// gone or the interpreter shuts down.
fn call_back(callback: Py<PyAny>, events: std::sync::mpsc::Receiver<String>) {
    for line in events {
        let called = Python::try_attach(|py| {
            let event = py.import("json").and_then(|json| json.call_method1("loads", (&line,)));
            let result = event.and_then(|event| callback.call1(py, (event,)).map(drop));
            if let Err(e) = result {
                log_callback_error(py, &callback, e);
            }
        });
        if called.is_none() {
            return;
        }
    }
}

/// Logs an exception a callback raised on the `rdzv` logger (with its traceback), or prints
/// it if logging fails too.
fn log_callback_error(py: Python<'_>, callback: &Py<PyAny>, error: PyErr) {
    let logged = py.import("logging").and_then(|logging| {
        let logger = logging.call_method1("getLogger", ("rdzv",))?;
        let kwargs = pyo3::types::PyDict::new(py);
        kwargs.set_item("exc_info", error.value(py))?;
        logger.call_method(
            "error",
            ("rdzv: the event callback %r raised; it is called again for the next event", callback),
            Some(&kwargs),
        )?;
        Ok(())
    });
    if logged.is_err() {
        error.print(py);
    }
}
