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
    let text = value.to_text().unwrap_or_default();
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
    for p in 0..stream.partitioner_count() {
        let mut per_task: BTreeMap<u32, (Vec<usize>, Vec<Row>)> = BTreeMap::new();
        for (i, row) in rows.iter().enumerate() {
            let partition = match stream.partitioners.get(p) {
                Some(col) => partition_for(&row[*col], stream.partitions),
                None => 0,
            };
            let entry = per_task.entry(partition).or_default();
            entry.0.push(i);
            entry.1.push(row.clone());
        }
        for (partition, (indexes, task_rows)) in per_task {
            let task = TaskId {
                stream: stream.name.clone(),
                partitioner: p,
                partition,
            };
            routed.push((p, task, indexes, task_rows));
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
