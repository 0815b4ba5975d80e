//! `rdzv run` under Slurm: the defaults a node takes from the job step it runs in
//! (docs/SLURM.md). Each is a default only: `--node-id`, `--local-addr` and the URL's
//! `rank_order` and `node_index` replace them.

use std::time::Duration;

use rdzv::RendezvousParams;
use rdzv_core::Participant;
use rdzv_core::params::RankOrder;
use tokio::process::Command;

/// How long one `scontrol` call may take: it asks slurmctld, which a large job's start keeps
/// busy.
const SCONTROL_TIMEOUT: Duration = Duration::from_secs(20);

/// The Slurm job step this process runs in, as its environment says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlurmStep {
    /// `SLURMD_NODENAME`: the node's name in Slurm.
    pub node: String,
    /// `SLURM_JOB_ID`.
    pub job: String,
    /// `SLURM_STEP_ID`; `batch` in the batch script itself.
    pub step: String,
    /// `SLURM_RESTART_COUNT`: how many times the job was requeued (0 when unset).
    pub restarts: u32,
    /// `SLURM_JOB_NODELIST`: the job's nodes, as a host list (`n[1-4]`).
    pub node_list: String,
}

impl SlurmStep {
    /// The step, from the environment variables `var` reads; `None` outside Slurm (no
    /// `SLURM_JOB_ID` or no `SLURMD_NODENAME`, both set by slurmd for every task).
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Option<SlurmStep> {
        let set = |name: &str| var(name).filter(|v| !v.is_empty());
        Some(SlurmStep {
            node: set("SLURMD_NODENAME")?,
            job: set("SLURM_JOB_ID")?,
            step: set("SLURM_STEP_ID").unwrap_or_else(|| "batch".into()),
            restarts: set("SLURM_RESTART_COUNT").and_then(|v| v.parse().ok()).unwrap_or(0),
            node_list: set("SLURM_JOB_NODELIST").unwrap_or_default(),
        })
    }

    /// The default node id: `<node>-<job>.<step>`, and `-r<N>` after the job's N-th requeue.
    /// An agent restarted within its step keeps its id (its node's place in the run); the
    /// same node in a requeued job is a new node.
    pub fn node_id(&self) -> String {
        let id = format!("{}-{}.{}", self.node, self.job, self.step);
        if self.restarts == 0 { id } else { format!("{id}-r{}", self.restarts) }
    }

    /// The node's address as Slurm knows it (`NodeAddr` of `scontrol show node`).
    pub async fn address(&self) -> Result<String, String> {
        let shown = scontrol(&["show", "node", "--oneliner", &self.node]).await?;
        node_addr(&shown).ok_or_else(|| format!("`scontrol show node {}` gives no NodeAddr", self.node))
    }

    /// The node's place in the job's node list (`scontrol show hostnames`, Slurm's order of
    /// the job's nodes): what `rank_order=slurm` orders by. Not `SLURM_NODEID`, which counts
    /// within the step, so that it is 0 on every node when each node runs a step of its own.
    pub async fn node_index(&self) -> Result<u64, String> {
        if self.node_list.is_empty() {
            return Err("SLURM_JOB_NODELIST is not set".into());
        }
        let names = scontrol(&["show", "hostnames", &self.node_list]).await?;
        let place = names.lines().position(|name| name.trim() == self.node);
        place
            .map(|i| i as u64)
            .ok_or_else(|| format!("{} is not in SLURM_JOB_NODELIST ({})", self.node, self.node_list))
    }

    /// What the agent says it took from this step, once its worker `me` exists with `params`.
    pub fn taken(&self, params: &RendezvousParams, me: &Participant) -> String {
        let index = params.node_index.map_or("none".into(), |i| i.to_string());
        format!(
            "under Slurm (job {}, step {}, node {}): node id {}, address {}, node index {index}, rank_order={}",
            self.job,
            self.step,
            self.node,
            me.node,
            me.addr,
            params.rank_order.as_str()
        )
    }

    /// Whether Slurm signals every process of a step (`scancel --signal`, `--signal`, srun
    /// passing a signal on), the workers in their own process groups too: so with every
    /// `ProctrackType` but `proctrack/pgid`, which signals the agent's process group only.
    pub async fn signals_every_process(&self) -> Result<bool, String> {
        let config = scontrol(&["show", "config"]).await?;
        let tracking = proctrack_type(&config).ok_or("`scontrol show config` gives no ProctrackType")?;
        Ok(tracking != "proctrack/pgid")
    }
}

/// The value of `ProctrackType` in `scontrol show config`'s output (`Name = value` lines).
fn proctrack_type(config: &str) -> Option<&str> {
    config.lines().find_map(|line| {
        let (name, value) = line.split_once('=')?;
        (name.trim() == "ProctrackType").then(|| value.trim())
    })
}

/// What a node takes from Slurm, each where the command line and the URL say nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Defaults {
    /// See [`SlurmStep::node_id`].
    pub node_id: Option<String>,
    /// See [`SlurmStep::address`].
    pub local_addr: Option<String>,
    /// See [`SlurmStep::node_index`].
    pub node_index: Option<u64>,
    /// See [`SlurmStep::signals_every_process`].
    pub notices_reach_workers: bool,
}

impl Defaults {
    /// The defaults of the step `step` (none outside Slurm), asking `scontrol` only for what
    /// `given_addr` leaves open. What cannot be found is said on stderr and left to rdzv's
    /// own default.
    pub async fn of(step: Option<&SlurmStep>, given_addr: bool) -> Defaults {
        let Some(step) = step else { return Defaults::default() };
        // Asked together: two of them wait on slurmctld, which a large job's start keeps busy.
        let address = async {
            match given_addr {
                true => Ok(None),
                false => step.address().await.map(Some),
            }
        };
        let (address, index, tracking) =
            tokio::join!(address, step.node_index(), step.signals_every_process());
        let local_addr = address
            .map_err(|e| eprintln!("rdzv: under Slurm, no node address: {e}; advertising the host name"))
            .ok()
            .flatten();
        let node_index = index
            .map_err(|e| {
                eprintln!("rdzv: under Slurm, no node index: {e}; rank_order=slurm falls back to arrival")
            })
            .ok();
        let notices_reach_workers = tracking
            .map_err(|e| {
                eprintln!("rdzv: under Slurm, its process tracking is unknown: {e}; SIGUSR1 and SIGUSR2 are passed on")
            })
            .unwrap_or(false);
        Defaults { node_id: Some(step.node_id()), local_addr, node_index, notices_reach_workers }
    }

    /// Fills in what `params` (the URL's options with the flags over them) leaves open: the
    /// node id, the address, the node index, and `rank_order=slurm` unless the URL names an
    /// order (`url_orders`) or the node a segment. Nothing outside Slurm.
    pub fn fill(&self, params: &mut RendezvousParams, url_orders: bool) {
        if self.node_id.is_none() {
            return;
        }
        params.node_id = params.node_id.take().or_else(|| self.node_id.clone());
        params.local_addr = params.local_addr.take().or_else(|| self.local_addr.clone());
        params.node_index = params.node_index.or(self.node_index);
        if !url_orders && params.segment.is_none() {
            params.rank_order = RankOrder::Slurm;
        }
    }
}

/// The value of `NodeAddr=` in `scontrol show node --oneliner`'s output.
fn node_addr(shown: &str) -> Option<String> {
    let addr = shown.split_whitespace().find_map(|field| field.strip_prefix("NodeAddr="))?;
    (!addr.is_empty() && addr != "(null)").then(|| addr.to_string())
}

/// Runs `scontrol ARGS` and returns its standard output.
async fn scontrol(args: &[&str]) -> Result<String, String> {
    let shown = format!("scontrol {}", args.join(" "));
    let run = Command::new("scontrol").args(args).kill_on_drop(true).output();
    let output = tokio::time::timeout(SCONTROL_TIMEOUT, run)
        .await
        .map_err(|_| format!("`{shown}` did not answer within {SCONTROL_TIMEOUT:?}"))?
        .map_err(|e| format!("cannot run `{shown}`: {e}"))?;
    if !output.status.success() {
        let said = String::from_utf8_lossy(&output.stderr);
        return Err(format!("`{shown}` failed ({}): {}", output.status, said.trim()));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn a_step_is_found_from_slurmds_variables_only() {
        assert_eq!(SlurmStep::from_env(env(&[])), None);
        assert_eq!(SlurmStep::from_env(env(&[("SLURM_JOB_ID", "42")])), None);
        assert_eq!(SlurmStep::from_env(env(&[("SLURM_JOB_ID", "42"), ("SLURMD_NODENAME", "")])), None);
        let step = SlurmStep::from_env(env(&[
            ("SLURM_JOB_ID", "42"),
            ("SLURMD_NODENAME", "gpu07"),
            ("SLURM_STEP_ID", "3"),
            ("SLURM_JOB_NODELIST", "gpu[01-08]"),
        ]))
        .expect("a step");
        assert_eq!(step.node_id(), "gpu07-42.3");
        assert_eq!(step.node_list, "gpu[01-08]");
    }

    #[test]
    fn the_batch_script_and_a_requeued_job_have_ids_of_their_own() {
        let batch =
            SlurmStep::from_env(env(&[("SLURM_JOB_ID", "42"), ("SLURMD_NODENAME", "n1")])).expect("batch");
        assert_eq!(batch.node_id(), "n1-42.batch");
        let requeued = SlurmStep::from_env(env(&[
            ("SLURM_JOB_ID", "42"),
            ("SLURMD_NODENAME", "n1"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_RESTART_COUNT", "2"),
        ]))
        .expect("requeued");
        assert_eq!(requeued.node_id(), "n1-42.0-r2");
        assert!(rdzv_core::ids::validate_id("node_id", &requeued.node_id()).is_ok());
    }

    #[test]
    fn slurms_defaults_fill_only_what_the_url_and_flags_leave_open() {
        let slurm = Defaults {
            node_id: Some("n2-42.0".into()),
            local_addr: Some("10.1.0.2".into()),
            node_index: Some(1),
            notices_reach_workers: true,
        };
        let mut params = RendezvousParams::new("job", 2, 2).expect("params");
        slurm.fill(&mut params, false);
        assert_eq!(params.node_id.as_deref(), Some("n2-42.0"));
        assert_eq!(params.local_addr.as_deref(), Some("10.1.0.2"));
        assert_eq!((params.node_index, params.rank_order), (Some(1), RankOrder::Slurm));
        // The URL's own values stay; an order it names, or a segment, keeps its order.
        let mut given = RendezvousParams::new("job", 2, 2).expect("params");
        given.node_id = Some("mine".into());
        given.node_index = Some(7);
        given.segment = Some("rack1".into());
        slurm.fill(&mut given, false);
        assert_eq!((given.node_id.as_deref(), given.node_index), (Some("mine"), Some(7)));
        assert_eq!(given.rank_order, RankOrder::Segment);
        let mut ordered = RendezvousParams::new("job", 2, 2).expect("params");
        ordered.rank_order = RankOrder::Natural;
        slurm.fill(&mut ordered, true);
        assert_eq!(ordered.rank_order, RankOrder::Natural);
        // Outside Slurm nothing changes.
        let mut outside = RendezvousParams::new("job", 2, 2).expect("params");
        Defaults::default().fill(&mut outside, false);
        assert_eq!(outside, RendezvousParams::new("job", 2, 2).expect("params"));
    }

    #[test]
    fn the_process_tracking_is_read_from_scontrols_config() {
        let config = "Configuration data as of 2026-12-05T15:25:00\nPrologFlags             = (null)\nProctrackType           = proctrack/cgroup\nPropagatePrioProcess    = 0\n";
        assert_eq!(proctrack_type(config), Some("proctrack/cgroup"));
        assert_eq!(proctrack_type("ProctrackType = proctrack/pgid"), Some("proctrack/pgid"));
        assert_eq!(proctrack_type("SlurmUser = root"), None);
    }

    #[test]
    fn the_node_address_is_read_from_scontrols_line() {
        let line =
            "NodeName=n2 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.1.0.2 NodeHostName=n2 Version=22.05.8";
        assert_eq!(node_addr(line).as_deref(), Some("10.1.0.2"));
        assert_eq!(node_addr("NodeName=n2 NodeAddr=(null)"), None);
        assert_eq!(node_addr("NodeName=n2"), None);
    }
}
