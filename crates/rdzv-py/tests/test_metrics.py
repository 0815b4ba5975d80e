"""`rdzv run --metrics-addr`, scraped by a real Prometheus server (Debian's `prometheus`,
started here): three agents on a real etcd — two members of a full round and a spare — are
scraped every second; a member is SIGKILLed; the series read back through Prometheus' HTTP
API must show what happened: the survivor restarted once for a lost member and formed a
second round, the spare was promoted, the dead agent's target is down. Every example query of
docs/OBSERVABILITY.md is then run as written there and must answer sensibly; the one about
lease refresh failures once the promoted spare's link to etcd is frozen (it connects through
`rdzv-netfault`). The workers only sleep: no torch here.

A missing `prometheus` fails the test (never skips): install it with `scripts/setup.sh`."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable

from conftest import REPO, Link, free_port
from test_rdzv_run import rdzv_binary
from test_torchrun import kill

AGENTS = ["m0", "m1", "s2"]
DEADLINE = 60
OBSERVABILITY = REPO / "docs" / "OBSERVABILITY.md"


def dashboard_queries() -> list[str]:
    """The example dashboard queries of docs/OBSERVABILITY.md, as written there: the lines of
    its ```promql block that are not comments."""
    m = re.search(r"Example dashboard queries:\n\n```promql\n(.*?)```", OBSERVABILITY.read_text(), re.S)
    assert m, f"no block of example queries in {OBSERVABILITY}"
    return [line for line in m.group(1).splitlines() if line.strip() and not line.startswith("#")]


def wait_until(what: str, check: Callable[[], bool], timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.25)


def metrics_address(log: Path) -> str:
    """The `host:port` an agent says it serves its metrics on."""
    found: list[str] = []

    def said() -> bool:
        m = re.search(r"serving metrics at http://([^/\s]+)/metrics", log.read_text())
        if m:
            found.append(m.group(1))
        return bool(m)

    wait_until(f"the metrics address in {log}", said, 30)
    return found[0]


class Prometheus:
    """A Prometheus server scraping `targets` (agent name → `host:port`) every second, with
    the agent's name as the label `agent`."""

    def __init__(self, targets: dict[str, str], tmp: Path) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("`prometheus` is not installed; run scripts/setup.sh (the test needs a real server)")
        configs = [
            {"targets": [address], "labels": {"agent": name}} for name, address in targets.items()
        ]
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [{"job_name": "rdzv", "static_configs": configs}],
        }
        # YAML is a superset of JSON.
        (tmp / "prometheus.yml").write_text(json.dumps(config))
        self.address = f"127.0.0.1:{free_port()}"
        self.log = tmp / "prometheus.log"
        cmd = [
            binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address={self.address}", "--log.level=warn",
        ]  # fmt: skip
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        wait_until("Prometheus to be ready", self._ready, 30)

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"prometheus exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://{self.address}/-/ready", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def series(self, expr: str) -> list[tuple[dict[str, str], float]]:
        """An instant query's vector: each series' labels and value."""
        url = f"http://{self.address}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=5) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        assert body["data"]["resultType"] == "vector", body
        return [(s["metric"], float(s["value"][1])) for s in body["data"]["result"]]

    def query(self, expr: str) -> dict[str, float]:
        """An instant query's vector: each series' `agent` label (or its labels, if it has
        none) → value."""
        return {m.get("agent", json.dumps(m, sort_keys=True)): v for m, v in self.series(expr)}

    def by(self, expr: str, label: str) -> dict[str, float]:
        """An instant query's vector: each series' `label` → value (one series per value)."""
        found = self.series(expr)
        by_label = {m[label]: v for m, v in found}
        assert len(by_label) == len(found), f"{expr}: several series per {label}: {found}"
        return by_label

    def value(self, expr: str, agent: str) -> float | None:
        return self.query(expr).get(agent)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def test_prometheus_scrapes_the_agents_and_sees_a_member_killed(etcd: str, run_id: str, tmp_path: Path) -> None:
    options = "min_workers=2&max_workers=2&keep_alive_ttl=2s&last_call_timeout=1s&timeout=60s"
    logs = {name: tmp_path / f"{name}.log" for name in AGENTS}
    events = {name: tmp_path / f"{name}.jsonl" for name in AGENTS}
    procs: dict[str, subprocess.Popen] = {}
    # The spare reaches etcd through a link of its own, frozen at the end (lease failures).
    link = Link(etcd)
    endpoints = {"m0": etcd, "m1": etcd, "s2": link.endpoint_list}

    def start(name: str) -> None:
        cmd = [
            rdzv_binary(), "run", f"etcd://{endpoints[name]}/{run_id}?{options}", "--node-id", name,
            "--local-addr", "127.0.0.1", "--metrics-addr", "127.0.0.1:0", "--events", str(events[name]),
            "--monitor-interval", "0.5s", "--grace-period", "1s", "--", "sleep", "600",
        ]  # fmt: skip
        with open(logs[name], "wb") as log:
            procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    prometheus = None
    frozen = False
    try:
        start("m0")
        start("m1")
        targets = {name: metrics_address(logs[name]) for name in ["m0", "m1"]}
        # The spare comes once the round of two is formed.
        wait_until("the first round", lambda: all("round 1 formed" in logs[n].read_text() for n in targets))
        start("s2")
        targets["s2"] = metrics_address(logs["s2"])
        agent_at = {address: name for name, address in targets.items()}
        prometheus = Prometheus(targets, tmp_path)

        def scraped(expr: str, expected: dict[str, float]) -> Callable[[], bool]:
            return lambda: all(prometheus.value(expr, a) == v for a, v in expected.items())

        wait_until("every agent scraped", scraped('up{job="rdzv"}', {a: 1 for a in AGENTS}))
        wait_until("the first round counted", scraped("rdzv_rounds_formed_total", {"m0": 1, "m1": 1, "s2": 0}))
        wait_until("the spare seen by both members", scraped("rdzv_spare_nodes", {"m0": 1, "m1": 1}))
        assert prometheus.value("rdzv_round_members", "m0") == 2
        assert prometheus.value('rdzv_worker_info{node="m0"}', "m0") == 1

        os.killpg(procs["m1"].pid, signal.SIGKILL)
        procs["m1"].wait()
        # The survivor lost a member, restarted once for it, and formed a second round with
        # the spare, promoted into the dead member's place.
        wait_until("the restart counted", scraped('rdzv_restarts_total{cause="member_lost"}', {"m0": 1}))
        wait_until("the second round", scraped("rdzv_rounds_formed_total", {"m0": 2, "s2": 1}))
        wait_until("the promotion", scraped("rdzv_spares_promoted_total", {"s2": 1, "m0": 0}))
        wait_until("the dead agent's target down", scraped('up{job="rdzv"}', {"m1": 0, "m0": 1, "s2": 1}))
        wait_until("no spare left", scraped("rdzv_spare_nodes", {"m0": 0, "s2": 0}))
        lost = prometheus.query('sum by (agent) (rdzv_members_lost_total{reason=~"member_gone|ended"})')
        assert lost.get("m0") == 1, lost
        counted = prometheus.query('sum by (agent) (rdzv_restarts_total{cause!="member_lost"})')
        assert counted == {"m0": 0, "s2": 0}, f"no other restart: {counted}"
        assert prometheus.value("rdzv_rendezvous_duration_seconds_count", "m0") == 2
        assert prometheus.value("rdzv_round_members", "s2") == 2
        puts = prometheus.query('rdzv_backend_operations_total{op="put",result="ok"}')
        assert puts["m0"] > 0 and puts["s2"] > 0, puts

        # The docs' dashboard queries, as written there, each with a sensible answer.
        queries = dashboard_queries()
        restarts_by_cause, p90, restarts_by_node, spares, lease_failures, excluded, drains, latency = queries
        assert restarts_by_cause == "sum by (cause) (increase(rdzv_restarts_total[1h]))", queries
        restarts = prometheus.by(restarts_by_cause, "cause")
        causes = {"worker_failure", "peer_failure", "member_lost", "admit_waiting", "lease_lost", "unhealthy", "other"}
        assert set(restarts) == causes and restarts["member_lost"] >= 1, restarts
        assert all(v == 0 for c, v in restarts.items() if c != "member_lost"), restarts
        assert "rdzv_rendezvous_duration_seconds_bucket" in p90, queries
        # Per scrape address; the dead agent rendezvoused before the first scrape (no rate).
        took = {agent_at[i]: v for i, v in prometheus.by(p90, "instance").items()}
        assert set(took) <= set(AGENTS) and {"m0", "s2"} <= set(took), took
        assert all(0 < took[a] <= DEADLINE for a in ["m0", "s2"]), took
        assert "group_left (node) rdzv_worker_info" in restarts_by_node, queries
        # The dead agent's info is stale, so only the live nodes are named.
        per_node = prometheus.by(restarts_by_node, "node")
        assert set(per_node) == {"m0", "s2"} and per_node["m0"] >= 1 and per_node["s2"] == 0, per_node
        assert spares == "max(rdzv_spare_nodes)", queries
        assert prometheus.query(spares) == {"{}": 0}, "no spare waits once it was promoted"
        # No agent has a health gate here: nobody is out, nobody was drained.
        assert excluded == "sum(rdzv_excluded)", queries
        assert prometheus.query(excluded) == {"{}": 0}, "an agent without a health check counts as excluded"
        assert "rdzv_drains_total" in drains, queries
        assert prometheus.query(drains) == {"{}": 0}, "an agent without a health check was drained"
        assert "rdzv_backend_operation_duration_seconds_bucket" in latency, queries
        p99 = prometheus.by(latency, "op")
        assert {"put", "lease_keep_alive"} <= {op for op, v in p99.items() if math.isfinite(v)}, p99
        assert all(0 < v <= 2.5 for v in p99.values() if math.isfinite(v)), p99

        # The event logs say the same, line by line.
        survivor = [json.loads(line) for line in events["m0"].read_text().splitlines()]
        names = [e["event"] for e in survivor if e["event"] != "nodes_waiting"]
        assert names == ["round_formed", "member_lost", "restart", "round_formed"], names
        restart = next(e for e in survivor if e["event"] == "restart")
        assert (restart["cause"], restart["counted"], restart["count"]) == ("member_lost", True, 1), restart
        promoted = [json.loads(line)["event"] for line in events["s2"].read_text().splitlines()]
        assert [n for n in promoted if n != "nodes_waiting"] == ["round_formed", "spare_promoted"], promoted

        # Nobody failed to refresh a lease so far; then the promoted spare is cut off from
        # etcd (its metrics are still scraped): its refreshes fail until its lease is lost.
        assert "rdzv_lease_refresh_failures_total" in lease_failures, queries
        assert prometheus.query(lease_failures) == {}, "a lease refresh failed before any fault"
        link.freeze()
        frozen = True
        wait_until("a failed lease refresh", lambda: prometheus.query(lease_failures) != {}, 30)
        failing = {agent_at[i] for i in prometheus.by(lease_failures, "instance")}
        assert failing == {"s2"}, failing
    finally:
        if frozen:
            link.heal()
        if prometheus is not None:
            prometheus.stop()
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for name, proc in procs.items():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                kill([proc])
                raise AssertionError(f"{name} did not end on SIGTERM:\n{logs[name].read_text()[-3000:]}")
        link.close()
