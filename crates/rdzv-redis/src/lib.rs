//! # rdzv-redis: etcd v3 semantics on Redis
//!
//! [`RedisKv`] implements the [`rdzv_core::Kv`] contract (revisions, compare-and-swap,
//! leases, watches from a past revision) on a plain Redis 7 server, so that teams that run
//! Redis and no etcd get the same rendezvous with the same guarantees. [`RedisFactory`]
//! builds one from a URL:
//!
//! ```text
//! redis://[user:pass@]host:6379/<run_id>?db=0&namespace=rdzv&connect_timeout=5s
//! rediss://host:6380/<run_id>?cacert=/etc/ssl/my-ca.pem        (TLS)
//! rediss://host:6380/<run_id>?cacert=ca.pem&cert=client.pem&key=client.key   (TLS, client certificate)
//! ```
//!
//! Options: `db` (database number), `cacert` (PEM CA for `rediss://`; default: the system's
//! roots), `cert` and `key` (PEM client certificate and its key, for servers with
//! `tls-auth-clients yes`; a server that wants one and gets none is reported as such),
//! `connect_timeout` (default 5 s), `request_timeout` (every request, default 10 s),
//! `namespace` (default `rdzv`; clients in different namespaces never see each other),
//! `history` (revisions of watch history kept, default 1 000 000), `history_bytes` (bytes of
//! watch history kept, default 64 MiB). Running Redis for rdzv in production (persistence,
//! ACL rules, TLS, memory) is described in `docs/REDIS.md` in the repository.
//!
//! ## Limits
//! Checked before anything is sent, failing with
//! [`KvError::TooLarge`](rdzv_core::KvError::TooLarge): a key (or prefix) of at most
//! [`MAX_KEY_BYTES`] (4 KiB), a value of at most [`MAX_VALUE_BYTES`] and a key and value
//! together of at most [`MAX_REQUEST_BYTES`] (both 1.5 MiB, etcd's default request limit).
//! A key is indexed under at most 51 prefixes (see the data layout), so a write costs a
//! bounded number of index updates whatever its key looks like.
//!
//! ## Why scripts
//! etcd answers "write this if the key's revision is still R, else tell me what is there" in
//! one atomic transaction. Redis has no such command, and `WATCH`/`MULTI` cannot be used on
//! a connection multiplexed between many concurrent callers (one caller's `WATCH` would
//! guard another's writes). A Lua script runs atomically on the server, so **every
//! operation is one call of one script** (loaded once, run by its SHA with `EVALSHA`): it
//! reaps expired leases, checks the precondition, bumps the namespace's revision counter,
//! stores the value with its metadata, updates the indexes and appends the event to the
//! log — or, when the precondition fails, returns the current key in the same round trip.
//! Reads are scripts too, so the revision they report and the data they return are one
//! snapshot. The script validates what it reads before its first write (Redis does not
//! roll scripts back), so a foreign value under our keys aborts it cleanly with an error
//! naming the key.
//!
//! ## The event log
//! Each namespace has one Redis stream whose entry ids are `<revision>-<n>`: a write appends
//! its events (one, or several for a prefix delete or an expiring lease) with the revision
//! it got. Each client tails that stream with one blocking `XREAD` on a connection of its
//! own (started with its first watch, ended with its last) and hands every entry to all its
//! watches, which filter by key or prefix in memory: a thousand watches cost Redis one
//! blocked reader. The feed keeps the latest entries in memory (at most 32 768 of them and
//! 32 MiB), so a watch from a recent revision — the usual "my write + 1" — replays them
//! without touching Redis, and so does a watch that fell behind the feed (its consumer was
//! busy during a burst); older history is read with `XRANGE` on the shared connection. Because every revision
//! has at least one entry and a revision's entries are appended atomically, a watch detects
//! any hole: after a broken connection the feed resumes from its last entry, and if the
//! entries a watch needs were trimmed it ends with
//! [`KvError::Compacted`](rdzv_core::KvError::Compacted),
//! naming the oldest revision still kept. The stream is trimmed to the last `history`
//! revisions and, oldest revisions first, to `history_bytes` (each event counting its key,
//! value and 64 bytes; the newest revision is always kept), or by
//! [`Kv::compact`](rdzv_core::Kv::compact); the `compacted` key records how far, so
//! compaction is detected exactly, and `logbytes` how much the log holds.
//!
//! ## Leases, on the server's clock
//! A lease is a deadline in a sorted set, computed from the Redis server's `TIME` inside the
//! script — never from a client's clock — plus the set of keys bound to it. Every script
//! first ends the leases whose deadline has passed: their keys are deleted, each lease's at
//! one new revision, with delete events in the log. So that an expiry produces its events
//! even when nobody writes, each client also runs a background reaper that calls the script
//! when the next deadline is due (at least every 200 ms); it stops when the client is
//! dropped. TTLs have millisecond precision, with a floor of 500 ms.
//!
//! ## Data layout (namespace `ns`, all under the hash tag `{rdzv:ns}`, so one cluster slot)
//! | key | type | holds |
//! |---|---|---|
//! | `{rdzv:ns}:rev` | string | the current revision |
//! | `{rdzv:ns}:epoch` | string | the namespace's identity (see below; `…:rolled-back:<found>:<seen>` after a rollback) |
//! | `{rdzv:ns}:k:<key>` | hash | `v` value, `c` create revision, `m` mod revision, `n` version, `l` lease |
//! | `{rdzv:ns}:names` | sorted set | every key, for prefix ranges by key (`ZRANGEBYLEX`) |
//! | `{rdzv:ns}:i:<dir>` | sorted set | the keys under `<dir>` scored by create revision: counts and creation-ordered ranges in O(log N). `<dir>` is a prefix ending at a key's 5th to 16th `/` (at most 12 per key; the rendezvous orders by creation under a round's `join/` and `waiting/`, at least five `/` deep); other prefixes are answered by filtering their keys |
//! | `{rdzv:ns}:log` | stream | the events, ids `<revision>-<n>` |
//! | `{rdzv:ns}:compacted` | string | the oldest revision the log still has |
//! | `{rdzv:ns}:logbytes` | string | the bytes the log's events count for (`history_bytes`) |
//! | `{rdzv:ns}:logsz` | stream | what each event counts for, same ids as the log (trimming reads these, not the values) |
//! | `{rdzv:ns}:leases` | sorted set | lease ids scored by deadline (server ms) |
//! | `{rdzv:ns}:lttl` | hash | each lease's TTL |
//! | `{rdzv:ns}:lk:<id>` | set | the keys bound to a lease |
//! | `{rdzv:ns}:leaseid` | string | the last lease id handed out |
//!
//! ## Connections and failures
//! Requests share one auto-reconnecting multiplexed connection; the watch feed has one more.
//! Every request is bounded by `request_timeout`. Reads, keep-alives and compaction are
//! retried within that bound after a connection failure; writes never are (their outcome
//! is unknown, and resending could apply them twice) — they fail with
//! [`KvError::Unavailable`](rdzv_core::KvError::Unavailable) or
//! [`KvError::Timeout`](rdzv_core::KvError::Timeout), which the caller may retry. A client
//! attaches to the namespace's *epoch*, created by the first client; if the server restarts
//! without persistence (or is flushed) the epoch is gone, and every operation and watch of
//! the old client fails with a clear error instead of serving a history that no longer
//! exists. If the server instead comes back with *older* data (restarted from an RDB/AOF
//! snapshot that misses the last writes, or a lagging replica promoted), the epoch survives
//! but the revision counter goes back, and revisions would be handed out again for
//! different writes. Each client remembers the highest revision and lease id it has seen;
//! every script call carries them and is refused when the server's counters are lower, and
//! the feed checks the same after every reconnect and whenever the log is quiet. The client
//! that finds a rollback fails that call, every later one and its open watches with a
//! non-retryable error saying "rolled back", and gives the namespace a new epoch so that
//! every other client attached to it stops too (at its next call, or its reaper's within
//! a second). New clients start over on what the server has.
//!
//! ## What the server needs
//! Redis 7 (Debian's 7.0 is what the tests run), or a compatible server with Lua scripting
//! and streams. Run it with `maxmemory-policy noeviction`: an evicted key would be a hole
//! in our data, which the script then reports as damage instead of guessing. With
//! persistence off, a restart loses the namespace; clients notice (see above) and say so.
//! Native [`Kv::increment`](rdzv_core::Kv::increment) is a script too; beyond ±2^53, where
//! Lua's numbers stop being exact, it declines and callers fall back to compare-and-swap.
//!
//! ## Example
//! ```no_run
//! use rdzv_core::Kv;
//! use rdzv_core::kv::{PutMode, PutOptions, PutOutcome};
//! use rdzv_redis::{RedisConfig, RedisKv};
//!
//! # async fn demo() -> Result<(), rdzv_core::KvError> {
//! let kv = RedisKv::connect(RedisConfig::new("127.0.0.1", 6379)).await?;
//! match kv.put(b"/jobs/42/leader", b"worker-7", PutOptions::new(PutMode::Create)).await? {
//!     PutOutcome::Written { revision, .. } => println!("leader since revision {revision}"),
//!     PutOutcome::Conflict { current } => println!("leader is already {current:?}"),
//! }
//! # Ok(())
//! # }
//! ```

mod client;
mod config;
mod connect;
mod error;
mod factory;
mod feed;
mod kept;
mod kv;
mod limits;
mod reaper;
mod reply;
mod shared;
mod watch;

#[cfg(feature = "testing")]
pub mod testing;

pub use config::{DEFAULT_NAMESPACE, DEFAULT_PORT, OPTIONS, RedisConfig};
pub use factory::RedisFactory;
pub use kv::RedisKv;
pub use limits::{MAX_KEY_BYTES, MAX_REQUEST_BYTES, MAX_VALUE_BYTES};
