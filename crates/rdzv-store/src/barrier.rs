//! The all-ranks barrier, in O(1) backend writes per rank: each rank `add`s 1 to the
//! barrier's counter; the rank that brings it to a multiple of `world_size` writes one
//! "done" key for that generation, which every other rank of the generation watches. The
//! counter keeps counting across uses, so the same barrier key can be passed again and
//! again (each `world_size` arrivals form the next generation).

use std::time::Duration;

use rdzv_core::{DeleteMode, KvExt, PutMode};

use crate::counter::add_at;
use crate::error::StoreError;
use crate::store::Store;

impl Store {
    /// Returns once `world_size` calls (this one included) have reached the barrier `key`,
    /// or fails with [`StoreError::Timeout`] after `timeout`. Every rank must pass the same
    /// `world_size` for the same key. A rank that timed out has still been counted, so the
    /// barrier's generations are off by one from then on: after a timeout, use a new key.
    /// Barriers are apart from the other keys (`num_keys` does not count them).
    pub async fn barrier(
        &self,
        key: impl AsRef<[u8]>,
        world_size: usize,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        let key = key.as_ref();
        let size = match i64::try_from(world_size) {
            Ok(size) if size > 0 => size,
            _ => {
                return Err(StoreError::InvalidArgument(format!(
                    "a barrier needs a world size between 1 and {}, not {world_size}",
                    i64::MAX
                )));
            }
        };
        let base = self.barrier_prefix(key);
        let done = |generation: i64| {
            let mut done = base.clone();
            done.extend_from_slice(format!("done/{generation}").as_bytes());
            done
        };
        let mut counter = base.clone();
        counter.push(b'n');
        self.bounded("barrier", &[key], timeout, async {
            let kv = self.kv().as_ref();
            let arrived = add_at(kv, &counter, key, 1, self.lease()).await?;
            let generation = (arrived - 1) / size;
            if arrived % size != 0 {
                kv.key_exists(&done(generation)).await?;
                return Ok(());
            }
            kv.put(&done(generation), b"", self.write(PutMode::Overwrite)).await?;
            if generation > 0 {
                // Every rank of the previous generation has arrived in this one, so has
                // left the previous wait: nobody needs its done key any more.
                kv.delete(&done(generation - 1), DeleteMode::Any).await?;
            }
            Ok(())
        })
        .await
    }
}
