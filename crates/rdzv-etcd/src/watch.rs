//! Watches: every watch of one client is multiplexed on one gRPC watch stream, as etcd's Go
//! client does, and etcd's responses are flattened into [`Event`]s.
//!
//! Why one stream: each watch on its own HTTP/2 stream costs a stream reset when it is
//! dropped, and h2 closes a connection after 1,024 locally reset streams
//! (`too_many_internal_resets`), failing every request in flight on it — a thousand
//! handlers leaving at once did exactly that. On the shared stream a watch is ended by a
//! cancel request instead.
//!
//! How: a driver task per client owns the stream (opened lazily with the first watch). It
//! sends creates in order and matches each `created` answer to the oldest create not yet
//! answered (etcd handles the requests of one stream in order and answers creates in that
//! order), then routes responses by watch id to per-watch channels. Compaction ends the one
//! watch it concerns with [`KvError::Compacted`]. When the stream breaks, it is reopened
//! (failing over between members) with every live watch re-created from its last delivered
//! revision + 1, with bounded, growing pauses between attempts; then the watches end with
//! an error.
//!
//! Each watch's events wait in its own unbounded queue until read, as in the Go client: a
//! reader that falls behind costs memory but never stalls the other watches of the client.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use etcd_client::{WatchOptions, WatchResponse, WatchResponseStream};
use futures::{Stream, StreamExt};
use rdzv_core::{Event, EventKind, KeyValue, KvError, KvResult, Revision, WatchStream};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::client::Shared;
use crate::error::{self, BACKEND, Context};
use crate::keys::Namespace;

/// Attempts to reopen a broken stream before giving up, with pauses from 100 ms doubling up
/// to 2 s (about 10 s in all, plus the attempts themselves).
const RESUME_ATTEMPTS: usize = 8;
const RESUME_MIN_DELAY: Duration = Duration::from_millis(100);
const RESUME_MAX_DELAY: Duration = Duration::from_secs(2);

/// What to watch.
pub(crate) struct Target {
    pub shared: Arc<Shared>,
    pub namespace: Namespace,
    /// The etcd key (namespaced).
    pub key: Vec<u8>,
    /// The etcd range end for a prefix watch.
    pub range_end: Option<Vec<u8>>,
    pub request_timeout: Duration,
}

/// Opens the watch from `start` (≥ 1) on the client's shared stream and waits until etcd
/// has registered it. Fails at once if the cluster cannot be reached, or with `Timeout`
/// after the request timeout; once open, breaks are resumed inside the stream.
pub(crate) async fn open(target: Target, start: Revision) -> KvResult<WatchStream> {
    static TOKENS: AtomicU64 = AtomicU64::new(1);
    let token = TOKENS.fetch_add(1, Ordering::Relaxed);
    let commands = target.shared.watches.sender(&target.shared);
    let (events, received) = mpsc::unbounded_channel();
    let (reply, replied) = oneshot::channel();
    // Built first, so that giving up below (timeout, cancelled caller) cancels the watch.
    let subscription = Subscription {
        token,
        events: received,
        pending: VecDeque::new(),
        commands: commands.clone(),
        done: false,
        shared: target.shared.clone(),
    };
    let watch = Watch {
        namespace: target.namespace,
        key: target.key,
        range_end: target.range_end,
        next: start,
        events,
        reply: Some(reply),
        id: None,
        request_timeout: target.request_timeout,
        token_renewed: false,
    };
    let ctx = target.shared.context(target.request_timeout, None);
    if commands.send(Command::Create { token, watch: Box::new(watch) }).is_err() {
        return Err(driver_gone(&target.shared.endpoints));
    }
    match tokio::time::timeout(target.request_timeout, replied).await {
        Ok(Ok(Ok(()))) => Ok(subscription.boxed()),
        Ok(Ok(Err(e))) => Err(e),
        Ok(Err(_)) => Err(driver_gone(&target.shared.endpoints)),
        Err(_) => Err(error::timeout("watch", ctx)),
    }
}

fn driver_gone(endpoints: &str) -> KvError {
    KvError::Unavailable {
        backend: BACKEND,
        endpoint: endpoints.to_string(),
        message: "the client's watch stream stopped (was its tokio runtime shut down?); \
                  connect again from a running runtime"
            .to_string(),
        source: None,
    }
}

/// The per-client handle on the driver task; it starts the task on first use, and again if
/// it ended (its runtime shut down).
#[derive(Default)]
pub(crate) struct Mux {
    commands: Mutex<Option<mpsc::UnboundedSender<Command>>>,
}

impl Mux {
    fn sender(&self, shared: &Arc<Shared>) -> mpsc::UnboundedSender<Command> {
        let mut commands = self.commands.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(sender) = commands.as_ref().filter(|s| !s.is_closed()) {
            return sender.clone();
        }
        let (sender, receiver) = mpsc::unbounded_channel();
        // Weak: the task must not keep the client alive; it ends when the last sender (the
        // client's and the open watches') is gone.
        let driver = Driver {
            shared: Arc::downgrade(shared),
            endpoints: shared.endpoints.clone(),
            commands: receiver,
            watches: BTreeMap::new(),
            ids: HashMap::new(),
            creating: VecDeque::new(),
            link: None,
            backoff: None,
            retry_at: None,
            last_error: None,
            renew_token: false,
        };
        tokio::spawn(driver.run());
        *commands = Some(sender.clone());
        sender
    }
}

/// What a watch's channel carries: the events of one response, or the error that ends it.
type Batch = KvResult<Vec<Event>>;

enum Command {
    Create {
        token: u64,
        watch: Box<Watch>,
    },
    /// The watch's stream was dropped.
    Cancel {
        token: u64,
    },
}

/// One live watch, as the driver knows it.
struct Watch {
    namespace: Namespace,
    key: Vec<u8>,
    range_end: Option<Vec<u8>>,
    /// The revision to (re)start from: the last delivered event's + 1.
    next: Revision,
    events: mpsc::UnboundedSender<Batch>,
    /// Waiting for etcd's first `created` answer.
    reply: Option<oneshot::Sender<KvResult<()>>>,
    /// etcd's id for it on the current stream, once created.
    id: Option<i64>,
    request_timeout: Duration,
    /// Being re-created on a fresh stream because etcd refused the last stream's token
    /// (once: a second refusal fails the watch).
    token_renewed: bool,
}

impl Watch {
    fn options(&self) -> WatchOptions {
        let mut options = WatchOptions::new().with_start_revision(self.next);
        if let Some(end) = &self.range_end {
            options = options.with_range(end.clone());
        }
        options
    }

    /// Ends the watch with `error` (on the stream, or as the answer to its creation).
    fn fail(self, error: KvError) {
        match self.reply {
            Some(reply) => {
                let _ = reply.send(Err(error));
            }
            None => {
                let _ = self.events.send(Err(error));
            }
        }
    }

    /// The events of `response` not yet delivered, as [`Event`]s.
    fn absorb(&mut self, response: &WatchResponse) -> Vec<Event> {
        let mut batch = Vec::with_capacity(response.events().len());
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            // etcd marks a delete by a zero create revision (it is how its own watchers tell);
            // this also avoids etcd-client's panicking conversion of unknown event types.
            let kind = if kv.create_revision() == 0 { EventKind::Delete } else { EventKind::Put };
            if kv.mod_revision() < self.next {
                // Already delivered before a resume; never hand out a duplicate.
                continue;
            }
            let kv = match kind {
                EventKind::Put => self.namespace.convert(kv.clone()),
                EventKind::Delete => KeyValue {
                    key: self.namespace.strip(kv.key().to_vec()),
                    value: Vec::new(),
                    create_revision: 0,
                    mod_revision: kv.mod_revision(),
                    version: 0,
                    lease: None,
                },
            };
            batch.push(Event { kind, kv });
        }
        if let Some(last) = batch.last() {
            self.next = last.revision() + 1;
        }
        batch
    }
}

/// A request for the stream, sent by the writer task.
enum Outgoing {
    Create(Vec<u8>, WatchOptions),
    Cancel(i64),
}

/// The open stream.
struct Link {
    requests: mpsc::UnboundedSender<Outgoing>,
    responses: WatchResponseStream,
}

struct Driver {
    shared: Weak<Shared>,
    endpoints: String,
    commands: mpsc::UnboundedReceiver<Command>,
    /// Live watches by token (ordered, so that re-creation follows creation order).
    watches: BTreeMap<u64, Watch>,
    /// etcd watch id → token, on the current stream.
    ids: HashMap<i64, u64>,
    /// Tokens whose create was sent on the current stream and not yet answered, in order.
    creating: VecDeque<u64>,
    link: Option<Link>,
    /// Pauses left for reopening, while reopening.
    backoff: Option<ExponentialBackoff>,
    /// When to try reopening the broken stream.
    retry_at: Option<Instant>,
    last_error: Option<String>,
    /// Renew the client's auth token before reopening.
    renew_token: bool,
}

enum Step {
    Command(Option<Command>),
    Message(Result<Option<WatchResponse>, etcd_client::Error>),
    Retry,
}

impl Driver {
    async fn run(mut self) {
        loop {
            let retry_at = self.retry_at;
            let step = tokio::select! {
                command = self.commands.recv() => Step::Command(command),
                message = next_message(&mut self.link) => Step::Message(message),
                () = sleep_until(retry_at) => Step::Retry,
            };
            match step {
                Step::Command(None) => return,
                Step::Command(Some(Command::Create { token, watch })) => self.create(token, *watch).await,
                Step::Command(Some(Command::Cancel { token })) => self.cancel(token),
                Step::Message(Ok(Some(response))) => self.route(response),
                Step::Message(Ok(None)) => {
                    self.broken(None, "the server closed the watch stream".to_string())
                }
                Step::Message(Err(e)) => {
                    let timeout = self.watches.values().next().map_or(Duration::ZERO, |w| w.request_timeout);
                    let ctx = Context { endpoints: &self.endpoints, lease: None, timeout };
                    let error = error::classify("watch", e, ctx);
                    if error.is_retryable() {
                        self.broken(Some(error), String::new());
                    } else {
                        self.fail_all(|_| error.duplicate());
                    }
                }
                Step::Retry => self.reopen().await,
            }
        }
    }

    async fn create(&mut self, token: u64, watch: Watch) {
        let request = (watch.key.clone(), watch.options());
        self.watches.insert(token, watch);
        if let Some(link) = &self.link {
            self.creating.push_back(token);
            // A closed writer means the stream ended: its end, read next, re-creates this.
            let _ = link.requests.send(Outgoing::Create(request.0, request.1));
            return;
        }
        // No stream (none yet, or broken and waiting for its next attempt): open it now,
        // so that an unreachable cluster fails this call at once.
        if let Err(e) = self.connect().await {
            if let Some(watch) = self.watches.remove(&token) {
                watch.fail(e);
            }
            if self.watches.is_empty() {
                self.retry_at = None;
                self.backoff = None;
            }
        }
    }

    fn cancel(&mut self, token: u64) {
        let Some(watch) = self.watches.remove(&token) else { return };
        if let (Some(id), Some(link)) = (watch.id, &self.link) {
            self.ids.remove(&id);
            let _ = link.requests.send(Outgoing::Cancel(id));
        }
        // A create still unanswered is cancelled when its answer comes (see `route`).
    }

    fn route(&mut self, response: WatchResponse) {
        // Any answer means the stream works: a later break gets fresh attempts.
        self.backoff = None;
        let id = response.watch_id();
        if response.created() {
            let Some(token) = self.creating.pop_front() else {
                tracing::warn!(endpoints = %self.endpoints, id, "etcd answered a watch create never sent");
                return;
            };
            let Some(watch) = self.watches.get_mut(&token) else {
                // Dropped while being created.
                if !response.canceled() {
                    self.send(Outgoing::Cancel(id));
                }
                return;
            };
            if response.canceled() && !watch.token_renewed && response.cancel_reason().contains("auth token")
            {
                // The stream carries the token it was opened with, which etcd may have
                // dropped since (after its TTL unused, or a restart) while requests moved on
                // to a new one: reopen with a fresh token, re-creating every watch.
                watch.token_renewed = true;
                tracing::debug!(endpoints = %self.endpoints, "etcd refused the watch stream's token; reopening");
                self.detach();
                self.renew_token = true;
                self.retry_at = Some(Instant::now());
                return;
            }
            if response.canceled() {
                let reason = response.cancel_reason();
                let error = KvError::backend(
                    BACKEND,
                    format!(
                        "etcd refused the watch at {}: {}",
                        self.endpoints,
                        if reason.is_empty() { "no reason given" } else { reason }
                    ),
                );
                if let Some(mut watch) = self.watches.remove(&token) {
                    // As before multiplexing: the call succeeds and the stream yields the error.
                    if let Some(reply) = watch.reply.take() {
                        let _ = reply.send(Ok(()));
                    }
                    watch.fail(error);
                }
                return;
            }
            watch.id = Some(id);
            // A later refusal (after another expiry) deserves another renewal.
            watch.token_renewed = false;
            if let Some(reply) = watch.reply.take() {
                let _ = reply.send(Ok(()));
            }
            self.ids.insert(id, token);
        }
        let Some(&token) = self.ids.get(&id) else {
            // Events of a watch being cancelled, or the answer to our cancel.
            return;
        };
        if response.compact_revision() > 0 || response.canceled() {
            self.ids.remove(&id);
            let Some(watch) = self.watches.remove(&token) else { return };
            let error = if response.compact_revision() > 0 {
                KvError::Compacted { requested: watch.next, oldest: response.compact_revision() }
            } else {
                let reason = response.cancel_reason();
                KvError::backend(
                    BACKEND,
                    format!(
                        "etcd cancelled the watch at {}: {}",
                        self.endpoints,
                        if reason.is_empty() { "no reason given" } else { reason }
                    ),
                )
            };
            watch.fail(error);
            return;
        }
        let Some(watch) = self.watches.get_mut(&token) else { return };
        let batch = watch.absorb(&response);
        if !batch.is_empty() && watch.events.send(Ok(batch)).is_err() {
            // The stream was dropped; its cancel command is on its way.
            self.cancel(token);
        }
    }

    fn send(&self, request: Outgoing) {
        if let Some(link) = &self.link {
            let _ = link.requests.send(request);
        }
    }

    /// The stream broke with a retryable error: drop it, fail the watches not yet created
    /// (their callers are waiting), and reopen for the others at once.
    fn broken(&mut self, error: Option<KvError>, why: String) {
        let why = error.as_ref().map_or(why, |e| e.to_string());
        tracing::debug!(endpoints = %self.endpoints, %why, "etcd watch stream broken; resuming");
        self.detach();
        let unanswered: Vec<u64> =
            self.watches.iter().filter(|(_, w)| w.reply.is_some()).map(|(token, _)| *token).collect();
        for token in unanswered {
            if let Some(watch) = self.watches.remove(&token) {
                let e = error.as_ref().map_or_else(|| self.unavailable(why.clone()), KvError::duplicate);
                watch.fail(e);
            }
        }
        self.last_error = Some(why);
        self.retry_at = if self.watches.is_empty() { None } else { Some(Instant::now()) };
    }

    /// Forgets the current stream; the watches stay, to be re-created on the next.
    fn detach(&mut self) {
        self.link = None;
        self.ids.clear();
        self.creating.clear();
        for watch in self.watches.values_mut() {
            watch.id = None;
        }
    }

    fn unavailable(&self, message: String) -> KvError {
        KvError::Unavailable { backend: BACKEND, endpoint: self.endpoints.clone(), message, source: None }
    }

    /// Ends every watch with the error `error_for` gives it, and forgets the stream.
    fn fail_all(&mut self, error_for: impl Fn(&Watch) -> KvError) {
        self.link = None;
        self.ids.clear();
        self.creating.clear();
        self.retry_at = None;
        self.backoff = None;
        for (_, watch) in std::mem::take(&mut self.watches) {
            let error = error_for(&watch);
            watch.fail(error);
        }
    }

    /// One attempt to reopen the broken stream; schedules the next, or gives up.
    async fn reopen(&mut self) {
        self.retry_at = None;
        if self.watches.is_empty() || self.link.is_some() {
            self.backoff = None;
            return;
        }
        match self.connect().await {
            Ok(()) => {
                tracing::debug!(endpoints = %self.endpoints, watches = self.watches.len(), "etcd watch stream resumed");
            }
            Err(e) if e.is_retryable() => {
                self.last_error = Some(e.to_string());
                let backoff = self.backoff.get_or_insert_with(|| {
                    ExponentialBuilder::default()
                        .with_min_delay(RESUME_MIN_DELAY)
                        .with_max_delay(RESUME_MAX_DELAY)
                        .with_max_times(RESUME_ATTEMPTS)
                        .build()
                });
                match backoff.next() {
                    Some(pause) => self.retry_at = Some(Instant::now() + pause),
                    None => {
                        let last = self.last_error.clone().unwrap_or_else(|| "none".to_string());
                        let endpoints = self.endpoints.clone();
                        self.fail_all(|watch| KvError::Unavailable {
                            backend: BACKEND,
                            endpoint: endpoints.clone(),
                            message: format!(
                                "the watch broke and could not be resumed from revision {} after \
                                 {} attempts; last error: {last}",
                                watch.next,
                                RESUME_ATTEMPTS + 1,
                            ),
                            source: None,
                        });
                    }
                }
            }
            Err(e) => self.fail_all(|_| e.duplicate()),
        }
    }

    /// Opens the stream with the first watch's create, then sends the others' (each from
    /// its next revision).
    async fn connect(&mut self) -> KvResult<()> {
        let Some((&first, watch)) = self.watches.iter().next() else { return Ok(()) };
        let Some(shared) = self.shared.upgrade() else {
            return Err(driver_gone(&self.endpoints));
        };
        let timeout = watch.request_timeout;
        let (key, options) = (watch.key.clone(), watch.options());
        if std::mem::take(&mut self.renew_token) {
            // If this fails, the create is refused again and the watch fails with the reason.
            let renewal = async { shared.client().await?.refresh_token().await };
            match tokio::time::timeout(timeout, renewal).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::debug!(endpoints = %self.endpoints, error = %e, "renewing the etcd auth token failed");
                }
                Err(_) => {
                    tracing::debug!(endpoints = %self.endpoints, "renewing the etcd auth token timed out")
                }
            }
        }
        let attempt = shared.run(|c| {
            let (mut client, key, options) = (c.watch.clone(), key.clone(), options.clone());
            async move { client.watch(key, Some(options)).await }
        });
        let ctx = Context { endpoints: &self.endpoints, lease: None, timeout };
        let stream = match tokio::time::timeout(timeout, attempt).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return Err(error::classify("watch", e, ctx)),
            Err(_) => return Err(error::timeout("watch", ctx)),
        };
        let (mut sender, responses) = stream.split();
        let (requests, mut outgoing) = mpsc::unbounded_channel::<Outgoing>();
        // The writer may wait for the server to take requests (flow control) while the
        // driver goes on reading answers, so neither waits for the other.
        tokio::spawn(async move {
            while let Some(request) = outgoing.recv().await {
                let sent = match request {
                    Outgoing::Create(key, options) => sender.watch(key, Some(options)).await,
                    Outgoing::Cancel(id) => sender.cancel(id).await,
                };
                if sent.is_err() {
                    return;
                }
            }
        });
        self.ids.clear();
        self.creating.clear();
        self.creating.push_back(first);
        for (&token, watch) in self.watches.iter().skip(1) {
            self.creating.push_back(token);
            let _ = requests.send(Outgoing::Create(watch.key.clone(), watch.options()));
        }
        self.link = Some(Link { requests, responses });
        Ok(())
    }
}

async fn next_message(link: &mut Option<Link>) -> Result<Option<WatchResponse>, etcd_client::Error> {
    match link {
        Some(link) => link.responses.message().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The consumer's side of one watch; dropping it cancels the watch on the shared stream.
struct Subscription {
    token: u64,
    events: mpsc::UnboundedReceiver<Batch>,
    /// Events of the last batch not yet handed out.
    pending: VecDeque<Event>,
    commands: mpsc::UnboundedSender<Command>,
    done: bool,
    /// The client lives as long as its watches.
    shared: Arc<Shared>,
}

impl Stream for Subscription {
    type Item = KvResult<Event>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(event) = this.pending.pop_front() {
                return Poll::Ready(Some(Ok(event)));
            }
            if this.done {
                return Poll::Ready(None);
            }
            match this.events.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(batch))) => this.pending.extend(batch),
                Poll::Ready(Some(Err(error))) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(error)));
                }
                Poll::Ready(None) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(driver_gone(&this.shared.endpoints))));
                }
            }
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Cancel { token: self.token });
    }
}
