"""The training script of the torchrun tests: all_reduce over gloo (CPU).

Each worker sums (rank + 1) over the world. When the world has TARGET_WORLD members it
writes what it saw to OUT_DIR and exits 0; a smaller or larger world keeps reducing until
the agents re-form it (a peer dies: the collective fails and the worker exits non-zero).
With HOLD_FILE set, the workers keep reducing while any of them sees that file, whatever the
world.
With AGENT_NAME set (in the agent's environment), each worker appends a line to
OUT_DIR/starts.jsonl when it starts: which agent, its group rank and rank, the world size,
the master address (one per world), its pid, the agent's restart count and when the worker
started (`time.monotonic()`, before torch's import).

With NOTICE_FILE set, each worker appends a line to NOTICE_FILE.<rank> for every SIGUSR1 it
receives (the Slurm tests: a warning before the job's end, once per worker).

With STEPS set, each world trains that many steps whatever its size, appends what it saw to
OUT_DIR/steps.jsonl, then runs no collective while HOLD_FILE exists and exits 0: its peers
can then be stopped by their agents (a world re-forming) without failing it, so that only
its own agent stops it (the fencing tests)."""

import json
import os
import signal
import sys
import time

# When the agent started this worker, before torch's import: that takes seconds on a loaded
# machine, and the fencing test times how fast the agents re-form by it.
STARTED = time.monotonic()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
if "NOTICE_FILE" in os.environ:

    def noticed(signum: int, frame: object) -> None:
        with open(f"{os.environ['NOTICE_FILE']}.{rank}", "a") as f:
            f.write(f"{signal.Signals(signum).name} pid {os.getpid()}\n")

    signal.signal(signal.SIGUSR1, noticed)
target = int(os.environ["TARGET_WORLD"])
hold = os.environ.get("HOLD_FILE")
if "AGENT_NAME" in os.environ:
    start = {
        "agent": os.environ["AGENT_NAME"],
        "node_id": os.environ.get("RDZV_NODE_ID"),
        "group_rank": int(os.environ["GROUP_RANK"]),
        "rank": rank,
        "world": world,
        "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        "previous_group_rank": os.environ.get("RDZV_PREVIOUS_GROUP_RANK"),
        "pid": os.getpid(),
        "restart": int(os.environ["TORCHELASTIC_RESTART_COUNT"]),
        "started": STARTED,
    }
    with open(os.path.join(os.environ["OUT_DIR"], "starts.jsonl"), "a") as f:
        f.write(json.dumps(start) + "\n")
if "STEPS" in os.environ:
    for _ in range(int(os.environ["STEPS"])):
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        time.sleep(0.05)
    done = {
        "agent": os.environ.get("AGENT_NAME"),
        "rank": rank,
        "world": world,
        "sum": t.item(),
        "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
    }
    with open(os.path.join(os.environ["OUT_DIR"], "steps.jsonl"), "a") as f:
        f.write(json.dumps(done) + "\n")
    while hold and os.path.exists(hold):
        time.sleep(0.1)
    dist.destroy_process_group()
    sys.exit(0)
while True:
    # Whether the hold file is there travels in the collective, so that every rank takes the
    # same decision: a rank that stopped on its own look at the file would meet the others'
    # next all_reduce with its barrier.
    holding = float(bool(hold and os.path.exists(hold)))
    t = torch.tensor([float(rank + 1), holding])
    dist.all_reduce(t)
    if world == target and t[1].item() == 0:
        break
    time.sleep(0.2)
result = {
    "rank": rank,
    "world": world,
    "sum": t[0].item(),
    "group_rank": int(os.environ["GROUP_RANK"]),
    "restart": int(os.environ["TORCHELASTIC_RESTART_COUNT"]),
    "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
}
with open(os.path.join(os.environ["OUT_DIR"], f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
dist.barrier()
dist.destroy_process_group()
