"""Segments with real torch (gloo on CPU) on a real etcd, through both launchers: torchrun with
``--rdzv-conf segment=…`` and ``rdzv run --segment``.

- Agents arriving s1, s2, s1, s2 form a world in which each segment holds consecutive group
  ranks.
- A member dies while spares of both segments wait, the other segment's spare the longer: the
  spare of the dead member's segment takes its group rank, and nothing else moves.
- Whole segments of two (``segment_size=2``): a lone node of a third segment waits as a spare;
  a same-segment spare fills a hole with nothing else moving; a member whose segment has no
  spare is replaced by a complete spare segment in its block, the other segment keeping its
  ranks, and the dead member's partner waits as a spare.

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

    def __init__(
        self, launcher: str, etcd: str, run_id: str, nodes: int, tmp_path: Path, segment_size: int | None = None
    ) -> None:
        self.launcher, self.etcd, self.run_id, self.nodes = launcher, etcd, run_id, nodes
        self.segment_size = segment_size
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
            self.logs[name], segment=segment, segment_size=self.segment_size,
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


def whole_first_world(launcher: str, etcd: str, run_id: str, tmp_path: Path) -> tuple[Job, dict[str, int]]:
    """Agents of s1, s2, s1, s3, s2 with whole segments of two in a world of four: the world is
    the two complete segments, each in a block of two group ranks; the lone s3 node is a
    spare."""
    job = Job(launcher, etcd, run_id, 4, tmp_path, segment_size=2)
    for name, segment in [("a0", "s1"), ("a1", "s2"), ("a2", "s1"), ("lone", "s3"), ("a3", "s2")]:
        job.start(name, segment)
    job.wait(lambda: len(worlds(job.out, 4)) >= 1, "a world of 4")
    (world,) = worlds(job.out, 4)
    assert set(world) == {"a0", "a1", "a2", "a3"}, world
    assert job.segments_by_rank(world) in (["s1", "s1", "s2", "s2"], ["s2", "s2", "s1", "s1"]), world
    job.wait(lambda: len(job.status()["spares"]) == 1, "the lone s3 node waiting as a spare")
    return job, world


def kill_a0_with_a_spare(job: Job, spare: str, segment: str) -> dict[str, int]:
    """Starts `spare` of `segment`, waits until it is the second spare, kills a0 (of s1) and
    returns the world formed next."""
    job.start(spare, segment)
    job.wait(lambda: len(job.status()["spares"]) == 2, f"{spare} waiting beside the lone node")
    kill_tree(job.procs.pop("a0"))
    job.wait(lambda: len(worlds(job.out, 4)) >= 2, "a second world of 4")
    return worlds(job.out, 4)[1]


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_whole_segments_a_same_segment_spare_fills_a_hole(
    launcher: str, etcd: str, run_id: str, tmp_path: Path
) -> None:
    job, first = whole_first_world(launcher, etcd, run_id, tmp_path)
    second = kill_a0_with_a_spare(job, "spare-s1", "s1")
    expected = {("spare-s1" if n == "a0" else n): r for n, r in first.items()}
    assert second == expected, f"{first} then {second}"
    assert len(job.status()["spares"]) == 1, "the lone s3 node still waits"
    job.finish()


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_whole_segments_a_complete_spare_segment_takes_the_block_of_an_incomplete_one(
    launcher: str, etcd: str, run_id: str, tmp_path: Path
) -> None:
    job, first = whole_first_world(launcher, etcd, run_id, tmp_path)
    second = kill_a0_with_a_spare(job, "pair", "s3")
    s1_block = {first["a0"], first["a2"]}
    assert {second["lone"], second["pair"]} == s1_block, f"{first} then {second}"
    assert {n: second[n] for n in ("a1", "a3")} == {n: first[n] for n in ("a1", "a3")}, f"{first} then {second}"
    # Everyone else is in the world: the one spare is a2, whose segment is incomplete.
    job.wait(lambda: len(job.status()["spares"]) == 1, "a2 waiting as a spare")
    job.finish()
