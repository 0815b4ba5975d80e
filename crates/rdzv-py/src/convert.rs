//! Python values as Rust ones: keys and values (`bytes` or `str`), durations (seconds or a
//! `timedelta`).

use std::time::Duration;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

/// `bytes` or `str` (encoded as UTF-8) as bytes, as c10d stores accept both.
pub(crate) fn bytes_of(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u8>> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(s.to_cow()?.as_bytes().to_vec());
    }
    Err(PyTypeError::new_err(format!("{what} must be bytes or str, not {}", obj.get_type().name()?)))
}

pub(crate) fn keys_of(keys: &Bound<'_, PyAny>) -> PyResult<Vec<Vec<u8>>> {
    if keys.is_instance_of::<PyString>() || keys.is_instance_of::<PyBytes>() {
        return Err(PyTypeError::new_err("keys must be a list of bytes or str, not a single key"));
    }
    keys.try_iter()?.map(|k| bytes_of(&k?, "a key")).collect()
}

/// Seconds (a number) or a `datetime.timedelta`, as a duration; `None` stays `None`.
pub(crate) fn duration_of(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<Duration>> {
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
