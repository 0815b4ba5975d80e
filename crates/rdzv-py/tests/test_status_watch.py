"""`rdzv status --watch` on a real etcd: through a pseudo-terminal, the screen is cleared and
redrawn as the run changes (a round forms, a member leaves, a spare waits, the run closes),
with the last changes listed; through a pipe, each new snapshot follows the last, as text or
one JSON object per line; SIGINT or SIGTERM ends it with exit code 0."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import threading
import time

import rdzv
from test_rdzv_run import rdzv_binary

CLEAR = "\x1b[H\x1b[2J"


class Output:
    """What a process writes to `fd`, read as it comes by a thread."""

    def __init__(self, fd: int) -> None:
        self.fd, self.text, self._lock = fd, "", threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            ready, _, _ = select.select([self.fd], [], [], 0.5)
            if not ready:
                continue
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # the pty's other side closed
                return
            if not chunk:
                return
            with self._lock:
                self.text += chunk.decode(errors="replace")

    def until(self, what: str, check, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                text = self.text
            if check(text):
                return text
            assert time.monotonic() < deadline, f"timed out waiting for {what}; output:\n{text[-3000:]}"
            time.sleep(0.05)


def objects(text: str) -> list[dict]:
    """The JSON objects of the complete lines of `text`."""
    return [json.loads(line) for line in text.split("\n")[:-1]]


def two_members(url: str) -> tuple[rdzv.Rendezvous, rdzv.Rendezvous]:
    a, b = rdzv.connect(url), rdzv.connect(url)
    t = threading.Thread(target=b.next_rendezvous)
    t.start()
    a.next_rendezvous()
    t.join(30)
    return a, b


def test_a_terminal_is_redrawn_on_each_change(etcd: str, run_id: str) -> None:
    url = f"etcd://{etcd}/{run_id}?min_workers=2&max_workers=2&keep_alive_ttl=3s&last_call_timeout=0.2s"
    master, slave = pty.openpty()
    proc = subprocess.Popen([rdzv_binary(), "status", url, "--watch"], stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    out = Output(master)
    try:
        out.until("the first screen", lambda t: CLEAR in t and "no round yet" in t and "watching" in t)
        a, b = two_members(url)
        screen = out.until("the round", lambda t: "round 1 formed: 2 members" in t.split(CLEAR)[-1])
        last = screen.split(CLEAR)[-1]
        assert "round 1 is final" in last and "members (2 of 2 alive, max 2)" in last, last
        spare = rdzv.connect(url)
        waiting = threading.Thread(target=lambda: spare.next_rendezvous())
        waiting.start()
        out.until("the spare", lambda t: "waits as a spare" in t.split(CLEAR)[-1] and "spares: 1" in t.split(CLEAR)[-1])
        b.shutdown()
        # The spare takes b's place in round 2, with a.
        assert a.round_broken(timeout=10) in ("member_gone", "ended")
        a.next_rendezvous()
        out.until("the next round", lambda t: "round 2 formed: 2 members" in t.split(CLEAR)[-1])
        a.set_closed("succeeded")
        screen = out.until("the close", lambda t: "run closed (succeeded)" in t.split(CLEAR)[-1])
        last = screen.split(CLEAR)[-1]
        # The last changes, in order, on the last screen.
        order = [last.index(s) for s in ("round 1 formed", "waits as a spare", "round 2 formed", "run closed")]
        assert order == sorted(order), last
        assert screen.count(CLEAR) >= 5, "one redraw per change"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
        waiting.join(30)
        a.shutdown()
        spare.shutdown()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def test_a_pipe_gets_each_snapshot_after_the_last(etcd: str, run_id: str) -> None:
    url = f"etcd://{etcd}/{run_id}?min_workers=2&max_workers=2&keep_alive_ttl=3s&last_call_timeout=0.2s"
    text = subprocess.Popen([rdzv_binary(), "status", url, "--watch"], stdout=subprocess.PIPE)
    lines = subprocess.Popen([rdzv_binary(), "status", url, "--watch", "--format", "json"], stdout=subprocess.PIPE)
    assert text.stdout is not None and lines.stdout is not None
    plain, jsonl = Output(text.stdout.fileno()), Output(lines.stdout.fileno())
    try:
        plain.until("the first snapshot", lambda t: "no round yet" in t)
        jsonl.until("the first snapshot", lambda t: t.count("\n") >= 1)
        a, b = two_members(url)
        # Each change is made once both watchers showed the last: a watcher still reading
        # when the next change comes shows the two as one snapshot (the 100 ms settle).
        plain.until("the round", lambda t: "round 1 is final" in t)
        jsonl.until("the round", lambda t: '"state":"final"' in t)
        b.shutdown()
        plain.until("b lost", lambda t: "(rank" in t and "lost" in t)
        jsonl.until("b lost", lambda t: any(s["state"] == "final" and len(s["joined"]) == 1 for s in objects(t)))
        a.set_closed()
        plain.until("the close", lambda t: "run closed" in t)
        got = jsonl.until("the close", lambda t: '"state":"closed"' in t)
        snapshots = [json.loads(line) for line in got.splitlines()]
        states = [s["state"] for s in snapshots]
        assert states[0] == "none" and states[-1] == "closed" and "final" in states, states
        assert all(a != b for a, b in zip(snapshots, snapshots[1:])), "only changes are printed"
        # The snapshots are `rdzv status --format json`'s, key for key.
        once = subprocess.run([rdzv_binary(), "status", url, "--format", "json"], capture_output=True, text=True, check=True)
        assert json.loads(once.stdout) == snapshots[-1]
        assert "\x1b" not in plain.text and plain.text.count("--- ") == len(snapshots), plain.text
        text.send_signal(signal.SIGTERM)
        lines.send_signal(signal.SIGINT)
        assert (text.wait(10), lines.wait(10)) == (0, 0)
        a.shutdown()
    finally:
        for p in (text, lines):
            if p.poll() is None:
                p.kill()
                p.wait()
