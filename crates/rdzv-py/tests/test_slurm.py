"""`rdzv run` under a real Slurm (munged, slurmctld and three slurmd on this host: the `slurm`
fixture), with real torch (CPU, gloo):

- docs/SLURM.md's job script, as it stands there: etcd started by the job on its first node,
  one agent per node by one `srun`, min = max = 2 nodes of 3 (one spare). It trains and every
  agent exits 0; the agents take their node ids, addresses and rank order from Slurm.
- `scancel JOB.STEP` of one member's agent (one step per node): Slurm kills the step at once,
  the spare takes its group rank when the member's lease expires, and the job finishes; with
  `scancel --signal=TERM JOB.STEP` the agent leaves, and the spare takes the place at once.
- `scancel JOB` (as a time limit or a preemption): every agent stops its workers and leaves
  on the SIGTERM, before Slurm's SIGKILL.
- `scancel --signal=USR1` of a step, as Slurm's `--signal` sends it: each worker gets it once,
  from Slurm itself where its process tracking signals every process of the step
  (`linuxproc`, like `cgroup`), passed on by the agent where it signals the task's process
  group only (`pgid`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

from slurm_cluster import SlurmCluster, consecutive_free_ports
from test_rdzv_run import rdzv_binary
from test_torchrun import TRAIN

REPO = Path(__file__).resolve().parents[3]
SLURM_MD = REPO / "docs" / "SLURM.md"


def documented_script() -> str:
    """The job script between docs/SLURM.md's `slurm.sbatch` markers, without its fence."""
    text = SLURM_MD.read_text()
    block = re.search(r"<!-- slurm\.sbatch: begin -->\n```bash\n(.*?)```\n<!-- slurm\.sbatch: end -->", text, re.S)
    assert block, "docs/SLURM.md lost its job script's markers"
    return block.group(1)


def job_env(slurm: SlurmCluster, out: Path, **extra: str) -> dict[str, str]:
    """What the job inherits: the cluster's environment with rdzv and this Python first on
    PATH, and train.py's settings."""
    path = os.pathsep.join([str(Path(rdzv_binary()).parent), str(Path(sys.executable).parent), slurm.env["PATH"]])
    return dict(slurm.env, PATH=path, OUT_DIR=str(out), GLOO_SOCKET_IFNAME="lo", AGENT_NAME="slurm", **extra)


def starts(out: Path) -> list[dict]:
    path = out / "starts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_until(predicate, what: str, slurm: SlurmCluster, job: str, timeout: float = 120) -> None:
    """Waits for `predicate`; on timeout cancels the job and fails with the daemons' logs."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            state = slurm.job_state(job)
            slurm.scancel(job)
            raise AssertionError(f"timed out waiting for {what} (job {job}: {state})\n{slurm.logs_tail()}")
        time.sleep(0.2)


def logs(out: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()}" for p in sorted(out.glob("*.log")))


def test_the_documented_job_trains_with_a_spare_and_every_agent_exits_0(slurm: SlurmCluster, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "train.sbatch"
    script.write_text(documented_script())
    env = job_env(slurm, out, NODES="2", NPROC="1", ETCD_PORT=str(consecutive_free_ports(2)[0]), TRAIN=TRAIN, TARGET_WORLD="2")
    job = slurm.sbatch(script, "--nodes=3", f"--output={out}/job.log", env=env)
    state = slurm.wait_job(job, timeout=240)
    said = logs(out)
    assert state == ("COMPLETED", "0:0"), said
    # Two of the three trained; the spare never started a worker.
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world"] for r in results] == [2, 2] and results[0]["sum"] == 3, said
    worlds = starts(out)
    assert len(worlds) == 2 and all(w["world"] == 2 and w["restart"] == 0 for w in worlds), worlds
    # Node ids from Slurm (NODE-JOB.STEP: the agents' srun is the job's second step, after
    # etcd's), group ranks in Slurm's node order, the master at the node's NodeAddr.
    members = sorted(worlds, key=lambda w: w["group_rank"])
    nodes = [re.fullmatch(rf"(n\d)-{job}\.1", w["node_id"]) for w in members]
    assert all(nodes), members
    assert [m.group(1) for m in nodes] == sorted(m.group(1) for m in nodes), members
    assert {w["master"].split(":")[0] for w in worlds} == {"127.0.0.1"}, worlds
    assert said.count("under Slurm (job") == 3 and "rank_order=slurm" in said, said


AGENT_PER_STEP = """#!/bin/bash
# One agent per node, each a step of its own so that one can be cancelled alone.
for i in 0 1 2; do
    srun --nodes=1 --ntasks=1 --relative=$i --output="$OUT_DIR/agent$i.log" \\
        rdzv run "$URL" --monitor-interval 1s --grace-period 5s -- python "$TRAIN" &
    pids[$i]=$!
done
for i in 0 1 2; do
    rc=0
    wait "${pids[$i]}" || rc=$?
    echo "$rc" > "$OUT_DIR/agent$i.rc"
done
"""


def agents_per_step(slurm: SlurmCluster, etcd: str, run_id: str, tmp_path: Path, ttl: int) -> tuple[Path, Path, str]:
    """Submits AGENT_PER_STEP (min = max = 2 nodes of 3, keep_alive_ttl `ttl` seconds) with
    the workers held by a hold file, and waits for the first world of 2. Returns the output
    folder, the hold file and the job id."""
    out, hold = tmp_path / "out", tmp_path / "hold"
    out.mkdir()
    hold.touch()
    script = tmp_path / "agents.sbatch"
    script.write_text(AGENT_PER_STEP)
    url = f"etcd://{etcd}/{run_id}?min_workers=2&max_workers=2&keep_alive_ttl={ttl}s&last_call_timeout=1s"
    env = job_env(slurm, out, URL=url, TRAIN=TRAIN, TARGET_WORLD="2", HOLD_FILE=str(hold))
    job = slurm.sbatch(script, "--nodes=3", f"--output={out}/job.log", env=env)
    wait_until(lambda: len(starts(out)) >= 2, "the first world of 2", slurm, job)
    return out, hold, job


def agent_of(node_id: str) -> int:
    """Which AGENT_PER_STEP agent a node id (NODE-JOB.STEP) is: agent<i> ran on n<i+1>."""
    return int(node_id.split("-", 1)[0][1:]) - 1


@pytest.mark.parametrize("how", ["scancel", "scancel --signal=TERM"])
def test_a_cancelled_step_is_replaced_by_the_spare_and_the_job_finishes(
    how: str, slurm: SlurmCluster, etcd: str, run_id: str, tmp_path: Path
) -> None:
    """`scancel JOB.STEP` kills the step at once (SIGKILL: no agent can leave), so the spare
    takes the place once the member's lease expires (`keep_alive_ttl`); with
    `--signal=TERM` the agent stops its workers and leaves, and the spare takes the place at
    once, long before the TTL."""
    graceful = "TERM" in how
    # With a leave, a TTL far longer than the replacement may take: only the leave explains
    # a quick one.
    ttl = 40 if graceful else 5
    out, hold, job = agents_per_step(slurm, etcd, run_id, tmp_path, ttl)
    first = starts(out)[:2]
    leaving = next(w for w in first if w["group_rank"] == 1)
    staying = next(w for w in first if w["group_rank"] == 0)
    step = leaving["node_id"].split("-", 1)[1]  # NODE-JOB.STEP
    cancelled = time.monotonic()
    slurm.scancel(step, signal="TERM" if graceful else None)

    def second_world() -> list[dict]:
        return [w for w in starts(out)[2:] if w["world"] == 2 and w["node_id"] != leaving["node_id"]]

    wait_until(lambda: len(second_world()) >= 2, "the second world, with the spare", slurm, job)
    replaced_after = time.monotonic() - cancelled
    second = second_world()[:2]
    hold.unlink()
    state = slurm.wait_job(job, timeout=120)
    said = logs(out)
    if graceful:
        assert replaced_after < ttl / 2, f"the spare came {replaced_after:.1f} s after scancel (TTL {ttl} s)\n{said}"
    # The survivor keeps its group rank; the spare takes the cancelled member's.
    ranks = {w["node_id"]: w["group_rank"] for w in second}
    assert ranks.get(staying["node_id"]) == 0, (second, said)
    spare = next(node for node in ranks if node != staying["node_id"])
    assert ranks[spare] == 1, (second, said)
    codes = {int(p.stem[len("agent") :]): int(p.read_text()) for p in out.glob("agent*.rc")}
    assert sorted(codes) == [0, 1, 2], (codes, said)
    cancelled_agent = agent_of(leaving["node_id"])
    assert codes[cancelled_agent] != 0, (codes, said)
    assert all(code == 0 for i, code in codes.items() if i != cancelled_agent), (codes, said)
    assert state == ("COMPLETED", "0:0"), (state, said)
    if graceful:
        assert "SIGTERM received and passed on" in (out / f"agent{cancelled_agent}.log").read_text(), said


def test_scancel_of_the_job_stops_every_agent_gracefully(
    slurm: SlurmCluster, etcd: str, run_id: str, tmp_path: Path
) -> None:
    """`scancel JOB` (as a time limit or a preemption) sends SIGTERM to every step, SIGKILL
    `KillWait` (5 s here) later: each agent stops its workers and leaves before that."""
    out, _, job = agents_per_step(slurm, etcd, run_id, tmp_path, ttl=5)
    members = {agent_of(w["node_id"]) for w in starts(out)[:2]}
    slurm.scancel(job)
    state = slurm.wait_job(job, timeout=60)
    said = logs(out)
    assert state[0] == "CANCELLED", (state, said)
    for i in members:
        agent = (out / f"agent{i}.log").read_text()
        assert "SIGTERM received and passed on" in agent, said
    assert "Killed" not in said, said


ONE_AGENT = """#!/bin/bash
srun --nodes=1 --ntasks=1 --output="$OUT_DIR/agent.log" rdzv run "$URL" -- python "$TRAIN"
"""


@pytest.mark.parametrize("proctrack", ["linuxproc", "pgid"])
def test_a_usr1_from_slurm_reaches_each_worker_once(
    proctrack: str, slurm: SlurmCluster, etcd: str, run_id: str, tmp_path: Path
) -> None:
    # A cluster of its own for `pgid`, in a short directory: its sockets' paths are bounded.
    own = None if proctrack == "linuxproc" else Path(tempfile.mkdtemp(prefix="rdzv-slurm-"))
    cluster = slurm if own is None else SlurmCluster.start(own, nodes=1, proctrack=proctrack)
    try:
        out, hold = tmp_path / "out", tmp_path / "hold"
        out.mkdir()
        hold.touch()
        notice = out / "notice"
        script = tmp_path / "agent.sbatch"
        script.write_text(ONE_AGENT)
        url = f"etcd://{etcd}/{run_id}?min_workers=1&max_workers=1"
        env = job_env(cluster, out, URL=url, TRAIN=TRAIN, TARGET_WORLD="1", HOLD_FILE=str(hold), NOTICE_FILE=str(notice))
        job = cluster.sbatch(script, "--nodes=1", f"--output={out}/job.log", env=env)
        wait_until(lambda: len(starts(out)) >= 1, "the worker", cluster, job)
        cluster.scancel(f"{job}.0", signal="USR1")
        got = Path(f"{notice}.0")
        wait_until(lambda: got.exists(), "the worker's notice", cluster, job, timeout=30)
        time.sleep(2)  # a second delivery, were there one, would be in by now
        hold.unlink()
        state = cluster.wait_job(job, timeout=60)
        said = logs(out)
        assert got.read_text().count("SIGUSR1") == 1, (got.read_text(), said)
        agent = (out / "agent.log").read_text()
        if proctrack == "pgid":
            assert "passing SIGUSR1 on to the workers" in agent, said
        else:
            assert "SIGUSR1 reaches the workers from Slurm itself" in agent, said
        assert state == ("COMPLETED", "0:0"), (state, said)
    finally:
        if own is not None:
            cluster.stop()
            shutil.rmtree(own, ignore_errors=True)
