"""Real servers for the tests: etcd and redis-server, started on free loopback ports, and a
Slurm cluster of three nodes on this host (munged, slurmctld and three slurmd: slurm_cluster.py).

A missing binary fails the tests that need it (never skips): install them with
`scripts/setup.sh` (Debian's etcd-server, redis-server, slurmctld, slurmd, slurm-client and
munge)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

import pytest

import rdzv
from slurm_cluster import SlurmCluster, consecutive_free_ports

# How many times a server is started on newly chosen ports when one was taken between
# choosing and binding it (by another worker's server or an outgoing connection).
START_ATTEMPTS = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"`{name}` is not installed; run scripts/setup.sh (the tests need a real server)")
    return path


def _start_on_free_ports(
    count: int,
    command: Callable[[list[int]], list[str]],
    ready: Callable[[list[int]], tuple[str, str]],
    log: Path,
    cleanup: str | None = None,
) -> tuple[subprocess.Popen, list[int]]:
    """Runs `command(ports)` on `count` consecutive free ports outside the ephemeral range,
    logging to `log`, under a watchdog (`_watched`, which removes `cleanup` when the server
    ends), and waits until it answers at `ready(ports)` (a URL, and what the log says once
    this server listens: another server may answer on a port taken meanwhile). Starts again
    on other ports when one was taken."""
    for attempt in range(1, START_ATTEMPTS + 1):
        ports = consecutive_free_ports(count)
        log.unlink(missing_ok=True)
        with open(log, "wb") as out:
            proc = _watched(command(ports), out, cleanup)
        try:
            url, listening = ready(ports)
            _wait_ready(url, listening, proc, log)
            return proc, ports
        except RuntimeError as e:
            _stop(proc)
            if "address already in use" not in str(e).lower() or attempt == START_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def _wait_ready(url: str, listening: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 30
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {log.read_text()[-2000:]}")
        text = log.read_text(errors="replace")
        if "address already in use" in text.lower():
            raise RuntimeError(f"a port of the server was taken: {text[-2000:]}")
        if listening not in text:
            time.sleep(0.1)
            continue
        try:
            store = rdzv.open_store(url)
            store.set_timeout(2)
            store.set("ping", "1")
            return
        except rdzv.Error as e:
            last = e
            time.sleep(0.2)
    raise RuntimeError(f"server at {url} did not answer within 30 s: {last}")


# Runs the server (`"$0" "$@"`) in the background and ends it with SIGTERM when its own
# stdin closes: when `_stop` closes it, and also when the test process dies without running
# its fixtures' cleanup (SIGKILL, a CI timeout), since the kernel then closes the pipe. Once
# the server has exited, for whatever reason, removes `$RDZV_CLEANUP` (the server's data,
# 123 MiB of etcd's on tmpfs) if set, and exits with the server's status. A killed pytest
# used to leave its servers running, holding their ports and that memory.
WATCHDOG = r"""
exec 3<&0  # an asynchronous command's stdin is /dev/null unless redirected from elsewhere
"$0" "$@" 3<&- &
server=$!
(while read -r _; do :; done; kill "$server" 2>/dev/null) <&3 3<&- &
reader=$!
wait "$server"
status=$?
kill "$reader" 2>/dev/null  # lest it signal the server's number, reused, at its end of input
# The wheel's checks run the tests with a PATH of the venv and etcd only: find rm anyway.
if [ -n "$RDZV_CLEANUP" ]; then PATH="$PATH:/usr/bin:/bin" rm -rf "$RDZV_CLEANUP"; fi
exit "$status"
"""


def _watched(command: list[str], out: BinaryIO, cleanup: str | None) -> subprocess.Popen:
    """`command` started under `WATCHDOG`, in a process group of its own (so that `_stop`
    can kill the server and its watchdog together), its output to `out`."""
    env = dict(os.environ, RDZV_CLEANUP=cleanup or "")
    return subprocess.Popen(
        ["/bin/sh", "-c", WATCHDOG, *command],
        stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )  # fmt: skip


def _stop(proc: subprocess.Popen) -> None:
    """Ends a `_watched` server: SIGTERM through its watchdog, SIGKILL to both after 10 s."""
    assert proc.stdin is not None
    proc.stdin.close()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`host:port` of a fresh single-member etcd."""
    binary = _binary("etcd")
    d = tmp_path_factory.mktemp("etcd")
    # etcd fsyncs its log on every commit: on a busy disk one fsync has taken 5.7 s,
    # which expires the 2 s leases of some tests. On tmpfs (as in the Rust harness)
    # a commit waits for no disk.
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    data = tempfile.mkdtemp(prefix="rdzv-py-etcd-", dir=shm)

    def command(ports: list[int]) -> list[str]:
        client, peer, metrics = ports
        c, p = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        shutil.rmtree(data, ignore_errors=True)  # a start that gave up may have begun it
        return [
            binary, "--name", "n0", "--data-dir", data,
            "--listen-client-urls", c, "--advertise-client-urls", c,
            "--listen-peer-urls", p, "--initial-advertise-peer-urls", p,
            "--initial-cluster", f"n0={p}", "--initial-cluster-state", "new",
            "--listen-metrics-urls", f"http://127.0.0.1:{metrics}", "--log-level", "info",
        ]  # fmt: skip

    def ready(ports: list[int]) -> tuple[str, str]:
        # etcd logs the address each client listener serves on, once it does.
        return f"etcd://127.0.0.1:{ports[0]}/ready", f'"address":"127.0.0.1:{ports[0]}"'

    try:
        proc, ports = _start_on_free_ports(3, command, ready, d / "log", cleanup=data)
    except BaseException:
        shutil.rmtree(data, ignore_errors=True)
        raise
    try:
        yield f"127.0.0.1:{ports[0]}"
    finally:
        _stop(proc)
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="session")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`host:port` of a fresh redis-server."""
    binary = _binary("redis-server")
    d = tmp_path_factory.mktemp("redis")

    def command(ports: list[int]) -> list[str]:
        return [
            binary, "--port", str(ports[0]), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(d),
        ]  # fmt: skip

    def ready(ports: list[int]) -> tuple[str, str]:
        return f"redis://127.0.0.1:{ports[0]}/ready", "Ready to accept connections"

    proc, ports = _start_on_free_ports(1, command, ready, d / "log")
    try:
        yield f"127.0.0.1:{ports[0]}"
    finally:
        _stop(proc)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A fresh Slurm cluster of three nodes, n1..n3, of 2 CPUs each, in the partition `test`;
    submit through its helpers or with its `env` (which names its slurm.conf)."""
    # Its Unix sockets live in this directory; pytest's (under /tmp, about 40 characters,
    # with an xdist worker's folder) keeps them well under the 107 a socket's path may have.
    cluster = SlurmCluster.start(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(params=["etcd", "redis"])
def endpoint(request: pytest.FixtureRequest) -> str:
    """An rdzv endpoint URL without run id, on each real backend."""
    return f"{request.param}://{request.getfixturevalue(request.param)}"


@pytest.fixture
def run_id(request: pytest.FixtureRequest) -> str:
    """A run id of its own for each test (and each parametrization)."""
    name = "".join(ch if ch.isalnum() else "-" for ch in request.node.name)
    return f"{name[:60]}-{os.getpid()}-{time.monotonic_ns() % 10**9}"


REPO = Path(__file__).resolve().parents[3]


class Link:
    """A node's way to its servers through `rdzv-netfault` (crates/rdzv-netfault): `freeze()`
    cuts it off — no byte flows, nothing is reset, as in a partition — `heal()` ends that,
    `cut()` resets every open connection. Connect through `endpoints` instead of the servers.
    Use as a context manager; the process ends when its stdin closes."""

    def __init__(self, *targets: str) -> None:
        binary = os.environ.get("RDZV_NETFAULT_BIN") or str(REPO / "target" / "debug" / "rdzv-netfault")
        if not os.access(binary, os.X_OK):
            raise RuntimeError(f"no rdzv-netfault at {binary}: run `cargo build -p rdzv-netfault` first")
        self._proc = subprocess.Popen(
            [binary, *targets], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        assert self._proc.stdout is not None
        self.endpoints: list[str] = self._proc.stdout.readline().split()
        if len(self.endpoints) != len(targets):
            raise RuntimeError(f"rdzv-netfault did not start (exit {self._proc.poll()})")

    @property
    def endpoint_list(self) -> str:
        """`host:port,host:port` for a URL."""
        return ",".join(self.endpoints)

    def _command(self, command: str) -> str:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(command + "\n")
        answer = self._proc.stdout.readline().strip()
        if not answer.startswith("ok"):
            raise RuntimeError(f"rdzv-netfault {command}: {answer!r}")
        return answer

    def freeze(self) -> None:
        self._command("freeze")

    def heal(self) -> None:
        self._command("heal")

    def cut(self) -> int:
        return int(self._command("cut").split()[1])

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def __enter__(self) -> "Link":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
