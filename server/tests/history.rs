//! `history('metric')` against what `INSERT … RETURNING *` gave live: 50,000 events with
//! jitter, late events within and beyond the lateness, re-sent ids and NULLs, through
//! every window kind, on the local log and on Kafka; again after a restart, and for
//! metrics of the same definitions created afterwards.

mod common;

use std::collections::{BTreeMap, HashSet};

use common::{connect_port, kafka_addr, simple_rows, spawn_eddy_with, temp_dir, TextRow};
use eddy_cluster::route::partition_for;
use eddy_planner::types::Value;

const EVENTS: usize = 50_000;
const PARTITIONS: u32 = 2;
const LATENESS_S: i64 = 20;

/// The metrics, each (name, definition after `AS`).
const METRICS: [(&str, &str); 6] = [
    (
        "m_slide",
        "SELECT card, COUNT(*) AS n, SUM(amount) AS s, AVG(amount) AS a, MIN(amount) AS lo, \
         MAX(amount) AS hi, COUNT(DISTINCT amount) AS d FROM pay \
         WINDOW SLIDING (SIZE 5 MINUTES) GROUP BY card",
    ),
    (
        "m_delay",
        "SELECT card, COUNT(amount) AS n, SUM(amount) AS s FROM pay \
         WINDOW SLIDING (SIZE 2 MINUTES, DELAY 30 SECONDS) GROUP BY card",
    ),
    (
        "m_tumble",
        "SELECT card, COUNT(*) AS n, MAX(amount) AS hi FROM pay \
         WINDOW TUMBLING (SIZE 1 MINUTE) WHERE amount > 10 GROUP BY card",
    ),
    (
        "m_last",
        "SELECT card, SUM(amount) AS s, VARIANCE(amount) AS v, \
         PERCENTILE_DISC(0.5) WITHIN GROUP (ORDER BY amount) AS mid FROM pay \
         WINDOW SLIDING (SIZE 5 EVENTS) GROUP BY card",
    ),
    (
        "m_hop",
        "SELECT card, COUNT(*) AS n, SUM(amount) AS s FROM pay \
         WINDOW HOPPING (SIZE 2 MINUTES, HOP 30 SECONDS) GROUP BY card",
    ),
    (
        "m_all",
        "SELECT card, COUNT(*) AS n, SUM(amount) AS s FROM pay WINDOW INFINITE \
         WHERE card <> 'c7' GROUP BY card",
    ),
];

/// The generated events, as VALUES tuples, with their id, card and event time (s).
struct Event {
    id: i64,
    card: String,
    ts: i64,
    amount: Option<f64>,
    tuple: String,
}

fn events() -> Vec<Event> {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let base = chrono::NaiveDate::from_ymd_opt(2026, 11, 1)
        .unwrap()
        .and_hms_opt(0, 0, 0)
        .unwrap();
    let mut out: Vec<Event> = Vec::with_capacity(EVENTS);
    for i in 0..EVENTS as i64 {
        // Re-sent: the same event again.
        if i > 10 && next() % 33 == 0 {
            let j = (i as usize) - 1 - (next() % 10) as usize;
            let again = Event {
                id: out[j].id,
                card: out[j].card.clone(),
                ts: out[j].ts,
                amount: out[j].amount,
                tuple: out[j].tuple.clone(),
            };
            out.push(again);
            continue;
        }
        // Mostly a little out of order; some late within the lateness, some beyond.
        let jitter_ms = match next() % 50 {
            0 => 15_000 + next() % 30_000,
            1..=5 => next() % 12_000,
            _ => next() % 1_500,
        };
        let ms = i * 60 - jitter_ms as i64;
        let ts = base + chrono::Duration::milliseconds(ms);
        let card = format!("c{}", next() % 150);
        let amount = match next() % 40 {
            0 => None,
            r => Some((next() % 2000) as f64 / 8.0 + r as f64),
        };
        let text = amount.map_or("NULL".to_string(), |a| a.to_string());
        out.push(Event {
            id: i,
            card: card.clone(),
            ts: ms,
            amount,
            tuple: format!("({i}, '{ts}', '{card}', {text})"),
        });
    }
    out
}

/// Which events the tasks accept, as the engine decides: a re-sent id is a duplicate, an
/// event older than its task's stream time less the lateness is late.
fn accepted(events: &[Event]) -> Vec<bool> {
    let mut time: BTreeMap<u32, i64> = BTreeMap::new();
    let mut seen: HashSet<i64> = HashSet::new();
    events
        .iter()
        .map(|e| {
            let task = partition_for(&Value::Text(e.card.as_str().into()), PARTITIONS);
            if seen.contains(&e.id) {
                return false;
            }
            let t = time.entry(task).or_insert(i64::MIN);
            if *t != i64::MIN && e.ts < *t - LATENESS_S * 1000 {
                return false;
            }
            seen.insert(e.id);
            *t = (*t).max(e.ts);
            true
        })
        .collect()
}

/// Per metric, per task: the rows its history must give, in order.
type Expected = BTreeMap<&'static str, BTreeMap<u32, Vec<TextRow>>>;

/// Sends every event through `INSERT … RETURNING *` and keeps, for each accepted one, each
/// metric's part of its row under the metric and the event's task.
async fn record(client: &tokio_postgres::Client, events: &[Event]) -> Expected {
    let accepted = accepted(events);
    let mut expected: Expected = BTreeMap::new();
    // Columns of RETURNING *: the event's four, then each metric's aggregates in order.
    let mut widths = Vec::new();
    for (name, _) in METRICS {
        let n = client
            .prepare(&format!("SELECT * FROM {name}"))
            .await
            .unwrap()
            .columns()
            .len();
        widths.push(n - 1); // less the group-by column
    }
    for (chunk_no, chunk) in events.chunks(500).enumerate() {
        let values: Vec<&str> = chunk.iter().map(|e| e.tuple.as_str()).collect();
        let rows = simple_rows(
            client,
            &format!("INSERT INTO pay VALUES {} RETURNING *", values.join(", ")),
        )
        .await;
        assert_eq!(rows.len(), chunk.len());
        for (k, (e, row)) in chunk.iter().zip(rows).enumerate() {
            if !accepted[chunk_no * 500 + k] {
                continue;
            }
            let task = partition_for(&Value::Text(e.card.as_str().into()), PARTITIONS);
            let mut at = 4;
            for ((name, _), width) in METRICS.iter().zip(&widths) {
                let mut r: TextRow = vec![row[0].clone(), row[1].clone(), row[2].clone()];
                r.extend(row[at..at + width].iter().cloned());
                at += width;
                expected
                    .entry(name)
                    .or_default()
                    .entry(task)
                    .or_default()
                    .push(r);
            }
        }
    }
    expected
}

/// `history(metric)`, split by the task each row's event went to.
async fn history(client: &tokio_postgres::Client, metric: &str) -> BTreeMap<u32, Vec<TextRow>> {
    let mut out: BTreeMap<u32, Vec<TextRow>> = BTreeMap::new();
    for row in simple_rows(client, &format!("SELECT * FROM history('{metric}')")).await {
        let card = Value::Text(row[2].as_deref().unwrap().into());
        out.entry(partition_for(&card, PARTITIONS))
            .or_default()
            .push(row);
    }
    out
}

async fn check(client: &tokio_postgres::Client, expected: &Expected, suffix: &str, when: &str) {
    for (name, _) in METRICS {
        let got = history(client, &format!("{name}{suffix}")).await;
        let want = &expected[name];
        for (task, rows) in want {
            let have = got.get(task).map_or(&[][..], |v| &v[..]);
            assert_eq!(
                have.len(),
                rows.len(),
                "{when}: {name}{suffix}, task {task}: rows"
            );
            if let Some(i) = (0..rows.len()).find(|&i| have[i] != rows[i]) {
                panic!(
                    "{when}: {name}{suffix}, task {task}, row {i}: history {:?}, RETURNING gave {:?}",
                    have[i], rows[i]
                );
            }
        }
        assert_eq!(got.len(), want.len(), "{when}: {name}{suffix}: tasks");
    }
}

/// Event time `ms` after the base as text.
fn time_text(ms: i64) -> String {
    let base = chrono::NaiveDate::from_ymd_opt(2026, 11, 1)
        .unwrap()
        .and_hms_opt(0, 0, 0)
        .unwrap();
    (base + chrono::Duration::milliseconds(ms)).to_string()
}

/// `m_slide`'s (n, s, hi) for `card` as of `t` (ms), counted from the events: the state
/// before the first event its task accepted later than `t`; `None` for an empty group.
fn slide_as_of(events: &[Event], accepted: &[bool], card: &str, t: i64) -> Option<TextRow> {
    let task = |c: &str| partition_for(&Value::Text(c.into()), PARTITIONS);
    let mut time = i64::MIN;
    let mut mine = Vec::new();
    for (e, _) in events
        .iter()
        .zip(accepted)
        .filter(|(e, ok)| **ok && task(&e.card) == task(card))
    {
        if e.ts > t {
            break;
        }
        time = time.max(e.ts);
        if e.card == card {
            mine.push(e);
        }
    }
    let window: Vec<&&Event> = mine.iter().filter(|e| e.ts > time - 300_000).collect();
    if window.is_empty() {
        return None;
    }
    let amounts: Vec<f64> = window.iter().filter_map(|e| e.amount).collect();
    let text = |v: Option<f64>| v.map(eddy_planner::types::format_float);
    Some(vec![
        Some(window.len().to_string()),
        text((!amounts.is_empty()).then(|| amounts.iter().sum())),
        text(amounts.iter().copied().reduce(f64::max)),
    ])
}

/// `AS OF` lookups and a `features` join at random times and cards, against the
/// events counted by hand.
async fn check_as_of(client: &tokio_postgres::Client, events: &[Event], when: &str) {
    let accepted = accepted(events);
    let mut seed = 0x51u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let span = EVENTS as u64 * 60;
    let probes: Vec<(String, i64)> = (0..40)
        .map(|i| match i % 4 {
            // At an event's own time and card: it counts.
            0 => {
                let e = &events[(next() % EVENTS as u64) as usize];
                (e.card.clone(), e.ts)
            }
            _ => (format!("c{}", next() % 150), (next() % span) as i64),
        })
        .collect();
    let mut labels = Vec::new();
    for (i, (card, t)) in probes.iter().enumerate() {
        let want = slide_as_of(events, &accepted, card, *t);
        let got = simple_rows(
            client,
            &format!(
                "SELECT n, s, hi FROM m_slide AS OF TIMESTAMP '{}' WHERE card = '{card}'",
                time_text(*t)
            ),
        )
        .await;
        assert_eq!(
            got,
            want.clone().into_iter().collect::<Vec<_>>(),
            "{when}: {card} as of {t}"
        );
        labels.push(format!("('{card}', '{}', {i})", time_text(*t)));
    }
    client
        .batch_execute(&format!("INSERT INTO labels VALUES {}", labels.join(", ")))
        .await
        .unwrap();
    let rows = simple_rows(
        client,
        "SELECT label, \"m_slide.n\", \"m_slide.s\", \"m_slide.hi\" \
         FROM features('labels', 'm_slide') ORDER BY label",
    )
    .await;
    let mut rows = rows.into_iter();
    for (i, (card, t)) in probes.iter().enumerate() {
        let want = slide_as_of(events, &accepted, card, *t)
            .unwrap_or_else(|| vec![Some("0".into()), None, None]);
        // The labels of an earlier check come first, with the same values.
        let row = loop {
            let r = rows.next().expect("a row per label");
            if r[0].as_deref() == Some(i.to_string().as_str()) {
                break r;
            }
        };
        assert_eq!(row[1..], want[..], "{when}: features of {card} at {t}");
    }
}

async fn parity(args: &[&str], dir_name: &str) {
    let dir = temp_dir(dir_name);
    let (server, port) = spawn_eddy_with(&dir, args);
    let client = connect_port(port).await;
    client
        .batch_execute(&format!(
            "CREATE STREAM pay (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL, \
             amount DOUBLE PRECISION) WITH (event_time = 'ts', event_id = 'id', \
             partition_by = 'card', partitions = {PARTITIONS}, lateness = '{LATENESS_S} seconds', \
             retention = '30 days')"
        ))
        .await
        .unwrap();
    for (name, def) in METRICS {
        client
            .batch_execute(&format!("CREATE METRIC {name} AS {def}"))
            .await
            .unwrap();
    }
    client
        .batch_execute(
            "CREATE STREAM labels (card TEXT NOT NULL, ts TIMESTAMP NOT NULL, label INT) \
             WITH (event_time = 'ts', lateness = '30 days')",
        )
        .await
        .unwrap();
    let events = events();
    let expected = record(&client, &events).await;
    let accepted = expected["m_slide"].values().map(Vec::len).sum::<usize>();
    assert!(
        accepted > 40_000 && accepted < EVENTS - 1000,
        "{accepted} accepted"
    );
    check(&client, &expected, "", "live").await;
    check_as_of(&client, &events, "live").await;

    // A bound on the event time narrows the rows to those events.
    let rows = simple_rows(
        &client,
        "SELECT count(*), min(ts), max(ts) FROM history('m_slide') \
         WHERE ts >= '2026-11-01 00:10:00' AND ts < '2026-11-01 00:20:00'",
    )
    .await;
    assert!(rows[0][1].as_deref().unwrap() >= "2026-11-01 00:10:00");
    assert!(rows[0][2].as_deref().unwrap() < "2026-11-01 00:20:00");
    let slice: usize = expected["m_slide"]
        .values()
        .flatten()
        .filter(|r| {
            let ts = r[1].as_deref().unwrap();
            ("2026-11-01 00:10:00".."2026-11-01 00:20:00").contains(&ts)
        })
        .count();
    assert_eq!(rows[0][0].as_deref(), Some(slice.to_string().as_str()));

    drop(client);
    server.terminate();
    let (server, port) = spawn_eddy_with(&dir, args);
    let client = connect_port(port).await;
    check(&client, &expected, "", "after a restart").await;
    check_as_of(&client, &events, "after a restart").await;
    for (name, def) in METRICS {
        client
            .batch_execute(&format!("CREATE METRIC {name}_later AS {def}"))
            .await
            .unwrap();
    }
    check(&client, &expected, "_later", "created afterwards").await;
    drop(client);
    server.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_is_what_returning_gave_on_the_local_log() {
    parity(&[], "history-local").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_is_what_returning_gave_on_kafka() {
    let kafka = kafka_addr();
    let cluster = format!("hist{}", std::process::id());
    parity(&["--kafka", &kafka, "--cluster", &cluster], "history-kafka").await;
}

/// Past retention: rows start one window length after the horizon, a NOTICE says where,
/// and the rows given are still RETURNING's; COPY and a cursor read the history too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_starts_where_retention_left_every_event_its_window_needs() {
    let dir = temp_dir("history-retention");
    let (server, port) = spawn_eddy_with(&dir, &[]);
    let client = connect_port(port).await;
    client
        .batch_execute(
            "CREATE STREAM r (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL, \
             amount BIGINT) WITH (event_time = 'ts', event_id = 'id', retention = '2 minutes'); \
             CREATE METRIC r_1m AS SELECT card, COUNT(*) AS n, SUM(amount) AS s FROM r \
             WINDOW SLIDING (SIZE 1 MINUTE) GROUP BY card",
        )
        .await
        .unwrap();
    // One event a second for 20 minutes; RETURNING of the last 90 seconds' events.
    let mut live = Vec::new();
    for chunk in 0..12 {
        let values: Vec<String> = (chunk * 100..chunk * 100 + 100)
            .map(|i| format!("({i}, '{}', 'k{}', {i})", time_text(i * 1000), i % 3))
            .collect();
        let sql = format!("INSERT INTO r VALUES {} RETURNING *", values.join(", "));
        live.extend(simple_rows(&client, &sql).await);
    }
    // T = 19:59; kept: 2 minutes back (17:59); exact from one window later (18:59).
    let conninfo = format!("host=127.0.0.1 port={port} user=eddy dbname=eddy");
    let out = common::psql(&conninfo, "SELECT id, n, s FROM history('r_1m')", "");
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr
            .contains("NOTICE:  the history of metric \"r_1m\" starts at ts = 2026-11-01 00:18:59"),
        "{stderr}"
    );
    let rows: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    let want: Vec<String> = live
        .iter()
        .filter(|r| r[1].as_deref().unwrap() >= "2026-11-01 00:18:59")
        .map(|r| {
            format!(
                "{}|{}|{}",
                r[0].as_deref().unwrap(),
                r[4].as_deref().unwrap(),
                r[5].as_deref().unwrap()
            )
        })
        .collect();
    assert_eq!(rows, want);
    // The same rows through COPY and through a cursor, with no notice when the range
    // starts where history does.
    let copy = common::psql(
        &conninfo,
        "COPY (SELECT id, n, s FROM history('r_1m') WHERE ts >= '2026-11-01 00:18:59') TO STDOUT \
         WITH (DELIMITER '|')",
        "",
    );
    assert_eq!(
        String::from_utf8_lossy(&copy.stdout)
            .lines()
            .collect::<Vec<_>>(),
        want
    );
    assert!(!String::from_utf8_lossy(&copy.stderr).contains("NOTICE"));
    let fetched = simple_rows(
        &client,
        "BEGIN; DECLARE h CURSOR FOR SELECT id, n, s FROM history('r_1m'); \
         FETCH 7 FROM h; FETCH 100 FROM h; FETCH ALL FROM h; COMMIT",
    )
    .await;
    let fetched: Vec<String> = fetched
        .iter()
        .map(|r| {
            format!(
                "{}|{}|{}",
                r[0].as_deref().unwrap(),
                r[1].as_deref().unwrap(),
                r[2].as_deref().unwrap()
            )
        })
        .collect();
    assert_eq!(fetched, want);
    drop(client);
    server.terminate();
}
