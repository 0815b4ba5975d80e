//! Where a Store keeps its data on the backend.
//!
//! A Store has a *root* (its namespace on the backend, e.g. `rdzv/job/v_3/kv/`) and a
//! *scope* (the user-visible prefix added by [`Store::with_prefix`](crate::Store::with_prefix),
//! e.g. `trainer/`). Under the root, three disjoint areas:
//!
//! - `<root>k/<scope><key>`: user keys (`set`, `add`, `append`, `compare_set`…). Because
//!   the scope is a plain prefix of the key, `store.with_prefix("p").set("x")` and
//!   `store.set("p/x")` are the same key, exactly as with c10d's `PrefixStore`.
//! - `<root>q/<n>:<scope><key>/<item>`: the items of a queue (`n` = byte length of
//!   `<scope><key>`).
//! - `<root>b/<n>:<scope><key>/…`: a barrier's counter and "done" keys.
//!
//! User keys cannot reach the other areas (they all start with `k/`), and the length prefix
//! makes the queue and barrier names prefix-free: the items of queue `a` are never under
//! the prefix of queue `a/b`, so a range or a watch of one queue sees only that queue.

/// The area of user keys.
const USER: &[u8] = b"k/";
/// The area of queues.
const QUEUE: &[u8] = b"q/";
/// The area of barriers.
const BARRIER: &[u8] = b"b/";

/// The backend key of user key `key` in `scope` under `root`.
pub(crate) fn user_key(root: &[u8], scope: &[u8], key: &[u8]) -> Vec<u8> {
    let mut out = user_prefix(root, scope);
    out.extend_from_slice(key);
    out
}

/// The backend prefix of every user key in `scope` under `root`.
pub(crate) fn user_prefix(root: &[u8], scope: &[u8]) -> Vec<u8> {
    concat(&[root, USER, scope])
}

/// The backend prefix under which queue `key` keeps its items (ends with `/`).
pub(crate) fn queue_prefix(root: &[u8], scope: &[u8], key: &[u8]) -> Vec<u8> {
    named(root, QUEUE, scope, key)
}

/// The backend prefix of barrier `key`'s bookkeeping keys (ends with `/`).
pub(crate) fn barrier_prefix(root: &[u8], scope: &[u8], key: &[u8]) -> Vec<u8> {
    named(root, BARRIER, scope, key)
}

/// `<root><area><len>:<scope><key>/`, a prefix-free encoding of the name `<scope><key>`.
fn named(root: &[u8], area: &[u8], scope: &[u8], key: &[u8]) -> Vec<u8> {
    let len = (scope.len() + key.len()).to_string();
    let mut out = concat(&[root, area, len.as_bytes(), b":", scope, key]);
    out.push(b'/');
    out
}

fn concat(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(parts.iter().map(|p| p.len()).sum::<usize>() + 1);
    for part in parts {
        out.extend_from_slice(part);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_keys_follow_the_scope() {
        assert_eq!(user_key(b"r/", b"p/", b"x"), b"r/k/p/x");
        assert_eq!(user_key(b"r/", b"", b"p/x"), b"r/k/p/x");
    }

    #[test]
    fn queue_names_are_prefix_free() {
        let a = queue_prefix(b"r/", b"", b"a");
        let ab = queue_prefix(b"r/", b"", b"a/b");
        assert!(!ab.starts_with(&a), "{ab:?} starts with {a:?}");
        assert!(!a.starts_with(&ab));
        let ten = queue_prefix(b"r/", b"", b"0123456789");
        let one = queue_prefix(b"r/", b"", b"0");
        assert!(!ten.starts_with(&one));
    }

    #[test]
    fn areas_are_disjoint() {
        let user = user_prefix(b"r/", b"");
        assert!(!queue_prefix(b"r/", b"", b"x").starts_with(&user));
        assert!(!barrier_prefix(b"r/", b"", b"x").starts_with(&user));
    }
}
