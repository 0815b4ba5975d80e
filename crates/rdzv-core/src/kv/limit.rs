//! [`SizeLimit`]: the one check of a backend's size limits, made before anything is sent.

use crate::error::KvError;

use super::KvResult;

/// A limit on the size of what a backend accepts (a key, a value, a request), checked
/// before sending so that an oversize call fails with a [`KvError::TooLarge`] that says what
/// to shrink, and how the limit is raised if it can be, rather than failing at the server.
///
/// ```
/// use rdzv_core::KvError;
/// use rdzv_core::kv::SizeLimit;
/// let keys = SizeLimit { backend: "mine", what: "a key", limit: 4, raise: None };
/// assert!(keys.check(4).is_ok());
/// assert!(matches!(keys.check(5), Err(KvError::TooLarge { size: 5, limit: 4, .. })));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SizeLimit {
    /// Backend name.
    pub backend: &'static str,
    /// What is limited (`"a key"`, `"a value"`, `"a request"`), as the error names it.
    pub what: &'static str,
    /// The most bytes accepted.
    pub limit: usize,
    /// How the limit is raised (`None`: it is fixed), as the error names it.
    pub raise: Option<&'static str>,
}

impl SizeLimit {
    /// `Ok` if `size` bytes are within the limit, else [`KvError::TooLarge`].
    pub fn check(&self, size: usize) -> KvResult<()> {
        if size <= self.limit {
            return Ok(());
        }
        let SizeLimit { backend, what, limit, raise } = *self;
        Err(KvError::TooLarge { backend, what, size, limit, raise })
    }
}
