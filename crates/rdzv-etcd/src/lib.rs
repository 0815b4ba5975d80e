//! # rdzv-etcd
//!
//! The etcd v3 backend of rdzv (docs to come).

mod backend;
mod client;
mod errors;
mod factory;
mod keys;
mod options;
mod watch;

pub use backend::{EtcdKv, MIN_LEASE_TTL};
pub use factory::EtcdFactory;
pub use options::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_PORT, DEFAULT_REQUEST_TIMEOUT, EtcdOptions, OPTIONS, TlsFiles,
};

#[cfg(feature = "testing")]
pub mod testing;
