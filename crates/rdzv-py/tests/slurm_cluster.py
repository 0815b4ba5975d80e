"""A real Slurm cluster on this one host, for the tests: munged, slurmctld and one slurmd per
node (n1, n2, ...), all on 127.0.0.1, with their own munge key, slurm.conf, ports and state
in a directory of the test's. Clients reach it through `SLURM_CONF` (`SlurmCluster.env`).

Several clusters can run side by side (pytest-xdist workers): each has its own munge socket
and key, and its ports are chosen at random outside the kernel's ephemeral range.
A missing binary fails (never skips): scripts/setup.sh installs them."""

from __future__ import annotations

import os
import pwd
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scancel", "scontrol", "sinfo", "squeue")
NOT_INSTALLED = (
    "Slurm is not installed: run scripts/setup.sh "
    "(it installs Debian's slurmctld, slurmd, slurm-client and munge)"
)
FINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"}
)
READY_TIMEOUT = 30.0
COMMAND_TIMEOUT = 30.0
STOP_GRACE = 10.0
# Below this, ports are commonly taken by system services (as in rdzv-core's testing/ports.rs).
LOWEST_PORT = 10_000
# A Unix socket's path holds at most 107 bytes; slurmd's step sockets
# (SPOOL/nN/nN_JOB.STEP) are the longest this cluster makes.
MAX_SOCKET_PATH = 100
START_ATTEMPTS = 3


@dataclass
class SlurmCluster:
    """A started cluster of `nodes` nodes n1..nN in one partition, `test`, of 2 CPUs each.
    Make one with `start`; `stop` (or leaving the `with` block) ends it and every process of
    its jobs."""

    directory: Path
    nodes: int
    conf: Path
    env: dict[str, str] = field(repr=False)
    binaries: dict[str, str] = field(repr=False)
    _daemons: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)
    _reaper: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @classmethod
    def start(cls, directory: Path, nodes: int = 3, proctrack: str = "linuxproc") -> SlurmCluster:
        """Starts a cluster in `directory` (created if missing; what an earlier cluster left
        there is replaced) and returns once `sinfo` reports all `nodes` nodes idle.
        `proctrack` is its ProctrackType plugin: `linuxproc` signals every process of a step
        (as `cgroup`, the usual one, does), `pgid` only the task's process group.

        Raises RuntimeError when Slurm is not installed, or when the cluster is not ready
        within 30 s (with the tails of the daemons' logs); no process is left running then.
        Raises ValueError when `directory` is too long a path for the Unix sockets in it."""
        binaries = find_binaries(search_path())
        directory = directory.resolve()
        _check_socket_paths(directory, nodes)
        for attempt in range(1, START_ATTEMPTS + 1):
            cluster = cls._launch(directory, nodes, binaries, proctrack)
            try:
                cluster._wait_ready()
                return cluster
            except RuntimeError:
                # Ports are free when chosen but can be taken before a daemon binds them
                # (another worker's cluster, an outgoing connection): choose again then.
                clash = "Address already in use" in cluster.logs_tail()
                cluster.stop()
                if not clash or attempt == START_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    @classmethod
    def _launch(cls, directory: Path, nodes: int, binaries: dict[str, str], proctrack: str) -> SlurmCluster:
        _fresh_directories(directory, nodes)
        key = directory / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)  # munged refuses a key others can read
        ctld_port, node_ports = _choose_ports(nodes)
        conf = directory / "slurm.conf"
        conf.write_text(_slurm_conf(directory, nodes, ctld_port, node_ports, proctrack))
        cluster = cls(directory, nodes, conf, _client_env(conf), binaries)
        try:
            cluster._reaper = _start_reaper(conf)
            cluster._spawn_daemons(key)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _spawn_daemons(self, key: Path) -> None:
        d = self.directory
        b = self.binaries
        # -F: in the foreground, as our child, logging to its stderr (log/munged.out);
        # -f: run although we are root and the directories' permissions are not what munged
        # wants of a system daemon's.
        self._spawn("munged", [
            b["munged"], "-F", "-f", f"--socket={d / 'munge.sock'}", f"--key-file={key}",
            f"--pid-file={d / 'munged.pid'}", f"--seed-file={d / 'munged.seed'}",
        ])  # fmt: skip
        self._wait_for_file(d / "munge.sock", "munged")
        self._spawn("slurmctld", [b["slurmctld"], "-D", "-f", str(self.conf)])
        for name in self.node_names:
            self._spawn(f"slurmd.{name}", [b["slurmd"], "-D", "-N", name, "-f", str(self.conf)])

    def _spawn(self, name: str, cmd: list[str]) -> None:
        """Starts a daemon in a process group of its own (so that stopping it reaches its
        helpers, e.g. slurmscriptd), its stdout and stderr in log/NAME.out: what a daemon
        says before it opens its log file (a bad slurm.conf) lands there."""
        with open(self.directory / "log" / f"{name}.out", "wb") as out:
            self._daemons[name] = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=self.env, cwd=self.directory, start_new_session=True,
            )  # fmt: skip

    def _wait_for_file(self, path: Path, daemon: str) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while not path.exists():
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{daemon} made no {path} within {READY_TIMEOUT:.0f} s\n{self.logs_tail()}")
            time.sleep(0.05)

    def _check_alive(self) -> None:
        for name, proc in self._daemons.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode} while starting\n{self.logs_tail()}")

    def _wait_ready(self) -> None:
        """Returns once all nodes are idle: registered with slurmctld, ready for jobs."""
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            self._check_alive()
            result = self._run(["sinfo", "-h", "-o", "%T %D"], check=False)
            if result.returncode == 0 and _idle_count(result.stdout) == self.nodes:
                return
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        self._check_alive()  # a daemon that died while sinfo waited says more than a timeout
        seen = (result.stdout + result.stderr).strip()
        raise RuntimeError(
            f"the Slurm cluster in {self.directory} did not get its {self.nodes} nodes idle "
            f"within {READY_TIMEOUT:.0f} s (sinfo: {seen!r})\n{self.logs_tail()}"
        )

    @property
    def node_names(self) -> list[str]:
        return [f"n{i}" for i in range(1, self.nodes + 1)]

    def sbatch(self, script: Path, *args: str, env: dict[str, str] | None = None) -> str:
        """Submits `script` with the sbatch options `args` (they go before the script) and
        returns the job id. `env` is the submitter's whole environment, which the job
        inherits (sbatch's default --export=ALL); it defaults to `self.env`, and its
        SLURM_CONF is always this cluster's. sbatch runs in `self.directory`, so a job
        without --chdir or --output works and writes its output there."""
        environment = dict(self.env if env is None else env)
        environment["SLURM_CONF"] = str(self.conf)
        result = self._run(["sbatch", "--parsable", *args, str(script)], env=environment)
        # --parsable prints "JOB" or "JOB;CLUSTER".
        return result.stdout.strip().split(";")[0]

    def job_state(self, job_id: str) -> tuple[str, str]:
        """(JobState, ExitCode) of a job slurmctld still knows (for 300 s after it ends),
        e.g. ("COMPLETED", "0:0"): ExitCode is the batch script's "STATUS:SIGNAL"."""
        text = self._run(["scontrol", "show", "job", "-o", job_id]).stdout
        state = re.search(r"(?:^|\s)JobState=(\S+)", text)
        exit_code = re.search(r"(?:^|\s)ExitCode=(\S+)", text)
        if state is None or exit_code is None:
            raise RuntimeError(f"`scontrol show job -o {job_id}` gave no JobState or ExitCode: {text!r}")
        return state.group(1), exit_code.group(1)

    def wait_job(self, job_id: str, timeout: float) -> tuple[str, str]:
        """Polls until the job's state is final (COMPLETED, FAILED, CANCELLED, ...) and
        returns (JobState, ExitCode). Raises TimeoutError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            state, exit_code = self.job_state(job_id)
            if state in FINAL_STATES:
                return state, exit_code
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"job {job_id} is still {state} after {timeout:.0f} s\n{self._tail('slurmctld.log')}"
                )
            time.sleep(0.2)

    def steps(self, job_id: str) -> list[str]:
        """The job's running steps as "JOB.STEP" (its srun steps; not the batch or extern
        step), in squeue's order; empty once the job has ended."""
        out = self._run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i"], check=False).stdout
        return [s for s in out.split() if not s.endswith((".batch", ".extern"))]

    def scancel(self, target: str, signal: str | None = None) -> None:
        """`scancel [--signal=SIGNAL] TARGET`: TARGET is a job ("12") or a step ("12.0");
        without `signal` it is cancelled, with one only signalled. Raises RuntimeError when
        scancel fails, as it does signalling a step that is not there (cancelling a job that is
        not there it takes for done)."""
        # --ctld: without it scancel signals a step through the slurmd's itself, and Slurm
        # 22.05 then delivers the signal but exits 225, "Invalid job id specified".
        option = [] if signal is None else ["--ctld", f"--signal={signal}"]
        self._run(["scancel", *option, target])

    def logs_tail(self, lines: int = 30) -> str:
        """The last `lines` lines of each daemon's log, for a failure message: its log file,
        or its output where it has none (munged, or a daemon that failed before opening it;
        under -D the daemons write the same lines to both, the file with times)."""
        names = ["munged", "slurmctld", *(f"slurmd.{n}" for n in self.node_names)]
        tails = (self._tail(f"{name}.log", lines) or self._tail(f"{name}.out", lines) for name in names)
        return "\n".join(filter(None, tails))

    def _tail(self, name: str, lines: int = 30) -> str:
        try:
            text = (self.directory / "log" / name).read_text(errors="replace")
        except OSError:
            return ""
        if not text.strip():
            return ""
        return f"--- {name} (last {lines} lines) ---\n" + "\n".join(text.splitlines()[-lines:])

    def _run(
        self, cmd: list[str], *, env: dict[str, str] | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Runs a Slurm client with a time limit; raises RuntimeError (with its stderr) when
        it fails and `check` is set, or when it does not finish in time."""
        full = [self.binaries[cmd[0]], *cmd[1:]]
        try:
            result = subprocess.run(
                full, env=env or self.env, cwd=self.directory, capture_output=True, text=True,
                timeout=COMMAND_TIMEOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"`{' '.join(cmd)}` did not finish within {COMMAND_TIMEOUT:.0f} s") from e
        if check and result.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` failed (exit {result.returncode}): {result.stderr.strip()}")
        return result

    def stop(self) -> None:
        """Cancels every job, stops the daemons (SIGTERM, SIGKILL after 10 s) and kills what
        is left of the jobs' processes. Never raises; stopping twice is harmless."""
        if self._daemons:
            self._stop_daemons()
        if self._reaper is not None:
            # Everything it would kill is gone: `_stop_daemons` ends with the same sweep.
            self._reaper.kill()
            self._reaper.wait()
            self._reaper = None

    def _stop_daemons(self) -> None:
        ctld = self._daemons.get("slurmctld")
        # Without slurmctld (it failed to start) there are no jobs, and each client
        # would wait for it until its timeout.
        if ctld is not None and ctld.poll() is None:
            try:
                self._cancel_all_jobs()
            except Exception:
                pass  # what it leaves running, the kill below ends
        # slurmd's first (they report to slurmctld), munged last (all of them use it).
        nodes = [n for n in self._daemons if n.startswith("slurmd.")]
        for tier in (nodes, ["slurmctld"], ["munged"]):
            _terminate([self._daemons[n] for n in tier if n in self._daemons])
        self._daemons.clear()
        _kill_stragglers(self.conf)

    def _cancel_all_jobs(self) -> None:
        """Cancels the jobs and waits (bounded) until slurmctld has none left running, so that
        their processes end the way Slurm ends them: SIGTERM, then SIGKILL after KillWait."""
        user = pwd.getpwuid(os.getuid()).pw_name
        self._run(["scancel", "-u", user], check=False)
        deadline = time.monotonic() + STOP_GRACE
        while time.monotonic() < deadline:
            if not self._run(["squeue", "-h", "-o", "%i"], check=False).stdout.strip():
                return
            time.sleep(0.2)

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def search_path() -> str:
    """Where the binaries are looked for: PATH, and the daemons' /usr/sbin, which a user's
    PATH may lack."""
    return os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


def find_binaries(path: str) -> dict[str, str]:
    """Slurm's and munge's binaries on the search path `path`; raises RuntimeError naming
    the missing ones and how to install them."""
    found = {name: shutil.which(name, path=path) for name in BINARIES}
    missing = [name for name, where in found.items() if where is None]
    if missing:
        raise RuntimeError(f"{NOT_INSTALLED}; missing: {', '.join(missing)}")
    return {name: where for name, where in found.items() if where is not None}


def _check_socket_paths(directory: Path, nodes: int) -> None:
    longest = directory / "spool" / f"n{nodes}" / f"n{nodes}_4294967294.4294967294"
    if len(str(longest)) > MAX_SOCKET_PATH:
        raise ValueError(
            f"{directory} is too long a path for the cluster's Unix sockets (such as {longest}, "
            f"over {MAX_SOCKET_PATH} characters): start the cluster in a shorter directory"
        )


def _fresh_directories(directory: Path, nodes: int) -> None:
    # An earlier cluster's state would bring its jobs back; its logs would mislead.
    for sub in ("state", "spool", "log"):
        shutil.rmtree(directory / sub, ignore_errors=True)
    for sub in ["state", "log", *(f"spool/n{i}" for i in range(1, nodes + 1))]:
        (directory / sub).mkdir(parents=True, exist_ok=True)
    for stale in ("munge.sock", "munge.sock.lock"):
        (directory / stale).unlink(missing_ok=True)


def _client_env(conf: Path) -> dict[str, str]:
    """os.environ with SLURM_CONF pointing at `conf`. The Slurm variables of a job this
    process may itself run in are dropped: they would make srun and sbatch act on that
    job instead of this cluster's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))}
    env["SLURM_CONF"] = str(conf)
    return env


def _slurm_conf(d: Path, nodes: int, ctld_port: int, node_ports: list[int], proctrack: str) -> str:
    user = pwd.getpwuid(os.getuid()).pw_name
    last = node_ports[-1]
    return f"""\
ClusterName=rdzvtest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
# Each node has a port of its own (NodeName's Port=), which overrides this one.
SlurmdPort={node_ports[0]}
AuthType=auth/munge
AuthInfo=socket={d / 'munge.sock'}
CredType=cred/munge
SlurmUser={user}
SlurmdUser={user}
StateSaveLocation={d / 'state'}
SlurmdSpoolDir={d / 'spool'}/%n
SlurmctldPidFile={d / 'slurmctld.pid'}
SlurmdPidFile={d}/slurmd.%n.pid
SlurmctldLogFile={d / 'log' / 'slurmctld.log'}
SlurmdLogFile={d / 'log'}/slurmd.%n.log
ProctrackType=proctrack/{proctrack}
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
KillWait=5
SlurmdParameters=config_overrides
NodeName=n[1-{nodes}] NodeHostname=localhost NodeAddr=127.0.0.1 Port={node_ports[0]}-{last} CPUs=2 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""


def _idle_count(sinfo: str) -> int:
    """Nodes `sinfo -h -o '%T %D'` reports idle ("idle*" is one not responding)."""
    pairs = (line.split() for line in sinfo.splitlines())
    return sum(int(p[1]) for p in pairs if len(p) == 2 and p[0] == "idle" and p[1].isdigit())


def _choose_ports(nodes: int) -> tuple[int, list[int]]:
    """A free port for slurmctld and `nodes` consecutive free ones for the slurmd's (Slurm
    takes the nodes' ports as a range), all outside the kernel's ephemeral range: a port in
    it can be handed to any outgoing connection while a daemon is not yet listening. Random,
    so that clusters started side by side rarely choose the same."""
    low, high = _candidate_range()
    held: list[socket.socket] = []  # held open until all are chosen, so that they differ
    try:
        ctld = _free_run(1, low, high, held)
        node_ports = _free_run(nodes, low, high, held)
    finally:
        for s in held:
            s.close()
    return ctld[0], node_ports


def consecutive_free_ports(length: int) -> list[int]:
    """`length` consecutive ports free now, outside the kernel's ephemeral range, chosen at
    random (for a server the test starts, as `_choose_ports` chooses the daemons')."""
    held: list[socket.socket] = []
    try:
        return _free_run(length, *_candidate_range(), held)
    finally:
        for s in held:
            s.close()


def _candidate_range() -> tuple[int, int]:
    """LOWEST_PORT up to the start of the ephemeral range, or the ports above it when
    those are more."""
    try:
        first, last = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        first, last = 32768, 60999  # Linux's default
    below, above = first - LOWEST_PORT, 65535 - last
    if max(below, above) <= 0:
        raise RuntimeError(f"the ephemeral port range {first}-{last} leaves no ports for the Slurm daemons")
    return (LOWEST_PORT, first - 1) if below >= above else (last + 1, 65535)


def _free_run(length: int, low: int, high: int, held: list[socket.socket]) -> list[int]:
    """`length` consecutive ports in low..high that can be bound now, bound into `held`."""
    span = high - low + 1 - (length - 1)
    offset = random.randrange(span)
    for step in range(span):
        start = low + (offset + step) % span
        run: list[socket.socket] = []
        for port in range(start, start + length):
            s = None if _claimed(port) else _bind(port)
            if s is None:
                break
            run.append(s)
        held.extend(run)  # closed by the caller, whether the run is whole or not
        if len(run) == length:
            return list(range(start, start + length))
    raise RuntimeError(f"no {length} consecutive free ports in {low}..{high} for the Slurm daemons")


def _claimed(port: int) -> bool:
    """Whether a live process claimed `port` for a test server of the Rust tests, which may
    be down for an outage test and will start again on it (rdzv-core's testing/ports.rs)."""
    try:
        pid = int((Path(tempfile.gettempdir()) / "rdzv-test-ports" / str(port)).read_text().strip())
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return True  # being written: its process is alive
    return Path(f"/proc/{pid}").exists()


def _bind(port: int) -> socket.socket | None:
    # On all addresses, as the daemons listen: a port taken on any address is not free.
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", port))
        return s
    except OSError:
        s.close()
        return None


def _terminate(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to each process's group, SIGKILL to those still there after 10 s."""
    for proc in procs:
        _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        # The group too: a helper (slurmscriptd) can outlive its daemon.
        _signal_group(proc, signal.SIGKILL)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)  # its group's id is its pid: start_new_session
    except OSError:
        pass  # the group is gone


def _start_reaper(conf: Path) -> subprocess.Popen[bytes]:
    """This module run as the reaper of the cluster of `conf` (`__main__` below): it waits for
    the end of its stdin, which comes only when the test process dies without stopping the
    cluster (SIGKILL, a CI timeout; `stop` kills the reaper instead), and then kills every
    process of the cluster. The daemons run in sessions of their own and would otherwise outlive such a test
    process, holding their ports. In a session of its own too, so that a Ctrl-C meant for
    pytest, which stops the cluster itself, does not end it first."""
    return subprocess.Popen(
        [sys.executable, __file__, str(conf)], stdin=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip


def _kill_stragglers(conf: Path) -> None:
    """SIGKILLs every process whose environment names `conf`: slurmstepd's and job
    processes that left the daemons' process groups (slurmstepd starts sessions of its own)
    and outlived them. Their environments have our SLURM_CONF: the daemons' is
    `_client_env`, and a job's is its submitter's, with SLURM_CONF forced by `sbatch`."""
    entry = f"SLURM_CONF={conf}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if entry in (proc / "environ").read_bytes().split(b"\0"):
                os.kill(int(proc.name), signal.SIGKILL)
        except OSError:
            pass  # gone, or not ours to read


if __name__ == "__main__":
    # The reaper of `_start_reaper`.
    sys.stdin.buffer.read()
    _kill_stragglers(Path(sys.argv[1]))
