//! A single updating progress line on stderr while a worker waits for a round — only when
//! stderr is a terminal. It polls (every 250 ms) for display only; the protocol itself
//! never polls.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use rdzv::Rendezvous;
use rdzv_core::KvExt;
use rdzv_core::protocol::State;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Shows progress until dropped (then clears its line).
pub struct Progress {
    task: Option<JoinHandle<()>>,
}

impl Progress {
    /// Starts showing the progress of `worker`'s `next_rendezvous`, begun at `started`, if
    /// stderr is a terminal; does nothing otherwise.
    pub fn start(worker: &Rendezvous, started: Instant) -> Progress {
        if !std::io::stderr().is_terminal() {
            return Progress { task: None };
        }
        let worker = worker.clone();
        let task = tokio::spawn(async move {
            let deadline = started + worker.params().timeout;
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            loop {
                tick.tick().await;
                let line = describe(&worker, deadline).await;
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r\x1b[K{line}");
                let _ = err.flush();
            }
        });
        Progress { task: Some(task) }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[K");
            let _ = err.flush();
        }
    }
}

async fn describe(worker: &Rendezvous, deadline: Instant) -> String {
    let params = worker.params();
    let left = deadline.saturating_duration_since(Instant::now()).as_secs_f64().ceil() as u64;
    let needed = if params.min_workers == params.max_workers {
        params.min_workers.to_string()
    } else {
        format!("{}..{}", params.min_workers, params.max_workers)
    };
    let kv = worker.backend();
    let keys = worker.keys();
    let state = match kv.get(&keys.state()).await {
        Ok(read) => match read.kv {
            Some(found) => State::read(&*kv, keys, &found).await.ok(),
            None => None,
        },
        Err(_) => return format!("rdzv: backend not answering… {left} s left"),
    };
    match state {
        Some(State::Joinable { version, .. }) => {
            let joined = kv.count(&keys.joins(version), None).await.unwrap_or(0);
            format!("rdzv: round {version}: {joined}/{needed} joined, {left} s left")
        }
        Some(State::Final { version, participants, .. }) => {
            let waiting = kv.count(&keys.waiting(version), None).await.unwrap_or(0);
            format!(
                "rdzv: round {version} runs with {} workers; {waiting} waiting for the next, {left} s left",
                participants.len()
            )
        }
        Some(State::Frozen { version, .. }) => {
            format!("rdzv: round {version} is being confirmed, {left} s left")
        }
        Some(State::Closed { .. }) => "rdzv: the run is closed".to_string(),
        Some(State::Setup) | None => format!("rdzv: starting a round (need {needed}), {left} s left"),
    }
}
