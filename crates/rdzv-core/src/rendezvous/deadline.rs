//! The deadline of one `next_rendezvous` call (docs/PROTOCOL.md "Spares"): `timeout` after
//! the call starts, except while the worker waits as a spare. A spare waits for as long as
//! the run lasts — retrying after backend errors is still waiting — and once it stops being
//! one (a member went and it moves on to be admitted, or it lost its session: cut off from
//! the backend for longer than its TTL) it gets a whole `timeout` again from then on. Pure:
//! the time is passed in.

use std::time::Duration;

use tokio::time::Instant;

/// What a call's worker does, as far as its deadline is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Doing {
    /// Waits as a spare behind a full, intact round.
    Spare,
    /// Retries after a backend error.
    Retrying,
    /// Anything else.
    Other,
}

impl Doing {
    /// What the machine of the call says its worker does.
    pub(crate) fn of(machine: &super::machine::Machine) -> Doing {
        if machine.is_spare() {
            Doing::Spare
        } else if machine.is_retrying() {
            Doing::Retrying
        } else {
            Doing::Other
        }
    }
}

/// When a call fails with a timeout, as the worker's waits as a spare suspend and resume it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Deadline {
    timeout: Duration,
    /// `None` while the worker waits as a spare.
    at: Option<Instant>,
}

impl Deadline {
    /// The deadline of a call started at `started`.
    pub(crate) fn new(started: Instant, timeout: Duration) -> Deadline {
        Deadline { timeout, at: Some(started + timeout) }
    }

    /// When the call times out; `None` while the worker waits as a spare.
    pub(crate) fn at(&self) -> Option<Instant> {
        self.at
    }

    /// What the worker does at `now`: waits as a spare, retries after a backend error (which
    /// changes nothing), or else. A spare's deadline does not run, and one that stops being a
    /// spare has a whole `timeout` from `now`.
    pub(crate) fn observe(&mut self, doing: Doing, now: Instant) {
        match (doing, self.at) {
            (Doing::Spare, _) => self.at = None,
            (Doing::Retrying, _) | (Doing::Other, Some(_)) => {}
            (Doing::Other, None) => self.at = Some(now + self.timeout),
        }
    }

    /// The worker lost its session at `now`: whatever it waited on as a spare, it no longer
    /// does, and a spare that has waited longer than `timeout` has its whole `timeout` to
    /// start a new session and carry on.
    pub(crate) fn session_lost(&mut self, now: Instant) {
        self.observe(Doing::Other, now);
    }

    /// When the call times out, as of `now` (a spare's wait that was suspended resumes).
    pub(crate) fn resumed_at(&mut self, now: Instant) -> Instant {
        self.observe(Doing::Other, now);
        self.at.unwrap_or(now + self.timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(15);

    #[test]
    fn a_call_that_never_waits_as_a_spare_times_out_from_its_start() {
        let start = Instant::now();
        let mut deadline = Deadline::new(start, TIMEOUT);
        deadline.observe(Doing::Other, start + Duration::from_secs(14));
        assert_eq!(deadline.at(), Some(start + TIMEOUT));
    }

    #[test]
    fn a_spare_has_no_deadline_and_a_whole_timeout_once_admitted() {
        let start = Instant::now();
        let mut deadline = Deadline::new(start, TIMEOUT);
        deadline.observe(Doing::Spare, start + Duration::from_secs(1));
        assert_eq!(deadline.at(), None);
        deadline.observe(Doing::Retrying, start + Duration::from_secs(300));
        assert_eq!(deadline.at(), None, "a spare that retries after a backend error is still a spare");
        let admitted = start + Duration::from_secs(600);
        deadline.observe(Doing::Other, admitted);
        assert_eq!(deadline.at(), Some(admitted + TIMEOUT));
    }

    /// Issue 39, defect 3: a spare that had waited longer than its timeout lost its session
    /// and then failed at once against `started + timeout`.
    #[test]
    fn a_spare_that_loses_its_session_after_its_timeout_gets_a_whole_timeout_again() {
        let start = Instant::now();
        let mut deadline = Deadline::new(start, TIMEOUT);
        for cut in 1..=3 {
            deadline.observe(Doing::Spare, start + Duration::from_secs(1));
            deadline.observe(Doing::Retrying, start + Duration::from_secs(50 * cut));
            let lost = start + Duration::from_secs(100 * cut);
            deadline.session_lost(lost);
            assert_eq!(deadline.at(), Some(lost + TIMEOUT), "after session loss {cut}");
            assert_eq!(deadline.resumed_at(lost + Duration::from_secs(1)), lost + TIMEOUT);
        }
    }

    #[test]
    fn a_session_lost_outside_a_spares_wait_keeps_the_deadline() {
        let start = Instant::now();
        let mut deadline = Deadline::new(start, TIMEOUT);
        deadline.observe(Doing::Retrying, start + Duration::from_secs(1));
        assert_eq!(deadline.at(), Some(start + TIMEOUT), "retrying suspends no deadline");
        deadline.session_lost(start + Duration::from_secs(5));
        assert_eq!(deadline.at(), Some(start + TIMEOUT));
    }
}
