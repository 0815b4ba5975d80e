//! The state value of a round (docs/PROTOCOL.md "States of a round"): one small JSON object under
//! `rdzv/active_version`, with the reference's status names.

use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::keys::RunKeys;
use super::pieces::Pieces;
use crate::error::RendezvousError;
use crate::kv::{KeyValue, Kv};

/// A member of a round: who it is and where to reach it. Its rank is its index in the
/// round's participant list.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Participant {
    /// The worker's node id (unique within the run).
    pub node: String,
    /// The address it advertises (host name or IP).
    pub addr: String,
    /// Its process id.
    pub pid: u32,
    /// A TCP port that was free on its machine when it joined (rank 0's becomes
    /// `MASTER_PORT`); absent in values written by older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The segment of the hardware it is in (an NVLink domain, a rack: the `segment`
    /// option), if it said: the members of a segment get consecutive ranks
    /// (docs/PROTOCOL.md "Segments").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment: Option<String>,
}

/// What a worker writes under its join key and its waiting key: its descriptor, plus what the
/// freeze needs to give it its place (docs/PROTOCOL.md "Who is in, and their ranks"). Values
/// written by older versions (a bare [`Participant`]) read as a joiner with neither.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Joiner {
    /// The worker's node id.
    pub node: String,
    /// The address it advertises.
    pub addr: String,
    /// Its process id.
    pub pid: u32,
    /// A TCP port that was free on its machine when it joined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Its segment, if it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment: Option<String>,
    /// The last round this worker was a member of, and its rank there: a survivor of the
    /// round before the forming one keeps its rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<LastRound>,
    /// When this worker first arrived in the run: the create revision of the first join or
    /// waiting key it wrote (absent: this key is its first, so its own create revision).
    /// Newcomers are admitted in this order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<crate::kv::Revision>,
    /// Its node's index in the scheduler's order of the job's nodes (the `node_index`
    /// option): what `rank_order=slurm` orders newcomers by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_index: Option<u64>,
}

/// The segments of a round's ranks, in rank order, as runs of one segment: written as
/// `[["rack1", 18], ["rack2", 18]]`, a member without a segment as `""`. What the freeze of
/// the round after needs to give a free rank to a worker of the segment that held it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentRuns(pub Vec<(String, usize)>);

impl SegmentRuns {
    /// The runs of `members`' segments, or `None` when none of them has one.
    pub fn of(members: &[Participant]) -> Option<SegmentRuns> {
        if members.iter().all(|m| m.segment.is_none()) {
            return None;
        }
        let mut runs: Vec<(String, usize)> = Vec::new();
        for m in members {
            let segment = m.segment.as_deref().unwrap_or("");
            match runs.last_mut() {
                Some((last, count)) if last == segment => *count += 1,
                _ => runs.push((segment.to_string(), 1)),
            }
        }
        Some(SegmentRuns(runs))
    }

    /// The segment of `rank`'s member (`None`: it had none, or the round had no such rank).
    pub fn segment_of(&self, rank: usize) -> Option<&str> {
        let mut first = 0;
        for (segment, count) in &self.0 {
            if rank < first + count {
                return Some(segment.as_str()).filter(|s| !s.is_empty());
            }
            first += count;
        }
        None
    }

    /// The round's number of members.
    pub fn world_size(&self) -> usize {
        self.0.iter().map(|(_, count)| count).sum()
    }
}

/// A round a worker was a member of, and its rank in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastRound {
    /// The round.
    pub version: u64,
    /// The worker's rank in it.
    pub rank: usize,
}

/// How a closed run ended, when the closer said so (`RendezvousHandler::set_closed_with`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunOutcome {
    /// The job finished: every worker succeeded.
    Succeeded,
    /// The job failed and will not be retried.
    Failed,
}

impl RunOutcome {
    /// The name used in the state value and in output (`succeeded`, `failed`).
    pub fn as_str(self) -> &'static str {
        match self {
            RunOutcome::Succeeded => "succeeded",
            RunOutcome::Failed => "failed",
        }
    }
}

/// The state of the current round.
// Read through the flat `Wire` form: serde's internally tagged enums buffer every value into
// an intermediate tree first, which at thousands of handlers parsing every state change was
// a quarter of a busy process's CPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "lowercase", try_from = "Wire")]
pub enum State {
    /// Someone is creating a new round (bound to its writer's session).
    Setup,
    /// Round `version` accepts joiners.
    Joinable {
        /// The round.
        version: u64,
        /// The last round that was final before this one, when its creator knew it (it ended
        /// that round to open this one): its surviving members keep their ranks, and the
        /// freeze waits for them before it admits spares. Absent in values written by older
        /// versions, and when the round was opened from no state.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        previous: Option<u64>,
        /// The segments of `previous`'s ranks, when a member of it had one: a free rank goes
        /// to a newcomer of the segment of the member that held it (docs/PROTOCOL.md
        /// "Segments").
        #[serde(default, skip_serializing_if = "Option::is_none")]
        segments: Option<SegmentRuns>,
    },
    /// Membership of round `version` is fixed; members are confirming (10 s lease).
    Frozen {
        /// The round.
        version: u64,
        /// The members, in rank order (shared: thousands of handlers of one process hold
        /// the same list). Written in the compact form `members`.
        #[serde(rename = "members", serialize_with = "members::serialize")]
        participants: Arc<[Participant]>,
    },
    /// Round `version` is complete and running.
    Final {
        /// The round.
        version: u64,
        /// The members, in rank order (shared, as in `Frozen`).
        #[serde(rename = "members", serialize_with = "members::serialize")]
        participants: Arc<[Participant]>,
        /// The revision of the last member's keep-alive key: every member was alive then,
        /// so a member gone after it — even before `final` was written — is a death the
        /// members must be told of. Absent in values written by older versions.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        confirmed: Option<crate::kv::Revision>,
        /// The `max_workers` of the member that wrote it: how many the round could take, so
        /// that a reader without the parameters (`rdzv status`) can tell spares from waiters
        /// the next round would admit. Absent in values written by older versions.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_workers: Option<usize>,
    },
    /// The run is over.
    Closed {
        /// How it ended, if its closer said so.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        outcome: Option<RunOutcome>,
    },
}

/// A state value as written, read in one pass (see [`State`]).
#[derive(Deserialize)]
struct Wire {
    status: Status,
    #[serde(default)]
    version: Option<u64>,
    /// The members as older versions wrote them (objects with field names).
    #[serde(default)]
    participants: Option<Arc<[Participant]>>,
    /// The members in the compact form (see `members`).
    #[serde(default, deserialize_with = "members::deserialize")]
    members: Option<Arc<[Participant]>>,
    #[serde(default)]
    confirmed: Option<crate::kv::Revision>,
    #[serde(default)]
    previous: Option<u64>,
    #[serde(default)]
    segments: Option<SegmentRuns>,
    #[serde(default)]
    outcome: Option<RunOutcome>,
    #[serde(default)]
    max_workers: Option<usize>,
    /// Where the members are when the value does not list them (see `pieces.rs`).
    #[serde(default)]
    pieces: Option<Pieces>,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum Status {
    Setup,
    Joinable,
    Frozen,
    Final,
    Closed,
}

/// A state value as read: whole, or a round whose member list is in pieces yet to be read.
pub(crate) enum Parsed {
    /// The state, members and all.
    Whole(State),
    /// A `frozen` or `final` value without its members (an empty list in their place), and
    /// where they are.
    InPieces(State, Pieces),
}

impl Parsed {
    fn from_wire(wire: Wire) -> Result<Parsed, String> {
        let Wire {
            status,
            version,
            participants,
            members,
            confirmed,
            previous,
            segments,
            outcome,
            max_workers,
            pieces,
        } = wire;
        let missing = |field: &str| format!("missing field `{field}`");
        let (participants, pieces) = match (members.or(participants), pieces) {
            (Some(listed), _) => (Some(listed), None),
            (None, Some(pieces)) => (Some(Arc::from(Vec::new())), Some(pieces)),
            (None, None) => (None, None),
        };
        let state = match status {
            Status::Setup => State::Setup,
            Status::Closed => State::Closed { outcome },
            Status::Joinable => {
                State::Joinable { version: version.ok_or_else(|| missing("version"))?, previous, segments }
            }
            Status::Frozen => State::Frozen {
                version: version.ok_or_else(|| missing("version"))?,
                participants: participants.ok_or_else(|| missing("members"))?,
            },
            Status::Final => State::Final {
                version: version.ok_or_else(|| missing("version"))?,
                participants: participants.ok_or_else(|| missing("members"))?,
                confirmed,
                max_workers,
            },
        };
        Ok(match pieces {
            Some(pieces) if matches!(state, State::Frozen { .. } | State::Final { .. }) => {
                Parsed::InPieces(state, pieces)
            }
            _ => Parsed::Whole(state),
        })
    }
}

impl TryFrom<Wire> for State {
    type Error = String;

    fn try_from(wire: Wire) -> Result<State, String> {
        match Parsed::from_wire(wire)? {
            Parsed::Whole(state) => Ok(state),
            Parsed::InPieces(..) => {
                Err("its member list is in pieces, which only `State::read` reads".into())
            }
        }
    }
}

/// The JSON form of a `frozen` or `final` value whose members are in pieces.
#[derive(Serialize)]
struct InPiecesWire<'a> {
    status: &'static str,
    version: u64,
    pieces: &'a Pieces,
    #[serde(skip_serializing_if = "Option::is_none")]
    confirmed: Option<crate::kv::Revision>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_workers: Option<usize>,
}

impl State {
    /// Parses a state value read from `key`. Unknown fields are ignored; anything else that
    /// is not a valid state is a [`RendezvousError::State`] naming the key.
    ///
    /// Large values (a frozen or final round's participant list) are parsed once per process:
    /// every handler of a process sees the same state change, and a recent value that is
    /// byte for byte the same is handed out again, sharing its participant list. The same
    /// buffer (backends hand one to every watcher and reader) is recognized without
    /// comparing its bytes.
    pub fn parse(key: &[u8], value: &Bytes) -> Result<State, RendezvousError> {
        if value.len() < SHARE_FROM_BYTES {
            return State::parse_uncached(key, value);
        }
        if let Some(state) = recent::find(value) {
            return Ok(state);
        }
        let state = State::parse_uncached(key, value)?;
        recent::remember(value, &state);
        Ok(state)
    }

    fn parse_uncached(key: &[u8], value: &[u8]) -> Result<State, RendezvousError> {
        match State::parse_value(key, value)? {
            Parsed::Whole(state) => Ok(state),
            Parsed::InPieces(..) => {
                Err(invalid(key, value, "its member list is in pieces, which only `State::read` reads"))
            }
        }
    }

    /// `value` read from `key`, parsed once: whole, or naming pieces of its member list.
    fn parse_value(key: &[u8], value: &[u8]) -> Result<Parsed, RendezvousError> {
        let wire: Wire = serde_json::from_slice(value).map_err(|e| invalid(key, value, e))?;
        let parsed = Parsed::from_wire(wire).map_err(|e| invalid(key, value, e))?;
        if let Parsed::Whole(State::Frozen { participants, .. } | State::Final { participants, .. }) = &parsed
            && participants.is_empty()
        {
            return Err(RendezvousError::State {
                key: String::from_utf8_lossy(key).into_owned(),
                reason: "a frozen or final round has no participants".into(),
            });
        }
        Ok(parsed)
    }

    /// Reads the state value `found` (read from `keys.state()`): as [`State::parse`], and
    /// where the value names pieces of its member list (a round longer than the writer's
    /// `members_inline_bytes`), reads them too — once per process, whichever of its
    /// handlers asks first.
    pub async fn read(kv: &dyn Kv, keys: &RunKeys, found: &KeyValue) -> Result<State, RendezvousError> {
        if found.value.len() >= SHARE_FROM_BYTES {
            return State::parse(&found.key, &found.value);
        }
        match State::parse_value(&found.key, &found.value)? {
            Parsed::Whole(state) => Ok(state),
            Parsed::InPieces(template, at) => {
                let version = template.version().unwrap_or_default();
                // Boxed: inline, this rare read would size the future of every waiting call.
                let list = Box::pin(super::pieces::read(kv, keys, version, &at)).await?;
                Ok(template.with_participants(list))
            }
        }
    }

    /// As [`State::parse`], except that a value naming pieces of its member list reads with
    /// an empty list in its place: for readers that need only the status, the version and
    /// the outcome, and no I/O.
    pub fn parse_header(key: &[u8], value: &Bytes) -> Result<State, RendezvousError> {
        if value.len() >= SHARE_FROM_BYTES {
            return State::parse(key, value);
        }
        match State::parse_value(key, value)? {
            Parsed::Whole(state) | Parsed::InPieces(state, _) => Ok(state),
        }
    }

    /// Whether `value` is a state value that names pieces of its member list (which only
    /// [`State::read`] reads).
    pub fn names_pieces(value: &[u8]) -> bool {
        value.len() < SHARE_FROM_BYTES && matches!(State::parse_value(b"", value), Ok(Parsed::InPieces(..)))
    }

    /// This `frozen` or `final` state with its members `list`.
    fn with_participants(self, list: Arc<[Participant]>) -> State {
        match self {
            State::Frozen { version, .. } => State::Frozen { version, participants: list },
            State::Final { version, confirmed, max_workers, .. } => {
                State::Final { version, participants: list, confirmed, max_workers }
            }
            other => other,
        }
    }

    /// The value to write for this state: itself, or, for a `frozen` or `final` round whose
    /// member list is longer than `inline_bytes`, a value that names the pieces of the list,
    /// which are written first (bound to the run lease) unless this process wrote or read
    /// them already. With the value, the prefix of the pieces written now, if any: theirs
    /// to delete should the value not be written.
    pub(crate) async fn value_to_write(
        &self,
        kv: &dyn Kv,
        keys: &RunKeys,
        inline_bytes: usize,
        run_lease: &super::run_lease::RunLease,
    ) -> crate::kv::KvResult<(Vec<u8>, Option<Vec<u8>>)> {
        let (status, version, participants, confirmed, max_workers) = match self {
            State::Frozen { version, participants } => ("frozen", *version, participants, None, None),
            State::Final { version, participants, confirmed, max_workers } => {
                ("final", *version, participants, *confirmed, *max_workers)
            }
            _ => return Ok((self.to_bytes(), None)),
        };
        let whole = self.to_bytes();
        if whole.len() <= inline_bytes {
            return Ok((whole, None));
        }
        // Boxed, as the read in `State::read`: one writer per round takes this path.
        let (pieces, fresh) =
            Box::pin(super::pieces::write(kv, keys, version, participants, inline_bytes, run_lease)).await?;
        let wire = InPiecesWire { status, version, pieces: &pieces, confirmed, max_workers };
        let written = fresh.then(|| keys.members_pieces(version, &pieces.id));
        Ok((serde_json::to_vec(&wire).unwrap_or_default(), written))
    }

    /// The JSON encoding of this state.
    pub fn to_bytes(&self) -> Vec<u8> {
        // Serializing plain strings and integers cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The round this state is about, if any.
    pub fn version(&self) -> Option<u64> {
        match self {
            State::Joinable { version, .. }
            | State::Frozen { version, .. }
            | State::Final { version, .. } => Some(*version),
            State::Setup | State::Closed { .. } => None,
        }
    }

    /// The status name, as in the JSON value.
    pub fn status(&self) -> &'static str {
        match self {
            State::Setup => "setup",
            State::Joinable { .. } => "joinable",
            State::Frozen { .. } => "frozen",
            State::Final { .. } => "final",
            State::Closed { .. } => "closed",
        }
    }
}

/// A descriptor (`what`, for the error) read from `key`.
fn parse_descriptor<T: serde::de::DeserializeOwned>(
    key: &[u8],
    value: &[u8],
    what: &str,
) -> Result<T, RendezvousError> {
    serde_json::from_slice(value).map_err(|e| RendezvousError::State {
        key: String::from_utf8_lossy(key).into_owned(),
        reason: format!("not a valid {what} descriptor ({e}): {}", preview(value)),
    })
}

impl Joiner {
    /// Parses a join or waiting key's value read from `key`.
    pub fn parse(key: &[u8], value: &[u8]) -> Result<Joiner, RendezvousError> {
        parse_descriptor(key, value, "joiner")
    }

    /// The JSON encoding of this descriptor.
    pub fn to_bytes(&self) -> Vec<u8> {
        // Plain strings and integers: serializing cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The worker as a member of a round.
    pub fn participant(&self) -> Participant {
        Participant {
            node: self.node.clone(),
            addr: self.addr.clone(),
            pid: self.pid,
            port: self.port,
            segment: self.segment.clone(),
        }
    }
}

impl Participant {
    /// What tells one worker from another: node id, address and process id (another live
    /// process may carry the same node id).
    pub(crate) fn identity(&self) -> (&str, &str, u32) {
        (self.node.as_str(), self.addr.as_str(), self.pid)
    }

    /// This worker's join descriptor, with what it remembers of the run.
    pub fn joiner(&self, last: Option<LastRound>, since: Option<crate::kv::Revision>) -> Joiner {
        Joiner {
            node: self.node.clone(),
            addr: self.addr.clone(),
            pid: self.pid,
            port: self.port,
            segment: self.segment.clone(),
            last,
            since,
            node_index: None,
        }
    }

    /// Parses a participant descriptor read from `key` (a join or keep-alive key's value).
    pub fn parse(key: &[u8], value: &[u8]) -> Result<Participant, RendezvousError> {
        parse_descriptor(key, value, "participant")
    }

    /// The JSON encoding of this descriptor.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// From this size on, parsed state values are shared within the process (below it, parsing
/// is cheaper than the lookup).
const SHARE_FROM_BYTES: usize = 4096;

/// The compact form of a round's members in a `frozen` or `final` value: one array
/// `[node, addr, pid, port]` per member (`port` null when unknown), `[node, addr, pid, port,
/// segment]` for a member with a segment, instead of an object with field names: about a
/// third smaller, and it is the value every member receives, whose size bounds how many
/// members a round can have (docs/PROTOCOL.md "How large a round can be").
pub(super) mod members {
    use std::sync::Arc;

    use serde::de::{self, SeqAccess, Visitor};
    use serde::ser::SerializeSeq;
    use serde::{Deserialize, Deserializer, Serializer};

    use super::Participant;

    /// One member as written: node, address, process id, port, and its segment if it has one.
    struct Member(Participant);

    pub(super) fn serialize<S: Serializer>(members: &Arc<[Participant]>, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(members.len()))?;
        for p in members.iter() {
            match &p.segment {
                None => seq.serialize_element(&(&p.node, &p.addr, p.pid, p.port))?,
                Some(segment) => seq.serialize_element(&(&p.node, &p.addr, p.pid, p.port, segment))?,
            }
        }
        seq.end()
    }

    /// One member as it appears in a list: `[node, addr, pid, port]` or with its segment.
    pub(in crate::rendezvous) fn encode_one(p: &Participant) -> Vec<u8> {
        let encoded = match &p.segment {
            None => serde_json::to_vec(&(&p.node, &p.addr, p.pid, p.port)),
            Some(segment) => serde_json::to_vec(&(&p.node, &p.addr, p.pid, p.port, segment)),
        };
        // Strings and integers always serialize.
        encoded.unwrap_or_default()
    }

    /// A JSON list of members as [`encode_one`] writes them.
    pub(in crate::rendezvous) fn decode_list(bytes: &[u8]) -> serde_json::Result<Vec<Participant>> {
        let mut d = serde_json::Deserializer::from_slice(bytes);
        let members = Vec::<Member>::deserialize(&mut d)?;
        d.end()?;
        Ok(members.into_iter().map(|m| m.0).collect())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Arc<[Participant]>>, D::Error> {
        let members: Option<Vec<Member>> = Option::deserialize(d)?;
        Ok(members.map(|all| all.into_iter().map(|m| m.0).collect()))
    }

    impl<'de> Deserialize<'de> for Member {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Member, D::Error> {
            d.deserialize_seq(MemberVisitor)
        }
    }

    struct MemberVisitor;

    impl<'de> Visitor<'de> for MemberVisitor {
        type Value = Member;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a member: [node, addr, pid, port] or [node, addr, pid, port, segment]")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Member, A::Error> {
            let missing = |i| de::Error::invalid_length(i, &self);
            let node = seq.next_element()?.ok_or_else(|| missing(0))?;
            let addr = seq.next_element()?.ok_or_else(|| missing(1))?;
            let pid = seq.next_element()?.ok_or_else(|| missing(2))?;
            let port = seq.next_element()?.ok_or_else(|| missing(3))?;
            let segment = seq.next_element()?;
            if seq.next_element::<de::IgnoredAny>()?.is_some() {
                return Err(de::Error::invalid_length(6, &self));
            }
            Ok(Member(Participant { node, addr, pid, port, segment }))
        }
    }
}

/// The last few large state values parsed in this process, with what they parsed to.
mod recent {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use bytes::Bytes;

    use super::State;
    use crate::per_process::PerProcess;

    const KEEP: usize = 4;

    /// Held as `Bytes`, so a buffer kept here is never freed and reused for another value:
    /// the same address and length is then the same value. One per process: a child forked
    /// while a parent thread held the lock would otherwise wait on it for ever.
    static RECENT: PerProcess<Mutex<VecDeque<(Bytes, State)>>> =
        PerProcess::new(|| Mutex::new(VecDeque::new()));

    fn same_buffer(a: &Bytes, b: &Bytes) -> bool {
        a.as_ptr() == b.as_ptr() && a.len() == b.len()
    }

    /// The state a byte-identical value parsed to, if it is among the recent ones.
    pub(super) fn find(value: &Bytes) -> Option<State> {
        let recent = RECENT.get().lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let hit = recent.iter().find(|(bytes, _)| same_buffer(bytes, value));
        hit.or_else(|| recent.iter().find(|(bytes, _)| bytes == value)).map(|(_, state)| state.clone())
    }

    pub(super) fn remember(value: &Bytes, state: &State) {
        let mut recent = RECENT.get().lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if recent.len() == KEEP {
            recent.pop_front();
        }
        recent.push_back((value.clone(), state.clone()));
    }
}

/// The error for a `value` read from `key` that is no valid state value.
fn invalid(key: &[u8], value: &[u8], e: impl std::fmt::Display) -> RendezvousError {
    RendezvousError::State {
        key: String::from_utf8_lossy(key).into_owned(),
        reason: format!("not a valid state value ({e}): {}", preview(value)),
    }
}

fn preview(value: &[u8]) -> String {
    const MAX: usize = 80;
    let text = String::from_utf8_lossy(&value[..value.len().min(MAX)]).into_owned();
    if value.len() > MAX { format!("{text:?}…") } else { format!("{text:?}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(node: &str) -> Participant {
        Participant { node: node.into(), addr: "h".into(), pid: 1, port: None, segment: None }
    }

    #[test]
    fn round_trips_and_keeps_reference_names() {
        let states = [
            State::Setup,
            State::Joinable { version: 3, previous: None, segments: None },
            State::Joinable { version: 4, previous: Some(3), segments: None },
            State::Frozen { version: 3, participants: vec![p("a"), p("b")].into() },
            State::Final {
                version: 3,
                participants: vec![p("a")].into(),
                confirmed: Some(7),
                max_workers: Some(4),
            },
            State::Closed { outcome: None },
            State::Closed { outcome: Some(RunOutcome::Succeeded) },
        ];
        for s in states {
            let bytes = s.to_bytes();
            let text = String::from_utf8(bytes.clone()).expect("utf8");
            assert!(text.contains(&format!("\"status\":\"{}\"", s.status())), "{text}");
            assert_eq!(State::parse(b"k", &Bytes::from(bytes)).expect("parses"), s);
        }
    }

    #[test]
    fn members_are_written_compact_and_the_older_form_is_read() {
        let fin = State::Final {
            version: 3,
            participants: vec![p("a")].into(),
            confirmed: None,
            max_workers: None,
        };
        let text = String::from_utf8(fin.to_bytes()).expect("utf8");
        assert_eq!(text, r#"{"status":"final","version":3,"members":[["a","h",1,null]]}"#);
        let older = br#"{"status":"final","version":3,"participants":[{"node":"a","addr":"h","pid":1}]}"#;
        assert_eq!(State::parse(b"k", &Bytes::from_static(older)).expect("parses"), fin);
    }

    #[test]
    fn segments_ride_in_members_and_in_the_joinable_value() {
        let racked = Participant { segment: Some("rack1".into()), ..p("b") };
        let fin = State::Final {
            version: 3,
            participants: vec![p("a"), racked.clone()].into(),
            confirmed: None,
            max_workers: None,
        };
        let text = String::from_utf8(fin.to_bytes()).expect("utf8");
        assert_eq!(
            text,
            r#"{"status":"final","version":3,"members":[["a","h",1,null],["b","h",1,null,"rack1"]]}"#
        );
        assert_eq!(State::parse(b"k", &Bytes::from(text.into_bytes())).expect("parses"), fin);
        let six = br#"{"status":"final","version":3,"members":[["a","h",1,null,"r","x"]]}"#;
        assert!(State::parse(b"k", &Bytes::from_static(six)).is_err());
        let open = State::Joinable {
            version: 4,
            previous: Some(3),
            segments: SegmentRuns::of(&[p("a"), racked.clone()]),
        };
        let text = String::from_utf8(open.to_bytes()).expect("utf8");
        assert_eq!(text, r#"{"status":"joinable","version":4,"previous":3,"segments":[["",1],["rack1",1]]}"#);
        assert_eq!(State::parse(b"k", &Bytes::from(text.into_bytes())).expect("parses"), open);
        let joiner = racked.joiner(None, None);
        assert_eq!(Joiner::parse(b"k", &joiner.to_bytes()).expect("parses").participant(), racked);
    }

    /// Issue 25: the value every member of a round of 16,384 receives stays under 1 MiB with
    /// node ids of the default form (`<host>-<pid>-<6 hex digits>`) on 12-character host
    /// names (0.93 MiB); it took 1.36 MiB with field names (etcd refuses requests over 1.5 MiB by default).
    #[test]
    fn a_final_value_of_16384_members_is_under_one_mebibyte() {
        let members: Vec<Participant> = (0..16384u32)
            .map(|i| {
                let host = format!("trainer-{i:04}");
                let pid = 100_000 + i;
                let port = Some(40_000 + (i % 20_000) as u16);
                Participant {
                    node: format!("{host}-{pid}-{:06x}", i * 7919 % 0xff_ffff),
                    addr: host,
                    pid,
                    port,
                    segment: None,
                }
            })
            .collect();
        let fin = State::Final {
            version: 9,
            participants: members.into(),
            confirmed: Some(1 << 40),
            max_workers: Some(16384),
        };
        let size = fin.to_bytes().len();
        assert!(size <= 1 << 20, "{size} bytes");
    }

    #[test]
    fn large_values_share_their_participant_list() {
        let many: Vec<Participant> = (0..200).map(|i| p(&format!("node-{i}"))).collect();
        let fin =
            State::Final { version: 9, participants: many.into(), confirmed: Some(3), max_workers: None };
        let bytes = Bytes::from(fin.to_bytes());
        assert!(bytes.len() >= SHARE_FROM_BYTES);
        // The same buffer, and a copy of it (as a backend that reads each value afresh gives).
        let copy = Bytes::copy_from_slice(&bytes);
        let parsed = [&bytes, &bytes, &copy].map(|b| State::parse(b"k", b).expect("parses"));
        assert_eq!(parsed[0], fin);
        let lists: Vec<_> = parsed
            .iter()
            .map(|s| match s {
                State::Final { participants, .. } => participants.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert!(lists.iter().all(|l| Arc::ptr_eq(l, &lists[0])), "parsed more than once");
        // A different value is never taken for a remembered one.
        let other = State::Final {
            version: 10,
            participants: vec![p("x")].into(),
            confirmed: None,
            max_workers: None,
        };
        assert_eq!(State::parse(b"k", &Bytes::from(other.to_bytes())).expect("parses"), other);
    }

    #[test]
    fn joiners_read_old_descriptors_and_round_trip() {
        let old = Bytes::from(p("a").to_bytes());
        let read = Joiner::parse(b"k", &old).expect("a bare participant is a joiner");
        assert_eq!((read.participant(), read.last, read.since), (p("a"), None, None));
        let full = p("a").joiner(Some(LastRound { version: 4, rank: 2 }), Some(17));
        assert_eq!(Joiner::parse(b"k", &full.to_bytes()).expect("parses"), full);
        // What the state's participant list holds stays the bare descriptor.
        let text = String::from_utf8(full.participant().to_bytes()).expect("utf8");
        assert!(!text.contains("last") && !text.contains("since"), "{text}");
    }

    #[test]
    fn ignores_unknown_fields() {
        let value = Bytes::from_static(br#"{"status":"joinable","version":7,"future":[1,2]}"#);
        let s = State::parse(b"k", &value).expect("parses");
        assert_eq!(s, State::Joinable { version: 7, previous: None, segments: None });
    }

    #[test]
    fn corrupt_values_are_state_errors_naming_the_key() {
        for bad in [
            &b"garbage"[..],
            b"",
            b"{}",
            br#"{"status":"joinable"}"#,
            br#"{"status":"final","version":1,"participants":[]}"#,
            br#"{"status":"final","version":-1,"participants":[]}"#,
            br#"{"status":"weird","version":1}"#,
            b"\xff\xfe",
            br#"[1,2,3]"#,
        ] {
            match State::parse(b"/p/run_x/rdzv/active_version", &Bytes::from_static(bad)) {
                Err(RendezvousError::State { key, .. }) => assert_eq!(key, "/p/run_x/rdzv/active_version"),
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
    }
}
