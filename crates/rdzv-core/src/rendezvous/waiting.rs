//! Who waits for the next round while one runs, and how many of them it could admit: what
//! `num_nodes_waiting` answers and `rdzv status` shows (docs/PROTOCOL.md "Spares").

use crate::error::RendezvousError;
use crate::ext::KvExt;
use crate::kv::{Kv, RangeOptions, RangeOrder};

use super::keys::RunKeys;
use super::state::{Joiner, State};

/// The workers waiting for the round after the running one, and how many of them it could
/// admit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Waiting {
    /// The running round (`None`: no round is running; then nobody counts as waiting).
    pub version: Option<u64>,
    /// Its members whose keep-alive keys exist.
    pub members_alive: usize,
    /// Its world size.
    pub world_size: usize,
    /// The largest world size, when known (the reader's `max_workers`, else the one the
    /// round's `final` value records).
    pub max_workers: Option<usize>,
    /// The waiting workers in the order the next round takes them (arrival in the run).
    pub waiters: Vec<Joiner>,
    /// How many of `waiters`, from the first, the next round could admit: the room
    /// `max_workers` leaves beside the members still alive (all of them when `max_workers` is
    /// not known). The rest are *spares*.
    pub admissible: usize,
}

impl Waiting {
    /// The waiters of the spares that are not admissible.
    pub fn spares(&self) -> &[Joiner] {
        &self.waiters[self.admissible.min(self.waiters.len())..]
    }

    /// Reads the run's state, the running round's keep-alive keys and its waiting keys.
    /// `max_workers` is the reader's parameter, if it has one.
    pub async fn read(
        kv: &dyn Kv,
        keys: &RunKeys,
        max_workers: Option<usize>,
    ) -> Result<Waiting, RendezvousError> {
        let read = kv.get(&keys.state()).await?;
        let state = read.kv.map(|kv| State::parse(&kv.key, &kv.value)).transpose()?;
        let Some(State::Final { version, participants, max_workers: recorded, .. }) = state else {
            return Ok(Waiting::default());
        };
        let members_alive = (kv.count(&keys.ranks(version), None).await? as usize).min(participants.len());
        let options = RangeOptions { order: RangeOrder::ByCreateRevision, ..RangeOptions::default() };
        let found = kv.range(&keys.waiting(version), options).await?;
        let mut waiters = Vec::with_capacity(found.kvs.len());
        for kv in &found.kvs {
            let joiner = Joiner::parse(&kv.key, &kv.value)?;
            let arrival = joiner.since.map_or(kv.create_revision, |since| since.min(kv.create_revision));
            waiters.push((arrival, kv.create_revision, joiner));
        }
        waiters.sort_by_key(|(arrival, created, _)| (*arrival, *created));
        let waiters: Vec<Joiner> = waiters.into_iter().map(|(_, _, joiner)| joiner).collect();
        let max_workers = max_workers.or(recorded);
        let room = max_workers.map_or(usize::MAX, |max| max.saturating_sub(members_alive));
        Ok(Waiting {
            version: Some(version),
            members_alive,
            world_size: participants.len(),
            max_workers,
            admissible: waiters.len().min(room),
            waiters,
        })
    }
}
