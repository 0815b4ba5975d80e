"""The single-host Slurm cluster of the tests (`slurm`, conftest.py; slurm_cluster.py): a batch
job of three nodes runs one step on each of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_cluster import SlurmCluster, find_binaries


def test_a_batch_job_runs_one_step_on_each_node(slurm: SlurmCluster, tmp_path: Path) -> None:
    out = tmp_path / "steps"
    out.mkdir()
    script = tmp_path / "job.sh"
    # `wait PID` for each step, not a bare `wait`, so that a failed step fails the job.
    script.write_text(f"""#!/bin/bash
set -eu
pids=()
for i in 0 1 2; do
    srun -N1 -n1 --relative=$i bash -c 'echo $SLURMD_NODENAME > {out}/$SLURM_STEP_ID' &
    pids+=($!)
done
for pid in "${{pids[@]}}"; do wait "$pid"; done
""")
    job_log = tmp_path / "job.out"
    job = slurm.sbatch(script, "-N3", f"--output={job_log}")

    state = slurm.wait_job(job, timeout=60)

    job_output = job_log.read_text() if job_log.exists() else "(none)"
    assert state == ("COMPLETED", "0:0"), f"job {job}: {state}\njob output: {job_output}\n{slurm.logs_tail()}"
    # The steps start at once: which gets which step id is a race, which node each runs on is not.
    nodes = {p.name: p.read_text().strip() for p in out.iterdir()}
    assert sorted(nodes) == ["0", "1", "2"], f"step -> node: {nodes}"
    assert sorted(nodes.values()) == ["n1", "n2", "n3"], f"step -> node: {nodes}"


def test_a_missing_slurm_fails_saying_how_to_install_it(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"run scripts/setup.sh .*missing: munged, slurmctld, slurmd, sbatch"):
        find_binaries(str(tmp_path))
