"""Real servers for the tests: etcd and redis-server, started on free loopback ports, and a
Slurm cluster of three nodes on this host (munged, slurmctld and three slurmd: slurm_cluster.py).

A missing binary fails the tests that need it (never skips): install them with
`scripts/setup.sh` (Debian's etcd-server, redis-server, slurmctld, slurmd, slurm-client and
munge)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

import rdzv
from slurm_cluster import SlurmCluster


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"`{name}` is not installed; run scripts/setup.sh (the tests need a real server)")
    return path


def _wait_ready(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 30
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            store = rdzv.open_store(url)
            store.set_timeout(2)
            store.set("ping", "1")
            return
        except rdzv.Error as e:
            last = e
            time.sleep(0.2)
    raise RuntimeError(f"server at {url} did not answer within 30 s: {last}")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
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
    client, peer, metrics = free_port(), free_port(), free_port()
    c, p = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    log = d / "log"
    cmd = [
        binary, "--name", "n0", "--data-dir", data,
        "--listen-client-urls", c, "--advertise-client-urls", c,
        "--listen-peer-urls", p, "--initial-advertise-peer-urls", p,
        "--initial-cluster", f"n0={p}", "--initial-cluster-state", "new",
        "--listen-metrics-urls", f"http://127.0.0.1:{metrics}", "--log-level", "warn",
    ]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_ready(f"etcd://127.0.0.1:{client}/ready", proc, log)
        yield f"127.0.0.1:{client}"
    finally:
        _stop(proc)
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="session")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`host:port` of a fresh redis-server."""
    binary = _binary("redis-server")
    d = tmp_path_factory.mktemp("redis")
    port = free_port()
    log = d / "log"
    cmd = [
        binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
        "--appendonly", "no", "--dir", str(d), "--logfile", str(log),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        _wait_ready(f"redis://127.0.0.1:{port}/ready", proc, log)
        yield f"127.0.0.1:{port}"
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
