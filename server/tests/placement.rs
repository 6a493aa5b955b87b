//! Shards pinned by the placement plan, on this machine: the real binary's shard threads
//! each allowed on exactly one PU, distinct ones, and SHOW SHARDS agreeing.

mod common;

use common::{connect_port, simple_rows, spawn_eddy, spawn_eddy_with, temp_dir};

/// (thread name, Cpus_allowed_list) of each thread of process `pid`.
fn threads(pid: u32) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = entry.unwrap().path();
        let (Ok(comm), Ok(status)) = (
            std::fs::read_to_string(dir.join("comm")),
            std::fs::read_to_string(dir.join("status")),
        ) else {
            continue; // the thread ended meanwhile
        };
        let cpus = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap_or_default()
            .trim()
            .to_string();
        out.push((comm.trim().to_string(), cpus));
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_shard_thread_is_pinned_to_its_own_pu_and_show_shards_agrees() {
    let dir = temp_dir("placement");
    let (server, port) = spawn_eddy(&dir);
    let client = connect_port(port).await;
    client
        .batch_execute(
            "CREATE STREAM pay (ts TIMESTAMP NOT NULL, card TEXT NOT NULL, amount BIGINT) \
             WITH (event_time = 'ts', partition_by = 'card', partitions = 4);
             CREATE METRIC m AS SELECT card, COUNT(*) AS n FROM pay \
             WINDOW SLIDING (SIZE 1 HOUR) GROUP BY card;
             INSERT INTO pay VALUES ('2026-01-01 10:00:00', 'a', 1), \
             ('2026-01-01 10:00:01', 'b', 2), ('2026-01-01 10:00:02', 'c', 3);",
        )
        .await
        .unwrap();
    let shards: Vec<(String, String)> = threads(server.0.id())
        .into_iter()
        .filter(|(name, _)| name.starts_with("eddy-shard-"))
        .collect();
    assert_eq!(shards.len(), 2, "{shards:?}");
    for (name, cpus) in &shards {
        assert!(cpus.parse::<usize>().is_ok(), "{name} may run on {cpus}");
    }
    assert_ne!(
        shards[0].1, shards[1].1,
        "two shards share a PU: {shards:?}"
    );
    let rows = simple_rows(&client, "SHOW SHARDS").await;
    assert_eq!(rows.len(), 2);
    let mut tasks = 0;
    let mut events = 0;
    for (i, row) in rows.iter().enumerate() {
        // shard, pu, core, numa_node, tasks, events, queue_depth
        let get = |c: usize| row[c].clone().unwrap_or_default();
        assert_eq!(get(0), i.to_string());
        assert_eq!(get(1), shards[i].1, "shard {i}: {row:?} against {shards:?}");
        assert_eq!(get(3), "0");
        // Nothing waits for an idle shard, but a periodic checkpoint may be passing.
        assert!(get(6).parse::<usize>().unwrap() <= 1, "{row:?}");
        tasks += get(4).parse::<usize>().unwrap();
        events += get(5).parse::<u64>().unwrap();
    }
    assert_eq!((tasks, events), (4, 3), "{rows:?}");
    drop(client);
    server.terminate();

    // --pin-shards false: the OS places them, and SHOW SHARDS says so.
    let (server, port) = spawn_eddy_with(&dir, &["--pin-shards", "false"]);
    let client = connect_port(port).await;
    for (name, cpus) in threads(server.0.id()) {
        if name.starts_with("eddy-shard-") {
            assert!(cpus.parse::<usize>().is_err(), "{name} pinned to {cpus}");
        }
    }
    let rows = simple_rows(&client, "SHOW SHARDS").await;
    assert!(rows.iter().all(|r| r[1].is_none()), "{rows:?}");
    drop(client);
    server.terminate();
}

/// The shards' cpus by shard, and the cpus of every other thread.
fn pinned(pid: u32) -> (Vec<String>, std::collections::BTreeSet<String>) {
    let mut shards = Vec::new();
    let mut others = std::collections::BTreeSet::new();
    for (name, cpus) in threads(pid) {
        match name.strip_prefix("eddy-shard-") {
            Some(_) => shards.push(cpus),
            None => {
                others.insert(cpus);
            }
        }
    }
    (shards, others)
}

/// `ALTER SYSTEM SET shards` while the node runs: shards start and stop, tasks move with
/// their state, the service threads follow the plan (on the PU without a shard when there
/// is one), bad settings are refused, and the setting is kept for the next start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shard_count_changes_while_the_node_runs() {
    let dir = temp_dir("reshard");
    let (server, port) = spawn_eddy_with(&dir, &["--shards", "1"]);
    let client = connect_port(port).await;
    client
        .batch_execute(
            "CREATE STREAM pay (ts TIMESTAMP NOT NULL, card TEXT NOT NULL, amount BIGINT) \
             WITH (event_time = 'ts', partition_by = 'card', partitions = 4);
             CREATE METRIC m AS SELECT card, COUNT(*) AS n, SUM(amount) AS total FROM pay \
             WINDOW SLIDING (SIZE 1 HOUR) GROUP BY card;",
        )
        .await
        .unwrap();
    let insert = |from: usize| {
        (from..from + 40)
            .map(|i| {
                format!(
                    "('2026-01-01 10:{:02}:{:02}', 'c{}', {i})",
                    i / 60,
                    i % 60,
                    i % 7
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    client
        .batch_execute(&format!("INSERT INTO pay VALUES {}", insert(0)))
        .await
        .unwrap();
    // One shard: it has PU 0; every other thread runs on PU 1.
    let (shards, others) = pinned(server.0.id());
    assert_eq!(shards, ["0"]);
    assert_eq!(others.into_iter().collect::<Vec<_>>(), ["1"]);
    let before = simple_rows(&client, "SELECT card, n, total FROM m ORDER BY card").await;
    assert_eq!(before.len(), 7);
    // A subscription open across the change: its watchers move with the tasks.
    let watching = connect_port(port).await;
    watching
        .batch_execute("BEGIN; DECLARE c CURSOR FOR SELECT card, n, total FROM m EMIT CHANGES")
        .await
        .unwrap();
    // Each change row is the metric's row and the event time it came with.
    let mut first: Vec<_> = simple_rows(&watching, "FETCH ALL FROM c")
        .await
        .into_iter()
        .map(|r| r[..3].to_vec())
        .collect();
    first.sort();
    assert_eq!(first, before);

    client
        .batch_execute("ALTER SYSTEM SET shards = 2")
        .await
        .unwrap();
    let rows = simple_rows(&client, "SHOW SHARDS").await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    let tasks: Vec<usize> = rows
        .iter()
        .map(|r| r[4].clone().unwrap().parse().unwrap())
        .collect();
    assert_eq!(tasks, [2, 2]);
    let (shards, others) = pinned(server.0.id());
    assert_eq!(shards.len(), 2);
    assert_ne!(shards[0], shards[1]);
    // Both PUs carry a shard: the other threads may run on either.
    assert_eq!(others.into_iter().collect::<Vec<_>>(), ["0-1"]);
    assert_eq!(
        simple_rows(&client, "SELECT card, n, total FROM m ORDER BY card").await,
        before
    );
    client
        .batch_execute(&format!("INSERT INTO pay VALUES {}", insert(40)))
        .await
        .unwrap();
    let after = simple_rows(&client, "SELECT sum(n), sum(total) FROM m").await;
    assert_eq!(after[0], [Some("80".to_string()), Some("3160".to_string())]);
    // The subscription saw every card change after the move: its last row per card is
    // the metric's row now.
    let now = simple_rows(&client, "SELECT card, n, total FROM m ORDER BY card").await;
    let mut last = std::collections::BTreeMap::new();
    while last.len() < now.len() || last.values().cloned().collect::<Vec<_>>() != now {
        let rows = simple_rows(&watching, "FETCH ALL FROM c WITH (timeout = '5 seconds')").await;
        assert!(
            !rows.is_empty(),
            "the subscription stopped at {last:?}, want {now:?}"
        );
        for row in rows {
            last.insert(row[0].clone(), row[..3].to_vec());
        }
    }
    drop(watching);

    // Refused settings name what is wrong, and the session goes on.
    for (sql, state) in [
        ("ALTER SYSTEM SET shards = 0", "22023"),
        ("ALTER SYSTEM SET shards = 'many'", "22023"),
        ("ALTER SYSTEM SET work_mem = '1MB'", "42704"),
    ] {
        let e = client.batch_execute(sql).await.unwrap_err();
        assert_eq!(e.code().unwrap().code(), state, "{sql}: {e}");
    }
    assert_eq!(simple_rows(&client, "SHOW SHARDS").await.len(), 2);
    drop(client);
    server.terminate();

    // Kept for the next start without --shards; a flag wins over it. Each start:
    // (flags, shards it runs, a change, shards after the change); the state survives.
    let kept: &[&str] = &["--shards", "kept"];
    let one: &[&str] = &["--shards", "1"];
    for (flags, at_start, change, changed) in [
        (kept, 2, Some("ALTER SYSTEM SET shards = 1"), 1),
        // RESET is auto: one shard per core here.
        (kept, 1, Some("ALTER SYSTEM RESET shards"), 2),
        (one, 1, None, 1),
    ] {
        let (server, port) = spawn_eddy_with(&dir, flags);
        let client = connect_port(port).await;
        let shards = || async { simple_rows(&client, "SHOW SHARDS").await.len() };
        assert_eq!(shards().await, at_start, "{flags:?}");
        assert_eq!(
            simple_rows(&client, "SELECT sum(n), sum(total) FROM m").await,
            after
        );
        if let Some(sql) = change {
            client.batch_execute(sql).await.unwrap();
        }
        assert_eq!(shards().await, changed, "{flags:?} after {change:?}");
        drop(client);
        server.terminate();
    }
}
