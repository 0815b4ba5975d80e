//! The rendezvous protocol (docs/PROTOCOL.md), written once against [`Kv`](crate::Kv).
//!
//! - `decide.rs`: the decision tables — pure functions, no I/O.
//! - `machine/`: one `next_rendezvous` call as a state machine over those tables: inputs
//!   (values read, watch events, timer expiries, write outcomes) in, actions out, time
//!   injected. No I/O.
//! - `executor.rs`: the small async executor that performs the machine's actions on a `Kv`;
//!   `deadline.rs`: when a call times out (never while it waits as a spare).
//! - `monitor.rs`: phase 4, watching a running round for its end; `broken.rs`: why a round
//!   is over.
//! - `handler.rs`: the public [`RendezvousHandler`].
//! - `state.rs`, `keys.rs`: the state value and the key layout; `pieces.rs`: a long member
//!   list stored in pieces beside it.
//! - `forget.rs`: deleting the rounds nobody can be in any more.
//! - `changes.rs`: what changed for a member between two rounds.
//! - `waiting.rs`: who waits for the next round, and how many of them it could admit.
//! - `excluded.rs`: the nodes their health check keeps out, and why.

mod broken;
mod changes;
mod current;
mod deadline;
pub(crate) mod decide;
mod excluded;
mod executor;
pub(crate) mod forget;
mod handler;
mod keys;
mod lookup;
pub(crate) mod machine;
mod monitor;
mod pieces;
mod recent;
mod run_lease;
mod segment_groups;
mod state;
mod waiting;
mod whole_segments;

pub use broken::RoundBroken;
pub use changes::RoundChanges;
pub use current::Current;
pub use excluded::Exclusion;
pub use executor::free_port;
pub use handler::{RendezvousHandler, RendezvousInfo};
pub use keys::RunKeys;
pub use machine::RoundTimings;
pub use state::{Joiner, LastRound, Participant, RunOutcome, SegmentRuns, State};
pub use waiting::Waiting;
