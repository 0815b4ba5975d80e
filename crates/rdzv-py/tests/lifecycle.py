"""The worker of the lifecycle tests (test_lifecycle.py): trains STEPS steps of all_reduce over
gloo (CPU), then exits 0. Each worker appends a line to OUT_DIR/starts.jsonl when it starts
(its agent AGENT_NAME, group rank, the world's master and the restart count).

- FAIL_AGENT: that agent's worker exits 1 after FAIL_AT_STEP steps while the restart count
  is below FAIL_RESTARTS (default 1): its peers' next all_reduce then fails too.
- SLOW_AGENT: after the steps, that agent's worker goes on alone for SLOW_SECONDS (no
  collective: as rank 0 writing the final checkpoint would) and writes OUT_DIR/slow.done
  just before it exits 0; the others exit at once.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
agent = os.environ["AGENT_NAME"]
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
out = os.environ["OUT_DIR"]
start = {
    "agent": agent,
    "group_rank": int(os.environ["GROUP_RANK"]),
    "rank": dist.get_rank(),
    "world": dist.get_world_size(),
    "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
    "restart": restart,
}
with open(os.path.join(out, "starts.jsonl"), "a") as f:
    f.write(json.dumps(start) + "\n")
fails = agent == os.environ.get("FAIL_AGENT") and restart < int(os.environ.get("FAIL_RESTARTS", "1"))
for step in range(int(os.environ.get("STEPS", "10"))):
    if fails and step == int(os.environ.get("FAIL_AT_STEP", "3")):
        print(f"{agent}: failing on purpose at step {step} (restart {restart})", flush=True)
        sys.exit(1)
    dist.all_reduce(torch.tensor([1.0]))
    time.sleep(0.2)
if agent == os.environ.get("SLOW_AGENT"):
    time.sleep(float(os.environ["SLOW_SECONDS"]))
    with open(os.path.join(out, "slow.done"), "w") as f:
        f.write(f"{agent}\n")
dist.destroy_process_group()
