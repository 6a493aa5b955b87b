#!/usr/bin/env python3
"""Regenerates sqllogic-tests/slt/aggregate/crosscheck.slt and crosscheck_partitioned.slt.

Seeded pseudo-random events; lateness, duplicates and (for the partitioned file) Kafka's murmur2
task assignment are simulated here to print the accepted counts and stream times the files expect.
Run: python3 sqllogic-tests/tools/gen_crosscheck.py (writes both files in place).
"""
import datetime
import os
import random

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "slt", "aggregate")

def murmur2(data):
    length=len(data); seed=0x9747b28c; m=0x5bd1e995; r=24
    h=(seed ^ length) & 0xffffffff
    l4=length//4
    for i in range(l4):
        i4=i*4
        k=(data[i4]&0xff)+((data[i4+1]&0xff)<<8)+((data[i4+2]&0xff)<<16)+((data[i4+3]&0xff)<<24)
        k=(k*m)&0xffffffff; k^=k>>r; k=(k*m)&0xffffffff
        h=(h*m)&0xffffffff; h^=k
    rem=length%4
    if rem==3: h^=(data[(length&~3)+2]&0xff)<<16
    if rem>=2: h^=(data[(length&~3)+1]&0xff)<<8
    if rem>=1:
        h^=data[length&~3]&0xff; h=(h*m)&0xffffffff
    h^=h>>13; h=(h*m)&0xffffffff; h^=h>>15
    return h


# ---- crosscheck.slt: one task

import random, datetime
random.seed(20260101)
base = datetime.datetime(2026,1,1,10,0,0)
LATE = 120  # seconds
cards = ['c0','c1','c2','c3','c4','c5']
events = []   # (id, ts, card, v, f)
T = None
applied_ids = set()
accepted = []
next_id = 1
batches = []
for b in range(3):
    rows = []
    for i in range(200):
        k = b*200 + i
        t = base + datetime.timedelta(seconds=k*3 - random.randint(0, 150) if random.random() < 0.3 else k*3)
        card = random.choice(cards)
        v = random.randint(-50, 100)
        f = random.randint(-400, 400) / 4
        if random.random() < 0.05 and applied_ids:
            eid = random.choice(sorted(applied_ids)[-30:])
        else:
            eid = next_id; next_id += 1
        rows.append((eid, t, card, v, f))
        # simulate
        if eid in applied_ids:
            continue
        if T is not None and t < T - datetime.timedelta(seconds=LATE):
            continue
        applied_ids.add(eid)
        accepted.append((eid, t, card, v, f, len(accepted)))
        T = t if T is None or t > T else T
    batches.append((rows, T, len(accepted)))

def fmt(t): return t.strftime('%Y-%m-%d %H:%M:%S')
out = []
out.append("""# Cross-check: 600 pseudo-random events (seeded; 6 cards, out of order by up to 150 s against a
# lateness of 120 s, about 5% repeated ids) go in three batches. After each batch every metric is
# compared with the same aggregates recomputed by plain SQL over the stream's reservoir (which
# holds exactly the accepted events) at T = max(ts): any differing row is counted, and the
# expected count is 0. The reservoir itself is checked against an offline simulation (accepted
# count and T), and a few totals are shown. Ids rise with arrival, so LAST_VALUE's tie-break
# (latest arrival) is the largest id. One task (no partitioner).

statement ok
DROP STREAM IF EXISTS agg_cc CASCADE

statement ok
CREATE STREAM agg_cc (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL, v INTEGER, f DOUBLE PRECISION)
WITH (event_time = 'ts', event_id = 'id', lateness = '2 minutes')

statement ok
CREATE METRIC agg_cc_sl AS SELECT card, COUNT(*) AS n, SUM(v) AS s, MIN(v) AS lo, MAX(v) AS hi, COUNT(DISTINCT v) AS dv,
       SUM(f) AS sf, LAST_VALUE(v) AS lv, VAR_POP(f) AS vp, STDDEV_SAMP(f) AS sd
FROM agg_cc WINDOW SLIDING (SIZE 5 MINUTES) GROUP BY card

statement ok
CREATE METRIC agg_cc_dl AS SELECT card, COUNT(*) AS n, SUM(v) AS s, MIN(v) AS lo, MAX(v) AS hi, COUNT(DISTINCT v) AS dv,
       SUM(f) AS sf, LAST_VALUE(v) AS lv, VAR_POP(f) AS vp, STDDEV_SAMP(f) AS sd
FROM agg_cc WINDOW SLIDING (SIZE 3 MINUTES, DELAY 1 MINUTE) GROUP BY card

statement ok
CREATE METRIC agg_cc_tu AS SELECT card, COUNT(*) AS n, SUM(v) AS s, MIN(v) AS lo, MAX(v) AS hi, COUNT(DISTINCT v) AS dv,
       SUM(f) AS sf, LAST_VALUE(v) AS lv, VAR_POP(f) AS vp, STDDEV_SAMP(f) AS sd
FROM agg_cc WINDOW TUMBLING (SIZE 2 MINUTES) GROUP BY card

statement ok
CREATE METRIC agg_cc_in AS SELECT card, COUNT(*) AS n, SUM(v) AS s, MIN(v) AS lo, MAX(v) AS hi, COUNT(DISTINCT v) AS dv,
       SUM(f) AS sf, LAST_VALUE(v) AS lv, VAR_POP(f) AS vp, STDDEV_SAMP(f) AS sd
FROM agg_cc WINDOW INFINITE WHERE v > 0 GROUP BY card
""")
windows = {
 'sl': ("c.ts > t.t - INTERVAL '5 minutes' AND c.ts <= t.t", ""),
 'dl': ("c.ts > t.t - INTERVAL '4 minutes' AND c.ts <= t.t - INTERVAL '1 minute'", ""),
 'tu': ("c.ts >= date_bin(INTERVAL '2 minutes', t.t, TIMESTAMP '1970-01-01 00:00:00') AND c.ts <= t.t", ""),
 'in': ("c.ts <= t.t AND c.v > 0", ""),
}
def recompute(cond):
    return f"""WITH t AS (SELECT max(ts) AS t FROM agg_cc),
     w AS (SELECT c.* FROM agg_cc c, t WHERE {cond}),
     r AS (SELECT card, count(*) AS n, CAST(sum(v) AS BIGINT) AS s, min(v) AS lo, max(v) AS hi, count(DISTINCT v) AS dv,
                  sum(f) AS sf, var_pop(f) AS vp, stddev_samp(f) AS sd FROM w GROUP BY card),
     l AS (SELECT card, v AS lv FROM (SELECT card, v, row_number() OVER (PARTITION BY card ORDER BY ts DESC, id DESC) AS rn FROM w) x WHERE rn = 1)"""
for bi, (rows, Tdt0, n) in enumerate(batches):
    # The tag counts the events applied, not the late and repeated ones.
    applied = n - (batches[bi - 1][2] if bi else 0)
    T = fmt(Tdt0)
    vals = ",\n".join(f"    ({r[0]}, '{fmt(r[1])}', '{r[2]}', {r[3]}, {r[4]})" for r in rows)
    out.append(f"""# ---- batch {bi+1}: 200 rows

statement count {applied}
INSERT INTO agg_cc VALUES
{vals}

# Accepted so far and stream time, from the offline simulation.
query ??
SELECT count(*), max(ts) FROM agg_cc
----
{n} {T}
""")
    for name, (cond, _) in windows.items():
        out.append(f"""# {name}: rows of the metric that differ from the recomputation, either way (exact columns).
query ?
{recompute(cond)}
SELECT count(*) FROM (
    (SELECT card, n, CAST(s AS BIGINT) AS s, lo, hi, dv, sf, lv FROM agg_cc_{name}
     EXCEPT SELECT r.card, r.n, r.s, r.lo, r.hi, r.dv, r.sf, l.lv FROM r JOIN l ON r.card = l.card)
    UNION ALL
    (SELECT r.card, r.n, r.s, r.lo, r.hi, r.dv, r.sf, l.lv FROM r JOIN l ON r.card = l.card
     EXCEPT SELECT card, n, CAST(s AS BIGINT) AS s, lo, hi, dv, sf, lv FROM agg_cc_{name})
) d
----
0

# {name}: groups whose VAR_POP or STDDEV_SAMP is off by more than 1e-9 relative.
query ?
{recompute(cond)}
SELECT count(*) FROM agg_cc_{name} m JOIN r ON m.card = r.card
WHERE abs(m.vp - r.vp) > 1e-9 * abs(r.vp) OR abs(m.sd - r.sd) > 1e-9 * abs(r.sd)
   OR (m.sd IS NULL) <> (r.sd IS NULL)
----
0
""")
    # totals from simulation
    Tdt = datetime.datetime.strptime(T, '%Y-%m-%d %H:%M:%S')
    acc = accepted[:n]
    w = [a for a in acc if Tdt - datetime.timedelta(minutes=5) < a[1] <= Tdt]
    groups = len(set(a[2] for a in w))
    out.append(f"""# Totals of the 5-minute window, from the offline simulation.
query ???
SELECT count(*), sum(n), sum(s) FROM agg_cc_sl
----
{groups} {len(w)} {sum(a[3] for a in w)}
""")
out.append("""statement ok
DROP STREAM agg_cc CASCADE
""")
text = "\n".join(out)
open(os.path.join(OUT, 'crosscheck.slt'), 'w').write(text)


# ---- crosscheck_partitioned.slt: partition_by card, 4 tasks

def task(card, p): return (murmur2(card.encode()) & 0x7fffffff) % p
P = 4
random.seed(424242)
base = datetime.datetime(2026,1,1,10,0,0)
LATE = 120
cards = [f'card-{i}' for i in range(12)]
T = {}
applied = {t: set() for t in range(P)}
accepted = []
next_id = 1
batches = []
for b in range(3):
    rows = []
    for i in range(200):
        k = b*200 + i
        card = random.choice(cards)
        tk = task(card, P)
        # each task drifts differently: task-specific offset
        off = tk * 400
        sec = k*3 - off - (random.randint(0, 150) if random.random() < 0.3 else 0)
        t = base + datetime.timedelta(seconds=sec)
        v = random.randint(-50, 100)
        f = random.randint(-400, 400) / 4
        if random.random() < 0.05 and applied[tk]:
            eid = random.choice(sorted(applied[tk])[-20:])
        else:
            eid = next_id; next_id += 1
        rows.append((eid, t, card, tk, v, f))
        if eid in applied[tk]: continue
        if tk in T and t < T[tk] - datetime.timedelta(seconds=LATE): continue
        applied[tk].add(eid)
        accepted.append((eid, t, card, tk, v, f))
        T[tk] = max(T.get(tk, t), t)
    batches.append((rows, dict(T), len(accepted)))
def fmt(t): return t.strftime('%Y-%m-%d %H:%M:%S')
windows = {
 'sl': "c.ts > t.t - INTERVAL '5 minutes' AND c.ts <= t.t",
 'dl': "c.ts > t.t - INTERVAL '4 minutes' AND c.ts <= t.t - INTERVAL '1 minute'",
 'tu': "c.ts >= date_bin(INTERVAL '2 minutes', t.t, TIMESTAMP '1970-01-01 00:00:00') AND c.ts <= t.t",
}
def recompute(cond):
    return f"""WITH t AS (SELECT task, max(ts) AS t FROM agg_ccp GROUP BY task),
     w AS (SELECT c.* FROM agg_ccp c JOIN t ON c.task = t.task WHERE {cond}),
     r AS (SELECT card, count(*) AS n, CAST(sum(v) AS BIGINT) AS s, min(v) AS lo, max(v) AS hi, count(DISTINCT v) AS dv,
                  sum(f) AS sf, var_pop(f) AS vp FROM w GROUP BY card),
     l AS (SELECT card, v AS lv FROM (SELECT card, v, row_number() OVER (PARTITION BY card ORDER BY ts DESC, id DESC) AS rn FROM w) x WHERE rn = 1)"""
out = ["""# Cross-check on a partitioned stream: 600 pseudo-random events (seeded) over 12 cards, with
# partition_by = 'card' and partitions = 4. Each task has its own stream time (the generator
# gives every task its own time offset, so they differ by minutes), lateness (120 s) and dedup
# (ids are repeated only within a task, so a repeat is always a duplicate). The column `task`
# holds murmur2(card) mod 4, computed offline, so that plain SQL over the reservoir can recompute
# every window at its own task's T = max(ts) of that task. Any metric row that differs from the
# recomputation is counted; the expected count is 0.

statement ok
DROP STREAM IF EXISTS agg_ccp CASCADE

statement ok
CREATE STREAM agg_ccp (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL, task INTEGER NOT NULL, v INTEGER, f DOUBLE PRECISION)
WITH (event_time = 'ts', event_id = 'id', partition_by = 'card', partitions = 4, lateness = '2 minutes')
"""]
for name, w in [('sl', 'SLIDING (SIZE 5 MINUTES)'), ('dl', 'SLIDING (SIZE 3 MINUTES, DELAY 1 MINUTE)'), ('tu', 'TUMBLING (SIZE 2 MINUTES)')]:
    out.append(f"""statement ok
CREATE METRIC agg_ccp_{name} AS SELECT card, COUNT(*) AS n, SUM(v) AS s, MIN(v) AS lo, MAX(v) AS hi, COUNT(DISTINCT v) AS dv,
       SUM(f) AS sf, LAST_VALUE(v) AS lv, VAR_POP(f) AS vp
FROM agg_ccp WINDOW {w} GROUP BY card
""")
for bi, (rows, Ts, n) in enumerate(batches):
    applied = n - (batches[bi - 1][2] if bi else 0)
    vals = ",\n".join(f"    ({r[0]}, '{fmt(r[1])}', '{r[2]}', {r[3]}, {r[4]}, {r[5]})" for r in rows)
    tl = "\n".join(f"{tk} {fmt(Ts[tk])}" for tk in sorted(Ts))
    out.append(f"""# ---- batch {bi+1}: 200 rows

statement count {applied}
INSERT INTO agg_ccp VALUES
{vals}

# Accepted so far, and each task's stream time, from the offline simulation.
query ?
SELECT count(*) FROM agg_ccp
----
{n}

query ??
SELECT task, max(ts) FROM agg_ccp GROUP BY task ORDER BY task
----
{tl}
""")
    for name, cond in windows.items():
        out.append(f"""# {name}: metric rows that differ from the recomputation, either way.
query ?
{recompute(cond)}
SELECT count(*) FROM (
    (SELECT card, n, CAST(s AS BIGINT) AS s, lo, hi, dv, sf, lv FROM agg_ccp_{name}
     EXCEPT SELECT r.card, r.n, r.s, r.lo, r.hi, r.dv, r.sf, l.lv FROM r JOIN l ON r.card = l.card)
    UNION ALL
    (SELECT r.card, r.n, r.s, r.lo, r.hi, r.dv, r.sf, l.lv FROM r JOIN l ON r.card = l.card
     EXCEPT SELECT card, n, CAST(s AS BIGINT) AS s, lo, hi, dv, sf, lv FROM agg_ccp_{name})
    UNION ALL
    (SELECT m.card, m.n, 0, 0, 0, 0, 0, 0 FROM agg_ccp_{name} m JOIN r ON m.card = r.card WHERE abs(m.vp - r.vp) > 1e-9 * abs(r.vp))
) d
----
0
""")
    acc = accepted[:n]
    w = [a for a in acc if Ts[a[3]] - datetime.timedelta(minutes=5) < a[1] <= Ts[a[3]]]
    out.append(f"""# Totals of the 5-minute windows, from the offline simulation.
query ???
SELECT count(*), sum(n), sum(s) FROM agg_ccp_sl
----
{len(set(a[2] for a in w))} {len(w)} {sum(a[4] for a in w)}
""")
out.append("""statement ok
DROP STREAM agg_ccp CASCADE
""")
open(os.path.join(OUT, 'crosscheck_partitioned.slt'), 'w').write("\n".join(out))

