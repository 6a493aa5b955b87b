//! How tasks are named and found: `TaskId`, which task of a partitioner an event goes to
//! (exactly as Kafka's default partitioner would choose the partition for a record keyed
//! the same way), and which shard runs a task.
//!
//! Invariant: `partition_for` equals `toPositive(murmur2(key)) % partitions` of the Java
//! client, with the key the UTF-8 text of the value and NULL as the empty key. This module
//! depends on nothing in the crate but the event row type, so every layer can name tasks.

use std::collections::BTreeMap;

use eddy_planner::catalog::StreamDef;
use eddy_planner::types::Value;

use crate::exec::events::Row;

/// Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2).
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = SEED ^ (len as u32);
    let chunks = data.chunks_exact(4);
    let tail = chunks.remainder();
    for c in chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    if tail.len() >= 3 {
        h ^= (tail[2] as u32) << 16;
    }
    if tail.len() >= 2 {
        h ^= (tail[1] as u32) << 8;
    }
    if !tail.is_empty() {
        h ^= tail[0] as u32;
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The task (Kafka partition) of a partitioner value.
pub fn partition_for(value: &Value, partitions: u32) -> u32 {
    let text = value.text().unwrap_or_default();
    ((murmur2(text.as_bytes()) & 0x7fff_ffff) as u32) % partitions
}

/// A task: (stream, partitioner, partition).
#[derive(
    Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct TaskId {
    pub stream: String,
    pub partitioner: usize,
    pub partition: u32,
}

/// A file-name-safe form of a stream name.
pub(crate) fn dir_name(stream: &str) -> String {
    let plain = !stream.is_empty()
        && stream
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if plain {
        stream.to_string()
    } else {
        let hex: String = stream.bytes().map(|b| format!("{b:02x}")).collect();
        format!("x-{hex}")
    }
}

/// The shard owning a task: stable across restarts and nodes. A stream's partitions go
/// round-robin from a shard picked by its name, so its tasks spread over every shard.
pub fn shard_of(task: &TaskId, shards: usize) -> usize {
    let key = format!("{}/{}", task.stream, task.partitioner);
    let first = (murmur2(key.as_bytes()) & 0x7fff_ffff) as usize;
    (first + task.partition as usize) % shards
}

/// Events routed to the tasks of every partitioner: (partitioner, task, the events'
/// indexes in `rows`, the events), partitioner by partitioner.
pub(crate) type Routed = Vec<(usize, TaskId, Vec<usize>, Vec<Row>)>;

pub(crate) fn route(stream: &StreamDef, rows: &[Row]) -> Routed {
    let mut routed = Vec::new();
    let mut partitions = Vec::with_capacity(rows.len());
    for p in 0..stream.partitioner_count() {
        let task = |partition| TaskId {
            stream: stream.name.clone(),
            partitioner: p,
            partition,
        };
        partitions.clear();
        partitions.extend(rows.iter().map(|row| match stream.partitioners.get(p) {
            Some(col) => partition_for(&row[*col], stream.partitions),
            None => 0,
        }));
        // One task takes them all (one row, or one partition): no map, no copies of the
        // index list.
        if let Some(&first) = partitions.first() {
            if partitions.iter().all(|&t| t == first) {
                routed.push((p, task(first), (0..rows.len()).collect(), rows.to_vec()));
                continue;
            }
        }
        let mut per_task: BTreeMap<u32, (Vec<usize>, Vec<Row>)> = BTreeMap::new();
        for (i, (row, &partition)) in rows.iter().zip(&partitions).enumerate() {
            let entry = per_task.entry(partition).or_default();
            entry.0.push(i);
            entry.1.push(row.clone());
        }
        for (partition, (indexes, task_rows)) in per_task {
            routed.push((p, task(partition), indexes, task_rows));
        }
    }
    routed
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectors of Kafka's own UtilsTest.testMurmur2.
    #[test]
    fn matches_kafka_murmur2() {
        assert_eq!(murmur2(b"21"), -973_932_308);
        assert_eq!(murmur2(b"foobar"), -790_332_482);
        assert_eq!(murmur2(b"a-little-bit-long-string"), -985_981_536);
        assert_eq!(murmur2(b"a-little-bit-longer-string"), -1_486_304_829);
        assert_eq!(
            murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8"),
            -58_897_971
        );
        assert_eq!(murmur2(b"abc"), 479_470_107);
    }

    /// Each partitioner gets every row once, in input order within a task, with the
    /// rows' indexes; a batch bound for one task keeps all of them in one piece.
    #[test]
    fn routes_every_row_to_one_task_of_each_partitioner() {
        let sql = "CREATE STREAM s (ts TIMESTAMP NOT NULL, a TEXT, b TEXT) \
                   WITH (event_time = 'ts', partition_by = 'a, b', partitions = 4)";
        let stmt = eddy_planner::sql::parse_statement(sql).unwrap();
        let catalog = eddy_planner::ddl::apply(&Default::default(), &stmt)
            .unwrap()
            .0;
        let stream = catalog.stream("s").unwrap();
        let row = |a: &str, b: &str| -> Row {
            Row::from(vec![
                Value::Timestamp(0),
                Value::Text(a.into()),
                Value::Text(b.into()),
            ])
        };
        let rows: Vec<Row> = (0..40).map(|i| row(&format!("a{i}"), "same")).collect();
        let routed = route(stream, &rows);
        for p in 0..2 {
            let mine: Vec<_> = routed.iter().filter(|r| r.0 == p).collect();
            let mut seen: Vec<usize> = mine.iter().flat_map(|r| r.2.clone()).collect();
            seen.sort();
            assert_eq!(seen, (0..40).collect::<Vec<_>>());
            for (_, task, indexes, task_rows) in &mine {
                assert!(indexes.is_sorted());
                for (i, r) in indexes.iter().zip(task_rows) {
                    assert!(std::ptr::eq(r.as_ptr(), rows[*i].as_ptr()));
                    let col = stream.partitioners[p];
                    assert_eq!(task.partition, partition_for(&r[col], 4));
                }
            }
            // `a` spreads the rows; `b` is one value, so one task.
            assert_eq!(mine.len() > 1, p == 0);
        }
    }

    #[test]
    fn null_routes_like_the_empty_key() {
        assert_eq!(
            partition_for(&Value::Null, 8),
            partition_for(&Value::Text("".into()), 8)
        );
    }

    /// A stream's partitions spread evenly over the shards, whatever its name.
    #[test]
    fn a_streams_tasks_spread_over_every_shard() {
        for (stream, partitions, shards) in [("a", 2, 2), ("lat_1", 2, 2), ("s", 5, 2), ("x", 7, 3)]
        {
            let mut per_shard = vec![0; shards];
            for partition in 0..partitions {
                let task = TaskId {
                    stream: stream.into(),
                    partitioner: 0,
                    partition,
                };
                per_shard[shard_of(&task, shards)] += 1;
            }
            let (min, max) = (per_shard.iter().min(), per_shard.iter().max());
            assert!(max.unwrap() - min.unwrap() <= 1, "{stream}: {per_shard:?}");
        }
    }
}
