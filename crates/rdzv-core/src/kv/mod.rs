//! The backend contract's values: a compare-and-swap / watch / lease key-value store modelled
//! on etcd v3. The rendezvous and the Store are written once against [`Kv`] (at the
//! crate root, with [`KvExt`](crate::KvExt), [`KvError`](crate::KvError) and
//! [`KvResult`]); a backend is anything that implements it faithfully. This
//! module holds what crosses the trait (keys with their revisions, write preconditions and
//! their outcomes, range options, leases, watch events) and the helpers a backend writes
//! its implementation with ([`SizeLimit`], [`prefix_end`], [`check_delete_piece`], [`show_key`]).

pub(crate) mod contract;
mod limit;
mod op;
mod prefix;
mod types;

/// The byte buffer of [`KeyValue::value`] (re-exported from the `bytes` crate): cheap to clone,
/// derefs to `[u8]`.
pub use bytes::Bytes;
pub use contract::WatchStream;
pub use limit::SizeLimit;
pub use op::Op;
pub use prefix::{check_delete_piece, prefix_end};
pub use types::{
    Capabilities, CountedCreate, DeleteMode, DeleteOutcome, DeletePrefixResponse, Event, EventKind,
    GetResponse, KeyValue, LeaseId, PutMode, PutOptions, PutOutcome, RangeOptions, RangeOrder, RangeResponse,
    Revision, WatchScope,
};

pub use crate::ext::{Watch, show_key};

// The trait and its result type have their one public path at the crate root; inside the
// crate they are also reached here, next to their values.
pub(crate) use contract::{Kv, KvResult};
