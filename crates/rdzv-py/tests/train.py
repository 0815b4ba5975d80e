"""The training script of the torchrun tests: all_reduce over gloo (CPU).

Each worker sums (rank + 1) over the world. When the world has TARGET_WORLD members it
writes what it saw to OUT_DIR and exits 0; a smaller or larger world keeps reducing until
the agents re-form it (a peer dies: the collective fails and the worker exits non-zero)."""

import json
import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
target = int(os.environ["TARGET_WORLD"])
while True:
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    if world == target:
        break
    time.sleep(0.2)
result = {
    "rank": rank,
    "world": world,
    "sum": t.item(),
    "group_rank": int(os.environ["GROUP_RANK"]),
    "restart": int(os.environ["TORCHELASTIC_RESTART_COUNT"]),
    "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
}
with open(os.path.join(os.environ["OUT_DIR"], f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
dist.barrier()
dist.destroy_process_group()
