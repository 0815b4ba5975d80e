//! Watches: etcd's watch responses flattened into [`Event`]s, with compaction surfaced as
//! [`KvError::Compacted`] and a broken stream resumed from the last delivered revision + 1
//! (with bounded, growing pauses between attempts; then the stream ends with an error).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use etcd_client::{WatchOptions, WatchResponse};
use futures::StreamExt;
use rdzv_core::{Event, EventKind, KeyValue, KvError, KvResult, Revision, WatchStream};

use crate::client::Shared;
use crate::errors::{self, BACKEND};
use crate::keys::Namespace;

/// Attempts to resume a broken watch before giving up, with pauses from 100 ms doubling up
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

/// Opens the watch from `start` (≥ 1). Fails at once if the cluster cannot be reached; once
/// open, breaks are resumed inside the stream.
pub(crate) async fn open(target: Target, start: Revision) -> KvResult<WatchStream> {
    let mut state = State {
        target,
        next: start,
        stream: None,
        pending: VecDeque::new(),
        backoff: None,
        last_error: None,
        done: false,
    };
    state.stream = Some(state.create().await?);
    Ok(futures::stream::unfold(state, |mut state| async move {
        state.next_event().await.map(|item| (item, state))
    })
    .boxed())
}

struct State {
    target: Target,
    /// The revision to (re)start from: the last delivered event's + 1.
    next: Revision,
    stream: Option<etcd_client::WatchStream>,
    /// Events of the last response not yet handed out.
    pending: VecDeque<Event>,
    /// Pauses left for resuming, while resuming.
    backoff: Option<ExponentialBackoff>,
    last_error: Option<String>,
    done: bool,
}

impl State {
    fn ctx(&self) -> errors::Context<'_> {
        self.target.shared.context(self.target.request_timeout, None)
    }

    /// One attempt to open the watch from `self.next`.
    async fn create(&self) -> KvResult<etcd_client::WatchStream> {
        let mut options = WatchOptions::new().with_start_revision(self.next);
        if let Some(end) = &self.target.range_end {
            options = options.with_range(end.clone());
        }
        let (key, options) = (&self.target.key, &options);
        let attempt = self.target.shared.run(|c| {
            let (mut client, key, options) = (c.watch.clone(), key.clone(), options.clone());
            async move { client.watch(key, Some(options)).await }
        });
        match tokio::time::timeout(self.target.request_timeout, attempt).await {
            Ok(Ok(stream)) => Ok(stream),
            Ok(Err(e)) => Err(errors::classify("watch", e, self.ctx())),
            Err(_) => Err(errors::timeout("watch", self.ctx())),
        }
    }

    async fn next_event(&mut self) -> Option<KvResult<Event>> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(Ok(event));
            }
            if self.done {
                return None;
            }
            let Some(stream) = self.stream.as_mut() else {
                if let Err(e) = self.resume().await {
                    self.done = true;
                    return Some(Err(e));
                }
                continue;
            };
            match stream.message().await {
                Ok(Some(response)) => {
                    // Any answer means the stream works: a later break gets fresh attempts.
                    self.backoff = None;
                    if let Some(error) = self.absorb(response) {
                        self.done = true;
                        self.stream = None;
                        return Some(Err(error));
                    }
                }
                Ok(None) => self.broken("the server closed the watch stream".to_string()),
                Err(e) => {
                    let error = errors::classify("watch", e, self.ctx());
                    if error.is_retryable() {
                        self.broken(error.to_string());
                    } else {
                        self.done = true;
                        self.stream = None;
                        return Some(Err(error));
                    }
                }
            }
        }
    }

    fn broken(&mut self, why: String) {
        tracing::debug!(
            endpoints = %self.target.shared.endpoints,
            from = self.next,
            %why,
            "etcd watch broken; resuming"
        );
        self.last_error = Some(why);
        self.stream = None;
    }

    /// Takes the events of one response; an error if the watch was cancelled.
    fn absorb(&mut self, response: WatchResponse) -> Option<KvError> {
        if response.compact_revision() > 0 {
            return Some(KvError::Compacted { requested: self.next, oldest: response.compact_revision() });
        }
        if response.canceled() {
            let reason = response.cancel_reason();
            return Some(KvError::backend(
                BACKEND,
                format!(
                    "etcd cancelled the watch at {}: {}",
                    self.target.shared.endpoints,
                    if reason.is_empty() { "no reason given" } else { reason }
                ),
            ));
        }
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            // etcd marks a delete by a zero create revision (it is how its own watchers tell);
            // this also avoids etcd-client's panicking conversion of unknown event types.
            let kind = if kv.create_revision() == 0 { EventKind::Delete } else { EventKind::Put };
            let kv = match kind {
                EventKind::Put => self.target.namespace.convert(kv.clone()),
                EventKind::Delete => KeyValue {
                    key: self.target.namespace.strip(kv.key().to_vec()),
                    value: Vec::new(),
                    create_revision: 0,
                    mod_revision: kv.mod_revision(),
                    version: 0,
                    lease: None,
                },
            };
            if kv.mod_revision < self.next {
                // Already delivered before a resume; never hand out a duplicate.
                continue;
            }
            self.pending.push_back(Event { kind, kv });
        }
        if let Some(last) = self.pending.back() {
            self.next = last.revision() + 1;
        }
        None
    }

    /// Re-opens the watch from `self.next`, pausing between attempts; gives up with
    /// `Unavailable` when the attempts run out, or at once on an error retrying cannot fix.
    async fn resume(&mut self) -> KvResult<()> {
        loop {
            match self.create().await {
                Ok(stream) => {
                    tracing::debug!(from = self.next, "etcd watch resumed");
                    self.stream = Some(stream);
                    return Ok(());
                }
                Err(e) if e.is_retryable() => self.last_error = Some(e.to_string()),
                Err(e) => return Err(e),
            }
            let backoff = self.backoff.get_or_insert_with(|| {
                ExponentialBuilder::default()
                    .with_min_delay(RESUME_MIN_DELAY)
                    .with_max_delay(RESUME_MAX_DELAY)
                    .with_max_times(RESUME_ATTEMPTS)
                    .build()
            });
            match backoff.next() {
                Some(pause) => tokio::time::sleep(pause).await,
                None => {
                    return Err(KvError::Unavailable {
                        backend: BACKEND,
                        endpoint: self.target.shared.endpoints.clone(),
                        message: format!(
                            "the watch broke and could not be resumed from revision {} after \
                             {} attempts; last error: {}",
                            self.next,
                            RESUME_ATTEMPTS + 1,
                            self.last_error.as_deref().unwrap_or("none")
                        ),
                        source: None,
                    });
                }
            }
        }
    }
}
