"""Fencing: a node of a real torch training job (gloo on CPU, `train.py`) cut off from etcd
(a real partition through `rdzv-netfault`: bytes stop, nothing is reset) for about three
keep-alive TTLs. Through both launchers, on a real etcd:

- the cut-off agent's lease is lost within a TTL, so it is no member any more: it stops its
  workers at once (not when it can reach the server again), even while its check for waiting
  nodes hangs on the frozen link (the world of 3 has room for a 4th, so that check asks the
  server);
- the others re-form without it within the TTL and a few seconds (their agents start the
  workers of the world of 2: timed by the workers' start, before they import torch), and
  train as a world of 2;
- healed, it is admitted again, the world of 3 trains again, and the job finishes with every
  agent exiting 0, the cut-off one without having used up a restart.

Only the node's link to etcd is cut, not the gloo connections between the workers. The
workers train a fixed number of steps in each world (`STEPS`), then run no collective until
the test lets them finish (`HOLD_FILE`), and the cut comes once every worker of the world of
3 has done its steps. So no worker dies of a collective whose peer was stopped, and each is
stopped by its own agent: the cut-off node's by its fencing (what is tested), the others'
when they re-form. During a collective, the order in which the agents act would decide
instead: a worker of the cut-off node that fails because a peer was stopped before it may
count as that node's failure.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from conftest import Link
from test_spares import LAUNCHERS, agent, starts, wait_exit
from test_torchrun import kill, wait_for

TTL = 2
STEPS = 20


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def worlds(out: Path) -> list[dict[str, dict]]:
    """The worlds that started, in order: agent name → its start line."""
    by_master: dict[str, dict[str, dict]] = {}
    for start in starts(out) if (out / "starts.jsonl").exists() else []:
        by_master.setdefault(start["master"], {})[start["agent"]] = start
    return [w for w in by_master.values() if len(w) == next(iter(w.values()))["world"]]


def trained(out: Path, world: dict[str, dict]) -> list[float] | None:
    """The sums the workers of `world` reduced, once every one has done its steps."""
    path = out / "steps.jsonl"
    master = next(iter(world.values()))["master"]
    done = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    sums = [d["sum"] for d in done if d["master"] == master]
    return sums if len(sums) == len(world) else None


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_node_cut_off_stops_its_workers_and_rejoins_when_healed(
    launcher: str, etcd: str, run_id: str, tmp_path: Path
) -> None:
    out, hold = tmp_path / "out", tmp_path / "hold"
    out.mkdir()
    hold.touch()
    names = ["a0", "a1", "cut"]
    logs = {n: tmp_path / f"{n}.log" for n in names}
    with Link(etcd) as link:
        endpoints = {"a0": etcd, "a1": etcd, "cut": link.endpoint_list}
        procs = {
            n: agent(
                launcher, endpoints[n], run_id, "2:4", n, out, 3, hold, logs[n], ttl=TTL,
                extra_env={"STEPS": str(STEPS)},
            )
            for n in names
        }  # fmt: skip
        everyone = list(procs.values())
        wait_for(lambda: any(len(w) == 3 for w in worlds(out)), "a world of 3", everyone)
        first = next(w for w in worlds(out) if len(w) == 3)
        wait_for(lambda: trained(out, first) is not None, "the world of 3 to train", everyone, timeout=60)
        assert trained(out, first) == [6.0] * 3
        before = len(worlds(out))
        worker = first["cut"]["pid"]
        link.freeze()
        frozen = time.monotonic()
        # Fenced: its worker is stopped within the TTL, the grace period and slack.
        wait_for(lambda: not alive(worker), "the cut-off node's worker to stop", everyone, timeout=TTL + 2 + 5)
        stopped = time.monotonic() - frozen

        # The others re-form without it, and train.
        def without_it() -> dict[str, dict] | None:
            return next((w for w in worlds(out)[before:] if set(w) == {"a0", "a1"}), None)

        wait_for(lambda: without_it() is not None, "a world of a0 and a1", everyone, timeout=30)
        second = without_it()
        assert second is not None
        # Re-formed when both agents started its workers: what follows (torch's import, gloo's
        # connections) is the workers' own start, seconds longer on a loaded machine.
        reformed = max(s["started"] for s in second.values()) - frozen
        wait_for(lambda: trained(out, second) is not None, "the world of 2 to train", everyone, timeout=60)
        assert trained(out, second) == [3.0] * 2
        time.sleep(max(0.0, 3 * TTL - (time.monotonic() - frozen)))
        assert procs["cut"].poll() is None, f"the cut-off agent ended:\n{logs['cut'].read_text()[-3000:]}"
        link.heal()
        # Admitted again: a world of all three trains, then the job ends.
        wait_for(lambda: len([w for w in worlds(out) if len(w) == 3]) >= 2, "a world of 3 again", everyone, timeout=60)
        last = [w for w in worlds(out) if len(w) == 3][-1]
        wait_for(lambda: trained(out, last) is not None, "the world of 3 to train again", everyone, timeout=60)
        assert trained(out, last) == [6.0] * 3
        hold.unlink()
        try:
            wait_exit(procs, logs)
        finally:
            kill(everyone)
    assert last["cut"]["restart"] == 0, f"the cut-off node used up a restart: {last['cut']}"
    assert stopped < TTL + 2 + 3, f"its worker stopped {stopped:.1f} s into the cut"
    assert reformed < TTL + 10, f"the others re-formed {reformed:.1f} s into the cut"
    assert not any(alive(s["pid"]) for s in starts(out)), "a worker outlived its agent"
