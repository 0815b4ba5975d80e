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

/// The arguments of [`Kv::delete_prefix_limited`](crate::Kv::delete_prefix_limited), checked
/// as every backend must: a non-empty prefix (an empty one would be every key) and a limit of
/// at least one key; else [`KvError::InvalidArgument`](crate::KvError::InvalidArgument).
///
/// ```
/// use rdzv_core::kv::check_delete_piece;
/// assert!(check_delete_piece(b"run/v_1/", 256).is_ok());
/// assert!(check_delete_piece(b"", 256).is_err());
/// assert!(check_delete_piece(b"run/v_1/", 0).is_err());
/// ```
pub fn check_delete_piece(prefix: &[u8], limit: usize) -> crate::KvResult<()> {
    if prefix.is_empty() || limit == 0 {
        return Err(crate::KvError::InvalidArgument(
            "delete_prefix_limited needs a non-empty prefix and a limit of at least one key".into(),
        ));
    }
    Ok(())
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
