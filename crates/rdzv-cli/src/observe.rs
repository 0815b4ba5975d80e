//! What `rdzv run` tells about itself while it runs: metrics served over HTTP
//! (`--metrics-addr`) and events as JSON lines (`--events`), both fed by its worker's event
//! stream. The agent's own events — restarts, worker exits, nodes waiting — are reported
//! here, from where its decisions are carried out, into that same stream. Without either
//! flag nothing is recorded.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdzv::Rendezvous;
use rdzv_core::Kv;
use rdzv_core::events::EventKind;
use rdzv_core::metrics::Metrics;
use tokio::time::Instant;

use crate::agent::{Decision, status_name};
use crate::event_log::EventLog;
use crate::exit::CliError;
use crate::workers::WorkerExit;

/// How long the agent waits at its exit for the event log to be written.
const FLUSH_TIME: Duration = Duration::from_secs(5);

/// Where the agent's observations go.
pub struct Observe {
    metrics: Option<Metrics>,
    log: Option<EventLog>,
    /// The nodes waiting and spares last reported (across rounds: a new round that finds
    /// the same is no news).
    waiting: Mutex<Option<(usize, usize)>>,
}

impl Observe {
    /// Serves metrics on `metrics_addr` and opens the event log `events`, as asked (before
    /// joining: a node that cannot must not make the others wait for it).
    pub async fn start(metrics_addr: Option<&str>, events: Option<&Path>) -> Result<Observe, CliError> {
        let log = events.map(EventLog::open).transpose()?;
        let metrics = match metrics_addr {
            Some(addr) => {
                let metrics = Metrics::new();
                let bound = crate::metrics_server::serve(addr, metrics.clone()).await?;
                eprintln!("rdzv: serving metrics at http://{bound}/metrics");
                Some(metrics)
            }
            None => None,
        };
        Ok(Observe { metrics, log, waiting: Mutex::new(None) })
    }

    /// Whether anything is observed.
    pub fn any(&self) -> bool {
        self.metrics.is_some() || self.log.is_some()
    }

    /// The worker's backend, with its operations counted when metrics are served.
    pub fn instrument(&self, kv: Arc<dyn Kv>) -> Arc<dyn Kv> {
        match &self.metrics {
            Some(metrics) => metrics.instrument(kv),
            None => kv,
        }
    }

    /// Subscribes the metrics and the log to `worker`'s events.
    pub fn attach(&self, worker: &Rendezvous) {
        if let Some(metrics) = &self.metrics {
            metrics.attach(worker.handler());
        }
        if let Some(log) = &self.log {
            worker.on_event(log.subscriber());
        }
    }

    /// A decision about to be carried out: a rejoin after the first round is a restart.
    pub fn decision(&self, worker: &Rendezvous, decision: &Decision, count: u32, max_restarts: u32) {
        let Decision::Join { why, say } = decision else { return };
        let Some((cause, counted)) = why.cause() else { return };
        if self.any() {
            let reason = say.clone().unwrap_or_default();
            worker.emit(EventKind::Restart { cause, counted, count, max_restarts, reason });
        }
    }

    /// A worker exited by itself.
    pub fn worker_exited(&self, worker: &Rendezvous, exit: &WorkerExit) {
        if self.any() {
            let (rank, local_rank, status) = (exit.rank, exit.local_rank, status_name(exit.status));
            worker.emit(EventKind::WorkerExited { rank, local_rank, status });
        }
    }

    /// Reports how many nodes wait (and how many of them are spares) whenever that changes,
    /// read every `interval` while the workers run (bounded by it). Never resolves; does
    /// nothing when nothing is observed.
    pub async fn nodes_waiting(&self, worker: &Rendezvous, interval: Duration) {
        if !self.any() {
            return std::future::pending().await;
        }
        let mut tick = tokio::time::interval_at(Instant::now(), interval);
        loop {
            tick.tick().await;
            match tokio::time::timeout(interval, worker.waiting()).await {
                Ok(Ok(waiting)) => {
                    let now = (waiting.admissible, waiting.spares().len());
                    let before = self.waiting.lock().unwrap_or_else(|p| p.into_inner()).replace(now);
                    if before != Some(now) {
                        worker.emit(EventKind::NodesWaiting { waiting: now.0, spares: now.1 });
                    }
                }
                Ok(Err(e)) => tracing::debug!("reading the waiting nodes: {e}"),
                Err(_) => tracing::debug!("reading the waiting nodes took longer than --monitor-interval"),
            }
        }
    }

    /// Writes out the events reported so far (at the agent's exit).
    pub fn finish(&self) {
        if let Some(log) = &self.log {
            log.flush(FLUSH_TIME);
        }
    }
}
