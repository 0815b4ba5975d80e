//! Health gates (docs/PROTOCOL.md "Health gates"): a node runs its checks before each join,
//! every interval while it waits, and every interval while it is a member; a node that fails
//! is kept out of the run (excluded, with its reason on record), and a member that fails
//! `failures` checks in a row leaves its round so that a healthy spare takes its place.
//!
//! - `check.rs`: what a check is, parsed from the `health_check` option, and running a list
//!   of them under one timeout.
//! - `command.rs`: a shell command as a check (killed with its process group at the timeout).
//! - `builtin.rs`: the built-in checks (`gpu`, `disk`, `store`).
//! - `gate.rs`: the gate around `next_rendezvous`, and the watch over a member.

mod builtin;
mod check;
mod command;
mod gate;

pub use check::{Check, Checks, Target, Verdict};
pub(crate) use gate::{Gate, MemberWatch};
