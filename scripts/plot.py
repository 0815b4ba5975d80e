#!/usr/bin/env python3
"""Turns the raw benchmark results (JSON lines written by benches/*.rs, scripts/multiproc.py
and scripts/etcd_figures.py) into BENCHMARKS.md and its SVG plots. No dependencies beyond
Python 3.

usage: plot.py RESULTS_DIR OUT_MD PLOT_DIR
RESULTS_DIR holds cas_contention.jsonl, rendezvous_latency.jsonl, store_ops.jsonl,
cost.jsonl, multiproc.jsonl, multiproc_cli.jsonl, machine.json and, when they were run,
multiproc_disk.jsonl, multiproc_cluster.jsonl, clients.jsonl, detect.jsonl, promote.jsonl,
drain.jsonl, rounds.jsonl, killone.jsonl, ceiling.jsonl, ratio.jsonl and c10d.jsonl;
device/ (optional), what scripts/device_figures.sh recorded on a machine of many cores;
notes.md (optional), what the figures of the current run show, is pasted in verbatim before
"Regenerate". A missing file leaves its rows or section out.

Each section of BENCHMARKS.md is written by a function of its own (`*_section`); `main`
calls them in the order of the file.
"""

import json
import math
import os
import re
import statistics
import sys
from collections import defaultdict

# Reference figures (docs/TESTING.md): the reference implementation on this kind of machine (processes, etcd 3.4).
REFERENCE = {16: (1.9, 16, 77), 64: (11.0, 49, 283), 128: (46.0, 114, 607)}
REFERENCE_TIME_TEXT = {16: "1.9 s", 64: "10–12 s", 128: "46 s"}
COLORS = {"mem": "#1b9e77", "etcd": "#d95f02", "redis": "#7570b3", "etcd, processes": "#e7298a",
          "reference (processes)": "#666666"}
MIB = 1024.0

# The targets (issue 16, "Scale"), where a figure has one: in-process workers on one shared
# client, by backend and N (seconds a round, peak MiB); the cold-start processes (`rdzv join`).
TIME_TARGETS = {("mem", 1024): 1.0, ("etcd", 1024): 1.5, ("redis", 1024): 1.5, ("etcd", 4096): 5.0,
                ("redis", 4096): 5.0, ("etcd", 8192): 5.0, ("redis", 8192): 5.0, ("mem", 16384): 3.0}
MEMORY_TARGETS = {1024: 128, 4096: 512, 8192: 512, 16384: 1024}
CLI_TIME_TARGETS = {128: "≤ 0.8 s", 256: "≤ 1.5 s", 512: "–"}


def ceiling_cause(failed):
    """The limit a failed ceiling run met, in one table cell: which limit (as far as the
    failure's own words tell), then the failure's last line."""
    lines = [l.strip() for l in failed.replace("|", "/").splitlines() if l.strip()]
    last = lines[-1] if lines else failed
    if "session lease expired" in failed or "not refreshed within its TTL" in failed:
        limit = "sessions lost (their keep-alives fell behind their TTL: the rate of lease refreshes one client and one etcd sustain here)"
    elif "more than the limit" in failed or "too large" in failed.lower():
        limit = "a request over etcd's size limit (--max-request-bytes)"
    elif "too many requests" in failed:
        limit = "etcd's 'too many requests' (its apply fell behind its commits)"
    else:
        limit = "see benches/results/ceiling.jsonl"
    return f"{limit}; {last[:200]}"


def load(dirname, name):
    """The records of RESULTS_DIR/name, one per JSON line; [] when the file is missing."""
    path = os.path.join(dirname, name)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def fmt_s(x):
    """Seconds in µs, ms or s, whichever suits; – for None."""
    if x is None:
        return "–"
    if x < 0.001:
        return f"{x * 1e6:.0f} µs"
    if x < 1:
        return f"{x * 1e3:.1f} ms"
    return f"{x:.2f} s"


def fmt_rate(x):
    """A rate per second, in k/s from 1,000 on."""
    if x >= 10000:
        return f"{x / 1000:.0f} k/s"
    if x >= 1000:
        return f"{x / 1000:.1f} k/s"
    return f"{x:.0f}/s"


def fmt_n(x, digits=2):
    """A number with `digits` decimals; – for None."""
    return "–" if x is None else f"{x:.{digits}f}"


def spread(values):
    """(median, min, max)"""
    return statistics.median(values), min(values), max(values)


def fmt_spread(values, unit="runs"):
    """`median (min–max, k runs)` of seconds, or – when there are none."""
    if not values:
        return "–"
    med, lo, hi = spread(values)
    return f"{fmt_s(med)} ({fmt_s(lo)}–{fmt_s(hi)}, {len(values)} {unit})"


def median_of(rows, key, digits=2):
    """The median of `key` over the rows that have it, formatted; – if none."""
    v = [r[key] for r in rows if r.get(key) is not None]
    return fmt_n(statistics.median(v), digits) if v else "–"


def by_workers(rows):
    """Rows without failures, grouped by N."""
    out = defaultdict(list)
    for r in rows:
        if not r.get("failures", 0) and not r.get("failed"):
            out[r["workers"]].append(r)
    return out


# ---------------------------------------------------------------- SVG, by hand

def svg_chart(path, title, series, xlabel, ylabel, logy=False, hlines=()):
    """series: {name: [(x, y, lo, hi)]}; x on a log2 axis."""
    w, h, ml, mr, mt, mb = 720, 420, 70, 200, 40, 50
    pts = [p for s in series.values() for p in s if p[1] is not None]
    if not pts:
        return False
    xs = [p[0] for p in pts]
    ys = [v for p in pts for v in (p[1], p[2], p[3]) if v is not None] + [y for y, _ in hlines]
    x0, x1 = math.log2(min(xs)), math.log2(max(xs))
    if x0 == x1:
        x1 = x0 + 1
    if logy:
        ys = [y for y in ys if y > 0]
        y0, y1 = math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys)))
        if y0 == y1:
            y1 += 1
    else:
        y0, y1 = 0.0, max(ys) * 1.1 or 1.0

    def px(x):
        """The x pixel of N."""
        return ml + (math.log2(x) - x0) / (x1 - x0) * (w - ml - mr)

    def py(y):
        """The y pixel of a value (clamped to the axis' floor on a log axis)."""
        v = math.log10(max(y, 10 ** y0)) if logy else y
        return mt + (1 - (v - y0) / (y1 - y0)) * (h - mt - mb)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{ml}" y="24" font-size="15" font-weight="bold">{title}</text>']
    # axes and grid
    for xv in sorted(set(xs)):
        out.append(f'<line x1="{px(xv):.1f}" y1="{mt}" x2="{px(xv):.1f}" y2="{h - mb}" stroke="#eee"/>')
        out.append(f'<text x="{px(xv):.1f}" y="{h - mb + 16}" text-anchor="middle">{xv}</text>')
    if logy:
        ticks = [10 ** e for e in range(y0, y1 + 1)]
    else:
        step = 10 ** math.floor(math.log10(y1 / 5)) if y1 > 0 else 1
        while y1 / step > 8:
            step *= 2
        ticks = [i * step for i in range(int(y1 / step) + 1)]
    for yv in ticks:
        label = fmt_s(yv) if "seconds" in ylabel else (f"{yv:g}")
        out.append(f'<line x1="{ml}" y1="{py(yv):.1f}" x2="{w - mr}" y2="{py(yv):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{ml - 6}" y="{py(yv) + 4:.1f}" text-anchor="end">{label}</text>')
    out.append(f'<line x1="{ml}" y1="{h - mb}" x2="{w - mr}" y2="{h - mb}" stroke="black"/>')
    out.append(f'<line x1="{ml}" y1="{mt}" x2="{ml}" y2="{h - mb}" stroke="black"/>')
    out.append(f'<text x="{(ml + w - mr) / 2}" y="{h - 10}" text-anchor="middle">{xlabel}</text>')
    out.append(f'<text x="16" y="{(mt + h - mb) / 2}" text-anchor="middle" '
               f'transform="rotate(-90 16 {(mt + h - mb) / 2})">{ylabel}</text>')
    for y, label in hlines:
        out.append(f'<line x1="{ml}" y1="{py(y):.1f}" x2="{w - mr}" y2="{py(y):.1f}" stroke="red" stroke-dasharray="5,4"/>')
        out.append(f'<text x="{w - mr - 4}" y="{py(y) - 4:.1f}" text-anchor="end" fill="red">{label}</text>')
    palette = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666"]
    for i, (name, s) in enumerate(series.items()):
        color = COLORS.get(name, palette[i % len(palette)])
        s = sorted(p for p in s if p[1] is not None)
        if not s:
            continue
        dash = ' stroke-dasharray="2,3"' if name.startswith("reference") else ""
        path_d = " ".join(f"{'M' if j == 0 else 'L'}{px(x):.1f},{py(y):.1f}" for j, (x, y, _, _) in enumerate(s))
        out.append(f'<path d="{path_d}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
        for x, y, lo, hi in s:
            if lo is not None and hi is not None:
                out.append(f'<line x1="{px(x):.1f}" y1="{py(lo):.1f}" x2="{px(x):.1f}" y2="{py(hi):.1f}" stroke="{color}"/>')
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}"/>')
        ly = mt + 10 + i * 18
        out.append(f'<line x1="{w - mr + 12}" y1="{ly}" x2="{w - mr + 32}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/>')
        out.append(f'<text x="{w - mr + 38}" y="{ly + 4}">{name}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    return True


# ---------------------------------------------------------------- tables

def back_to_back_rows(runs):
    """Target rows from scripts/bench_rounds.sh's records (rounds.jsonl): `rdzv bench` rounds one
    after another at 1,024 and 8,192 workers on each backend, old rounds deleted beside them."""
    rows = []
    def rounds_of(backend, n):
        """The runs of one backend and size."""
        return [r for r in runs if r["backend"] == backend and r["workers"] == n]
    def completed(rs):
        """The runs that exited 0 with a report."""
        return [r for r in rs if r["exit"] == 0 and r.get("report")]
    def round_ms(rs):
        """Every round's milliseconds over the completed runs."""
        return [ms for r in completed(rs) for ms in r["report"].get("round_ms", [])]
    for b in sorted({r["backend"] for r in runs}):
        medians = {}
        for n in sorted({r["workers"] for r in runs if r["backend"] == b}):
            rs = rounds_of(b, n)
            ok = completed(rs)
            times = [ms / 1000 for ms in round_ms(rs)]
            if times:
                medians[n] = statistics.median(times)
            k = rs[0]["rounds"]
            lost = sum(r["sessions_lost_warnings"] for r in rs)
            target = ("≤ 5 s, every round completing" if b == "etcd" else "every round completing") if n == 8192 else "–"
            rows.append([f"{n} in-process workers, {b}, {k} rounds back to back (`rdzv bench`, old rounds deleted "
                         f"beside the new ones): each round; every round completed in {len(ok)} of {len(rs)} runs, "
                         f"{lost} session-lost warnings", fmt_spread(times, "rounds"), "–", target])
            keep_alives = [r["report"]["ops_per_worker_round"]["lease_keep_alives"] for r in ok
                           if "ops_per_worker_round" in r["report"]]
            memory = [r["report"]["peak_memory_kib"] / MIB for r in ok if r["report"].get("peak_memory_kib")]
            if n == 8192 and memory:
                med, lo, hi = spread(memory)
                rows.append([f"… peak memory (VmHWM of the whole process); lease refreshes per worker per round "
                             f"{fmt_n(statistics.median(keep_alives)) if keep_alives else '–'}",
                             f"{med:.0f} MiB ({lo:.0f}–{hi:.0f}, {len(memory)} runs)", "–", "≤ 512 MiB"])
        if 1024 in medians and 8192 in medians:
            # Runs are interleaved by size (run i of 1,024 just before run i of 8,192), so each
            # pair shares the machine's conditions: the spread of the pairs' ratios shows the noise.
            def run_median(n, i):
                """The median round of run i at size n, or None."""
                t = round_ms([r for r in rounds_of(b, n) if r["run"] == i])
                return statistics.median(t) if t else None
            pairs = []
            for i in sorted({r["run"] for r in rounds_of(b, 1024)}):
                small, large = run_median(1024, i), run_median(8192, i)
                if small and large:
                    pairs.append(large / small)
            pair_text = f"; run by run {min(pairs):.2f}–{max(pairs):.2f} ({len(pairs)} pairs)" if pairs else ""
            rows.append([f"{b}: round time at 8192 / at 1024 workers, rounds back to back (medians over every "
                         "round of the runs above, the sizes' runs interleaved)",
                         fmt_n(medians[8192] / medians[1024]) + pair_text, "–", "≤ 8 (linear)"])
    return rows


def table(header, rows):
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)



# ---------------------------------------------------------------- the records

class Results:
    """Every record file of RESULTS_DIR, loaded once, with the failed records split off
    where the sections show them apart."""

    def __init__(self, res):
        self.dir = res
        self.machine = {}
        if os.path.exists(os.path.join(res, "machine.json")):
            with open(os.path.join(res, "machine.json")) as f:
                self.machine = json.load(f)
        latency = load(res, "rendezvous_latency.jsonl")
        self.lat_failed = [r for r in latency if r.get("failed")]
        self.latency = [r for r in latency if not r.get("failed")]
        self.lat_by = defaultdict(list)
        for r in self.latency:
            self.lat_by[(r["backend"], r["workers"])].append(r["seconds"])
        self.backends = sorted({b for b, _ in self.lat_by})
        self.sizes = sorted({n for _, n in self.lat_by})
        cost = load(res, "cost.jsonl")
        self.cost_crashed = [r for r in cost if r.get("round") == "crashed"]
        self.cost_failed = [r for r in cost if r.get("failed") and r.get("round") != "crashed"]
        self.cost = [r for r in cost if not r.get("failed")]
        self.cost_rounds = [r for r in self.cost if r["round"] in (1, 2)]
        self.mp = load(res, "multiproc.jsonl")
        self.mp_by = defaultdict(list)
        for r in self.mp:
            if r.get("failures", 0) == 0:
                self.mp_by[r["workers"]].append(r)
        self.cli = load(res, "multiproc_cli.jsonl")
        self.disk, self.cluster = load(res, "multiproc_disk.jsonl"), load(res, "multiproc_cluster.jsonl")
        self.clients, self.detect = load(res, "clients.jsonl"), load(res, "detect.jsonl")
        self.rounds, self.killone = load(res, "rounds.jsonl"), load(res, "killone.jsonl")
        self.ceiling, self.promote = load(res, "ceiling.jsonl"), load(res, "promote.jsonl")
        self.drain, self.segments = load(res, "drain.jsonl"), load(res, "segments.jsonl")
        self.c10d, self.ratio = load(res, "c10d.jsonl"), load(res, "ratio.jsonl")
        self.cas, self.store = load(res, "cas_contention.jsonl"), load(res, "store_ops.jsonl")

    def cost_of(self, backend, n):
        """Round 1 and 2 times of the `cost` bench at one backend and size."""
        return [r["seconds"] for r in self.cost_rounds if r["backend"] == backend and r["workers"] == n]

    def cost_bad(self, backend, n):
        """The `cost` bench's failed rounds and crashed processes at one backend and size."""
        return [r for r in self.cost_failed + self.cost_crashed if r["backend"] == backend and r["workers"] == n]


# ---------------------------------------------------------------- title and machine

def intro_section(md):
    """The title, where the file comes from, and where the earlier runs are."""
    md.append("# Benchmarks")
    md.append("")
    md.append("Generated by `scripts/bench.sh` (the one command that reruns everything and rewrites this "
              "file and its plots); raw results in `benches/results/`. Not part of CI. Earlier runs and "
              "their analyses are in the git history of this file and of `benches/results/notes.md` "
              "(`git log -p BENCHMARKS.md`).")
    md.append("")


def machine_section(md, data):
    """## Machine: machine.json's fields, what the servers ran on, and `later` where rows were
    measured again by hand after the run (bench.sh writes machine.json without it)."""
    md.append("## Machine")
    md.append("")
    for k in ["date", "cpu", "nproc", "ram", "kernel", "etcd", "redis", "rustc", "load_before", "load_after", "git"]:
        if k in data.machine:
            md.append(f"- **{k}**: {data.machine[k]}")
    md.append("")
    md.append("etcd and Redis run on loopback, started by the harness (etcd's data directory on tmpfs, "
              "Redis without persistence). The machine is shared: other jobs ran at the same time (see the "
              "load averages above), so absolute times carry that noise; each figure is a median with "
              "its min–max range over the runs stated. The counts (writes, reads, proposals) do not "
              "depend on the machine's speed.")
    md.append("")
    if "later" in data.machine:
        md.append(data.machine["later"])
        md.append("")


# ---------------------------------------------------------------- against the targets

def process_rows(data):
    """Target rows of the gated `join_once` processes on etcd: time, proposals per worker."""
    rows = []
    for n in sorted(data.mp_by):
        med, lo, hi = spread([r["seconds"] for r in data.mp_by[n]])
        props = [r["proposals_per_worker"] for r in data.mp_by[n]
                 if r.get("proposals_per_worker") is not None and r.get("proposals_clean", True)]
        ref = REFERENCE.get(n)
        rows.append([f"{n} processes, etcd: time to complete the round", f"{fmt_s(med)} ({fmt_s(lo)}–{fmt_s(hi)}, {len(data.mp_by[n])} runs)",
                     REFERENCE_TIME_TEXT.get(n, "–"), "≤ 1 s" if n == 128 else "–"])
        if props:
            rows.append([f"{n} processes, etcd: proposals per worker (median of the runs with a clean count)",
                         f"{fmt_n(statistics.median(props))} ({fmt_n(min(props))}–{fmt_n(max(props))}, {len(props)} runs)",
                         str(ref[1]) if ref else "–", "≤ 4"])
    return rows


def round_time_rows(data):
    """Target rows of a round's time in process: 1024 workers (criterion), larger N (`cost`)."""
    rows = []
    for (b, n), v in sorted(data.lat_by.items()):
        if n == 1024:
            target = TIME_TARGETS.get((b, n))
            rows.append([f"1024 in-process workers, {b}", fmt_spread(v, "rounds"), "–",
                         f"≤ {target:g} s" if target else "–"])
    for (b, n), target in sorted(TIME_TARGETS.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if n == 1024:
            continue
        v = data.cost_of(b, n)
        failed = data.cost_bad(b, n)
        measured = fmt_spread(v, "rounds") if v else "–"
        if failed:
            measured += f" ({len(failed)} failed: see the cost section)"
        if v or failed:
            rows.append([f"{n} in-process workers, {b} (`cost` bench, rounds 1 and 2)", measured, "–",
                         f"≤ {target:g} s, every worker completing"])
    return rows


def cold_start_rows(data):
    """Target rows of the cold `rdzv join` processes, and of one client per worker."""
    rows = []
    cli_by = by_workers(data.cli)
    for n in sorted(cli_by):
        if n in CLI_TIME_TARGETS:
            rows.append([f"{n} `rdzv join` processes started cold, etcd: time from the first spawn",
                         fmt_spread([r["seconds"] for r in cli_by[n]]), REFERENCE_TIME_TEXT.get(n, "–"),
                         CLI_TIME_TARGETS[n]])
            rows.append([f"{n} `rdzv join` processes: etcd proposals per process to the round "
                         "(its lease grant and its share of the run's setup included)",
                         median_of(cli_by[n], "proposals_per_worker_to_round"),
                         str(REFERENCE.get(n, (0, "–"))[1]), "≤ 4"])
            rows.append([f"{n} `rdzv join` processes: the same with each process's leave after the round",
                         median_of(cli_by[n], "proposals_per_worker"), "–", "–"])
    for n in sorted({r["workers"] for r in data.clients}):
        rs = [r for r in data.clients if r["workers"] == n]
        ok = [r["seconds"] for r in rs if not r.get("failed")]
        rows.append([f"{n} workers on etcd, one client each (`rdzv bench --client-per-worker`)",
                     f"{len(ok)} of {len(rs)} runs completed; {fmt_spread(ok)}", "–", "completes"])
    return rows


def count_rows(data):
    """Target rows of the `cost` bench's counts: failed leaves, writes, reads, proposals, memory."""
    rows = []
    leaves = [r for r in data.cost if r["round"] == "leave"]
    for r in sorted(leaves, key=lambda r: (r["workers"], r["backend"])):
        if r["workers"] == 4096:
            rows.append([f"4096 handlers leaving at once on one client, {r['backend']}: failed requests",
                         str(r["failed_leaves"]), "–", "0"])
    for key, label, target in [("writes", "writes per worker per round (max over N, rounds)", "≤ 4"),
                               ("reads", "reads per worker per round (max over N, rounds)", "≤ 4")]:
        for b in sorted({r["backend"] for r in data.cost_rounds}):
            v = [r["counts"][key] for r in data.cost_rounds if r["backend"] == b]
            rows.append([f"{b}: {label}", fmt_n(max(v)), "–", target])
    props = [r["proposals"] for r in data.cost_rounds if r.get("proposals") is not None]
    if props:
        rows.append(["etcd proposals per worker per round, in-process (max over N, rounds)", fmt_n(max(props)),
                     "16 / 49 / 114 (N = 16 / 64 / 128)", "≤ 4"])
    for r in sorted((r for r in data.cost if r["round"] == "memory"), key=lambda r: (r["workers"], r["backend"])):
        if r["workers"] in MEMORY_TARGETS:
            rows.append([f"peak memory, {r['workers']} in-process workers, {r['backend']} (VmHWM of the whole process)",
                         f"{r['vmhwm_kib'] / MIB:.0f} MiB", "–", f"≤ {MEMORY_TARGETS[r['workers']]} MiB"])
    return rows


def scale_rows(data):
    """Rows of issue 25's scale figures from the `cost` bench: growth from 1024 to 8192, and
    the server's work per worker at 8192."""
    rows = []
    for b in ("etcd", "redis"):
        small, large = data.cost_of(b, 1024), data.cost_of(b, 8192)
        if small and large:
            ratio = statistics.median(large) / statistics.median(small)
            # Two rounds per size, the first of them cold: too few for the target, which the
            # back-to-back rows check over 20 rounds per size (5 interleaved runs).
            rows.append([f"{b}: round time at 8192 / at 1024 in-process workers (`cost` bench, medians of rounds 1 "
                         "and 2; for the record: the target is checked on the back-to-back rounds below)",
                         fmt_n(ratio), "–", "–"])
        for key, label in (("proposals", "etcd proposals"), ("server_ranges", "etcd key ranges read")):
            v = [r[key] for r in data.cost_rounds if r["backend"] == b and r["workers"] == 8192 and r.get(key) is not None]
            if v:
                rows.append([f"8192 in-process workers, {b}: {label} per worker per round (max of rounds 1 and 2)",
                             fmt_n(max(v)), "–", "≤ 4" if key == "proposals" else "–"])
    return rows


def kill_rows(data):
    """Target rows of one in-process worker cut off among thousands (killone.jsonl)."""
    rows = []
    kill = data.killone
    for ttl in sorted({r["ttl_s"] for r in kill}):
        runs = [r for r in kill if r["ttl_s"] == ttl]
        ok = [r for r in runs if not r.get("failed") and r.get("failure")]
        n = runs[0]["workers"]
        told = [r["failure"]["told_last_s"] for r in ok]
        formed = [r["failure"]["formed_s"] - r["failure"]["told_last_s"] for r in ok]
        rounds = [r["seconds"] for r in ok]
        rows.append([f"{n} in-process workers on etcd, one cut off (keep_alive_ttl {ttl:g} s): the last survivor told "
                     f"({len(ok)} of {len(runs)} runs completed)", fmt_spread(told) if told else "–", "–", f"≤ TTL = {ttl:g} s"])
        if rounds:
            rows.append([f"… then the next round, a spare in the dead member's place (from the last told; "
                         f"the {n} round took {fmt_s(statistics.median(rounds))})", fmt_spread(formed), "–",
                         f"≤ 2 × the round = {fmt_s(2 * statistics.median(rounds))}"])
    return rows


def ceiling_rows(data):
    """Rows of the largest round on one etcd, and the server's cost of each size that completed."""
    ceiling = data.ceiling
    if not ceiling:
        return []
    done = [r for r in ceiling if not r.get("failed")]
    stop = [r for r in ceiling if r.get("failed")]
    largest = max((r["workers"] for r in done), default=None)
    why = f"; {stop[0]['workers']} failed: {ceiling_cause(stop[0]['failed'])}" if stop else "; every size tried completed"
    rows = [[f"the ceiling: the largest round of in-process workers on one etcd with its default limits{why}",
             str(largest) if largest else "–", "–", "written down"]]
    for r in done:
        load = f", load {r['load_before'].split()[0]} before" if r.get("load_before") else ""
        rows.append([f"a round of {r['workers']} in-process workers on one etcd (one run{load}): the round; peak memory "
                     "(VmHWM); the bench's writes and reads per worker per round",
                     f"{fmt_s(r['seconds'])}; {r['peak_memory_kib'] / 1024:.0f} MiB; "
                     f"{fmt_n(r['writes_per_worker_round'])} writes, {fmt_n(r['reads_per_worker_round'])} reads"
                     if "seconds" in r and "peak_memory_kib" in r else "–",
                     "–", "≤ 4 GiB, ≤ 4 writes" if r["workers"] >= 98304 else "–"])
        rows.append([f"the etcd server's cost of a bench run of {r['workers']} (its sessions granted, one round, "
                     "the sessions ended; per 1000 workers): CPU s, proposals; database size",
                     f"{fmt_n(r['server_cpu_s_per_1000'])} s, {fmt_n(r['proposals_per_1000'], 0)}; "
                     f"{r['db_bytes'] / MIB / MIB:.1f} MiB" if r.get("db_bytes") else "–", "–", "–"])
    return rows + ceiling_ratio_rows(done) + median_ratio_rows(data.ratio)


def plural(n):
    """The English plural ending for a count of `n`."""
    return "" if n == 1 else "s"


def median_ratio_rows(ratio):
    """The round time of the large size over that of the small one, from the medians of the quiet
    runs of `etcd_figures.py ratio` (issue 43: t(98,304) ≤ 12 × t(8,192))."""
    good = [r for r in ratio if r.get("quiet") and "seconds" in r]
    sizes = sorted({r["workers"] for r in good})
    if len(sizes) != 2:
        return []
    small, large = ([r["seconds"] for r in good if r["workers"] == n] for n in sizes)
    # Each run writes the small size, then the large one: a pair is a small record and the large
    # one right after it (run numbers repeat when several invocations append to one file).
    each, held = [], None
    for r in good:
        if r["workers"] == sizes[0]:
            held = r["seconds"]
        elif held is not None:
            each.append(r["seconds"] / held)
            held = None
    each.sort()
    left = len(ratio) - len(good)
    # Records older than the `quiet_load` field were all made with the default bound.
    bound = max(r.get("quiet_load", 0.9) for r in good)
    return [[f"etcd: round time at {sizes[1]} / at {sizes[0]} in-process workers, medians of quiet runs "
             f"(`etcd_figures.py ratio`: the sizes in turn, each on a fresh etcd, started at a 1-minute load "
             f"under {bound:g}{f'; {left} run{plural(left)} left out, not quiet or failed' if left else ''})",
             f"{statistics.median(large) / statistics.median(small):.2f} ({fmt_s(statistics.median(large))} over "
             f"{len(large)} runs, {fmt_s(min(large))}–{fmt_s(max(large))}; {fmt_s(statistics.median(small))} over "
             f"{len(small)}); run by run {each[0]:.2f}–{each[-1]:.2f}" if each else "–",
             "–", f"≤ {sizes[1] / sizes[0]:g} (linear)"]]


def ceiling_ratio_rows(done):
    """The round time of the largest completed size over that of 8,192, from the same run of
    the ceiling (issue 43: t(98,304) ≤ 12 × t(8,192))."""
    base = next((r for r in done if r["workers"] == 8192 and "seconds" in r), None)
    top = max((r for r in done if "seconds" in r), key=lambda r: r["workers"], default=None)
    if not base or not top or top is base:
        return []
    factor = top["workers"] / base["workers"]
    return [[f"etcd: round time at {top['workers']} / at 8192 in-process workers (the ceiling runs: one run each, "
             "in one invocation, each size on a fresh etcd)",
             f"{top['seconds'] / base['seconds']:.2f} ({fmt_s(top['seconds'])} and {fmt_s(base['seconds'])})",
             "–", f"≤ {factor:g} (linear)"]]


def promote_rows(data):
    """Target rows of a spare taking a SIGKILLed member's place (promote.jsonl)."""
    rows = []
    promote = data.promote
    for ttl in sorted({r["ttl_s"] for r in promote}):
        rs = [r for r in promote if r["ttl_s"] == ttl]
        ok = [r["promoted_s"] for r in rs if not r.get("failed")]
        kept = sum(bool(r.get("spare_took_the_rank") and r.get("survivors_kept_ranks")) for r in rs)
        rows.append([f"a spare takes a SIGKILLed member's place (`rdzv join` processes, etcd, keep_alive_ttl {ttl} s): "
                     f"from the kill to the spare's round; ranks kept in {kept} of {len(rs)} runs",
                     fmt_spread(ok), "–", f"≤ TTL + 1 s = {ttl + 1:g} s"])
    return rows


def drain_rows(data):
    """Target rows of a member drained by its health check and replaced (drain.jsonl)."""
    rows = []
    for interval in sorted({r["interval_s"] for r in data.drain}):
        rs = [r for r in data.drain if r["interval_s"] == interval]
        ok = [r["replaced_s"] for r in rs if not r.get("failed")]
        gone = [r["victim_worker_gone_s"] for r in rs if r.get("victim_worker_gone_s") is not None]
        kept = sum(bool(r.get("spare_took_the_rank") and r.get("survivors_kept_ranks")) for r in rs)
        failures, grace, ttl = rs[0]["failures"], rs[0]["grace_s"], rs[0]["ttl_s"]
        rows.append([f"a member whose health check turns bad is drained and the spare takes its place (`rdzv run` "
                     f"agents, etcd, --health-check-interval {interval} s × {failures} failures, --grace-period "
                     f"{grace} s, keep_alive_ttl {ttl} s): from the check turning bad to the spare's worker "
                     f"starting; ranks kept in {kept} of {len(rs)} runs; the drained node's worker (it ignores "
                     f"SIGTERM) gone after {fmt_spread(gone)}",
                     fmt_spread(ok), "–", f"≤ interval × failures + grace + 5 s = {interval * failures + grace + 5:g} s"])
    return rows


def segments_rows(data):
    """Target rows of the cost of segment labels (segments.jsonl): round time labelled against
    unlabelled, and the bench's writes and reads per worker with labels."""
    rows = []
    for n in sorted({r["workers"] for r in data.segments}):
        ok = [r for r in data.segments if r["workers"] == n and not r.get("failed")]
        plain = [r["seconds"] for r in ok if not r["labels"]]
        for whole in (False, True):
            labelled = [r for r in ok if r["labels"] and bool(r.get("segment_size")) == whole]
            if not plain or not labelled:
                continue
            labels = labelled[0]["labels"]
            what = (f"{labels} segment labels (interleaved)" if not whole
                    else f"{labels} labels admitted as whole segments (segment_size={labelled[0]['segment_size']})")
            ratio = statistics.median(r["seconds"] for r in labelled) / statistics.median(plain)
            rows.append([f"{n} in-process workers, etcd, {what} against none: round time, median with / median "
                         f"without (without: {fmt_spread(plain)}; with: "
                         f"{fmt_spread([r['seconds'] for r in labelled])})", f"{ratio:.2f}", "–", "≤ 1.10"])
            rows.append([f"{n} in-process workers, etcd, {what}: the bench's writes and reads per worker per "
                         "round (max over the runs)",
                         f"{max(r['writes_per_worker_round'] for r in labelled):.2f} writes, "
                         f"{max(r['reads_per_worker_round'] for r in labelled):.2f} reads", "–", "≤ 4 writes"])
    return rows


def targets_section(md, data):
    """## Against the targets (docs/TESTING.md): one table, a row per figure."""
    md.append("## Against the targets (docs/TESTING.md)")
    md.append("")
    rows = (process_rows(data) + round_time_rows(data) + cold_start_rows(data) + count_rows(data)
            + scale_rows(data) + back_to_back_rows(data.rounds) + kill_rows(data) + ceiling_rows(data)
            + promote_rows(data) + drain_rows(data) + segments_rows(data))
    md.append(table(["figure", "measured", "reference", "target"], rows))
    md.append("")


def c10d_section(md, data):
    """### Against PyTorch's default rendezvous: c10d and rdzv side by side (c10d.jsonl), with the
    variants that show why c10d collapses."""
    c10d = data.c10d
    if not c10d:
        return
    md.append("### Against PyTorch's default rendezvous (torchrun's `c10d` backend)")
    md.append("")
    md.append("`python3 scripts/c10d_compare.py --python <the test venv's python> --sizes 16,32,64 --runs 1 "
              "--after-round stay,exit --c10d-conf ';cas_backoff_max_seconds=0.5,keep_alive_interval=600' "
              "--out benches/results/c10d.jsonl` (run by `scripts/bench.sh`), one run of each, then `--sizes 32,64 "
              "--stagger 1` (the go lines spread evenly over 1 s): N separate worker processes of each system; each imports "
              "its library and connects (c10d: `DynamicRendezvousHandler` over a multi-tenant TCPStore this "
              "script hosts, torch 2.15; rdzv: `rdzv.connect` to a local etcd on tmpfs), then all are told to "
              "go at one instant (a line on each one's stdin), and the time runs until the last has its round "
              "(min = max = N, join timeout 120 s). A worker that has its round *stays* (as torchrun's agents "
              "do while their workers train) or *exits*. Beside each figure: the load average (1 min) before "
              "the run — it still counts the previous run's N processes importing torch, so the check that "
              "nothing else ran is the number of runnable tasks at the go (the harness itself is one); the "
              "load each system makes during its run is part of its result. 128 processes do not fit this "
              "machine: 128 Python processes importing torch took 208 MiB each, 22 GiB of its 24, and it "
              "thrashed and killed some for memory before the first run began (tried 2026-12-05, stopped); "
              "128 and more need a larger machine.")
    md.append("")
    md.append(c10d_table(c10d))
    md.append("")
    md.append("Why c10d collapses, read in torch 2.15's `torch/distributed/elastic/rendezvous/"
              "dynamic_rendezvous.py`: every node joins by a compare-and-set of *one* value, the pickled "
              "state holding every participant and its last heartbeat (`_BackendRendezvousStateHolder.sync` "
              "→ `C10dRendezvousBackend.set_state`, a TCPStore `compare_set`), so each attempt ships and "
              "pickles O(N) bytes and only one of the nodes racing wins. A node whose write lost re-reads and "
              "writes again at once: `cas_backoff_max_seconds` defaults to 0 (`_DistributedRendezvousOpExecutor."
              "run` waits only when it is above 0). And a node that has joined and waits for the rest sends a "
              "keep-alive every `keep_alive_interval` (5 s): `_RendezvousJoinOp` returns `KEEP_ALIVE`, one more "
              "write of the whole state racing the nodes still joining. Once N processes on two cores make "
              "the join last past 5 s, every joined node adds its heartbeats to the race, and at 64 the join "
              "does not converge within its 120 s. The variants say which part does it: whether a worker "
              "stays or exits after its round changes nothing (with min = max = N no worker has its round "
              "before the last one joins, so no finished member is writing), nor does a plain TCPStore "
              "instead of a multi-tenant one (a preparatory run, not in the table: 16 processes 1.36 s "
              "multi-tenant, 1.49 s plain; 32 processes 5.10 s and 4.52 s; 64 processes both timed out, "
              "staying or exiting); a random backoff after a lost write "
              "(`cas_backoff_max_seconds=0.5`) and no heartbeats during the join (`keep_alive_interval=600`) "
              "take 64 processes from the timeout to seconds. Workers told to go one after another over 1 s "
              f"(as when each starts once it has imported torch) help at 32 ({c10d_took(c10d, 32, True)} "
              f"instead of {c10d_took(c10d, 32, False)} in this table) but not at 64 "
              f"({c10d_took(c10d, 64, True)}): the outside report of c10d completing 64 processes in 1.6 s "
              "is not reproduced by any difference tried here. Both options are torch's "
              "(`--rdzv-conf`), which torchrun leaves at their defaults. rdzv has no shared value to race for: "
              "each worker creates its own join key and counts its position, and a failed create is an "
              "answer, not a retry.")
    md.append("")


def c10d_took(c10d, n, staggered):
    """How long c10d with torch's defaults took at `n` processes staying after their round,
    told to go together or one after another: the first such run in `c10d`."""
    for r in c10d:
        if (r["system"] == "c10d" and r["workers"] == n and r.get("after_round", "stay") == "stay"
                and not r.get("c10d_conf") and bool(r.get("stagger_s")) == staggered):
            return fmt_s(r["seconds"]) if not r.get("failed") else "timed out"
    return "not run"


def c10d_table(c10d):
    """c10d_compare.py's runs as a table, sorted by size, variant and system."""
    rows = []
    for r in sorted(c10d, key=lambda r: (r["workers"], r.get("after_round") != "stay", r.get("stagger_s") or 0,
                                         r["system"] != "c10d", r.get("c10d_conf") or "")):
        what = "rdzv" if r["system"] == "rdzv" else f"c10d, {r.get('c10d_conf') or 'torch defaults'}"
        took = fmt_s(r["seconds"]) if not r.get("failed") else (
            "timed out (`RendezvousTimeoutError`)" if "Timeout" in r["failed"] else f"failed: {r['failed'][:80]}")
        load = (r.get("load_before") or r.get("load_at_start") or "?").split()[0]
        start = f"spread over {r['stagger_s']:g} s" if r.get("stagger_s") else "together"
        rows.append([r["workers"], start, r.get("after_round", "stay"), what, took, load,
                     r.get("runnable_at_go", "?")])
    return table(["N processes", "told to go", "after its round", "system", "last worker's round (from the "
                  "first go)", "load before", "runnable at the go"], rows)


def device_section(md, res):
    """### On a machine of many cores: what scripts/device_figures.sh recorded in
    RESULTS_DIR/device/ (machine.json, inproc.jsonl, c10d.jsonl), or that it has not run."""
    device = os.path.join(res, "device")
    if not os.path.exists(os.path.join(device, "machine.json")):
        md.append("### On a machine with 16 cores or more")
        md.append("")
        md.append("Not measured yet: no such machine was at hand. `scripts/device_figures.sh` is the prepared "
                  "command (docs/TESTING.md): c10d against rdzv at 64, 128 and 256 processes, and one round of "
                  "8,192, 32,768 and 98,304 in-process members on one etcd; its files go into "
                  "`benches/results/device/`, and this section shows them.")
        md.append("")
        return
    with open(os.path.join(device, "machine.json")) as f:
        machine = json.load(f)
    md.append(f"### On a machine of {machine['cores']} cores")
    md.append("")
    md.append(f"{machine['cpu']}, {machine['memory_gib']} GiB, kernel {machine['kernel']}; torch "
              f"{machine['torch']}, {machine['etcd']}, rdzv built from {machine.get('build', '?')}; "
              f"{machine['date']}, by `scripts/device_figures.sh run`. Every figure of this section is of "
              f"that machine of {machine['cores']} cores, none of the rest of this file.")
    md.append("")
    rows = []
    for r in load(device, "inproc.jsonl"):
        took = fmt_s(r["seconds"]) if "seconds" in r else f"failed: {ceiling_cause(r.get('failed', ''))}"
        memory = f"{r['peak_memory_kib'] / 1024:.0f} MiB" if "peak_memory_kib" in r else "–"
        rows.append([r["workers"], took, memory,
                     f"{fmt_n(r.get('writes_per_worker_round'))} / {fmt_n(r.get('reads_per_worker_round'))}",
                     f"{fmt_n(r.get('server_cpu_s_per_1000'))} s", r.get("load_before", "?").split()[0]])
    if rows:
        md.append(table(["in-process members on one etcd (one round, a fresh etcd each)", "round", "peak memory",
                         "writes / reads per worker", "etcd CPU per 1000", "load before"], rows))
        md.append("")
    c10d = load(device, "c10d.jsonl")
    if c10d:
        md.append(c10d_table(c10d))
        md.append("")


def failed_runs(rows, describe):
    """`describe(row): its error` for each failed run of `rows`, joined; `none` when none failed."""
    return ", ".join(f"{describe(r)}: {r['failed'][:160]}" for r in rows if r.get("failed")) or "none"


def run_window(rows):
    """When the runs of `rows` ran, and the load average at the first and the last."""
    return (f"Run {rows[0].get('date', '?')} to {rows[-1].get('date', '?')}, load average (1/5/15 min) "
            f"{rows[0].get('load', '?')} at the first run and {rows[-1].get('load', '?')} at the last")


def promote_section(md, data):
    """The paragraph on spare promotion that ends the targets: how it was run, and when."""
    promote = data.promote
    if not promote:
        return
    workers = sorted({r["workers"] for r in promote})
    failed = failed_runs(promote, lambda r: f"TTL {r['ttl_s']} s run {r['run']}")
    md.append("Spare promotion (`python3 scripts/etcd_figures.py promote --rdzv target/release/rdzv --workers 4 "
              "--ttls 3,10 --runs 5 --out benches/results/promote.jsonl`, run by `scripts/bench.sh`): "
              f"{', '.join(map(str, workers))} "
              "`rdzv join … --hold` processes on etcd form a full round (min = max = N), one more waits "
              "as a spare; about 1 s after `rdzv status` sees it, a member (not rank 0) is killed with "
              "SIGKILL, and the time runs until the spare printed its round. The lease of the dead member "
              "expires between ⅔ TTL and one TTL after its last refresh (every TTL/3); the rest is the "
              "round forming at once (full: no last call), with every survivor keeping its rank and the "
              f"spare taking the dead one's. {run_window(promote)}. Failed runs: {failed}.")
    md.append("")


def drain_section(md, data):
    """The paragraph on health drains that ends the targets: how it was run, and when."""
    drain = data.drain
    if not drain:
        return
    failed = failed_runs(drain, lambda r: f"interval {r['interval_s']} s run {r['run']}")
    md.append("Health drain (`python3 scripts/etcd_figures.py drain --rdzv target/release/rdzv --workers 3 "
              "--intervals 1,5 --runs 5 --out benches/results/drain.jsonl`, run by `scripts/bench.sh`): "
              f"{drain[0]['workers']} `rdzv run` agents on etcd with a health check (a file test) form a "
              "full round, one more waits as a spare; each runs one worker that ignores SIGTERM, so every "
              "stop of workers takes the whole grace period before SIGKILL. About 1 s after `rdzv status` "
              "sees the spare, a member's check (not rank 0's) starts failing; the time runs until the "
              "spare's worker starts. The first failed check comes up to one interval after the change, and "
              "after `failures` in a row the member revokes its session: the others see it gone at once (no "
              "TTL wait), stop their workers (the grace period) and re-form with the spare, while the "
              f"drained member stops its own. Hence about interval × failures + grace. {run_window(drain)}. "
              f"Failed runs: {failed}.")
    md.append("")


def segments_section(md, data):
    """The paragraph on the cost of segments that ends the targets: how it was run, and when."""
    seg = data.segments
    if not seg:
        return
    failed = failed_runs(
        seg, lambda r: f"N={r['workers']} labels {r['labels']} segment_size {r.get('segment_size')} run {r['run']}")
    loads = [r["load_before"] for r in seg]
    md.append("Segments (`python3 scripts/etcd_figures.py segments --rdzv target/release/rdzv --sizes 1024,8192 "
              "--labels 64 --runs 6 --out benches/results/segments.jsonl`, run by `scripts/bench.sh`): "
              "`rdzv bench` of N in-process workers on one client against a local etcd, one round, "
              "in turn (each run starting with another of the three) without labels, with `--segments 64` "
              "(worker i in `s<i mod 64>`, so each segment's workers arrive interleaved with the others': "
              "the most regrouping), and with those labels admitted as whole segments (`segment_size=N/64` "
              "in the URL: every segment complete, each in its block). At 1,024 workers a round takes a "
              "fifth of a second and the runs spread as much as the variants differ: a ratio a tenth either "
              "side of 1 there is noise, not a gain or a cost. The labels add a few bytes per member to "
              "the values and a grouping of the newcomers to the freeze; the key count and the number of "
              "calls do not change. Load average (1 min) before each run "
              f"from {min(loads):.2f} to {max(loads):.2f} (the bench and etcd load the machine "
              f"themselves). Failed runs: {failed}.")
    md.append("")


# ---------------------------------------------------------------- latency

def latency_section(md, data):
    """## Rendezvous latency, in-process workers (rendezvous_latency.jsonl), with the phases."""
    md.append("## Rendezvous latency, in-process workers")
    md.append("")
    md.append("`benches/rendezvous_latency.rs`: N workers (min = max = N) in one process on one shared client, "
              "all calling `Rendezvous::next_rendezvous` (bootstrap exchange included) at once; the time until "
              "the last returned. Median (min–max) over the rounds criterion ran; the slowest worker's "
              "phase timings (median) show where the time goes.")
    md.append("")
    rows = []
    for n in data.sizes:
        row = [n]
        for b in data.backends:
            v = data.lat_by.get((b, n))
            if v:
                med, lo, hi = spread(v)
                row.append(f"{fmt_s(med)} ({fmt_s(lo)}–{fmt_s(hi)}, {len(v)})")
            else:
                row.append("–")
        rows.append(row)
    md.append(table(["N"] + [f"{b}: median (min–max, rounds)" for b in data.backends], rows))
    md.append("")
    if data.lat_failed:
        md.append("**Failed rounds** (not in the figures above; a failed size stops that backend's larger sizes):")
        md.append("")
        for r in data.lat_failed:
            md.append(f"- {r['backend']}, N = {r['workers']}: after {fmt_s(r['seconds'])}: {r['failed']}")
        md.append("")
    phases_table(md, data)


def phases_table(md, data):
    """The slowest worker's phases at each N and backend, folded in a <details>."""
    rows = []
    for n in data.sizes:
        for b in data.backends:
            rs = [r for r in data.latency if r["backend"] == b and r["workers"] == n]
            if rs:
                rows.append([n, b, fmt_s(statistics.median(r["max_joined"] for r in rs)),
                             fmt_s(statistics.median(r["max_frozen"] for r in rs)),
                             fmt_s(statistics.median(r["max_completed"] for r in rs)),
                             fmt_s(statistics.median(r["seconds"] for r in rs))])
    md.append("<details><summary>Phases (slowest worker, from its call: joined → frozen → final; then all returned)</summary>")
    md.append("")
    md.append(table(["N", "backend", "joined", "frozen", "final", "all returned"], rows))
    md.append("")
    md.append("</details>")
    md.append("")


def processes_section(md, data):
    """## Rendezvous latency, separate processes on etcd: `join_once` (multiproc.jsonl), then
    the cold `rdzv join` processes."""
    mp = data.mp
    md.append("## Rendezvous latency, separate processes on etcd")
    md.append("")
    worker = mp[0]["worker"].split("/")[-1] if mp else "?"
    md.append(f"`scripts/multiproc.py`: N worker processes (`{worker}`) against a local "
              "etcd, min = max = N; time from just before the first spawn until the last process exited after "
              "its round. Each process is spawned first and waits for a common start instant (`RDZV_START_AT`), "
              "then connects (its own runtime, client and session) and rendezvouses, so the Python launcher's "
              "spawn speed is out of the figure but connecting is in. Proposals per worker include creating "
              "the worker (session and run leases) and rank 0's bootstrap write, counted on every run, each "
              "started after the earlier runs' leases expired (`--settle-every-run`): their median.")
    md.append("")
    rows = []
    for n in sorted(data.mp_by):
        rs = data.mp_by[n]
        med, lo, hi = spread([r["seconds"] for r in rs])
        props = [r["proposals_per_worker"] for r in rs
                 if r.get("proposals_per_worker") is not None and r.get("proposals_clean", True)]
        rows.append([n, len(rs), fmt_s(med), f"{fmt_s(lo)}–{fmt_s(hi)}",
                     fmt_s(statistics.median(r["spawn_seconds"] for r in rs)),
                     fmt_s(statistics.median(r["max_connect_s"] or 0 for r in rs)),
                     fmt_n(statistics.median(props)) if props else "–",
                     REFERENCE_TIME_TEXT.get(n, "–"), REFERENCE.get(n, (0, "–"))[1]])
    md.append(table(["N", "runs", "median", "min–max", "spawning all", "slowest connect",
                     "etcd proposals / worker", "reference time", "reference proposals / worker"], rows))
    cold_start_table(md, data)
    failed = [r for r in mp if r.get("failures", 0)]
    if failed:
        md.append("")
        md.append(f"{len(failed)} run(s) had failing workers and are left out: "
                  + "; ".join(f"N={r['workers']}: {r['failures']} failed ({r['failure_sample'][:1]})" for r in failed))
    md.append("")


def cold_start_table(md, data):
    """The cold `rdzv join` processes (multiproc_cli.jsonl): time, proposals, ranges, CPU."""
    cli = data.cli
    if not cli:
        return
    md.append("")
    md.append("The same with `rdzv join <url> --hold 2s --format json` processes (the CLI: it stays a member "
              "2 s after printing its round, then leaves the run), started by the launcher one after the other "
              "with no start gate: time from the first spawn until the last had printed its round (the harness "
              "polls their output every 5 ms), spawning included. etcd's proposals are read twice: when every "
              "process had printed (the rendezvous, its lease grants and the run's setup included) and after "
              "they all exited (their leaves too).")
    md.append("")
    by = defaultdict(list)
    for r in cli:
        if r.get("failures", 0) == 0:
            by[r["workers"]].append(r)
    rows = []
    for n in sorted(by):
        med, lo, hi = spread([r["seconds"] for r in by[n]])
        rows.append([n, len(by[n]), fmt_s(med), f"{fmt_s(lo)}–{fmt_s(hi)}",
                     fmt_s(statistics.median(r["spawn_seconds"] for r in by[n])),
                     median_of(by[n], "proposals_per_worker_to_round"),
                     median_of(by[n], "proposals_per_worker"), median_of(by[n], "ranges_per_worker"),
                     median_of(by[n], "server_cpu_s_per_1000"), REFERENCE_TIME_TEXT.get(n, "–")])
    md.append(table(["N", "runs", "median", "min–max", "spawning all", "etcd proposals / worker to the round",
                     "etcd proposals / worker (leave included)",
                     "etcd key ranges read / worker", "etcd CPU s / 1000 workers", "reference time"], rows))
    bad = [r for r in cli if r.get("failures", 0)]
    if bad:
        md.append("")
        md.append(f"{len(bad)} run(s) had failing workers: " + "; ".join(
            f"N={r['workers']}: {r['failures']} failed ({r['failure_sample'][:1]})" for r in bad))


# ---------------------------------------------------------------- cost

def cost_section(md, data):
    """## Cost per worker per round (cost.jsonl): counts, failures, memory, time, leaves."""
    md.append("## Cost per worker per round")
    md.append("")
    md.append("`benches/cost.rs`: N in-process workers (`RendezvousHandler`, the protocol alone) on one shared "
              "client wrapped in `CountingKv`. Writes = puts, deletes, lease grants/revokes (lease refreshes "
              "aside); reads = gets and ranges; on etcd also the server's own committed Raft proposals "
              "(`etcd_server_proposals_committed_total` before and after the round, so it includes every "
              "write the server made, lease refreshes excepted as etcd does not propose them), the key "
              "ranges it read (`etcd_mvcc_range_total`: range requests and transactions' compares and reads) "
              "and its CPU time (`process_cpu_seconds_total`, per 1000 workers). Round 1 is "
              "the first rendezvous, round 2 everyone calling `next_rendezvous` again. `setup` is creating "
              "the workers (session and run leases). These counts do not depend on the machine.")
    md.append("")
    rows = []
    for r in data.cost:
        if r["round"] in (1, 2, "setup"):
            c = r["counts"]
            rows.append([r["backend"], r["workers"], r["round"], fmt_n(c["writes"]), fmt_n(c["reads"]),
                         fmt_n(c["watches"]), fmt_n(r.get("proposals")), fmt_n(r.get("server_ranges")),
                         fmt_n(r.get("server_cpu_s_per_1000")), fmt_s(r.get("seconds"))])
    md.append(table(["backend", "N", "round", "writes / worker", "reads / worker", "watches / worker",
                     "etcd proposals / worker", "etcd key ranges read / worker", "etcd CPU s / 1000 workers",
                     "time"], rows))
    md.append("")
    cost_failures(md, data)
    memory_table(md, data)
    time_memory_table(md, data)
    leave_table(md, data)


def cost_failures(md, data):
    """The `cost` bench's sizes whose process did not finish, and its failed rounds."""
    if data.cost_crashed:
        md.append("**Sizes whose bench process did not finish** (`scripts/bench.sh` records these and goes on):")
        md.append("")
        for r in data.cost_crashed:
            md.append(f"- {r['backend']}, N = {r['workers']}: {r['failed']}, after {fmt_s(r.get('seconds'))}")
        md.append("")
    if data.cost_failed:
        md.append("**Failed rounds** (left out of the table):")
        md.append("")
        for r in data.cost_failed:
            md.append(f"- {r['backend']}, N = {r['workers']}, round {r['round']}: {r['failed']} of {r['workers']} "
                      f"workers failed after {fmt_s(r['seconds'])} ({r['returned']} returned): "
                      f"{'; '.join(r['errors'])[:400]}. State key then: `{r['state'][:200]}`")
        md.append("")


def memory_table(md, data):
    """Peak resident memory of the `cost` bench's process at each backend and size."""
    rows = [[r["backend"], r["workers"], f"{r['vmhwm_kib'] / 1024:.0f} MiB", f"{r['rss_before_kib'] / 1024:.0f} MiB",
             "yes" if r.get("peak_reset") else "no (whole process)"]
            for r in data.cost if r["round"] == "memory"]
    md.append("Peak resident memory of the bench process (VmHWM; `scripts/bench.sh` runs each backend and size "
              "in a fresh process, with a fresh server), with the RSS before the workers were created:")
    md.append("")
    md.append(table(["backend", "N", "peak (VmHWM)", "RSS before", "peak reset before this size"], rows))
    md.append("")


def time_memory_table(md, data):
    """A round's time and the peak memory against N, a column pair per backend (as plotted)."""
    cost, bad_rows = data.cost, data.cost_failed + data.cost_crashed
    cost_backends = sorted({r["backend"] for r in cost if r["round"] in (1, 2, "memory")}
                           | {r["backend"] for r in bad_rows})
    cost_sizes = sorted({r["workers"] for r in cost if r["round"] in (1, 2, "memory")}
                        | {r["workers"] for r in bad_rows})
    if not cost_backends:
        return
    md.append("Time and peak memory against N (the plots below): a round's time (median of rounds 1 and 2, "
              "min–max) and the peak memory; `failed` where a round or the whole process failed at that size.")
    md.append("")
    rows = []
    for n in cost_sizes:
        row = [n]
        for b in cost_backends:
            v = data.cost_of(b, n)
            peak = [r["vmhwm_kib"] for r in cost if r["round"] == "memory" and r["backend"] == b and r["workers"] == n]
            bad = data.cost_bad(b, n)
            cell = fmt_spread(v, "rounds") if v else ("failed" if bad else "–")
            if v and bad:
                cell += ", then failed"
            row += [cell, f"{peak[0] / MIB:.0f} MiB" if peak else "–"]
        rows.append(row)
    md.append(table(["N"] + [h for b in cost_backends for h in (f"{b}: time", f"{b}: peak memory")], rows))
    md.append("")


def leave_table(md, data):
    """All N handlers leaving at once on the one client: time and failed requests."""
    leaves = [r for r in data.cost if r["round"] == "leave"]
    if not leaves:
        return
    md.append("All N handlers leaving at once on the one client (`shutdown`, after the rounds): time and "
              "failed requests.")
    md.append("")
    md.append(table(["backend", "N", "time", "failed leaves", "errors"],
                    [[r["backend"], r["workers"], fmt_s(r["seconds"]), r["failed_leaves"],
                      "; ".join(r.get("errors", []))[:200] or "–"] for r in leaves]))
    md.append("")


# ---------------------------------------------------------------- figures without a target

def extra_figures_section(md, data):
    """## Figures without a target: one client per worker, etcd on disk and as a 3-member
    cluster, failure detection against the keep-alive TTL, etcd's CPU time."""
    etcd_cost = [r for r in data.cost_rounds if r.get("server_cpu_s_per_1000") is not None]
    if not (data.clients or data.disk or data.cluster or data.detect or etcd_cost):
        return
    md.append("## Figures without a target")
    md.append("")
    clients_figures(md, data)
    disk_cluster_figures(md, data)
    detect_figures(md, data)
    cpu_figures(md, data, etcd_cost)


def clients_figures(md, data):
    """### One client per worker (clients.jsonl)."""
    clients = data.clients
    if not clients:
        return
    md.append("### One client per worker (what the server sees from separate hosts)")
    md.append("")
    md.append("`rdzv bench <etcd> --workers N --rounds 1 --client-per-worker` (`scripts/etcd_figures.py clients`): "
              "N in-process workers, each on a thread and runtime of its own with its own etcd client and "
              "connections (as on N hosts), against a local etcd on tmpfs. Time: the round, from all workers calling "
              "until the last returned (creating the clients and sessions is not in it). Writes and reads per "
              "worker: counted by the clients, in the round. The server's side is read around the whole "
              "command (creating N sessions, the round, N workers leaving): etcd's committed proposals and "
              "the key ranges it read (`etcd_mvcc_range_total`: range requests and transactions' compares "
              "and reads) per worker, and its CPU time per 1000 workers.")
    md.append("")
    rows = []
    for n in sorted({r["workers"] for r in clients}):
        rs = [r for r in clients if r["workers"] == n]
        ok = [r for r in rs if not r.get("failed")]
        rows.append([n, f"{len(ok)} of {len(rs)}", fmt_spread([r["seconds"] for r in ok]),
                     median_of(ok, "writes_per_worker_round"), median_of(ok, "reads_per_worker_round"),
                     median_of(ok, "proposals_per_worker"), median_of(ok, "ranges_per_worker"),
                     median_of(ok, "server_cpu_s_per_1000"),
                     f"{statistics.median(r['peak_memory_kib'] for r in ok) / MIB:.0f} MiB"
                     if ok and all(r.get("peak_memory_kib") for r in ok) else "–",
                     fmt_s(statistics.median(r["wall_seconds"] for r in ok)) if ok else "–"])
    md.append(table(["N", "runs completed", "round: median (min–max)", "writes / worker (round)",
                     "reads / worker (round)", "etcd proposals / worker (whole command)",
                     "etcd key ranges read / worker (whole command)", "etcd CPU s / 1000 workers (whole command)",
                     "peak memory of the bench", "whole command"], rows))
    bad = [r for r in clients if r.get("failed")]
    if bad:
        md.append("")
        md.append("Failed: " + "; ".join(f"N = {r['workers']}, run {r['run']}: {r['failed'][:300]}" for r in bad))
    md.append("")


def disk_cluster_figures(md, data):
    """### etcd with its data on disk, and a 3-member cluster (multiproc_disk.jsonl,
    multiproc_cluster.jsonl), beside the tmpfs runs of the same size."""
    disk, cluster = data.disk, data.cluster
    if not (disk or cluster):
        return
    md.append("### etcd with its data on disk, and a 3-member cluster")
    md.append("")
    md.append("The cold-start runs above (`rdzv join … --hold 0s` processes, started one after the other from "
              "the first spawn, leave included) at one size, against three etcd set-ups: one member with its data "
              "on tmpfs (the tables above), one member with its data on disk (every commit waits for an fsync), "
              "and three members on loopback (the URL lists all three; each process talks to one of them, and "
              "every commit needs a majority). Proposals are as one member counts them; key ranges read and "
              "CPU time are summed over the members (each member applies every transaction, compares "
              "included).")
    md.append("")
    rows = []
    sizes = sorted({r["workers"] for r in disk + cluster})
    for label, rs_all in [("1 member, tmpfs", data.cli), ("1 member, on disk", disk),
                          ("3 members, tmpfs", cluster)]:
        for n in sizes:
            rs = by_workers(rs_all).get(n, [])
            failed = [r for r in rs_all if r["workers"] == n and (r.get("failures") or r.get("failed"))]
            if not rs and not failed:
                continue
            data_on = sorted({r.get("etcd_data", "?") for r in rs_all if r["workers"] == n})
            rows.append([label, ", ".join(data_on), n, fmt_spread([r["seconds"] for r in rs]),
                         median_of(rs, "proposals_per_worker"), median_of(rs, "ranges_per_worker"),
                         median_of(rs, "server_cpu_s_per_1000"), len(failed)])
    md.append(table(["etcd", "data on", "N", "time: median (min–max)", "proposals / process",
                     "key ranges read / process", "etcd CPU s / 1000 workers", "runs with failures"], rows))
    md.append("")


def detect_figures(md, data):
    """### Failure detection against the keep-alive TTL (detect.jsonl)."""
    detect = data.detect
    if not detect:
        return
    md.append("### Failure detection against the keep-alive TTL")
    md.append("")
    workers = sorted({r["workers"] for r in detect})
    md.append(f"`scripts/etcd_figures.py detect`: {', '.join(map(str, workers))} `rdzv join … --hold` processes "
              "on etcd form a round (min = N − 1, max = N, `last_call_timeout=1s`, `keep_alive_ttl` as below); "
              "about 1 s later one member (not rank 0) is killed with SIGKILL, so its lease is neither "
              "refreshed nor revoked. Told: from the kill until a survivor printed that its round is over "
              "(`Rendezvous::round_broken`: the member's keep-alive key went when its lease expired on the "
              "server). Next round: until the last survivor printed the round of N − 1. Medians over runs "
              "(min–max of the last survivor told).")
    md.append("")
    rows = []
    for ttl in sorted({r["ttl_s"] for r in detect}):
        rs = [r for r in detect if r["ttl_s"] == ttl and not r.get("failed")]
        bad = [r for r in detect if r["ttl_s"] == ttl and r.get("failed")]
        last = [r["told_last_s"] for r in rs]
        nexts = [r["next_round_last_s"] for r in rs if r.get("next_round_last_s") is not None]
        rows.append([f"{ttl} s", len(rs), median_of(rs, "told_first_s"),
                     f"{fmt_n(statistics.median(last))} ({fmt_n(min(last))}–{fmt_n(max(last))})" if last else "–",
                     f"{statistics.median(last) / ttl:.2f}" if last else "–",
                     fmt_n(statistics.median(nexts)) if nexts else "–", len(bad)])
    md.append(table(["keep_alive_ttl", "runs", "first survivor told (s)", "last survivor told (s)",
                     "last told / TTL", "next round, last survivor (s)", "failed runs"], rows))
    reasons = sorted({re.sub(r"rank \d+", "rank k", x) for r in detect for x in r.get("reasons", [])})
    if reasons:
        md.append("")
        md.append("Reasons the survivors gave: " + "; ".join(f"“{x}”" for x in reasons[:4]) + ".")
    bad = [r for r in detect if r.get("failed")]
    if bad:
        md.append("")
        md.append("Failed: " + "; ".join(f"TTL {r['ttl_s']} s, run {r['run']}: {r['failed'][:200]}" for r in bad))
    md.append("")


def cpu_figures(md, data, etcd_cost):
    """### etcd's CPU time per 1000 workers, from every record that has it."""
    cpu_rows = []
    for n in sorted({r["workers"] for r in etcd_cost}):
        for rnd in (1, 2):
            v = [r["server_cpu_s_per_1000"] for r in etcd_cost if r["workers"] == n and r["round"] == rnd]
            if v:
                cpu_rows.append([f"in-process, one client (`cost` bench, round {rnd})", n, fmt_n(statistics.median(v))])
    for label, rows_all in [("processes (`join_once`, gated; creation included)", data.mp),
                            ("processes (`rdzv join`, cold; creation and leave included)", data.cli),
                            ("one client per worker (`rdzv bench --client-per-worker`, whole command)", data.clients)]:
        for n, rs in sorted(by_workers(rows_all).items()):
            v = [r["server_cpu_s_per_1000"] for r in rs if r.get("server_cpu_s_per_1000") is not None]
            if v:
                cpu_rows.append([label, n, f"{fmt_n(statistics.median(v))} ({fmt_n(min(v))}–{fmt_n(max(v))})"])
    if not cpu_rows:
        return
    md.append("### etcd's CPU time per 1000 workers")
    md.append("")
    md.append("utime + stime of the etcd process over a round (`process_cpu_seconds_total` from its `/metrics` "
              "in the `cost` bench; `/proc/<pid>/stat` in the scripts), divided by N / 1000: the server's "
              "cost of a rendezvous of 1000 workers, on this machine's cores. Median (min–max) over runs; "
              "the counters tick in 10 ms, so small N are coarse.")
    md.append("")
    md.append(table(["workers", "N", "etcd CPU s / 1000 workers"], cpu_rows))
    md.append("")


# ---------------------------------------------------------------- CAS and Store

def cas_section(md, data):
    """## CAS contention (cas_contention.jsonl): commits per second and conflicts per commit."""
    md.append("## CAS contention")
    md.append("")
    md.append("`benches/cas_contention.rs`: k writers increment one key by compare-and-swap through one client. "
              "`reread`: get, put if unchanged, on conflict read again. `swap`: `KvExt::compare_and_swap`, whose "
              "lost swap returns the winner's value (no re-read). Committed increments per second: the "
              "median over criterion's samples (min–max); conflicts per commit over all samples.")
    md.append("")
    groups = defaultdict(list)
    for r in data.cas:
        groups[(r["backend"], r["mode"], r["writers"])].append(r)
    rows = []
    for b in sorted({k[0] for k in groups}):
        for k in sorted({k[2] for k in groups if k[0] == b}):
            row = [b, k]
            for mode in ["reread", "swap"]:
                rs = [r for r in groups.get((b, mode, k), []) if r["seconds"] > 0]
                if not rs:
                    row += ["–", "–"]
                    continue
                rates = [r["commits"] / r["seconds"] for r in rs]
                med, lo, hi = spread(rates)
                row.append(f"{fmt_rate(med)} ({fmt_rate(lo)}–{fmt_rate(hi)})")
                row.append(fmt_n(sum(r["conflicts"] for r in rs) / max(1, sum(r["commits"] for r in rs))))
            rows.append(row)
    md.append(table(["backend", "writers", "reread: commits/s", "reread: conflicts/commit",
                     "swap: commits/s", "swap: conflicts/commit"], rows))
    md.append("")


def store_section(md, data):
    """## Store operations (store_ops.jsonl): set, get and add per second, 1 and 16 callers."""
    md.append("## Store operations")
    md.append("")
    md.append("`benches/store_ops.rs`: `set` (64-byte value), `get`, `add` through one shared client; one "
              "caller, or 16 concurrent callers each on its own key. Operations per second: median over "
              "criterion's samples (min–max).")
    md.append("")
    groups = defaultdict(list)
    for r in data.store:
        if r["seconds"] > 0:
            groups[(r["backend"], r["op"], r["callers"])].append(r["ops"] / r["seconds"])
    rows = []
    for b in sorted({k[0] for k in groups}):
        for op in ["set", "get", "add"]:
            row = [b, op]
            for callers in [1, 16]:
                v = groups.get((b, op, callers))
                if v:
                    med, lo, hi = spread(v)
                    row.append(f"{fmt_rate(med)} ({fmt_rate(lo)}–{fmt_rate(hi)})")
                else:
                    row.append("–")
            rows.append(row)
    md.append(table(["backend", "op", "1 caller", "16 callers"], rows))
    md.append("")


# ---------------------------------------------------------------- plots

def latency_chart(data, plot_dir):
    """latency.svg: in-process rounds and the `join_once` processes against N, with the reference."""
    series = {}
    for b in data.backends:
        pts = []
        for n in data.sizes:
            v = data.lat_by.get((b, n))
            if v:
                med, lo, hi = spread(v)
                pts.append((n, med, lo, hi))
        series[b] = pts
    if data.mp_by:
        series["etcd, processes"] = [(n, *spread([r["seconds"] for r in rs])) for n, rs in sorted(data.mp_by.items())]
    series["reference (processes)"] = [(n, t, None, None) for n, (t, _, _) in sorted(REFERENCE.items())]
    return svg_chart(os.path.join(plot_dir, "latency.svg"), "Rendezvous latency vs N (min = max = N)", series,
                     "N workers", "seconds until all returned (log)", logy=True,
                     hlines=[(1.0, "target: 128 processes, 1024 in-process (mem) ≤ 1 s"),
                             (1.5, "1024 in-process (etcd, Redis) ≤ 1.5 s")])


def cost_chart(data, plot_dir):
    """cost.svg: writes, reads and etcd proposals per worker against N, with the reference."""
    cost_rounds = data.cost_rounds
    series = {}
    for b in sorted({r["backend"] for r in cost_rounds}):
        for rnd in (1, 2):
            pts = [(r["workers"], r["counts"]["writes"], None, None) for r in cost_rounds
                   if r["backend"] == b and r["round"] == rnd]
            series[f"{b}: writes, round {rnd}"] = pts
        pts = [(r["workers"], r["counts"]["reads"], None, None) for r in cost_rounds
               if r["backend"] == b and r["round"] == 1]
        series[f"{b}: reads, round 1"] = pts
    pts = [(r["workers"], r["proposals"], None, None) for r in cost_rounds
           if r.get("proposals") is not None and r["round"] == 1]
    if pts:
        series["etcd proposals, round 1"] = pts
    series["reference: proposals"] = [(n, p, None, None) for n, (_, p, _) in sorted(REFERENCE.items())]
    return svg_chart(os.path.join(plot_dir, "cost.svg"), "Backend operations per worker per round vs N", series,
                     "N workers", "per worker (log)", logy=True, hlines=[(4.0, "target ≤ 4")])


def time_chart(data, plot_dir):
    """time.svg: the `cost` bench's round time against N, per backend; False if nothing to plot."""
    series = {}
    for b in sorted({r["backend"] for r in data.cost_rounds}):
        sizes = sorted({r["workers"] for r in data.cost_rounds if r["backend"] == b})
        series[b] = [(n, *spread(data.cost_of(b, n))) for n in sizes]
    return svg_chart(os.path.join(plot_dir, "time.svg"),
                     "Round time vs N, in-process workers on one client (cost bench)", series,
                     "N workers", "seconds a round (log)", logy=True,
                     hlines=[(1.0, "1 s (mem, 1024)"), (1.5, "1.5 s (etcd, Redis, 1024)"),
                             (5.0, "5 s (etcd, Redis, 4096)")])


def memory_chart(data, plot_dir):
    """memory.svg: the `cost` bench's peak memory against N, per backend; False if nothing to plot."""
    memory = [r for r in data.cost if r["round"] == "memory"]
    series = {b: sorted((r["workers"], r["vmhwm_kib"] / MIB, None, None) for r in memory if r["backend"] == b)
              for b in sorted({r["backend"] for r in memory})}
    return svg_chart(os.path.join(plot_dir, "memory.svg"),
                     "Peak memory vs N, in-process workers on one client (cost bench)", series,
                     "N workers", "peak resident MiB, VmHWM (log)", logy=True,
                     hlines=[(128, "128 MiB (1024)"), (512, "512 MiB (4096)")])


def plots_section(md, data, plot_dir, rel_plot):
    """## Plots: writes the four SVGs into plot_dir and links them (time and memory only when
    they have points)."""
    latency_chart(data, plot_dir)
    cost_chart(data, plot_dir)
    have_time = time_chart(data, plot_dir)
    have_memory = memory_chart(data, plot_dir)
    md.append("## Plots")
    md.append("")
    md.append(f"![latency vs N]({rel_plot}/latency.svg)")
    md.append("")
    md.append(f"![operations per worker vs N]({rel_plot}/cost.svg)")
    md.append("")
    if have_time:
        md.append(f"![round time vs N, every backend]({rel_plot}/time.svg)")
        md.append("")
    if have_memory:
        md.append(f"![peak memory vs N, every backend]({rel_plot}/memory.svg)")
        md.append("")


# ---------------------------------------------------------------- notes and how to regenerate

def notes_section(md, data):
    """## What the figures show: RESULTS_DIR/notes.md, verbatim, when there is one."""
    path = os.path.join(data.dir, "notes.md")
    if os.path.exists(path):
        with open(path) as f:
            md.append(f.read().rstrip())
        md.append("")


def regenerate_section(md):
    """## Regenerate: the commands, and what scripts/bench.sh runs."""
    md.append("## Regenerate")
    md.append("")
    md.append("```sh\nscripts/bench.sh            # everything: ~40–45 minutes on 2 cores once built (plus the release build)\n"
              "RDZV_BENCH_URL='etcd://my-etcd:2379/bench' cargo bench --bench rendezvous_latency   # your own server\n```")
    md.append("")
    md.append("`scripts/bench.sh` builds the benches (release), starts its own etcd and Redis, runs "
              "`cargo bench` for `cas_contention`, `store_ops`, `rendezvous_latency` and `cost`, the "
              "multi-process runs, `scripts/etcd_figures.py` (one client per worker, failure detection), and "
              "then `scripts/plot.py`. `RDZV_BENCH_URL` points any bench at your "
              "server instead of the built-in ones; `RDZV_BENCH_BACKENDS=mem,etcd` picks built-in backends.")


def main():
    """plot.py RESULTS_DIR OUT_MD PLOT_DIR: writes OUT_MD, section by section, and the plots."""
    res, out_md, plot_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(plot_dir, exist_ok=True)
    rel_plot = os.path.relpath(plot_dir, os.path.dirname(os.path.abspath(out_md)))
    data = Results(res)
    md = []
    intro_section(md)
    machine_section(md, data)
    targets_section(md, data)
    c10d_section(md, data)
    device_section(md, res)
    promote_section(md, data)
    drain_section(md, data)
    segments_section(md, data)
    latency_section(md, data)
    processes_section(md, data)
    cost_section(md, data)
    extra_figures_section(md, data)
    cas_section(md, data)
    store_section(md, data)
    plots_section(md, data, plot_dir, rel_plot)
    notes_section(md, data)
    regenerate_section(md)
    with open(out_md, "w") as f:
        f.write("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
