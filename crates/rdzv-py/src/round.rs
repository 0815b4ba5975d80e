//! `rdzv.Round` and `rdzv.Participant`: a worker's place in a completed round, as Python
//! values.

use pyo3::prelude::*;

use crate::store::Store;

/// A member of a round.
#[pyclass(module = "rdzv._rdzv", frozen, get_all)]
#[derive(Clone)]
pub(crate) struct Participant {
    /// Node id.
    node: String,
    /// Advertised address.
    addr: String,
    /// Process id.
    pid: u32,
    /// A port that was free on its machine when it joined.
    port: Option<u16>,
    /// Its segment (an NVLink domain, a rack), if it named one.
    segment: Option<String>,
}

#[pymethods]
impl Participant {
    fn __repr__(&self) -> String {
        let port = self.port.map_or_else(|| "None".to_string(), |p| p.to_string());
        let segment = self.segment.as_deref().map_or_else(|| "None".to_string(), |s| format!("{s:?}"));
        format!(
            "Participant(node={:?}, addr={:?}, pid={}, port={port}, segment={segment})",
            self.node, self.addr, self.pid
        )
    }
}

/// This worker's place in a completed round.
#[pyclass(module = "rdzv._rdzv", frozen, get_all)]
pub(crate) struct Round {
    /// The run.
    run_id: String,
    /// The round's number.
    version: u64,
    /// This worker's rank.
    rank: usize,
    /// The number of members.
    world_size: usize,
    /// The members in rank order.
    participants: Vec<Participant>,
    /// Rank 0's address.
    master_addr: String,
    /// A port that was free on rank 0's machine.
    master_port: u16,
    /// The round compared with in `previous_rank`, `left` and `joined`: the last round this
    /// worker was a member of, or else the last running round it waited on (`None`: its
    /// first round).
    previous_version: Option<u64>,
    /// This worker's rank in that round (`None`: it was not a member of it).
    previous_rank: Option<usize>,
    /// Ranks of that round whose members are not in this one, ascending.
    left: Vec<usize>,
    /// Ranks of this round whose members were not in that one, ascending.
    joined: Vec<usize>,
    /// The round's Store.
    store: Py<Store>,
}

impl Round {
    pub(crate) fn new(py: Python<'_>, round: rdzv::Round) -> PyResult<Round> {
        Ok(Round {
            run_id: round.info.run_id,
            version: round.info.version,
            rank: round.info.rank,
            world_size: round.info.world_size,
            participants: round
                .info
                .participants
                .iter()
                .map(|p| Participant {
                    node: p.node.clone(),
                    addr: p.addr.clone(),
                    pid: p.pid,
                    port: p.port,
                    segment: p.segment.clone(),
                })
                .collect(),
            master_addr: round.bootstrap.master_addr,
            master_port: round.bootstrap.master_port,
            previous_version: round.info.changes.previous_version,
            previous_rank: round.info.changes.previous_rank,
            left: round.info.changes.left.to_vec(),
            joined: round.info.changes.joined.to_vec(),
            store: Py::new(py, Store::new(round.store))?,
        })
    }
}

#[pymethods]
impl Round {
    fn __repr__(&self) -> String {
        format!(
            "Round(run_id={:?}, version={}, rank={}, world_size={}, master_addr={:?}, master_port={}, previous_rank={})",
            self.run_id,
            self.version,
            self.rank,
            self.world_size,
            self.master_addr,
            self.master_port,
            self.previous_rank.map_or_else(|| "None".to_string(), |r| r.to_string())
        )
    }
}
