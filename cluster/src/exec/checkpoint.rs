//! A task's checkpoint record: what, besides the group states in the store, brings a
//! task back to one point of its log — stream time, sequence, counters, window edges,
//! remembered event ids, the reservoir's mark, and the log offset to replay from.

use eddy_planner::codec::{decode_value, encode_value, Reader};
use eddy_planner::types::Value;

/// A task's counters, kept in its checkpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskStats {
    pub accepted: u64,
    pub late: u64,
    pub duplicates: u64,
}

/// 2: COUNT(*) keeps no state of its own (it reads the group's event count), so group
/// states of version 1 have one slot more per COUNT(*).
/// 3: COUNT(DISTINCT x) reads MIN(x)'s multiset, and the state store has no family of
/// its own for it, so group states of version 2 may have one slot more per COUNT DISTINCT.
const VERSION: u8 = 3;

#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    pub time: Option<i64>,
    pub seq: u64,
    pub stats: TaskStats,
    pub log_end: u64,
    /// (hash of the window's structural key, head, tail, epoch) per window.
    pub windows: Vec<(u64, i64, i64, i64)>,
    /// Remembered event ids with their event times, oldest first.
    pub dedup: Vec<(i64, Value)>,
    /// `Reservoir::checkpoint`'s mark.
    pub reservoir: Vec<u8>,
}

impl Checkpoint {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(64 + self.reservoir.len() + self.dedup.len() * 24);
        b.push(VERSION);
        match self.time {
            Some(t) => {
                b.push(1);
                b.extend_from_slice(&t.to_le_bytes());
            }
            None => b.push(0),
        }
        for n in [
            self.seq,
            self.stats.accepted,
            self.stats.late,
            self.stats.duplicates,
            self.log_end,
        ] {
            b.extend_from_slice(&n.to_le_bytes());
        }
        b.extend_from_slice(&(self.windows.len() as u32).to_le_bytes());
        for (k, h, t, e) in &self.windows {
            b.extend_from_slice(&k.to_le_bytes());
            for n in [h, t, e] {
                b.extend_from_slice(&n.to_le_bytes());
            }
        }
        b.extend_from_slice(&(self.dedup.len() as u64).to_le_bytes());
        for (ts, id) in &self.dedup {
            b.extend_from_slice(&ts.to_le_bytes());
            encode_value(id, &mut b);
        }
        b.extend_from_slice(&self.reservoir);
        b
    }

    pub fn decode(bytes: &[u8]) -> Option<Checkpoint> {
        let mut r = Reader(bytes);
        if r.u8()? != VERSION {
            return None;
        }
        let time = match r.u8()? {
            0 => None,
            _ => Some(r.i64()?),
        };
        let seq = r.u64()?;
        let stats = TaskStats {
            accepted: r.u64()?,
            late: r.u64()?,
            duplicates: r.u64()?,
        };
        let log_end = r.u64()?;
        let n = r.u32()? as usize;
        let mut windows = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            windows.push((r.u64()?, r.i64()?, r.i64()?, r.i64()?));
        }
        let n = r.u64()? as usize;
        let mut dedup = Vec::with_capacity(n.min(1 << 20));
        for _ in 0..n {
            dedup.push((r.i64()?, decode_value(&mut r)?));
        }
        Some(Checkpoint {
            time,
            seq,
            stats,
            log_end,
            windows,
            dedup,
            reservoir: r.0.to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let cp = Checkpoint {
            time: Some(-5),
            seq: 9,
            stats: TaskStats {
                accepted: 7,
                late: 1,
                duplicates: 2,
            },
            log_end: 11,
            windows: vec![(7, 1, 2, 3), (8, i64::MIN, i64::MIN, 0)],
            dedup: vec![(4, Value::Text("a".into())), (5, Value::Int(3))],
            reservoir: vec![1, 2, 3],
        };
        assert_eq!(Checkpoint::decode(&cp.encode()), Some(cp));
    }
}
