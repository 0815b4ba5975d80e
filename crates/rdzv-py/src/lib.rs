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

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

use rdzv::{RendezvousError as RustRendezvousError, RoundBroken, StoreError as RustStoreError};

/// How long a blocking call waits with the GIL released before it checks for signals.
const SLICE: Duration = Duration::from_millis(100);

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

fn rendezvous_err(e: RustRendezvousError) -> PyErr {
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

fn store_err(e: RustStoreError) -> PyErr {
    let message = e.to_string();
    match e {
        RustStoreError::Timeout { .. } => StoreTimeoutError::new_err(message),
        RustStoreError::QueueEmpty { .. } => StoreQueueEmptyError::new_err(message),
        e if e.is_retryable() => StoreUnavailableError::new_err(message),
        _ => StoreError::new_err(message),
    }
}

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
fn block<F>(py: Python<'_>, fut: F) -> PyResult<F::Output>
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
fn same_process(created_in: u32, what: &str) -> PyResult<()> {
    if created_in == std::process::id() {
        Ok(())
    } else {
        Err(RendezvousError::new_err(format!(
            "this {what} was created in process {created_in}, before a fork; create a new one in this process \
             (rdzv.connect or rdzv.open_store)"
        )))
    }
}

/// `bytes` or `str` (encoded as UTF-8) as bytes, as c10d stores accept both.
fn bytes_of(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u8>> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(s.to_cow()?.as_bytes().to_vec());
    }
    Err(PyTypeError::new_err(format!("{what} must be bytes or str, not {}", obj.get_type().name()?)))
}

fn keys_of(keys: &Bound<'_, PyAny>) -> PyResult<Vec<Vec<u8>>> {
    if keys.is_instance_of::<PyString>() || keys.is_instance_of::<PyBytes>() {
        return Err(PyTypeError::new_err("keys must be a list of bytes or str, not a single key"));
    }
    keys.try_iter()?.map(|k| bytes_of(&k?, "a key")).collect()
}

/// Seconds (a number) or a `datetime.timedelta`, as a duration; `None` stays `None`.
fn duration_of(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<Duration>> {
    let Some(obj) = obj else { return Ok(None) };
    if obj.is_none() {
        return Ok(None);
    }
    let seconds: f64 = if obj.hasattr("total_seconds")? {
        obj.call_method0("total_seconds")?.extract()?
    } else {
        obj.extract().map_err(|_| PyTypeError::new_err(format!("{what} must be seconds or a timedelta")))?
    };
    Duration::try_from_secs_f64(seconds).map(Some).map_err(|_| {
        PyValueError::new_err(format!("{what} must be a non-negative number of seconds, not {seconds}"))
    })
}

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

/// One worker's handle on a run.
#[pyclass(module = "rdzv._rdzv", frozen)]
struct Rendezvous {
    inner: rdzv::Rendezvous,
    pid: u32,
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

/// A member of a round.
#[pyclass(module = "rdzv._rdzv", frozen, get_all)]
#[derive(Clone)]
struct Participant {
    /// Node id.
    node: String,
    /// Advertised address.
    addr: String,
    /// Process id.
    pid: u32,
    /// A port that was free on its machine when it joined.
    port: Option<u16>,
}

#[pymethods]
impl Participant {
    fn __repr__(&self) -> String {
        let port = self.port.map_or_else(|| "None".to_string(), |p| p.to_string());
        format!("Participant(node={:?}, addr={:?}, pid={}, port={port})", self.node, self.addr, self.pid)
    }
}

/// This worker's place in a completed round.
#[pyclass(module = "rdzv._rdzv", frozen, get_all)]
struct Round {
    /// The run.
    run_id: String,
    /// The round's number.
    version: u64,
    /// This worker's rank.
    rank: usize,
    /// The number of members.
    world_size: usize,
    /// The members in rank order.
    participants: Vec<Participant>,
    /// Rank 0's address.
    master_addr: String,
    /// A port that was free on rank 0's machine.
    master_port: u16,
    /// The round compared with in `previous_rank`, `left` and `joined`: the last round this
    /// worker was a member of, or else the last running round it waited on (`None`: its
    /// first round).
    previous_version: Option<u64>,
    /// This worker's rank in that round (`None`: it was not a member of it).
    previous_rank: Option<usize>,
    /// Ranks of that round whose members are not in this one, ascending.
    left: Vec<usize>,
    /// Ranks of this round whose members were not in that one, ascending.
    joined: Vec<usize>,
    /// The round's Store.
    store: Py<Store>,
}

impl Round {
    fn new(py: Python<'_>, round: rdzv::Round) -> PyResult<Round> {
        Ok(Round {
            run_id: round.info.run_id,
            version: round.info.version,
            rank: round.info.rank,
            world_size: round.info.world_size,
            participants: round
                .info
                .participants
                .iter()
                .map(|p| Participant { node: p.node.clone(), addr: p.addr.clone(), pid: p.pid, port: p.port })
                .collect(),
            master_addr: round.bootstrap.master_addr,
            master_port: round.bootstrap.master_port,
            previous_version: round.info.changes.previous_version,
            previous_rank: round.info.changes.previous_rank,
            left: round.info.changes.left.to_vec(),
            joined: round.info.changes.joined.to_vec(),
            store: Py::new(py, Store::new(round.store))?,
        })
    }
}

#[pymethods]
impl Round {
    fn __repr__(&self) -> String {
        format!(
            "Round(run_id={:?}, version={}, rank={}, world_size={}, master_addr={:?}, master_port={}, previous_rank={})",
            self.run_id,
            self.version,
            self.rank,
            self.world_size,
            self.master_addr,
            self.master_port,
            self.previous_rank.map_or_else(|| "None".to_string(), |r| r.to_string())
        )
    }
}

/// The c10d-style Store of a round (or of a run, from `open_store`).
#[pyclass(module = "rdzv._rdzv", frozen)]
struct Store {
    inner: rdzv::Store,
    timeout: Mutex<Duration>,
    pid: u32,
}

impl Store {
    fn new(inner: rdzv::Store) -> Store {
        let timeout = inner.timeout();
        Store { inner, timeout: Mutex::new(timeout), pid: std::process::id() }
    }

    /// The Store with the current timeout, for one call.
    fn handle(&self) -> PyResult<rdzv::Store> {
        same_process(self.pid, "Store")?;
        let timeout = *self.timeout.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        Ok(self.inner.clone().with_timeout(timeout))
    }

    fn run<T, F>(&self, py: Python<'_>, op: impl FnOnce(rdzv::Store) -> F) -> PyResult<T>
    where
        F: Future<Output = Result<T, RustStoreError>> + Send,
        T: Send,
    {
        let store = self.handle()?;
        block(py, op(store))?.map_err(store_err)
    }
}

#[pymethods]
impl Store {
    /// Sets `key` to `value`.
    fn set(&self, py: Python<'_>, key: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let (key, value) = (bytes_of(key, "key")?, bytes_of(value, "value")?);
        self.run(py, |s| async move { s.set(key, value).await })
    }

    /// The value of `key`, waiting until it exists.
    fn get<'py>(&self, py: Python<'py>, key: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
        let key = bytes_of(key, "key")?;
        let value = self.run(py, |s| async move { s.get(key).await })?;
        Ok(PyBytes::new(py, &value))
    }

    /// Adds `amount` to the counter at `key`; returns the new value.
    fn add(&self, py: Python<'_>, key: &Bound<'_, PyAny>, amount: i64) -> PyResult<i64> {
        let key = bytes_of(key, "key")?;
        self.run(py, |s| async move { s.add(key, amount).await })
    }

    /// c10d's compare_set; returns the value stored afterwards.
    fn compare_set<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        expected: &Bound<'py, PyAny>,
        desired: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let key = bytes_of(key, "key")?;
        let expected = bytes_of(expected, "expected_value")?;
        let desired = bytes_of(desired, "desired_value")?;
        let value = self.run(py, |s| async move { s.compare_set(key, expected, desired).await })?;
        Ok(PyBytes::new(py, &value))
    }

    /// Appends `value` to the bytes at `key`.
    fn append(&self, py: Python<'_>, key: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let (key, value) = (bytes_of(key, "key")?, bytes_of(value, "value")?);
        self.run(py, |s| async move { s.append(key, value).await })
    }

    /// Waits until every key exists (`timeout`: seconds or timedelta; default the store's).
    #[pyo3(signature = (keys, timeout=None))]
    fn wait(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let keys = keys_of(keys)?;
        let timeout = duration_of(timeout, "timeout")?;
        self.run(py, |s| async move {
            let timeout = timeout.unwrap_or_else(|| s.timeout());
            s.wait(keys, timeout).await
        })
    }

    /// Whether every key exists now.
    fn check(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<bool> {
        let keys = keys_of(keys)?;
        self.run(py, |s| async move { s.check(keys).await })
    }

    /// Deletes `key`; returns whether it existed.
    fn delete_key(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let key = bytes_of(key, "key")?;
        self.run(py, |s| async move { s.delete_key(key).await })
    }

    /// The number of keys.
    fn num_keys(&self, py: Python<'_>) -> PyResult<i64> {
        self.run(py, |s| async move { s.num_keys().await })
    }

    /// The keys, in byte order.
    fn list_keys<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let keys = self.run(py, |s| async move { s.list_keys().await })?;
        Ok(keys.iter().map(|k| PyBytes::new(py, k)).collect())
    }

    /// The values of `keys`, waiting until all exist.
    fn multi_get<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let keys = keys_of(keys)?;
        let values = self.run(py, |s| async move { s.multi_get(keys).await })?;
        Ok(values.iter().map(|v| PyBytes::new(py, v)).collect())
    }

    /// Sets each key to the value at the same position.
    fn multi_set(&self, py: Python<'_>, keys: &Bound<'_, PyAny>, values: &Bound<'_, PyAny>) -> PyResult<()> {
        let keys = keys_of(keys)?;
        let values: Vec<Vec<u8>> =
            values.try_iter()?.map(|v| bytes_of(&v?, "a value")).collect::<PyResult<_>>()?;
        if keys.len() != values.len() {
            return Err(PyValueError::new_err(format!(
                "multi_set needs as many values as keys, got {} keys and {} values",
                keys.len(),
                values.len()
            )));
        }
        self.run(py, |s| async move { s.multi_set(keys.into_iter().zip(values)).await })
    }

    /// Appends `value` to the queue `key`.
    fn queue_push(&self, py: Python<'_>, key: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let (key, value) = (bytes_of(key, "key")?, bytes_of(value, "value")?);
        self.run(py, |s| async move { s.queue_push(key, value).await })
    }

    /// Removes and returns the oldest item of the queue `key`.
    #[pyo3(signature = (key, block=true))]
    fn queue_pop<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        block: bool,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let key = bytes_of(key, "key")?;
        let value = self.run(py, |s| async move { s.queue_pop(key, block).await })?;
        Ok(PyBytes::new(py, &value))
    }

    /// The number of items in the queue `key`.
    fn queue_len(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<i64> {
        let key = bytes_of(key, "key")?;
        self.run(py, |s| async move { s.queue_len(key).await })
    }

    /// Returns once `world_size` calls have reached the barrier `key`.
    #[pyo3(signature = (key, world_size, timeout=None))]
    fn barrier(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        world_size: usize,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let key = bytes_of(key, "key")?;
        let timeout = duration_of(timeout, "timeout")?;
        self.run(py, |s| async move {
            let timeout = timeout.unwrap_or_else(|| s.timeout());
            s.barrier(key, world_size, timeout).await
        })
    }

    /// The timeout of blocking calls, in seconds.
    #[getter]
    fn timeout(&self) -> f64 {
        self.timeout.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).as_secs_f64()
    }

    /// Sets the timeout of blocking calls (seconds or timedelta).
    fn set_timeout(&self, timeout: &Bound<'_, PyAny>) -> PyResult<()> {
        let Some(timeout) = duration_of(Some(timeout), "timeout")? else {
            return Err(PyValueError::new_err("timeout must be seconds or a timedelta, not None"));
        };
        *self.timeout.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = timeout;
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!("Store(scope={:?})", String::from_utf8_lossy(self.inner.scope()))
    }
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
