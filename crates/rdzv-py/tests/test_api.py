"""The Python API on real etcd and Redis (and memory): rounds, the Store, errors, signals, fork."""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

import rdzv


def test_import_does_not_import_torch() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import sys, rdzv; print('torch' in sys.modules)"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == "False"


def test_two_workers_form_a_round_and_share_the_store(endpoint: str, run_id: str) -> None:
    url = f"{endpoint}/{run_id}?min_workers=2&max_workers=2&keep_alive_ttl=3s"
    a, b = rdzv.connect(url), rdzv.connect(url)
    assert a.run_id == run_id and a.backend in ("etcd", "redis")
    rounds: dict[str, rdzv.Round] = {}
    t = threading.Thread(target=lambda: rounds.__setitem__("b", b.next_rendezvous()))
    t.start()
    rounds["a"] = a.next_rendezvous()
    t.join(30)
    ra, rb = rounds["a"], rounds["b"]
    assert (ra.world_size, rb.world_size) == (2, 2)
    assert {ra.rank, rb.rank} == {0, 1}
    assert ra.version == rb.version
    assert [p.node for p in ra.participants] == [p.node for p in rb.participants]
    assert (ra.master_addr, ra.master_port) == (rb.master_addr, rb.master_port)
    assert ra.participants[0].port == ra.master_port
    # The round's Store, shared; rank 0 published the bootstrap keys in it.
    assert ra.store.get("MASTER_PORT") == str(ra.master_port).encode()
    ra.store.set("k", "v")
    assert rb.store.get(b"k") == b"v"
    assert ra.store.add("n", 2) == 2 and rb.store.add("n", 3) == 5
    assert rb.store.compare_set("k", "v", "w") == b"w"
    assert ra.store.compare_set("k", "x", "y") == b"w"
    ra.store.multi_set(["x", "y"], [b"1", "2"])
    assert rb.store.multi_get(["x", "y"]) == [b"1", b"2"]
    assert rb.store.check(["x", "y"]) and not rb.store.check(["x", "nope"])
    assert rb.store.delete_key("x") and not rb.store.delete_key("x")
    ra.store.append("log", "a")
    rb.store.append("log", b"b")
    assert ra.store.get("log") == b"ab"
    ra.store.queue_push("q", "item")
    assert rb.store.queue_len("q") == 1 and rb.store.queue_pop("q") == b"item"
    with pytest.raises(rdzv.StoreQueueEmptyError):
        rb.store.queue_pop("q", block=False)
    assert a.num_nodes_waiting() == 0 and not a.is_closed()
    assert a.round_broken(timeout=0) is None
    # b leaves: a's round breaks, the run stays open; then a closes it.
    b.shutdown()
    assert a.round_broken(timeout=10) in ("member_gone", "ended")
    assert not a.is_closed()
    a.set_closed()
    assert a.is_closed()
    with pytest.raises(rdzv.RendezvousClosedError):
        a.next_rendezvous()
    a.shutdown()


def test_store_timeouts_and_types() -> None:
    store = rdzv.open_store("mem://api/store-timeouts")
    store.set_timeout(datetime.timedelta(milliseconds=200))
    assert store.timeout == pytest.approx(0.2)
    with pytest.raises(rdzv.StoreTimeoutError, match="missing"):
        store.get("missing")
    with pytest.raises(rdzv.StoreTimeoutError):
        store.wait(["missing"], 0.1)
    with pytest.raises(TypeError):
        store.set("k", 3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        store.check("k")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        store.multi_set(["a", "b"], ["1"])
    store.set("n", "x")
    with pytest.raises(rdzv.StoreError, match="not a decimal integer"):
        store.add("n", 1)
    store.barrier("b", 1, timeout=1)


def test_errors_mirror_the_rust_kinds(run_id: str) -> None:
    with pytest.raises(rdzv.RendezvousConfigError, match="unknown option `bogus`"):
        rdzv.connect(f"mem://api/{run_id}?min_workers=1&bogus=1")
    with pytest.raises(rdzv.RendezvousConfigError, match="min_workers"):
        rdzv.connect(f"mem://api/{run_id}")
    started = time.monotonic()
    with pytest.raises(rdzv.RendezvousUnavailableError):
        rdzv.connect(f"etcd://127.0.0.1:1/{run_id}?min_workers=1&connect_timeout=1s")
    assert time.monotonic() - started < 15
    w = rdzv.connect(f"mem://api/{run_id}?min_workers=2&timeout=0.3s")
    with pytest.raises(rdzv.RendezvousTimeoutError):
        w.next_rendezvous()
    assert issubclass(rdzv.RendezvousTimeoutError, rdzv.RendezvousError)
    assert issubclass(rdzv.StoreTimeoutError, rdzv.Error)
    w.shutdown()
    with pytest.raises(rdzv.RendezvousShutdownError):
        w.next_rendezvous()


def test_blocking_call_releases_the_gil(run_id: str) -> None:
    w = rdzv.connect(f"mem://gil/{run_id}?min_workers=2&timeout=3s")
    ticks = []
    t = threading.Thread(target=lambda: [ticks.append(time.sleep(0.05)) for _ in range(10)])
    t.start()
    with pytest.raises(rdzv.RendezvousTimeoutError):
        w.next_rendezvous()
    t.join()
    assert len(ticks) == 10


def test_ctrl_c_interrupts_a_blocking_call(etcd: str, run_id: str) -> None:
    code = (
        "import rdzv, signal, sys\n"
        # As on a terminal: a launcher started in the background (nohup, CI) hands its
        # children SIGINT ignored, and then Python would never raise KeyboardInterrupt.
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        f"w = rdzv.connect('etcd://{etcd}/{run_id}?min_workers=2')\n"
        "print('waiting', flush=True)\n"
        "try:\n"
        "    w.next_rendezvous()\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', flush=True)\n"
        "    sys.exit(7)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "waiting"
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(10) == 7
    assert proc.stdout.read().strip() == "interrupted"
    # Nobody is left behind: the interrupted join was withdrawn.
    w = rdzv.connect(f"etcd://{etcd}/{run_id}?min_workers=1")
    assert w.next_rendezvous().world_size == 1
    w.shutdown()


def test_an_interrupted_call_in_a_process_that_lives_on_leaves_no_ghost(endpoint: str, run_id: str) -> None:
    """Issue 39, defect 4: a `next_rendezvous()` interrupted by Ctrl-C and caught, in a
    process that lives on (a notebook): its join key used to stay for as long as the session
    lived, and was frozen into the next round as a ghost (a stall of the frozen value's 10 s).
    Two other workers must form their round of 2 at once."""
    url = f"{endpoint}/{run_id}?min_workers=2&max_workers=2&keep_alive_ttl=10s"
    code = (
        "import rdzv, signal, sys, time\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        f"w = rdzv.connect({url!r})\n"
        "print('waiting', flush=True)\n"
        "try:\n"
        "    w.next_rendezvous()\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "waiting"
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        assert proc.stdout.readline().strip() == "interrupted"
        a, b = rdzv.connect(url), rdzv.connect(url)
        started = time.monotonic()
        with ThreadPoolExecutor(2) as pool:
            rounds = [f.result(60) for f in [pool.submit(a.next_rendezvous), pool.submit(b.next_rendezvous)]]
        took = time.monotonic() - started
        assert [r.world_size for r in rounds] == [2, 2]
        assert {p.node for p in rounds[0].participants} == {a.node_id, b.node_id}
        assert took < 5, f"the round of 2 took {took:.1f} s: a ghost of the interrupted call stalled it"
        assert proc.poll() is None, "the interrupted process did not live on"
        a.shutdown()
        b.shutdown()
    finally:
        proc.kill()
        proc.wait()


def wait_child(pid: int, timeout: float = 60) -> int:
    """The exit code of forked child `pid`; a child still running after `timeout` seconds (a
    deadlock after the fork) is killed and fails the test instead of hanging the suite."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f"the forked child did not exit within {timeout} s")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX-only")
def test_fork_child_makes_its_own_handles(redis: str, run_id: str) -> None:
    url = f"redis://{redis}/{run_id}?min_workers=1"
    parent = rdzv.connect(url)
    store = rdzv.open_store(url)
    store.set("from", "parent")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            try:
                store.get("from")
            except rdzv.RendezvousError as e:
                assert "before a fork" in str(e)
                child_store = rdzv.open_store(url)
                assert child_store.get("from") == b"parent"
                child_store.set("child", "ok")
                code = 0
        finally:
            os._exit(code)
    assert wait_child(pid) == 0
    assert store.get("child") == b"ok"
    assert parent.next_rendezvous().world_size == 1
    parent.shutdown()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX-only")
def test_a_forked_child_keeps_its_own_session_alive(endpoint: str, run_id: str) -> None:
    # The parent has a session, so its keep-alive thread runs: the child has none of it.
    parent = rdzv.connect(f"{endpoint}/{run_id}-parent?min_workers=1")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            child = rdzv.connect(f"{endpoint}/{run_id}?min_workers=1&keep_alive_ttl=1s")
            child.next_rendezvous()
            # Three TTLs: a session nobody refreshes would be gone, and the round broken.
            time.sleep(3)
            code = 0 if child.round_broken(timeout=0) is None else 2
            child.shutdown()
        finally:
            os._exit(code)
    code = wait_child(pid)
    parent.shutdown()
    assert code == 0, "the child's session was not kept alive"


def test_a_round_tells_what_changed_since_the_previous_one(run_id: str) -> None:
    # Round 1: three members (max_workers), a fourth waits as a spare. Round 2: the member at
    # rank 1 leaves, the spare takes its rank. Round 3: that one leaves too, nobody replaces
    # it, the world shrinks to 2 and only the rank beyond it moves down.
    url = f"mem://changes/{run_id}?min_workers=2&max_workers=3&last_call_timeout=2s&timeout=30s"
    pool = ThreadPoolExecutor(4)

    def next_rounds(*workers: rdzv.Rendezvous) -> list[Future[rdzv.Round]]:
        return [pool.submit(w.next_rendezvous) for w in workers]

    first = [rdzv.connect(url) for _ in range(3)]
    rounds1 = [f.result(30) for f in next_rounds(*first)]
    assert {r.world_size for r in rounds1} == {3} and len({r.version for r in rounds1}) == 1
    for r in rounds1:  # a first round compares with nothing
        assert (r.previous_version, r.previous_rank, r.left, r.joined) == (None, None, [], [])
    by_rank = dict(zip((r.rank for r in rounds1), first))
    r0, r1, r2 = by_rank[0], by_rank[1], by_rank[2]
    v1 = rounds1[0].version

    spare = rdzv.connect(url)
    spare_round = next_rounds(spare)[0]
    time.sleep(1)  # the spare waits on the running round 1
    assert not spare_round.done()
    assert r0.num_nodes_waiting() == 0  # a spare is not a waiting worker a full round admits

    r1.shutdown()
    assert r0.round_broken(timeout=10) in ("member_gone", "ended")
    a, b = (f.result(30) for f in next_rounds(r0, r2))
    s = spare_round.result(30)
    assert a.version == b.version == s.version > v1
    # The survivors keep their ranks, the newcomer takes the hole at rank 1.
    assert (a.rank, b.rank, s.rank) == (0, 2, 1)
    assert (a.previous_version, b.previous_version, s.previous_version) == (v1, v1, v1)
    assert (a.previous_rank, b.previous_rank, s.previous_rank) == (0, 2, None)
    for r in (a, b, s):
        assert (r.left, r.joined) == ([1], [1])
    v2 = a.version

    spare.shutdown()
    assert r0.round_broken(timeout=10) in ("member_gone", "ended")
    a, b = (f.result(30) for f in next_rounds(r0, r2))
    assert a.version == b.version > v2 and a.world_size == 2
    # Rank 2 is beyond the new world: its member moves down to the free rank 1.
    assert (a.rank, b.rank) == (0, 1)
    assert (a.previous_version, b.previous_version) == (v2, v2)
    assert (a.previous_rank, b.previous_rank) == (0, 2)
    for r in (a, b):
        assert (r.left, r.joined) == ([1], [])
    r0.shutdown()
    r2.shutdown()
    pool.shutdown()


def test_a_participant_carries_its_segment(run_id: str) -> None:
    pool = ThreadPoolExecutor(2)
    base = f"mem://segments/{run_id}?min_workers=2&timeout=30s"
    workers = [rdzv.connect(f"{base}&segment=rack-1"), rdzv.connect(base)]
    rounds = [f.result(30) for f in [pool.submit(w.next_rendezvous) for w in workers]]
    segments = {p.node: p.segment for p in rounds[0].participants}
    assert segments == {workers[0].node_id: "rack-1", workers[1].node_id: None}, segments
    assert "rack-1" in repr(next(p for p in rounds[0].participants if p.segment))
    with pytest.raises(rdzv.RendezvousConfigError, match="segment"):
        rdzv.connect(f"{base}&segment=rack%201")
    for w in workers:
        w.shutdown()
