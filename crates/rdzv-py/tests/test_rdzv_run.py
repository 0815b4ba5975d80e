"""`rdzv run` — the Rust agent, with no Python on the launcher side — drives the same real
torch training script as torchrun does: two nodes × two local workers, gloo on CPU, on a real
etcd. The ranks, world size, group ranks and master must be torchrun's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from test_torchrun import TRAIN, finish, results

REPO = Path(__file__).resolve().parents[3]


def rdzv_binary() -> str:
    """The `rdzv` binary: `$RDZV_BIN`, else the workspace's debug build (scripts/test-python.sh
    builds it)."""
    path = os.environ.get("RDZV_BIN") or str(REPO / "target" / "debug" / "rdzv")
    assert os.access(path, os.X_OK), f"no rdzv binary at {path}: run `cargo build -p rdzv-cli` first"
    return path


def test_rdzv_run_two_nodes_two_workers_all_reduce(etcd: str, run_id: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, OUT_DIR=str(out), TARGET_WORLD="4", GLOO_SOCKET_IFNAME="lo")
    # The default session TTL: nothing here fails, and with 3 s a CI run that saturated both
    # cores stalled an agent's refreshes that long, lost its session and restarted the round.
    url = f"etcd://{etcd}/{run_id}?min_workers=2&last_call_timeout=2s&timeout=90s"
    cmd = [rdzv_binary(), "run", url, "--nproc-per-node", "2", "--local-addr", "127.0.0.1", "--", sys.executable, TRAIN]
    logs = [tmp_path / f"node{i}.log" for i in range(2)]
    procs = []
    for log in logs:
        with open(log, "wb") as f:
            procs.append(subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True))
    finish(procs, logs, timeout=120)
    rs = results(out)
    assert sorted(r["rank"] for r in rs) == [0, 1, 2, 3]
    assert all(r["world"] == 4 and r["sum"] == 10.0 for r in rs)
    assert sorted({r["group_rank"] for r in rs}) == [0, 1]
    assert len({r["master"] for r in rs}) == 1
    assert all(r["restart"] == 0 for r in rs)
