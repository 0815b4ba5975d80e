"""Health gates with real torch (gloo on CPU) on a real etcd, through both launchers: torchrun
with ``--rdzv-backend=rdzv --rdzv-conf health_check=…``, and ``rdzv run --health-check``.

Every agent runs the same check, which reads files named after the agent in a "ward"
directory: ``sick-<agent>`` makes it fail, ``hang-<agent>`` makes it hang (until its timeout
kills it). Who is in which world is read back from ``starts.jsonl`` (see ``train.py``); who is
excluded, from ``rdzv status --format json``.

- A node whose check fails (here: hangs) is never admitted, even when a member dies and the
  world is below ``min``: the job waits for it to recover, and then admits it.
- A member that turns bad is drained and replaced by the spare, every survivor keeping its
  group rank, within ``interval x failures + grace + a few seconds``.
- A spare that turns bad withdraws and is not promoted: the healthy spare behind it is.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from test_spares import LAUNCHERS, agent, run_status, starts, wait_exit, worlds
from test_torchrun import kill_tree, wait_for

INTERVAL, FAILURES, CHECK_TIMEOUT = 1, 2, 2
#: rdzv run's --grace-period in `agent`; torch's workers end at SIGTERM.
GRACE = 2
CHECK = 'if [ -e "$WARD/hang-$AGENT_NAME" ]; then sleep 600; fi; test ! -e "$WARD/sick-$AGENT_NAME"'
HEALTH = {"check": CHECK, "interval": str(INTERVAL), "timeout": str(CHECK_TIMEOUT), "failures": str(FAILURES)}


class Job:
    """Agents of one run, each with the health gate above, and their ward."""

    def __init__(self, launcher: str, etcd: str, run_id: str, nnodes: str, target: int, tmp_path: Path) -> None:
        self.launcher, self.etcd, self.run_id, self.nnodes, self.target = launcher, etcd, run_id, nnodes, target
        self.out, self.hold, self.ward = tmp_path / "out", tmp_path / "hold", tmp_path / "ward"
        self.out.mkdir()
        self.ward.mkdir()
        self.hold.touch()
        self.tmp = tmp_path
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}

    def start(self, name: str) -> None:
        self.logs[name] = self.tmp / f"{name}.log"
        self.procs[name] = agent(
            self.launcher, self.etcd, self.run_id, self.nnodes, name, self.out, self.target, self.hold,
            self.logs[name], extra_env={"WARD": str(self.ward)}, health=HEALTH,
        )  # fmt: skip

    def mark(self, how: str, name: str) -> None:
        (self.ward / f"{how}-{name}").touch()

    def unmark(self, how: str, name: str) -> None:
        (self.ward / f"{how}-{name}").unlink()

    def kill(self, name: str) -> None:
        kill_tree(self.procs.pop(name))

    def status(self) -> dict:
        return run_status(self.etcd, self.run_id)

    def excluded(self) -> dict[str, str]:
        return {e["node_id"]: e["reason"] for e in self.status()["excluded"]}

    def wait(self, predicate, what: str, timeout: float = 120) -> None:
        wait_for(predicate, what, list(self.procs.values()), timeout=timeout)

    def log(self, name: str) -> str:
        return self.logs[name].read_text(errors="replace")

    def finish(self) -> None:
        self.hold.unlink()
        wait_exit(self.procs, {n: self.logs[n] for n in self.procs})


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_an_unhealthy_node_is_never_admitted_even_below_min_and_joins_once_it_recovers(
    launcher: str, etcd: str, run_id: str, tmp_path: Path
) -> None:
    job = Job(launcher, etcd, run_id, "2", 2, tmp_path)
    job.mark("hang", "late")
    for name in ("a0", "a1", "late"):
        job.start(name)
    job.wait(lambda: len(worlds(job.out, 2)) >= 1, "a world of 2")
    job.wait(lambda: len(job.status()["excluded"]) == 1, "the hung node excluded")
    ((node, reason),) = job.excluded().items()
    assert f"timed out after {CHECK_TIMEOUT}s (killed)" in reason, reason
    (first,) = worlds(job.out, 2)
    assert set(first) == {"a0", "a1"}, first
    job.kill("a1")
    # Below min, for as long as the node stays sick: no world, and it stays out.
    time.sleep(8)
    assert len(worlds(job.out, 2)) == 1, f"a world formed with the unhealthy node: {starts(job.out)}"
    assert node in job.excluded(), job.status()
    status = job.status()
    assert node not in status["waiting"] + status["spares"], status
    job.unmark("hang", "late")
    job.wait(lambda: len(worlds(job.out, 2)) >= 2, "a world with the recovered node")
    second = worlds(job.out, 2)[1]
    assert second == {"a0": first["a0"], "late": first["a1"]}, f"{first} then {second}"
    assert job.excluded() == {}, job.status()
    job.finish()


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_member_that_turns_bad_is_drained_and_the_spare_takes_its_rank(
    launcher: str, etcd: str, run_id: str, tmp_path: Path
) -> None:
    job = Job(launcher, etcd, run_id, "3", 3, tmp_path)
    for name in ("a0", "a1", "a2", "a3"):
        job.start(name)
    job.wait(lambda: len(worlds(job.out, 3)) >= 1, "a world of 3")
    (first,) = worlds(job.out, 3)
    (spare,) = set(job.procs) - set(first)
    victim = next(name for name, rank in first.items() if rank == 1)
    sick_at = time.monotonic()
    job.mark("sick", victim)
    job.wait(lambda: len(worlds(job.out, 3)) >= 2, "a world of 3 with the spare")
    took = time.monotonic() - sick_at
    second = worlds(job.out, 3)[1]
    assert second[spare] == first[victim], f"the spare did not take group rank {first[victim]}: {second}"
    assert {n: r for n, r in second.items() if n != spare} == {n: r for n, r in first.items() if n != victim}
    bound = INTERVAL * FAILURES + GRACE + 15
    print(f"\n{launcher}: drained and replaced {took:.1f} s after the check turned bad (bound {bound} s)")
    assert took < bound, f"replaced {took:.1f} s after the check turned bad (bound {bound} s)"
    job.wait(lambda: len(job.status()["excluded"]) == 1, "the drained node excluded")
    assert "exit status 1" in next(iter(job.excluded().values()))
    assert "health check" in job.log(victim), job.log(victim)[-3000:]
    assert job.procs[victim].poll() is None, "the drained agent ended instead of waiting to recover"
    job.finish()


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_spare_that_turns_bad_is_not_promoted(launcher: str, etcd: str, run_id: str, tmp_path: Path) -> None:
    job = Job(launcher, etcd, run_id, "2", 2, tmp_path)
    job.start("a0")
    job.start("a1")
    job.wait(lambda: len(worlds(job.out, 2)) >= 1, "a world of 2")
    job.start("s1")
    job.wait(lambda: len(job.status()["spares"]) == 1, "the first spare waiting")
    job.start("s2")
    job.wait(lambda: len(job.status()["spares"]) == 2, "the second spare waiting")
    job.mark("sick", "s1")
    job.wait(lambda: len(job.status()["spares"]) == 1 and len(job.status()["excluded"]) == 1, "s1 withdrawn")
    job.kill("a1")
    job.wait(lambda: len(worlds(job.out, 2)) >= 2, "a world of 2 with a spare")
    second = worlds(job.out, 2)[1]
    assert set(second) == {"a0", "s2"}, f"not the healthy spare: {second}"
    # The sick spare stays out until the job ends; then the run's close ends its wait (exit 0).
    job.finish()
