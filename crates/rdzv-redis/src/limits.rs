//! The sizes the Redis backend accepts, checked before anything is sent.
//!
//! Redis itself takes values of up to 512 MB, but every value written is also kept in the
//! event log, every key is stored once per index it belongs to, and a script holds the whole
//! request while it runs (blocking the server for everyone). So the backend keeps to the
//! same order of size as etcd's default request limit (1.5 MiB): a request that would not fit
//! on etcd is not accepted here either, and a job moves between backends unchanged.

use rdzv_core::KvResult;
use rdzv_core::kv::SizeLimit;

use crate::error::NAME;

/// Longest key, in bytes.
pub const MAX_KEY_BYTES: usize = 4 * 1024;

/// Longest value, in bytes (as etcd's default request limit).
pub const MAX_VALUE_BYTES: usize = 1536 * 1024;

/// Largest request: a key and its value together, in bytes.
pub const MAX_REQUEST_BYTES: usize = 1536 * 1024;

// Fixed on purpose (see above): no option raises them.
const KEY: SizeLimit = SizeLimit { backend: NAME, what: "a key", limit: MAX_KEY_BYTES, raise: None };
const VALUE: SizeLimit = SizeLimit { backend: NAME, what: "a value", limit: MAX_VALUE_BYTES, raise: None };
const REQUEST: SizeLimit =
    SizeLimit { backend: NAME, what: "a request", limit: MAX_REQUEST_BYTES, raise: None };

/// A key (or prefix) sent to the server.
pub(crate) fn check_key(key: &[u8]) -> KvResult<()> {
    KEY.check(key.len())
}

/// A write of `value` under `key`.
pub(crate) fn check_write(key: &[u8], value: &[u8]) -> KvResult<()> {
    KEY.check(key.len())?;
    VALUE.check(value.len())?;
    REQUEST.check(key.len() + value.len())
}
