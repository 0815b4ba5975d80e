//! Watches: every watch of one client is multiplexed on one gRPC watch stream, as etcd's Go
//! client does, and etcd's responses are flattened into [`Event`]s.
//!
//! Why one stream: each watch on its own HTTP/2 stream costs a stream reset when it is
//! dropped, and h2 closes a connection after 1,024 locally reset streams
//! (`too_many_internal_resets`), failing every request in flight on it — a thousand
//! handlers leaving at once did exactly that. On the shared stream a watch is ended by a
//! cancel request instead.
//!
//! Why shared etcd watches: N handlers of one client waiting on the same key (the rendezvous
//! state) would otherwise cost the server N watches and the client N copies of every
//! event, each with the full value (4096 workers × a 400 KB state = 1.6 GB per change). So
//! local watches of the same key (or prefix) share one etcd watch, a *group*, which keeps
//! the events it received (up to 16 MiB / 65,536 of them): a local watch starting at or
//! after the first revision the group still covers joins it and is handed the kept events
//! from its start, then the live ones; one starting earlier gets a group of its own.
//!
//! How: a driver task per client owns the stream (opened lazily with the first watch). It
//! sends creates in order and matches each `created` answer to the oldest create not yet
//! answered (etcd handles the requests of one stream in order and answers creates in that
//! order), then routes responses by watch id to the group's members. Compaction ends the
//! members that needed a compacted revision with [`KvError::Compacted`] (the others go on,
//! the group started again). When the stream breaks, it is reopened (failing over between
//! members) with every group re-created from its last received revision + 1, with bounded,
//! growing pauses between attempts; then the watches end with an error. A group's etcd
//! watch is cancelled when its last local watch is dropped.
//!
//! Each watch's events wait in its own unbounded queue until read, as in the Go client: a
//! reader that falls behind costs memory but never stalls the other watches of the client.
//! The queue is `futures`' channel, which allocates per event: tokio's allocates 32 slots
//! (about 3 KiB here) when it is made, for watches that mostly carry a few events (98,304
//! in-process workers hold one or two each; `tests/footprint.rs`).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use etcd_client::{WatchOptions, WatchResponse, WatchResponseStream};
use futures::channel::mpsc as queue;
use futures::{Stream, StreamExt};
use rdzv_core::kv::{Event, EventKind, KeyValue, Revision, WatchStream};
use rdzv_core::retry::RetryPolicy;
use rdzv_core::{KvError, KvResult};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::client::Shared;
use crate::error::{self, BACKEND, Context};
use crate::keys::Namespace;

/// Attempts to reopen a broken stream before giving up, and the pauses between them: from
/// 100 ms growing to 2 s (about 10 s in all, jitter aside, plus the attempts themselves).
const RESUME_ATTEMPTS: usize = 8;
const RESUME: RetryPolicy = RetryPolicy::new(Duration::from_millis(100), Duration::from_secs(2));

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
    let (events, received) = queue::unbounded();
    let (reply, replied) = oneshot::channel();
    // Built first, so that giving up below (timeout, cancelled caller) cancels the watch.
    let subscription = Subscription {
        token,
        events: received,
        pending: Vec::new().into_iter(),
        commands: commands.clone(),
        done: false,
        shared: target.shared.clone(),
    };
    let request = Request {
        namespace: target.namespace,
        key: target.key,
        range_end: target.range_end,
        start,
        events,
        reply,
        request_timeout: target.request_timeout,
    };
    let ctx = target.shared.context(target.request_timeout, None);
    if commands.send(Command::Create { token, request: Box::new(request) }).is_err() {
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
            groups: BTreeMap::new(),
            next_group: 0,
            members: HashMap::new(),
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

/// Retained events of one shared etcd watch, so that a local watch starting from an earlier
/// revision can still join it: at most this many bytes of keys and values...
const HISTORY_BYTES: usize = 16 << 20;
/// ...and at most this many events.
const HISTORY_EVENTS: usize = 65_536;

enum Command {
    Create {
        token: u64,
        request: Box<Request>,
    },
    /// The watch's stream was dropped.
    Cancel {
        token: u64,
    },
}

/// A local watch to open.
struct Request {
    namespace: Namespace,
    key: Vec<u8>,
    range_end: Option<Vec<u8>>,
    start: Revision,
    events: queue::UnboundedSender<Batch>,
    reply: oneshot::Sender<KvResult<()>>,
    request_timeout: Duration,
}

/// One local watch, a member of a [`Group`].
struct Member {
    /// The next revision it is to receive (it has everything before).
    next: Revision,
    events: queue::UnboundedSender<Batch>,
    /// Waiting for the group's first `created` answer.
    reply: Option<oneshot::Sender<KvResult<()>>>,
}

impl Member {
    /// Ends the watch with `error` (on the stream, or as the answer to its creation).
    fn fail(self, error: KvError) {
        match self.reply {
            Some(reply) => {
                let _ = reply.send(Err(error));
            }
            None => {
                let _ = self.events.unbounded_send(Err(error));
            }
        }
    }

    /// Hands over the events of `batch` it has not had; false if its stream was dropped.
    fn deliver(&mut self, batch: &[Event]) -> bool {
        let fresh: Vec<Event> = batch.iter().filter(|e| e.revision() >= self.next).cloned().collect();
        let Some(last) = fresh.last() else { return true };
        self.next = last.revision() + 1;
        self.events.unbounded_send(Ok(fresh)).is_ok()
    }
}

/// One etcd watch on the stream, shared by every local watch of the same key (or prefix)
/// that starts within what it has seen: N handlers of one client waiting on the same state
/// key cost the server one watch and the client one copy of each event, not N.
struct Group {
    namespace: Namespace,
    key: Vec<u8>,
    range_end: Option<Vec<u8>>,
    /// The revision to (re)start the etcd watch from: the last event received + 1.
    next: Revision,
    /// The events received from `covered_from` on: every change of the key (or prefix) with
    /// a revision in `covered_from..next`.
    history: VecDeque<Event>,
    history_bytes: usize,
    covered_from: Revision,
    members: BTreeMap<u64, Member>,
    /// etcd's id for it on the current stream, once created.
    id: Option<i64>,
    request_timeout: Duration,
    /// Being re-created on a fresh stream because etcd refused the last stream's token
    /// (once: a second refusal fails the watch).
    token_renewed: bool,
}

impl Group {
    fn options(&self) -> WatchOptions {
        let mut options = WatchOptions::new().with_start_revision(self.next);
        if let Some(end) = &self.range_end {
            options = options.with_range(end.clone());
        }
        options
    }

    /// Whether a watch of `key`/`range_end` from `start` can be served by this group.
    fn serves(&self, key: &[u8], range_end: &Option<Vec<u8>>, start: Revision) -> bool {
        self.key == key && &self.range_end == range_end && self.covered_from <= start
    }

    /// The events of `response` not yet received, as [`Event`]s (converted once for all the
    /// members), also kept in the history.
    fn absorb(&mut self, response: &WatchResponse) -> Vec<Event> {
        let mut batch = Vec::with_capacity(response.events().len());
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            // etcd marks a delete by a zero create revision (it is how its own watchers tell);
            // this also avoids etcd-client's panicking conversion of unknown event types.
            let kind = if kv.create_revision() == 0 { EventKind::Delete } else { EventKind::Put };
            if kv.mod_revision() < self.next {
                // Already received before a resume; never hand out a duplicate.
                continue;
            }
            let kv = match kind {
                EventKind::Put => self.namespace.convert(kv.clone()),
                EventKind::Delete => KeyValue {
                    key: self.namespace.strip(kv.key().to_vec()),
                    value: Default::default(),
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
        for event in &batch {
            self.history_bytes += event.kv.key.len() + event.kv.value.len();
            self.history.push_back(event.clone());
        }
        while self.history_bytes > HISTORY_BYTES || self.history.len() > HISTORY_EVENTS {
            let Some(old) = self.history.pop_front() else { break };
            self.history_bytes -= old.kv.key.len() + old.kv.value.len();
            // Other events of the same revision may remain; coverage restarts after it.
            self.covered_from = old.revision() + 1;
        }
        batch
    }

    /// Starts over from the earliest revision a member still needs, with no history (after
    /// a compaction answer that did not concern every member).
    fn restart(&mut self) {
        self.next = self.members.values().map(|m| m.next).min().unwrap_or(self.next);
        self.covered_from = self.next;
        self.history.clear();
        self.history_bytes = 0;
        self.id = None;
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
    /// Live groups by creation number (ordered, so that re-creation follows creation order).
    groups: BTreeMap<u64, Group>,
    next_group: u64,
    /// Local watch token → its group.
    members: HashMap<u64, u64>,
    /// etcd watch id → group, on the current stream.
    ids: HashMap<i64, u64>,
    /// Groups whose create was sent on the current stream and not yet answered, in order.
    creating: VecDeque<u64>,
    link: Option<Link>,
    /// Pauses left for reopening, while reopening.
    backoff: Option<Box<dyn Iterator<Item = Duration> + Send>>,
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
                Step::Command(Some(Command::Create { token, request })) => self.create(token, *request).await,
                Step::Command(Some(Command::Cancel { token })) => self.cancel(token),
                Step::Message(Ok(Some(response))) => self.route(response),
                Step::Message(Ok(None)) => {
                    self.broken(None, "the server closed the watch stream".to_string())
                }
                Step::Message(Err(e)) => {
                    let timeout = self.groups.values().next().map_or(Duration::ZERO, |g| g.request_timeout);
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

    /// The group a new watch can join: same key or prefix, covering its start, on a live
    /// stream (where every group is created or being created: `connect` and every new or
    /// restarted group send their create on it).
    fn joinable(&self, request: &Request) -> Option<u64> {
        self.link.as_ref()?;
        self.groups
            .iter()
            .find(|(_, g)| g.serves(&request.key, &request.range_end, request.start))
            .map(|(gid, _)| *gid)
    }

    async fn create(&mut self, token: u64, request: Request) {
        if let Some(gid) = self.joinable(&request) {
            let Some(group) = self.groups.get_mut(&gid) else { return };
            let mut member = Member { next: request.start, events: request.events, reply: None };
            let replay: Vec<Event> =
                group.history.iter().filter(|e| e.revision() >= request.start).cloned().collect();
            member.deliver(&replay);
            member.next = member.next.max(group.next);
            if group.id.is_some() {
                let _ = request.reply.send(Ok(()));
            } else {
                member.reply = Some(request.reply);
            }
            group.members.insert(token, member);
            self.members.insert(token, gid);
            return;
        }
        let gid = self.next_group;
        self.next_group += 1;
        let member = Member { next: request.start, events: request.events, reply: Some(request.reply) };
        let group = Group {
            namespace: request.namespace,
            key: request.key,
            range_end: request.range_end,
            next: request.start,
            history: VecDeque::new(),
            history_bytes: 0,
            covered_from: request.start,
            members: BTreeMap::from([(token, member)]),
            id: None,
            request_timeout: request.request_timeout,
            token_renewed: false,
        };
        let create = Outgoing::Create(group.key.clone(), group.options());
        self.groups.insert(gid, group);
        self.members.insert(token, gid);
        if let Some(link) = &self.link {
            self.creating.push_back(gid);
            // A closed writer means the stream ended: its end, read next, re-creates this.
            let _ = link.requests.send(create);
            return;
        }
        // No stream (none yet, or broken and waiting for its next attempt): open it now,
        // so that an unreachable cluster fails this call at once.
        if let Err(e) = self.connect().await {
            if let Some(group) = self.groups.remove(&gid) {
                for (token, member) in group.members {
                    self.members.remove(&token);
                    member.fail(e.duplicate());
                }
            }
            if self.groups.is_empty() {
                self.retry_at = None;
                self.backoff = None;
            }
        }
    }

    fn cancel(&mut self, token: u64) {
        let Some(gid) = self.members.remove(&token) else { return };
        let Some(group) = self.groups.get_mut(&gid) else { return };
        group.members.remove(&token);
        if group.members.is_empty() {
            self.drop_group(gid);
        }
    }

    /// Forgets a group and cancels its etcd watch (one still unanswered is cancelled when
    /// its answer comes, see `route`).
    fn drop_group(&mut self, gid: u64) {
        let Some(group) = self.groups.remove(&gid) else { return };
        for token in group.members.keys() {
            self.members.remove(token);
        }
        if let (Some(id), Some(link)) = (group.id, &self.link) {
            self.ids.remove(&id);
            let _ = link.requests.send(Outgoing::Cancel(id));
        }
    }

    fn route(&mut self, response: WatchResponse) {
        // Any answer means the stream works: a later break gets fresh attempts.
        self.backoff = None;
        let id = response.watch_id();
        if response.created() {
            let Some(gid) = self.creating.pop_front() else {
                tracing::warn!(endpoints = %self.endpoints, id, "etcd answered a watch create never sent");
                return;
            };
            let Some(group) = self.groups.get_mut(&gid) else {
                // Dropped while being created.
                if !response.canceled() {
                    self.send(Outgoing::Cancel(id));
                }
                return;
            };
            if response.canceled() && !group.token_renewed && response.cancel_reason().contains("auth token")
            {
                // The stream carries the token it was opened with, which etcd may have
                // dropped since (after its TTL unused, or a restart) while requests moved on
                // to a new one: reopen with a fresh token, re-creating every watch.
                group.token_renewed = true;
                tracing::debug!(endpoints = %self.endpoints, "etcd refused the watch stream's token; reopening");
                self.detach();
                self.renew_token = true;
                self.retry_at = Some(Instant::now());
                return;
            }
            if response.canceled() {
                self.end_group(gid, "refused", response.cancel_reason());
                return;
            }
            group.id = Some(id);
            // A later refusal (after another expiry) deserves another renewal.
            group.token_renewed = false;
            for member in group.members.values_mut() {
                if let Some(reply) = member.reply.take() {
                    let _ = reply.send(Ok(()));
                }
            }
            self.ids.insert(id, gid);
        }
        let Some(&gid) = self.ids.get(&id) else {
            // Events of a watch being cancelled, or the answer to our cancel.
            return;
        };
        if response.compact_revision() > 0 {
            self.ids.remove(&id);
            self.compacted(gid, response.compact_revision());
            return;
        }
        if response.canceled() {
            self.ids.remove(&id);
            self.end_group(gid, "cancelled", response.cancel_reason());
            return;
        }
        let Some(group) = self.groups.get_mut(&gid) else { return };
        let batch = group.absorb(&response);
        if batch.is_empty() {
            return;
        }
        let gone: Vec<u64> = group
            .members
            .iter_mut()
            .filter_map(|(token, m)| (!m.deliver(&batch)).then_some(*token))
            .collect();
        for token in gone {
            // The stream was dropped; its cancel command is on its way.
            self.cancel(token);
        }
    }

    /// etcd refused or cancelled a group's watch: its members end with the reason. As before
    /// multiplexing, a member still being opened is answered first (the call succeeds and
    /// the stream yields the error).
    fn end_group(&mut self, gid: u64, what: &str, reason: &str) {
        let Some(group) = self.groups.remove(&gid) else { return };
        let key = group.namespace.strip(group.key.clone());
        let error = ended(what, reason, &self.endpoints, &key);
        for (token, mut member) in group.members {
            self.members.remove(&token);
            if let Some(reply) = member.reply.take() {
                let _ = reply.send(Ok(()));
            }
            member.fail(error.duplicate());
        }
    }

    /// etcd ended a group's watch: its start is compacted. The members that need a revision
    /// before `oldest` fail with [`KvError::Compacted`]; the others are served by the group
    /// started again from the earliest revision they need.
    fn compacted(&mut self, gid: u64, oldest: Revision) {
        let Some(group) = self.groups.get_mut(&gid) else { return };
        let lost: Vec<u64> = group.members.iter().filter(|(_, m)| m.next < oldest).map(|(t, _)| *t).collect();
        for token in lost {
            if let Some(mut member) = group.members.remove(&token) {
                self.members.remove(&token);
                if let Some(reply) = member.reply.take() {
                    let _ = reply.send(Ok(()));
                }
                let requested = member.next;
                member.fail(KvError::Compacted { requested, oldest });
            }
        }
        if group.members.is_empty() {
            self.groups.remove(&gid);
            return;
        }
        group.restart();
        if let Some(link) = &self.link {
            self.creating.push_back(gid);
            let _ = link.requests.send(Outgoing::Create(group.key.clone(), group.options()));
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
        let mut emptied = Vec::new();
        for (gid, group) in &mut self.groups {
            let unanswered: Vec<u64> =
                group.members.iter().filter(|(_, m)| m.reply.is_some()).map(|(t, _)| *t).collect();
            for token in unanswered {
                if let Some(member) = group.members.remove(&token) {
                    self.members.remove(&token);
                    let e = error.as_ref().map_or_else(
                        || KvError::Unavailable {
                            backend: BACKEND,
                            endpoint: self.endpoints.clone(),
                            message: why.clone(),
                            source: None,
                        },
                        KvError::duplicate,
                    );
                    member.fail(e);
                }
            }
            if group.members.is_empty() {
                emptied.push(*gid);
            }
        }
        for gid in emptied {
            self.groups.remove(&gid);
        }
        self.last_error = Some(why);
        self.retry_at = if self.groups.is_empty() { None } else { Some(Instant::now()) };
    }

    /// Forgets the current stream; the groups stay, to be re-created on the next.
    fn detach(&mut self) {
        self.link = None;
        self.ids.clear();
        self.creating.clear();
        for group in self.groups.values_mut() {
            group.id = None;
        }
    }

    /// Ends every watch with the error `error_for` gives it (from the revision it needs
    /// next), and forgets the stream.
    fn fail_all(&mut self, error_for: impl Fn(Revision) -> KvError) {
        self.link = None;
        self.ids.clear();
        self.creating.clear();
        self.retry_at = None;
        self.backoff = None;
        self.members.clear();
        for (_, group) in std::mem::take(&mut self.groups) {
            for (_, member) in group.members {
                let error = error_for(member.next);
                member.fail(error);
            }
        }
    }

    /// One attempt to reopen the broken stream; schedules the next, or gives up.
    async fn reopen(&mut self) {
        self.retry_at = None;
        if self.groups.is_empty() || self.link.is_some() {
            self.backoff = None;
            return;
        }
        match self.connect().await {
            Ok(()) => {
                tracing::debug!(endpoints = %self.endpoints, watches = self.members.len(), "etcd watch stream resumed");
            }
            Err(e) if e.is_retryable() => {
                self.last_error = Some(e.to_string());
                let backoff =
                    self.backoff.get_or_insert_with(|| Box::new(RESUME.pauses().take(RESUME_ATTEMPTS)));
                match backoff.next() {
                    Some(pause) => self.retry_at = Some(Instant::now() + pause),
                    None => {
                        let last = self.last_error.clone().unwrap_or_else(|| "none".to_string());
                        let endpoints = self.endpoints.clone();
                        self.fail_all(|next| KvError::Unavailable {
                            backend: BACKEND,
                            endpoint: endpoints.clone(),
                            message: format!(
                                "the watch broke and could not be resumed from revision {next} after \
                                 {} attempts; last error: {last}",
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

    /// Opens the stream with the first group's create, then sends the others' (each from
    /// its next revision).
    async fn connect(&mut self) -> KvResult<()> {
        let Some((&first, group)) = self.groups.iter().next() else { return Ok(()) };
        let Some(shared) = self.shared.upgrade() else {
            return Err(driver_gone(&self.endpoints));
        };
        let timeout = group.request_timeout;
        let (key, options) = (group.key.clone(), group.options());
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
        for (&gid, group) in self.groups.iter().skip(1) {
            self.creating.push_back(gid);
            let _ = requests.send(Outgoing::Create(group.key.clone(), group.options()));
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
    events: queue::UnboundedReceiver<Batch>,
    /// Events of the last batch not yet handed out, in the batch's own buffer, which is freed
    /// with its last event: a watch waiting for its next event holds none.
    pending: std::vec::IntoIter<Event>,
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
            if let Some(event) = this.pending.next() {
                if this.pending.len() == 0 {
                    this.pending = Vec::new().into_iter();
                }
                return Poll::Ready(Some(Ok(event)));
            }
            if this.done {
                return Poll::Ready(None);
            }
            match this.events.poll_next_unpin(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(batch))) => this.pending = batch.into_iter(),
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

/// The error a watch etcd refused or cancelled (for another reason than compaction) ends
/// with. A refusal for want of permission is final: the user's roles must change. Anything
/// else (a member that lags behind the revision asked for, a watch the server gave up on)
/// ends the watch as a dropped stream does, [`KvError::WatchEnded`]: read again, watch again,
/// which a fresh read makes safe. Its reason is logged, since the error cannot carry it.
fn ended(what: &str, reason: &str, endpoints: &str, key: &[u8]) -> KvError {
    let reason = if reason.is_empty() { "no reason given" } else { reason };
    if reason.contains("permission denied") {
        return KvError::backend(
            BACKEND,
            format!(
                "etcd {what} the watch at {endpoints}: {reason}: the user's roles must grant read on \
                 every key under rdzv's key prefix (see docs/ETCD.md, RBAC)"
            ),
        );
    }
    tracing::warn!(endpoints, %reason, "etcd {what} a watch; reading again and watching again");
    KvError::WatchEnded { backend: BACKEND, key: rdzv_core::kv::show_key(key) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancelled_watch_is_watched_again_unless_permission_is_missing() {
        for reason in ["mvcc: required revision is a future revision", "", "etcdserver: reworded"] {
            let e = ended("cancelled", reason, "h:1", b"/p/rdzv/active_version");
            assert!(matches!(e, KvError::WatchEnded { .. }) && e.needs_reread(), "{reason:?}: {e:?}");
            assert!(e.to_string().contains("/p/rdzv/active_version"), "{e}");
        }
        let e = ended("refused", "etcdserver: permission denied", "h:1", b"/p/");
        assert!(!e.is_retryable() && e.to_string().contains("roles"), "{e}");
    }
}
