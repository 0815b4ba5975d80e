"""torchrun itself (``torch.distributed.run``'s ``main``), with its agent's exit barrier given
EXIT_BARRIER_TIMEOUT seconds instead of 300 (the agent takes the value as a constructor
argument, but torchrun has no flag for it): a test can then see what happens after the barrier
gives up on a slower node without waiting five minutes."""

import os
import sys

import torch.distributed.launcher.api as launcher
from torch.distributed.run import main


class _Agent(launcher.LocalElasticAgent):  # type: ignore[misc, valid-type]
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("exit_barrier_timeout", float(os.environ["EXIT_BARRIER_TIMEOUT"]))
        super().__init__(*args, **kwargs)


launcher.LocalElasticAgent = _Agent
sys.exit(main())
