//! Reading the state value with its member list when the value may be replaced meanwhile.
//!
//! A `frozen` or `final` value whose list is in pieces (pieces.rs) is read in two steps: the
//! value, then its pieces. The pieces are deleted with their round, and a round is deleted
//! only once later rounds replaced its value. So a value whose pieces are gone is no longer
//! the state: it was read just before it was replaced, or it came from a watch's history
//! (a member that re-enters watches from the revision of its last round). Such a value is
//! passed over for the one that replaced it; only a value that is still the state and reads
//! wrong is an error.

use super::keys::RunKeys;
use super::state::State;
use crate::error::RendezvousError;
use crate::kv::{KeyValue, Kv, Revision};

/// The state key as read now: its value with the state it holds (none when no round
/// exists), and the store revision of the read.
#[derive(Clone, Debug)]
pub struct Current {
    /// The key as read, and the state its value holds (member list included).
    pub value: Option<(KeyValue, State)>,
    /// The store revision of the read.
    pub revision: Revision,
}

impl Current {
    /// The state, if a round exists.
    pub fn state(&self) -> Option<&State> {
        self.value.as_ref().map(|(_, state)| state)
    }

    /// The state, if a round exists, without the key it was read from.
    pub fn into_state(self) -> Option<State> {
        self.value.map(|(_, state)| state)
    }

    /// Reads the state key and the state its value holds ([`State::read`]). A value that
    /// does not read (its member list gone) but was replaced by then is passed over: the key
    /// is read again. Fails with the value's error only if it is still the state.
    pub async fn read(kv: &dyn Kv, keys: &RunKeys) -> Result<Current, RendezvousError> {
        loop {
            let read = kv.get(&keys.state()).await?;
            let Some(found) = read.kv else {
                return Ok(Current { value: None, revision: read.revision });
            };
            // Boxed, as where a watch's event is read (executor.rs): it is rarely more than a parse.
            if let Some(state) = Box::pin(read_unless_replaced(kv, keys, &found)).await? {
                return Ok(Current { value: Some((found, state)), revision: read.revision });
            }
        }
    }
}

/// Reads `found`, a value the state key held (a watch's event): its state, or `None` if the
/// value does not read (its member list gone) and has been replaced since — a later event
/// of the same watch brings what replaced it. Fails with the value's error only if it is
/// still the state.
pub(crate) async fn read_unless_replaced(
    kv: &dyn Kv,
    keys: &RunKeys,
    found: &KeyValue,
) -> Result<Option<State>, RendezvousError> {
    match State::read(kv, keys, found).await {
        Ok(state) => Ok(Some(state)),
        Err(error @ RendezvousError::State { .. }) => {
            let now = kv.get(&keys.state()).await?;
            match now.kv {
                Some(current) if current.mod_revision == found.mod_revision => Err(error),
                _ => Ok(None),
            }
        }
        Err(error) => Err(error),
    }
}
