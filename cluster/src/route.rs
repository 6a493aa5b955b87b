//! Task routing: which task of a partitioner an event goes to, exactly as Kafka's
//! default partitioner would choose the partition for a record keyed the same way.
//!
//! Invariant: `partition_for` equals `toPositive(murmur2(key)) % partitions` of the Java
//! client, with the key the UTF-8 text of the value and NULL as the empty key.

use eddy_planner::types::Value;

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
}
