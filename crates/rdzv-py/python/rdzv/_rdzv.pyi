"""Type stubs of the native module ``rdzv._rdzv`` (re-exported by ``rdzv``)."""

from datetime import timedelta
from types import TracebackType
from typing import Any, Callable, Iterable, Literal, Optional, Union

__version__: str

Key = Union[str, bytes]
Value = Union[str, bytes]
Seconds = Union[float, int, timedelta]
BrokenReason = Literal["member_gone", "ended", "closed", "lease_lost", "left", "no_round", "unhealthy"]

class Error(Exception):
    """Base of every rdzv error."""

class RendezvousError(Error):
    """A rendezvous failed (base of the rendezvous errors)."""

class RendezvousClosedError(RendezvousError):
    """The run was closed; no round will form."""

    outcome: str | None
    """How the job ended, if its closer said so: ``"succeeded"``, ``"failed"``, or ``None``."""

class RendezvousTimeoutError(RendezvousError):
    """The call did not complete by its deadline (the ``timeout`` option)."""

class RendezvousUnavailableError(RendezvousError):
    """The backend could not be reached (retryable)."""

class RendezvousConfigError(RendezvousError):
    """A bad URL or option; the message says what is wrong and what is right."""

class RendezvousStateError(RendezvousError):
    """A value under the run's keys is corrupt."""

class RendezvousLeaseLostError(RendezvousError):
    """This worker's session lease was lost; it is no longer a member and must rejoin."""

class RendezvousShutdownError(RendezvousError):
    """The handle was shut down."""

class StoreError(Error):
    """A Store operation failed (base of the Store errors)."""

class StoreTimeoutError(StoreError):
    """A Store operation did not complete within its timeout."""

class StoreQueueEmptyError(StoreError):
    """A non-blocking ``queue_pop`` found the queue empty."""

class StoreUnavailableError(StoreError):
    """The Store's backend could not be reached (retryable)."""

def connect(url: str) -> Rendezvous:
    """Joins the run named by ``url`` (``etcd://host:2379/<run_id>?min_workers=2&max_workers=4``,
    ``etcds://``, ``redis://``, ``rediss://``, ``mem://<name>/<run_id>``) as one worker.
    Raises ``RendezvousConfigError`` for a bad URL, ``RendezvousUnavailableError`` when the
    server cannot be reached."""

def open_store(url: str) -> Store:
    """A Store on its own under the run named by ``url`` (no ``min_workers`` needed)."""

class Participant:
    """A member of a round."""

    @property
    def node(self) -> str: ...
    @property
    def addr(self) -> str: ...
    @property
    def pid(self) -> int: ...
    @property
    def port(self) -> Optional[int]: ...
    @property
    def segment(self) -> Optional[str]:
        """Its segment (an NVLink domain, a rack: the ``segment`` option), if it named one."""

class Round:
    """This worker's place in a completed round."""

    @property
    def run_id(self) -> str: ...
    @property
    def version(self) -> int:
        """The round's number; only grows."""
    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def participants(self) -> list[Participant]:
        """The members in rank order."""
    @property
    def master_addr(self) -> str:
        """Rank 0's advertised address (``MASTER_ADDR``)."""
    @property
    def master_port(self) -> int:
        """A port that was free on rank 0's machine (``MASTER_PORT``)."""
    @property
    def previous_version(self) -> int | None:
        """The round ``previous_rank``, ``left`` and ``joined`` compare with: the last round this
        worker was a member of, or else the last running round it waited on (``None``: its
        first round)."""
    @property
    def previous_rank(self) -> int | None:
        """This worker's rank in ``previous_version`` (``None``: it was not a member of it). A
        member keeps its rank while it is below the new world size."""
    @property
    def left(self) -> list[int]:
        """Ranks of ``previous_version`` whose members are not in this round, ascending."""
    @property
    def joined(self) -> list[int]:
        """Ranks of this round whose members were not in ``previous_version``, ascending."""
    @property
    def store(self) -> Store:
        """The round's private Store; rank 0 has published MASTER_ADDR/MASTER_PORT in it."""

class Rendezvous:
    """One worker's handle on a run. A context manager: leaving the ``with`` block shuts it
    down (leaves the run without closing it)."""

    @property
    def run_id(self) -> str: ...
    @property
    def node_id(self) -> str: ...
    @property
    def local_addr(self) -> str: ...
    @property
    def backend(self) -> str:
        """``"etcd"``, ``"redis"`` or ``"mem"``."""
    @property
    def timeout(self) -> float:
        """The deadline of one ``next_rendezvous``, in seconds."""
    @property
    def keep_alive_ttl(self) -> float:
        """How long a silent worker stays a member, in seconds."""
    def next_rendezvous(self) -> Round:
        """Blocks until a round completes with this worker in it (leaving its current round
        first, if any). Raises ``RendezvousClosedError``, ``RendezvousTimeoutError``,
        ``RendezvousShutdownError``, ``RendezvousStateError``."""
    def is_closed(self) -> bool: ...
    def set_closed(self, outcome: str | None = None) -> None:
        """Closes the run for every worker; ``outcome`` (``"succeeded"`` or ``"failed"``) says how
        the job ended, which the workers still waiting learn (``RendezvousClosedError.outcome``).
        A closed run keeps its outcome, except that ``"failed"`` replaces ``"succeeded"``. The run
        stays closed for ``run_ttl`` after its last worker is gone."""
    def run_outcome(self) -> str | None:
        """How the job ended, as the run's close says: ``"succeeded"``, ``"failed"``, or ``None``
        while the run is open (or was closed without saying)."""
    def num_nodes_waiting(self) -> int:
        """How many waiting workers the next round could admit while the current one runs: 0
        for a full, intact round (the workers beyond ``max_workers`` are spares, admitted only
        when a member dies or leaves)."""
    def shutdown(self) -> None:
        """Leaves the run at once (the others learn it); does not close the run."""
    def on_event(self, callback: Callable[[dict[str, Any]], object]) -> None:
        """Calls ``callback(event)`` with each event of this worker from now on (round formed,
        spare promoted, member lost, run closed, lease refresh failed: see
        docs/OBSERVABILITY.md), one at a time and in order, on a thread of its own. ``event`` is
        a dict: ``time`` (RFC 3339, UTC), ``run_id``, ``node``, ``event`` (the name) and the
        event's fields. A callback that raises is logged on the ``rdzv`` logger and called
        again for the next event; it may make blocking calls on this handle. A callback that
        holds this handle keeps it from leaving when dropped: call ``shutdown``."""
    def round_broken(self, timeout: Optional[Seconds] = None) -> Optional[BrokenReason]:
        """Waits until this worker's round is over and returns why; ``None`` if ``timeout``
        passes first (``timeout=0`` only looks). ``"no_round"`` at once outside a round;
        ``"unhealthy"`` when this worker left it because its health check failed."""
    def __enter__(self) -> Rendezvous: ...
    def __exit__(
        self,
        ty: Optional[type[BaseException]],
        value: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...

class Store:
    """A c10d-style Store (PyTorch's ``Store`` API). Keys and values are ``bytes`` or
    ``str`` (UTF-8); values come back as ``bytes``. Blocking calls raise
    ``StoreTimeoutError`` after the store's timeout."""

    @property
    def timeout(self) -> float:
        """The timeout of blocking calls, in seconds (default 300)."""
    def set_timeout(self, timeout: Seconds) -> None: ...
    def set(self, key: Key, value: Value) -> None: ...
    def get(self, key: Key) -> bytes:
        """Waits until ``key`` exists."""
    def add(self, key: Key, amount: int) -> int:
        """Atomically adds ``amount`` (a missing key counts as 0); returns the new value."""
    def compare_set(self, key: Key, expected: Value, desired: Value) -> bytes:
        """c10d's compare_set: returns the value stored afterwards."""
    def append(self, key: Key, value: Value) -> None: ...
    def wait(self, keys: Iterable[Key], timeout: Optional[Seconds] = None) -> None: ...
    def check(self, keys: Iterable[Key]) -> bool: ...
    def delete_key(self, key: Key) -> bool: ...
    def num_keys(self) -> int: ...
    def list_keys(self) -> list[bytes]: ...
    def multi_get(self, keys: Iterable[Key]) -> list[bytes]: ...
    def multi_set(self, keys: Iterable[Key], values: Iterable[Value]) -> None: ...
    def queue_push(self, key: Key, value: Value) -> None: ...
    def queue_pop(self, key: Key, block: bool = True) -> bytes: ...
    def queue_len(self, key: Key) -> int: ...
    def barrier(self, key: Key, world_size: int, timeout: Optional[Seconds] = None) -> None: ...
