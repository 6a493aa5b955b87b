//! Node settings that `ALTER SYSTEM` changes while the node runs and keeps for its next
//! start in the data directory (`eddy.auto.conf`, lines `name = 'value'`). As with
//! PostgreSQL's `postgresql.auto.conf`, a command-line flag (or its environment
//! variable) wins over the file.

use std::collections::BTreeMap;
use std::path::Path;

/// The file of settings `ALTER SYSTEM` keeps, in the data directory.
pub const AUTO_CONF: &str = "eddy.auto.conf";

/// The most shards a node runs.
pub const SHARDS_MAX: usize = 1024;

/// A shard count: a number from 1 to `SHARDS_MAX`, or `auto` (`None`: one per core,
/// less the cores kept for the service threads).
pub fn parse_shards(text: &str) -> Result<Option<usize>, String> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("auto") {
        return Ok(None);
    }
    match text.parse::<usize>() {
        Ok(n) if (1..=SHARDS_MAX).contains(&n) => Ok(Some(n)),
        _ => Err(format!(
            "expected a number of shards from 1 to {SHARDS_MAX}, or auto, got \"{text}\""
        )),
    }
}

/// The settings kept in `dir` (none when the file is missing).
pub fn load(dir: &Path) -> std::io::Result<BTreeMap<String, String>> {
    let text = match std::fs::read_to_string(dir.join(AUTO_CONF)) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => return Err(e),
    };
    Ok(text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(name, value)| {
            let value = value.trim();
            let value = value
                .strip_prefix('\'')
                .and_then(|v| v.strip_suffix('\''))
                .unwrap_or(value);
            (name.trim().to_ascii_lowercase(), value.replace("''", "'"))
        })
        .collect())
}

/// Keeps `name = value` in `dir` (`None`: forgets `name`), replacing the file at once.
pub fn save(dir: &Path, name: &str, value: Option<&str>) -> std::io::Result<()> {
    let mut settings = load(dir)?;
    match value {
        Some(v) => settings.insert(name.to_string(), v.to_string()),
        None => settings.remove(name),
    };
    let mut text = String::from("# Written by ALTER SYSTEM; flags given at start win.\n");
    for (name, value) in &settings {
        text.push_str(&format!("{name} = '{}'\n", value.replace('\'', "''")));
    }
    replace_file(dir, AUTO_CONF, text.as_bytes())
}

/// Replaces `dir/name` with `bytes` at once: a crash leaves the old file or the new one,
/// durably (the file and the directory are fsynced).
pub fn replace_file(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(name))?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_round_trip_through_the_file() {
        let dir = std::env::temp_dir().join(format!("eddy-settings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(load(&dir).unwrap().is_empty());
        save(&dir, "shards", Some("3")).unwrap();
        save(&dir, "odd", Some("it's")).unwrap();
        let got = load(&dir).unwrap();
        assert_eq!(got.get("shards").map(String::as_str), Some("3"));
        assert_eq!(got.get("odd").map(String::as_str), Some("it's"));
        save(&dir, "shards", None).unwrap();
        assert!(!load(&dir).unwrap().contains_key("shards"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn shard_counts_are_numbers_in_range_or_auto() {
        assert_eq!(parse_shards("auto"), Ok(None));
        assert_eq!(parse_shards(" 4 "), Ok(Some(4)));
        for bad in ["0", "-1", "1025", "two", ""] {
            assert!(parse_shards(bad).is_err(), "{bad}");
        }
    }
}
