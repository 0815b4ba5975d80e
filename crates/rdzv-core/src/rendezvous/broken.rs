//! Why a running round is over: what the round's monitor (`monitor.rs`) reports and
//! [`decide::running_round`](super::decide::running_round) tells from the state. Its own
//! module, below both, so that the decision tables depend on no part of the executor.

/// Why the round a worker belonged to is over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RoundBroken {
    /// The member with this rank is gone: it died (its lease expired) or left.
    MemberGone {
        /// The rank whose keep-alive key vanished (`None` if it was found missing by a
        /// re-read rather than seen vanishing).
        rank: Option<usize>,
    },
    /// The round's state was destroyed or replaced (a waiter or a leaving member ended it).
    Ended,
    /// The run was closed.
    Closed,
    /// This worker's own session lease was lost: it is no longer a member.
    LeaseLost,
    /// This worker left the round (it called `next_rendezvous` again, or shut down).
    Left,
    /// This worker left the round because its health check failed
    /// ([`RendezvousHandler::exclude`](crate::RendezvousHandler::exclude)).
    Unhealthy {
        /// The failed check's words.
        reason: String,
    },
    /// This worker is not a member of any round.
    NoRound,
}
