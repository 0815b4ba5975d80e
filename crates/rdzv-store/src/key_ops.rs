//! Plain key operations: `set`, the blocking reads (`get`, `multi_get`, `wait`) and the
//! non-blocking ones (`check`, `delete_key`, `num_keys`, `list_keys`, `multi_set`).

use std::time::Duration;

use futures::future::try_join_all;
use rdzv_core::KvExt;
use rdzv_core::kv::{DeleteMode, DeleteOutcome, PutMode, RangeOptions};

use crate::error::StoreError;
use crate::store::{Store, collect_keys, deadline_after};

impl Store {
    /// Inserts or overwrites `key`, waking every call waiting for it.
    pub async fn set(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<(), StoreError> {
        let key = key.as_ref();
        let full = self.user_key(key);
        self.bounded("set", &[key], self.timeout(), async {
            self.kv().put(&full, value.as_ref(), self.write(PutMode::Overwrite)).await?;
            Ok(())
        })
        .await
    }

    /// The value of `key`, **waiting** until it exists. Fails with
    /// [`StoreError::Timeout`] naming the key when the store timeout passes first.
    pub async fn get(&self, key: impl AsRef<[u8]>) -> Result<Vec<u8>, StoreError> {
        let key = key.as_ref().to_vec();
        let mut values = self.wait_values("get", vec![key], self.timeout()).await?;
        Ok(values.pop().unwrap_or_default())
    }

    /// The values of `keys`, in order, waiting until all exist. Fails with
    /// [`StoreError::Timeout`] naming every key still missing when the store timeout passes.
    pub async fn multi_get<K: AsRef<[u8]>>(
        &self,
        keys: impl IntoIterator<Item = K>,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        self.wait_values("multi_get", collect_keys(keys), self.timeout()).await
    }

    /// Waits until every key of `keys` exists. Fails with [`StoreError::Timeout`] naming
    /// the keys still missing after `timeout` (pass [`Store::timeout`] for the default).
    pub async fn wait<K: AsRef<[u8]>>(
        &self,
        keys: impl IntoIterator<Item = K>,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        self.wait_values("wait", collect_keys(keys), timeout).await.map(drop)
    }

    /// Whether every key of `keys` exists now (true for no keys); does not wait.
    pub async fn check<K: AsRef<[u8]>>(&self, keys: impl IntoIterator<Item = K>) -> Result<bool, StoreError> {
        let keys = collect_keys(keys);
        let names: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        self.bounded("check", &names, self.timeout(), async {
            let reads = keys.iter().map(|key| {
                let full = self.user_key(key);
                async move { self.kv().get(&full).await }
            });
            let found = try_join_all(reads).await?;
            Ok(found.iter().all(|read| read.kv.is_some()))
        })
        .await
    }

    /// Deletes `key`; returns whether it existed. Safe to call again after a retryable error:
    /// if the first delete took effect and its answer was lost, the second finds the key gone
    /// and returns `false`.
    pub async fn delete_key(&self, key: impl AsRef<[u8]>) -> Result<bool, StoreError> {
        let key = key.as_ref();
        let full = self.user_key(key);
        self.bounded("delete_key", &[key], self.timeout(), async {
            let outcome = self.kv().delete(&full, DeleteMode::Any).await?;
            Ok(matches!(outcome, DeleteOutcome::Deleted { .. }))
        })
        .await
    }

    /// The number of keys in this Store's scope: the keys written by `set`, `add`,
    /// `append`, `compare_set` and `multi_set` and not deleted. Queues and barriers keep
    /// their bookkeeping apart and are not counted (use [`Store::queue_len`] for a queue).
    pub async fn num_keys(&self) -> Result<i64, StoreError> {
        let prefix = self.user_prefix();
        self.bounded("num_keys", &[], self.timeout(), async {
            let count = self.kv().count(&prefix, None).await?;
            Ok(i64::try_from(count).unwrap_or(i64::MAX))
        })
        .await
    }

    /// The keys counted by [`Store::num_keys`], without this Store's prefix, in byte order.
    pub async fn list_keys(&self) -> Result<Vec<Vec<u8>>, StoreError> {
        let prefix = self.user_prefix();
        self.bounded("list_keys", &[], self.timeout(), async {
            let options = RangeOptions { keys_only: true, ..RangeOptions::default() };
            let listed = self.kv().range(&prefix, options).await?;
            Ok(listed
                .kvs
                .into_iter()
                .filter_map(|kv| kv.key.strip_prefix(prefix.as_slice()).map(<[u8]>::to_vec))
                .collect())
        })
        .await
    }

    /// Sets each `(key, value)` pair, waking the waiters of each key. Each key is written
    /// on its own (a reader may see some of them before the others).
    pub async fn multi_set<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &self,
        items: impl IntoIterator<Item = (K, V)>,
    ) -> Result<(), StoreError> {
        let items: Vec<(Vec<u8>, V)> = items.into_iter().map(|(k, v)| (k.as_ref().to_vec(), v)).collect();
        let names: Vec<&[u8]> = items.iter().map(|(k, _)| k.as_slice()).collect();
        self.bounded("multi_set", &names, self.timeout(), async {
            let writes = items.iter().map(|(key, value)| {
                let full = self.user_key(key);
                async move { self.kv().put(&full, value.as_ref(), self.write(PutMode::Overwrite)).await }
            });
            try_join_all(writes).await?;
            Ok(())
        })
        .await
    }

    /// Waits (concurrently) for every key of `keys` until `timeout`; returns their values
    /// in order, or a timeout naming exactly the keys that did not appear.
    async fn wait_values(
        &self,
        operation: &'static str,
        keys: Vec<Vec<u8>>,
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let deadline = deadline_after(timeout);
        let waits = keys.iter().map(|key| {
            let full = self.user_key(key);
            async move {
                match tokio::time::timeout_at(deadline, self.kv().key_exists(&full)).await {
                    Ok(found) => Ok(Some(found?.value)),
                    Err(_) => Ok::<_, StoreError>(None),
                }
            }
        });
        let found = try_join_all(waits).await?;
        let missing: Vec<Vec<u8>> = keys
            .iter()
            .zip(&found)
            .filter(|(_, value)| value.is_none())
            .map(|(key, _)| key.clone())
            .collect();
        if !missing.is_empty() {
            return Err(StoreError::Timeout { operation, keys: missing, after: timeout });
        }
        Ok(found.into_iter().flatten().map(Vec::from).collect())
    }
}
