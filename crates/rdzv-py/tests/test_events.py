"""`Rendezvous.on_event`: each event of a worker, as a dict, on a thread of rdzv's own — in
order, with the GIL held only while the callback runs; a callback that raises is logged and
called again; a callback may make blocking calls on the handle it watches."""

from __future__ import annotations

import logging
import threading
import time

import pytest

import rdzv


def wait_for(what: str, check, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_callbacks_get_every_event_in_order(run_id: str, caplog: pytest.LogCaptureFixture) -> None:
    url = f"mem://events/{run_id}?min_workers=2&max_workers=2&keep_alive_ttl=3s&last_call_timeout=0.2s"
    a, b = rdzv.connect(url), rdzv.connect(url)
    seen_a: list[dict] = []
    seen_b: list[dict] = []
    closed_then: list[bool] = []

    def on_a(event: dict) -> None:
        seen_a.append(event)
        if event["event"] == "round_formed":
            # A blocking call on the same handle, from the callback's thread.
            closed_then.append(a.is_closed())

    def on_b(event: dict) -> None:
        seen_b.append(event)
        raise RuntimeError(f"callback fails on {event['event']}")

    a.on_event(on_a)
    b.on_event(on_b)
    with pytest.raises(TypeError):
        a.on_event("not callable")  # type: ignore[arg-type]
    t = threading.Thread(target=b.next_rendezvous)
    t.start()
    ra = a.next_rendezvous()
    t.join(30)
    # The callback runs on a thread of its own, some time after the round formed: the run
    # is closed only after it made its call (else what the call sees depends on timing).
    wait_for("a's callback's blocking call", lambda: closed_then)
    b.shutdown()
    assert a.round_broken(timeout=10) in ("member_gone", "ended")
    a.set_closed("succeeded")
    wait_for("a's events", lambda: [e["event"] for e in seen_a] == ["round_formed", "member_lost", "run_closed"])
    formed = seen_a[0]
    assert (formed["run_id"], formed["node"], formed["version"]) == (run_id, a.node_id, ra.version)
    assert (formed["rank"], formed["world_size"], formed["previous_version"]) == (ra.rank, 2, None)
    assert formed["time"].endswith("Z") and formed["seconds"] >= 0
    assert seen_a[1]["reason"] in ("member_gone", "ended")
    assert (seen_a[2]["outcome"], seen_a[2]["by_this_worker"]) == ("succeeded", True)
    assert closed_then == [False]
    # b's callback raised on each of its events: each was logged, and the next one came.
    wait_for("b's events", lambda: len(seen_b) >= 1)
    assert seen_b[0]["event"] == "round_formed"
    wait_for("the failures logged", lambda: any("callback fails on round_formed" in r.exc_text for r in caplog.records if r.exc_text))
    record = next(r for r in caplog.records if r.exc_text and "round_formed" in r.exc_text)
    assert record.name == "rdzv" and record.levelno == logging.ERROR
    a.shutdown()


def test_a_slow_callback_delays_nothing_but_itself(run_id: str) -> None:
    url = f"mem://events/{run_id}?min_workers=1&keep_alive_ttl=3s"
    w = rdzv.connect(url)
    release = threading.Event()
    seen: list[str] = []

    def slow(event: dict) -> None:
        release.wait(30)
        seen.append(event["event"])

    w.on_event(slow)
    started = time.monotonic()
    # Three rounds in a row, while the callback holds the first event.
    versions = [w.next_rendezvous().version for _ in range(3)]
    assert time.monotonic() - started < 5, "a blocked callback held up the rendezvous"
    assert versions == sorted(versions) and len(set(versions)) == 3
    assert seen == []
    release.set()
    wait_for("every event, in order", lambda: seen == ["round_formed"] * 3)
    w.shutdown()
