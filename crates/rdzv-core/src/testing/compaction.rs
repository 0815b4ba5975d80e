//! Compaction: a watch from a compacted revision fails with `Compacted` and ends; current
//! state survives compaction. Backends without compaction must say so.

use std::sync::Arc;

use super::{expect_watch_error, key, next_event, put, watch, within};
use crate::error::KvError;
use crate::kv::{Kv, RangeOptions, WatchScope};

/// A watch from before the compaction point fails with `Compacted` naming an oldest
/// available revision past the requested one, then ends; a watch from the compaction point
/// works. Without the capability, `compact` must be `Unsupported`.
pub async fn watch_from_compacted_revision_fails(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let k = key(&ns, "k");
    let r1 = put(&*kv, &k, b"1").await;
    put(&*kv, &k, b"2").await;
    let r3 = put(&*kv, &k, b"3").await;
    if !kv.capabilities().compaction {
        match within("compact", kv.compact(r3)).await {
            Err(KvError::Unsupported { .. }) => return,
            other => panic!("compact without the capability must be Unsupported: {other:?}"),
        }
    }
    within("compact", kv.compact(r3)).await.expect("compact");
    expect_watch_error(
        kv.watch(&k, WatchScope::Key, r1).await,
        "watch from a compacted revision",
        |e| matches!(e, KvError::Compacted { requested, oldest } if *requested == r1 && *oldest > r1),
    )
    .await;
    let mut events = watch(&*kv, &k, WatchScope::Key, r3).await;
    let event = next_event(&mut events, "watching from the compaction point").await;
    assert_eq!((event.revision(), event.kv.value.to_vec()), (r3, b"3".to_vec()));
}

/// Compaction discards history, not state: keys read the same before and after.
pub async fn compaction_keeps_current_state(kv: Arc<dyn Kv>, ns: Vec<u8>) {
    let a = put(&*kv, &key(&ns, "a"), b"1").await;
    let b = put(&*kv, &key(&ns, "b"), b"2").await;
    let before = within("range", kv.range(&ns, RangeOptions::default())).await.expect("range");
    if !kv.capabilities().compaction {
        assert!(matches!(within("compact", kv.compact(b)).await, Err(KvError::Unsupported { .. })));
        return;
    }
    {
        within("compact", kv.compact(b)).await.expect("compact");
    }
    let after = within("range", kv.range(&ns, RangeOptions::default())).await.expect("range");
    assert_eq!(before.kvs, after.kvs);
    assert_eq!(after.kvs[0].create_revision, a);
    let r = put(&*kv, &key(&ns, "a"), b"3").await;
    let got = within("get", kv.get(&key(&ns, "a"))).await.expect("get").kv.expect("exists");
    assert_eq!((got.create_revision, got.mod_revision, got.version), (a, r, 2));
}
