"""How a job ends, through both launchers (torchrun with ``--rdzv-backend=rdzv``, and ``rdzv
run``), with real torch (gloo on CPU) on a real etcd: the run's outcome, the spares' exit, the
restarts, and the end of every agent. torchrun's side depends on the torch release (see the
backend's docs, ``rdzv.torch_backend``): ``scripts/test-python.sh`` runs this file on the
oldest release supported (2.6, the first that loads the ``torchrun.handlers`` entry point) as
well as on the pinned one.

- A worker fails with no restarts left: every member exits non-zero, the spare 0, and the run
  is closed as ``failed`` (under torch 2.6 it was closed as ``succeeded``: the agent's own
  ``_shutdown`` called the handler's ``shutdown()`` with nothing in flight first).
- A worker fails once with a restart left: the group re-forms and finishes; every agent exits
  0 and the run is closed as ``succeeded``.
- A slower node's workers go on after a faster node's agent gave up waiting for them and
  closed the run as succeeded: they finish, not killed (torch's exit barrier gives up after
  its timeout, 300 s by default, lowered here by ``torchrun_exit_barrier.py``).

The worker is ``lifecycle.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_rdzv_run import rdzv_binary
from test_torchrun import exits, wait_for

HERE = Path(__file__).parent
SCRIPT = str(HERE / "lifecycle.py")
LAUNCHERS = ["torchrun", "rdzv-run"]
TTL = 3


def url(etcd: str, run_id: str, nnodes: int) -> str:
    return (
        f"etcd://{etcd}/{run_id}?min_workers={nnodes}&max_workers={nnodes}"
        f"&keep_alive_ttl={TTL}s&last_call_timeout=2s&timeout=90s"
    )


def agent(
    launcher: str, etcd: str, run_id: str, nnodes: int, name: str, tmp_path: Path, max_restarts: int, **env: str
) -> subprocess.Popen:
    """Starts agent `name` in a session of its own (so that it dies with its workers); `env`
    goes to it and its workers (see lifecycle.py). With EXIT_BARRIER_TIMEOUT in `env`, torchrun
    runs through torchrun_exit_barrier.py."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    full_env = dict(
        os.environ, OUT_DIR=str(out), AGENT_NAME=name, GLOO_SOCKET_IFNAME="lo", LOGLEVEL="INFO", **env
    )
    if launcher == "torchrun":
        torchrun = [str(HERE / "torchrun_exit_barrier.py")] if "EXIT_BARRIER_TIMEOUT" in env else ["-m", "torch.distributed.run"]
        cmd = [
            sys.executable, *torchrun,
            f"--nnodes={nnodes}", "--nproc-per-node=1",
            "--rdzv-backend=rdzv", f"--rdzv-endpoint=etcd://{etcd}", f"--rdzv-id={run_id}",
            f"--rdzv-conf=last_call_timeout=2,keep_alive_ttl={TTL},join_timeout=90", "--local-addr=127.0.0.1",
            "--monitor-interval=0.5", f"--max-restarts={max_restarts}", f"--log-dir={tmp_path / 'torchelastic'}",
            SCRIPT,
        ]  # fmt: skip
    else:
        cmd = [
            rdzv_binary(), "run", url(etcd, run_id, nnodes), "--nproc-per-node", "1", "--local-addr", "127.0.0.1",
            "--monitor-interval", "0.5s", "--grace-period", "2s", "--max-restarts", str(max_restarts),
            "--", sys.executable, SCRIPT,
        ]  # fmt: skip
    with open(tmp_path / f"{name}.log", "wb") as f:
        return subprocess.Popen(cmd, env=full_env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def starts(tmp_path: Path) -> list[dict]:
    path = tmp_path / "out" / "starts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def ended(procs: dict[str, subprocess.Popen], tmp_path: Path) -> dict[str, tuple[int, float]]:
    """Every agent's exit code and when it exited, each within 90 s."""
    return exits(procs, {name: tmp_path / f"{name}.log" for name in procs}, timeout=90)


def all_exit_0(procs: dict[str, subprocess.Popen], tmp_path: Path) -> None:
    for name, (code, _) in ended(procs, tmp_path).items():
        assert code == 0, f"{name} exited with {code}:\n{log(tmp_path, name)}"


def log(tmp_path: Path, name: str) -> str:
    return (tmp_path / f"{name}.log").read_text()[-4000:]


def outcome(etcd: str, run_id: str) -> str | None:
    """The run's outcome, as `rdzv status` shows it."""
    shown = subprocess.run(
        [rdzv_binary(), "status", f"etcd://{etcd}/{run_id}", "--format", "json"],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    return json.loads(shown.stdout)["outcome"]


def members_and_spare(
    launcher: str, etcd: str, run_id: str, tmp_path: Path, max_restarts: int, **env: str
) -> dict[str, subprocess.Popen]:
    """a0 and a1 form a world of 2 (two nodes), then a spare arrives."""
    procs = {n: agent(launcher, etcd, run_id, 2, n, tmp_path, max_restarts, **env) for n in ("a0", "a1")}
    wait_for(lambda: len(starts(tmp_path)) >= 2, "a world of 2", list(procs.values()))
    procs["spare"] = agent(launcher, etcd, run_id, 2, "spare", tmp_path, max_restarts, **env)
    return procs


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_worker_failing_with_no_restarts_left_closes_the_run_as_failed(
    launcher: str, etcd: str, run_id: str, tmp_path: Path
) -> None:
    procs = members_and_spare(launcher, etcd, run_id, tmp_path, 0, FAIL_AGENT="a0", STEPS="40")
    when = ended(procs, tmp_path)
    codes = {name: code for name, (code, _) in when.items()}
    assert codes["a0"] == 1, f"a0 exited with {codes['a0']}:\n{log(tmp_path, 'a0')}"
    assert codes["a1"] != 0, f"a1 exited 0:\n{log(tmp_path, 'a1')}"
    assert codes["spare"] == 0, f"the spare exited with {codes['spare']}:\n{log(tmp_path, 'spare')}"
    assert outcome(etcd, run_id) == "failed"
    last_member = max(when["a0"][1], when["a1"][1])
    assert when["spare"][1] - last_member < 15, "the spare outlived the job"
    assert {s["agent"] for s in starts(tmp_path)} == {"a0", "a1"}, f"the failed job re-formed: {starts(tmp_path)}"


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_worker_failing_once_with_a_restart_left_finishes_and_succeeds(
    launcher: str, etcd: str, run_id: str, tmp_path: Path
) -> None:
    procs = members_and_spare(launcher, etcd, run_id, tmp_path, 1, FAIL_AGENT="a0", STEPS="15")
    all_exit_0(procs, tmp_path)
    assert outcome(etcd, run_id) == "succeeded"
    worlds = {s["master"] for s in starts(tmp_path)}
    assert len(worlds) >= 2, f"the group did not re-form after the failure: {starts(tmp_path)}"
    assert max(s["restart"] for s in starts(tmp_path)) >= 1, f"no restart counted: {starts(tmp_path)}"


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_slower_nodes_workers_finish_after_a_faster_node_closed_the_run(
    launcher: str, etcd: str, run_id: str, tmp_path: Path
) -> None:
    exit_barrier = 5
    env = {"SLOW_AGENT": "a1", "SLOW_SECONDS": str(exit_barrier + 10), "EXIT_BARRIER_TIMEOUT": str(exit_barrier)}
    procs = {n: agent(launcher, etcd, run_id, 2, n, tmp_path, 3, **env) for n in ("a0", "a1")}
    all_exit_0(procs, tmp_path)
    assert (tmp_path / "out" / "slow.done").exists(), f"the slow node's worker was stopped:\n{log(tmp_path, 'a1')}"
    assert len(starts(tmp_path)) == 2, f"the group re-formed: {starts(tmp_path)}"
    assert outcome(etcd, run_id) == "succeeded"
