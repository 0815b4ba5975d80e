//! The connection state every operation shares, and the one way to run our script:
//! bounded by a timeout, retried only when the operation is idempotent.

use rdzv_core::retry::RetryPolicy;
use rdzv_core::{KvError, KvResult};
use redis::aio::ConnectionManager;
use redis::{Client, Script, Value};
use std::sync::Arc;

use crate::config::RedisConfig;
use crate::error::from_redis;
use crate::feed::{FeedGate, FeedSlot, Log};
use crate::reply::{Context, Reply};
use crate::shared::HighWater;

/// The script: helpers, then the operations and their dispatcher.
const SOURCE: &str = concat!(include_str!("lua/prelude.lua"), "\n", include_str!("lua/ops.lua"));

/// Whether an operation may be sent again after a failure whose outcome is unknown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Reads, keep-alive, reaping: running twice is harmless.
    Idempotent,
    /// Writes: a lost reply may hide an applied write, so it is never resent.
    Once,
}

/// One namespace on one server, attached to the namespace's current epoch.
pub(crate) struct Shared {
    pub config: RedisConfig,
    /// `redis://host:port/db`, for errors.
    pub endpoint: String,
    /// `{rdzv:<namespace>}:`.
    pub base: String,
    pub client: Client,
    pub conn: ConnectionManager,
    pub script: Script,
    /// The epoch this client attached to; a different one means the server lost our data.
    pub epoch: String,
    /// The log reader shared by this client's watches, while any runs.
    pub feed: FeedSlot,
    pub feed_gate: FeedGate,
    /// What this client has seen, shared with its feed.
    pub high: Arc<HighWater>,
    /// The connection batched lease refreshes use (see [`Shared::call_keeper`]).
    keeper: tokio::sync::OnceCell<ConnectionManager>,
    /// The runtime this client was made in, where its connection's tasks run.
    runtime: tokio::runtime::Id,
    /// How the watches read the log, made once for all of them (see [`Shared::log`]).
    log: std::sync::OnceLock<Arc<Log>>,
}

impl Shared {
    /// Connects and attaches to the namespace (creating its epoch if it is new).
    pub async fn connect(config: RedisConfig) -> KvResult<Shared> {
        config.validate().map_err(|e| KvError::InvalidArgument(e.to_string()))?;
        let client = crate::connect::client(&config)?;
        let conn = crate::connect::manager(&client, &config).await?;
        let mut shared = Shared {
            endpoint: config.endpoint_display(),
            base: config.key_base(),
            config,
            client,
            conn,
            script: Script::new(SOURCE),
            epoch: String::new(),
            feed: Default::default(),
            feed_gate: Default::default(),
            high: Default::default(),
            keeper: tokio::sync::OnceCell::new(),
            runtime: tokio::runtime::Handle::current().id(),
            log: std::sync::OnceLock::new(),
        };
        let mut reply = shared.call("init", &[], Retry::Idempotent).await?;
        let epoch = reply.bytes()?;
        shared.epoch = String::from_utf8_lossy(&epoch).into_owned();
        Ok(shared)
    }

    /// How this client reads its namespace's event log (for a watch). One for all the
    /// client's watches: it holds the client's configuration and keys, about a kilobyte in a
    /// dozen allocations, and 98,304 in-process workers each hold a watch or two.
    pub fn log(&self) -> Arc<Log> {
        self.log
            .get_or_init(|| {
                Arc::new(Log {
                    client: self.client.clone(),
                    config: self.config.clone(),
                    endpoint: self.endpoint.clone(),
                    epoch: self.epoch.clone(),
                    epoch_key: format!("{}epoch", self.base),
                    compacted_key: format!("{}compacted", self.base),
                    log_key: self.log_key(),
                    rev_key: self.rev_key(),
                    high: self.high.clone(),
                })
            })
            .clone()
    }

    /// Redis key of the revision counter (routes every call to the namespace's slot).
    pub fn rev_key(&self) -> String {
        format!("{}rev", self.base)
    }

    /// Redis key of the event log.
    pub fn log_key(&self) -> String {
        format!("{}log", self.base)
    }

    pub fn context(&self) -> Context<'_> {
        Context { endpoint: &self.endpoint, namespace: &self.config.namespace, high: &self.high }
    }

    /// Marks the namespace as rolled back (a new epoch saying so), so that every other client
    /// attached to it stops too; for a rollback this client found outside a script (its
    /// watch feed), where nothing marked it yet. Best effort: bypasses the failure this
    /// client already reports, and ignores the answer.
    pub async fn announce_rollback(&self) {
        let timeout = self.config.request_timeout;
        match tokio::time::timeout(timeout, self.invoke("mark_rolled_back", &[])).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::debug!(error = %e, "redis: marking the namespace as rolled back"),
            Err(_) => tracing::debug!("redis: marking the namespace as rolled back timed out"),
        }
    }

    /// Runs operation `op` of the script with `args`, within the request timeout.
    /// Returns the reply (tagged), with corrupt-data, lost-epoch and rollback replies as
    /// errors. After a rollback was found, fails at once with that error.
    pub async fn call(&self, op: &'static str, args: &[&[u8]], retry: Retry) -> KvResult<Reply> {
        self.call_on(&self.conn, op, args, retry).await
    }

    /// [`Shared::call`], from another runtime than this client's on a second connection,
    /// made by the first such call *in that runtime*. Sessions refresh their leases from a
    /// keep-alive thread of their own (`rdzv_core::Session`): on this connection, whose
    /// tasks run on that thread, a refresh never waits for a runtime busy with the protocol
    /// (where the main connection's tasks run). From this client's own runtime, or if the
    /// second connection cannot be made, the main connection serves.
    pub async fn call_keeper(&self, op: &'static str, args: &[&[u8]], retry: Retry) -> KvResult<Reply> {
        if tokio::runtime::Handle::current().id() == self.runtime {
            return self.call(op, args, retry).await;
        }
        let keeper =
            self.keeper.get_or_try_init(|| crate::connect::manager(&self.client, &self.config)).await;
        match keeper {
            Ok(conn) => self.call_on(conn, op, args, retry).await,
            Err(e) => {
                tracing::debug!(error = %e, "redis: no keep-alive connection; using the main one");
                self.call_on(&self.conn, op, args, retry).await
            }
        }
    }

    async fn call_on(
        &self,
        conn: &ConnectionManager,
        op: &'static str,
        args: &[&[u8]],
        retry: Retry,
    ) -> KvResult<Reply> {
        if let Some(e) = self.high.failed() {
            return Err(e);
        }
        let timeout = self.config.request_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let unreachable = std::sync::Mutex::new(None);
        let once = || async {
            let result = match tokio::time::timeout_at(deadline, self.invoke_on(conn, op, args)).await {
                Ok(r) => r,
                Err(_) => Err(crate::error::timeout(op, &self.endpoint, timeout)),
            };
            let mut last = unreachable.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match &result {
                Err(e @ KvError::Unavailable { .. }) => *last = Some(e.duplicate()),
                Err(KvError::Timeout { .. }) => {}
                _ => *last = None,
            }
            drop(last);
            result
        };
        let repeatable = |e: &KvError| retry == Retry::Idempotent && e.is_retryable();
        let value = RetryPolicy::CLIENT.run(Some(deadline), repeatable, once).await.map_err(|e| match e {
            // The deadline cut short a try after earlier ones found the server unreachable (a
            // slow try under load): that, with the endpoint, is what went wrong.
            KvError::Timeout { .. } => {
                unreachable.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take().unwrap_or(e)
            }
            e => e,
        })?;
        Reply::parse(value, op, &self.context())
    }

    async fn invoke(&self, op: &'static str, args: &[&[u8]]) -> KvResult<Value> {
        self.invoke_on(&self.conn, op, args).await
    }

    async fn invoke_on(&self, conn: &ConnectionManager, op: &'static str, args: &[&[u8]]) -> KvResult<Value> {
        let mut invocation = self.script.prepare_invoke();
        invocation
            .key(self.rev_key())
            .arg(&self.base)
            .arg(&self.epoch)
            .arg(self.config.history)
            .arg(self.high.revision())
            .arg(self.high.lease())
            .arg(self.config.history_bytes)
            .arg(op);
        for a in args {
            invocation.arg(*a);
        }
        let mut conn = conn.clone();
        invocation
            .invoke_async::<Value>(&mut conn)
            .await
            .map_err(|e| from_redis(e, &self.endpoint, op, self.config.request_timeout))
    }
}
