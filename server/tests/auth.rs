//! Authentication on the real binary: with a password, every client proves it with
//! SCRAM-SHA-256 (tokio-postgres and psql); a wrong password and an unknown user fail
//! alike with 28P01; the secret is kept for the next start; and without a password Eddy
//! refuses to listen beyond loopback.

mod common;

use common::{simple_rows, spawn_eddy_env, temp_dir};

async fn connect(
    port: u16,
    user: &str,
    password: Option<&str>,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let mut config = format!("host=127.0.0.1 port={port} user={user} dbname=eddy");
    if let Some(p) = password {
        config.push_str(&format!(" password='{p}'"));
    }
    let (client, conn) = tokio_postgres::connect(&config, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    Ok(client)
}

fn code(e: &tokio_postgres::Error) -> String {
    e.code()
        .map(|c| c.code().to_string())
        .unwrap_or_else(|| format!("no SQLSTATE: {e}"))
}

fn psql(port: u16, password: &str) -> std::process::Output {
    std::process::Command::new("psql")
        .args([
            "-X",
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "eddy",
            "-d",
            "eddy",
        ])
        .args(["-v", "VERBOSITY=verbose", "-Atc", "SELECT 41 + 1"])
        .env("PGPASSWORD", password)
        .output()
        .expect("psql runs")
}

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
    let ok = psql(port, "s3cret pass");
    assert_eq!(String::from_utf8_lossy(&ok.stdout).trim(), "42", "{ok:?}");
    let bad = psql(port, "nope");
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
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_eddy"))
        .args([
            "serve",
            "--pg-addr",
            "0.0.0.0:0",
            "--http-addr",
            "127.0.0.1:0",
        ])
        .args(["--shards", "1", "--data-dir"])
        .arg(&*dir)
        .env_remove("EDDY_PASSWORD")
        .output()
        .expect("eddy runs");
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("refusing to listen on 0.0.0.0:0 without a password"),
        "{said}"
    );
}
