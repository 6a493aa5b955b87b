//! Session settings as PostgreSQL sets them: startup options (`PGOPTIONS`, libpq's
//! `options`), `ALTER ROLE … SET`, `ALTER SYSTEM` and the server's configuration, `SHOW`
//! and `RESET`; and `statement_timeout`, which cancels a statement before it applies
//! anything.

mod common;

use std::time::Duration;

use common::{connect, fails, simple_rows, start, temp_dir};
use eddy_server::serve::{Config, Server};
use eddy_server::session::settings::Setting;

/// A client with these startup `options`.
async fn connect_with_options(
    server: &Server,
    options: &str,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let mut config = tokio_postgres::Config::new();
    config
        .host("127.0.0.1")
        .port(server.addr.port())
        .user("eddy")
        .dbname("eddy")
        .options(options);
    let (client, conn) = config.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    Ok(client)
}

async fn show(client: &tokio_postgres::Client, name: &str) -> String {
    simple_rows(client, &format!("SHOW {name}")).await[0][0]
        .clone()
        .unwrap_or_default()
}

/// `SHOW name` from psql, with `PGOPTIONS` set to `options`.
fn psql_show(server: &Server, options: &str, name: &str) -> String {
    let out = std::process::Command::new("psql")
        .args([
            "-X",
            "-Atc",
            &format!("SHOW {name}"),
            &common::conn_string(server),
        ])
        .env("PGOPTIONS", options)
        .output()
        .expect("psql runs");
    assert!(
        out.status.success(),
        "psql: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_come_from_the_server_the_role_the_startup_and_set() {
    let dir = temp_dir("settings-layers");
    let server = start(&dir).await;

    // Startup options, from psql's PGOPTIONS and from libpq-style `options`.
    assert_eq!(
        psql_show(&server, "-c synchronous_commit=off", "synchronous_commit"),
        "off"
    );
    assert_eq!(psql_show(&server, "", "synchronous_commit"), "on");
    let client = connect_with_options(
        &server,
        "-c synchronous_commit=off --statement-timeout=1500 -c geqo=off",
    )
    .await
    .unwrap();
    assert_eq!(show(&client, "synchronous_commit").await, "off");
    assert_eq!(show(&client, "statement_timeout").await, "1500ms");
    // SET changes it; RESET goes back to what the session started with.
    client
        .batch_execute("SET synchronous_commit = on; SET statement_timeout = '2s'")
        .await
        .unwrap();
    assert_eq!(show(&client, "synchronous_commit").await, "on");
    assert_eq!(show(&client, "statement_timeout").await, "2s");
    client
        .batch_execute("RESET synchronous_commit")
        .await
        .unwrap();
    assert_eq!(show(&client, "synchronous_commit").await, "off");
    client
        .batch_execute("SET synchronous_commit TO DEFAULT; RESET ALL")
        .await
        .unwrap();
    assert_eq!(show(&client, "statement_timeout").await, "1500ms");
    assert_eq!(show(&client, "synchronous_commit").await, "off");

    // A bad value in the startup refuses the session with 22023, as PostgreSQL does.
    let Err(refused) = connect_with_options(&server, "-c synchronous_commit=sometimes").await
    else {
        panic!("a bad startup value was accepted");
    };
    assert_eq!(common::sqlstate(&refused), "22023");

    // A role's defaults apply to its new sessions, below the startup options.
    let admin = connect(&server).await;
    admin
        .batch_execute("ALTER ROLE eddy SET synchronous_commit = off")
        .await
        .unwrap();
    admin
        .batch_execute("ALTER ROLE eddy SET statement_timeout TO 60000")
        .await
        .unwrap();
    let client = connect(&server).await;
    assert_eq!(show(&client, "synchronous_commit").await, "off");
    assert_eq!(show(&client, "statement_timeout").await, "1min");
    client
        .batch_execute("SET synchronous_commit = on")
        .await
        .unwrap();
    client
        .batch_execute("RESET synchronous_commit")
        .await
        .unwrap();
    assert_eq!(show(&client, "synchronous_commit").await, "off");
    let client = connect_with_options(&server, "-c synchronous_commit=on")
        .await
        .unwrap();
    assert_eq!(show(&client, "synchronous_commit").await, "on");
    assert_eq!(
        fails(&admin, "ALTER ROLE eddy SET no_such_setting = 1").await,
        Some("42704".into())
    );
    assert_eq!(
        fails(&admin, "ALTER ROLE eddy SET synchronous_commit = maybe").await,
        Some("22023".into())
    );
    assert_eq!(
        fails(&admin, "ALTER ROLE nobody SET synchronous_commit = off").await,
        Some("42704".into())
    );
    admin
        .batch_execute(
            "CREATE ROLE scorer LOGIN; ALTER ROLE scorer SET synchronous_commit = off; \
             ALTER ROLE eddy RESET statement_timeout",
        )
        .await
        .unwrap();

    // The server's default, from ALTER SYSTEM, under the role's.
    admin
        .batch_execute("ALTER SYSTEM SET statement_timeout = '30s'")
        .await
        .unwrap();
    let client = connect(&server).await;
    assert_eq!(show(&client, "statement_timeout").await, "30s");
    assert_eq!(show(&client, "synchronous_commit").await, "off");

    // Everything survives a restart: the role's settings in the catalog, ALTER SYSTEM's
    // in the data directory.
    drop((client, admin));
    server.stop().await;
    let server = start(&dir).await;
    let client = connect(&server).await;
    assert_eq!(show(&client, "statement_timeout").await, "30s");
    assert_eq!(show(&client, "synchronous_commit").await, "off");
    let scorer = common::connect_as(server.addr.port(), "scorer", None)
        .await
        .unwrap();
    assert_eq!(show(&scorer, "synchronous_commit").await, "off");
    client
        .batch_execute("ALTER ROLE eddy RESET ALL; ALTER SYSTEM RESET statement_timeout")
        .await
        .unwrap();
    let client = connect(&server).await;
    assert_eq!(show(&client, "statement_timeout").await, "0");
    assert_eq!(show(&client, "synchronous_commit").await, "on");
    client
        .batch_execute("ALTER SYSTEM SET synchronous_commit = off")
        .await
        .unwrap();
    assert_eq!(
        psql_show(&server, "", "synchronous_commit"),
        "off",
        "ALTER SYSTEM's default reaches new sessions"
    );
    assert_eq!(
        fails(&client, "ALTER SYSTEM SET synchronous_commit = perhaps").await,
        Some("22023".into())
    );
    client
        .batch_execute("ALTER SYSTEM RESET synchronous_commit")
        .await
        .unwrap();
    server.stop().await;

    // The configuration's default (eddy.toml, --synchronous-commit), which ALTER SYSTEM's
    // kept value beats unless the command line or the environment gave it.
    let server = Server::start(&Config {
        session_defaults: [(Setting::SynchronousCommit, "off".to_string())].into(),
        ..Config::embedded(dir.to_path_buf())
    })
    .await
    .unwrap();
    let client = connect(&server).await;
    assert_eq!(show(&client, "synchronous_commit").await, "off");
    client.batch_execute("RESET ALL").await.unwrap();
    assert_eq!(show(&client, "synchronous_commit").await, "off");

    // SHOW's column is the parameter's name as PostgreSQL spells it, however typed.
    for (typed, column) in [
        ("datestyle", "DateStyle"),
        ("INTERVALSTYLE", "IntervalStyle"),
        ("timezone", "TimeZone"),
        ("Server_Version", "server_version"),
    ] {
        let messages = client.simple_query(&format!("SHOW {typed}")).await.unwrap();
        let names: Vec<String> = messages
            .iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => {
                    Some(r.columns().iter().map(|c| c.name().to_string()).collect())
                }
                _ => None,
            })
            .expect("a row");
        assert_eq!(names, [column], "SHOW {typed}");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_timeout_cancels_a_statement_and_applies_nothing() {
    use futures::SinkExt;

    let dir = temp_dir("settings-timeout");
    let server = start(&dir).await;
    let client = connect(&server).await;
    client
        .batch_execute(
            "CREATE STREAM st (ts TIMESTAMP NOT NULL, card TEXT NOT NULL, amount DOUBLE PRECISION) \
             WITH (event_time = 'ts', partition_by = 'card', partitions = 2); \
             CREATE METRIC st_card AS SELECT card, COUNT(*) AS n FROM st WINDOW INFINITE GROUP BY card",
        )
        .await
        .unwrap();
    let rows: String = (0..2000)
        .map(|i| {
            format!(
                "2026-01-01 10:{:02}:{:02},c-{},{}\n",
                i / 60 % 60,
                i % 60,
                i % 50,
                i
            )
        })
        .collect();

    // A COPY whose data arrives after its time is up is cancelled with 57014: none of
    // its rows apply, and the session goes on.
    client
        .batch_execute("SET statement_timeout = '300ms'")
        .await
        .unwrap();
    let sink = client
        .copy_in("COPY st FROM STDIN (FORMAT csv)")
        .await
        .unwrap();
    futures::pin_mut!(sink);
    sink.send(bytes::Bytes::from(rows[..rows.len() / 2].to_string()))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let sent = async {
        sink.send(bytes::Bytes::from(rows[rows.len() / 2..].to_string()))
            .await?;
        sink.finish().await
    };
    let err = sent.await.expect_err("the COPY ran past its time");
    assert_eq!(common::sqlstate(&err), "57014", "{err}");
    let count = simple_rows(&client, "SELECT count(*) FROM st").await;
    assert_eq!(
        count[0][0].as_deref(),
        Some("0"),
        "nothing of the COPY applied"
    );

    // A query past its time is cancelled with 57014 too.
    client
        .batch_execute("SET statement_timeout = 0")
        .await
        .unwrap();
    let sink = client
        .copy_in("COPY st FROM STDIN (FORMAT csv)")
        .await
        .unwrap();
    futures::pin_mut!(sink);
    sink.send(bytes::Bytes::from(rows.clone())).await.unwrap();
    assert_eq!(sink.finish().await.unwrap(), 2000);
    client
        .batch_execute("SET statement_timeout = 200")
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let slow = fails(
        &client,
        "SELECT count(*) FROM st a, st b, st c WHERE a.amount + b.amount + c.amount < 0",
    )
    .await;
    assert_eq!(slow, Some("57014".into()));
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "cancelled near its time, not at the end: {:?}",
        started.elapsed()
    );
    // The session goes on, and a statement within its time runs.
    let count = simple_rows(&client, "SELECT count(*) FROM st").await;
    assert_eq!(count[0][0].as_deref(), Some("2000"));
    server.stop().await;
}
