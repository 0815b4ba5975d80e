//! The project's retry delays, and the one retry loop: for conditions that pass by
//! themselves ([`KvError::Busy`]: a leader election, an overload), and, at a first contact,
//! for a connection that was just reset ([`KvError::Unavailable`], a few times only).

use std::future::Future;
use std::time::Duration;

use backon::BackoffBuilder;
use tokio::time::Instant;

use crate::error::KvError;
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

/// Runs `op` again after each [`KvError::Busy`] answer, with [`retry_delays`] of 50 ms up to
/// 1 s, until it succeeds, fails otherwise, or the next try would start after `deadline`
/// (then the last `Busy` is returned). Any other error is returned at once: a server that
/// cannot be reached still fails fast.
pub async fn retry_while_busy<T, F, Fut>(deadline: Instant, op: F) -> KvResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = KvResult<T>>,
{
    retry(deadline, 0, op).await
}

/// How many more times [`retry_first_contact`] asks after an
/// [`Unavailable`](KvError::Unavailable) answer.
pub const FIRST_CONTACT_RETRIES: u32 = 2;
/// The first pause of [`retry_first_contact`] after an `Unavailable` answer; the second is
/// twice as long, and jitter adds up to as much again to each (at most 900 ms in all).
pub const FIRST_CONTACT_PAUSE: Duration = Duration::from_millis(150);

/// [`retry_while_busy`], and also an [`Unavailable`](KvError::Unavailable) answer is
/// asked again, at most [`FIRST_CONTACT_RETRIES`] more times, after jittered pauses of
/// [`FIRST_CONTACT_PAUSE`] and twice that (under 1 s in all), never starting a try after
/// `deadline`. For a first request that is safe to repeat, such as a session's lease grant
/// (a grant whose answer was lost leaves a lease with no key, which expires by its TTL): a
/// client whose connection was just reset fails the next request once and reconnects, and
/// that reconnection is used; a server that cannot be reached at all still fails within
/// about a second (plus the tries' own time), with the last `Unavailable`. Any other error is
/// returned at once.
pub async fn retry_first_contact<T, F, Fut>(deadline: Instant, op: F) -> KvResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = KvResult<T>>,
{
    retry(deadline, FIRST_CONTACT_RETRIES, op).await
}

/// The one retry loop: `Busy` until `deadline`, `Unavailable` at most `unavailable` more
/// times within it, nothing else.
async fn retry<T, F, Fut>(deadline: Instant, mut unavailable: u32, mut op: F) -> KvResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = KvResult<T>>,
{
    let mut delays = retry_delays(Duration::from_millis(50), Duration::from_secs(1));
    let mut reconnects = retry_delays(FIRST_CONTACT_PAUSE, 2 * FIRST_CONTACT_PAUSE);
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
            Err(e @ KvError::Unavailable { .. }) if unavailable > 0 => {
                unavailable -= 1;
                let pause = reconnects.next().unwrap_or(2 * FIRST_CONTACT_PAUSE);
                if Instant::now() + pause >= deadline {
                    return Err(e);
                }
                tracing::debug!(error = %e, "the server could not be reached; trying again (its client may have reconnected)");
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

    fn busy() -> KvError {
        KvError::Busy { backend: "x", endpoint: "h:1".into(), message: "no leader".into(), source: None }
    }

    fn unavailable() -> KvError {
        KvError::Unavailable { backend: "x", endpoint: "h:1".into(), message: "refused".into(), source: None }
    }

    /// The loop with `unavailable` more tries after `Unavailable`, on an operation that always
    /// fails with `error()`: how many tries it made, and whether it ended with that error.
    async fn always(deadline: Instant, unavailable: u32, error: fn() -> KvError) -> (u32, bool) {
        let tries = AtomicU32::new(0);
        let last = retry(deadline, unavailable, || async {
            tries.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>(error())
        })
        .await;
        let same = matches!((&last, error()), (Err(a), b) if std::mem::discriminant(a) == std::mem::discriminant(&b));
        (tries.load(Ordering::SeqCst), same)
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

        let (_, busy_last) = always(deadline, 0, busy).await;
        assert!(busy_last);
        // It stops at the first pause that would end past the deadline, and a pause is at most
        // 2 s (1 s, and jitter of up to as much again); with pauses this long, asserting a
        // fixed time since the start failed now and then.
        let (now, largest_pause) = (Instant::now(), Duration::from_secs(2));
        assert!(
            now <= deadline && now + largest_pause >= deadline,
            "stopped {:?} before the deadline",
            deadline - now
        );

        let far = Instant::now() + Duration::from_secs(60);
        assert_eq!(always(far, 0, unavailable).await, (1, true), "unreachable fails fast");
    }

    /// Issue 23, item 2: a first contact asks again after `Unavailable` (a connection just
    /// reset), twice at most and within a second; `Busy` still until the deadline.
    #[tokio::test(start_paused = true)]
    async fn a_first_contact_asks_again_after_unavailable_a_bounded_number_of_times() {
        let tries = AtomicU32::new(0);
        let far = Instant::now() + Duration::from_secs(60);
        let ok = retry_first_contact(far, || async {
            if tries.fetch_add(1, Ordering::SeqCst) == 0 { Err(unavailable()) } else { Ok(7) }
        })
        .await;
        assert_eq!((ok.unwrap_or_default(), tries.load(Ordering::SeqCst)), (7, 2));

        let started = Instant::now();
        assert_eq!(always(far, FIRST_CONTACT_RETRIES, unavailable).await, (1 + FIRST_CONTACT_RETRIES, true));
        assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());

        // Never past the deadline: with 100 ms left, no pause of 150 ms or more is taken.
        let started = Instant::now();
        let soon = started + Duration::from_millis(100);
        assert_eq!(always(soon, FIRST_CONTACT_RETRIES, unavailable).await, (1, true));
        assert!(started.elapsed().is_zero());

        // Busy answers and an Unavailable one in between: all retried.
        tries.store(0, Ordering::SeqCst);
        let mixed = retry_first_contact(far, || async {
            match tries.fetch_add(1, Ordering::SeqCst) {
                0 | 2 | 3 => Err(busy()),
                1 => Err(unavailable()),
                _ => Ok(9),
            }
        })
        .await;
        assert_eq!(mixed.unwrap_or_default(), 9);

        // Anything else is returned at once.
        let invalid = || KvError::InvalidArgument("no".into());
        assert_eq!(always(far, FIRST_CONTACT_RETRIES, invalid).await, (1, true));
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
