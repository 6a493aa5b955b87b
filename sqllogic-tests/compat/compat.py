#!/usr/bin/env python3
"""PostgreSQL-compatibility suite: the same ad-hoc queries against Eddy and PostgreSQL 15.

Usage:
  compat.py --eddy HOST:PORT --postgres HOST:PORT [--report FILE] [--min-share X]
            [--only CATEGORY ...] [--skip-setup] [--query-timeout SECONDS]

Runs setup-eddy.sql on Eddy (user eddy, database eddy) and setup-postgres.sql on
PostgreSQL (user postgres, database postgres), then every query of queries/*.sql on both,
one psql session per category file and side, so a SET affects only the queries after it in
the same file on both sides. Each query runs alone in psql's autocommit mode (its own
implicit transaction), so an error does not affect the next one.

Each answer is psql's unaligned output (`-A -F '|' -P null='∅'`, records separated by
U+001E so that values may hold newlines) or, for an error, its SQLSTATE (psql's :SQLSTATE
variable). Two answers are identical when the SQLSTATEs are equal and, for a success, the
header line (column names) and the rows are equal as text; the rows are compared in order
when the query has a top-level ORDER BY, sorted otherwise. Values are compared as each
server prints them: a float printed differently is a difference.

Prints a table per category (identical / total / share), the overall share and each
differing query with both answers; --report writes the same as Markdown. Exits 1 when the
overall share is below --min-share (default 0: report only), 2 when a setup fails.
Standard library only; needs psql on PATH (or --psql).
"""
import argparse
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RS = "\x1e"  # psql's record separator here: rows may hold newlines
NULL_TEXT = "∅"
# Environment variables that would change what libpq asks of the server at startup.
PG_SESSION_ENV = ("PGOPTIONS", "PGTZ", "PGDATESTYLE", "PGCLIENTENCODING", "PGGEQO",
                  "PGAPPNAME", "PGSERVICE", "PGSERVICEFILE", "PGSYSCONFDIR", "PGTARGETSESSIONATTRS")


BY_DESIGN = "by design:"


class Query:
    def __init__(self, category, index, text, comment, line):
        self.category = category
        self.index = index      # 1-based, within its file
        self.text = text        # the statement, without its terminating semicolon
        self.comment = comment  # the comment lines right above it, joined
        self.line = line        # line of the file where the statement starts
        self.ordered = has_top_level_order_by(text)
        # A comment `by design: <reason>` marks a difference Eddy's contract asks for. The
        # query still counts as not identical; it is reported apart from the wrong answers.
        marker = comment.find(BY_DESIGN)
        self.by_design = comment[marker + len(BY_DESIGN):].strip() if marker >= 0 else None

    @property
    def name(self):
        return f"{self.category}#{self.index}"


class Answer:
    """What one server answered to one query."""

    def __init__(self, sqlstate, header="", rows=(), note="", message=""):
        self.sqlstate = sqlstate  # '00000' on success; None when there was no answer
        self.header = header
        self.rows = list(rows)
        self.note = note          # why there was no answer (timeout, lost connection)
        self.message = message    # an error's message, shown but never compared

    @property
    def ok(self):
        return self.sqlstate == "00000"

    def key(self, ordered):
        if self.sqlstate is None:
            return ("no answer",)
        if not self.ok:
            return ("error", self.sqlstate)
        return ("ok", self.header, tuple(self.rows if ordered else sorted(self.rows)))

    def text(self, max_rows=None, max_chars=None):
        if self.sqlstate is None:
            return f"(no answer: {self.note})"
        if not self.ok:
            message = f": {self.message}" if self.message else ""
            if max_chars is not None and len(message) > max_chars:
                message = message[:max_chars] + "…"
            return f"ERROR {self.sqlstate}{message}"
        lines = [self.header] if self.header else ["(no result set)"]
        rows = self.rows
        if max_rows is not None and len(rows) > max_rows:
            lines += rows[:max_rows] + [f"… {len(rows) - max_rows} more rows"]
        else:
            lines += rows
        if not rows and self.header:
            lines.append("(0 rows)")
        out = []
        for line in lines:
            line = line.replace("\n", "⏎")
            if max_chars is not None and len(line) > max_chars:
                line = line[:max_chars] + "…"
            out.append(line)
        return "\n".join(out)


# ---- parsing the query files

def split_statements(source):
    """Yields (text, comment, line) per statement of a SQL file.

    Statements end with a semicolon outside quotes, quoted identifiers, dollar quotes and
    comments; they may span lines. The `--` comment lines right above a statement are kept
    as its comment (a blank line between them detaches them)."""
    i, n = 0, len(source)
    while i < n:
        end = scan_to_semicolon(source, i)
        chunk = source[i:end]
        comment, offset = [], 0
        for line in chunk.split("\n"):
            stripped = line.strip()
            if stripped == "":
                comment = []
            elif stripped.startswith("--"):
                comment.append(stripped[2:].strip())
            else:
                break
            offset += len(line) + 1
        text = chunk[offset:].strip()
        if text:
            start = i + offset + (len(chunk[offset:]) - len(chunk[offset:].lstrip()))
            yield text, " ".join(c for c in comment if c), source.count("\n", 0, start) + 1
        i = end + 1


def scan_to_semicolon(s, i):
    """Index of the first semicolon at or after i that ends the statement (or len(s))."""
    n = len(s)
    while i < n:
        c = s[i]
        if c == ";":
            return i
        i = skip_token(s, i)
    return n


def skip_quoted(s, i, quote, escapes):
    """Index just past the string or identifier opened by `quote` at i: a doubled quote
    stands for itself, and with `escapes` (an E'' string) a backslash escapes the next
    character."""
    n, j = len(s), i + 1
    while j < n:
        if escapes and s[j] == "\\":
            j += 2
        elif s[j] == quote and j + 1 < n and s[j + 1] == quote:
            j += 2
        elif s[j] == quote:
            return j + 1
        else:
            j += 1
    return n


def skip_token(s, i):
    """Index just past the lexical element at i (a quoted string, a quoted identifier, a
    dollar-quoted string, a comment, or one other character)."""
    n = len(s)
    c = s[i]
    if c == "'":
        escapes = i > 0 and s[i - 1] in "eE" and (i < 2 or not (s[i - 2].isalnum() or s[i - 2] == "_"))
        return skip_quoted(s, i, "'", escapes)
    if c == '"':
        return skip_quoted(s, i, '"', False)
    if c == "-" and s.startswith("--", i):
        j = s.find("\n", i)
        return n if j < 0 else j
    if c == "/" and s.startswith("/*", i):
        depth, j = 0, i
        while j < n:
            if s.startswith("/*", j):
                depth += 1
                j += 2
            elif s.startswith("*/", j):
                depth -= 1
                j += 2
                if depth == 0:
                    return j
            else:
                j += 1
        return n
    if c == "$":
        m = re.match(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$", s[i:])
        if m and not (i > 0 and (s[i - 1].isalnum() or s[i - 1] == "_")):
            tag = m.group(0)
            end = s.find(tag, i + len(tag))
            return n if end < 0 else end + len(tag)
    return i + 1


def has_top_level_order_by(sql):
    """Whether the statement ends in an ORDER BY of its own (outside every parenthesis):
    only then is the order of its rows part of its answer."""
    depth, i, n = 0, 0, len(sql)
    words = []  # (word, depth) outside quotes and comments
    while i < n:
        c = sql[i]
        if c == "(":
            depth += 1
            i += 1
        elif c == ")":
            depth -= 1
            i += 1
        elif c.isalpha() or c == "_":
            j = i
            while j < n and (sql[j].isalnum() or sql[j] in "_$"):
                j += 1
            words.append((sql[i:j].upper(), depth))
            i = j
        else:
            i = skip_token(sql, i)
    return any(w == "ORDER" and d == 0 and k + 1 < len(words) and words[k + 1] == ("BY", 0)
               for k, (w, d) in enumerate(words))


def load_queries(queries_dir, only):
    files = sorted(f for f in os.listdir(queries_dir) if f.endswith(".sql"))
    categories = []
    for f in files:
        category = f[:-4]
        if only and category not in only:
            continue
        with open(os.path.join(queries_dir, f), encoding="utf-8") as fh:
            source = fh.read()
        queries = [Query(category, k + 1, text, comment, line)
                   for k, (text, comment, line) in enumerate(split_statements(source))]
        categories.append((category, queries))
    return categories


# ---- running psql

class Side:
    def __init__(self, label, addr, user, db, psql):
        host, _, port = addr.rpartition(":")
        if not host or not port.isdigit():
            sys.exit(f"compat.py: {label}'s address must be HOST:PORT, not {addr!r}")
        self.label, self.host, self.port, self.user, self.db, self.psql = label, host, port, user, db, psql

    def argv(self, *extra):
        return [self.psql, "-X", "-h", self.host, "-p", self.port, "-U", self.user, "-d", self.db, *extra]


def psql_env():
    env = dict(os.environ)
    for k in PG_SESSION_ENV:
        env.pop(k, None)
    env.setdefault("LC_ALL", "C.UTF-8")
    return env


def run_setup(side, setup_file):
    p = subprocess.run(side.argv("-q", "-v", "ON_ERROR_STOP=1", "-f", setup_file),
                       capture_output=True, text=True, env=psql_env())
    if p.returncode != 0:
        sys.stderr.write(f"compat.py: setup on {side.label} ({setup_file}) failed:\n{p.stdout}{p.stderr}")
        sys.exit(2)


def session_statement(text):
    return re.match(r"\s*(SET|RESET)\b", text, re.I) is not None


def run_category(side, queries, query_timeout):
    """Runs the queries in one psql session (a new one after a timeout or a lost
    connection, which first replays the SET and RESET statements before the failed query)
    and returns one Answer per query."""
    answers = {}
    next_k = 0
    while next_k < len(queries):
        got, started, stopped_at, note = run_session(side, queries, next_k, query_timeout)
        answers.update(got)
        if stopped_at is None:
            break
        # queries[stopped_at] got no answer; go on after it in a new session, unless this
        # session could not run a single query (the server is gone).
        answers[stopped_at] = Answer(None, note=note)
        if not started:
            for k in range(stopped_at + 1, len(queries)):
                answers[k] = Answer(None, note=note)
            break
        next_k = stopped_at + 1
    return [answers.get(k, Answer(None, note="not run")) for k in range(len(queries))]


def run_session(side, queries, first, query_timeout):
    token = "@@compat-" + secrets.token_hex(4)
    parts = ["\\set VERBOSITY sqlstate\n", "\\set ON_ERROR_STOP off\n"]
    # Session settings made before the first query of this session, in a restarted one.
    for q in queries[:first]:
        if session_statement(q.text):
            parts.append(q.text + "\n;\n")
    for k in range(first, len(queries)):
        parts.append(f"\\echo '{token} Q {k}'\n{queries[k].text}\n;\n\\echo '{token} E {k}' :SQLSTATE\n"
                     f"\\echo '{token} M {k}' :LAST_ERROR_MESSAGE\n")
    with tempfile.TemporaryDirectory(prefix="compat-") as tmp:
        script = os.path.join(tmp, "script.sql")
        out_path = os.path.join(tmp, "out")
        err_path = os.path.join(tmp, "err")
        with open(script, "w", encoding="utf-8") as fh:
            fh.write("".join(parts))
        argv = side.argv("-q", "-A", "-F", "|", "-R", RS, "-P", f"null={NULL_TEXT}",
                         "-P", "footer=off", "-P", "pager=off", "-f", script)
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=psql_env())
            last_size, last_change, timed_out = -1, time.monotonic(), False
            while proc.poll() is None:
                time.sleep(0.05)
                size = os.path.getsize(out_path)
                if size != last_size:
                    last_size, last_change = size, time.monotonic()
                elif time.monotonic() - last_change > query_timeout:
                    proc.kill()  # our own psql, by its handle
                    proc.wait()
                    timed_out = True
        with open(out_path, "rb") as fh:
            output = fh.read().decode("utf-8", errors="replace")
        with open(err_path, "rb") as fh:
            errors = fh.read().decode("utf-8", errors="replace")
    got, started = parse_output(output, token)
    missing = [k for k in range(first, len(queries)) if k not in got]
    if not missing:
        return got, started, None, ""
    stopped_at = missing[0]
    if timed_out:
        note = f"no answer within {query_timeout:g} s"
    else:
        tail = errors.strip().splitlines()[-1:] or [f"psql exited with {proc.returncode}"]
        note = "psql stopped: " + tail[0]
    return got, started, stopped_at, note


def parse_output(output, token):
    """Answers by query index, from psql's output with the markers around each query."""
    got, started = {}, set()
    marker = re.compile(r"^" + re.escape(token) + r" ([QEM]) (\d+)(?: ([^\n]*))?\n", re.M)
    pos, current = 0, None
    for m in marker.finditer(output):
        kind, k = m.group(1), int(m.group(2))
        if kind == "Q":
            current, pos = k, m.end()
            started.add(k)
        elif kind == "E" and current == k:
            body = output[pos:m.start()]
            got[k] = make_answer((m.group(3) or "").strip(), body)
            current = None
        elif kind == "M" and k in got and not got[k].ok:
            got[k].message = (m.group(3) or "").strip()
    return got, started


def make_answer(sqlstate, body):
    if sqlstate != "00000":
        return Answer(sqlstate or "?????")
    if body.endswith("\n"):
        body = body[:-1]
    if body == "":
        return Answer("00000")
    records = body.split(RS)
    return Answer("00000", records[0], records[1:])


# ---- comparing and reporting

def compare(categories, eddy_answers, pg_answers):
    results = []  # (category, [(query, eddy, pg, same)])
    for (category, queries) in categories:
        rows = []
        for q, e, p in zip(queries, eddy_answers[category], pg_answers[category]):
            # No answer (a timeout, a lost connection) is never identical to anything.
            same = e.sqlstate is not None and p.sqlstate is not None and e.key(q.ordered) == p.key(q.ordered)
            rows.append((q, e, p, same))
        results.append((category, rows))
    return results


def summary_table(results):
    lines = [f"{'category':<14} {'identical':>9} {'total':>6} {'share':>7}"]
    same_all = total_all = 0
    for category, rows in results:
        same = sum(1 for r in rows if r[3])
        lines.append(f"{category:<14} {same:>9} {len(rows):>6} {share(same, len(rows)):>7}")
        same_all += same
        total_all += len(rows)
    lines.append(f"{'overall':<14} {same_all:>9} {total_all:>6} {share(same_all, total_all):>7}")
    return lines, (same_all / total_all if total_all else 1.0)


def share(a, b):
    return f"{100.0 * a / b:.1f}%" if b else "-"


def kind_of_difference(e, p):
    if e.sqlstate is None:
        return "no answer from Eddy"
    if p.sqlstate is None:
        return "no answer from PostgreSQL"
    if p.ok and not e.ok:
        return f"Eddy fails ({e.sqlstate}) where PostgreSQL answers"
    if e.ok and not p.ok:
        return f"Eddy answers where PostgreSQL fails ({p.sqlstate})"
    if not e.ok and not p.ok:
        return "another SQLSTATE"
    if e.header != p.header:
        if sorted(e.rows) == sorted(p.rows):
            return "column names differ"
        return "column names and rows differ"
    if len(e.rows) != len(p.rows):
        return "a different number of rows"
    if sorted(e.rows) == sorted(p.rows):
        return "rows in another order"
    return "values differ"


def silent_differences(results):
    """Queries Eddy answered without an error where PostgreSQL failed or returned other rows
    (header aside): Eddy's answer is wrong and nothing tells its client so."""
    def rows(a, ordered):
        return a.rows if ordered else sorted(a.rows)
    return [q.name for (_, rs) in results for (q, e, p, same) in rs
            if not same and e.ok and p.sqlstate is not None and q.by_design is None
            and (not p.ok or rows(e, q.ordered) != rows(p, q.ordered))]


def deliberate_differences(results):
    """Differing queries marked `by design:`, with the reason."""
    return [(q.name, q.by_design) for (_, rs) in results for (q, _, _, same) in rs
            if not same and q.by_design is not None]


def print_differences(results, out):
    for category, rows in results:
        for q, e, p, same in rows:
            if same:
                continue
            out.write(f"\n--- {q.name} (line {q.line}): {kind_of_difference(e, p)}\n")
            if q.comment:
                out.write(f"    -- {q.comment}\n")
            out.write(indent(q.text, "    ") + "\n")
            out.write("  Eddy:\n" + indent(e.text(max_rows=8, max_chars=160), "    | ") + "\n")
            out.write("  PostgreSQL:\n" + indent(p.text(max_rows=8, max_chars=160), "    | ") + "\n")


def indent(text, prefix):
    return "\n".join(prefix + line for line in text.split("\n"))


def write_report(path, results, table, args):
    with open(path, "w", encoding="utf-8") as out:
        out.write("# PostgreSQL compatibility of Eddy\n\n")
        out.write(f"Eddy at `{args.eddy}`, PostgreSQL at `{args.postgres}`; queries from "
                  f"`sqllogic-tests/compat/queries/`. An answer is identical when the column names, the "
                  f"rows (in order when the query has a top-level ORDER BY) and the SQLSTATE of an "
                  f"error are the same text.\n\n")
        out.write("| category | identical | total | share |\n|---|---:|---:|---:|\n")
        for line in table[1:]:
            cat, same, total, pct = line.split()
            if cat == "overall":
                cat, same, total, pct = f"**{cat}**", f"**{same}**", f"**{total}**", f"**{pct}**"
            out.write(f"| {cat} | {same} | {total} | {pct} |\n")
        silent = silent_differences(results)
        out.write(f"\nSilent wrong answers (Eddy answered without an error; PostgreSQL failed or answered other rows): "
                  f"{len(silent)}{': ' + ', '.join(silent) if silent else ''}.\n")
        for name, reason in deliberate_differences(results):
            out.write(f"\nBy design, not counted as a wrong answer: {name}: {reason}.\n")
        kinds = {}
        for _, rows in results:
            for q, e, p, same in rows:
                if not same:
                    kinds.setdefault(kind_of_difference(e, p), []).append(q.name)
        if kinds:
            out.write("\n## Differences by kind\n\n| kind | queries |\n|---|---|\n")
            for kind, names in sorted(kinds.items(), key=lambda kv: -len(kv[1])):
                out.write(f"| {kind} | {len(names)}: {', '.join(names)} |\n")
        out.write("\n## Differing queries\n")
        for category, rows in results:
            diffs = [r for r in rows if not r[3]]
            if not diffs:
                continue
            out.write(f"\n### {category}\n")
            for q, e, p, _ in diffs:
                out.write(f"\n**{q.name}** (line {q.line}): {kind_of_difference(e, p)}")
                if q.comment:
                    out.write(f" — {q.comment}")
                out.write("\n\n```sql\n" + q.text + "\n```\n\n")
                out.write("Eddy:\n```\n" + e.text(max_rows=20, max_chars=300) + "\n```\n")
                out.write("PostgreSQL:\n```\n" + p.text(max_rows=20, max_chars=300) + "\n```\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--eddy", required=True, metavar="HOST:PORT")
    ap.add_argument("--postgres", required=True, metavar="HOST:PORT")
    ap.add_argument("--eddy-user", default="eddy")
    ap.add_argument("--eddy-db", default="eddy")
    ap.add_argument("--postgres-user", default="postgres")
    ap.add_argument("--postgres-db", default="postgres")
    ap.add_argument("--report", metavar="FILE", help="write a Markdown report here")
    ap.add_argument("--min-share", type=float, default=0.0,
                    help="exit 1 when the overall share of identical answers is below this (0 to 1)")
    ap.add_argument("--no-silent", action="store_true",
                    help="exit 1 when Eddy gives any silent wrong answer")
    ap.add_argument("--only", nargs="+", metavar="CATEGORY", help="run these category files only")
    ap.add_argument("--skip-setup", action="store_true", help="the servers already hold the stream and rows")
    ap.add_argument("--query-timeout", type=float, default=60.0,
                    help="seconds without output after which a query counts as unanswered")
    ap.add_argument("--queries", default=os.path.join(HERE, "queries"), help="directory of category files")
    ap.add_argument("--psql", default="psql")
    args = ap.parse_args()

    eddy = Side("Eddy", args.eddy, args.eddy_user, args.eddy_db, args.psql)
    pg = Side("PostgreSQL", args.postgres, args.postgres_user, args.postgres_db, args.psql)
    categories = load_queries(args.queries, set(args.only or ()))
    if not categories:
        sys.exit("compat.py: no query files")
    if not args.skip_setup:
        run_setup(pg, os.path.join(HERE, "setup-postgres.sql"))
        run_setup(eddy, os.path.join(HERE, "setup-eddy.sql"))

    eddy_answers, pg_answers = {}, {}
    for category, queries in categories:
        t0 = time.monotonic()
        pg_answers[category] = run_category(pg, queries, args.query_timeout)
        eddy_answers[category] = run_category(eddy, queries, args.query_timeout)
        print(f"ran {category}: {len(queries)} queries in {time.monotonic() - t0:.1f} s", file=sys.stderr)

    results = compare(categories, eddy_answers, pg_answers)
    unanswered = [q.name for (_, rows) in results for (q, e, p, _) in rows if p.sqlstate is None]
    if unanswered:
        print(f"warning: PostgreSQL gave no answer to {', '.join(unanswered)}", file=sys.stderr)
    print_differences(results, sys.stdout)
    table, overall = summary_table(results)
    print()
    print("\n".join(table))
    silent = silent_differences(results)
    print(f"silent wrong answers (Eddy answered without an error; PostgreSQL failed or answered other rows): {len(silent)}"
          + (f" ({', '.join(silent)})" if silent else ""))
    for name, reason in deliberate_differences(results):
        print(f"by design, not counted as a wrong answer: {name}: {reason}")
    if args.report:
        write_report(args.report, results, table, args)
        print(f"report: {args.report}")
    failed = 0
    if overall < args.min_share:
        print(f"overall share {overall:.3f} is below --min-share {args.min_share}", file=sys.stderr)
        failed = 1
    if args.no_silent and silent:
        print(f"--no-silent: {len(silent)} silent wrong answers", file=sys.stderr)
        failed = 1
    return failed


if __name__ == "__main__":
    sys.exit(main())
