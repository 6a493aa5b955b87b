"""The measuring and reporting half of bench/pgbench/sweep.sh.

    python3 sweep.py cpu PID [CHILDREN]
        CPU seconds (user + system) of process PID, of the children it reaped and of its
        live children (a PostgreSQL postmaster's backends and workers; the backends that
        exited are in its reaped children's time), then the number of live children. With
        CHILDREN, first waits (5 s at most) until no more than CHILDREN are alive.
    python3 sweep.py point --system S --mode M --clients N … LOG…
        One pgbench run: throughput and failures from pgbench's output, latency
        percentiles from its per-transaction logs (the third field, microseconds), CPU per
        event from the two `cpu` readings. Prints the point as one JSON line on stdout and
        a summary on stderr.
    python3 sweep.py report POINTS.jsonl OUT_DIR [--floor FLOOR.json]
        sweep.json, sweep.md, and per synchronous_commit mode throughput_MODE.svg and
        p99_MODE.svg (both systems against the number of clients, log-2 x axis). With
        several rounds per point (sweep.sh's ROUNDS), a system's point is its median round
        by throughput, a ratio to PostgreSQL is the median of the rounds' ratios (each
        round's runs are back to back), and the table gives each throughput's range. With
        --floor (the output of bench's `floor`, run at the sweep's start), its loopback
        echoes too, plain and durable, as context: the floor each target is read against
        is pgfloor's point, measured right after PostgreSQL's.
"""

import argparse
import datetime
import json
import math
import os
import re
import sys
import time

NAMES = {"postgres": "PostgreSQL 15", "eddy": "Eddy", "floor": "floor"}
# The suite's colours (bench/src/bin/suite/plots.rs): Eddy blue, PostgreSQL red; the floor
# (pgfloor, a server that does no work) grey.
COLORS = {"eddy": "rgb(31,119,180)", "postgres": "rgb(214,39,40)", "floor": "rgb(127,127,127)"}
# The targets of the sweep (issue 56), Eddy against PostgreSQL: with commit off per
# number of clients, durable at every point.
TARGETS_OFF = {1: 1.5, 16: 3.0, 64: 3.0}
TARGET_DURABLE = 1.5
# Eddy's throughput never falls as clients are added: each point at least this much of
# the one before.
TARGET_STEP = 0.95
# p99.9 at 16 clients with commit off, in milliseconds.
TARGET_P999_MS = {("off", 16): 5.0}


def stat_ticks(pid):
    """utime + stime + cutime + cstime of `pid`, and its parent's pid."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state): ppid is field 4, utime … cstime fields 14 … 17.
    return sum(int(v) for v in fields[11:15]), int(fields[1])


def cpu(pid):
    """CPU seconds of `pid` and its children, and how many children are alive."""
    total, _ = stat_ticks(pid)
    children = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != pid:
            try:
                ticks, ppid = stat_ticks(entry)
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
            if ppid == pid:
                total += ticks
                children += 1
    return total / os.sysconf("SC_CLK_TCK"), children


def settled_cpu(pid, children_before):
    """`cpu` once the run's backends have exited and been reaped (their time then counts
    in the postmaster's reaped children's), waiting at most 5 seconds."""
    deadline = time.monotonic() + 5
    while True:
        seconds, children = cpu(pid)
        if children_before is None or children <= children_before or time.monotonic() > deadline:
            return seconds, children
        time.sleep(0.1)


def percentile(sorted_values, p):
    return sorted_values[min(len(sorted_values) - 1, int(p * len(sorted_values)))]


def point(args):
    text = open(args.pgbench_out, errors="replace").read()

    def figure(pattern, cast=float):
        m = re.search(pattern, text, re.M)
        return cast(m.group(1)) if m else None

    tps = figure(r"^tps = ([0-9.]+) \(without initial connection time\)") or 0.0
    processed = figure(r"^number of transactions actually processed: (\d+)", int) or 0
    failed = figure(r"^number of failed transactions: (\d+)", int) or 0
    aborted = len(re.findall(r"client \d+ .*aborted", text))
    latencies = []
    unfinished = 0
    for path in args.logs:
        with open(path) as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                if fields[2].isdigit():
                    latencies.append(int(fields[2]))
                else:  # "failed" or "skipped"
                    unfinished += 1
    latencies.sort()

    def ms(p):
        return round(percentile(latencies, p) / 1000, 3) if latencies else None

    cpu_s = round(args.cpu1 - args.cpu0, 2)
    events = processed or len(latencies)
    result = {
        "system": args.system,
        "synchronous_commit": args.mode,
        "clients": args.clients,
        "threads": min(args.clients, 2),
        "seconds": args.seconds,
        "cards": args.cards,
        "round": args.round,
        "transactions": processed,
        "tps": round(tps, 1),
        "p50_ms": ms(0.5),
        "p99_ms": ms(0.99),
        "p999_ms": ms(0.999),
        "max_ms": round(latencies[-1] / 1000, 3) if latencies else None,
        "failed": failed,
        "failed_in_log": unfinished,
        "aborted_clients": aborted,
        "pgbench_exit": args.rc,
        "cpu_s": cpu_s,
        "cpu_us_per_event": round(cpu_s * 1e6 / events, 1) if events else None,
        "synchronous_commit_seen": args.seen,
        "command": args.command,
    }
    print(json.dumps(result))
    print(
        f"{NAMES[args.system]:<13} synchronous_commit={args.mode:<3} clients={args.clients:<4} "
        + (f"round {args.round}  " if args.round > 1 else "")
        + f"{tps:10.1f} tps  p50 {fmt(result['p50_ms'])} ms  p99 {fmt(result['p99_ms'])} ms  "
        f"p99.9 {fmt(result['p999_ms'])} ms  failed {failed + aborted}  "
        f"cpu {cpu_s:.2f} s ({fmt(result['cpu_us_per_event'])} us/event)  "
        f"SHOW synchronous_commit: {args.seen}"
        + (f"  pgbench exit {args.rc}, see {args.pgbench_out}" if args.rc else ""),
        file=sys.stderr,
    )


def fmt(v, digits=3):
    if v is None:
        return "-"
    return f"{v:.{digits}g}" if abs(v) < 10 ** digits else f"{v:.0f}"


def report(args):
    points = [json.loads(line) for line in open(args.points) if line.strip()]
    os.makedirs(args.out, exist_ok=True)
    clients = sorted({p["clients"] for p in points})
    modes = [m for m in ("off", "on") if any(p["synchronous_commit"] == m for p in points)]
    doc = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "seconds": points[0]["seconds"] if points else None,
        "cards": points[0]["cards"] if points else None,
        "clients": clients,
        "points": points,
    }
    floor = {}
    if args.floor:
        floor = {p["probe"]: p for p in json.load(open(args.floor))["floor"]}
        doc["floor"] = list(floor.values())
    with open(os.path.join(args.out, "sweep.json"), "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")

    def rounds_of(system, mode, n):
        return [p for p in points if (p["system"], p["synchronous_commit"], p["clients"]) == (system, mode, n)]

    def at(system, mode, n):
        """The system's median round at the point, by throughput."""
        return median(sorted(rounds_of(system, mode, n), key=lambda p: p["tps"]))

    def over_pg(system, mode, n):
        """The system's throughput over PostgreSQL's in each round, sorted."""
        pg = {p.get("round", 1): p["tps"] for p in rounds_of("postgres", mode, n)}
        return sorted(p["tps"] / pg[r] for p in rounds_of(system, mode, n)
                      if pg.get(r := p.get("round", 1)))

    def tps_cell(system, mode, n):
        p = at(system, mode, n)
        if not p:
            return "-"
        runs = [q["tps"] for q in rounds_of(system, mode, n)]
        spread = f" ({fmt(min(runs), 6)}–{fmt(max(runs), 6)})" if len(runs) > 1 else ""
        return fmt(p["tps"], 6) + spread

    rounds = max((p.get("round", 1) for p in points), default=1)

    def get(p, key, digits=3):
        return fmt(p[key], digits) if p and p[key] is not None else "-"

    md = [
        "# Per-event scoring against the number of clients: Eddy and PostgreSQL 15",
        "",
        f"{doc['date']}, {doc['nproc']} cores, {doc['seconds']} s per point, {doc['cards']} cards; "
        "one event per transaction (pgbench -M prepared, -j min(clients, 2)). "
        "Latency per transaction from pgbench's logs; CPU is the server's (all of PostgreSQL's "
        "processes) per event. Commands in sweep.json."
        + (f" {rounds} rounds per point, each running the systems back to back: a system's "
           "figures are its median round's (by throughput, with the range of its rounds), and "
           "a ratio is the median of the rounds' ratios." if rounds > 1 else ""),
    ]
    for mode in modes:
        md += [
            "",
            f"## synchronous_commit = {mode}",
            "",
            "| clients | PostgreSQL tps | Eddy tps | Eddy/PG | floor tps | floor/PG "
            "| p99 ms (PG / Eddy) | p99.9 ms (PG / Eddy) "
            "| CPU µs/event (PG / Eddy) | failed (PG / Eddy) |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for n in clients:
            pg, ed = at("postgres", mode, n), at("eddy", mode, n)

            def ratio(system):
                r = median(over_pg(system, mode, n))
                return hundredths(r) if r is not None else "-"

            def fails(system):
                runs = rounds_of(system, mode, n)
                return str(sum(p["failed"] + p["aborted_clients"] for p in runs)) if runs else "-"

            md.append(
                f"| {n} | {tps_cell('postgres', mode, n)} | {tps_cell('eddy', mode, n)} | {ratio('eddy')} "
                f"| {tps_cell('floor', mode, n)} | {ratio('floor')} "
                f"| {get(pg, 'p99_ms')} / {get(ed, 'p99_ms')} | {get(pg, 'p999_ms')} / {get(ed, 'p999_ms')} "
                f"| {get(pg, 'cpu_us_per_event')} / {get(ed, 'cpu_us_per_event')} | {fails('postgres')} / {fails('eddy')} |"
            )
        seen = {
            NAMES[s]: sorted({p["synchronous_commit_seen"] for p in points if p["system"] == s and p["synchronous_commit"] == mode})
            for s in ("postgres", "eddy")
        }
        md += target_lines(mode, clients, at, over_pg)
        md += ["", "`SHOW synchronous_commit` under the same PGOPTIONS after each run: "
               + "; ".join(f"{k}: {', '.join(v)}" for k, v in seen.items() if v) + "."]
        for key, name, title, unit, log in (
            ("tps", "throughput", "transactions per second", "transactions/s", False),
            ("p99_ms", "p99", "p99 latency per transaction", "milliseconds (log scale)", True),
        ):
            series = [
                (NAMES[s], COLORS[s], [(n, p[key]) for n in clients
                                       if (p := at(s, mode, n)) and p[key]])
                for s in ("postgres", "eddy", "floor")
            ]
            svg = plot(
                f"Per-event scoring, synchronous_commit = {mode}: {title}",
                "clients (log 2 scale)",
                unit,
                [s for s in series if s[2]],
                log,
            )
            with open(os.path.join(args.out, f"{name}_{mode}.svg"), "w") as f:
                f.write(svg)
        md += ["", f"![throughput](throughput_{mode}.svg) ![p99](p99_{mode}.svg)"]
    md += floor_lines(floor)
    with open(os.path.join(args.out, "sweep.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    print(f"\nwritten to {args.out}: sweep.json, sweep.md, "
          + ", ".join(f"throughput_{m}.svg, p99_{m}.svg" for m in modes))


def met(ok):
    return "**met**" if ok else "**not met**"


def median(sorted_values):
    """The middle one of sorted values (the lower of an even count), or None."""
    return sorted_values[(len(sorted_values) - 1) // 2] if sorted_values else None


def hundredths(ratio):
    """A ratio cut (not rounded) to two decimals: 1.498 shows as 1.49, never as a 1.50 that
    misses a 1.5 target."""
    return f"{math.floor(ratio * 100) / 100:.2f}"


def target_lines(mode, clients, at, over_pg):
    """Every target of the mode, met or not in this run. A ratio target is also read
    against the floor of the same run when there is one: a target past floor/PG is beyond
    what any server scores here with pgbench."""
    md = []
    for n in clients:
        want = TARGET_DURABLE if mode == "on" else TARGETS_OFF.get(n)
        ratios = over_pg("eddy", mode, n)
        ratio = median(ratios)
        if not want or ratio is None:
            continue
        line = f"- {n} client{'s' if n > 1 else ''}: target {want}× PostgreSQL, Eddy {hundredths(ratio)}×"
        if len(ratios) > 1:
            line += f" (rounds {', '.join(hundredths(r) for r in ratios)})"
        line += f": {met(ratio >= want)}"
        ceiling = median(over_pg("floor", mode, n))
        if ceiling is not None:
            verdict = "within the floor" if ceiling >= want else "beyond the floor: no server reaches it here"
            line += f" (floor {hundredths(ceiling)}×: {verdict})"
        md.append(line)
    eddy = [(n, at("eddy", mode, n)) for n in sorted(clients)]
    eddy = [(n, p) for n, p in eddy if p and p["tps"]]
    for (a, pa), (b, pb) in zip(eddy, eddy[1:]):
        step = pb["tps"] / pa["tps"]
        md.append(f"- {a} → {b} clients: Eddy keeps {hundredths(step)}× of its throughput "
                  f"(target ≥ {TARGET_STEP}): {met(step >= TARGET_STEP)}")
    for (m, n), limit in TARGET_P999_MS.items():
        ed = at("eddy", mode, n)
        if m == mode and ed and ed["p999_ms"] is not None:
            md.append(f"- {n} clients: Eddy's p99.9 {ed['p999_ms']} ms (target ≤ {limit} ms): "
                      f"{met(ed['p999_ms'] <= limit)}")
    return ["", "Targets in this run:", ""] + md if md else []


def floor_lines(floor):
    """`floor`'s echoes, measured at the sweep's start, as sweep.md's last section."""
    if not floor:
        return []
    md = ["", "## The machine's floor (bench `floor`, at the sweep's start, servers idle)", ""]
    for probe, what in (
        ("echo_blocking", "loopback echo, one client, both sides blocking"),
        ("echo_polling", "loopback echo, one client, both sides polling"),
        ("echo_durable", "loopback echo that writes and fdatasyncs each message first"),
    ):
        p = floor.get(probe)
        if p:
            md.append(f"- {what}: {fmt(p['round_trips_per_sec'], 6)} round trips/s, "
                      f"p50 {p['p50_ms']} ms, p99 {p['p99_ms']} ms")
    return md


def nice_ticks(lo, hi, count=6):
    """Round ticks from lo to hi, about `count` of them."""
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def log_ticks(lo, hi):
    ticks = []
    for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        ticks += [m * 10.0 ** e for m in (1, 2, 5) if lo <= m * 10.0 ** e <= hi]
    return ticks


def label(v):
    if v >= 1000:
        return f"{v:,.0f}"
    return f"{v:g}"


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def plot(title, xdesc, ydesc, series, log_y):
    """An SVG line plot in the suite's look: 960×600 plot, legend at its right, white
    ground, sans-serif; x is log 2 of the clients, y linear from 0 or log 10."""
    width, height, legend_w = 960, 600, 200
    left, right, top, bottom = 100, width - 24, 60, height - 70
    xs = sorted({x for _, _, pts in series for x, _ in pts}) or [1]
    ys = [y for _, _, pts in series for _, y in pts] or [1.0]
    x0, x1 = math.log2(xs[0]) - 0.3, math.log2(xs[-1]) + 0.3
    if log_y:
        y0, y1 = max(min(ys) * 0.7, 1e-3), max(max(ys) * 1.5, 1e-2)
        ticks = log_ticks(y0, y1)
        fy = lambda y: bottom - (math.log10(max(y, y0)) - math.log10(y0)) / (math.log10(y1) - math.log10(y0)) * (bottom - top)
    else:
        y0, y1 = 0.0, max(ys) * 1.15 or 1.0
        ticks = nice_ticks(y0, y1)
        fy = lambda y: bottom - (y - y0) / (y1 - y0) * (bottom - top)
    fx = lambda x: left + (math.log2(x) - x0) / (x1 - x0) * (right - left)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width + legend_w}" height="{height}" '
        f'viewBox="0 0 {width + legend_w} {height}" font-family="sans-serif">',
        f'<rect width="{width + legend_w}" height="{height}" fill="white"/>',
        f'<text x="{(left + right) / 2}" y="32" font-size="22" text-anchor="middle">{esc(title)}</text>',
    ]
    for t in ticks:
        y = fy(t)
        out += [
            f'<line x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="#e0e0e0"/>',
            f'<text x="{left - 8}" y="{y + 4:.1f}" font-size="13" text-anchor="end">{label(t)}</text>',
        ]
    for x in xs:
        px = fx(x)
        out += [
            f'<line x1="{px:.1f}" y1="{top}" x2="{px:.1f}" y2="{bottom}" stroke="#e0e0e0"/>',
            f'<text x="{px:.1f}" y="{bottom + 20}" font-size="13" text-anchor="middle">{x}</text>',
        ]
    out += [
        f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" fill="none" stroke="black"/>',
        f'<text x="{(left + right) / 2}" y="{height - 24}" font-size="15" text-anchor="middle">{esc(xdesc)}</text>',
        f'<text transform="translate(24,{(top + bottom) / 2}) rotate(-90)" font-size="15" '
        f'text-anchor="middle">{esc(ydesc)}</text>',
    ]
    for i, (name, color, pts) in enumerate(series):
        pts = sorted(pts)
        path = " ".join(f"{fx(x):.1f},{fy(y):.1f}" for x, y in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        out += [f'<circle cx="{fx(x):.1f}" cy="{fy(y):.1f}" r="4" fill="{color}"/>' for x, y in pts]
        ly = top + 22 * i + 10
        out += [
            f'<line x1="{width + 8}" y1="{ly}" x2="{width + 32}" y2="{ly}" stroke="{color}" stroke-width="3"/>',
            f'<text x="{width + 40}" y="{ly + 5}" font-size="13">{esc(name)}</text>',
        ]
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    c = sub.add_parser("cpu")
    c.add_argument("pid", type=int)
    c.add_argument("children", type=int, nargs="?")
    p = sub.add_parser("point")
    for name in ("system", "mode", "seen", "command", "pgbench_out"):
        p.add_argument("--" + name.replace("_", "-"), required=True)
    for name in ("clients", "seconds", "cards", "rc"):
        p.add_argument("--" + name, type=int, required=True)
    for name in ("cpu0", "cpu1"):
        p.add_argument("--" + name, type=float, required=True)
    p.add_argument("--round", type=int, default=1)
    p.add_argument("logs", nargs="*")
    r = sub.add_parser("report")
    r.add_argument("points")
    r.add_argument("out")
    r.add_argument("--floor")
    args = parser.parse_args()
    if args.what == "cpu":
        seconds, children = settled_cpu(args.pid, args.children)
        print(f"{seconds:.2f} {children}")
    elif args.what == "point":
        point(args)
    else:
        report(args)


if __name__ == "__main__":
    main()
