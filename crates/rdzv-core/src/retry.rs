//! The project's retry delays, and the one retry loop for conditions that pass by
//! themselves ([`KvError::Busy`](crate::KvError::Busy): a leader election, an overload).

use std::future::Future;
use std::time::Duration;

use backon::BackoffBuilder;
use tokio::time::Instant;

use crate::kv::KvResult;

/// Delays between retries: exponential from `min` up to `max`, each with jitter (so that
/// many clients that failed together do not retry in lockstep against a recovering
/// server), never running out.
pub fn retry_delays(min: Duration, max: Duration) -> impl Iterator<Item = Duration> + Send + 'static {
    backon::ExponentialBuilder::default()
        .with_min_delay(min)
        .with_max_delay(max)
        .with_jitter()
        .without_max_times()
        .build()
}

/// Runs `op` again after each [`KvError::Busy`](crate::KvError::Busy) answer, with [`retry_delays`] of 50 ms up to
/// 1 s, until it succeeds, fails otherwise, or the next try would start after `deadline`
/// (then the last `Busy` is returned). Any other error is returned at once: a server that
/// cannot be reached still fails fast.
pub async fn retry_while_busy<T, F, Fut>(deadline: Instant, mut op: F) -> KvResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = KvResult<T>>,
{
    let mut delays = retry_delays(Duration::from_millis(50), Duration::from_secs(1));
    loop {
        match op().await {
            Err(e) if e.is_busy() => {
                let pause = delays.next().unwrap_or(Duration::from_secs(1));
                if Instant::now() + pause >= deadline {
                    return Err(e);
                }
                tracing::debug!(error = %e, "the server cannot serve now; retrying");
                tokio::time::sleep(pause).await;
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::error::KvError;

    fn busy() -> KvError {
        KvError::Busy { backend: "x", endpoint: "h:1".into(), message: "no leader".into(), source: None }
    }

    #[tokio::test(start_paused = true)]
    async fn busy_answers_are_retried_until_the_deadline_and_other_errors_are_not() {
        let tries = AtomicU32::new(0);
        let deadline = Instant::now() + Duration::from_secs(5);
        let ok = retry_while_busy(deadline, || async {
            if tries.fetch_add(1, Ordering::SeqCst) < 3 { Err(busy()) } else { Ok(7) }
        })
        .await;
        assert_eq!(ok.unwrap_or_default(), 7);

        let started = Instant::now();
        let last = retry_while_busy(deadline, || async { Err::<(), _>(busy()) }).await;
        assert!(last.is_err_and(|e| e.is_busy()));
        assert!(Instant::now() <= deadline && started.elapsed() >= Duration::from_secs(3));

        tries.store(0, Ordering::SeqCst);
        let unreachable = retry_while_busy(Instant::now() + Duration::from_secs(60), || async {
            tries.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>(KvError::Unavailable {
                backend: "x",
                endpoint: "h:1".into(),
                message: "refused".into(),
                source: None,
            })
        })
        .await;
        assert!(unreachable.is_err() && tries.load(Ordering::SeqCst) == 1, "unreachable fails fast");
    }

    #[test]
    fn delays_grow_to_the_cap_with_jitter() {
        let delays: Vec<Duration> =
            retry_delays(Duration::from_millis(50), Duration::from_secs(1)).take(12).collect();
        // Jitter adds up to the delay itself.
        assert!(
            delays.iter().all(|d| *d >= Duration::from_millis(50) && *d <= Duration::from_secs(2)),
            "{delays:?}"
        );
        assert!(delays[11] >= Duration::from_secs(1), "{delays:?}");
    }

    #[test]
    fn two_backoffs_jitter_apart() {
        // With backon's `std` feature each backoff seeds its jitter at random; without it,
        // every one (in every process) would wait exactly as long as every other.
        let delays = || -> Vec<Duration> {
            retry_delays(Duration::from_millis(50), Duration::from_secs(1)).take(8).collect()
        };
        assert_ne!(delays(), delays());
    }
}
