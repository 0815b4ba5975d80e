//! The one wait loop, [`KvExt::wait_until`]: read; unless that
//! ends the wait, watch from the read's revision + 1 and hand each event to the waiter; when
//! a watch needs it (its start was compacted away, it ended), read again. Whoever waits for
//! something in a store — a key to appear or go, an item to pop, a round to break — says
//! only what to read, what to watch, and what ends the wait, in a [`Wait`].

use std::future::Future;

use futures::StreamExt;
use futures::stream::{BoxStream, SelectAll};

use crate::error::KvError;
use crate::ext::{KvExt, show_key};
use crate::kv::{Event, Kv, KvResult, Revision, WatchScope};

/// What the read of a [`Wait`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reading<T> {
    /// The wait is over, with this.
    Done(T),
    /// Not yet, as of this revision: the watches start at the next one.
    Pending(Revision),
}

/// Where [`KvExt::wait_until`] starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Start {
    /// With a read ([`Wait::read`]).
    Read,
    /// With the watches, each from its revision, one per [`Wait::watched`] key: for a caller
    /// that already read what it waits on (as of revision `r`, it passes `r + 1`).
    Watch(Vec<Revision>),
}

/// Something to wait for in a store, for [`KvExt::wait_until`].
pub trait Wait: Send {
    /// What the wait ends with.
    type Output: Send;

    /// The keys (or, with [`WatchScope::Prefix`], the prefixes) whose changes may end the
    /// wait; they are watched together.
    fn watched(&self) -> Vec<(Vec<u8>, WatchScope)>;

    /// Reads the current state: whether the wait is over, else the revision it was read at.
    fn read(&mut self) -> impl Future<Output = KvResult<Reading<Self::Output>>> + Send;

    /// One event of the key `watched()[index]`, in revision order per key: `Some` ends the
    /// wait.
    fn event(
        &mut self,
        index: usize,
        event: Event,
    ) -> impl Future<Output = KvResult<Option<Self::Output>>> + Send;

    /// A read, a watch or [`Wait::event`] failed with `error`: `Ok` reads again, `Err` ends
    /// the wait with that error. By default, an error that a fresh read repairs
    /// ([`KvError::needs_reread`]: a compacted start, an ended watch) reads again at once, and
    /// any other ends the wait.
    fn failed(&mut self, error: KvError) -> impl Future<Output = KvResult<()>> + Send {
        async move { if error.needs_reread() { Ok(()) } else { Err(error) } }
    }
}

/// The loop of [`KvExt::wait_until`].
pub(crate) async fn wait_until<K, W>(kv: &K, mut wait: W, start: Start) -> KvResult<W::Output>
where
    K: Kv + ?Sized,
    W: Wait,
{
    let watched = wait.watched();
    let mut known = match start {
        Start::Read => None,
        Start::Watch(from) if from.len() == watched.len() => Some(from),
        Start::Watch(from) => {
            return Err(KvError::InvalidArgument(format!(
                "a wait on {} keys was given {} start revisions; give one per watched key",
                watched.len(),
                from.len()
            )));
        }
    };
    loop {
        let from = match known.take() {
            Some(from) => from,
            None => match wait.read().await {
                Ok(Reading::Done(output)) => return Ok(output),
                Ok(Reading::Pending(revision)) => vec![revision + 1; watched.len()],
                Err(e) => {
                    retry(&mut wait, &watched, e).await?;
                    continue;
                }
            },
        };
        match watch(kv, &watched, &from, &mut wait).await {
            Ok(output) => return Ok(output),
            Err(e) => retry(&mut wait, &watched, e).await?,
        }
    }
}

/// Asks the waiter whether to read again after `error`.
async fn retry<W: Wait>(wait: &mut W, watched: &[(Vec<u8>, WatchScope)], error: KvError) -> KvResult<()> {
    let key = watched.first().map(|(key, _)| show_key(key)).unwrap_or_default();
    tracing::debug!(error = %error, "waiting on `{key}`: reading again");
    wait.failed(error).await
}

/// Watches every key of `watched` from its revision in `from` until an event ends the wait
/// or a watch fails.
async fn watch<K, W>(
    kv: &K,
    watched: &[(Vec<u8>, WatchScope)],
    from: &[Revision],
    wait: &mut W,
) -> KvResult<W::Output>
where
    K: Kv + ?Sized,
    W: Wait,
{
    let mut events: SelectAll<BoxStream<'static, (usize, KvResult<Event>)>> = SelectAll::new();
    for (index, ((key, scope), &start)) in watched.iter().zip(from).enumerate() {
        let opened = kv.watch_from(key, *scope, start).await?;
        // Never ends: after the stream's end, `Watch::next` says `WatchEnded`.
        let stream = futures::stream::unfold(opened, |mut opened| async move {
            let item = opened.next().await;
            Some((item, opened))
        });
        events.push(stream.map(move |item| (index, item)).boxed());
    }
    while let Some((index, item)) = events.next().await {
        if let Some(output) = wait.event(index, item?).await? {
            return Ok(output);
        }
    }
    Err(KvError::InvalidArgument("a wait must watch at least one key".into()))
}
