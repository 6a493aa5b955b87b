//! Authentication on the real binary: with a password, every client proves it with
//! SCRAM-SHA-256 (tokio-postgres and psql); a wrong password and an unknown user fail
//! alike with 28P01; the secret is kept for the next start; and without a password Eddy
//! refuses to listen beyond loopback.

mod common;

use common::{
    connect_as as connect, fails, psql, refused_start, simple_rows, spawn_eddy_env,
    sqlstate as code, temp_dir,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_prove_the_password_with_scram() {
    let dir = temp_dir("auth");
    let (server, port) = spawn_eddy_env(&dir, &[], &[("EDDY_PASSWORD", "s3cret pass")]);

    let client = connect(port, "eddy", Some("s3cret pass"))
        .await
        .expect("the right password");
    assert_eq!(
        simple_rows(&client, "SELECT 1").await,
        [[Some("1".to_string())]]
    );

    let wrong = connect(port, "eddy", Some("guess")).await.unwrap_err();
    assert_eq!(code(&wrong), "28P01", "{wrong}");
    let unknown = connect(port, "mallory", Some("s3cret pass"))
        .await
        .unwrap_err();
    assert_eq!(code(&unknown), "28P01", "{unknown}");
    // Nothing tells an unknown user from a wrong password.
    let message = |e: &tokio_postgres::Error| {
        e.as_db_error()
            .map(|d| d.message().to_string())
            .unwrap_or_default()
    };
    assert_eq!(
        message(&wrong).replace("\"eddy\"", "\"mallory\""),
        message(&unknown)
    );
    // No password at all: the client cannot answer the SCRAM challenge.
    assert!(connect(port, "eddy", None).await.is_err());

    // psql, as a user runs it.
    let as_eddy = |password: &str| {
        let conninfo =
            format!("host=127.0.0.1 port={port} user=eddy dbname=eddy password='{password}'");
        psql(&conninfo, "SELECT 41 + 1", "")
    };
    let ok = as_eddy("s3cret pass");
    assert_eq!(String::from_utf8_lossy(&ok.stdout).trim(), "42", "{ok:?}");
    let bad = as_eddy("nope");
    assert!(!bad.status.success());
    let said = String::from_utf8_lossy(&bad.stderr).to_lowercase();
    assert!(
        said.contains("password authentication failed for user \"eddy\""),
        "{said}"
    );
    drop(client);
    server.terminate();

    // The secret is kept: without EDDY_PASSWORD the next start still asks for it.
    let (server, port) = spawn_eddy_env(&dir, &[], &[]);
    assert_eq!(
        code(&connect(port, "eddy", Some("guess")).await.unwrap_err()),
        "28P01"
    );
    connect(port, "eddy", Some("s3cret pass"))
        .await
        .expect("the kept password");
    assert!(!std::fs::read_to_string(dir.join("auth.scram"))
        .unwrap()
        .contains("s3cret"));
    server.terminate();
}

#[test]
fn without_a_password_only_loopback_is_served() {
    let dir = temp_dir("auth-open");
    let said = refused_start(&dir, &["--pg-addr", "0.0.0.0:0", "--shards", "1"], &[]);
    assert!(
        said.contains("refusing to listen on 0.0.0.0:0 without a password"),
        "{said}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_decide_every_kind_of_statement() {
    let dir = temp_dir("grants");
    let (server, port) = spawn_eddy_env(&dir, &[], &[("EDDY_PASSWORD", "root-pw")]);
    let admin = connect(port, "eddy", Some("root-pw")).await.unwrap();
    admin
        .batch_execute(
            "CREATE STREAM pay (card TEXT, amount BIGINT, ts TIMESTAMP) WITH (event_time = 'ts');
             CREATE METRIC spend AS SELECT card, SUM(amount) AS total FROM pay
               WINDOW SLIDING (SIZE 1 HOUR) GROUP BY card;
             CREATE ROLE writer LOGIN PASSWORD 'w-pw';
             CREATE USER reader PASSWORD 'r-pw';
             CREATE ROLE nobody LOGIN PASSWORD 'n-pw';
             CREATE ROLE cannot_log_in PASSWORD 'c-pw';
             GRANT INSERT ON STREAM pay TO writer;
             GRANT SELECT ON METRIC spend TO reader;",
        )
        .await
        .unwrap();
    // psql's \du lists them.
    assert_eq!(
        simple_rows(
            &admin,
            "SELECT rolname, rolcanlogin FROM pg_roles ORDER BY 1"
        )
        .await,
        [
            ["cannot_log_in", "f"],
            ["eddy", "t"],
            ["nobody", "t"],
            ["reader", "t"],
            ["writer", "t"],
        ]
        .map(|r| r.map(|c| Some(c.to_string())).to_vec())
    );
    let writer = connect(port, "writer", Some("w-pw")).await.unwrap();
    let reader = connect(port, "reader", Some("r-pw")).await.unwrap();
    let nobody = connect(port, "nobody", Some("n-pw")).await.unwrap();
    let no_login = connect(port, "cannot_log_in", Some("c-pw"))
        .await
        .unwrap_err();
    assert_eq!(code(&no_login), "28P01");
    assert_eq!(
        code(&connect(port, "writer", Some("r-pw")).await.unwrap_err()),
        "28P01"
    );

    let insert = "INSERT INTO pay VALUES ('c1', 5, '2026-01-01 00:00:00')";
    let total = || async { simple_rows(&admin, "SELECT total FROM spend WHERE card = 'c1'").await };
    // INSERT, RETURNING and COPY FROM take INSERT on the stream.
    assert_eq!(fails(&writer, insert).await, None);
    assert_eq!(
        simple_rows(&writer, &format!("{insert} RETURNING spend.total")).await,
        [[Some("10".to_string())]]
    );
    for denied in [&reader, &nobody] {
        assert_eq!(fails(denied, insert).await.as_deref(), Some("42501"));
        assert_eq!(
            fails(denied, "COPY pay FROM STDIN").await.as_deref(),
            Some("42501")
        );
        assert_eq!(fails(denied, "SELECT 1").await, None, "the session goes on");
    }
    // A prepared INSERT takes its fast path, checked at each execution.
    let prepared = "INSERT INTO pay VALUES ($1, $2, '2026-01-01 00:00:01')";
    writer.execute(prepared, &[&"c1", &1i64]).await.unwrap();
    let denied = reader.execute(prepared, &[&"c1", &1i64]).await.unwrap_err();
    assert_eq!(code(&denied), "42501");
    // Denied statements changed nothing.
    assert_eq!(total().await, [[Some("11".to_string())]]);

    // SELECT, prepared point lookups, EMIT CHANGES and COPY TO take SELECT.
    assert_eq!(fails(&reader, "SELECT * FROM spend").await, None);
    let lookup = "SELECT total FROM spend WHERE card = $1";
    assert_eq!(reader.query(lookup, &[&"c1"]).await.unwrap().len(), 1);
    for denied in [&writer, &nobody] {
        assert_eq!(
            fails(denied, "SELECT * FROM spend").await.as_deref(),
            Some("42501")
        );
        assert_eq!(
            code(&denied.query(lookup, &[&"c1"]).await.unwrap_err()),
            "42501"
        );
        assert_eq!(
            fails(
                denied,
                "BEGIN; DECLARE c CURSOR FOR SELECT * FROM spend EMIT CHANGES"
            )
            .await
            .as_deref(),
            Some("42501")
        );
        let _ = denied.batch_execute("ROLLBACK").await;
        assert_eq!(
            fails(denied, "COPY (SELECT * FROM spend) TO STDOUT")
                .await
                .as_deref(),
            Some("42501")
        );
    }
    assert_eq!(
        fails(
            &reader,
            "BEGIN; DECLARE c CURSOR FOR SELECT * FROM spend EMIT CHANGES; CLOSE c; COMMIT"
        )
        .await,
        None
    );
    // The stream's events are not the metric's: reading them takes SELECT on the stream.
    assert_eq!(
        fails(&reader, "SELECT * FROM pay").await.as_deref(),
        Some("42501")
    );
    assert_eq!(
        fails(
            &reader,
            "SELECT * FROM spend WHERE card IN (SELECT card FROM pay)"
        )
        .await
        .as_deref(),
        Some("42501")
    );

    // DDL takes ownership or the superuser.
    for sql in [
        "DROP METRIC spend",
        "ALTER STREAM pay ADD COLUMN note TEXT",
        "CREATE METRIC mine AS SELECT COUNT(*) FROM pay WINDOW SLIDING (SIZE 1 HOUR)",
        "GRANT SELECT ON METRIC spend TO nobody",
        "GRANT SELECT ON ALL METRICS TO nobody",
        "CREATE ROLE sneaky SUPERUSER",
        "ALTER ROLE nobody SUPERUSER",
        "ALTER SYSTEM SET max_insert_rows = 10",
    ] {
        assert_eq!(fails(&writer, sql).await.as_deref(), Some("42501"), "{sql}");
    }
    // A role owns what it creates, and may share it.
    writer
        .batch_execute(
            "CREATE STREAM own (x BIGINT, ts TIMESTAMP) WITH (event_time = 'ts');
             CREATE METRIC own_count AS SELECT COUNT(*) AS n FROM own WINDOW SLIDING (SIZE 1 HOUR);
             INSERT INTO own VALUES (1, '2026-01-01 00:00:00');
             GRANT SELECT ON METRIC own_count TO nobody;
             ALTER ROLE writer PASSWORD 'w-pw2';",
        )
        .await
        .unwrap();
    assert_eq!(
        simple_rows(&nobody, "SELECT n FROM own_count").await,
        [[Some("1".to_string())]]
    );
    assert_eq!(
        fails(&nobody, "SELECT * FROM own").await.as_deref(),
        Some("42501")
    );
    assert_eq!(
        fails(&admin, "DROP ROLE writer").await.as_deref(),
        Some("2BP01")
    );
    // ON ALL METRICS covers metrics made later; REVOKE takes effect at once, on prepared
    // statements too.
    admin.batch_execute("GRANT SELECT ON ALL METRICS TO nobody; CREATE METRIC later AS SELECT COUNT(*) FROM pay WINDOW SLIDING (SIZE 1 HOUR)").await.unwrap();
    assert_eq!(fails(&nobody, "SELECT * FROM later").await, None);
    let statement = reader.prepare(lookup).await.unwrap();
    reader.query(&statement, &[&"c1"]).await.unwrap();
    admin
        .batch_execute("REVOKE SELECT ON METRIC spend FROM reader")
        .await
        .unwrap();
    assert_eq!(
        code(&reader.query(&statement, &[&"c1"]).await.unwrap_err()),
        "42501"
    );
    // Errors name what is missing.
    assert_eq!(
        fails(&admin, "GRANT SELECT ON METRIC nothing TO reader")
            .await
            .as_deref(),
        Some("42P01")
    );
    assert_eq!(
        fails(&admin, "GRANT SELECT ON METRIC spend TO ghost")
            .await
            .as_deref(),
        Some("42704")
    );
    assert_eq!(
        fails(&admin, "GRANT INSERT ON METRIC spend TO reader")
            .await
            .as_deref(),
        Some("22023")
    );
    assert_eq!(
        fails(&admin, "CREATE ROLE reader").await.as_deref(),
        Some("42P07")
    );
    drop((admin, writer, reader, nobody));
    server.terminate();

    // Roles and grants are kept, and only as verifiers.
    let kept = std::fs::read_to_string(dir.join("catalog.sql")).unwrap();
    for secret in ["w-pw", "r-pw", "n-pw", "root-pw"] {
        assert!(!kept.contains(secret), "{secret} in {kept}");
    }
    assert!(kept.contains("SCRAM-SHA-256$4096:"), "{kept}");
    let (server, port) = spawn_eddy_env(&dir, &[], &[]);
    let writer = connect(port, "writer", Some("w-pw2")).await.unwrap();
    assert_eq!(fails(&writer, insert).await, None);
    assert_eq!(
        fails(&writer, "SELECT * FROM spend").await.as_deref(),
        Some("42501")
    );
    let nobody = connect(port, "nobody", Some("n-pw")).await.unwrap();
    assert_eq!(fails(&nobody, "SELECT * FROM later").await, None);
    drop((writer, nobody));
    server.terminate();
}

/// A self-signed certificate and its key, made with openssl.
fn certificate(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let made = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl runs");
    assert!(made.status.success(), "{made:?}");
    (cert, key)
}

#[test]
fn tls_when_asked_and_only_tls_when_required() {
    let dir = temp_dir("tls");
    let (cert, key) = certificate(&dir.join("pki"));
    let (cert, key) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let (server, port) = spawn_eddy_env(
        &dir.join("data"),
        &["--tls-cert", cert, "--tls-key", key],
        &[("EDDY_PASSWORD", "tls-pw")],
    );
    let base = format!("host=127.0.0.1 port={port} user=eddy dbname=eddy password=tls-pw");
    let tls = psql(&format!("{base} sslmode=require"), "SELECT 1", "");
    assert!(tls.status.success(), "{tls:?}");
    // Without TLS, still served unless TLS is required.
    let plain = psql(&format!("{base} sslmode=disable"), "SELECT 1", "");
    assert!(plain.status.success(), "{plain:?}");
    server.terminate();

    let http = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let http_addr = format!("127.0.0.1:{http}");
    let (server, port) = spawn_eddy_env(
        &dir.join("data"),
        &[
            "--tls-cert",
            cert,
            "--tls-key",
            key,
            "--tls-required",
            "--http-addr",
            &http_addr,
        ],
        &[],
    );
    // /metrics takes the same certificate.
    let metrics = std::process::Command::new("curl")
        .args([
            "-sS",
            "--cacert",
            cert,
            "--resolve",
            &format!("localhost:{http}:127.0.0.1"),
        ])
        .arg(format!("https://localhost:{http}/metrics"))
        .output()
        .expect("curl runs");
    assert!(
        String::from_utf8_lossy(&metrics.stdout).contains("# TYPE "),
        "{metrics:?}"
    );
    let base = format!("host=127.0.0.1 port={port} user=eddy dbname=eddy password=tls-pw");
    let tls = psql(&format!("{base} sslmode=require"), "SELECT 42", "");
    assert_eq!(String::from_utf8_lossy(&tls.stdout).trim(), "42", "{tls:?}");
    let plain = psql(&format!("{base} sslmode=disable"), "SELECT 1", "");
    assert!(!plain.status.success());
    let said = String::from_utf8_lossy(&plain.stderr);
    assert!(said.contains("TLS is required"), "{said}");
    server.terminate();

    // --tls-required without a certificate does not start.
    let data = dir.join("data2");
    let said = refused_start(&data, &["--tls-required"], &[]);
    assert!(said.contains("--tls-cert"), "{said}");
}

/// Identity is the logged-in role in ad-hoc SQL too: `current_user`, the owner `\dt`
/// shows, and `has_table_privilege` as the grants decide; and a NOLOGIN role may not log
/// in even where logins are trusted (no password on the node).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ad_hoc_sql_sees_the_logged_in_role() {
    let dir = temp_dir("identity");
    let (_server, port) = spawn_eddy_env(&dir, &[], &[]);
    let admin = connect(port, "eddy", None).await.unwrap();
    admin
        .batch_execute(
            "CREATE ROLE analyst LOGIN;
             CREATE ROLE maker LOGIN;
             CREATE ROLE locked;",
        )
        .await
        .unwrap();
    let maker = connect(port, "maker", None).await.unwrap();
    maker
        .batch_execute("CREATE STREAM made (card TEXT, ts TIMESTAMP) WITH (event_time = 'ts')")
        .await
        .unwrap();
    let analyst = connect(port, "analyst", None).await.unwrap();
    let one = |rows: Vec<Vec<Option<String>>>| rows.concat();
    assert_eq!(
        one(simple_rows(&analyst, "SELECT current_user, session_user, current_role").await),
        [
            Some("analyst".to_string()),
            Some("analyst".to_string()),
            Some("analyst".to_string())
        ]
    );
    // The owner \dt shows is the role that created the stream.
    assert_eq!(
        one(simple_rows(
            &admin,
            "SELECT pg_catalog.pg_get_userbyid(c.relowner) FROM pg_catalog.pg_class c WHERE c.relname = 'made'"
        )
        .await),
        [Some("maker".to_string())]
    );
    let may_select = "SELECT has_table_privilege('analyst', 'made', 'SELECT'), has_table_privilege('made', 'SELECT')";
    assert_eq!(
        one(simple_rows(&analyst, may_select).await),
        [Some("f".to_string()), Some("f".to_string())]
    );
    assert_eq!(
        fails(&analyst, "SELECT * FROM made").await.as_deref(),
        Some("42501")
    );
    maker
        .batch_execute("GRANT SELECT ON STREAM made TO analyst")
        .await
        .unwrap();
    assert_eq!(
        one(simple_rows(&analyst, may_select).await),
        [Some("t".to_string()), Some("t".to_string())]
    );
    assert_eq!(fails(&analyst, "SELECT * FROM made").await, None);
    assert_eq!(
        fails(
            &analyst,
            "SELECT has_table_privilege('nobody', 'made', 'SELECT')"
        )
        .await
        .as_deref(),
        Some("42704")
    );
    assert_eq!(
        code(&connect(port, "locked", None).await.unwrap_err()),
        "28000"
    );
}
