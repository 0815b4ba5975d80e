#!/usr/bin/env python3
"""Turns the raw benchmark results (JSON lines written by benches/*.rs and
scripts/multiproc.py) into BENCHMARKS.md and two SVG plots. No dependencies beyond Python 3.

usage: plot.py RESULTS_DIR OUT_MD PLOT_DIR
RESULTS_DIR holds cas_contention.jsonl, rendezvous_latency.jsonl, store_ops.jsonl,
cost.jsonl, multiproc.jsonl, machine.json and (optionally) notes.md, appended verbatim.
"""

import json
import math
import os
import statistics
import sys
from collections import defaultdict

# Reference figures (docs/TESTING.md): the reference implementation on this kind of machine (processes, etcd 3.4).
REFERENCE = {16: (1.9, 16, 77), 64: (11.0, 49, 283), 128: (46.0, 114, 607)}
REFERENCE_TIME_TEXT = {16: "1.9 s", 64: "10–12 s", 128: "46 s"}
COLORS = {"mem": "#1b9e77", "etcd": "#d95f02", "redis": "#7570b3", "etcd, processes": "#e7298a",
          "reference (processes)": "#666666"}


def load(dirname, name):
    path = os.path.join(dirname, name)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def fmt_s(x):
    if x is None:
        return "–"
    if x < 0.001:
        return f"{x * 1e6:.0f} µs"
    if x < 1:
        return f"{x * 1e3:.1f} ms"
    return f"{x:.2f} s"


def fmt_rate(x):
    if x >= 10000:
        return f"{x / 1000:.0f} k/s"
    if x >= 1000:
        return f"{x / 1000:.1f} k/s"
    return f"{x:.0f}/s"


def fmt_n(x, digits=2):
    return "–" if x is None else f"{x:.{digits}f}"


def spread(values):
    """(median, min, max)"""
    return statistics.median(values), min(values), max(values)


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
        return ml + (math.log2(x) - x0) / (x1 - x0) * (w - ml - mr)

    def py(y):
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

def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def main():
    res, out_md, plot_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(plot_dir, exist_ok=True)
    rel_plot = os.path.relpath(plot_dir, os.path.dirname(os.path.abspath(out_md)))
    machine = json.load(open(os.path.join(res, "machine.json"))) if os.path.exists(os.path.join(res, "machine.json")) else {}
    latency, cost, mp = load(res, "rendezvous_latency.jsonl"), load(res, "cost.jsonl"), load(res, "multiproc.jsonl")
    cas, store = load(res, "cas_contention.jsonl"), load(res, "store_ops.jsonl")
    md = ["# Benchmarks", ""]
    md.append("Generated by `scripts/bench.sh` (the one command that reruns everything and rewrites this "
              "file and its plots); raw results in `benches/results/`. Not part of CI.")
    md.append("")
    md.append("## Machine")
    md.append("")
    for k in ["date", "cpu", "nproc", "ram", "kernel", "etcd", "redis", "rustc", "load_before", "load_after", "git"]:
        if k in machine:
            md.append(f"- **{k}**: {machine[k]}")
    md.append("")
    md.append("etcd and Redis run on loopback, started by the harness (etcd's data directory on tmpfs, "
              "Redis without persistence). The machine is shared: other jobs ran at the same time (see the "
              "load averages above), so absolute times carry that noise; each figure is a median with "
              "its min–max range over the runs stated. The counts (writes, reads, proposals) do not "
              "depend on the machine's speed.")
    md.append("")

    # ---- targets summary
    md.append("## Against the targets (docs/TESTING.md)")
    md.append("")
    rows = []
    mp_by = defaultdict(list)
    for r in mp:
        if r.get("failures", 0) == 0:
            mp_by[r["workers"]].append(r)
    for n in sorted(mp_by):
        med, lo, hi = spread([r["seconds"] for r in mp_by[n]])
        props = [r["proposals_per_worker"] for r in mp_by[n]
                 if r.get("proposals_per_worker") is not None and r.get("proposals_clean", True)]
        ref = REFERENCE.get(n)
        rows.append([f"{n} processes, etcd: time to complete the round", f"{fmt_s(med)} ({fmt_s(lo)}–{fmt_s(hi)}, {len(mp_by[n])} runs)",
                     REFERENCE_TIME_TEXT.get(n, "–"), "≤ 1 s" if n == 128 else "–"])
        if props:
            rows.append([f"{n} processes, etcd: proposals per worker", fmt_n(statistics.median(props)),
                         str(ref[1]) if ref else "–", "≤ 4"])
    lat_by = defaultdict(list)
    lat_failed = [r for r in latency if r.get("failed")]
    latency = [r for r in latency if not r.get("failed")]
    for r in latency:
        lat_by[(r["backend"], r["workers"])].append(r["seconds"])
    for (b, n), v in sorted(lat_by.items()):
        if n == 1024:
            med, lo, hi = spread(v)
            rows.append([f"1024 in-process workers, {b}", f"{fmt_s(med)} ({fmt_s(lo)}–{fmt_s(hi)}, {len(v)} rounds)", "–", "≤ 3 s"])
    cost_failed = [r for r in cost if r.get("failed")]
    cost = [r for r in cost if not r.get("failed")]
    cost_rounds = [r for r in cost if r["round"] in (1, 2)]
    for key, label, target in [("writes", "writes per worker per round (max over N, rounds)", "≤ 4"),
                               ("reads", "reads per worker per round (max over N, rounds)", "≤ 4")]:
        for b in sorted({r["backend"] for r in cost_rounds}):
            v = [r["counts"][key] for r in cost_rounds if r["backend"] == b]
            rows.append([f"{b}: {label}", fmt_n(max(v)), "–", target])
    props = [r["proposals"] for r in cost_rounds if r.get("proposals") is not None]
    if props:
        rows.append(["etcd proposals per worker per round, in-process (max over N, rounds)", fmt_n(max(props)),
                     "16 / 49 / 114 (N = 16 / 64 / 128)", "≤ 4"])
    for r in cost:
        if r["round"] == "memory" and r["workers"] == 1024:
            rows.append([f"peak memory, 1024 in-process workers, {r['backend']} (VmHWM of the whole process)",
                         f"{r['vmhwm_kib'] / 1024:.0f} MiB", "–", "≤ 256 MiB"])
    md.append(table(["figure", "measured", "reference", "target"], rows))
    md.append("")

    # ---- latency
    md.append("## Rendezvous latency, in-process workers")
    md.append("")
    md.append("`benches/rendezvous_latency.rs`: N workers (min = max = N) in one process on one shared client, "
              "all calling `Rendezvous::next_rendezvous` (bootstrap exchange included) at once; the time until "
              "the last returned. Median (min–max) over the rounds criterion ran; the slowest worker's "
              "phase timings (median) show where the time goes.")
    md.append("")
    backends = sorted({b for b, _ in lat_by})
    sizes = sorted({n for _, n in lat_by})
    rows = []
    for n in sizes:
        row = [n]
        for b in backends:
            v = lat_by.get((b, n))
            if v:
                med, lo, hi = spread(v)
                row.append(f"{fmt_s(med)} ({fmt_s(lo)}–{fmt_s(hi)}, {len(v)})")
            else:
                row.append("–")
        rows.append(row)
    md.append(table(["N"] + [f"{b}: median (min–max, rounds)" for b in backends], rows))
    md.append("")
    if lat_failed:
        md.append("**Failed rounds** (not in the figures above; a failed size stops that backend's larger sizes):")
        md.append("")
        for r in lat_failed:
            md.append(f"- {r['backend']}, N = {r['workers']}: after {fmt_s(r['seconds'])}: {r['failed']}")
        md.append("")
    rows = []
    for n in sizes:
        for b in backends:
            rs = [r for r in latency if r["backend"] == b and r["workers"] == n]
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

    # ---- multi-process
    md.append("## Rendezvous latency, separate processes on etcd")
    md.append("")
    worker = mp[0]["worker"].split("/")[-1] if mp else "?"
    md.append(f"`scripts/multiproc.py`: N worker processes (`{worker}`) against a local "
              "etcd, min = max = N; time from just before the first spawn until the last process exited after "
              "its round. Each process is spawned first and waits for a common start instant (`RDZV_START_AT`), "
              "then connects (its own runtime, client and session) and rendezvouses, so the Python launcher's "
              "spawn speed is out of the figure but connecting is in. Proposals per worker include creating "
              "the worker (session and run leases) and rank 0's bootstrap write, counted on each size's first "
              "run only (started after earlier runs' leases expired).")
    md.append("")
    rows = []
    for n in sorted(mp_by):
        rs = mp_by[n]
        med, lo, hi = spread([r["seconds"] for r in rs])
        props = [r["proposals_per_worker"] for r in rs
                 if r.get("proposals_per_worker") is not None and r.get("proposals_clean", True)]
        rows.append([n, len(rs), fmt_s(med), f"{fmt_s(lo)}–{fmt_s(hi)}",
                     fmt_s(statistics.median(r["spawn_seconds"] for r in rs)),
                     fmt_s(statistics.median(r["max_connect_s"] or 0 for r in rs)),
                     fmt_n(statistics.median(props)) if props else "–",
                     REFERENCE_TIME_TEXT.get(n, "–"), REFERENCE.get(n, (0, "–"))[1]])
    failed = [r for r in mp if r.get("failures", 0)]
    md.append(table(["N", "runs", "median", "min–max", "spawning all", "slowest connect",
                     "etcd proposals / worker", "reference time", "reference proposals / worker"], rows))
    cli = load(res, "multiproc_cli.jsonl")
    if cli:
        md.append("")
        md.append("The same with `rdzv join <url> --hold 0s --format json` processes (the CLI: it leaves the run "
                  "after printing, which is in the time), started by the launcher one after the other with no start "
                  "gate: time from the first spawn until the last exited, spawning included.")
        md.append("")
        by = defaultdict(list)
        for r in cli:
            if r.get("failures", 0) == 0:
                by[r["workers"]].append(r)
        rows = []
        for n in sorted(by):
            med, lo, hi = spread([r["seconds"] for r in by[n]])
            props = [r["proposals_per_worker"] for r in by[n] if r.get("proposals_per_worker") is not None]
            rows.append([n, len(by[n]), fmt_s(med), f"{fmt_s(lo)}–{fmt_s(hi)}",
                         fmt_s(statistics.median(r["spawn_seconds"] for r in by[n])),
                         fmt_n(statistics.median(props)) if props else "–", REFERENCE_TIME_TEXT.get(n, "–")])
        md.append(table(["N", "runs", "median", "min–max", "spawning all", "etcd proposals / worker (leave included)",
                         "reference time"], rows))
        bad = [r for r in cli if r.get("failures", 0)]
        if bad:
            md.append("")
            md.append(f"{len(bad)} run(s) had failing workers: " + "; ".join(
                f"N={r['workers']}: {r['failures']} failed ({r['failure_sample'][:1]})" for r in bad))
    if failed:
        md.append("")
        md.append(f"{len(failed)} run(s) had failing workers and are left out: "
                  + "; ".join(f"N={r['workers']}: {r['failures']} failed ({r['failure_sample'][:1]})" for r in failed))
    md.append("")

    # ---- cost
    md.append("## Cost per worker per round")
    md.append("")
    md.append("`benches/cost.rs`: N in-process workers (`RendezvousHandler`, the protocol alone) on one shared "
              "client wrapped in `CountingKv`. Writes = puts, deletes, lease grants/revokes (lease refreshes "
              "aside); reads = gets and ranges; on etcd also the server's own committed Raft proposals "
              "(`etcd_server_proposals_committed_total` before and after the round, so it includes every "
              "write the server made, lease refreshes excepted as etcd does not propose them). Round 1 is "
              "the first rendezvous, round 2 everyone calling `next_rendezvous` again. `setup` is creating "
              "the workers (session and run leases). These counts do not depend on the machine.")
    md.append("")
    rows = []
    for r in cost:
        if r["round"] in (1, 2, "setup"):
            c = r["counts"]
            rows.append([r["backend"], r["workers"], r["round"], fmt_n(c["writes"]), fmt_n(c["reads"]),
                         fmt_n(c["watches"]), fmt_n(r.get("proposals")), fmt_s(r.get("seconds"))])
    md.append(table(["backend", "N", "round", "writes / worker", "reads / worker", "watches / worker",
                     "etcd proposals / worker", "time"], rows))
    md.append("")
    if cost_failed:
        md.append("**Failed rounds** (left out of the table):")
        md.append("")
        for r in cost_failed:
            md.append(f"- {r['backend']}, N = {r['workers']}, round {r['round']}: {r['failed']} of {r['workers']} "
                      f"workers failed after {fmt_s(r['seconds'])} ({r['returned']} returned): "
                      f"{'; '.join(r['errors'])[:400]}. State key then: `{r['state'][:200]}`")
        md.append("")
    rows = [[r["backend"], r["workers"], f"{r['vmhwm_kib'] / 1024:.0f} MiB", f"{r['rss_before_kib'] / 1024:.0f} MiB",
             "yes" if r.get("peak_reset") else "no (whole process)"]
            for r in cost if r["round"] == "memory"]
    md.append("Peak resident memory of the bench process (VmHWM; `scripts/bench.sh` runs each backend and size "
              "in a fresh process, with a fresh server), with the RSS before the workers were created:")
    md.append("")
    md.append(table(["backend", "N", "peak (VmHWM)", "RSS before", "peak reset before this size"], rows))
    md.append("")

    # ---- CAS
    md.append("## CAS contention")
    md.append("")
    md.append("`benches/cas_contention.rs`: k writers increment one key by compare-and-swap through one client. "
              "`reread`: get, put if unchanged, on conflict read again. `swap`: `KvExt::compare_and_swap`, whose "
              "lost swap returns the winner's value (no re-read). Committed increments per second: the "
              "median over criterion's samples (min–max); conflicts per commit over all samples.")
    md.append("")
    groups = defaultdict(list)
    for r in cas:
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

    # ---- store
    md.append("## Store operations")
    md.append("")
    md.append("`benches/store_ops.rs`: `set` (64-byte value), `get`, `add` through one shared client; one "
              "caller, or 16 concurrent callers each on its own key. Operations per second: median over "
              "criterion's samples (min–max).")
    md.append("")
    groups = defaultdict(list)
    for r in store:
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

    # ---- plots
    series = {}
    for b in backends:
        pts = []
        for n in sizes:
            v = lat_by.get((b, n))
            if v:
                med, lo, hi = spread(v)
                pts.append((n, med, lo, hi))
        series[f"{b}" if b != "etcd" else "etcd"] = pts
        if b == "etcd":
            series["etcd"] = pts
    if mp_by:
        series["etcd, processes"] = [(n, *spread([r["seconds"] for r in rs])) for n, rs in sorted(mp_by.items())]
    series["reference (processes)"] = [(n, t, None, None) for n, (t, _, _) in sorted(REFERENCE.items())]
    svg_chart(os.path.join(plot_dir, "latency.svg"), "Rendezvous latency vs N (min = max = N)", series,
              "N workers", "seconds until all returned (log)", logy=True, hlines=[(1.0, "target: 128 processes ≤ 1 s"),
                                                                         (3.0, "target: 1024 in-process ≤ 3 s")])
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
    svg_chart(os.path.join(plot_dir, "cost.svg"), "Backend operations per worker per round vs N", series,
              "N workers", "per worker (log)", logy=True, hlines=[(4.0, "target ≤ 4")])
    md.append("## Plots")
    md.append("")
    md.append(f"![latency vs N]({rel_plot}/latency.svg)")
    md.append("")
    md.append(f"![operations per worker vs N]({rel_plot}/cost.svg)")
    md.append("")
    notes = os.path.join(res, "notes.md")
    if os.path.exists(notes):
        md.append(open(notes).read().rstrip())
        md.append("")
    md.append("## Regenerate")
    md.append("")
    md.append("```sh\nscripts/bench.sh            # everything: ~8 minutes on 2 cores once built (plus the release build)\n"
              "RDZV_BENCH_URL='etcd://my-etcd:2379/bench' cargo bench --bench rendezvous_latency   # your own server\n```")
    md.append("")
    md.append("`scripts/bench.sh` builds the benches (release), starts its own etcd and Redis, runs "
              "`cargo bench` for `cas_contention`, `store_ops`, `rendezvous_latency` and `cost`, the "
              "multi-process runs, and then `scripts/plot.py`. `RDZV_BENCH_URL` points any bench at your "
              "server instead of the built-in ones; `RDZV_BENCH_BACKENDS=mem,etcd` picks built-in backends.")
    with open(out_md, "w") as f:
        f.write("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
