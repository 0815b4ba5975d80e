//! A session: one lease kept alive in the background, with a signal when it is lost
//! (like etcd's Go `concurrency.Session`).
//!
//! Sessions do not run a task each. Every session on one client (one `Arc<dyn Kv>`) is kept
//! alive by one *driver*, which refreshes the leases that are due together in
//! [`Kv::lease_keep_alive_many`] calls of at most [`MAX_REFRESH_BATCH`] leases, and a lease held by several sessions (the run lease
//! every handler of a run keeps alive) once. In a multi-thread runtime the driver runs on a
//! thread of its own: a task of a runtime busy with thousands of rendezvous tasks waits
//! behind every runnable task each time it wakes, and thousands of such waits used to add up
//! to lost leases in a process that was making progress. In a current-thread runtime (the
//! only kind whose clock tests may pause) it is a task of that runtime, on its clock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::KvError;
use crate::kv::{Kv, KvResult, LeaseId};
use crate::per_process::PerProcess;

/// One lease, refreshed every TTL/3 in the background until [`Session::close`] or drop.
///
/// If the lease cannot be refreshed before its TTL runs out (the server says it is gone, or
/// every refresh failed for a whole TTL, counted from when the grant or the last successful
/// refresh was *sent*), the session is *lost*: [`Session::lost`] fires and the keys bound to
/// it must be presumed deleted. The refreshes of all sessions on one client are batched and
/// do not compete with the caller's tasks in a multi-thread runtime (see the module docs).
#[derive(Debug)]
pub struct Session {
    kv: Arc<dyn Kv>,
    lease: LeaseId,
    ttl: Duration,
    lost: CancellationToken,
    stop: CancellationToken,
    revoke_on_drop: bool,
    /// Keeps the client's driver running while this session lives.
    _driver: Arc<Driver>,
}

impl Session {
    /// Grants a lease of `ttl` and starts keeping it alive. Must be called within a tokio
    /// runtime.
    pub async fn start(kv: Arc<dyn Kv>, ttl: Duration) -> KvResult<Session> {
        Session::start_observed(kv, ttl, None).await
    }

    /// [`start`](Session::start), telling `on_refresh_failure` of each refresh of the lease
    /// that fails (it is retried until the TTL runs out; then the session is lost). Called on
    /// the keep-alive driver's thread: it must return at once.
    pub async fn start_observed(
        kv: Arc<dyn Kv>,
        ttl: Duration,
        on_refresh_failure: Option<RefreshFailed>,
    ) -> KvResult<Session> {
        // The server's TTL may start as soon as the request leaves: count from the send, so
        // that our idea of the expiry is never later than the server's.
        let sent = Instant::now();
        let lease = kv.lease_grant(ttl).await?;
        Ok(Session::register(kv, lease, ttl, sent, true, on_refresh_failure))
    }

    /// Keeps an existing lease alive (e.g. one shared by several processes) without owning
    /// it: dropping or closing this session only stops the refreshing, it never revokes.
    /// Must be called within a tokio runtime.
    pub fn attach(kv: Arc<dyn Kv>, lease: LeaseId, ttl: Duration) -> Session {
        Session::register(kv, lease, ttl, Instant::now(), false, None)
    }

    fn register(
        kv: Arc<dyn Kv>,
        lease: LeaseId,
        ttl: Duration,
        granted: Instant,
        revoke_on_drop: bool,
        on_refresh_failure: Option<RefreshFailed>,
    ) -> Session {
        let lost = CancellationToken::new();
        let stop = CancellationToken::new();
        let holder = Holder {
            lost: lost.clone(),
            stop: stop.clone(),
            on_refresh_failure: on_refresh_failure.map(Hook),
        };
        let driver = Driver::of(&kv);
        let added = Add { lease, ttl, granted, holder };
        if driver.commands.send(added).is_err() {
            // The driver's runtime is shutting down: nothing will refresh this lease.
            tracing::warn!(lease, "no keep-alive driver (the runtime is shutting down): session lost");
            lost.cancel();
        }
        Session { kv, lease, ttl, lost, stop, revoke_on_drop, _driver: driver }
    }

    /// The lease id, to bind keys to this session.
    pub fn lease(&self) -> LeaseId {
        self.lease
    }

    /// The lease's TTL.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// A token cancelled when the lease is lost (never cancelled by a clean close).
    pub fn lost(&self) -> CancellationToken {
        self.lost.clone()
    }

    /// Whether the lease was lost.
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// Stops refreshing and revokes the lease, deleting its keys at once (only stops
    /// refreshing for a session made by [`Session::attach`]).
    pub async fn close(self) -> KvResult<()> {
        self.stop.cancel();
        if !self.revoke_on_drop {
            return Ok(());
        }
        match self.kv.lease_revoke(self.lease).await {
            Ok(()) | Err(KvError::LeaseNotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl Drop for Session {
    /// Stops refreshing and revokes the lease in the background (best effort: if it fails,
    /// the lease expires after its TTL anyway).
    fn drop(&mut self) {
        if self.stop.is_cancelled() {
            return;
        }
        self.stop.cancel();
        if !self.revoke_on_drop {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (kv, lease) = (self.kv.clone(), self.lease);
            runtime.spawn(async move {
                let _ = kv.lease_revoke(lease).await;
            });
        }
    }
}

/// The handle of one client's keep-alive driver; the driver ends when the last session
/// holding it is gone.
#[derive(Debug)]
struct Driver {
    commands: mpsc::UnboundedSender<Add>,
}

/// Which driver serves a session: the client (by the address of its `Kv`) and, for a
/// current-thread runtime, that runtime (its driver lives on it).
type DriverKey = (usize, Option<tokio::runtime::Id>);

/// The drivers of this process (a forked child starts without its parent's: their tasks ran
/// on threads the child does not have).
static DRIVERS: PerProcess<Mutex<HashMap<DriverKey, Weak<Driver>>>> = PerProcess::new(Default::default);

impl Driver {
    /// The driver of `kv` for the current runtime, started if there is none (or its
    /// runtime ended). Must be called within a tokio runtime.
    fn of(kv: &Arc<dyn Kv>) -> Arc<Driver> {
        let current = tokio::runtime::Handle::current();
        let own_thread = match current.runtime_flavor() {
            tokio::runtime::RuntimeFlavor::MultiThread => keep_alive_runtime(),
            _ => None,
        };
        let runtime = if own_thread.is_some() { None } else { Some(current.id()) };
        let key = (Arc::as_ptr(kv) as *const () as usize, runtime);
        let mut drivers = DRIVERS.get().lock().unwrap_or_else(|p| p.into_inner());
        if let Some(driver) = drivers.get(&key).and_then(Weak::upgrade)
            && !driver.commands.is_closed()
        {
            return driver;
        }
        drivers.retain(|_, driver| driver.strong_count() > 0);
        let (commands, received) = mpsc::unbounded_channel();
        let task = drive(kv.clone(), received);
        match own_thread {
            Some(runtime) => drop(runtime.spawn(task)),
            None => drop(current.spawn(task)),
        }
        let driver = Arc::new(Driver { commands });
        drivers.insert(key, Arc::downgrade(&driver));
        driver
    }
}

/// The runtime on a thread of its own that runs the drivers of sessions started in
/// multi-thread runtimes; `None` if it could not be started (they then run in the caller's
/// runtime). It lives as long as the process, so that whatever a backend starts from it
/// (a reconnection, a lease reaper) outlives any one driver. A forked child starts its own:
/// the parent's thread is not in the child, and a driver sent to its runtime would never
/// run (the child's sessions were never refreshed, and never reported lost).
fn keep_alive_runtime() -> Option<&'static tokio::runtime::Handle> {
    static RUNTIME: PerProcess<Option<tokio::runtime::Handle>> = PerProcess::new(|| {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
        let handle = runtime.handle().clone();
        std::thread::Builder::new()
            .name("rdzv-keepalive".into())
            .spawn(move || runtime.block_on(std::future::pending::<()>()))
            .ok()?;
        Some(handle)
    });
    RUNTIME.get().as_ref()
}

/// Told of a failed refresh of a session's lease: the lease, and what went wrong.
pub type RefreshFailed = Arc<dyn Fn(LeaseId, &str) + Send + Sync>;

/// A [`RefreshFailed`] that can be debugged.
#[derive(Clone)]
struct Hook(RefreshFailed);

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RefreshFailed")
    }
}

/// A session's interest in a lease.
#[derive(Debug, Clone)]
struct Holder {
    lost: CancellationToken,
    stop: CancellationToken,
    on_refresh_failure: Option<Hook>,
}

impl Holder {
    fn is_gone(&self) -> bool {
        self.stop.is_cancelled() || self.lost.is_cancelled()
    }
}

/// A session to keep alive.
#[derive(Debug)]
struct Add {
    lease: LeaseId,
    ttl: Duration,
    /// When the grant was sent (or, for an attached lease, now): the lease lasts at least
    /// `ttl` from then.
    granted: Instant,
    holder: Holder,
}

/// A lease the driver keeps alive.
#[derive(Debug)]
struct Entry {
    ttl: Duration,
    /// The server's deadline can only be later: it is counted from when the grant or the
    /// last successful refresh was sent.
    expires: Instant,
    next: Instant,
    in_flight: bool,
    holders: Vec<Holder>,
}

impl Entry {
    fn period(&self) -> Duration {
        self.ttl / 3
    }

    /// Tells the sessions still holding the lease that a refresh of it failed.
    fn refresh_failed(&self, lease: LeaseId, what: &str) {
        for holder in self.holders.iter().filter(|h| !h.is_gone()) {
            if let Some(Hook(told)) = &holder.on_refresh_failure {
                told(lease, what);
            }
        }
    }

    /// Tells every session still holding the lease that it is lost (a clean close is not).
    fn lose(&self, lease: LeaseId, why: &str) {
        tracing::warn!(lease, "session lease {why}: lost");
        for holder in &self.holders {
            if !holder.stop.is_cancelled() {
                holder.lost.cancel();
            }
        }
    }
}

/// The answers of one batch of refreshes, or the deadline of its earliest lease passed.
type Answers = Result<Vec<KvResult<Duration>>, tokio::time::error::Elapsed>;

/// One batch of refreshes: the leases, when it was sent, and the answers.
type Refresh = (Vec<LeaseId>, Instant, Answers);

/// Keeps the leases of one client alive until every session on it is gone.
async fn drive(kv: Arc<dyn Kv>, mut commands: mpsc::UnboundedReceiver<Add>) {
    let mut leases: HashMap<LeaseId, Entry> = HashMap::new();
    let mut refreshes: FuturesUnordered<BoxFuture<'static, Refresh>> = FuturesUnordered::new();
    // When to look for due refreshes: at or before the earliest `next` of the leases not in
    // flight (`None`: there are none). Kept up to date by what sets a `next` (an add, a
    // settled refresh) and computed afresh only after sending, because computing it on every
    // turn of the loop (every command, every answer) visited every lease: with 8,192 sessions
    // on one client and their holders added round after round, 8 million visits per round.
    // Too early is harmless (the wake finds nothing due and computes it again).
    let mut wake: Option<Instant> = None;
    loop {
        tokio::select! {
            command = commands.recv() => {
                // `None`: every session (and so every holder) is gone.
                let Some(first) = command else { return };
                wake = earliest(wake, add(&mut leases, first));
                while let Ok(more) = commands.try_recv() {
                    wake = earliest(wake, add(&mut leases, more));
                }
            }
            Some((batch, sent, result)) = refreshes.next(), if !refreshes.is_empty() => {
                wake = earliest(wake, settle(&mut leases, batch, sent, result));
            }
            _ = tokio::time::sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => {
                refreshes.extend(send_due(&kv, &mut leases));
                wake = leases.values().filter(|e| !e.in_flight).map(|e| e.next).min();
            }
        }
    }
}

/// The earlier of two optional instants (`None` is never).
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Adds a lease or a holder of it; returns the lease's `next` if it waits for it (none
/// while a refresh of it is in flight: its answer sets it).
fn add(leases: &mut HashMap<LeaseId, Entry>, added: Add) -> Option<Instant> {
    let Add { lease, ttl, granted, holder } = added;
    let (expires, next) = (granted + ttl, granted + ttl / 3);
    match leases.get_mut(&lease) {
        // Another session holds it already: one refresh serves both, on the earlier terms.
        Some(entry) => {
            entry.ttl = entry.ttl.min(ttl);
            entry.expires = entry.expires.min(expires);
            entry.next = entry.next.min(next);
            hold(&mut entry.holders, holder);
            (!entry.in_flight).then_some(entry.next)
        }
        None => {
            leases.insert(lease, Entry { ttl, expires, next, in_flight: false, holders: vec![holder] });
            Some(next)
        }
    }
}

/// Adds `holder` to a lease's holders, first dropping those gone if the list is full: the
/// run lease, held anew by every handler of a process round after round, would otherwise keep
/// every holder it had until its next refresh. At least as many adds come before the next such
/// look as holders stayed, so each add costs O(1) amortised.
fn hold(holders: &mut Vec<Holder>, holder: Holder) {
    if holders.len() == holders.capacity() {
        holders.retain(|h| !h.is_gone());
        holders.reserve(holders.len().max(1));
    }
    holders.push(holder);
}

/// At most this many leases go in one [`Kv::lease_keep_alive_many`] call. Each call has the
/// deadline of its earliest expiry, and a call that misses it tells nothing of any of its
/// leases: in one call of thousands, the one lease that was nearly expired used to take the
/// answers of all the others with it, and every one of them was then lost.
pub const MAX_REFRESH_BATCH: usize = 256;

/// Starts the refresh of every lease that is due (or nearly: a lease due within an eighth
/// of its period goes along, so that leases granted together stay in one call), in calls of
/// at most [`MAX_REFRESH_BATCH`] leases, the earliest-expiring first. A due lease that no
/// session holds any more is forgotten instead.
///
/// Only the due leases' sessions are looked at: a wake comes about every eighth of a period,
/// and looking at every session each time (each look takes a lock of each of its two tokens)
/// was a sixth of this thread's CPU with 98,304 sessions on one client. A closed session's
/// lease is thus refreshed no more, but forgotten only when it would have been due.
fn send_due(kv: &Arc<dyn Kv>, leases: &mut HashMap<LeaseId, Entry>) -> Vec<BoxFuture<'static, Refresh>> {
    let now = Instant::now();
    let mut due = Vec::new();
    leases.retain(|&lease, entry| {
        if entry.in_flight || entry.next > now + entry.period() / 8 {
            return true;
        }
        entry.holders.retain(|h| !h.is_gone());
        if entry.holders.is_empty() {
            return false;
        }
        if entry.expires <= now {
            entry.lose(lease, "expired before it could be refreshed");
            return false;
        }
        entry.in_flight = true;
        due.push((entry.expires, lease));
        true
    });
    due.sort_unstable();
    due.chunks(MAX_REFRESH_BATCH)
        .map(|chunk| {
            let deadline = chunk[0].0;
            let batch: Vec<LeaseId> = chunk.iter().map(|(_, lease)| *lease).collect();
            let kv = kv.clone();
            Box::pin(async move {
                let result = tokio::time::timeout_at(deadline, kv.lease_keep_alive_many(&batch)).await;
                (batch, now, result)
            }) as BoxFuture<'static, Refresh>
        })
        .collect()
}

/// Applies the answers of one refresh; returns the earliest `next` it set.
fn settle(
    leases: &mut HashMap<LeaseId, Entry>,
    batch: Vec<LeaseId>,
    sent: Instant,
    result: Answers,
) -> Option<Instant> {
    let now = Instant::now();
    let mut wake = None;
    let mut answers = match result {
        Ok(answers) => answers.into_iter(),
        Err(_) => Vec::new().into_iter(),
    };
    for lease in batch {
        let answer = answers.next();
        let Some(entry) = leases.get_mut(&lease) else { continue };
        entry.in_flight = false;
        let period = entry.period();
        let lost = match answer {
            Some(Ok(granted)) => {
                entry.expires = sent + granted.min(entry.ttl).max(period);
                entry.next = sent + period;
                None
            }
            Some(Err(KvError::LeaseNotFound(_))) => {
                entry.refresh_failed(lease, "the lease was not found on the server");
                Some("not found on the server")
            }
            failed => {
                match failed {
                    Some(Err(e)) => {
                        tracing::debug!(lease, error = %e, "lease refresh failed; retrying");
                        entry.refresh_failed(lease, &e.to_string());
                    }
                    _ => entry.refresh_failed(lease, "no answer before the lease's TTL ran out"),
                }
                if entry.expires <= now {
                    Some("not refreshed within its TTL")
                } else {
                    entry.next = now + (period / 4).max(Duration::from_millis(50));
                    None
                }
            }
        };
        if let Some(why) = lost {
            // A lease whose sessions all closed meanwhile (revoked while this refresh was
            // in flight) is not lost: forget it quietly.
            if entry.holders.iter().any(|h| !h.is_gone()) {
                entry.lose(lease, why);
            }
            leases.remove(&lease);
        } else {
            wake = earliest(wake, Some(entry.next));
        }
    }
    wake
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::stub::{STUB_TTL as TTL, Stub};

    #[tokio::test(start_paused = true)]
    async fn sessions_of_one_client_share_one_refresh_per_period() {
        let stub = Arc::new(Stub::default());
        let kv: Arc<dyn Kv> = stub.clone();
        let mut sessions = Vec::new();
        for _ in 0..100 {
            sessions.push(Session::start(kv.clone(), TTL).await.unwrap());
        }
        let run = Session::start(kv.clone(), TTL).await.unwrap();
        let attached: Vec<Session> =
            (0..100).map(|_| Session::attach(kv.clone(), run.lease(), TTL)).collect();
        // Refreshes are due at 3 s and 6 s (TTL/3 after the previous one was sent).
        tokio::time::sleep(TTL - Duration::from_millis(500)).await;
        let batches: Vec<Vec<LeaseId>> = stub.refreshes().iter().map(|r| r.leases()).collect();
        assert_eq!(batches.len(), 2, "one refresh call per period for all sessions: {batches:?}");
        for batch in &batches {
            let distinct: HashSet<_> = batch.iter().collect();
            assert_eq!((batch.len(), distinct.len()), (101, 101), "each lease once per call");
        }
        assert!(sessions.iter().chain(&attached).chain([&run]).all(|s| !s.is_lost()));
    }

    #[tokio::test(start_paused = true)]
    async fn thousands_of_leases_are_refreshed_in_bounded_calls() {
        let stub = Arc::new(Stub::default());
        let kv: Arc<dyn Kv> = stub.clone();
        let mut sessions = Vec::new();
        for _ in 0..(2 * MAX_REFRESH_BATCH + 10) {
            sessions.push(Session::start(kv.clone(), TTL).await.unwrap());
        }
        tokio::time::sleep(TTL / 3 + Duration::from_millis(500)).await;
        let calls: Vec<Vec<LeaseId>> = stub.refreshes().iter().map(|r| r.leases()).collect();
        let sizes: Vec<usize> = calls.iter().map(Vec::len).collect();
        assert_eq!(sizes, [MAX_REFRESH_BATCH, MAX_REFRESH_BATCH, 10], "calls of at most the bound");
        let refreshed: HashSet<_> = calls.iter().flatten().collect();
        assert_eq!(refreshed.len(), sessions.len(), "every lease once");
        assert!(sessions.iter().all(|s| !s.is_lost()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_gone_from_the_server_loses_its_sessions_only() {
        let stub = Arc::new(Stub::default());
        let kv: Arc<dyn Kv> = stub.clone();
        let kept = Session::start(kv.clone(), TTL).await.unwrap();
        let doomed = Session::start(kv.clone(), TTL).await.unwrap();
        let doomed_too = Session::attach(kv.clone(), doomed.lease(), TTL);
        let closed = Session::start(kv.clone(), TTL).await.unwrap();
        let closed_lost = closed.lost();
        stub.forget([doomed.lease(), closed.lease()]);
        closed.close().await.unwrap();
        tokio::time::sleep(TTL / 2).await;
        assert!(doomed.is_lost() && doomed_too.is_lost(), "both holders of the gone lease are told");
        assert!(!kept.is_lost(), "the other lease is unaffected");
        assert!(!closed_lost.is_cancelled(), "a clean close is never a loss");
    }

    #[tokio::test(start_paused = true)]
    async fn each_failed_refresh_is_told_to_its_session_only() {
        let stub = Arc::new(Stub::default());
        let kv: Arc<dyn Kv> = stub.clone();
        let told = Arc::new(Mutex::new(Vec::new()));
        let into = told.clone();
        let hook: RefreshFailed =
            Arc::new(move |lease, what: &str| into.lock().unwrap().push((lease, what.to_string())));
        let observed = Session::start_observed(kv.clone(), TTL, Some(hook)).await.unwrap();
        let _quiet = Session::start(kv.clone(), TTL).await.unwrap();
        tokio::time::sleep(TTL / 2).await;
        assert!(told.lock().unwrap().is_empty(), "refreshes that succeed are not failures");
        stub.set_failing(true);
        observed.lost().cancelled().await;
        let told = told.lock().unwrap().clone();
        assert!(told.len() > 2, "every retry is told: {told:?}");
        assert!(told.iter().all(|(lease, _)| *lease == observed.lease()), "only its own lease: {told:?}");
        assert!(told[0].1.contains("out of reach"), "with the backend's words: {told:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_whose_refreshes_fail_for_a_ttl_is_lost_then() {
        let stub = Arc::new(Stub::default());
        let kv: Arc<dyn Kv> = stub.clone();
        let started = Instant::now();
        let session = Session::start(kv.clone(), TTL).await.unwrap();
        stub.set_failing(true);
        session.lost().cancelled().await;
        let after = started.elapsed();
        assert!(after >= TTL && after < TTL + Duration::from_secs(1), "lost after {after:?}, TTL {TTL:?}");
        assert!(stub.refreshes().len() > 3, "retried before giving up: {:?}", stub.refreshes());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_held_again_with_a_shorter_ttl_is_refreshed_on_the_shorter_period() {
        let stub = Arc::new(Stub::default());
        let kv: Arc<dyn Kv> = stub.clone();
        let long = Session::start(kv.clone(), Duration::from_secs(30)).await.unwrap();
        let short = Session::attach(kv.clone(), long.lease(), Duration::from_secs(3));
        // Due at 1 s (a third of 3 s), not at 10 s (a third of 30 s); the next at 2 s.
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let refreshed: Vec<LeaseId> = stub.refreshes().iter().flat_map(|r| r.leases()).collect();
        assert_eq!(refreshed, [long.lease()], "refreshed once, on the shorter period");
        assert!(!long.is_lost() && !short.is_lost());
    }

    #[test]
    fn a_lease_held_anew_again_and_again_keeps_room_for_its_live_holders_only() {
        let holder = || Holder {
            lost: CancellationToken::new(),
            stop: CancellationToken::new(),
            on_refresh_failure: None,
        };
        let mut holders: Vec<Holder> = (0..10).map(|_| holder()).collect();
        for _ in 0..10_000 {
            let next = holder();
            hold(&mut holders, next.clone());
            next.stop.cancel();
        }
        assert_eq!(holders.iter().filter(|h| !h.is_gone()).count(), 10, "the live holders stay");
        assert!(holders.capacity() <= 64, "the gone ones do not pile up: room for {}", holders.capacity());
    }

    #[tokio::test(start_paused = true)]
    async fn leases_granted_apart_are_each_refreshed_once_a_period_and_a_closed_one_never() {
        let stub = Arc::new(Stub::default());
        let kv: Arc<dyn Kv> = stub.clone();
        let first = Session::start(kv.clone(), TTL).await.unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let second = Session::start(kv.clone(), TTL).await.unwrap();
        let closed = Session::start(kv.clone(), TTL).await.unwrap();
        let closed_lease = closed.lease();
        closed.close().await.unwrap();
        // Periods of 3 s: the first is due at 3, 6 and 9 s, the second at 5 and 8 s.
        tokio::time::sleep(Duration::from_millis(7_500)).await;
        let calls: Vec<Vec<LeaseId>> = stub.refreshes().iter().map(|r| r.leases()).collect();
        let (a, b) = (first.lease(), second.lease());
        assert_eq!(calls, [vec![a], vec![b], vec![a], vec![b], vec![a]], "in the order they came due");
        assert!(
            !calls.iter().flatten().any(|&l| l == closed_lease),
            "a closed session's lease is not refreshed"
        );
        assert!(!first.is_lost() && !second.is_lost());
    }
}
