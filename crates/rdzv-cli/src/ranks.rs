//! Global ranks for the local workers of `rdzv run`, by torchrun's rules: the agents are the
//! rendezvous members (their rank is the *group rank*); each publishes its role and local
//! world size in the round's Store (one write), reads everyone's, and numbers its workers
//! after those of the agents before it in group-rank order, so nodes with different numbers
//! of workers fit together.

use std::time::Duration;

use rdzv::Store;
use serde_json::json;

/// Store key prefix (in the round's Store) of each agent's role and local world size.
const ROLE_INFO_PREFIX: &str = "rdzv_run/role_info/";

/// The most workers one agent starts (a guard against typos such as `--nproc-per-node 80000`).
pub const MAX_NPROC: usize = 4096;

/// What an agent publishes about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoleInfo {
    /// Its workers' role (`ROLE_NAME`).
    pub role: String,
    /// How many workers it starts.
    pub local_world_size: usize,
}

/// Where one agent's workers sit among all workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Assignment {
    /// The global rank of its local rank 0 (`RANK = base_rank + LOCAL_RANK`).
    pub base_rank: usize,
    /// All workers of all agents (`WORLD_SIZE`).
    pub world_size: usize,
    /// The role rank of its local rank 0 (`ROLE_RANK = base_role_rank + LOCAL_RANK`).
    pub base_role_rank: usize,
    /// All workers of its role (`ROLE_WORLD_SIZE`).
    pub role_world_size: usize,
}

/// The assignment of the agent of group rank `group_rank`, given every agent's info in
/// group-rank order (`None` if `group_rank` is out of range).
pub fn assign(infos: &[RoleInfo], group_rank: usize) -> Option<Assignment> {
    let me = infos.get(group_rank)?;
    let before = &infos[..group_rank];
    let same_role = |i: &&RoleInfo| i.role == me.role;
    Some(Assignment {
        base_rank: before.iter().map(|i| i.local_world_size).sum(),
        world_size: infos.iter().map(|i| i.local_world_size).sum(),
        base_role_rank: before.iter().filter(same_role).map(|i| i.local_world_size).sum(),
        role_world_size: infos.iter().filter(same_role).map(|i| i.local_world_size).sum(),
    })
}

/// Publishes `me` as group rank `group_rank` and waits (at most `timeout`) for the infos of
/// all `group_world_size` agents. Errors say what went wrong, in one line.
pub async fn exchange(
    store: &Store,
    group_rank: usize,
    group_world_size: usize,
    me: &RoleInfo,
    timeout: Duration,
) -> Result<Vec<RoleInfo>, String> {
    let value = json!({"role": me.role, "local_world_size": me.local_world_size}).to_string();
    store
        .set(format!("{ROLE_INFO_PREFIX}{group_rank}"), value)
        .await
        .map_err(|e| format!("publishing this node's number of workers: {e}"))?;
    let keys: Vec<String> = (0..group_world_size).map(|r| format!("{ROLE_INFO_PREFIX}{r}")).collect();
    let values = store
        .clone()
        .with_timeout(timeout)
        .multi_get(&keys)
        .await
        .map_err(|e| format!("reading the other nodes' numbers of workers: {e}"))?;
    values.iter().enumerate().map(|(rank, v)| parse_info(v).ok_or_else(|| bad_info(rank, v))).collect()
}

fn parse_info(value: &[u8]) -> Option<RoleInfo> {
    let v: serde_json::Value = serde_json::from_slice(value).ok()?;
    let local_world_size = usize::try_from(v.get("local_world_size")?.as_u64()?).ok()?;
    if local_world_size == 0 || local_world_size > MAX_NPROC {
        return None;
    }
    Some(RoleInfo { role: v.get("role")?.as_str()?.to_string(), local_world_size })
}

fn bad_info(rank: usize, value: &[u8]) -> String {
    format!(
        "node {rank} published an unreadable number of workers ({}); is it running another version of rdzv?",
        String::from_utf8_lossy(value)
    )
}

/// `--nproc-per-node`: a count, or `auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NProc {
    /// This many workers.
    Count(usize),
    /// One per visible GPU, else one per CPU (see [`detect`]).
    Auto,
}

/// Parses `--nproc-per-node`: `auto` or 1 to [`MAX_NPROC`].
pub fn parse_nproc(value: &str) -> Result<NProc, String> {
    if value.eq_ignore_ascii_case("auto") {
        return Ok(NProc::Auto);
    }
    match value.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_NPROC).contains(&n) => Ok(NProc::Count(n)),
        Ok(_) => Err(format!("must be between 1 and {MAX_NPROC}, or `auto`")),
        Err(_) => Err("must be a number of workers, or `auto`".into()),
    }
}

/// The number of workers for `auto`, and where it comes from: the entries of
/// `CUDA_VISIBLE_DEVICES` when it is set (none visible: the CPUs), else the GPUs that
/// `nvidia-smi -L` lists when that program runs and lists any, else the number of CPUs.
pub fn detect() -> (usize, &'static str) {
    if let Some(visible) = std::env::var_os("CUDA_VISIBLE_DEVICES") {
        let n = count_visible(&visible.to_string_lossy());
        if n > 0 {
            return (n.min(MAX_NPROC), "CUDA_VISIBLE_DEVICES");
        }
        return (cpus(), "the number of CPUs (CUDA_VISIBLE_DEVICES hides every GPU)");
    }
    if let Some(n) = nvidia_smi_gpus() {
        return (n.min(MAX_NPROC), "nvidia-smi -L");
    }
    (cpus(), "the number of CPUs (no GPU found)")
}

/// Entries of a `CUDA_VISIBLE_DEVICES` value. CUDA stops at the first invalid entry, and
/// `-1` (or any negative index) is the usual way to hide every device.
fn count_visible(value: &str) -> usize {
    value
        .split(',')
        .map(str::trim)
        .take_while(|e| !e.is_empty() && !e.starts_with('-') && !e.eq_ignore_ascii_case("NoDevFiles"))
        .count()
}

fn nvidia_smi_gpus() -> Option<usize> {
    let out = std::process::Command::new("nvidia-smi")
        .arg("-L")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let n = count_gpu_lines(&String::from_utf8_lossy(&out.stdout));
    (n > 0).then_some(n)
}

/// `nvidia-smi -L` prints one `GPU <i>: <name> (UUID: …)` line per GPU (and indented MIG
/// lines under them, which are not separate GPUs here).
fn count_gpu_lines(text: &str) -> usize {
    text.lines().filter(|l| l.starts_with("GPU ")).count()
}

fn cpus() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(MAX_NPROC)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(role: &str, n: usize) -> RoleInfo {
        RoleInfo { role: role.into(), local_world_size: n }
    }

    #[test]
    fn ranks_follow_the_local_world_sizes_in_group_rank_order() {
        let infos = [info("default", 2), info("default", 3), info("default", 1)];
        let a: Vec<Assignment> = (0..3).map(|g| assign(&infos, g).expect("in range")).collect();
        assert_eq!(a.iter().map(|a| a.base_rank).collect::<Vec<_>>(), [0, 2, 5]);
        assert!(a.iter().all(|a| a.world_size == 6 && a.role_world_size == 6));
        assert_eq!(a[1].base_role_rank, 2);
        assert_eq!(assign(&infos, 3), None);
    }

    #[test]
    fn role_ranks_count_only_the_same_role() {
        let infos = [info("trainer", 2), info("reader", 4), info("trainer", 2)];
        let last = assign(&infos, 2).expect("in range");
        assert_eq!((last.base_rank, last.world_size), (6, 8));
        assert_eq!((last.base_role_rank, last.role_world_size), (2, 4));
        let reader = assign(&infos, 1).expect("in range");
        assert_eq!((reader.base_role_rank, reader.role_world_size), (0, 4));
    }

    #[test]
    fn infos_round_trip_and_bad_ones_are_refused() {
        let v = json!({"role": "default", "local_world_size": 8}).to_string();
        assert_eq!(parse_info(v.as_bytes()), Some(info("default", 8)));
        assert_eq!(parse_info(b"{\"role\":\"x\",\"local_world_size\":0}"), None);
        assert_eq!(parse_info(b"8"), None);
        assert!(bad_info(1, b"8").contains("node 1"));
    }

    #[test]
    fn nproc_values() {
        assert_eq!(parse_nproc("4"), Ok(NProc::Count(4)));
        assert_eq!(parse_nproc("auto"), Ok(NProc::Auto));
        assert!(parse_nproc("0").is_err());
        assert!(parse_nproc("100000").is_err());
        assert!(parse_nproc("four").is_err());
    }

    #[test]
    fn visible_devices_and_gpu_lines_are_counted() {
        assert_eq!(count_visible("0,1,2,3"), 4);
        assert_eq!(count_visible("GPU-5c3a,GPU-77b1"), 2);
        assert_eq!(count_visible(""), 0);
        assert_eq!(count_visible("-1"), 0);
        assert_eq!(count_visible("0,1,-1,3"), 2);
        let smi = "GPU 0: NVIDIA A100 (UUID: GPU-1)\n  MIG 1g.5gb Device 0: (UUID: MIG-1)\nGPU 1: NVIDIA A100 (UUID: GPU-2)\n";
        assert_eq!(count_gpu_lines(smi), 2);
        assert!(cpus() >= 1);
    }
}
