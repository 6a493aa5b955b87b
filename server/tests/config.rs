//! eddy.toml, `eddy config`, and the log: a real `eddy` process with a config file.

mod common;

use std::process::Command;

use common::{connect_port, refused_start, simple_rows, spawn_eddy_env, temp_dir};

/// `eddy config` with `args` and `env` only (no EDDY_ variable of the test's own).
fn eddy_config(cwd: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_eddy"));
    for (key, _) in std::env::vars() {
        if key.starts_with("EDDY_") {
            command.env_remove(key);
        }
    }
    let out = command
        .current_dir(cwd)
        .arg("config")
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("eddy runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

async fn shards(port: u16) -> usize {
    simple_rows(&connect_port(port).await, "SHOW SHARDS")
        .await
        .len()
}

async fn show(port: u16, name: &str) -> String {
    let client = connect_port(port).await;
    simple_rows(&client, &format!("SHOW {name}")).await[0][0]
        .clone()
        .unwrap()
}

#[tokio::test]
async fn the_file_sets_settings_and_limits_under_the_environment_and_alter_system() {
    let dir = temp_dir("config-file");
    std::fs::create_dir_all(&*dir).unwrap();
    let file = dir.join("eddy.toml");
    std::fs::write(
        &file,
        "shards = 1\nbusy_poll = 0\n\n[limits]\nmax_connections = 42\nmax_insert_rows = 5\nmax_subscriptions = 3\n",
    )
    .unwrap();
    let data = dir.join("data");
    let config = file.to_str().unwrap();
    // No --shards flag: the file's applies. The environment beats the file.
    let (eddy, port) = spawn_eddy_env(
        &data,
        &["--config", config, "--shards", "kept"],
        &[("EDDY_MAX_INSERT_ROWS", "7")],
    );
    assert_eq!(shards(port).await, 1);
    assert_eq!(show(port, "max_connections").await, "42");
    assert_eq!(show(port, "max_insert_rows").await, "7");
    let client = connect_port(port).await;
    client
        .batch_execute("ALTER SYSTEM SET max_subscriptions = 9; ALTER SYSTEM SET shards = 2")
        .await
        .unwrap();
    drop(client);
    eddy.terminate();
    // What ALTER SYSTEM kept beats the file; a flag beats what was kept.
    let (eddy, port) = spawn_eddy_env(&data, &["--config", config, "--shards", "kept"], &[]);
    assert_eq!(show(port, "max_subscriptions").await, "9");
    assert_eq!(shards(port).await, 2);
    assert_eq!(show(port, "max_insert_rows").await, "5");
    eddy.terminate();
    let (eddy, port) = spawn_eddy_env(&data, &["--config", config, "--shards", "1"], &[]);
    assert_eq!(shards(port).await, 1);
    eddy.terminate();
}

#[test]
fn bad_settings_fail_the_start_with_their_key_and_reason() {
    let dir = temp_dir("config-bad");
    std::fs::create_dir_all(&*dir).unwrap();
    let file = dir.join("eddy.toml");
    let config = file.to_str().unwrap();
    for (text, says) in [
        (
            "replicas = 40\n",
            "replicas = \"40\": invalid value '40' for '--replicas",
        ),
        ("pg_adr = \"127.0.0.1:1\"\n", "unknown setting \"pg_adr\""),
        (
            "busy_poll = \"soon\"\n",
            "busy_poll = \"soon\": invalid value",
        ),
        (
            "[limits]\nmax_connections = 0\n",
            "limits.max_connections = 0",
        ),
        ("[limit]\nmax_connections = 1\n", "limit: unknown table"),
        ("shards = \n", "TOML parse error at line 1"),
    ] {
        std::fs::write(&file, text).unwrap();
        let said = refused_start(&dir.join("data"), &["--config", config], &[]);
        assert!(
            said.contains(config) && said.contains(says),
            "{text}: {said}"
        );
    }
    let said = refused_start(&dir.join("data"), &[], &[("EDDY_MAX_INSERT_ROWS", "many")]);
    assert!(
        said.contains("EDDY_MAX_INSERT_ROWS: invalid value"),
        "{said}"
    );
    let missing = dir.join("nowhere.toml");
    let said = refused_start(
        &dir.join("data"),
        &[],
        &[("EDDY_CONFIG", missing.to_str().unwrap())],
    );
    assert!(said.contains("nowhere.toml"), "{said}");
}

#[test]
fn eddy_config_prints_each_value_and_where_it_came_from() {
    let dir = temp_dir("config-print");
    std::fs::create_dir_all(&*dir).unwrap();
    std::fs::write(
        dir.join("eddy.toml"),
        "replicas = 3\nkafka_properties = [\"linger.ms=5\"]\n[limits]\nmax_connections = 42\n",
    )
    .unwrap();
    let out = eddy_config(
        &dir,
        &["--config", "eddy.toml", "--busy-poll", "7"],
        &[("EDDY_CLUSTER", "blue"), ("EDDY_MAX_INSERT_ROWS", "9")],
    );
    for line in [
        "replicas = 3   # eddy.toml",
        "kafka_properties = [\"linger.ms=5\"]   # eddy.toml",
        "busy_poll = 7   # command line",
        "cluster = \"blue\"   # environment EDDY_CLUSTER",
        "pg_addr = \"127.0.0.1:5433\"   # default",
        "max_connections = 42   # eddy.toml",
        "max_insert_rows = 9   # environment EDDY_MAX_INSERT_ROWS",
        "max_statement_bytes = \"16MB\"   # default",
    ] {
        assert!(out.lines().any(|l| l == line), "no {line:?} in:\n{out}");
    }
    // Its output is itself a valid file that means the same.
    let settings: Vec<&str> = out
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split("   #").next().unwrap())
        .collect();
    std::fs::write(dir.join("again.toml"), settings.join("\n")).unwrap();
    let again = eddy_config(&dir, &["--config", "again.toml"], &[]);
    assert!(again.contains("busy_poll = 7   # again.toml"), "{again}");
    assert!(
        again.contains("max_insert_rows = 9   # again.toml"),
        "{again}"
    );
}

/// docs/eddy.toml is `eddy config` on its defaults: every setting and limit, documented.
#[test]
fn the_documented_defaults_are_the_binarys() {
    let dir = temp_dir("config-docs");
    std::fs::create_dir_all(&*dir).unwrap();
    let out = eddy_config(&dir, &[], &[]);
    let docs = common::repo().join("docs/eddy.toml");
    let documented = std::fs::read_to_string(&docs).unwrap_or_default();
    if std::env::var_os("EDDY_BLESS").is_some() {
        std::fs::write(&docs, &out).unwrap();
        return;
    }
    assert_eq!(
        documented, out,
        "docs/eddy.toml is stale: run EDDY_BLESS=1 cargo test -p eddy-server --test config"
    );
}

#[tokio::test]
async fn json_logs_carry_the_node_session_and_slow_statements() {
    let dir = temp_dir("config-log");
    std::fs::create_dir_all(&*dir).unwrap();
    let (eddy, port) = spawn_eddy_env(
        &dir,
        &["--log-format", "json", "--slow-statement-ms", "0"],
        &[],
    );
    let client = connect_port(port).await;
    client.batch_execute("SHOW max_connections").await.unwrap();
    drop(client);
    let lines = eddy.terminate();
    let events: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    let slow = events
        .iter()
        .find(|e| e["fields"]["statement"] == "SHOW max_connections")
        .unwrap_or_else(|| panic!("no slow statement in {lines:?}"));
    assert_eq!(slow["level"], "WARN");
    assert!(slow["fields"]["duration_ms"].as_f64().is_some());
    let spans: Vec<&str> = slow["spans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(spans, ["node", "session"], "{slow}");
    assert_eq!(slow["spans"][0]["id"], "local");
    assert!(events
        .iter()
        .any(|e| e["fields"]["message"] == "shutting down"));
}
