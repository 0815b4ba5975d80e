"""A worker that talks to no peer: it appends its start to OUT_DIR/starts.jsonl (agent, group
rank, pid, restart count), then idles while HOLD_FILE exists, and exits 0. With no collective
to fail, only its agent can stop it: what the fencing tests need."""

import json
import os
import time

start = {
    "agent": os.environ["AGENT_NAME"],
    "group_rank": int(os.environ["GROUP_RANK"]),
    "world": int(os.environ["GROUP_WORLD_SIZE"]),
    "pid": os.getpid(),
    "restart": int(os.environ["TORCHELASTIC_RESTART_COUNT"]),
    "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
}
with open(os.path.join(os.environ["OUT_DIR"], "starts.jsonl"), "a") as f:
    f.write(json.dumps(start) + "\n")
hold = os.environ["HOLD_FILE"]
while os.path.exists(hold):
    time.sleep(0.1)
