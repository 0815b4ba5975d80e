//! [`RedisKv`]: the [`Kv`] contract, each operation one call of our script.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rdzv_core::kv::{
    Capabilities, CountedCreate, DeleteMode, DeleteOutcome, DeletePrefixResponse, GetResponse, KeyValue,
    LeaseId, PutMode, PutOptions, PutOutcome, RangeOptions, RangeOrder, RangeResponse, Revision, WatchScope,
    WatchStream,
};
use rdzv_core::{Kv, KvError, KvResult};

use crate::client::{Retry, Shared};
use crate::config::RedisConfig;
use crate::error::NAME;
use crate::limits::{check_key, check_write};

/// The Redis backend: etcd v3 semantics from one Lua script and one stream per namespace
/// (see the [crate docs](crate)). Keys, values and requests larger than
/// [`MAX_KEY_BYTES`](crate::MAX_KEY_BYTES), [`MAX_VALUE_BYTES`](crate::MAX_VALUE_BYTES) and
/// [`MAX_REQUEST_BYTES`](crate::MAX_REQUEST_BYTES) fail with [`KvError::TooLarge`] before
/// anything is sent. Cheap to share behind an `Arc`; every clone of that `Arc`
/// uses one multiplexed connection, plus one for all its watches while any is open, and one
/// for the lease refreshes of [`Session`](rdzv_core::Session)s once one is due.
/// Dropping the last one stops its background lease reaper.
pub struct RedisKv {
    shared: Arc<Shared>,
    reaper: tokio::task::AbortHandle,
}

impl std::fmt::Debug for RedisKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisKv")
            .field("endpoint", &self.shared.endpoint)
            .field("namespace", &self.shared.config.namespace)
            .finish()
    }
}

impl Drop for RedisKv {
    fn drop(&mut self) {
        self.reaper.abort();
    }
}

impl RedisKv {
    /// Connects to the server of `config` and attaches to its namespace (creating it if
    /// new). Must run inside a tokio runtime (it starts the lease reaper there).
    ///
    /// Errors: [`KvError::Unavailable`] when the server cannot be reached in
    /// `connect_timeout`; [`KvError::InvalidArgument`] for a bad config (unreadable CA
    /// file, bad namespace); [`KvError::Backend`] when our keys hold foreign data.
    pub async fn connect(config: RedisConfig) -> KvResult<RedisKv> {
        let shared = Arc::new(Shared::connect(config).await?);
        let reaper = crate::reaper::spawn(Arc::downgrade(&shared));
        Ok(RedisKv { shared, reaper })
    }

    /// The settings this client runs with.
    pub fn config(&self) -> &RedisConfig {
        &self.shared.config
    }

    /// Records the revision of a conflict's current key as seen.
    fn saw(&self, current: Option<KeyValue>) -> Option<KeyValue> {
        if let Some(kv) = &current {
            self.shared.high.saw_revision(kv.mod_revision);
        }
        current
    }
}

/// The most leases one `keep_alive_many` script call refreshes: bounds the time the script
/// holds the server (each lease is a few cheap commands).
const KEEP_ALIVE_BATCH: usize = 512;

impl RedisKv {
    /// Refreshes up to [`KEEP_ALIVE_BATCH`] leases in one script call.
    async fn keep_alive_chunk(&self, leases: &[LeaseId]) -> KvResult<Vec<KvResult<Duration>>> {
        let ids: Vec<Vec<u8>> = leases.iter().map(|&lease| num(lease)).collect();
        let args: Vec<&[u8]> = ids.iter().map(Vec::as_slice).collect();
        let mut r = self.shared.call_keeper("keep_alive_many", &args, Retry::Idempotent).await?;
        if r.tag != "ok" {
            return Err(r.unexpected());
        }
        let mut answers = Vec::with_capacity(leases.len());
        for &lease in leases {
            let ttl = r.int()?;
            answers.push(match u64::try_from(ttl) {
                Ok(ms) => Ok(Duration::from_millis(ms)),
                Err(_) => Err(KvError::LeaseNotFound(lease)),
            });
        }
        Ok(answers)
    }

    /// Deletes the first `limit` keys under `prefix` in one script call (every key: 0).
    async fn delete_first(&self, prefix: &[u8], limit: usize) -> KvResult<DeletePrefixResponse> {
        let limit = num(i64::try_from(limit).unwrap_or(i64::MAX));
        let mut r = self.shared.call("delete_prefix", &[prefix, &limit], Retry::Once).await?;
        let deleted = r.int()?;
        let revision = r.int()?;
        self.shared.high.saw_revision(revision);
        Ok(DeletePrefixResponse { deleted: u64::try_from(deleted).unwrap_or(0), revision })
    }
}

fn mode_args(mode: PutMode) -> (&'static [u8], Revision) {
    match mode {
        PutMode::Overwrite => (b"o", 0),
        PutMode::Create => (b"c", 0),
        PutMode::Update(rev) => (b"u", rev),
    }
}

fn lease_arg(lease: Option<LeaseId>) -> KvResult<i64> {
    match lease {
        None => Ok(0),
        Some(id) if id > 0 => Ok(id),
        Some(id) => Err(KvError::LeaseNotFound(id)),
    }
}

fn num(n: impl ToString) -> Vec<u8> {
    n.to_string().into_bytes()
}

#[async_trait]
impl Kv for RedisKv {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_increment: true,
            counted_create: true,
            min_lease_ttl: crate::reaper::MIN_LEASE_TTL,
            ..Capabilities::default()
        }
    }

    async fn get(&self, key: &[u8]) -> KvResult<GetResponse> {
        check_key(key)?;
        let mut r = self.shared.call("get", &[key], Retry::Idempotent).await?;
        let revision = r.int()?;
        let kv = r.optional_key_value()?;
        self.shared.high.saw_revision(revision);
        Ok(GetResponse { kv, revision })
    }

    async fn range(&self, prefix: &[u8], options: RangeOptions) -> KvResult<RangeResponse> {
        check_key(prefix)?;
        let limit = num(options.limit.unwrap_or(0));
        let max_create = options.max_create_revision.map(num).unwrap_or_default();
        let order: &[u8] = match options.order {
            RangeOrder::ByKey => b"key",
            RangeOrder::ByCreateRevision => b"create",
        };
        let flag = |b: bool| -> &'static [u8] { if b { b"1" } else { b"0" } };
        let args = [prefix, &limit, &max_create, order, flag(options.keys_only), flag(options.count_only)];
        let mut r = self.shared.call("range", &args, Retry::Idempotent).await?;
        let revision = r.int()?;
        let count = r.int()?;
        let mut records = r.nested()?;
        let mut kvs = Vec::new();
        while !records.is_empty() {
            kvs.push(records.key_value()?);
        }
        self.shared.high.saw_revision(revision);
        Ok(RangeResponse { kvs, count: u64::try_from(count).unwrap_or(0), revision })
    }

    async fn put(&self, key: &[u8], value: &[u8], options: PutOptions) -> KvResult<PutOutcome> {
        check_write(key, value)?;
        let (mode, expect) = mode_args(options.mode);
        let lease = lease_arg(options.lease)?;
        let args = [key, value, mode, &num(expect), &num(lease)];
        let mut r = self.shared.call("put", &args, Retry::Once).await?;
        match r.tag.as_str() {
            "ok" => {
                let revision = r.int()?;
                let create_revision = r.int()?;
                self.shared.high.saw_revision(revision);
                Ok(PutOutcome::Written { revision, create_revision })
            }
            "conflict" => Ok(PutOutcome::Conflict { current: self.saw(r.optional_key_value()?) }),
            "lease_not_found" => Err(KvError::LeaseNotFound(lease)),
            _ => Err(r.unexpected()),
        }
    }

    async fn create_counted(
        &self,
        key: &[u8],
        value: &[u8],
        lease: Option<LeaseId>,
        tally: &[u8],
        tally_lease: Option<LeaseId>,
    ) -> KvResult<CountedCreate> {
        check_write(key, value)?;
        check_key(tally)?;
        let (key_lease, tally_lease) = (lease_arg(lease)?, lease_arg(tally_lease)?);
        let args = [key, value, &num(key_lease), tally, &num(tally_lease)];
        let mut r = self.shared.call("create_counted", &args, Retry::Once).await?;
        match r.tag.as_str() {
            "ok" => {
                let revision = r.int()?;
                let create_revision = r.int()?;
                let count = r.int()?;
                self.shared.high.saw_revision(revision + 1);
                let outcome = PutOutcome::Written { revision, create_revision };
                Ok(CountedCreate { outcome, tally: Some(u64::try_from(count).unwrap_or(0)) })
            }
            "conflict" => {
                let current = self.saw(r.optional_key_value()?);
                Ok(CountedCreate { outcome: PutOutcome::Conflict { current }, tally: None })
            }
            "lease_not_found" => Err(KvError::LeaseNotFound(r.int()?)),
            _ => Err(r.unexpected()),
        }
    }

    async fn delete(&self, key: &[u8], mode: DeleteMode) -> KvResult<DeleteOutcome> {
        check_key(key)?;
        let (mode, expect): (&[u8], Revision) = match mode {
            DeleteMode::Any => (b"a", 0),
            DeleteMode::IfRevision(rev) => (b"i", rev),
        };
        let mut r = self.shared.call("delete", &[key, mode, &num(expect)], Retry::Once).await?;
        match r.tag.as_str() {
            "ok" => {
                let revision = r.int()?;
                self.shared.high.saw_revision(revision);
                Ok(DeleteOutcome::Deleted { revision })
            }
            "missing" => Ok(DeleteOutcome::Missing),
            "conflict" => Ok(DeleteOutcome::Conflict { current: self.saw(r.optional_key_value()?) }),
            _ => Err(r.unexpected()),
        }
    }

    async fn delete_prefix(&self, prefix: &[u8]) -> KvResult<DeletePrefixResponse> {
        check_key(prefix)?;
        if prefix.is_empty() {
            return Err(KvError::InvalidArgument(
                "delete_prefix needs a non-empty prefix (deleting every key is not allowed)".into(),
            ));
        }
        self.delete_first(prefix, 0).await
    }

    async fn delete_prefix_limited(&self, prefix: &[u8], limit: usize) -> KvResult<DeletePrefixResponse> {
        check_key(prefix)?;
        rdzv_core::kv::check_delete_piece(prefix, limit)?;
        self.delete_first(prefix, limit).await
    }

    async fn lease_grant(&self, ttl: Duration) -> KvResult<LeaseId> {
        if ttl.is_zero() {
            return Err(KvError::InvalidArgument("a lease TTL must be longer than zero".into()));
        }
        let ttl = ttl.max(crate::reaper::MIN_LEASE_TTL);
        let ms = ttl.as_micros().div_ceil(1000);
        if ms > 1 << 40 {
            return Err(KvError::InvalidArgument(format!("lease TTL {ttl:?} is too long")));
        }
        let mut r = self.shared.call("grant", &[&num(ms)], Retry::Once).await?;
        let lease = r.int()?;
        self.shared.high.saw_lease(lease);
        Ok(lease)
    }

    async fn lease_keep_alive(&self, lease: LeaseId) -> KvResult<Duration> {
        let mut r = self.shared.call("keep_alive", &[&num(lease)], Retry::Idempotent).await?;
        match r.tag.as_str() {
            "ok" => Ok(Duration::from_millis(u64::try_from(r.int()?).unwrap_or(0))),
            "lease_not_found" => Err(KvError::LeaseNotFound(lease)),
            _ => Err(r.unexpected()),
        }
    }

    /// One script call per 512 leases, on a connection of their own (see
    /// `Shared::call_keeper`).
    async fn lease_keep_alive_many(&self, leases: &[LeaseId]) -> Vec<KvResult<Duration>> {
        let mut answers = Vec::with_capacity(leases.len());
        for chunk in leases.chunks(KEEP_ALIVE_BATCH) {
            match self.keep_alive_chunk(chunk).await {
                Ok(ttls) => answers.extend(ttls),
                Err(e) => {
                    let copies: Vec<_> = chunk.iter().skip(1).map(|_| Err(e.duplicate())).collect();
                    answers.push(Err(e));
                    answers.extend(copies);
                }
            }
        }
        answers
    }

    async fn lease_revoke(&self, lease: LeaseId) -> KvResult<()> {
        let r = self.shared.call("revoke", &[&num(lease)], Retry::Once).await?;
        match r.tag.as_str() {
            "ok" => Ok(()),
            "lease_not_found" => Err(KvError::LeaseNotFound(lease)),
            _ => Err(r.unexpected()),
        }
    }

    async fn watch(&self, key: &[u8], scope: WatchScope, start_revision: Revision) -> KvResult<WatchStream> {
        check_key(key)?;
        crate::watch::start(&self.shared, key.to_vec(), scope, start_revision).await
    }

    async fn increment(&self, key: &[u8], delta: i64) -> KvResult<Option<i64>> {
        check_key(key)?;
        // Lua numbers are doubles: beyond 2^53 the script declines and compare-and-swap,
        // which is exact, takes over.
        if delta.unsigned_abs() >= 1 << 53 {
            return Ok(None);
        }
        let mut r = self.shared.call("incr", &[key, &num(delta)], Retry::Once).await?;
        match r.tag.as_str() {
            "ok" => Ok(Some(r.int()?)),
            "fallback" => Ok(None),
            "not_integer" => Err(KvError::InvalidArgument(format!(
                "cannot increment `{}`: its value is not a decimal integer",
                rdzv_core::kv::show_key(key)
            ))),
            _ => Err(r.unexpected()),
        }
    }

    async fn compact(&self, revision: Revision) -> KvResult<()> {
        let mut r = self.shared.call("compact", &[&num(revision)], Retry::Idempotent).await?;
        match r.tag.as_str() {
            "ok" => Ok(()),
            "future" => Err(KvError::InvalidArgument(format!(
                "cannot compact to revision {revision}: the current revision is {}",
                r.int()?
            ))),
            _ => Err(r.unexpected()),
        }
    }
}
