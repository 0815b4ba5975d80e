"""Segments with real torch (gloo on CPU) on a real etcd, through both launchers: torchrun with
``--rdzv-conf segment=…`` and ``rdzv run --segment``.

- Agents arriving s1, s2, s1, s2 form a world in which each segment holds consecutive group
  ranks.
- A member dies while spares of both segments wait, the other segment's spare the longer: the
  spare of the dead member's segment takes its group rank, and nothing else moves.

Who is in which world is read back from ``starts.jsonl`` (see ``train.py``); who waits, from
``rdzv status --format json``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from test_spares import LAUNCHERS, agent, run_status, wait_exit, worlds
from test_torchrun import kill_tree, wait_for


class Job:
    """Agents of one run, each in a segment."""

    def __init__(self, launcher: str, etcd: str, run_id: str, nodes: int, tmp_path: Path) -> None:
        self.launcher, self.etcd, self.run_id, self.nodes = launcher, etcd, run_id, nodes
        self.out, self.hold, self.tmp = tmp_path / "out", tmp_path / "hold", tmp_path
        self.out.mkdir()
        self.hold.touch()
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}
        self.segment: dict[str, str] = {}

    def start(self, name: str, segment: str) -> None:
        self.logs[name], self.segment[name] = self.tmp / f"{name}.log", segment
        self.procs[name] = agent(
            self.launcher, self.etcd, self.run_id, str(self.nodes), name, self.out, self.nodes, self.hold,
            self.logs[name], segment=segment,
        )  # fmt: skip

    def status(self) -> dict:
        return run_status(self.etcd, self.run_id)

    def wait(self, predicate, what: str) -> None:
        wait_for(predicate, what, list(self.procs.values()), timeout=120)

    def segments_by_rank(self, world: dict[str, int]) -> list[str]:
        return [self.segment[name] for name in sorted(world, key=world.__getitem__)]

    def finish(self) -> None:
        self.hold.unlink()
        wait_exit(self.procs, {n: self.logs[n] for n in self.procs})


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_interleaved_arrivals_get_consecutive_ranks_per_segment(
    launcher: str, etcd: str, run_id: str, tmp_path: Path
) -> None:
    job = Job(launcher, etcd, run_id, 4, tmp_path)
    for i, segment in enumerate(["s1", "s2", "s1", "s2"]):
        job.start(f"a{i}", segment)
    job.wait(lambda: len(worlds(job.out, 4)) >= 1, "a world of 4")
    (world,) = worlds(job.out, 4)
    by_rank = job.segments_by_rank(world)
    assert by_rank in (["s1", "s1", "s2", "s2"], ["s2", "s2", "s1", "s1"]), f"{world}: {by_rank}"
    members = job.status()["participants"]
    assert [m.get("segment") for m in members] == by_rank, members
    job.finish()


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_spare_of_the_dead_members_segment_takes_its_rank(
    launcher: str, etcd: str, run_id: str, tmp_path: Path
) -> None:
    job = Job(launcher, etcd, run_id, 2, tmp_path)
    job.start("a0", "s1")
    job.start("a1", "s2")
    job.wait(lambda: len(worlds(job.out, 2)) >= 1, "a world of 2")
    (first,) = worlds(job.out, 2)
    # The spare of s2 waits first, then the one of s1.
    job.start("spare-s2", "s2")
    job.wait(lambda: len(job.status()["spares"]) == 1, "the s2 spare waiting")
    job.start("spare-s1", "s1")
    job.wait(lambda: len(job.status()["spares"]) == 2, "both spares waiting")
    kill_tree(job.procs.pop("a0"))
    job.wait(lambda: len(worlds(job.out, 2)) >= 2, "a world of 2 with a spare")
    second = worlds(job.out, 2)[1]
    assert second == {"spare-s1": first["a0"], "a1": first["a1"]}, f"{first} then {second}"
    job.finish()
