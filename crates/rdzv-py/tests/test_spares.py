"""Spares, stable ranks and a run that ends, with real torch (gloo on CPU) on a real etcd,
through both launchers: torchrun with ``--rdzv-backend=rdzv``, and ``rdzv run``.

- More agents than ``MAX`` nodes: one world trains undisturbed (no re-forming for the spare),
  and every agent, the spare included, exits 0 soon after the job ends.
- A member killed: the spare takes its place and its group rank; the others keep theirs.
- An elastic world that loses a member: the survivors whose group ranks still exist keep them.

Each worker appends a line to ``starts.jsonl`` when it starts (see ``train.py``): which
agent, its group rank and the world's master, from which the worlds are read back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import Link
from test_rdzv_run import rdzv_binary
from test_torchrun import TRAIN, exits, kill_tree, wait_for

LAUNCHERS = ["torchrun", "rdzv-run"]
TTL = 3


def agent(
    launcher: str,
    etcd: str,
    run_id: str,
    nnodes: str,
    name: str,
    out: Path,
    target: int,
    hold: Path,
    log: Path,
    script: str = TRAIN,
    ttl: int = TTL,
    extra_env: dict[str, str] | None = None,
    timeout: int = 90,
    health: dict[str, str] | None = None,
    segment: str | None = None,
    segment_size: int | None = None,
) -> subprocess.Popen:
    """Starts one agent (its etcd at `etcd`, `host:port`) running `script` in a session of its
    own (so that it dies with its workers); `extra_env` goes to the agent and its workers;
    `timeout` is its rendezvous deadline in seconds; `health` its health gate (`check`,
    `interval`, `timeout`, `failures`: seconds and a count), as `--rdzv-conf` keys for
    torchrun and as flags for `rdzv run`; `segment` its segment (``--rdzv-conf segment=`` or
    ``--segment``); `segment_size` whole segments of that many nodes (an option of the
    rendezvous: ``--rdzv-conf segment_size=`` or the URL's ``segment_size=``)."""
    env = dict(
        os.environ,
        OUT_DIR=str(out),
        TARGET_WORLD=str(target),
        HOLD_FILE=str(hold),
        AGENT_NAME=name,
        GLOO_SOCKET_IFNAME="lo",
        LOGLEVEL="INFO",
        **(extra_env or {}),
    )
    lo, _, hi = nnodes.partition(":")
    if launcher == "torchrun":
        cmd = [
            sys.executable, "-m", "torch.distributed.run",
            f"--nnodes={nnodes}", "--nproc-per-node=1",
            "--rdzv-backend=rdzv", f"--rdzv-endpoint=etcd://{etcd}", f"--rdzv-id={run_id}",
            f"--rdzv-conf=last_call_timeout=2,keep_alive_ttl={ttl},join_timeout={timeout}"
            + "".join(f",health_check{'' if k == 'check' else '_' + k}={v}" for k, v in (health or {}).items())
            + (f",segment={segment}" if segment else "")
            + (f",segment_size={segment_size}" if segment_size else ""),
            "--local-addr=127.0.0.1", "--monitor-interval=0.5", "--max-restarts=3",
            f"--log-dir={log.parent / 'torchelastic'}", script,
        ]  # fmt: skip
    else:
        url = (
            f"etcd://{etcd}/{run_id}?min_workers={lo}&max_workers={hi or lo}"
            f"&keep_alive_ttl={ttl}s&last_call_timeout=2s&timeout={timeout}s"
            + (f"&segment_size={segment_size}" if segment_size else "")
        )
        flags = [
            ("--health-check" + ("" if k == "check" else f"-{k}"), v if k in ("check", "failures") else f"{v}s")
            for k, v in (health or {}).items()
        ] + ([("--segment", segment)] if segment else [])
        cmd = [
            rdzv_binary(), "run", url, "--nproc-per-node", "1", "--local-addr", "127.0.0.1",
            "--monitor-interval", "0.5s", "--grace-period", "2s", *[a for f in flags for a in f],
            "--", sys.executable, script,
        ]  # fmt: skip
    with open(log, "wb") as f:
        return subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def worlds(out: Path, size: int) -> list[dict[str, int]]:
    """The complete worlds of `size` members that started, in order: agent name → group rank."""
    path = out / "starts.jsonl"
    if not path.exists():
        return []
    by_master: dict[str, dict[str, int]] = {}
    for line in path.read_text().splitlines():
        start = json.loads(line)
        by_master.setdefault(start["master"], {})[start["agent"]] = start["group_rank"]
    return [w for w in by_master.values() if len(w) == size]


def run_status(etcd: str, run_id: str) -> dict:
    """The run as ``rdzv status --format json`` shows it."""
    url = f"etcd://{etcd}/{run_id}"
    done = subprocess.run([rdzv_binary(), "status", url, "--format", "json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def waiting_nodes(etcd: str, run_id: str) -> list[str]:
    """The node ids waiting for the next round, spares included."""
    status = run_status(etcd, run_id)
    return status["waiting"] + status["spares"]


def starts(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "starts.jsonl").read_text().splitlines()]


def wait_exit(procs: dict[str, subprocess.Popen], logs: dict[str, Path], timeout: float = 120) -> dict[str, float]:
    """Waits for every agent to exit 0; returns when each exited."""
    ended = exits(procs, logs, timeout)
    for name, (code, _) in ended.items():
        assert code == 0, f"{name} exited with {code}:\n{logs[name].read_text()[-4000:]}"
    return {name: when for name, (_, when) in ended.items()}


def start_agents(
    launcher: str, etcd: str, run_id: str, nnodes: str, n: int, target: int, tmp_path: Path
) -> tuple[dict[str, subprocess.Popen], dict[str, Path], Path, Path]:
    out, hold = tmp_path / "out", tmp_path / "hold"
    out.mkdir()
    hold.touch()
    logs = {f"a{i}": tmp_path / f"a{i}.log" for i in range(n)}
    procs = {name: agent(launcher, etcd, run_id, nnodes, name, out, target, hold, log) for name, log in logs.items()}
    return procs, logs, out, hold


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_three_agents_for_a_job_of_two_train_once_and_all_exit_0(
    launcher: str, etcd: str, run_id: str, tmp_path: Path
) -> None:
    procs, logs, out, hold = start_agents(launcher, etcd, run_id, "2", 3, 2, tmp_path)
    wait_for(lambda: len(worlds(out, 2)) >= 1, "a world of 2", list(procs.values()))
    # Ten monitor intervals: agents that re-formed for the spare would start new worlds now.
    time.sleep(5)
    hold.unlink()
    ended = wait_exit(procs, logs)
    assert len(worlds(out, 2)) == 1 and len(starts(out)) == 2, f"the world was re-formed: {starts(out)}"
    (members,) = worlds(out, 2)
    (spare,) = set(procs) - set(members)
    last_member = max(ended[m] for m in members)
    assert ended[spare] - last_member < 15, f"the spare ended {ended[spare] - last_member:.1f} s after the job"


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_spare_takes_a_killed_members_place_and_the_others_keep_their_ranks(
    launcher: str, etcd: str, run_id: str, tmp_path: Path
) -> None:
    procs, logs, out, hold = start_agents(launcher, etcd, run_id, "3", 4, 3, tmp_path)
    wait_for(lambda: len(worlds(out, 3)) >= 1, "a world of 3", list(procs.values()))
    first = worlds(out, 3)[0]
    (spare,) = set(procs) - set(first)
    victim = next(name for name, rank in first.items() if rank == 1)
    killed = time.monotonic()
    kill_tree(procs.pop(victim))
    wait_for(lambda: len(worlds(out, 3)) >= 2, "a world of 3 with the spare", list(procs.values()))
    took = time.monotonic() - killed
    second = worlds(out, 3)[1]
    assert second[spare] == 1, f"the spare did not take group rank 1: {second}"
    assert {n: r for n, r in second.items() if n != spare} == {n: r for n, r in first.items() if n != victim}
    if launcher == "rdzv-run":
        told = {s["agent"]: s["previous_group_rank"] for s in starts(out) if s["master"] != starts(out)[0]["master"]}
        assert told == {n: ("" if n == spare else str(r)) for n, r in second.items()}, told
    hold.unlink()
    wait_exit(procs, {n: logs[n] for n in procs})
    assert took < 30, f"the spare came in {took:.1f} s after the kill"


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_an_elastic_world_that_loses_a_member_keeps_the_ranks_that_still_exist(
    launcher: str, etcd: str, run_id: str, tmp_path: Path
) -> None:
    procs, logs, out, hold = start_agents(launcher, etcd, run_id, "2:3", 3, 2, tmp_path)
    wait_for(lambda: len(worlds(out, 3)) >= 1, "a world of 3", list(procs.values()))
    (first,) = worlds(out, 3)
    victim = next(name for name, rank in first.items() if rank == 1)
    kill_tree(procs.pop(victim))
    hold.unlink()
    wait_exit(procs, {n: logs[n] for n in procs})
    (second,) = worlds(out, 2)
    by_old = {first[n]: r for n, r in second.items()}
    assert by_old == {0: 0, 2: 1}, f"group ranks before → after: {by_old}"


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_spare_cut_off_after_its_timeout_is_still_promoted(
    launcher: str, etcd: str, run_id: str, tmp_path: Path
) -> None:
    """Issue 39, defect 3: a spare that has waited longer than its timeout (8 s), then is cut
    off from etcd (a partition: bytes stop, nothing is reset) for three TTLs, loses its session;
    healed, it starts a new one and waits as a spare again — it does not die of its old
    deadline — and takes the place of a member killed afterwards."""
    timeout, ttl = 8, 2
    out, hold = tmp_path / "out", tmp_path / "hold"
    out.mkdir()
    hold.touch()
    logs = {n: tmp_path / f"{n}.log" for n in ("a0", "a1", "spare")}
    with Link(etcd) as link:

        def start(name: str, endpoint: str) -> subprocess.Popen:
            return agent(launcher, endpoint, run_id, "2", name, out, 2, hold, logs[name], ttl=ttl, timeout=timeout)

        procs = {name: start(name, etcd) for name in ("a0", "a1")}
        wait_for(lambda: len(worlds(out, 2)) >= 1, "a world of 2", list(procs.values()))
        procs["spare"] = start("spare", link.endpoint_list)
        # Its timeout runs from when it waits, not from when its process started: on a busy
        # machine its launcher takes seconds to import torch and connect, and a partition
        # begun before then fails its first connection instead of cutting off a waiting spare.
        wait_for(lambda: bool(waiting_nodes(etcd, run_id)), "the spare waiting", list(procs.values()))
        time.sleep(timeout + 2)
        link.freeze()
        time.sleep(3 * ttl)
        link.heal()
        time.sleep(ttl + 3)
        assert procs["spare"].poll() is None, f"the spare ended:\n{logs['spare'].read_text()[-3000:]}"
        first = worlds(out, 2)[0]
        victim = next(name for name, rank in first.items() if rank == 1)
        (survivor,) = set(first) - {victim}
        kill_tree(procs.pop(victim))
        wait_for(lambda: len(worlds(out, 2)) >= 2, "a world of 2 with the spare", list(procs.values()), timeout=60)
        second = worlds(out, 2)[1]
        assert second == {survivor: first[survivor], "spare": 1}, f"not the spare in {victim}'s place: {second}"
        hold.unlink()
        wait_exit(procs, {n: logs[n] for n in procs})
