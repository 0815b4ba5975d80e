"""The torchrun rendezvous backend ``rdzv``.

torchrun loads it through the ``torchrun.handlers`` entry point of this package::

    torchrun --rdzv-backend=rdzv --rdzv-endpoint=etcd://10.0.0.5:2379 --rdzv-id=job42 \\
        --nnodes=2:4 --nproc-per-node=8 train.py

``--rdzv-endpoint`` is an rdzv URL without the run id (``etcd://``, ``etcds://``,
``redis://``, ``rediss://``, ``mem://``; options may follow ``?``); a bare ``host:port``
means etcd. ``--rdzv-id`` is the run id, ``--nnodes=MIN:MAX`` the world's bounds.
``--rdzv-conf`` takes torch's key names (see ``TORCH_KEYS``) and rdzv's own options.

A run that ends. torchrun's ``launch_agent`` calls ``shutdown()`` in its ``finally`` when its
agent ends (not when a signal stops it), and the exception in flight then says how: none when
every worker of this agent succeeded, ``ChildFailedError`` when it gave up after
``--max-restarts``, another when the agent failed otherwise. So ``shutdown()`` closes the run as
succeeded (so that spares and late agents stop within seconds, as torch's own backends and
``rdzv run`` do), or as failed (as ``rdzv run`` does), or only leaves: its keys vanish at once
and the other agents re-form without it if at least ``MIN`` remain. torch 2.6 and 2.7 also call
``shutdown()`` from the agent's ``_shutdown`` (the end of ``SimpleElasticAgent.run``, and
stopping the workers for good), after the workers' result — failed or not — with nothing in
flight: that call says nothing, and is left to ``launch_agent``'s, which always follows
(unless a signal stops the agent: then one is in flight, and it only leaves). Supported:
torch 2.6 (the first to load the ``torchrun.handlers`` entry point) and later; tested on 2.6
and 2.15.

A run closed as succeeded while this agent's workers still run (torch's exit barrier gives
up on a slower node after 300 s, and the faster agents close the run and leave) does not stop
them: ``num_nodes_waiting()`` reports nothing to re-form for, and they finish on their own.
Should they fail instead, the run is closed as failed (``failed`` replaces ``succeeded``) and
this agent ends with an error. Workers that failed before the run was closed (a peer died) are
not such a failure: the agent re-forms, and if the run is closed as succeeded while it waits
(it was left out of the new world, e.g. its segment was incomplete under ``segment_size``), it
ends with exit code 0 like any agent waiting for a round.

An agent whose run closes while it waits for a round — a spare, a late agent, or any agent of
a job that succeeded — ends with exit code 0: ``next_rendezvous()`` raises ``SystemExit(0)``.
(torch's own ``RendezvousGracefulExitError`` would be the natural signal, but torch 2.15's
``launch_agent`` then crashes on the ``None`` result of the agent's run.) An agent that was a
member and re-forms after a failure gets ``RendezvousClosedError`` when the run closed as
failed, as with torch's own backends.

Spares. Agents beyond ``MAX`` of ``--nnodes=MIN:MAX`` wait as spares, without a timeout while
the round is full; a full, intact round reports ``num_nodes_waiting() == 0`` (torch's agent
restarts on any waiting node, which for spares would trade one agent for another for ever).
When an agent dies or leaves, the spare that arrived first takes its place and its group
rank; the surviving agents keep theirs.

``num_nodes_waiting()`` also counts this agent's round as needing a restart when a member
of it is gone (died or left) or this agent's own lease was lost, so the agents re-form within
the keep-alive TTL even while their workers are stuck in a collective.

Health gates. ``--rdzv-conf health_check=CMD`` (with ``health_check_interval``,
``health_check_timeout`` and ``health_check_failures`` beside it) runs CMD before each join
and every interval after: an agent whose check fails does not join (``next_rendezvous()``
waits, excluded, until the check passes), and a member that fails ``health_check_failures``
checks in a row leaves its round: ``num_nodes_waiting()`` reports it, so torch's agent stops
its workers and re-forms (no restart counted), while the other agents re-form at once with a
spare in its place. torch splits ``--rdzv-conf`` at commas: join built-ins with ``+``
(``health_check=builtin:gpu:8+disk:/tmp:10G``), and put a command with commas in a script.
The failures, the exclusion and the recovery are logged here (logger ``rdzv.torch_backend``).
"""

from __future__ import annotations

import datetime
import logging
import sys
import urllib.parse
from typing import Any, Callable

import torch.distributed as dist
from torch.distributed.elastic.agent.server.api import ElasticAgent
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous.api import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStateError,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
)

import rdzv

logger = logging.getLogger(__name__)

#: torch's ``--rdzv-conf`` keys and what they become here.
TORCH_KEYS = {
    "join_timeout": "rdzv `timeout`: deadline of one rendezvous (wins over `timeout`)",
    "timeout": "rdzv `timeout` (torchrun sets it to 900 unless given)",
    "last_call_timeout": "rdzv `last_call_timeout`",
    "keep_alive_interval": "with keep_alive_max_attempt: rdzv `keep_alive_ttl` = interval x attempts",
    "keep_alive_max_attempt": "see keep_alive_interval (torch's defaults: 5 s x 3)",
    "read_timeout": "timeout of the agent's Store calls, in seconds (default 60, as torch's)",
    "local_addr": "rdzv `local_addr` (also from --local-addr)",
    "etcd_prefix": "rdzv `prefix` (torch's etcd backend's name)",
    "protocol": "etcd `protocol` (https = TLS)",
    "cacert": "etcd/Redis `cacert`",
    "cert": "etcd/Redis `cert`",
    "key": "etcd/Redis `key`",
    "close_timeout": "accepted and ignored: closing is one write here",
    "is_host": "accepted and ignored: no agent hosts the store here",
}

#: torch's defaults for the keep-alive, used when only one of the two keys is given.
_KEEP_ALIVE_INTERVAL = 5.0
_KEEP_ALIVE_ATTEMPTS = 3
#: torch's c10d backend's default read timeout, in seconds.
_READ_TIMEOUT = 60.0
#: Round-broken reasons that mean the agent's worker group must re-form.
_BROKEN = frozenset({"member_gone", "ended", "closed", "lease_lost", "unhealthy"})


def _seconds(key: str, value: Any) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"--rdzv-conf {key}={value!r}: expected a number of seconds") from None
    if seconds <= 0:
        raise ValueError(f"--rdzv-conf {key}={value!r}: must be more than 0 seconds")
    return seconds


def build_url(params: RendezvousParameters) -> tuple[str, float]:
    """The rdzv URL for torchrun's parameters, and the agent Store's timeout in seconds.

    Raises ``ValueError`` naming the flag at fault (the endpoint, a ``--rdzv-conf`` key)."""
    endpoint = (params.endpoint or "").strip()
    if not endpoint:
        raise ValueError(
            "the rdzv backend needs --rdzv-endpoint: an rdzv URL without run id, "
            "e.g. etcd://10.0.0.5:2379, redis://host:6379, or a bare host:port for etcd"
        )
    if "://" not in endpoint:
        endpoint = "etcd://" + endpoint
    parts = urllib.parse.urlsplit(endpoint)
    if parts.path not in ("", "/"):
        raise ValueError(
            f"--rdzv-endpoint must not name a run (its path is {parts.path!r}): "
            "the run id comes from --rdzv-id"
        )
    if parts.fragment:
        raise ValueError("--rdzv-endpoint must not contain '#'")

    config = dict(params.config)
    options: dict[str, str] = {}
    store_timeout = _READ_TIMEOUT
    for key, value in config.items():
        if value is None:
            continue
        if key == "join_timeout":
            options["timeout"] = str(_seconds(key, value))
        elif key == "timeout":
            if config.get("join_timeout") is None:
                options["timeout"] = str(_seconds(key, value))
        elif key == "etcd_prefix":
            options["prefix"] = str(value)
        elif key == "read_timeout":
            store_timeout = _seconds(key, value)
        elif key in ("keep_alive_interval", "keep_alive_max_attempt", "close_timeout", "is_host"):
            continue
        elif key in ("min_workers", "max_workers", "min_nodes", "max_nodes"):
            raise ValueError(f"--rdzv-conf {key}: give the number of nodes with --nnodes=MIN:MAX instead")
        else:
            # rdzv's own options and the backend's (TLS files, protocol, db, …); rdzv checks
            # them and names the known ones.
            options[key] = str(value)

    if config.get("keep_alive_interval") is not None or config.get("keep_alive_max_attempt") is not None:
        if "keep_alive_ttl" in options:
            raise ValueError(
                "--rdzv-conf: give keep_alive_ttl, or keep_alive_interval/keep_alive_max_attempt, not both"
            )
        interval = _seconds("keep_alive_interval", config.get("keep_alive_interval", _KEEP_ALIVE_INTERVAL))
        attempts = _seconds("keep_alive_max_attempt", config.get("keep_alive_max_attempt", _KEEP_ALIVE_ATTEMPTS))
        options["keep_alive_ttl"] = str(interval * attempts)
    if "local_addr" not in options and params.local_addr:
        options["local_addr"] = params.local_addr
    options["min_workers"] = str(params.min_nodes)
    options["max_workers"] = str(params.max_nodes)

    query = "&".join(
        [parts.query] * bool(parts.query)
        + [f"{k}={urllib.parse.quote(v, safe='')}" for k, v in options.items()]
    )
    run_id = urllib.parse.quote(str(params.run_id), safe="")
    return f"{parts.scheme}://{parts.netloc}/{run_id}?{query}", store_timeout


class TorchStore(dist.Store):
    """A ``torch.distributed.Store`` backed by an rdzv Store (the round's): what the agent
    runs its rank assignment and barriers on. Store timeouts raise ``DistStoreError``, as
    torch's stores do."""

    def __init__(self, store: rdzv.Store, timeout: float) -> None:
        super().__init__()
        self._store = store
        self.set_timeout(datetime.timedelta(seconds=timeout))

    @staticmethod
    def _call(fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except rdzv.StoreError as e:
            raise dist.DistStoreError(str(e)) from e

    @property
    def timeout(self) -> datetime.timedelta:  # type: ignore[override]
        return datetime.timedelta(seconds=self._store.timeout)

    def set_timeout(self, timeout: datetime.timedelta) -> None:  # type: ignore[override]
        self._store.set_timeout(timeout)
        super().set_timeout(timeout)

    def set(self, key: str, value: Any) -> None:  # type: ignore[override]
        self._call(self._store.set, key, value)

    def get(self, key: str) -> bytes:  # type: ignore[override]
        return self._call(self._store.get, key)

    def add(self, key: str, value: int) -> int:  # type: ignore[override]
        return self._call(self._store.add, key, value)

    def compare_set(self, key: str, expected_value: Any, desired_value: Any) -> bytes:  # type: ignore[override]
        return self._call(self._store.compare_set, key, expected_value, desired_value)

    def append(self, key: str, value: Any) -> None:  # type: ignore[override]
        self._call(self._store.append, key, value)

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:  # type: ignore[override]
        self._call(self._store.wait, keys, timeout)

    def check(self, keys: list[str]) -> bool:  # type: ignore[override]
        return self._call(self._store.check, keys)

    def delete_key(self, key: str) -> bool:  # type: ignore[override]
        return self._call(self._store.delete_key, key)

    def num_keys(self) -> int:  # type: ignore[override]
        return self._call(self._store.num_keys)

    def multi_get(self, keys: list[str]) -> list[bytes]:  # type: ignore[override]
        return self._call(self._store.multi_get, keys)

    def multi_set(self, keys: list[str], values: list[Any]) -> None:  # type: ignore[override]
        self._call(self._store.multi_set, keys, values)


class RdzvRendezvousHandler(RendezvousHandler):
    """torch's ``RendezvousHandler`` over one rdzv worker (see the module's docs)."""

    def __init__(self, worker: rdzv.Rendezvous, store_timeout: float) -> None:
        self._worker = worker
        self._store_timeout = store_timeout
        self._in_round = False
        self._was_member = False
        # Whether this handler told torch's agent to re-form (num_nodes_waiting() > 0): torch
        # re-forms only then, or when the workers failed with restarts left.
        self._asked_to_reform = False
        # Whether the run was seen closed as succeeded while this agent's workers ran.
        self._succeeded = False

    def get_backend(self) -> str:
        return "rdzv"

    def log_health(self) -> None:
        """Logs this agent's health gate as it acts: failed checks, leaving a round, being
        excluded and let in again (rdzv's own log goes to no Python logger)."""
        self._worker.on_event(_log_health_event)

    @property
    def use_agent_store(self) -> bool:
        # The workers bootstrap their own TCPStore at MASTER_ADDR:MASTER_PORT (rank 0's
        # address and a port that was free there); the agent's Store is not a TCPStore.
        return False

    def next_rendezvous(self) -> RendezvousInfo:
        workers_failed = self._in_round and not self._asked_to_reform
        self._in_round = self._asked_to_reform = False
        # Only a close that came before the failure makes it a failure after success: one that
        # comes while this agent waits (its segment left the world whole, and a spare one took
        # its place) ends a job that succeeded without it.
        failed_after_success = workers_failed and self._run_succeeded()
        try:
            r = self._worker.next_rendezvous()
        except rdzv.RendezvousClosedError as e:
            if e.outcome == "succeeded" and failed_after_success:
                # This agent's workers failed after another closed the run as succeeded.
                self._close_or_warn("failed")
                raise RendezvousClosedError(
                    f"the workers of this agent failed after run {self._worker.run_id} was closed as succeeded "
                    "(by an agent that stopped waiting for this one); the run is now closed as failed"
                ) from e
            if e.outcome == "succeeded" or not self._was_member:
                how = "the job succeeded" if e.outcome == "succeeded" else "it was closed"
                logger.info(
                    "rdzv: run %s is over (%s) while this agent waited for a round; exiting with code 0",
                    self._worker.run_id,
                    how,
                )
                raise SystemExit(0) from e
            raise RendezvousClosedError(str(e)) from e
        except rdzv.RendezvousTimeoutError as e:
            raise RendezvousTimeoutError(str(e)) from e
        except rdzv.RendezvousUnavailableError as e:
            raise RendezvousConnectionError(str(e)) from e
        except rdzv.RendezvousStateError as e:
            raise RendezvousStateError(str(e)) from e
        except rdzv.RendezvousError as e:
            raise RendezvousError(str(e)) from e
        self._in_round = True
        self._was_member = True
        store = TorchStore(r.store, self._store_timeout)
        return RendezvousInfo(store, r.rank, r.world_size, RendezvousStoreInfo(r.master_addr, r.master_port))

    def is_closed(self) -> bool:
        return self._worker.is_closed()

    def set_closed(self) -> None:
        self._worker.set_closed()

    def num_nodes_waiting(self) -> int:
        waiting = self._count_waiting()
        self._asked_to_reform = waiting > 0
        return waiting

    def _count_waiting(self) -> int:
        reason = self._worker.round_broken(timeout=0) if self._in_round else None
        if reason in _BROKEN:
            if reason != "lease_lost" and self._run_succeeded():
                # Closed as succeeded by an agent whose exit barrier gave up on this one (and
                # which then left): these workers finish, or fail, on their own.
                return 0
            # torch's agent polls only this between its checks of the workers: reporting the
            # broken round (or this agent's lost lease) as a waiting node makes it stop its
            # workers and re-form now, not when a collective of its workers times out. Asked
            # first and without a request: an agent cut off from the backend learns it at once.
            return 1
        try:
            return self._worker.num_nodes_waiting()
        except rdzv.RendezvousUnavailableError as e:
            # The agent polls this every monitor interval; an error here would end the agent
            # (and its healthy workers) over a blip of the backend. The next poll asks again.
            logger.warning("rdzv: could not count the waiting nodes (will ask again): %s", e)
            return 0

    def _run_succeeded(self) -> bool:
        """Whether the run is closed as succeeded (once seen, for good: a run closed is never
        reopened). Unknown when the backend cannot be reached: then not."""
        if not self._succeeded:
            try:
                self._succeeded = self._worker.run_outcome() == "succeeded"
            except rdzv.RendezvousError as e:
                logger.warning("rdzv: could not read how the run ended: %s", e)
        return self._succeeded

    def get_run_id(self) -> str:
        return self._worker.run_id

    def shutdown(self) -> bool:
        # torchrun calls this in a `finally`: the exception in flight, if any, says why the
        # agent ends (see the module's docs).
        in_flight = sys.exc_info()[1]
        if in_flight is None and _called_by_the_agents_shutdown():
            # torch 2.6 and 2.7, after the workers' result, whatever it was: launch_agent's
            # call follows and tells.
            return True
        outcome = None
        if in_flight is None:
            outcome = "succeeded"
        elif isinstance(in_flight, ChildFailedError):
            outcome = "failed"
        self._in_round = False
        try:
            if outcome is not None and self._was_member:
                self._worker.set_closed(outcome)
            self._worker.shutdown()
        except rdzv.Error as e:
            # Torch's contract: False when shutting down failed. The session lease then
            # expires by itself within keep_alive_ttl, which the others see as a departure.
            logger.warning("rdzv: could not leave the run cleanly: %s", e)
            return False
        return True

    def _close_or_warn(self, outcome: str) -> None:
        try:
            self._worker.set_closed(outcome)
        except rdzv.Error as e:
            logger.warning("rdzv: could not close the run as %s: %s", outcome, e)


def _called_by_the_agents_shutdown() -> bool:
    """Whether the handler's ``shutdown()`` (the caller of this) was called by an elastic agent's
    ``_shutdown``: torch 2.6 and 2.7 do so when the agent's run ends, before ``launch_agent``'s
    own call."""
    caller = sys._getframe(2)
    return caller.f_code.co_name == "_shutdown" and isinstance(caller.f_locals.get("self"), ElasticAgent)


def _redacted(endpoint: str) -> str:
    """The endpoint without its password (it may carry one: ``redis://:secret@host``)."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep:
        scheme, rest = "", endpoint
    if "@" in rest.split("/", 1)[0]:
        user, _, host = rest.partition("@")
        rest = f"{user.split(':', 1)[0]}:***@{host}"
    return f"{scheme}{sep}{rest}"


def create_handler(params: RendezvousParameters) -> RdzvRendezvousHandler:
    """torchrun's handler creator: builds the URL, connects (so a bad endpoint fails here,
    before any worker starts) and returns the handler."""
    url, store_timeout = build_url(params)
    try:
        worker = rdzv.connect(url)
    except rdzv.RendezvousConfigError as e:
        message = str(e)
        if message.startswith("unknown option"):
            message += "; torch's --rdzv-conf keys accepted too: " + ", ".join(TORCH_KEYS)
        raise ValueError(f"rdzv backend: {message}") from None
    except rdzv.RendezvousUnavailableError as e:
        raise RendezvousConnectionError(f"rdzv backend: --rdzv-endpoint {_redacted(params.endpoint)}: {e}") from None
    handler = RdzvRendezvousHandler(worker, store_timeout)
    if "health_check=" in url:
        handler.log_health()
    return handler


def _log_health_event(event: dict[str, Any]) -> None:
    kind = event.get("event")
    if kind == "health_check_failed":
        where = f"a member of round {event['member_of']}" if event.get("member_of") is not None else "not in a round"
        logger.warning(
            "rdzv: health check failed (%s in a row; this node is %s): %s", event["consecutive"], where, event["reason"]
        )
    elif kind == "drained":
        logger.warning(
            "rdzv: this node failed its health check and leaves round %s (rank %s); its workers are stopped and it "
            "rejoins once healthy: %s",
            event["version"],
            event["rank"],
            event["reason"],
        )
    elif kind == "excluded":
        logger.warning(
            "rdzv: this node is excluded from the run until its health check passes (checked again every interval): %s",
            event["reason"],
        )
    elif kind == "readmitted":
        logger.warning("rdzv: this node's health check passes again after %.0f s excluded; it joins", event["excluded_seconds"])
