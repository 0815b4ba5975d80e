"""rdzv: rendezvous for distributed jobs over etcd v3, Redis or memory.

The workers of a job (one *run*) meet through a key-value store, agree on who is in, each
get a rank and the world size, and share a small c10d-style Store. This package needs no
torch; ``rdzv.torch_backend`` is the ``torchrun`` backend ``rdzv`` (loaded by torchrun).

Blocking calls release the GIL and can be interrupted with Ctrl-C (``KeyboardInterrupt``;
an interrupted ``next_rendezvous`` withdraws what it wrote). All handles of a process share
one background runtime, started on first use.

After ``os.fork()``, the child must create its own handles (``connect``/``open_store``):
it gets a runtime of its own on first use, and a handle made before the fork raises
``RendezvousError`` there instead of hanging on the parent's connections.
"""

from ._rdzv import (
    Error,
    Participant,
    Rendezvous,
    RendezvousClosedError,
    RendezvousConfigError,
    RendezvousError,
    RendezvousLeaseLostError,
    RendezvousShutdownError,
    RendezvousStateError,
    RendezvousTimeoutError,
    RendezvousUnavailableError,
    Round,
    Store,
    StoreError,
    StoreQueueEmptyError,
    StoreTimeoutError,
    StoreUnavailableError,
    __version__,
    connect,
    open_store,
)

__all__ = [
    "Error",
    "Participant",
    "Rendezvous",
    "RendezvousClosedError",
    "RendezvousConfigError",
    "RendezvousError",
    "RendezvousLeaseLostError",
    "RendezvousShutdownError",
    "RendezvousStateError",
    "RendezvousTimeoutError",
    "RendezvousUnavailableError",
    "Round",
    "Store",
    "StoreError",
    "StoreQueueEmptyError",
    "StoreTimeoutError",
    "StoreUnavailableError",
    "__version__",
    "connect",
    "open_store",
]
