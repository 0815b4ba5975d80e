//! `rdzv.Store`: the c10d-style Store of a round (or of a run, from `open_store`).

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use rdzv::StoreError as RustStoreError;

use crate::convert::{bytes_of, duration_of, keys_of};
use crate::errors::store_err;
use crate::runtime::{block, same_process};

/// The c10d-style Store of a round (or of a run, from `open_store`).
#[pyclass(module = "rdzv._rdzv", frozen)]
pub(crate) struct Store {
    inner: rdzv::Store,
    timeout: Mutex<Duration>,
    pid: u32,
}

impl Store {
    pub(crate) fn new(inner: rdzv::Store) -> Store {
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
