//! The key layout of a run (docs/PROTOCOL.md "Key layout"), all under `<prefix>/run_<run_id>/`.

/// Builds the keys of one run. Cheap to clone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunKeys {
    root: String,
}

impl RunKeys {
    /// The keys of run `run_id` under `prefix` (a trailing `/` on the prefix is ignored).
    pub fn new(prefix: &str, run_id: &str) -> Self {
        RunKeys { root: format!("{}/run_{}/", prefix.trim_end_matches('/'), run_id) }
    }

    /// `<prefix>/run_<id>/`: every key of the run starts with this.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// The state value of the current round.
    pub fn state(&self) -> Vec<u8> {
        format!("{}rdzv/active_version", self.root).into_bytes()
    }

    /// The last version handed out.
    pub fn version_counter(&self) -> Vec<u8> {
        format!("{}rdzv/version_counter", self.root).into_bytes()
    }

    /// How far the deletes of old rounds got (see `forget.rs`).
    pub fn forgotten(&self) -> Vec<u8> {
        format!("{}rdzv/forgotten", self.root).into_bytes()
    }

    /// Prefix of the exclusion records of the nodes that failed their health check.
    pub fn excluded_nodes(&self) -> Vec<u8> {
        format!("{}rdzv/excluded/", self.root).into_bytes()
    }

    /// The exclusion record of `node` (bound to its session: it goes with the node).
    pub fn excluded(&self, node: &str) -> Vec<u8> {
        format!("{}rdzv/excluded/{node}", self.root).into_bytes()
    }

    /// The id of the run lease.
    pub fn run_lease(&self) -> Vec<u8> {
        format!("{}lease", self.root).into_bytes()
    }

    /// `rdzv/v_<N>/`: everything of round `version`.
    pub fn round(&self, version: u64) -> String {
        format!("{}rdzv/v_{version}/", self.root)
    }

    /// Prefix of the join keys of round `version`.
    pub fn joins(&self, version: u64) -> Vec<u8> {
        format!("{}join/", self.round(version)).into_bytes()
    }

    /// The join key of `node` in round `version`.
    pub fn join(&self, version: u64, node: &str) -> Vec<u8> {
        format!("{}join/{node}", self.round(version)).into_bytes()
    }

    /// Prefix of the keep-alive keys of the members of round `version`.
    pub fn ranks(&self, version: u64) -> Vec<u8> {
        format!("{}rank_", self.round(version)).into_bytes()
    }

    /// The keep-alive key of member `rank` of round `version`.
    pub fn rank(&self, version: u64, rank: usize) -> Vec<u8> {
        format!("{}rank_{rank}", self.round(version)).into_bytes()
    }

    /// The tally `what` of round `version`: a key whose version counts the creations of
    /// that round's join keys (`joins`) or keep-alive keys (`confirms`), on backends that
    /// count them as they are created.
    pub fn tally(&self, version: u64, what: &str) -> Vec<u8> {
        format!("{}tally/{what}", self.round(version)).into_bytes()
    }

    /// Prefix of the keys of workers waiting for the round after `version`.
    pub fn waiting(&self, version: u64) -> Vec<u8> {
        format!("{}waiting/", self.round(version)).into_bytes()
    }

    /// The waiting key of `node` after round `version`.
    pub fn waiter(&self, version: u64, node: &str) -> Vec<u8> {
        format!("{}waiting/{node}", self.round(version)).into_bytes()
    }

    /// Prefix of the pieces of round `version`'s member list `id` (see `pieces.rs`).
    pub fn members_pieces(&self, version: u64, id: &str) -> Vec<u8> {
        format!("{}members/{id}/", self.round(version)).into_bytes()
    }

    /// Piece `i` of round `version`'s member list `id`, zero-padded so that key order is
    /// piece order.
    pub fn members_piece(&self, version: u64, id: &str, i: usize) -> Vec<u8> {
        format!("{}members/{id}/{i:06}", self.round(version)).into_bytes()
    }

    /// Prefix of the extra data of round `version`.
    pub fn extra_data_prefix(&self, version: u64) -> Vec<u8> {
        format!("{}extra_data/", self.round(version)).into_bytes()
    }

    /// Extra data `key` of round `version`.
    pub fn extra_data(&self, version: u64, key: &str) -> Vec<u8> {
        format!("{}extra_data/{key}", self.round(version)).into_bytes()
    }

    /// Prefix of the round's Store.
    pub fn store(&self, version: u64) -> Vec<u8> {
        format!("{}kv/", self.round(version)).into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_the_reference() {
        let keys = RunKeys::new("/torchelastic/p2p/", "1234");
        assert_eq!(keys.state(), b"/torchelastic/p2p/run_1234/rdzv/active_version");
        assert_eq!(keys.version_counter(), b"/torchelastic/p2p/run_1234/rdzv/version_counter");
        assert_eq!(keys.rank(3, 1), b"/torchelastic/p2p/run_1234/rdzv/v_3/rank_1");
        assert_eq!(keys.join(3, "n"), b"/torchelastic/p2p/run_1234/rdzv/v_3/join/n");
        assert_eq!(keys.waiter(3, "n"), b"/torchelastic/p2p/run_1234/rdzv/v_3/waiting/n");
        assert_eq!(keys.extra_data(3, "x"), b"/torchelastic/p2p/run_1234/rdzv/v_3/extra_data/x");
        assert_eq!(keys.store(3), b"/torchelastic/p2p/run_1234/rdzv/v_3/kv/");
        assert_eq!(keys.run_lease(), b"/torchelastic/p2p/run_1234/lease");
        assert_eq!(keys.excluded("n"), b"/torchelastic/p2p/run_1234/rdzv/excluded/n");
    }
}
