//! The key range of a prefix, as ordered stores (etcd, a `BTreeMap`) address it.

/// The first key after every key that starts with `prefix`: the prefix with its last byte
/// below `0xff` incremented and everything after it dropped. `None` when there is no such
/// key (an empty prefix, or only `0xff` bytes): the range runs to the end of the key space.
///
/// ```
/// use rdzv_core::kv::prefix_end;
/// assert_eq!(prefix_end(b"a/"), Some(b"a0".to_vec()));
/// assert_eq!(prefix_end(b"a\xfe\xff"), Some(b"a\xff".to_vec()));
/// assert_eq!(prefix_end(b"\xff\xff"), None);
/// assert_eq!(prefix_end(b""), None);
/// ```
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let last = prefix.iter().rposition(|&b| b < u8::MAX)?;
    let mut end = prefix[..=last].to_vec();
    end[last] += 1;
    Some(end)
}

#[cfg(test)]
mod tests {
    use super::prefix_end;

    #[test]
    fn the_end_increments_the_last_byte_below_ff() {
        assert_eq!(prefix_end(b"abc"), Some(b"abd".to_vec()));
        assert_eq!(prefix_end(b"a/"), Some(b"a0".to_vec()));
        assert_eq!(prefix_end(b"a\xff"), Some(b"b".to_vec()));
        assert_eq!(prefix_end(b"a\xfe\xff\xff"), Some(b"a\xff".to_vec()));
        assert_eq!(prefix_end(b"\xff\xff"), None);
        assert_eq!(prefix_end(b""), None);
    }
}
