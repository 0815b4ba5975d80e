//! The values that cross the [`Kv`](crate::Kv) trait: keys with their revisions, write
//! preconditions and their outcomes, range options, and watch events.

use std::time::Duration;

use bytes::Bytes;

/// A store-wide revision: strictly increases with every write (put or delete, including the
/// deletions caused by a lease's expiry). Revision 0 is "before anything"; real revisions
/// start at 1.
pub type Revision = i64;

/// The id of a lease granted by [`Kv::lease_grant`](crate::Kv::lease_grant).
pub type LeaseId = i64;

/// One key as stored, with its metadata.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyValue {
    /// The key, arbitrary bytes.
    pub key: Vec<u8>,
    /// The value, arbitrary bytes (empty in a delete event or with
    /// [`RangeOptions::keys_only`]). Cheap to clone: backends hand the same buffer to every
    /// reader and watcher of one revision of a key (a 400 KB rendezvous state watched by
    /// 4096 workers of one process is held once, not 4096 times).
    pub value: Bytes,
    /// Revision of the write that created this incarnation of the key.
    pub create_revision: Revision,
    /// Revision of the last write to the key (for a delete event: the deletion's revision).
    pub mod_revision: Revision,
    /// Number of writes since creation (1 after the creating write; 0 in a delete event).
    pub version: i64,
    /// The lease the key is bound to, if any.
    pub lease: Option<LeaseId>,
}

impl std::fmt::Debug for KeyValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyValue")
            .field("key", &String::from_utf8_lossy(&self.key))
            .field("value_len", &self.value.len())
            .field("create_revision", &self.create_revision)
            .field("mod_revision", &self.mod_revision)
            .field("version", &self.version)
            .field("lease", &self.lease)
            .finish()
    }
}

/// The precondition of a [`Kv::put`](crate::Kv::put).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutMode {
    /// Write whatever is there.
    Overwrite,
    /// Write only if the key is absent.
    Create,
    /// Write only if the key exists and its `mod_revision` is still this one.
    Update(Revision),
}

/// The precondition of a [`Kv::delete`](crate::Kv::delete).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteMode {
    /// Delete the key if it exists.
    Any,
    /// Delete only if the key exists and its `mod_revision` is still this one.
    IfRevision(Revision),
}

/// Options of a [`Kv::put`](crate::Kv::put).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PutOptions {
    /// The precondition.
    pub mode: PutMode,
    /// Bind the key to this lease (it is deleted when the lease ends); `None` = no lease.
    pub lease: Option<LeaseId>,
}

impl PutOptions {
    /// Unconditional write without a lease.
    pub const OVERWRITE: PutOptions = PutOptions { mode: PutMode::Overwrite, lease: None };

    /// Options with the given precondition and no lease.
    pub fn new(mode: PutMode) -> Self {
        PutOptions { mode, lease: None }
    }

    /// The same options, binding the key to `lease`.
    pub fn with_lease(mut self, lease: Option<LeaseId>) -> Self {
        self.lease = lease;
        self
    }
}

impl Default for PutOptions {
    fn default() -> Self {
        PutOptions::OVERWRITE
    }
}

/// What a [`Kv::put`](crate::Kv::put) did. A failed precondition is an outcome, not an
/// error: the loser learns the current key in the same round trip.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PutOutcome {
    /// The value was written at this revision (the key's new `mod_revision`; also its
    /// `create_revision` when the write created it).
    Written {
        /// Revision of the write.
        revision: Revision,
        /// The key's create revision after the write.
        create_revision: Revision,
    },
    /// The precondition failed; this is the key as it is now (`None`: absent).
    Conflict {
        /// The current key, if any.
        current: Option<KeyValue>,
    },
}

impl PutOutcome {
    /// Whether the value was written.
    pub fn is_written(&self) -> bool {
        matches!(self, PutOutcome::Written { .. })
    }
}

/// What a [`Kv::create_counted`](crate::Kv::create_counted) did: the create's outcome, and,
/// when it created the key, the tally after this creation (1 for the first creation the
/// tally saw).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CountedCreate {
    /// The create's outcome: `Written`, or `Conflict` with the key that was already there.
    pub outcome: PutOutcome,
    /// The tally's count including this creation; `None` when nothing was created.
    pub tally: Option<u64>,
}

/// What a [`Kv::delete`](crate::Kv::delete) did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeleteOutcome {
    /// The key existed and was deleted at `revision`.
    Deleted {
        /// Revision of the delete.
        revision: Revision,
    },
    /// There was no such key (with [`DeleteMode::Any`]); nothing was written.
    Missing,
    /// The precondition failed; this is the key as it is now (`None`: absent).
    Conflict {
        /// The current key, if any.
        current: Option<KeyValue>,
    },
}

/// The answer to a [`Kv::get`](crate::Kv::get).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GetResponse {
    /// The key, if it exists.
    pub kv: Option<KeyValue>,
    /// The store revision the read saw (watch from `revision + 1` to miss nothing after it).
    pub revision: Revision,
}

/// Order of the keys of a [`Kv::range`](crate::Kv::range).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RangeOrder {
    /// Ascending by key bytes.
    #[default]
    ByKey,
    /// Ascending by `create_revision` (the order in which keys were created).
    ByCreateRevision,
}

/// Options of a [`Kv::range`](crate::Kv::range).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RangeOptions {
    /// Return at most this many keys (`count` still counts all matches).
    pub limit: Option<usize>,
    /// Only keys whose `create_revision` is ≤ this.
    pub max_create_revision: Option<Revision>,
    /// Order of the returned keys.
    pub order: RangeOrder,
    /// Return keys with empty values.
    pub keys_only: bool,
    /// Return no keys, only `count`.
    pub count_only: bool,
}

/// The answer to a [`Kv::range`](crate::Kv::range).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeResponse {
    /// The matching keys (subject to `limit`, empty with `count_only`).
    pub kvs: Vec<KeyValue>,
    /// How many keys match, regardless of `limit`.
    pub count: u64,
    /// The store revision the read saw.
    pub revision: Revision,
}

/// The answer to a [`Kv::delete_prefix`](crate::Kv::delete_prefix).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeletePrefixResponse {
    /// How many keys were deleted.
    pub deleted: u64,
    /// The store revision after the delete (unchanged if nothing was deleted).
    pub revision: Revision,
}

/// What a watch covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WatchScope {
    /// Exactly the given key.
    Key,
    /// Every key that starts with the given bytes.
    Prefix,
}

/// Kind of a watch [`Event`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// The key was created or overwritten.
    Put,
    /// The key was deleted (explicitly, or because its lease ended).
    Delete,
}

/// One change delivered by a watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Put or delete.
    pub kind: EventKind,
    /// The key after the change. For a delete: `value` empty, `version` 0,
    /// `create_revision` 0, `mod_revision` = the deletion's revision.
    pub kv: KeyValue,
}

impl Event {
    /// The revision of the write that produced this event.
    pub fn revision(&self) -> Revision {
        self.kv.mod_revision
    }
}

/// What a backend can do: the one place a caller learns it. A call to a feature the backend
/// lacks fails with [`KvError::Unsupported`](crate::KvError::Unsupported) (the conformance
/// suite checks that it does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Watches from a past revision replay history (false: only from the current one).
    pub watch_history: bool,
    /// The backend can compact its history on demand (test hook).
    pub compaction: bool,
    /// The backend has a native [`Kv::increment`](crate::Kv::increment) (false: increment
    /// with a compare-and-swap of the decimal value).
    pub native_increment: bool,
    /// The smallest lease TTL the backend honours exactly; shorter TTLs are rounded up.
    pub min_lease_ttl: Duration,
    /// The backend counts the keys under a prefix as they were at a past revision without
    /// reading them ([`Kv::count_at_revision`](crate::Kv::count_at_revision)); without it,
    /// that method is [`KvError::Unsupported`](crate::KvError::Unsupported) and callers
    /// count with [`Kv::range`](crate::Kv::range)'s creation-revision filter instead.
    pub count_at_revision: bool,
    /// The backend creates a key and counts the creation in a tally in one atomic step
    /// ([`Kv::create_counted`](crate::Kv::create_counted)): a worker learns its place in a
    /// burst of arrivals without counting the others' keys. Without it, that method is
    /// [`KvError::Unsupported`](crate::KvError::Unsupported).
    pub counted_create: bool,
}

impl Default for Capabilities {
    /// History and compaction, no native increment, no count at a past revision, no counted
    /// create, leases of 1 s and more.
    fn default() -> Self {
        Capabilities {
            watch_history: true,
            compaction: true,
            native_increment: false,
            min_lease_ttl: Duration::from_secs(1),
            count_at_revision: false,
            counted_create: false,
        }
    }
}
