//! The protocol's state machine driven step by step, without tokio or a backend: what it does
//! after each answer on the paths where the executor used to decide for it (the version
//! counter's bump, a failed leave, a failed delete of a round frozen with a gone
//! predecessor), and what the worker is then doing, in the words of a timeout error. Each
//! table row is one answer and the action it must lead to.

use std::sync::Arc;

use rdzv_core::kv::{Bytes, DeleteMode, DeleteOutcome, KeyValue, LeaseId, PutMode, PutOutcome, Revision};
use rdzv_core::params::RankOrder;
use rdzv_core::protocol::Sizing;
use rdzv_core::protocol::{Action, Bind, Call, Input, Leaving, Machine, Observed};
use rdzv_core::protocol::{RunKeys, State};
use rdzv_core::{KvError, Participant, RendezvousError};
use std::time::Duration;
use tokio::time::Instant;

const SESSION: LeaseId = 7;

fn keys() -> RunKeys {
    RunKeys::new("/t", "job")
}

fn me() -> Participant {
    Participant { node: "n0".into(), addr: "h".into(), pid: 10, port: Some(1000), segment: None }
}

fn machine(leave_first: Option<Leaving>) -> Machine {
    machine_with_retired(leave_first, Vec::new())
}

fn machine_with_retired(leave_first: Option<Leaving>, retired: Vec<LeaseId>) -> Machine {
    Machine::new(Call {
        me: me(),
        session: SESSION,
        keys: keys(),
        sizing: Sizing {
            min: 2,
            max: 2,
            last_call: Duration::from_secs(30),
            backup: Duration::from_secs(10),
            order: RankOrder::Arrival,
            segment_size: None,
        },
        count_at_revision: false,
        counted_create: false,
        retired,
        run_id: "job".into(),
        started: Instant::now(),
        leave_first,
        leaving: None,
        last: None,
        since: None,
        node_index: None,
    })
}

fn key_value(key: Vec<u8>, value: &[u8], revision: Revision, lease: Option<LeaseId>) -> KeyValue {
    KeyValue {
        key,
        value: Bytes::copy_from_slice(value),
        create_revision: revision,
        mod_revision: revision,
        version: 1,
        lease,
    }
}

fn unavailable() -> RendezvousError {
    RendezvousError::Unavailable(KvError::Unavailable {
        backend: "model",
        endpoint: "h:1".into(),
        message: "refused".into(),
        source: None,
    })
}

/// Feeds `input`, at the call's start.
fn on(machine: &mut Machine, input: Input) -> Action {
    machine.on(input, Instant::now())
}

/// A machine that just wrote `setup` (at revision 5) to open a round: it asks for the counter.
fn opening() -> Machine {
    let mut m = machine(None);
    assert!(matches!(m.start(), Action::ReadState));
    assert_eq!(m.doing(), "starting");
    let none = Observed::absent(4);
    assert!(matches!(on(&mut m, Input::State(none)), Action::Put { mode: PutMode::Create, .. }));
    assert_eq!(m.doing(), "creating a round");
    let written = Input::Put(PutOutcome::Written { revision: 5, create_revision: 5 }, Some(SESSION));
    let counter = keys().version_counter();
    assert!(matches!(on(&mut m, written), Action::Get { key } if key == counter));
    assert_eq!(m.doing(), "creating a round");
    m
}

#[test]
fn the_version_counter_is_bumped_by_revision_from_what_was_read() {
    let counter = keys().version_counter();
    // (the counter as read, the write asked for: its value and precondition)
    let rows: [(Option<KeyValue>, &[u8], PutMode); 2] = [
        (None, b"1", PutMode::Create),
        (Some(key_value(counter.clone(), b"41", 3, Some(1))), b"42", PutMode::Update(3)),
    ];
    for (read, value, mode) in rows {
        let mut m = opening();
        match on(&mut m, Input::Key(read.clone())) {
            Action::Put { key, value: v, mode: m, bind: Bind::RunLease } => {
                assert_eq!((key, v.as_slice(), m), (counter.clone(), value, mode), "after {read:?}");
            }
            other => panic!("after {read:?}: {other:?}"),
        }
    }
}

#[test]
fn a_counter_bumped_by_someone_else_meanwhile_is_bumped_from_its_new_value() {
    let counter = keys().version_counter();
    let mut m = opening();
    let read = key_value(counter.clone(), b"41", 3, Some(1));
    assert!(matches!(on(&mut m, Input::Key(Some(read))), Action::Put { .. }));
    let theirs = key_value(counter.clone(), b"42", 6, Some(1));
    let conflict = Input::Put(PutOutcome::Conflict { current: Some(theirs) }, Some(1));
    match on(&mut m, conflict) {
        Action::Put { key, value, mode: PutMode::Update(6), bind: Bind::RunLease } => {
            assert_eq!((key, value.as_slice()), (counter, &b"43"[..]));
        }
        other => panic!("{other:?}"),
    }
    // The write went through: `setup` (revision 5) becomes `joinable` round 43.
    let written = Input::Put(PutOutcome::Written { revision: 7, create_revision: 3 }, Some(1));
    match on(&mut m, written) {
        Action::Put { key, value, mode: PutMode::Update(5), bind: Bind::RunLease } => {
            assert_eq!(key, keys().state());
            let state = State::parse(&key, &Bytes::from(value)).expect("a state");
            assert_eq!(state, State::Joinable { version: 43, previous: None, segments: None });
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_counter_that_is_no_number_ends_the_call_naming_it() {
    let counter = keys().version_counter();
    let mut m = opening();
    let read = key_value(counter.clone(), b"x1", 3, Some(1));
    match on(&mut m, Input::Key(Some(read))) {
        Action::Fail(RendezvousError::State { key, reason }) => {
            assert_eq!(key.as_bytes(), &counter[..]);
            assert!(reason.contains("not a number") && reason.contains("\"x1\""), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

/// Starts a machine that leaves a round as a member of rank > 0, and lets its stagger run out
/// with nobody else ending the round: its answer is the swap.
fn wait_out_the_stagger(m: &mut Machine) -> Action {
    assert!(matches!(m.start(), Action::WatchState { from: 21 }));
    assert!(matches!(on(m, Input::Ack), Action::Await { until: Some(_), prefix: false }));
    on(m, Input::Timer)
}

#[test]
fn rank_0_ends_its_round_at_once_and_the_others_after_a_stagger_by_rank() {
    let mut first =
        machine(Some(Leaving { version: 3, rank: 0, final_revision: 20, participants: Arc::from([]) }));
    match first.start() {
        Action::Put { key, mode: PutMode::Update(20), bind: Bind::Session, .. } => {
            assert_eq!(key, keys().state())
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(first.doing(), "leaving the previous round");

    let mut fifth =
        machine(Some(Leaving { version: 3, rank: 5, final_revision: 20, participants: Arc::from([]) }));
    assert!(matches!(fifth.start(), Action::WatchState { from: 21 }));
    assert_eq!(fifth.doing(), "leaving the previous round");
    let now = Instant::now();
    match fifth.on(Input::Ack, now) {
        Action::Await { until: Some(until), prefix: false } => {
            assert_eq!(until - now, rdzv_core::protocol::leave_delay(5));
            assert_eq!(until - now, Duration::from_millis(150), "rank 5: three steps of 50 ms");
        }
        other => panic!("{other:?}"),
    }
    match on(&mut fifth, Input::Timer) {
        Action::Put { key, mode: PutMode::Update(20), bind: Bind::Session, .. } => {
            assert_eq!(key, keys().state())
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_member_that_sees_the_round_ended_while_it_waits_does_not_swap() {
    let joinable = State::Joinable { version: 4, previous: Some(3), segments: None };
    let setup = State::Setup;
    // (what the state became, at revision 25, and what the member does next)
    type Row = (State, Option<LeaseId>, fn(&Action) -> bool);
    let rows: [Row; 3] = [
        // Another member opened round 4: join it, watching from what was seen.
        (joinable, Some(99), |a| matches!(a, Action::WatchState { from: 26 })),
        // Another member is opening the next round: wait for it.
        (setup, Some(98), |a| matches!(a, Action::WatchState { from: 26 })),
        // The run closed.
        (State::Closed { outcome: None }, Some(99), |a| {
            matches!(a, Action::Fail(RendezvousError::Closed { .. }))
        }),
    ];
    for (i, (state, lease, then)) in rows.into_iter().enumerate() {
        let mut m =
            machine(Some(Leaving { version: 3, rank: 1, final_revision: 20, participants: Arc::from([]) }));
        assert!(matches!(m.start(), Action::WatchState { from: 21 }), "row {i}");
        assert!(matches!(on(&mut m, Input::Ack), Action::Await { .. }), "row {i}");
        let seen = Observed::from_kv(Some(key_value(keys().state(), &state.to_bytes(), 25, lease)), None)
            .expect("a valid state value");
        let next = on(&mut m, Input::State(seen));
        assert!(then(&next), "row {i}: {next:?}");
        assert!(!matches!(next, Action::Put { .. }), "row {i}: no swap");
    }
}

#[test]
fn a_failed_leave_drops_the_keep_alive_key_and_then_its_own_error_decides() {
    let leaving = Leaving { version: 3, rank: 1, final_revision: 20, participants: Arc::from([]) };
    let mine = keys().rank(3, 1);
    // (how the leave's write failed, how the delete of the keep-alive key went, what follows)
    type Row = (fn() -> RendezvousError, fn() -> Input, fn(&Action) -> bool);
    let rows: [Row; 6] = [
        (
            unavailable,
            || Input::Deleted(DeleteOutcome::Deleted { revision: 21 }),
            |a| matches!(a, Action::Backoff),
        ),
        (unavailable, || Input::Deleted(DeleteOutcome::Missing), |a| matches!(a, Action::Backoff)),
        (unavailable, || Input::Failed(unavailable()), |a| matches!(a, Action::Backoff)),
        (
            || RendezvousError::Backend(KvError::LeaseNotFound(SESSION)),
            || Input::Deleted(DeleteOutcome::Deleted { revision: 21 }),
            |a| matches!(a, Action::Fail(RendezvousError::LeaseLost)),
        ),
        (
            || RendezvousError::Backend(KvError::LeaseNotFound(SESSION)),
            || Input::Failed(unavailable()),
            |a| matches!(a, Action::Fail(RendezvousError::LeaseLost)),
        ),
        (
            || RendezvousError::State { key: "k".into(), reason: "corrupt".into() },
            || Input::Failed(unavailable()),
            |a| matches!(a, Action::Fail(RendezvousError::State { .. })),
        ),
    ];
    for (i, (leave_error, delete_answer, then)) in rows.into_iter().enumerate() {
        let mut m = machine(Some(leaving.clone()));
        assert!(
            matches!(wait_out_the_stagger(&mut m), Action::Put { mode: PutMode::Update(20), .. }),
            "row {i}"
        );
        assert_eq!(m.doing(), "leaving the previous round", "row {i}");
        match on(&mut m, Input::Failed(leave_error())) {
            Action::Delete { key, mode: DeleteMode::Any } => assert_eq!(key, mine, "row {i}"),
            other => panic!("row {i}: {other:?}"),
        }
        assert_eq!(m.doing(), "leaving the previous round", "row {i}");
        let next = on(&mut m, delete_answer());
        assert!(then(&next), "row {i}: {next:?}");
        if matches!(next, Action::Backoff) {
            assert_eq!(m.doing(), "retrying after a backend error", "row {i}");
            assert!(matches!(on(&mut m, Input::Timer), Action::ReadState), "row {i}");
            assert_eq!(m.doing(), "retrying after a backend error", "row {i}");
        }
    }
}

#[test]
fn the_round_frozen_with_a_gone_predecessor_is_read_again_however_its_delete_went() {
    let predecessor = Participant { pid: 9, ..me() };
    let other =
        Participant { node: "n1".into(), addr: "h1".into(), pid: 11, port: Some(1000), segment: None };
    let frozen = State::Frozen { version: 2, participants: Arc::from(vec![predecessor, other]) };
    let state = key_value(keys().state(), &frozen.to_bytes(), 30, Some(99));
    let answers: [fn() -> Input; 3] = [
        || Input::Deleted(DeleteOutcome::Deleted { revision: 31 }),
        || Input::Deleted(DeleteOutcome::Conflict { current: None }),
        || Input::Failed(unavailable()),
    ];
    for (i, answer) in answers.into_iter().enumerate() {
        let mut m = machine(None);
        assert!(matches!(m.start(), Action::ReadState));
        let observed = Observed::from_kv(Some(state.clone()), Some(30)).expect("a state");
        assert!(matches!(on(&mut m, Input::State(observed)), Action::ProcessAlive { pid: 9 }), "row {i}");
        match on(&mut m, Input::Alive(false)) {
            Action::Delete { key, mode: DeleteMode::IfRevision(30) } => assert_eq!(key, keys().state()),
            other => panic!("row {i}: {other:?}"),
        }
        let next = on(&mut m, answer());
        assert!(matches!(next, Action::ReadState), "row {i}: {next:?}");
    }
}

/// Issue 25: a join key held by a session this worker gave up (lost to an overloaded server,
/// whose revoke did not get through) is its own: ended by its revision and written again at
/// once. A key of any other session is another live process's, waited for as before.
#[test]
fn a_join_key_of_a_session_this_worker_gave_up_is_ended_and_written_again() {
    const GIVEN_UP: LeaseId = 6;
    let join = keys().join(1, "n0");
    let joinable = key_value(
        keys().state(),
        &State::Joinable { version: 1, previous: None, segments: None }.to_bytes(),
        3,
        Some(1),
    );
    let writing = |retired: Vec<LeaseId>| {
        let mut m = machine_with_retired(None, retired);
        assert!(matches!(m.start(), Action::ReadState));
        let seen = Observed::from_kv(Some(joinable.clone()), Some(3)).expect("a state");
        assert!(matches!(on(&mut m, Input::State(seen)), Action::WatchState { from: 4 }));
        assert!(matches!(
            on(&mut m, Input::Ack),
            Action::Put { mode: PutMode::Create, bind: Bind::Session, .. }
        ));
        m
    };
    let held = || {
        let old = key_value(join.clone(), &me().to_bytes(), 2, Some(GIVEN_UP));
        Input::Put(PutOutcome::Conflict { current: Some(old) }, Some(SESSION))
    };

    let mut m = writing(vec![GIVEN_UP]);
    match on(&mut m, held()) {
        Action::Delete { key, mode: DeleteMode::IfRevision(2) } => assert_eq!(key, join),
        other => panic!("a key of a retired session must be ended, not waited for: {other:?}"),
    }
    assert_eq!(m.doing(), "joining");
    match on(&mut m, Input::Deleted(DeleteOutcome::Deleted { revision: 5 })) {
        Action::Put { key, mode: PutMode::Create, bind: Bind::Session, .. } => assert_eq!(key, join),
        other => panic!("then written again: {other:?}"),
    }
    let written = Input::Put(PutOutcome::Written { revision: 6, create_revision: 6 }, Some(SESSION));
    assert!(matches!(on(&mut m, written), Action::Count { created_up_to: Some(6), .. }));

    let mut m = writing(vec![]);
    assert!(matches!(on(&mut m, held()), Action::AwaitDelete { after: 2, .. }));
}
