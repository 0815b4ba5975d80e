//! A round's member list in pieces (docs/PROTOCOL.md "How large a round can be"): a `frozen`
//! or `final` value whose list is longer than the inline limit names pieces of it instead,
//! `v_<N>/members/<id>/<i>`. The pieces are written before the value (whoever sees the value
//! finds them), bound to the run lease, never changed (a new list gets a new random id), and
//! deleted with their round. The handlers of one process that share a backend client read a
//! list once, however many they are, and a `final` value reuses the pieces of the `frozen`
//! one it completes.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::sync::OnceCell;

use super::keys::RunKeys;
use super::run_lease::RunLease;
use super::state::{Participant, members};
use crate::error::{KvError, RendezvousError};
use crate::kv::{Kv, KvResult, PutMode, PutOptions, RangeOptions};
use crate::per_process::PerProcess;

/// Where a round's member list is: how many pieces under which id, and how many members
/// they hold together.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pieces {
    /// The list's id, unique to it (a new list is written under a new id).
    pub id: String,
    /// How many pieces: keys `0..count` under the id.
    pub count: usize,
    /// How many members, in rank order across the pieces.
    pub members: usize,
}

/// The member list `participants` of round `version` in pieces of at most `piece_bytes`
/// each (a member longer than that alone in its piece), under a fresh id.
pub(crate) fn split(participants: &[Participant], piece_bytes: usize) -> (Pieces, Vec<Vec<u8>>) {
    let mut pieces: Vec<Vec<u8>> = Vec::new();
    let mut current = b"[".to_vec();
    for member in participants {
        let encoded = members::encode_one(member);
        if current.len() > 1 && current.len() + encoded.len() + 1 > piece_bytes {
            current.push(b']');
            pieces.push(std::mem::replace(&mut current, b"[".to_vec()));
        }
        if current.len() > 1 {
            current.push(b',');
        }
        current.extend_from_slice(&encoded);
    }
    current.push(b']');
    pieces.push(current);
    let id = format!("{:016x}", crate::ids::random_bits());
    (Pieces { id, count: pieces.len(), members: participants.len() }, pieces)
}

/// Writes the pieces of `participants` (round `version`) bound to the run lease, unless
/// this process wrote or read this very list for that round already; says where they are,
/// and whether they were written now.
pub(crate) async fn write(
    kv: &dyn Kv,
    keys: &RunKeys,
    version: u64,
    participants: &Arc<[Participant]>,
    piece_bytes: usize,
    run_lease: &RunLease,
) -> KvResult<(Pieces, bool)> {
    if let Some(known) = known(keys, version, participants) {
        return Ok((known, false));
    }
    let (pieces, values) = split(participants, piece_bytes);
    let lease = run_lease.id().await?;
    for (i, value) in values.iter().enumerate() {
        let options = PutOptions { mode: PutMode::Overwrite, lease: Some(lease) };
        if let Err(e) = kv.put(&keys.members_piece(version, &pieces.id, i), value, options).await {
            if matches!(e, KvError::LeaseNotFound(_)) {
                // The next attempt finds or creates the run lease again.
                run_lease.invalidate(lease);
            }
            return Err(e);
        }
    }
    // Already set only to this same list, written here once.
    let _ = cell(kv, keys, version, &pieces).set(participants.clone());
    Ok((pieces, true))
}

/// The member list of round `version` that `pieces` names: read from the backend (one range
/// read) by the first of this process's handlers to ask, and shared with the others.
pub(crate) async fn read(
    kv: &dyn Kv,
    keys: &RunKeys,
    version: u64,
    pieces: &Pieces,
) -> Result<Arc<[Participant]>, RendezvousError> {
    let cell = cell(kv, keys, version, pieces);
    Ok(cell.get_or_try_init(|| fetch(kv, keys, version, pieces)).await?.clone())
}

async fn fetch(
    kv: &dyn Kv,
    keys: &RunKeys,
    version: u64,
    pieces: &Pieces,
) -> Result<Arc<[Participant]>, RendezvousError> {
    let prefix = keys.members_pieces(version, &pieces.id);
    let found = kv.range(&prefix, RangeOptions::default()).await?;
    let bad = |reason: String| RendezvousError::State {
        key: String::from_utf8_lossy(&prefix).into_owned(),
        reason: format!("round {version}'s member list: {reason}"),
    };
    if found.kvs.len() != pieces.count {
        return Err(bad(format!(
            "{} of its {} pieces found (deleted with the round?)",
            found.kvs.len(),
            pieces.count
        )));
    }
    let mut list = Vec::with_capacity(pieces.members);
    // Piece keys are zero-padded: key order is piece order.
    for piece in &found.kvs {
        list.extend(
            members::decode_list(&piece.value)
                .map_err(|e| bad(format!("a piece is not a member list ({e})")))?,
        );
    }
    if list.len() != pieces.members {
        return Err(bad(format!(
            "{} members in its pieces, not the {} its state says",
            list.len(),
            pieces.members
        )));
    }
    Ok(list.into())
}

/// The lists this process read or wrote lately: by backend client and where they are (to
/// read each once per client), and by the list itself (so that a `final` value names the
/// pieces of its `frozen` one).
struct Entry {
    /// The client's address: handlers on separate clients (as in tests, each on a link of
    /// its own) read for themselves.
    client: usize,
    /// Where the pieces are (round and id).
    prefix: Vec<u8>,
    pieces: Pieces,
    list: Arc<OnceCell<Arc<[Participant]>>>,
}

const KEEP: usize = 16;

static RECENT: PerProcess<Mutex<VecDeque<Entry>>> = PerProcess::new(|| Mutex::new(VecDeque::new()));

fn recent() -> std::sync::MutexGuard<'static, VecDeque<Entry>> {
    RECENT.get().lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The address of the client `kv` (an entry outliving it may see it reused: by a client
/// reading the same immutable pieces, which is harmless).
fn client(kv: &dyn Kv) -> usize {
    kv as *const dyn Kv as *const () as usize
}

/// The cell that holds (or will hold) the list `pieces` names, as read through `kv`.
fn cell(kv: &dyn Kv, keys: &RunKeys, version: u64, pieces: &Pieces) -> Arc<OnceCell<Arc<[Participant]>>> {
    let (client, prefix) = (client(kv), keys.members_pieces(version, &pieces.id));
    let mut recent = recent();
    if let Some(entry) = recent.iter().find(|e| e.client == client && e.prefix == prefix) {
        return entry.list.clone();
    }
    let list = Arc::new(OnceCell::new());
    if recent.len() == KEEP {
        recent.pop_front();
    }
    recent.push_back(Entry { client, prefix, pieces: pieces.clone(), list: list.clone() });
    list
}

/// The pieces of round `version` that hold this very list (the same `Arc`), if this process
/// knows them. (Keyed by run too: the prefix starts with the run's keys.)
fn known(keys: &RunKeys, version: u64, participants: &Arc<[Participant]>) -> Option<Pieces> {
    let round = keys.round(version).into_bytes();
    recent()
        .iter()
        .filter(|e| e.prefix.starts_with(&round))
        .find(|e| e.list.get().is_some_and(|list| Arc::ptr_eq(list, participants)))
        .map(|e| e.pieces.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(i: usize) -> Participant {
        let segment = i.is_multiple_of(3).then(|| format!("rack{}", i / 3));
        Participant {
            node: format!("node{i}"),
            addr: "10.0.0.1".into(),
            pid: i as u32,
            port: Some(29500),
            segment,
        }
    }

    #[test]
    fn pieces_keep_the_order_and_stay_within_their_size() {
        let list: Vec<Participant> = (0..1000).map(member).collect();
        for piece_bytes in [1, 64, 1000, 1 << 20] {
            let (pieces, values) = split(&list, piece_bytes);
            assert_eq!((pieces.count, pieces.members), (values.len(), 1000));
            let mut read = Vec::new();
            for value in &values {
                let members = members::decode_list(value).expect("a piece reads back");
                // Over the size only where one member alone is larger.
                assert!(
                    value.len() <= piece_bytes || members.len() == 1,
                    "{} bytes > {piece_bytes}",
                    value.len()
                );
                read.extend(members);
            }
            assert_eq!(read, list, "pieces of {piece_bytes} bytes");
        }
        assert_eq!(split(&list, 1).0.count, 1000);
        assert_eq!(split(&list, 1 << 20).0.count, 1);
    }

    #[test]
    fn each_list_gets_its_own_id() {
        let list: Vec<Participant> = (0..3).map(member).collect();
        assert_ne!(split(&list, 64).0.id, split(&list, 64).0.id);
    }
}
