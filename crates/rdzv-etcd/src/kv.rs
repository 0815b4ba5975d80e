//! [`EtcdKv`]: the [`Kv`] contract on etcd v3. Every precondition is a compare in one
//! transaction whose failure branch reads the key, so a lost race costs one round trip and
//! tells the loser the winner.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, CompactionOptions, Compare, CompareOp, DeleteOptions, GetOptions, ResponseHeader, SortOrder,
    SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use rdzv_core::kv::{
    Capabilities, CountedCreate, DeleteMode, DeleteOutcome, DeletePrefixResponse, GetResponse, KeyValue,
    LeaseId, PutMode, PutOptions, PutOutcome, RangeOptions, RangeOrder, RangeResponse, Revision, SizeLimit,
    WatchScope, WatchStream,
};
use rdzv_core::{Kv, KvError, KvResult};

use crate::client::{self, Clients, ConnectError, Resend, Shared};
use crate::config::{
    DEFAULT_MAX_REQUEST_BYTES, DEFAULT_REQUEST_TIMEOUT, EtcdOptions, MAX_KEY_BYTES, MIN_MAX_REQUEST_BYTES,
    REQUEST_RESERVE_BYTES,
};
use crate::error::{self, BACKEND};
use crate::keep_alive::OpenStream;
use crate::keys::Namespace;
use crate::watch;

/// The smallest lease TTL etcd honours with its default timing flags: it grants at least
/// `ceil(1.5 × election timeout)` = `ceil(1.5 × 1 s)` = 2 s, whatever is asked.
pub const MIN_LEASE_TTL: Duration = Duration::from_secs(2);

/// The etcd v3 backend: a [`Kv`] over a shared `etcd-client` client.
///
/// Cheap to clone; clones share the client. Build it with [`EtcdKv::connect`] (which shares
/// one client per connection settings and runtime) or [`EtcdKv::from_client`].
#[derive(Clone)]
pub struct EtcdKv {
    shared: Arc<Shared>,
    namespace: Namespace,
    request_timeout: Duration,
    max_request_bytes: usize,
}

impl std::fmt::Debug for EtcdKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdKv")
            .field("endpoints", &self.shared.endpoints)
            .field("username", &self.shared.username)
            .field("namespace", &String::from_utf8_lossy(self.namespace.as_bytes()))
            .field("request_timeout", &self.request_timeout)
            .field("max_request_bytes", &self.max_request_bytes)
            .finish_non_exhaustive()
    }
}

impl EtcdKv {
    /// Connects to the cluster of `options`, or attaches to the client already connected
    /// with the same endpoints, credentials, TLS files and connect timeout in this tokio
    /// runtime. The first connect checks that the cluster answers within
    /// `options.connect_timeout`.
    ///
    /// Errors: [`KvError::Unavailable`] (naming the endpoints) when no endpoint answers or
    /// TLS fails; [`KvError::InvalidArgument`] for unreadable TLS files;
    /// [`KvError::Backend`] when authentication fails.
    pub async fn connect(options: EtcdOptions) -> KvResult<EtcdKv> {
        EtcdKv::open(&options).await.map_err(|e| match e {
            ConnectError::Config(e) => KvError::InvalidArgument(e.to_string()),
            ConnectError::Kv(e) => e,
        })
    }

    /// [`EtcdKv::connect`], keeping configuration errors apart.
    pub(crate) async fn open(options: &EtcdOptions) -> Result<EtcdKv, ConnectError> {
        Ok(EtcdKv {
            shared: client::shared(options).await?,
            namespace: Namespace::default(),
            request_timeout: options.request_timeout,
            max_request_bytes: options.max_request_bytes,
        })
    }

    /// Wraps a client the caller connected. `endpoints` is only shown in errors (give the
    /// endpoints, never credentials). Requests time out after 10 s; see
    /// [`EtcdKv::with_request_timeout`].
    pub fn from_client(client: Client, endpoints: impl Into<String>) -> EtcdKv {
        EtcdKv {
            shared: Arc::new(Shared::from_client(client, endpoints.into())),
            namespace: Namespace::default(),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
        }
    }

    /// The same backend (sharing the client), with every key under `prefix`: keys are
    /// prefixed on the way in and cut on the way out, ranges and watches stay inside it.
    /// Revisions stay cluster-wide.
    pub fn with_namespace(mut self, prefix: impl Into<Vec<u8>>) -> EtcdKv {
        let mut full = self.namespace.as_bytes().to_vec();
        full.extend(prefix.into());
        self.namespace = Namespace::new(full);
        self
    }

    /// The same backend (sharing the client), with another per-request timeout.
    pub fn with_request_timeout(mut self, timeout: Duration) -> EtcdKv {
        self.request_timeout = timeout;
        self
    }

    /// The same backend (sharing the client), for a server whose `--max-request-bytes` is
    /// `bytes` (see [`EtcdOptions::max_request_bytes`]; at least
    /// [`MIN_MAX_REQUEST_BYTES`]).
    pub fn with_max_request_bytes(mut self, bytes: usize) -> EtcdKv {
        self.max_request_bytes = bytes.max(MIN_MAX_REQUEST_BYTES);
        self
    }

    /// The largest value a write may carry (see [`EtcdOptions::max_value_bytes`]).
    pub fn max_value_bytes(&self) -> usize {
        self.max_request_bytes.saturating_sub(REQUEST_RESERVE_BYTES)
    }

    /// The etcd key of `key`, if it is within [`MAX_KEY_BYTES`].
    fn key(&self, key: &[u8]) -> KvResult<Vec<u8>> {
        let full = self.namespace.key(key);
        check_key(&full)?;
        Ok(full)
    }

    /// The etcd range of `prefix`, if it is within [`MAX_KEY_BYTES`].
    fn prefix_range(&self, prefix: &[u8]) -> KvResult<(Vec<u8>, Vec<u8>)> {
        let (start, end) = self.namespace.prefix_range(prefix);
        check_key(&start)?;
        Ok((start, end))
    }

    /// Deletes every key from `start` (inclusive) to `end` (exclusive), namespaced already,
    /// as one write.
    async fn delete_range(&self, start: Vec<u8>, end: Vec<u8>) -> KvResult<DeletePrefixResponse> {
        let response = self
            .call("delete_prefix", None, |c| {
                let (mut kv, start, end) = (c.kv.clone(), start.clone(), end.clone());
                async move { kv.delete(start, Some(DeleteOptions::new().with_range(end))).await }
            })
            .await?;
        Ok(DeletePrefixResponse {
            deleted: u64::try_from(response.deleted()).unwrap_or(0),
            revision: revision(response.header())?,
        })
    }

    /// Refuses a value the server would refuse, before sending it.
    fn check_value(&self, value: &[u8]) -> KvResult<()> {
        let limit = self.max_value_bytes();
        SizeLimit { backend: BACKEND, what: "a value", limit, raise: Some(RAISE_VALUE_LIMIT) }
            .check(value.len())
    }

    /// The underlying client of the member requests currently go to (connecting it if
    /// needed), e.g. for administration the [`Kv`] trait does not cover.
    pub async fn client(&self) -> KvResult<Client> {
        let request = self.shared.client();
        let ctx = self.shared.context(self.request_timeout, None);
        match tokio::time::timeout(self.request_timeout, request).await {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(e)) => Err(error::classify("connect", e, ctx)),
            Err(_) => Err(error::timeout("connect", ctx)),
        }
    }

    /// The endpoints as shown in errors (`http://host:port,…`).
    pub fn endpoints(&self) -> &str {
        &self.shared.endpoints
    }

    /// Whether `self` and `other` use one and the same client (and connections).
    pub fn shares_client_with(&self, other: &EtcdKv) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// How many clients [`EtcdKv::connect`] currently keeps for reuse, over all settings
    /// and runtimes (a diagnostic for "one client per process").
    pub fn cached_clients() -> usize {
        client::cached_clients()
    }

    /// Runs one request under the request timeout (on another member if the preferred one
    /// cannot be reached, see [`Shared::run`]), classifying its error.
    async fn call<T, F, Fut>(&self, operation: &str, lease: Option<LeaseId>, request: F) -> KvResult<T>
    where
        F: FnMut(&Clients) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.call_on(&self.shared, operation, lease, request).await
    }

    /// [`EtcdKv::call`] through `shared` (this client's or its keeper).
    async fn call_on<T, F, Fut>(
        &self,
        shared: &Shared,
        operation: &str,
        lease: Option<LeaseId>,
        request: F,
    ) -> KvResult<T>
    where
        F: FnMut(&Clients) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let ctx = self.shared.context(self.request_timeout, lease);
        let refresh = operation == "lease_keep_alive";
        // Waiting for a slot is not the request's time: the server is busy with the others.
        let _slot = if refresh { None } else { shared.requests.acquire().await.ok() };
        // Boxed once a slot is ours: a request's state (about 7 KiB with tonic's) then takes
        // memory only while the request is in flight, not in every caller waiting for a slot
        // (98,304 of them at the start of a large round).
        let run = Box::pin(shared.run_with(request, if refresh { Resend::IfLost } else { Resend::Never }));
        match tokio::time::timeout(self.request_timeout, run).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(error::classify(operation, e, ctx)),
            Err(_) => Err(error::timeout(operation, ctx)),
        }
    }

    /// What etcd's answer to a refresh of `id` means: its TTL, or, at 0, that the lease is
    /// gone (and its remembered TTL with it).
    fn answered(&self, id: LeaseId, ttl: i64) -> KvResult<Duration> {
        if ttl > 0 {
            return Ok(Duration::from_secs(u64::try_from(ttl).unwrap_or(1)));
        }
        self.shared.forget_ttl(id);
        Err(KvError::LeaseNotFound(id))
    }

    /// The refreshes of `leases` through `shared`, all sent at once on its connection's shared
    /// keep-alive streams, under one deadline; `None` where it has no such streams, or where
    /// every refresh failed for want of a member on every member (each is then tried alone,
    /// failing over between members as a single refresh does).
    async fn keep_alive_all_on(
        &self,
        shared: &Shared,
        leases: &[LeaseId],
    ) -> Option<Vec<KvResult<Duration>>> {
        let batch = |c: &Clients| {
            let streams = c.refreshes.clone();
            async move {
                let Some(streams) = streams else { return Ok(None) };
                let mut answers = streams.refresh_many(leases).await;
                // Every one failed because the member could not be reached or was lost
                // meanwhile (a member killed before this connection noticed fails them all
                // with a broken pipe): the next member gets the batch. A refresh sent twice
                // only renews its lease twice.
                let lost = |a: &Result<_, _>| a.as_ref().is_err_and(error::is_unreachable);
                if !answers.is_empty() && answers.iter().all(lost) {
                    return answers.swap_remove(0).map(|_| None);
                }
                Ok(Some(answers))
            }
        };
        let sent = shared.run_with(batch, Resend::IfLost);
        let ctx = |id| self.shared.context(self.request_timeout, Some(id));
        let answers = match tokio::time::timeout(self.request_timeout, Box::pin(sent)).await {
            Ok(Ok(answers)) => answers?,
            Ok(Err(_)) => return None,
            Err(_) => {
                return Some(
                    leases.iter().map(|&id| Err(error::timeout("lease_keep_alive", ctx(id)))).collect(),
                );
            }
        };
        let answered = leases.iter().zip(answers).map(|(&id, answer)| match answer {
            Ok(ttl) => self.answered(id, ttl),
            Err(e) => Err(error::classify("lease_keep_alive", e, ctx(id))),
        });
        Some(answered.collect())
    }

    /// One refresh of `id` through `shared` (this client's connection or its keeper), on the
    /// stream the last refresh of `id` there left open (`keep_alive.rs`), else on a new one,
    /// which is then kept.
    async fn keep_alive_on(&self, shared: &Shared, id: LeaseId) -> KvResult<Duration> {
        // On the connection's shared keep-alive streams (`lease_streams.rs`) where it has them.
        let shared_streams = self
            .call_on(shared, "lease_keep_alive", Some(id), |c| {
                let streams = c.refreshes.clone();
                async move {
                    match streams {
                        Some(streams) => streams.refresh(id).await.map(Some),
                        None => Ok(None),
                    }
                }
            })
            .await;
        if let Some(ttl) = shared_streams? {
            return self.answered(id, ttl);
        }
        if let Some(mut open) = shared.keep_alives.take(id) {
            match tokio::time::timeout(self.request_timeout, open.refresh()).await {
                Ok(Ok(ttl)) => {
                    if ttl > 0 {
                        shared.keep_alives.give_back(id, open);
                    }
                    return self.answered(id, ttl);
                }
                Err(_) => {
                    let ctx = self.shared.context(self.request_timeout, Some(id));
                    return Err(error::timeout("lease_keep_alive", ctx));
                }
                // The stream broke (its connection was lost): a new one, on the member that answers.
                Ok(Err(e)) => {
                    tracing::debug!(lease = id, error = %e, "keep-alive stream broken; opening another")
                }
            }
        }
        let known_ttl = self.shared.known_ttl(id);
        let result = self
            .call_on(shared, "lease_keep_alive", Some(id), |c| {
                let mut lease = c.lease.clone();
                async move {
                    // One refresh; etcd answers with the TTL, or 0 if the lease is gone (which
                    // etcd-client reports as "lease not found").
                    // etcd-client's only `LeaseKeepAliveError` here is its own answer to TTL
                    // 0 (the request channel it sends on cannot be closed yet).
                    let (keeper, responses) = match lease.keep_alive(id).await {
                        Err(etcd_client::Error::LeaseKeepAliveError(_)) => Err(error::lease_not_found()),
                        other => other,
                    }?;
                    let mut open = OpenStream::new(keeper, responses);
                    if let Some(ttl) = known_ttl {
                        return Ok((ttl, open));
                    }
                    // Granted elsewhere: a second refresh on the same stream tells the TTL.
                    match open.refresh().await? {
                        ttl if ttl > 0 => Ok((ttl, open)),
                        _ => Err(error::lease_not_found()),
                    }
                }
            })
            .await;
        match result {
            Ok((ttl, open)) => {
                if known_ttl.is_none() {
                    self.shared.remember_ttl(id, ttl);
                }
                shared.keep_alives.give_back(id, open);
                Ok(Duration::from_secs(u64::try_from(ttl).unwrap_or(1)))
            }
            Err(e) => {
                if matches!(e, KvError::LeaseNotFound(_)) {
                    self.shared.forget_ttl(id);
                }
                Err(e)
            }
        }
    }

    fn convert(&self, kv: etcd_client::KeyValue) -> KeyValue {
        self.namespace.convert(kv)
    }

    /// The first key of the `index`-th response of a transaction, if it is a read.
    fn read_in_txn(&self, response: &mut [TxnOpResponse], index: usize) -> Option<KeyValue> {
        match response.get_mut(index) {
            Some(TxnOpResponse::Get(get)) => get.take_kvs().into_iter().next().map(|kv| self.convert(kv)),
            _ => None,
        }
    }

    /// The store's current revision (one count-only read of an empty range).
    async fn current_revision(&self) -> KvResult<Revision> {
        let response = self
            .call("compact", None, |c| {
                let mut kv = c.kv.clone();
                async move { kv.get(vec![0u8], Some(GetOptions::new().with_count_only())).await }
            })
            .await?;
        revision(response.header())
    }

    /// Which of a counted create's two leases is gone, after etcd refused the transaction
    /// for a missing lease without naming it: the tally's, if a look at it says so, else the
    /// key's.
    async fn missing_lease(&self, lease: Option<LeaseId>, tally_lease: Option<LeaseId>) -> KvError {
        let (Some(lease), Some(tally_lease)) = (lease, tally_lease) else {
            return KvError::LeaseNotFound(lease.or(tally_lease).unwrap_or_default());
        };
        let probe = self
            .call("lease_time_to_live", Some(tally_lease), |c| {
                let mut leases = c.lease.clone();
                async move { leases.time_to_live(tally_lease, None).await }
            })
            .await;
        match probe {
            Ok(answer) if answer.ttl() > 0 => KvError::LeaseNotFound(lease),
            Ok(_) | Err(KvError::LeaseNotFound(_)) => KvError::LeaseNotFound(tally_lease),
            Err(other) => other,
        }
    }

    /// Sends the transaction `build` makes, building it only once a slot is ours (again for
    /// each try): a request waiting for a slot holds its inputs, not etcd's request with its
    /// copies of every key (in a round of 98,304 in-process workers, every write waits at once).
    async fn txn(
        &self,
        operation: &str,
        lease: Option<LeaseId>,
        build: impl Fn() -> Txn,
    ) -> KvResult<TxnResponse> {
        self.call(operation, lease, |c| {
            let (mut kv, txn) = (c.kv.clone(), build());
            async move { kv.txn(txn).await }
        })
        .await
    }
}

/// How the value limit is raised (docs/ETCD.md, "Size limits").
const RAISE_VALUE_LIMIT: &str = "start the servers with a larger --max-request-bytes and give the URL option max_request_bytes the same value";

/// Refuses a key (namespace included) over [`MAX_KEY_BYTES`], before sending it.
fn check_key(full: &[u8]) -> KvResult<()> {
    const KEY: SizeLimit =
        SizeLimit { backend: BACKEND, what: "a key (namespace included)", limit: MAX_KEY_BYTES, raise: None };
    KEY.check(full.len())
}

/// The revision of a response header; etcd always sends one.
fn revision(header: Option<&ResponseHeader>) -> KvResult<Revision> {
    header
        .map(ResponseHeader::revision)
        .ok_or_else(|| KvError::backend(BACKEND, "etcd sent a response without a header"))
}

/// Ceil of a TTL in whole seconds, at least 1 (etcd's granularity).
fn ttl_seconds(ttl: Duration) -> KvResult<i64> {
    let whole = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(whole.max(1))
        .map_err(|_| KvError::InvalidArgument(format!("lease TTL {ttl:?} is too long")))
}

#[async_trait]
impl Kv for EtcdKv {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        // No native increment: etcd has none (the Store increments with compare-and-swap).
        Capabilities {
            min_lease_ttl: MIN_LEASE_TTL,
            count_at_revision: true,
            counted_create: true,
            ..Capabilities::default()
        }
    }

    async fn get(&self, key: &[u8]) -> KvResult<GetResponse> {
        let key = self.key(key)?;
        let mut response = self
            .call("get", None, |c| {
                let (mut kv, key) = (c.kv.clone(), key.clone());
                async move { kv.get(key, None).await }
            })
            .await?;
        Ok(GetResponse {
            revision: revision(response.header())?,
            kv: response.take_kvs().into_iter().next().map(|kv| self.convert(kv)),
        })
    }

    /// etcd counts a past revision from its index alone, whereas a count with a
    /// creation-revision filter has to read every key of the range.
    async fn count_at_revision(&self, prefix: &[u8], at: Revision) -> KvResult<u64> {
        let (start, end) = self.prefix_range(prefix)?;
        let get = GetOptions::new().with_range(end).with_count_only().with_revision(at);
        let response = self
            .call("count", None, |c| {
                let (mut kv, start, get) = (c.kv.clone(), start.clone(), get.clone());
                async move { kv.get(start, Some(get)).await }
            })
            .await?;
        Ok(u64::try_from(response.count()).unwrap_or(0))
    }

    async fn range(&self, prefix: &[u8], options: RangeOptions) -> KvResult<RangeResponse> {
        let (start, end) = self.prefix_range(prefix)?;
        let mut get = GetOptions::new().with_range(end.clone());
        if options.order == RangeOrder::ByCreateRevision {
            get = get.with_sort(SortTarget::Create, SortOrder::Ascend);
        }
        let limit = options.limit.map(|l| i64::try_from(l).unwrap_or(i64::MAX));
        let Some(max_create) = options.max_create_revision else {
            // etcd's count is exact here: all matches, before the limit.
            if options.count_only || limit == Some(0) {
                get = get.with_count_only();
            } else if let Some(limit) = limit {
                get = get.with_limit(limit);
            }
            if options.keys_only {
                get = get.with_keys_only();
            }
            let mut response = self
                .call("range", None, |c| {
                    let (mut kv, start, get) = (c.kv.clone(), start.clone(), get.clone());
                    async move { kv.get(start, Some(get)).await }
                })
                .await?;
            let kvs = if options.count_only || limit == Some(0) {
                Vec::new()
            } else {
                response.take_kvs().into_iter().map(|kv| self.convert(kv)).collect()
            };
            return Ok(RangeResponse {
                count: u64::try_from(response.count()).unwrap_or(0),
                revision: revision(response.header())?,
                kvs,
            });
        };
        // etcd counts the range *before* the creation-revision filter, so the count comes
        // from the filtered keys themselves (keys only, no values), in the same transaction
        // as the values when those are wanted.
        if max_create < 1 {
            // Nothing was created at or before revision 0; only the read's revision counts.
            let probe = GetOptions::new().with_range(end).with_count_only();
            let response = self
                .call("range", None, |c| {
                    let (mut kv, start, probe) = (c.kv.clone(), start.clone(), probe.clone());
                    async move { kv.get(start, Some(probe)).await }
                })
                .await?;
            return Ok(RangeResponse { kvs: Vec::new(), count: 0, revision: revision(response.header())? });
        }
        let get = get.with_max_create_revision(max_create);
        let keys = get.clone().with_keys_only();
        let wants_values = !options.count_only && !options.keys_only && limit != Some(0);
        let values = wants_values.then(|| match limit {
            Some(limit) => get.with_limit(limit),
            None => get,
        });
        let txn = || {
            let mut ops = vec![TxnOp::get(start.clone(), Some(keys.clone()))];
            ops.extend(values.clone().map(|values| TxnOp::get(start.clone(), Some(values))));
            Txn::new().and_then(ops)
        };
        let response = self.txn("range", None, txn).await?;
        let rev = revision(response.header())?;
        let mut responses = response.op_responses();
        let mut keys: Vec<KeyValue> = match responses.get_mut(0) {
            Some(TxnOpResponse::Get(get)) => get.take_kvs().into_iter().map(|kv| self.convert(kv)).collect(),
            _ => return Err(KvError::backend(BACKEND, "etcd sent no range response")),
        };
        let count = keys.len() as u64;
        let kvs = if options.count_only || limit == Some(0) {
            Vec::new()
        } else if wants_values {
            match responses.get_mut(1) {
                Some(TxnOpResponse::Get(get)) => {
                    get.take_kvs().into_iter().map(|kv| self.convert(kv)).collect()
                }
                _ => return Err(KvError::backend(BACKEND, "etcd sent no range response")),
            }
        } else {
            if let Some(limit) = options.limit {
                keys.truncate(limit);
            }
            keys
        };
        Ok(RangeResponse { kvs, count, revision: rev })
    }

    async fn put(&self, key: &[u8], value: &[u8], options: PutOptions) -> KvResult<PutOutcome> {
        let key = self.key(key)?;
        self.check_value(value)?;
        let txn = || {
            let mut put_options = etcd_client::PutOptions::new();
            if let Some(lease) = options.lease {
                put_options = put_options.with_lease(lease);
            }
            let write = TxnOp::put(key.clone(), value, Some(put_options));
            // Read back after the write for the key's create revision (keys only: no value).
            let read_back = || TxnOp::get(key.clone(), Some(GetOptions::new().with_keys_only()));
            let current = || TxnOp::get(key.clone(), None);
            match options.mode {
                PutMode::Overwrite => Txn::new().and_then(vec![write, read_back()]),
                PutMode::Create => Txn::new()
                    .when(vec![Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                    .and_then(vec![write])
                    .or_else(vec![current()]),
                PutMode::Update(expected) => Txn::new()
                    .when(vec![
                        Compare::mod_revision(key.clone(), CompareOp::Equal, expected),
                        // "Exists" too, so that Update(0) never creates.
                        Compare::version(key.clone(), CompareOp::Greater, 0),
                    ])
                    .and_then(vec![write, read_back()])
                    .or_else(vec![current()]),
            }
        };
        let response = self.txn("put", options.lease, txn).await?;
        let rev = revision(response.header())?;
        let mut responses = response.op_responses();
        if !response.succeeded() {
            return Ok(PutOutcome::Conflict { current: self.read_in_txn(&mut responses, 0) });
        }
        let create_revision = match options.mode {
            PutMode::Create => rev,
            _ => self.read_in_txn(&mut responses, 1).map_or(rev, |kv| kv.create_revision),
        };
        Ok(PutOutcome::Written { revision: rev, create_revision })
    }

    /// One transaction: the create, and a put of the tally key with its previous value
    /// returned, whose version (etcd counts a key's puts) before the put plus one is the
    /// tally.
    async fn create_counted(
        &self,
        key: &[u8],
        value: &[u8],
        lease: Option<LeaseId>,
        tally: &[u8],
        tally_lease: Option<LeaseId>,
    ) -> KvResult<CountedCreate> {
        let key = self.key(key)?;
        let tally = self.key(tally)?;
        self.check_value(value)?;
        let bound = |lease: Option<LeaseId>| {
            let options = etcd_client::PutOptions::new();
            match lease {
                Some(lease) => options.with_lease(lease),
                None => options,
            }
        };
        let txn = || {
            Txn::new()
                .when(vec![Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then(vec![
                    TxnOp::put(key.clone(), value, Some(bound(lease))),
                    TxnOp::put(tally.clone(), Vec::new(), Some(bound(tally_lease).with_prev_key())),
                ])
                .or_else(vec![TxnOp::get(key.clone(), None)])
        };
        let response = match self.txn("create_counted", lease.or(tally_lease), txn).await {
            // etcd does not say which lease is missing: ask about the tally's.
            Err(KvError::LeaseNotFound(_))
                if lease.is_some() && tally_lease.is_some() && lease != tally_lease =>
            {
                return Err(self.missing_lease(lease, tally_lease).await);
            }
            other => other?,
        };
        let rev = revision(response.header())?;
        let mut responses = response.op_responses();
        if !response.succeeded() {
            let current = self.read_in_txn(&mut responses, 0);
            return Ok(CountedCreate { outcome: PutOutcome::Conflict { current }, tally: None });
        }
        let before = match responses.get(1) {
            Some(TxnOpResponse::Put(put)) => put.prev_key().map_or(0, |kv| kv.version()),
            _ => return Err(KvError::backend(BACKEND, "etcd answered a transaction without its put")),
        };
        let tally = u64::try_from(before).unwrap_or(0) + 1;
        Ok(CountedCreate {
            outcome: PutOutcome::Written { revision: rev, create_revision: rev },
            tally: Some(tally),
        })
    }

    async fn delete(&self, key: &[u8], mode: DeleteMode) -> KvResult<DeleteOutcome> {
        let key = self.key(key)?;
        match mode {
            DeleteMode::Any => {
                let response = self
                    .call("delete", None, |c| {
                        let (mut kv, key) = (c.kv.clone(), key.clone());
                        async move { kv.delete(key, None).await }
                    })
                    .await?;
                if response.deleted() > 0 {
                    Ok(DeleteOutcome::Deleted { revision: revision(response.header())? })
                } else {
                    Ok(DeleteOutcome::Missing)
                }
            }
            DeleteMode::IfRevision(expected) => {
                let txn = || {
                    Txn::new()
                        .when(vec![
                            Compare::mod_revision(key.clone(), CompareOp::Equal, expected),
                            Compare::version(key.clone(), CompareOp::Greater, 0),
                        ])
                        .and_then(vec![TxnOp::delete(key.clone(), None)])
                        .or_else(vec![TxnOp::get(key.clone(), None)])
                };
                let response = self.txn("delete", None, txn).await?;
                let rev = revision(response.header())?;
                let mut responses = response.op_responses();
                if response.succeeded() {
                    Ok(DeleteOutcome::Deleted { revision: rev })
                } else {
                    Ok(DeleteOutcome::Conflict { current: self.read_in_txn(&mut responses, 0) })
                }
            }
        }
    }

    async fn delete_prefix(&self, prefix: &[u8]) -> KvResult<DeletePrefixResponse> {
        if prefix.is_empty() {
            return Err(KvError::InvalidArgument(
                "delete_prefix needs a non-empty prefix (refusing to delete every key)".to_string(),
            ));
        }
        let (start, end) = self.prefix_range(prefix)?;
        self.delete_range(start, end).await
    }

    /// Lists the piece's keys (keys only, at most `limit`), then deletes from the prefix's
    /// start to its last key: a bounded write, where one delete of thousands of keys (each
    /// detached from its lease) holds etcd's apply for seconds and fills the read buffer that
    /// every request of 3.4 copies.
    async fn delete_prefix_limited(&self, prefix: &[u8], limit: usize) -> KvResult<DeletePrefixResponse> {
        rdzv_core::kv::check_delete_piece(prefix, limit)?;
        let (start, end) = self.prefix_range(prefix)?;
        let list = GetOptions::new()
            .with_range(end.clone())
            .with_keys_only()
            .with_limit(i64::try_from(limit).unwrap_or(i64::MAX));
        let listed = self
            .call("range", None, |c| {
                let (mut kv, start, list) = (c.kv.clone(), start.clone(), list.clone());
                async move { kv.get(start, Some(list)).await }
            })
            .await?;
        let Some(last) = listed.kvs().last() else {
            return Ok(DeletePrefixResponse { deleted: 0, revision: revision(listed.header())? });
        };
        // Nothing beyond the listed keys: the whole prefix goes.
        let piece_end = if listed.count() <= listed.kvs().len() as i64 {
            end
        } else {
            let mut after_last = last.key().to_vec();
            after_last.push(0);
            after_last
        };
        self.delete_range(start, piece_end).await
    }

    async fn lease_grant(&self, ttl: Duration) -> KvResult<LeaseId> {
        let seconds = ttl_seconds(ttl)?;
        let response = self
            .call("lease_grant", None, |c| {
                let mut lease = c.lease.clone();
                async move { lease.grant(seconds, None).await }
            })
            .await?;
        if !response.error().is_empty() {
            return Err(error::grant_answer(response.error(), &self.shared.endpoints));
        }
        let id = response.id();
        self.shared.remember_ttl(id, response.ttl());
        Ok(id)
    }

    async fn lease_keep_alive(&self, id: LeaseId) -> KvResult<Duration> {
        self.keep_alive_on(&self.shared, id).await
    }

    /// Through the keeper connection (see `Shared::keeper`): all at once on its shared
    /// keep-alive streams, else one lease per request, at most 64 in flight.
    async fn lease_keep_alive_many(&self, leases: &[LeaseId]) -> Vec<KvResult<Duration>> {
        use futures::StreamExt;
        let keeper = self.shared.keeper();
        if let Some(answers) = self.keep_alive_all_on(keeper, leases).await {
            return answers;
        }
        // Each refresh's future is made when `buffered` starts it, so at most 64 exist at once.
        let refreshes =
            futures::stream::iter(leases.iter().copied()).map(|lease| self.keep_alive_on(keeper, lease));
        refreshes.buffered(64).collect().await
    }

    async fn lease_revoke(&self, id: LeaseId) -> KvResult<()> {
        let result = self
            .call("lease_revoke", Some(id), |c| {
                let mut lease = c.lease.clone();
                async move { lease.revoke(id).await }
            })
            .await;
        self.shared.keep_alives.close(id);
        self.shared.keeper().keep_alives.close(id);
        if matches!(result, Ok(_) | Err(KvError::LeaseNotFound(_))) {
            self.shared.forget_ttl(id);
        }
        result.map(|_| ())
    }

    async fn watch(&self, key: &[u8], scope: WatchScope, start_revision: Revision) -> KvResult<WatchStream> {
        let (start, end) = match scope {
            WatchScope::Key => (self.key(key)?, None),
            WatchScope::Prefix => {
                let (start, end) = self.prefix_range(key)?;
                (start, Some(end))
            }
        };
        watch::open(
            watch::Target {
                shared: self.shared.clone(),
                namespace: self.namespace.clone(),
                key: start,
                range_end: end,
                request_timeout: self.request_timeout,
            },
            start_revision.max(1),
        )
        .await
    }

    async fn compact(&self, revision: Revision) -> KvResult<()> {
        let compacted = self
            .call("compact", None, |c| {
                let mut kv = c.kv.clone();
                // Physical: return once the history is really gone, so that a watch from an
                // older revision fails right after.
                async move {
                    match kv.compact(revision, Some(CompactionOptions::new().with_physical())).await {
                        Ok(_) => Ok(true),
                        // etcd answers OutOfRange both when `revision` is already compacted
                        // and when it is in the future; the current revision tells which.
                        Err(e) if error::server_code(&e) == Some(tonic::Code::OutOfRange) => Ok(false),
                        Err(e) => Err(e),
                    }
                }
            })
            .await?;
        if compacted {
            return Ok(());
        }
        let current = self.current_revision().await?;
        if revision <= current {
            // Already compacted at or past `revision`: nothing left to do.
            Ok(())
        } else {
            Err(KvError::InvalidArgument(format!(
                "etcd compact: revision {revision} is in the future (the current revision is {current})"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_rounds_up_to_whole_seconds() {
        assert_eq!(ttl_seconds(Duration::from_millis(1)).ok(), Some(1));
        assert_eq!(ttl_seconds(Duration::ZERO).ok(), Some(1));
        assert_eq!(ttl_seconds(Duration::from_millis(1500)).ok(), Some(2));
        assert_eq!(ttl_seconds(Duration::from_secs(3)).ok(), Some(3));
    }
}
