//! The rendezvous protocol (docs/PROTOCOL.md), written once against [`Kv`](crate::Kv).
//!
//! - `decide.rs`: the decision table — pure functions, no I/O.
//! - `round.rs`: the driver of one `next_rendezvous` call, phase by phase.
//! - `handler.rs`: the public [`RendezvousHandler`].
//! - `state.rs`, `keys.rs`: the state value and the key layout.

pub mod decide;
mod handler;
pub mod keys;
mod monitor;
mod round;
mod run_lease;
pub mod state;

pub use handler::{RendezvousHandler, RendezvousInfo};
pub use monitor::RoundBroken;
pub use round::RoundTimings;
pub use state::{Participant, State};
