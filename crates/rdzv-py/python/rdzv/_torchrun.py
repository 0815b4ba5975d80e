"""The ``torchrun.handlers`` entry point, kept free of torch imports.

torch registers out-of-tree backends while its rendezvous package is first imported. Were
the entry point in ``rdzv.torch_backend`` (which imports that package), importing
``rdzv.torch_backend`` before torch's registry would load the entry point from a module
still half-initialized; so the creator here imports the backend only when called."""

from __future__ import annotations

from typing import Any, Callable


def handler_creator() -> Callable[[Any], Any]:
    """What torch calls to get the creator of ``rdzv`` handlers."""

    def create(params: Any) -> Any:
        from rdzv.torch_backend import create_handler

        return create_handler(params)

    return create
