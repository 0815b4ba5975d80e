"""rdzv as torchrun's rendezvous backend, driven through torchrun itself, with real torch
(gloo on CPU) and real etcd and Redis."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rdzv

TRAIN = str(Path(__file__).with_name("train.py"))
# Short TTLs and intervals keep the scenarios quick; restarts are few.
CONF = "last_call_timeout=2,keep_alive_ttl=3,join_timeout=90"


def torchrun(
    endpoint: str, run_id: str, nnodes: str, nproc: int, out: Path, target: int, log: Path, conf: str = CONF
) -> subprocess.Popen:
    """Starts one agent (torchrun) in a session of its own, so it dies with its workers."""
    out.mkdir(parents=True, exist_ok=True)
    # LOGLEVEL=INFO: the agents log their rendezvous results, which the tests wait for.
    env = dict(os.environ, OUT_DIR=str(out), TARGET_WORLD=str(target), GLOO_SOCKET_IFNAME="lo", LOGLEVEL="INFO")
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        f"--nnodes={nnodes}", f"--nproc-per-node={nproc}",
        "--rdzv-backend=rdzv", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}",
        f"--rdzv-conf={conf}", "--local-addr=127.0.0.1",
        "--monitor-interval=0.5", "--max-restarts=3", f"--log-dir={log.parent / 'torchelastic'}", TRAIN,
    ]  # fmt: skip
    with open(log, "wb") as f:
        return subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def finish(procs: list[subprocess.Popen], logs: list[Path], timeout: float = 180) -> list[int]:
    deadline = time.monotonic() + timeout
    codes = []
    for proc, log in zip(procs, logs):
        try:
            codes.append(proc.wait(max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            kill(procs)
            raise AssertionError(f"agent did not finish in time; its log:\n{log.read_text()[-4000:]}") from None
    for code, log in zip(codes, logs):
        assert code == 0, f"agent exited with {code}; its log:\n{log.read_text()[-4000:]}"
    return codes


def exits(procs: dict[str, subprocess.Popen], logs: dict[str, Path], timeout: float = 120) -> dict[str, tuple[int, float]]:
    """Waits for every agent to exit; returns each one's exit code and when it exited. Kills
    them all (with their workers) and fails when one is late."""
    deadline = time.monotonic() + timeout
    ended: dict[str, tuple[int, float]] = {}
    while len(ended) < len(procs):
        for name, proc in procs.items():
            if name not in ended and proc.poll() is not None:
                ended[name] = (proc.returncode, time.monotonic())
        if time.monotonic() > deadline:
            kill(list(procs.values()))
            late = [n for n in procs if n not in ended]
            tails = "".join(f"\n--- log of {n} ---\n{logs[n].read_text()[-3000:]}" for n in late)
            raise AssertionError(f"{late} did not exit{tails}")
        time.sleep(0.1)
    return ended


def results(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


def wait_for(predicate, what: str, procs: list[subprocess.Popen], timeout: float = 120) -> None:
    """Waits for `predicate`; on timeout kills the agents (with their workers) and fails."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            kill(procs)
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc), whatever session or group it moved to: torch's
    agent starts its workers in sessions of their own, out of reach of a kill of its group."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILLs an agent started in a session of its own, its group, and every process below it."""
    below = descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for pid in below:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def kill(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            kill_tree(p)


def test_entry_point_registers_the_backend_and_its_store_serves_the_agent(run_id: str) -> None:
    from datetime import timedelta
    from importlib.metadata import entry_points

    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler
    from torch.distributed.elastic.utils import store as store_util

    assert [ep.name for ep in entry_points(group="torchrun.handlers")].count("rdzv") == 1
    params = RendezvousParameters(
        backend="rdzv", endpoint="mem://torch", run_id=run_id, min_nodes=1, max_nodes=1,
        timeout=900, read_timeout="0.5", keep_alive_interval="1", keep_alive_max_attempt="2",
    )  # fmt: skip
    handler = get_rendezvous_handler(params)
    assert handler.get_backend() == "rdzv" and handler.get_run_id() == run_id
    assert not handler.use_agent_store
    info = handler.next_rendezvous()
    assert (info.rank, info.world_size) == (0, 1)
    assert info.bootstrap_store_info.master_port > 0
    store = info.store
    assert isinstance(store, dist.Store)
    assert store.timeout == timedelta(seconds=0.5)
    # What the agent does with it: rank assignment, then its exit barrier.
    store.set("torchelastic/role_info/0", b"{}")
    assert store.multi_get(["torchelastic/role_info/0"]) == [b"{}"]
    store.multi_set(["torchelastic/assigned_ranks/0"], ["[0, 1, 0, 1]"])
    assert store.get("torchelastic/assigned_ranks/0") == b"[0, 1, 0, 1]"
    store_util.barrier(store, world_size=1, key_prefix="exit", barrier_timeout=5)
    assert store.timeout == timedelta(seconds=0.5)
    with pytest.raises(dist.DistStoreError):
        store.wait(["never"], timedelta(milliseconds=100))
    with pytest.raises(dist.DistStoreError):
        store.get("never")
    assert store.add("c", 5) == 5 and store.compare_set("c", "5", "6") == b"6"
    assert store.check(["c"]) and store.delete_key("c") and store.num_keys() >= 1
    assert handler.num_nodes_waiting() == 0 and not handler.is_closed()
    # An agent that ends for any reason but success or giving up only leaves…
    try:
        raise TimeoutError("the agent's own rendezvous timed out")
    except TimeoutError:
        assert handler.shutdown() is True
    other = rdzv.connect(f"mem://torch/{run_id}?min_workers=1")
    assert not other.is_closed()
    other.shutdown()
    # …and one whose workers succeeded closes the run, as succeeded.
    again = get_rendezvous_handler(params)
    again.next_rendezvous()
    assert again.shutdown() is True
    late = rdzv.connect(f"mem://torch/{run_id}?min_workers=1")
    with pytest.raises(rdzv.RendezvousClosedError) as closed:
        late.next_rendezvous()
    assert closed.value.outcome == "succeeded"
    late.shutdown()


def test_a_broken_round_counts_as_a_waiting_node(run_id: str) -> None:
    import threading

    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    def handler():
        params = RendezvousParameters(
            backend="rdzv", endpoint="mem://broken", run_id=run_id, min_nodes=2, max_nodes=2, timeout=30
        )
        return get_rendezvous_handler(params)

    a, b = handler(), handler()
    t = threading.Thread(target=b.next_rendezvous)
    t.start()
    a.next_rendezvous()
    t.join(30)
    assert a.num_nodes_waiting() == 0
    try:  # b's agent ends for another reason than success: b leaves, a's agent must re-form
        raise RuntimeError("b's agent stopped")
    except RuntimeError:
        b.shutdown()
    deadline = time.monotonic() + 10
    while a.num_nodes_waiting() == 0:
        assert time.monotonic() < deadline, "a never saw its round broken"
        time.sleep(0.05)
    assert not a.is_closed()
    a.shutdown()


def test_importing_the_backend_first_registers_it_cleanly() -> None:
    code = (
        "import rdzv.torch_backend\n"
        "from torch.distributed.elastic.rendezvous import rendezvous_handler_registry as r\n"
        "print('rdzv' in r._registry)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
    assert "Exception while registering" not in out.stderr


def test_rdzv_conf_keys_map_to_rdzv_options(run_id: str) -> None:
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    from rdzv.torch_backend import build_url

    def url(endpoint: str, **conf: object) -> str:
        params = RendezvousParameters(
            backend="rdzv", endpoint=endpoint, run_id="job", min_nodes=2, max_nodes=4, local_addr="10.0.0.1", **conf
        )
        return build_url(params)[0]

    assert url("h:2379", timeout=900) == (
        "etcd://h:2379/job?timeout=900.0&local_addr=10.0.0.1&min_workers=2&max_workers=4"
    )
    assert "timeout=30.0" in url("etcd://h", timeout=900, join_timeout="30")
    assert "keep_alive_ttl=6.0" in url("etcd://h", keep_alive_interval="2")
    assert "prefix=%2Fmy" in url("etcd://h", etcd_prefix="/my")
    assert url("redis://h:6379/?db=1").startswith("redis://h:6379/job?db=1&")
    with pytest.raises(ValueError, match="--rdzv-id"):
        url("etcd://h:2379/job")
    with pytest.raises(ValueError, match="--nnodes"):
        url("etcd://h", min_workers="3")
    with pytest.raises(ValueError, match="not both"):
        url("etcd://h", keep_alive_ttl="3", keep_alive_interval="1")
    with pytest.raises(ValueError, match="--rdzv-endpoint"):
        url("")


def test_two_agents_two_workers_each_form_a_world_of_4(endpoint: str, run_id: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    logs = [tmp_path / f"agent{i}.log" for i in range(2)]
    procs = [torchrun(endpoint, run_id, "2", 2, out, 4, log) for log in logs]
    finish(procs, logs)
    rs = results(out)
    assert sorted(r["rank"] for r in rs) == [0, 1, 2, 3]
    assert all(r["world"] == 4 and r["sum"] == 10.0 for r in rs)
    assert sorted({r["group_rank"] for r in rs}) == [0, 1]
    assert len({r["master"] for r in rs}) == 1
    # The agents' workers succeeded: the run is closed, as succeeded.
    w = rdzv.connect(f"{endpoint}/{run_id}?min_workers=1")
    assert w.is_closed()
    with pytest.raises(rdzv.RendezvousClosedError) as closed:
        w.next_rendezvous()
    assert closed.value.outcome == "succeeded"
    w.shutdown()


def test_killed_agent_survivors_restart_as_world_of_2(etcd: str, run_id: str, tmp_path: Path) -> None:
    endpoint = etcd  # a bare host:port means etcd
    out = tmp_path / "out"
    logs = [tmp_path / f"agent{i}.log" for i in range(3)]
    procs = [torchrun(endpoint, run_id, "2:3", 1, out, 2, log) for log in logs]
    # Wait until the world of 3 runs: every agent logged its rendezvous result.
    wait_for(lambda: all("group_world_size=3" in log.read_text() for log in logs), "a world of 3", procs)
    victim = procs.pop()
    kill_tree(victim)  # the agent and its workers
    finish(procs, logs[:2])
    rs = results(out)
    assert sorted(r["rank"] for r in rs) == [0, 1]
    assert all(r["world"] == 2 and r["sum"] == 3.0 for r in rs)
    for log in logs[:2]:
        text = log.read_text()
        # Each survivor re-formed from 3 to 2 (seeing its round broken, or its workers fail).
        assert text.index("group_world_size=3") < text.rindex("group_world_size=2")


def test_late_agent_is_admitted(redis: str, run_id: str, tmp_path: Path) -> None:
    endpoint = f"redis://{redis}"
    out = tmp_path / "out"
    logs = [tmp_path / f"agent{i}.log" for i in range(3)]
    procs = [torchrun(endpoint, run_id, "2:3", 1, out, 3, log) for log in logs[:2]]
    wait_for(lambda: all("group_world_size=2" in log.read_text() for log in logs[:2]), "a world of 2", procs)
    procs.append(torchrun(endpoint, run_id, "2:3", 1, out, 3, logs[2]))
    finish(procs, logs)
    rs = results(out)
    assert sorted(r["rank"] for r in rs) == [0, 1, 2]
    assert all(r["world"] == 3 and r["sum"] == 6.0 for r in rs)
    # The first two agents re-formed to admit the third: a new round, not a failure.
    assert any("new nodes" in log.read_text() for log in logs[:2])


def test_bad_endpoint_fails_fast_with_a_clear_message(run_id: str, tmp_path: Path) -> None:
    log = tmp_path / "agent.log"
    started = time.monotonic()
    proc = torchrun("etcd://127.0.0.1:1", run_id, "1", 1, tmp_path / "out", 1, log)
    code = proc.wait(120)
    text = log.read_text()
    assert code != 0
    assert time.monotonic() - started < 60
    assert "RendezvousConnectionError" in text and "--rdzv-endpoint etcd://127.0.0.1:1" in text
    assert "unavailable" in text


def test_unknown_conf_key_names_the_known_ones(etcd: str, run_id: str, tmp_path: Path) -> None:
    log = tmp_path / "agent.log"
    proc = torchrun(etcd, run_id, "1", 1, tmp_path / "out", 1, log, conf="join_timout=5")
    assert proc.wait(120) != 0
    text = log.read_text()
    assert "unknown option `join_timout`" in text
    assert "join_timeout" in text and "keep_alive_ttl" in text
