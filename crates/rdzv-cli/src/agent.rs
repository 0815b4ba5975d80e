//! The decisions of `rdzv run`'s agent, as a state machine that does no I/O: what its driver
//! (`cmd/run.rs`) observed goes in ([`Event`]), what to do next comes out ([`Decision`]) —
//! whether to restart and whether that counts as a restart, the exit code, whether to close
//! the run and how, and what to print. Every decision passes through [`Agent::on`], so it can
//! be logged or counted in one place; the tests below drive it without a process or a backend.

use std::process::ExitStatus;

use rdzv::{RendezvousError, RoundBroken, RunOutcome, StoreError};
use rdzv_core::events::RestartCause;

use crate::cmd::join::why;
use crate::exit::{CliError, FAILURE};
use crate::signals::Received;

/// What stays the same for the agent's whole life.
#[derive(Clone, Debug)]
pub struct Config {
    /// The run (named in the error of a run closed while the workers ran).
    pub run_id: String,
    /// How many times the group may restart after a death or a failure (`--max-restarts`).
    pub max_restarts: u32,
    /// How many workers this node runs.
    pub nproc: usize,
    /// The command's program (named when the workers start).
    pub program: String,
}

/// What the driver observed: the outcome of the last [`Decision`] it carried out.
#[derive(Debug)]
pub enum Event {
    /// A round formed with this node as `rank` of `world_size` ([`Decision::Join`]).
    Formed {
        /// The round.
        version: u64,
        /// This node's rank (its group rank).
        rank: usize,
        /// The number of nodes.
        world_size: usize,
    },
    /// Forming a round failed ([`Decision::Join`]); a run closed meanwhile is
    /// [`RendezvousError::Closed`].
    JoinFailed(RendezvousError),
    /// A termination signal arrived while no worker ran (forming a round, agreeing on the
    /// ranks, waiting for the other nodes to finish).
    Signal(Received),
    /// This node's workers are global ranks `base_rank..` of `world_size` ([`Decision::ExchangeRanks`]).
    Assigned {
        /// The global rank of local rank 0.
        base_rank: usize,
        /// Every node's workers.
        world_size: usize,
    },
    /// The nodes could not tell each other their numbers of workers: what happened.
    ExchangeFailed(String),
    /// The round broke before the workers started.
    BrokenBeforeStart(RoundBroken),
    /// The numbers of workers exchanged have none for this node's rank.
    RankOutOfRange,
    /// The workers could not be started: why ([`Decision::StartWorkers`]).
    StartFailed(String),
    /// Every worker exited 0.
    WorkersSucceeded,
    /// A worker failed; the others were stopped.
    WorkerFailed {
        /// Its global rank.
        rank: usize,
        /// How it ended.
        status: ExitStatus,
        /// One line for the other nodes.
        summary: String,
        /// The whole report for this node's stderr (with the error and traceback from its
        /// error file, if it wrote one).
        report: String,
    },
    /// A signal arrived while the workers ran; it was passed on to them and they exited,
    /// `status` being the first failure among them, if any.
    Interrupted {
        /// The signal.
        signal: Received,
        /// The first failure.
        status: Option<ExitStatus>,
    },
    /// The round broke while the workers ran; they were stopped.
    Broken(RoundBroken),
    /// A worker of another node failed (its node's one line), while the workers ran or this
    /// node waited for the others to finish; the workers were stopped.
    PeerFailed(String),
    /// Nodes wait to be admitted: this agent saw `Some(n)` of them (and told the others), or
    /// another agent said so (`None`); the workers were stopped.
    NodesWaiting(Option<usize>),
    /// Every node's workers succeeded ([`Decision::AwaitFinish`]).
    Finished,
    /// Waiting for the other nodes to finish failed.
    FinishFailed(StoreError),
    /// The round broke before every node reported that its workers succeeded (a moment's
    /// grace for that report included).
    BrokenWhileFinishing(RoundBroken),
    /// Whether a node published a failure in the round's Store (`true` if that could not
    /// be read) ([`Decision::CheckFailure`]).
    FailureMark {
        /// A failure is published.
        published: bool,
    },
    /// The round's marks ([`Decision::CheckRegroup`]): whether a node said it re-forms the
    /// group to admit waiting nodes (`false` if that could not be read), and whether a node
    /// published a failure (`true` if that could not be read).
    RegroupMarks {
        /// A node re-forms the group.
        regroup: bool,
        /// A failure is published.
        failed: bool,
    },
    /// The failure was published, or publishing it failed ([`Decision::PublishFailure`]).
    FailurePublished,
    /// The run was closed, or closing it failed ([`Decision::Close`]).
    RunClosed(Result<(), RendezvousError>),
}

/// Why the agent joins a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejoin {
    /// Its first round.
    First,
    /// The group re-forms to admit waiting nodes: no restart.
    Regroup,
    /// This node's lease was lost (its workers were stopped): no restart.
    LeaseLost,
    /// This node failed its health check and left its round (its workers were stopped): no
    /// restart; it joins again once healthy.
    Unhealthy,
    /// A death or a failure: restart `count` of the allowed ones.
    Restart {
        /// How many restarts were used, this one included.
        count: u32,
        /// Why.
        cause: RestartCause,
    },
}

impl Rejoin {
    /// Why the workers were stopped and whether that counts as a restart; `None` for the
    /// first round.
    pub fn cause(self) -> Option<(RestartCause, bool)> {
        match self {
            Rejoin::First => None,
            Rejoin::Regroup => Some((RestartCause::AdmitWaiting, false)),
            Rejoin::LeaseLost => Some((RestartCause::LeaseLost, false)),
            Rejoin::Unhealthy => Some((RestartCause::Unhealthy, false)),
            Rejoin::Restart { cause, .. } => Some((cause, true)),
        }
    }
}

/// What the driver must do next. `say`: a line to print first, on stderr after `rdzv: `.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Form the next round → [`Event::Formed`], [`Event::JoinFailed`] or [`Event::Signal`].
    Join {
        /// Why.
        why: Rejoin,
        /// What to print.
        say: Option<String>,
    },
    /// Tell the others this node's number of workers and learn theirs →
    /// [`Event::Assigned`], [`Event::ExchangeFailed`], [`Event::BrokenBeforeStart`],
    /// [`Event::RankOutOfRange`] or [`Event::Signal`].
    ExchangeRanks,
    /// Start this node's workers and watch them and the round → [`Event::StartFailed`],
    /// [`Event::WorkersSucceeded`], [`Event::WorkerFailed`], [`Event::Interrupted`],
    /// [`Event::Broken`], [`Event::PeerFailed`] or [`Event::NodesWaiting`].
    StartWorkers {
        /// What to print.
        say: String,
    },
    /// Wait until every node's workers succeeded → [`Event::Finished`],
    /// [`Event::FinishFailed`], [`Event::PeerFailed`], [`Event::Signal`] or
    /// [`Event::BrokenWhileFinishing`].
    AwaitFinish,
    /// Read whether a node published a failure → [`Event::FailureMark`].
    CheckFailure,
    /// Read whether the group re-forms to admit waiting nodes, and whether a node published
    /// a failure → [`Event::RegroupMarks`].
    CheckRegroup,
    /// Publish this node's failure for the other nodes → [`Event::FailurePublished`].
    PublishFailure {
        /// The one line the others get.
        summary: String,
        /// What to print.
        say: Option<String>,
    },
    /// Close the run as `outcome` → [`Event::RunClosed`].
    Close {
        /// How the run ended.
        outcome: RunOutcome,
        /// What to print.
        say: Option<String>,
    },
    /// Leave the run and exit with this code, or with this error (printed by `main`).
    Exit {
        /// The exit code, or the error.
        exit: Result<u8, CliError>,
        /// What to print.
        say: Option<String>,
    },
}

impl Decision {
    /// The line to print before carrying it out, if any.
    pub fn say(&self) -> Option<&str> {
        match self {
            Decision::Join { say, .. }
            | Decision::PublishFailure { say, .. }
            | Decision::Close { say, .. }
            | Decision::Exit { say, .. } => say.as_deref(),
            Decision::StartWorkers { say } => Some(say),
            Decision::ExchangeRanks
            | Decision::AwaitFinish
            | Decision::CheckFailure
            | Decision::CheckRegroup => None,
        }
    }
}

/// The round this node is a member of.
#[derive(Clone, Copy, Debug)]
struct Member {
    version: u64,
    rank: usize,
    world_size: usize,
}

/// Where the agent is, and what the event it waits for is about.
#[derive(Clone, Debug)]
enum Stage {
    Joining,
    Exchanging(Member),
    Running(Member),
    Finishing(Member),
    /// The round broke while finishing because the run was closed: closed by a node that
    /// finished (success) or by one that failed?
    CheckingFailure(Member),
    /// The group must re-form for `reason`: is it a regroup or a restart?
    CheckingRegroup {
        reason: String,
        cause: RestartCause,
    },
    /// Publishing a worker's failure; then restart, or give up with the worker's status.
    PublishingFailure {
        rank: usize,
        status: ExitStatus,
    },
    /// Publishing that the workers could not start; then close the run and fail with it.
    PublishingStartFailure {
        message: String,
    },
    /// Closing the run; then exit with `then`.
    Closing {
        then: Result<u8, CliError>,
        propagate: bool,
    },
    /// An exit was decided.
    Over,
}

/// The agent's decisions.
#[derive(Debug)]
pub struct Agent {
    config: Config,
    /// Restarts used so far.
    restarts: u32,
    /// Whether this node ever started workers in a round.
    was_member: bool,
    stage: Stage,
}

impl Agent {
    /// An agent yet to join its first round, and that first decision.
    pub fn new(config: Config) -> (Agent, Decision) {
        let agent = Agent { config, restarts: 0, was_member: false, stage: Stage::Joining };
        (agent, Decision::Join { why: Rejoin::First, say: None })
    }

    /// Restarts used so far (`TORCHELASTIC_RESTART_COUNT`).
    pub fn restarts(&self) -> u32 {
        self.restarts
    }

    /// The decision that follows `event`.
    pub fn on(&mut self, event: Event) -> Decision {
        match (std::mem::replace(&mut self.stage, Stage::Over), event) {
            (Stage::Joining, Event::Formed { version, rank, world_size }) => {
                self.stage = Stage::Exchanging(Member { version, rank, world_size });
                Decision::ExchangeRanks
            }
            (Stage::Joining, Event::JoinFailed(RendezvousError::Closed { outcome, .. }))
                if outcome == Some(RunOutcome::Succeeded) || !self.was_member =>
            {
                let how = if outcome == Some(RunOutcome::Succeeded) { "the job succeeded" } else { "it was closed" };
                let role = if self.was_member {
                    "this node was waiting for a new round"
                } else {
                    "this node was never needed"
                };
                Decision::Exit { exit: Ok(0), say: Some(format!("the run is over ({how}); {role}")) }
            }
            (Stage::Joining, Event::JoinFailed(e)) => Decision::Exit { exit: Err(e.into()), say: None },
            (Stage::Joining | Stage::Exchanging(_), Event::Signal(signal)) => {
                Decision::Exit { exit: Ok(signal.exit_code()), say: None }
            }
            (Stage::Exchanging(member), Event::Assigned { base_rank, world_size }) => {
                self.was_member = true;
                self.stage = Stage::Running(member);
                let Config { nproc, program, .. } = &self.config;
                let say = format!(
                    "round {} formed: node {} of {}, ranks {}..{} of {}; starting {} x {} (restart {})",
                    member.version,
                    member.rank,
                    member.world_size,
                    base_rank,
                    base_rank + nproc - 1,
                    world_size,
                    nproc,
                    program,
                    self.restarts
                );
                Decision::StartWorkers { say }
            }
            (Stage::Exchanging(_), Event::ExchangeFailed(what)) => self.regroup_or_restart(what, RestartCause::Other),
            // As while the workers run: a lost lease is no failure, and counts no restart.
            (Stage::Exchanging(_), Event::BrokenBeforeStart(RoundBroken::LeaseLost)) => self.join(
                Rejoin::LeaseLost,
                "this node's session lease was lost (out of touch with the backend for longer than keep_alive_ttl) before its workers started; rejoining".into(),
            ),
            (Stage::Exchanging(_), Event::BrokenBeforeStart(RoundBroken::Unhealthy { reason })) => {
                self.drained(&reason, "before its workers started")
            }
            (Stage::Exchanging(member), Event::BrokenBeforeStart(reason)) => {
                let what = format!("round {} is over: {}", member.version, why(&reason));
                self.regroup_or_restart(what, RestartCause::MemberLost)
            }
            (Stage::Exchanging(member), Event::RankOutOfRange) => {
                let what = format!("round {}: this node's rank is out of range", member.version);
                self.regroup_or_restart(what, RestartCause::Other)
            }
            (Stage::Running(_), Event::StartFailed(message)) => {
                // Nothing ran, so there is nothing to restart: the job cannot work here.
                self.stage = Stage::PublishingStartFailure { message: message.clone() };
                Decision::PublishFailure { summary: message, say: None }
            }
            (Stage::Running(_), Event::Interrupted { signal, status }) => {
                let (code, say) = match status {
                    Some(status) => (
                        status_code(status),
                        format!("SIG{} received and passed on; a worker exited with {}", signal.name(), describe(status)),
                    ),
                    None => (0, format!("SIG{} received and passed on; the workers exited 0", signal.name())),
                };
                Decision::Exit { exit: Ok(code), say: Some(say) }
            }
            (Stage::Running(_), Event::NodesWaiting(seen)) => {
                let say = match seen {
                    Some(n) => format!("{n} node(s) wait to join; re-forming the group to admit them"),
                    None => "another agent re-forms the group to admit waiting nodes".into(),
                };
                self.join(Rejoin::Regroup, say)
            }
            (Stage::Running(member), Event::WorkersSucceeded) => {
                self.stage = Stage::Finishing(member);
                Decision::AwaitFinish
            }
            (Stage::Running(_), Event::WorkerFailed { rank, status, summary, report }) => {
                self.stage = Stage::PublishingFailure { rank, status };
                Decision::PublishFailure { summary, say: Some(report) }
            }
            (Stage::Running(_), Event::Broken(RoundBroken::Closed)) => {
                let closed = RendezvousError::Closed { run_id: self.config.run_id.clone(), outcome: None };
                Decision::Exit { exit: Err(closed.into()), say: None }
            }
            // Cut off from the backend for longer than its TTL: no longer a member, so its
            // workers were stopped at once (fencing). That is no failure: rejoin as a new
            // session without counting a restart, and without asking the round's Store, which
            // this node may not be able to reach yet.
            (Stage::Running(_), Event::Broken(RoundBroken::LeaseLost)) => self.join(
                Rejoin::LeaseLost,
                "this node's session lease was lost (out of touch with the backend for longer than keep_alive_ttl); its workers were stopped; rejoining".into(),
            ),
            (Stage::Running(_), Event::Broken(RoundBroken::Unhealthy { reason })) => {
                self.drained(&reason, "its workers were stopped")
            }
            (Stage::Running(member), Event::Broken(reason)) => {
                let what = format!("round {} is over: {}", member.version, why(&reason));
                self.regroup_or_restart(what, RestartCause::MemberLost)
            }
            (Stage::Running(_) | Stage::Finishing(_), Event::PeerFailed(what)) => {
                self.regroup_or_restart(what, RestartCause::PeerFailure)
            }
            (Stage::Finishing(member) | Stage::CheckingFailure(member), Event::Finished | Event::FailureMark { published: false }) => {
                self.stage = Stage::Closing { then: Ok(0), propagate: true };
                let say = format!("every worker of round {} succeeded; closing the run", member.version);
                Decision::Close { outcome: RunOutcome::Succeeded, say: Some(say) }
            }
            (Stage::Finishing(_), Event::FinishFailed(e)) => Decision::Exit {
                exit: Err(CliError::from(e).context("waiting for the other nodes to finish")),
                say: None,
            },
            // Its workers are done: nothing to pass the signal on to.
            (Stage::Finishing(_), Event::Signal(signal)) => Decision::Exit {
                exit: Err(CliError {
                    code: signal.exit_code(),
                    message: format!(
                        "SIG{} received while waiting for the other nodes to finish; left the run",
                        signal.name()
                    ),
                }),
                say: None,
            },
            // Nodes that finished close the run and leave, which breaks the round too: a run
            // closed with no failure published is a success.
            (Stage::Finishing(member), Event::BrokenWhileFinishing(RoundBroken::Closed)) => {
                self.stage = Stage::CheckingFailure(member);
                Decision::CheckFailure
            }
            (Stage::Finishing(_), Event::BrokenWhileFinishing(RoundBroken::LeaseLost)) => self.join(
                Rejoin::LeaseLost,
                "this node's session lease was lost (out of touch with the backend for longer than keep_alive_ttl) while it waited for the other nodes to finish; rejoining".into(),
            ),
            (Stage::Finishing(_), Event::BrokenWhileFinishing(RoundBroken::Unhealthy { reason })) => {
                self.drained(&reason, "while it waited for the other nodes to finish")
            }
            (Stage::Finishing(member), Event::BrokenWhileFinishing(reason)) => {
                self.unfinished(member, &reason, RestartCause::MemberLost)
            }
            // Closed before every node finished, and a node published a failure: it closed
            // the run when its restarts ran out.
            (Stage::CheckingFailure(member), Event::FailureMark { published: true }) => {
                self.unfinished(member, &RoundBroken::Closed, RestartCause::PeerFailure)
            }
            // A peer that left to admit waiting nodes also breaks the round; that is no failure.
            (Stage::CheckingRegroup { reason, cause }, Event::RegroupMarks { regroup, failed }) => {
                if regroup && !failed {
                    self.join(Rejoin::Regroup, format!("{reason}; re-forming the group to admit waiting nodes"))
                } else if self.restarts >= self.config.max_restarts {
                    let max = self.config.max_restarts;
                    let message = format!("{reason}; no restarts left (--max-restarts {max})");
                    Decision::Exit { exit: Err(CliError::other(message)), say: None }
                } else {
                    self.restarts += 1;
                    let (count, max) = (self.restarts, self.config.max_restarts);
                    self.join(Rejoin::Restart { count, cause }, format!("{reason}; re-forming the group (restart {count} of {max})"))
                }
            }
            (Stage::PublishingFailure { rank, status }, Event::FailurePublished) => {
                if self.restarts >= self.config.max_restarts {
                    self.stage = Stage::Closing { then: Ok(status_code(status)), propagate: true };
                    let say = format!("no restarts left (--max-restarts {}); closing the run", self.config.max_restarts);
                    Decision::Close { outcome: RunOutcome::Failed, say: Some(say) }
                } else {
                    self.regroup_or_restart(format!("rank {rank} failed"), RestartCause::WorkerFailure)
                }
            }
            (Stage::PublishingStartFailure { message }, Event::FailurePublished) => {
                self.stage = Stage::Closing { then: Err(CliError { code: FAILURE, message }), propagate: false };
                Decision::Close { outcome: RunOutcome::Failed, say: None }
            }
            (Stage::Closing { then, propagate }, Event::RunClosed(closed)) => {
                let exit = match closed {
                    Err(e) if propagate => Err(e.into()),
                    _ => then,
                };
                Decision::Exit { exit, say: None }
            }
            (stage, event) => Decision::Exit {
                exit: Err(CliError::other(format!(
                    "internal error: the agent got {event:?} in stage {stage:?}; please report it"
                ))),
                say: None,
            },
        }
    }

    /// Joins the next round for `why`, saying `say`.
    fn join(&mut self, why: Rejoin, say: String) -> Decision {
        self.stage = Stage::Joining;
        Decision::Join { why, say: Some(say) }
    }

    /// This node failed its health check and left its round (`when`): no failure of the job,
    /// so no restart counted; it rejoins once its check passes.
    fn drained(&mut self, reason: &str, when: &str) -> Decision {
        let say = format!(
            "this node failed its health check and left its round ({when}): {reason}; it rejoins once healthy"
        );
        self.join(Rejoin::Unhealthy, say)
    }

    /// The group must re-form for `reason`: first read whether that is a regroup (no
    /// restart) or a restart.
    fn regroup_or_restart(&mut self, reason: String, cause: RestartCause) -> Decision {
        self.stage = Stage::CheckingRegroup { reason, cause };
        Decision::CheckRegroup
    }

    /// The round broke (for `reason`) before every node finished.
    fn unfinished(&mut self, member: Member, reason: &RoundBroken, cause: RestartCause) -> Decision {
        let what = format!("round {} is over before every node finished: {}", member.version, why(reason));
        self.regroup_or_restart(what, cause)
    }
}

/// The exit code for a command's status: its code, or 128 + the signal that ended it.
pub fn status_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(FAILURE),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(FAILURE),
        (None, None) => FAILURE,
    }
}

/// A command's status in words: `status N`, or `signal N (SIGNAME)`.
pub fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("status {code}"),
        (None, Some(signal)) => match signal_name(signal) {
            Some(name) => format!("signal {signal} (SIG{name})"),
            None => format!("signal {signal}"),
        },
        (None, None) => "an unknown status".into(),
    }
}

/// A command's status as a metric label: its exit code, or the name of the signal that ended
/// it (`SIGKILL`, `SIG64`).
pub fn status_name(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code.to_string(),
        (None, Some(signal)) => {
            format!("SIG{}", signal_name(signal).map_or(signal.to_string(), str::to_string))
        }
        (None, None) => "unknown".into(),
    }
}

/// The names of the signals that usually end a worker (Linux numbering).
fn signal_name(signal: i32) -> Option<&'static str> {
    Some(match signal {
        1 => "HUP",
        2 => "INT",
        3 => "QUIT",
        4 => "ILL",
        6 => "ABRT",
        7 => "BUS",
        8 => "FPE",
        9 => "KILL",
        11 => "SEGV",
        13 => "PIPE",
        15 => "TERM",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;
    use std::time::Duration;

    use super::*;

    const RUN: &str = "job";

    fn agent(max_restarts: u32) -> (Agent, Decision) {
        Agent::new(Config { run_id: RUN.into(), max_restarts, nproc: 2, program: "train".into() })
    }

    /// The decisions after each of `events`, for an agent allowed `max_restarts`; the first is
    /// the one it starts with.
    fn decisions(max_restarts: u32, events: Vec<Event>) -> Vec<Decision> {
        let (mut agent, first) = agent(max_restarts);
        std::iter::once(first).chain(events.into_iter().map(|event| agent.on(event))).collect()
    }

    fn formed() -> Event {
        Event::Formed { version: 5, rank: 1, world_size: 2 }
    }

    fn assigned() -> Event {
        Event::Assigned { base_rank: 2, world_size: 4 }
    }

    /// Forms round 5 and starts the workers in it.
    fn running() -> Vec<Event> {
        vec![formed(), assigned()]
    }

    /// `these`, then `more`.
    fn with<T>(mut these: Vec<T>, more: impl IntoIterator<Item = T>) -> Vec<T> {
        these.extend(more);
        these
    }

    fn first() -> Decision {
        Decision::Join { why: Rejoin::First, say: None }
    }

    fn start(restarts: u32) -> Decision {
        let say =
            format!("round 5 formed: node 1 of 2, ranks 2..3 of 4; starting 2 x train (restart {restarts})");
        Decision::StartWorkers { say }
    }

    /// The decisions that `running()` leads to.
    fn started() -> Vec<Decision> {
        vec![first(), Decision::ExchangeRanks, start(0)]
    }

    fn join(why: Rejoin, say: &str) -> Decision {
        Decision::Join { why, say: Some(say.into()) }
    }

    fn exit(code: u8, say: Option<&str>) -> Decision {
        Decision::Exit { exit: Ok(code), say: say.map(Into::into) }
    }

    fn fail(error: CliError) -> Decision {
        Decision::Exit { exit: Err(error), say: None }
    }

    fn closed(outcome: Option<RunOutcome>) -> RendezvousError {
        RendezvousError::Closed { run_id: RUN.into(), outcome }
    }

    fn unreachable() -> RendezvousError {
        RendezvousError::Unavailable(rdzv_core::KvError::Unavailable {
            backend: "etcd",
            endpoint: "h:1".into(),
            message: "refused".into(),
            source: None,
        })
    }

    fn worker_failed(code: i32) -> Event {
        Event::WorkerFailed {
            rank: 3,
            status: ExitStatus::from_raw(code << 8),
            summary: "rank 3 failed: one line".into(),
            report: "rank 3 failed: the report".into(),
        }
    }

    fn published_failure() -> Decision {
        Decision::PublishFailure {
            summary: "rank 3 failed: one line".into(),
            say: Some("rank 3 failed: the report".into()),
        }
    }

    fn no_regroup() -> Event {
        Event::RegroupMarks { regroup: false, failed: false }
    }

    fn closing_as_succeeded() -> Decision {
        Decision::Close {
            outcome: RunOutcome::Succeeded,
            say: Some("every worker of round 5 succeeded; closing the run".into()),
        }
    }

    /// A row of the table of [`Agent::on`]: its name, the `--max-restarts`, the events, and
    /// the decisions they lead to (the first is the one the agent starts with).
    type Row = (&'static str, u32, Vec<Event>, Vec<Decision>);

    /// Drives each row and reports every row that failed, not only the first.
    fn check_rows(rows: Vec<Row>) {
        let failed: Vec<String> = rows
            .into_iter()
            .filter_map(|(name, max_restarts, events, expected)| {
                let got = decisions(max_restarts, events);
                (got != expected).then(|| format!("{name}:\n  expected {expected:?}\n  got      {got:?}"))
            })
            .collect();
        assert!(failed.is_empty(), "{} row(s) failed:\n{}", failed.len(), failed.join("\n"));
    }

    /// Forming a round: spares and members of a run closed meanwhile, a timeout.
    #[test]
    fn forming_a_round() {
        let timeout = || RendezvousError::Timeout {
            run_id: RUN.into(),
            phase: "joining".into(),
            after: Duration::from_secs(1),
        };
        check_rows(vec![
            (
                "a spare of a closed run was never needed",
                3,
                vec![Event::JoinFailed(closed(None))],
                vec![first(), exit(0, Some("the run is over (it was closed); this node was never needed"))],
            ),
            (
                "a spare of a job that succeeded",
                3,
                vec![Event::JoinFailed(closed(Some(RunOutcome::Succeeded)))],
                vec![
                    first(),
                    exit(0, Some("the run is over (the job succeeded); this node was never needed")),
                ],
            ),
            (
                "a member whose job succeeded while it waited for a new round",
                3,
                with(
                    running(),
                    [Event::NodesWaiting(None), Event::JoinFailed(closed(Some(RunOutcome::Succeeded)))],
                ),
                with(
                    started(),
                    [
                        join(Rejoin::Regroup, "another agent re-forms the group to admit waiting nodes"),
                        exit(
                            0,
                            Some(
                                "the run is over (the job succeeded); this node was waiting for a new round",
                            ),
                        ),
                    ],
                ),
            ),
            (
                "a member whose run was closed otherwise while it waited",
                3,
                with(
                    running(),
                    [Event::NodesWaiting(Some(2)), Event::JoinFailed(closed(Some(RunOutcome::Failed)))],
                ),
                with(
                    started(),
                    [
                        join(Rejoin::Regroup, "2 node(s) wait to join; re-forming the group to admit them"),
                        fail(closed(Some(RunOutcome::Failed)).into()),
                    ],
                ),
            ),
            (
                "forming timed out",
                3,
                vec![Event::JoinFailed(timeout())],
                vec![first(), fail(timeout().into())],
            ),
            (
                "a signal while forming",
                3,
                vec![Event::Signal(Received::Interrupt)],
                vec![first(), exit(130, None)],
            ),
        ]);
    }

    /// Agreeing on the ranks and starting the workers: a signal, a failed exchange, a round broken before the start, a rank out of range, workers that cannot start.
    #[test]
    fn agreeing_on_ranks_and_starting_the_workers() {
        check_rows(vec![
            (
                "a signal while agreeing on ranks",
                3,
                vec![formed(), Event::Signal(Received::Terminate)],
                vec![first(), Decision::ExchangeRanks, exit(143, None)],
            ),
            (
                "the exchange failed: a restart",
                3,
                vec![
                    formed(),
                    Event::ExchangeFailed("publishing: x".into()),
                    no_regroup(),
                    formed(),
                    assigned(),
                ],
                vec![
                    first(),
                    Decision::ExchangeRanks,
                    Decision::CheckRegroup,
                    join(
                        Rejoin::Restart { count: 1, cause: RestartCause::Other },
                        "publishing: x; re-forming the group (restart 1 of 3)",
                    ),
                    Decision::ExchangeRanks,
                    start(1),
                ],
            ),
            (
                "the round broke before the workers started, to admit waiting nodes",
                3,
                vec![
                    formed(),
                    Event::BrokenBeforeStart(RoundBroken::MemberGone { rank: Some(0) }),
                    Event::RegroupMarks { regroup: true, failed: false },
                ],
                vec![
                    first(),
                    Decision::ExchangeRanks,
                    Decision::CheckRegroup,
                    join(
                        Rejoin::Regroup,
                        "round 5 is over: the member of rank 0 is gone; re-forming the group to admit waiting nodes",
                    ),
                ],
            ),
            (
                "a rank out of range with no restarts left (a regroup with a failure is no regroup)",
                0,
                vec![formed(), Event::RankOutOfRange, Event::RegroupMarks { regroup: true, failed: true }],
                vec![
                    first(),
                    Decision::ExchangeRanks,
                    Decision::CheckRegroup,
                    fail(CliError::other(
                        "round 5: this node's rank is out of range; no restarts left (--max-restarts 0)",
                    )),
                ],
            ),
            (
                "the workers cannot start: the run is closed as failed, whatever closing gives",
                3,
                with(
                    running(),
                    [
                        Event::StartFailed("cannot start the workers (`train`): no".into()),
                        Event::FailurePublished,
                        Event::RunClosed(Err(unreachable())),
                    ],
                ),
                with(
                    started(),
                    [
                        Decision::PublishFailure {
                            summary: "cannot start the workers (`train`): no".into(),
                            say: None,
                        },
                        Decision::Close { outcome: RunOutcome::Failed, say: None },
                        fail(CliError {
                            code: FAILURE,
                            message: "cannot start the workers (`train`): no".into(),
                        }),
                    ],
                ),
            ),
        ]);
    }

    /// While the workers run: a signal passed on, success, a failure with and without restarts left, the run closed, a member gone.
    #[test]
    fn while_the_workers_run() {
        check_rows(vec![
            (
                "a signal passed on, the workers exited 0",
                3,
                with(running(), [Event::Interrupted { signal: Received::Interrupt, status: None }]),
                with(started(), [exit(0, Some("SIGINT received and passed on; the workers exited 0"))]),
            ),
            (
                "a signal passed on, a worker exited 3",
                3,
                with(
                    running(),
                    [Event::Interrupted {
                        signal: Received::Terminate,
                        status: Some(ExitStatus::from_raw(3 << 8)),
                    }],
                ),
                with(
                    started(),
                    [exit(3, Some("SIGTERM received and passed on; a worker exited with status 3"))],
                ),
            ),
            (
                "every worker succeeded, and every node",
                3,
                with(running(), [Event::WorkersSucceeded, Event::Finished, Event::RunClosed(Ok(()))]),
                with(started(), [Decision::AwaitFinish, closing_as_succeeded(), exit(0, None)]),
            ),
            (
                "every node succeeded, but closing failed",
                3,
                with(
                    running(),
                    [Event::WorkersSucceeded, Event::Finished, Event::RunClosed(Err(unreachable()))],
                ),
                with(started(), [Decision::AwaitFinish, closing_as_succeeded(), fail(unreachable().into())]),
            ),
            (
                "a worker failed with restarts left: restart 1, whose workers say so",
                3,
                with(
                    running(),
                    [
                        worker_failed(7),
                        Event::FailurePublished,
                        Event::RegroupMarks { regroup: false, failed: true },
                        formed(),
                        assigned(),
                    ],
                ),
                with(
                    started(),
                    [
                        published_failure(),
                        Decision::CheckRegroup,
                        join(
                            Rejoin::Restart { count: 1, cause: RestartCause::WorkerFailure },
                            "rank 3 failed; re-forming the group (restart 1 of 3)",
                        ),
                        Decision::ExchangeRanks,
                        start(1),
                    ],
                ),
            ),
            (
                "a worker failed with no restarts left: the run is closed as failed, with its status",
                0,
                with(running(), [worker_failed(7), Event::FailurePublished, Event::RunClosed(Ok(()))]),
                with(
                    started(),
                    [
                        published_failure(),
                        Decision::Close {
                            outcome: RunOutcome::Failed,
                            say: Some("no restarts left (--max-restarts 0); closing the run".into()),
                        },
                        exit(7, None),
                    ],
                ),
            ),
            (
                "a worker failed with no restarts left, and closing failed",
                0,
                with(
                    running(),
                    [worker_failed(7), Event::FailurePublished, Event::RunClosed(Err(unreachable()))],
                ),
                with(
                    started(),
                    [
                        published_failure(),
                        Decision::Close {
                            outcome: RunOutcome::Failed,
                            say: Some("no restarts left (--max-restarts 0); closing the run".into()),
                        },
                        fail(unreachable().into()),
                    ],
                ),
            ),
            (
                "the run was closed while the workers ran",
                3,
                with(running(), [Event::Broken(RoundBroken::Closed)]),
                with(started(), [fail(closed(None).into())]),
            ),
            (
                "a member died: restarts until none is left",
                1,
                with(
                    running(),
                    [
                        Event::Broken(RoundBroken::MemberGone { rank: None }),
                        no_regroup(),
                        formed(),
                        assigned(),
                        Event::Broken(RoundBroken::Ended),
                        no_regroup(),
                    ],
                ),
                with(
                    started(),
                    [
                        Decision::CheckRegroup,
                        join(
                            Rejoin::Restart { count: 1, cause: RestartCause::MemberLost },
                            "round 5 is over: a member is gone; re-forming the group (restart 1 of 1)",
                        ),
                        Decision::ExchangeRanks,
                        start(1),
                        Decision::CheckRegroup,
                        fail(CliError::other(
                            "round 5 is over: it was ended (a member left or died, and a waiting or leaving worker ended it); no restarts left (--max-restarts 1)",
                        )),
                    ],
                ),
            ),
        ]);
    }

    /// A lost lease, whenever it comes: the node rejoins, counting no restart.
    #[test]
    fn a_lost_lease_counts_no_restart() {
        let lease_lost = "this node's session lease was lost (out of touch with the backend for longer than keep_alive_ttl); its workers were stopped; rejoining";
        check_rows(vec![
            (
                "the lease was lost: rejoin, no restart counted",
                3,
                with(running(), [Event::Broken(RoundBroken::LeaseLost), formed(), assigned()]),
                with(started(), [join(Rejoin::LeaseLost, lease_lost), Decision::ExchangeRanks, start(0)]),
            ),
            (
                "the lease was lost while the ranks were exchanged: rejoin, no restart counted",
                0,
                vec![formed(), Event::BrokenBeforeStart(RoundBroken::LeaseLost), formed(), assigned()],
                vec![
                    first(),
                    Decision::ExchangeRanks,
                    join(
                        Rejoin::LeaseLost,
                        "this node's session lease was lost (out of touch with the backend for longer than keep_alive_ttl) before its workers started; rejoining",
                    ),
                    Decision::ExchangeRanks,
                    start(0),
                ],
            ),
            (
                "the lease was lost while waiting for the others to finish: rejoin, no restart counted",
                0,
                with(
                    running(),
                    [
                        Event::WorkersSucceeded,
                        Event::BrokenWhileFinishing(RoundBroken::LeaseLost),
                        formed(),
                        assigned(),
                    ],
                ),
                with(
                    started(),
                    [
                        Decision::AwaitFinish,
                        join(
                            Rejoin::LeaseLost,
                            "this node's session lease was lost (out of touch with the backend for longer than keep_alive_ttl) while it waited for the other nodes to finish; rejoining",
                        ),
                        Decision::ExchangeRanks,
                        start(0),
                    ],
                ),
            ),
        ]);
    }

    /// A node drained by its health check, whenever: it rejoins once healthy, counting no
    /// restart (its restarts stay for the job's own failures).
    #[test]
    fn a_drained_node_counts_no_restart() {
        let sick = || RoundBroken::Unhealthy { reason: "check `x`: exit status 1".into() };
        let said = |when: &str| {
            format!(
                "this node failed its health check and left its round ({when}): check `x`: exit status 1; it rejoins once healthy"
            )
        };
        check_rows(vec![
            (
                "drained while the workers ran",
                0,
                with(running(), [Event::Broken(sick()), formed(), assigned()]),
                with(
                    started(),
                    [
                        join(Rejoin::Unhealthy, &said("its workers were stopped")),
                        Decision::ExchangeRanks,
                        start(0),
                    ],
                ),
            ),
            (
                "drained while the ranks were exchanged",
                0,
                vec![formed(), Event::BrokenBeforeStart(sick()), formed(), assigned()],
                vec![
                    first(),
                    Decision::ExchangeRanks,
                    join(Rejoin::Unhealthy, &said("before its workers started")),
                    Decision::ExchangeRanks,
                    start(0),
                ],
            ),
            (
                "drained while waiting for the others to finish",
                0,
                with(
                    running(),
                    [Event::WorkersSucceeded, Event::BrokenWhileFinishing(sick()), formed(), assigned()],
                ),
                with(
                    started(),
                    [
                        Decision::AwaitFinish,
                        join(Rejoin::Unhealthy, &said("while it waited for the other nodes to finish")),
                        Decision::ExchangeRanks,
                        start(0),
                    ],
                ),
            ),
        ]);
        assert_eq!(Rejoin::Unhealthy.cause(), Some((RestartCause::Unhealthy, false)));
    }

    /// A peer's failure, and waiting for the other nodes to finish.
    #[test]
    fn a_peers_failure_and_the_finish() {
        let store_timeout = || StoreError::Timeout {
            operation: "barrier",
            keys: vec![b"rdzv_run/finished".to_vec()],
            after: Duration::from_secs(1),
        };
        check_rows(vec![
            (
                "a peer's worker failed while these ran",
                3,
                with(running(), [Event::PeerFailed("rank 0 failed".into()), no_regroup()]),
                with(
                    started(),
                    [
                        Decision::CheckRegroup,
                        join(
                            Rejoin::Restart { count: 1, cause: RestartCause::PeerFailure },
                            "rank 0 failed; re-forming the group (restart 1 of 3)",
                        ),
                    ],
                ),
            ),
            (
                "a peer's worker failed while this node waited for the others",
                3,
                with(
                    running(),
                    [Event::WorkersSucceeded, Event::PeerFailed("rank 0 failed".into()), no_regroup()],
                ),
                with(
                    started(),
                    [
                        Decision::AwaitFinish,
                        Decision::CheckRegroup,
                        join(
                            Rejoin::Restart { count: 1, cause: RestartCause::PeerFailure },
                            "rank 0 failed; re-forming the group (restart 1 of 3)",
                        ),
                    ],
                ),
            ),
            (
                "the finish barrier failed",
                3,
                with(running(), [Event::WorkersSucceeded, Event::FinishFailed(store_timeout())]),
                with(
                    started(),
                    [
                        Decision::AwaitFinish,
                        fail(
                            CliError::from(store_timeout()).context("waiting for the other nodes to finish"),
                        ),
                    ],
                ),
            ),
            (
                "a signal while waiting for the others",
                3,
                with(running(), [Event::WorkersSucceeded, Event::Signal(Received::Terminate)]),
                with(
                    started(),
                    [
                        Decision::AwaitFinish,
                        fail(CliError {
                            code: 143,
                            message:
                                "SIGTERM received while waiting for the other nodes to finish; left the run"
                                    .into(),
                        }),
                    ],
                ),
            ),
            (
                "closed by the nodes that finished, no failure published: a success",
                3,
                with(
                    running(),
                    [
                        Event::WorkersSucceeded,
                        Event::BrokenWhileFinishing(RoundBroken::Closed),
                        Event::FailureMark { published: false },
                        Event::RunClosed(Ok(())),
                    ],
                ),
                with(
                    started(),
                    [Decision::AwaitFinish, Decision::CheckFailure, closing_as_succeeded(), exit(0, None)],
                ),
            ),
            (
                "closed with a failure published before every node finished",
                3,
                with(
                    running(),
                    [
                        Event::WorkersSucceeded,
                        Event::BrokenWhileFinishing(RoundBroken::Closed),
                        Event::FailureMark { published: true },
                        no_regroup(),
                    ],
                ),
                with(
                    started(),
                    [
                        Decision::AwaitFinish,
                        Decision::CheckFailure,
                        Decision::CheckRegroup,
                        join(
                            Rejoin::Restart { count: 1, cause: RestartCause::PeerFailure },
                            "round 5 is over before every node finished: the run was closed; re-forming the group (restart 1 of 3)",
                        ),
                    ],
                ),
            ),
            (
                "a member died before every node finished",
                3,
                with(
                    running(),
                    [
                        Event::WorkersSucceeded,
                        Event::BrokenWhileFinishing(RoundBroken::MemberGone { rank: Some(1) }),
                        no_regroup(),
                    ],
                ),
                with(
                    started(),
                    [
                        Decision::AwaitFinish,
                        Decision::CheckRegroup,
                        join(
                            Rejoin::Restart { count: 1, cause: RestartCause::MemberLost },
                            "round 5 is over before every node finished: the member of rank 1 is gone; re-forming the group (restart 1 of 3)",
                        ),
                    ],
                ),
            ),
        ]);
    }

    #[test]
    fn an_event_its_stage_never_asked_for_is_an_internal_error() {
        let last = decisions(3, vec![Event::Finished]).pop();
        match last {
            Some(Decision::Exit { exit: Err(e), say: None }) => {
                assert!(e.message.starts_with("internal error: the agent got Finished"), "{e:?}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn exit_codes_follow_the_command() {
        // Raw wait statuses: exit code N is N << 8; a signal N is N.
        assert_eq!(status_code(ExitStatus::from_raw(0)), 0);
        assert_eq!(status_code(ExitStatus::from_raw(7 << 8)), 7);
        assert_eq!(status_code(ExitStatus::from_raw(15)), 143);
        assert_eq!(describe(ExitStatus::from_raw(9)), "signal 9 (SIGKILL)");
        assert_eq!(describe(ExitStatus::from_raw(64)), "signal 64");
        assert_eq!(describe(ExitStatus::from_raw(3 << 8)), "status 3");
        assert_eq!(status_name(ExitStatus::from_raw(3 << 8)), "3");
        assert_eq!(status_name(ExitStatus::from_raw(9)), "SIGKILL");
        assert_eq!(status_name(ExitStatus::from_raw(64)), "SIG64");
    }

    #[test]
    fn rejoins_tell_their_cause_and_whether_they_count() {
        let restart = Rejoin::Restart { count: 2, cause: RestartCause::PeerFailure };
        assert_eq!(restart.cause(), Some((RestartCause::PeerFailure, true)));
        assert_eq!(Rejoin::Regroup.cause(), Some((RestartCause::AdmitWaiting, false)));
        assert_eq!(Rejoin::LeaseLost.cause(), Some((RestartCause::LeaseLost, false)));
        assert_eq!(Rejoin::First.cause(), None);
    }
}
