//! The all-ranks barrier, in O(1) backend writes per rank: each rank `add`s 1 to the
//! barrier's counter; the rank that brings it to a multiple of `world_size` writes one
//! "done" key for that generation, which every other rank of the generation watches. The
//! counter keeps counting across uses, so the same barrier key can be passed again and
//! again (each `world_size` arrivals form the next generation).

use std::future::Future;
use std::time::Duration;

use rdzv_core::kv::{DeleteMode, PutMode};
use rdzv_core::retry::RetryPolicy;
use rdzv_core::{KvExt, KvResult};

use crate::counter::add_at;
use crate::error::StoreError;
use crate::store::Store;

impl Store {
    /// Returns once `world_size` calls (this one included) have reached the barrier `key`,
    /// or fails with [`StoreError::Timeout`] after `timeout`. Every rank must pass the same
    /// `world_size` for the same key. A rank that timed out has still been counted, so the
    /// barrier's generations are off by one from then on: after a timeout, use a new key.
    /// Counting is the one step not safe to repeat (a lost answer to it is
    /// [`StoreError::OutcomeUnknown`]); what follows — writing or awaiting the done key — is
    /// retried within `timeout` when the backend fails, so that a failure after counting
    /// neither fails this rank nor leaves the others waiting for a done key never written.
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
        self.bounded_write("barrier", &[key], timeout, |sent| async move {
            let kv = self.kv().as_ref();
            let arrived = add_at(kv, &counter, key, 1, self.lease(), &sent).await?;
            // Counted for sure: a timeout from here on is the documented one, and every step
            // left can be repeated.
            sent.clear();
            let generation = (arrived - 1) / size;
            let this_done = done(generation);
            if arrived % size != 0 {
                until_done(|| kv.key_exists(&this_done)).await?;
                return Ok(());
            }
            until_done(|| kv.put(&this_done, b"", self.write(PutMode::Overwrite))).await?;
            if generation > 0 {
                // Every rank of the previous generation has arrived in this one, so has
                // left the previous wait: nobody needs its done key any more. Only tidying:
                // a failure is left to the next generation's tidying, or the lease.
                if let Err(e) = kv.delete(&done(generation - 1), DeleteMode::Any).await {
                    tracing::debug!(error = %e, "barrier: could not delete the previous generation's done key");
                }
            }
            Ok(())
        })
        .await
    }
}

/// Runs `step` (one that is safe to repeat) again after each retryable backend error
/// ([`RetryPolicy::BUSY`]'s pauses, 50 ms growing to 1 s); the caller's deadline bounds it.
async fn until_done<T, F, Fut>(step: F) -> KvResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = KvResult<T>>,
{
    RetryPolicy::BUSY.run(None, rdzv_core::KvError::is_retryable, step).await
}
