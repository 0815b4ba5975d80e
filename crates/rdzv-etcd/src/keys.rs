//! Key ranges and key conversion: etcd addresses "every key starting with P" as the range
//! `[P, P+1)`, and an optional namespace is prepended to every key on the way in and cut off
//! on the way out.

use rdzv_core::kv::{KeyValue, prefix_end};

/// A namespace: a byte prefix that isolates one user's keys from another's on the same
/// cluster (like etcd's `--namespace` proxy).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Namespace(Vec<u8>);

impl Namespace {
    pub fn new(prefix: Vec<u8>) -> Namespace {
        Namespace(prefix)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The etcd key of a user key.
    pub fn key(&self, key: &[u8]) -> Vec<u8> {
        let mut full = Vec::with_capacity(self.0.len() + key.len());
        full.extend_from_slice(&self.0);
        full.extend_from_slice(key);
        full
    }

    /// The etcd range `[start, end)` of a user prefix (an empty prefix: the whole namespace).
    pub fn prefix_range(&self, prefix: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let start = self.key(prefix);
        if start.is_empty() {
            // The whole key space: from "\0" (the smallest non-empty key) to the end.
            return (vec![0], vec![0]);
        }
        // No key after the prefix (all 0xff): etcd's "\0" runs to the end of the key space.
        let end = prefix_end(&start).unwrap_or_else(|| vec![0]);
        (start, end)
    }

    /// The user key of an etcd key (keys outside the namespace are returned whole; etcd
    /// never sends them for a namespaced request).
    pub fn strip(&self, mut key: Vec<u8>) -> Vec<u8> {
        if key.starts_with(&self.0) {
            key.drain(..self.0.len());
        }
        key
    }

    /// Converts an etcd key-value, taking its value without copying.
    pub fn convert(&self, kv: etcd_client::KeyValue) -> KeyValue {
        let create_revision = kv.create_revision();
        let mod_revision = kv.mod_revision();
        let version = kv.version();
        let lease = kv.lease();
        let (key, value) = kv.into_key_value();
        KeyValue {
            key: self.strip(key),
            value: value.into(),
            create_revision,
            mod_revision,
            version,
            lease: (lease != 0).then_some(lease),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_ranges() {
        let none = Namespace::default();
        assert_eq!(none.prefix_range(b""), (vec![0], vec![0]));
        assert_eq!(none.prefix_range(b"k/"), (b"k/".to_vec(), b"k0".to_vec()));
        // No key follows every key under 0xff 0xff: the range runs to etcd's end, "\0".
        assert_eq!(none.prefix_range(b"\xff\xff"), (b"\xff\xff".to_vec(), vec![0]));
        let ns = Namespace::new(b"ns/".to_vec());
        assert_eq!(ns.prefix_range(b""), (b"ns/".to_vec(), b"ns0".to_vec()));
        assert_eq!(ns.key(b"a"), b"ns/a".to_vec());
        assert_eq!(ns.strip(b"ns/a".to_vec()), b"a".to_vec());
    }
}
