//! The project's one retry policy: pauses that grow from a first to a longest one, each with
//! jitter, and the one loop that takes them ([`RetryPolicy::run`]). Every retry in the
//! workspace is one of these with pauses of its own — the protocol's, a backend client's own
//! (Redis's repeatable requests and reconnections, etcd's watch resumption), the round
//! monitor's, the agent's, the Store's; which errors are retried is each caller's choice.
//! [`retry_while_busy`] and [`retry_first_contact`] are the two choices the handlers and
//! clients share.

use std::future::Future;
use std::time::Duration;

use backon::BackoffBuilder;
use tokio::time::Instant;

use crate::error::KvError;
use crate::kv::KvResult;

/// How a failed operation is tried again: after pauses growing exponentially from `first` up
/// to `longest`, each with jitter of up to as much again (so that many clients that failed
/// together do not come back in lockstep against a recovering server), for as long as the
/// caller allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The first pause (before jitter).
    pub first: Duration,
    /// The longest pause (before jitter).
    pub longest: Duration,
}

impl RetryPolicy {
    /// The protocol's: an attempt's backend errors, starting a new session, deleting old
    /// rounds. 50 ms growing to 2 s.
    pub const PROTOCOL: RetryPolicy = RetryPolicy::new(Duration::from_millis(50), Duration::from_secs(2));
    /// A backend client's own, for a request or a reconnection it can repeat: 50 ms growing
    /// to 500 ms (within the client's request timeout).
    pub const CLIENT: RetryPolicy = RetryPolicy::new(Duration::from_millis(50), Duration::from_millis(500));
    /// A server that answers it cannot serve now ([`KvError::Busy`]: a leader election, an
    /// overload): 50 ms growing to 1 s.
    pub const BUSY: RetryPolicy = RetryPolicy::new(Duration::from_millis(50), Duration::from_secs(1));

    /// Pauses from `first` growing to `longest`.
    pub const fn new(first: Duration, longest: Duration) -> RetryPolicy {
        RetryPolicy { first, longest }
    }

    /// The pauses, each with jitter, never running out.
    pub fn pauses(self) -> impl Iterator<Item = Duration> + Send + 'static {
        backon::ExponentialBuilder::default()
            .with_min_delay(self.first)
            .with_max_delay(self.longest)
            .with_jitter()
            .without_max_times()
            .build()
    }

    /// Runs `op` until it succeeds, fails with an error that `retry` refuses, or the next try
    /// would start at or after `deadline` (if any; then the last error is returned): the one
    /// retry loop. A try that lasted longer than the longest pause (a wait that was answered,
    /// then broke) starts the pauses from the first again.
    pub async fn run<T, E, F, Fut>(
        self,
        deadline: Option<Instant>,
        mut retry: impl FnMut(&E) -> bool,
        mut op: F,
    ) -> Result<T, E>
    where
        E: std::fmt::Display,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let mut pauses = self.pauses();
        loop {
            let started = Instant::now();
            let error = match op().await {
                Err(e) if retry(&e) => e,
                done => return done,
            };
            if started.elapsed() > self.longest {
                pauses = self.pauses();
            }
            let pause = pauses.next().unwrap_or(2 * self.longest);
            if deadline.is_some_and(|deadline| Instant::now() + pause >= deadline) {
                return Err(error);
            }
            tracing::debug!(%error, ?pause, "retrying");
            tokio::time::sleep(pause).await;
        }
    }
}

/// Runs `op` again after each [`KvError::Busy`] answer ([`RetryPolicy::BUSY`]), until it
/// succeeds, fails otherwise, or the next try would start after `deadline` (then the last
/// `Busy` is returned). Any other error is returned at once: a server that cannot be reached
/// still fails fast.
pub async fn retry_while_busy<T, F, Fut>(deadline: Instant, op: F) -> KvResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = KvResult<T>>,
{
    RetryPolicy::BUSY.run(Some(deadline), KvError::is_busy, op).await
}

/// How many more times [`retry_first_contact`] asks after an
/// [`Unavailable`](KvError::Unavailable) answer.
pub const FIRST_CONTACT_RETRIES: u32 = 2;
/// The pauses of [`retry_first_contact`]: the first, 150 ms, and twice that after it, jitter
/// adding up to as much again to each (under 1 s in all for its `Unavailable` retries).
pub const FIRST_CONTACT: RetryPolicy =
    RetryPolicy::new(Duration::from_millis(150), Duration::from_millis(300));

/// [`retry_while_busy`], and also an [`Unavailable`](KvError::Unavailable) answer is
/// asked again, at most [`FIRST_CONTACT_RETRIES`] more times, after the pauses of
/// [`FIRST_CONTACT`] (under 1 s in all), never starting a try after `deadline`. For a first
/// request that is safe to repeat, such as a session's lease grant (a grant whose answer was
/// lost leaves a lease with no key, which expires by its TTL): a client whose connection was
/// just reset fails the next request once and reconnects, and that reconnection is used; a
/// server that cannot be reached at all still fails within about a second (plus the tries'
/// own time), with the last `Unavailable`. Any other error is returned at once.
pub async fn retry_first_contact<T, F, Fut>(deadline: Instant, op: F) -> KvResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = KvResult<T>>,
{
    let mut unavailable = FIRST_CONTACT_RETRIES;
    let retry = move |e: &KvError| match e {
        KvError::Unavailable { .. } => unavailable.checked_sub(1).map(|left| unavailable = left).is_some(),
        e => e.is_busy(),
    };
    FIRST_CONTACT.run(Some(deadline), retry, op).await
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

    /// A first contact (`first`) or else a wait while busy, on an operation that always fails
    /// with `error()`: how many tries it made, and whether it ended with that error.
    async fn always(deadline: Instant, first: bool, error: fn() -> KvError) -> (u32, bool) {
        let tries = AtomicU32::new(0);
        let op = || async {
            tries.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>(error())
        };
        let last = if first {
            retry_first_contact(deadline, op).await
        } else {
            retry_while_busy(deadline, op).await
        };
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

        let (_, busy_last) = always(deadline, false, busy).await;
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
        assert_eq!(always(far, false, unavailable).await, (1, true), "unreachable fails fast");
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
        assert_eq!(always(far, true, unavailable).await, (1 + FIRST_CONTACT_RETRIES, true));
        assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());

        // Never past the deadline: with 100 ms left, no pause of 150 ms or more is taken.
        let started = Instant::now();
        let soon = started + Duration::from_millis(100);
        assert_eq!(always(soon, true, unavailable).await, (1, true));
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
        assert_eq!(always(far, true, invalid).await, (1, true));
    }

    /// The loop starts its pauses again after a try that lasted longer than the longest: the
    /// pauses of a wait that was answered for a while, then broke, are short again.
    #[tokio::test(start_paused = true)]
    async fn a_long_try_starts_the_pauses_again() {
        const LONG_TRY: u32 = 6;
        let policy = RetryPolicy::new(Duration::from_millis(100), Duration::from_secs(1));
        let starts = std::sync::Mutex::new(Vec::new());
        let done = policy
            .run(
                None,
                |_: &KvError| true,
                || {
                    let n = {
                        let mut starts = starts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                        starts.push(Instant::now());
                        starts.len() as u32 - 1
                    };
                    async move {
                        if n == LONG_TRY {
                            tokio::time::sleep(Duration::from_secs(5)).await;
                        }
                        if n < LONG_TRY + 1 { Err(busy()) } else { Ok(n) }
                    }
                },
            )
            .await;
        assert_eq!(done.unwrap_or_default(), LONG_TRY + 1);
        let starts = starts.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
        let pause = |n: usize| starts[n + 1] - starts[n];
        assert!(
            pause(LONG_TRY as usize - 1) >= Duration::from_secs(1),
            "the pauses did not grow: {starts:?}"
        );
        let after_long = pause(LONG_TRY as usize) - Duration::from_secs(5);
        assert!(after_long <= Duration::from_millis(200), "the pause after the long try was {after_long:?}");
    }

    #[test]
    fn delays_grow_to_the_cap_with_jitter() {
        let delays: Vec<Duration> = RetryPolicy::BUSY.pauses().take(12).collect();
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
        let delays = || -> Vec<Duration> { RetryPolicy::BUSY.pauses().take(8).collect() };
        assert_ne!(delays(), delays());
    }
}
