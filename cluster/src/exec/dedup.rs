//! The event ids a task has seen within its dedup horizon: the ids in arrival order with
//! their event times (to forget the old ones), and a hash table of their arrival numbers
//! (one hash per event: the lookup's hash records the id if the event is accepted).

use std::collections::VecDeque;
use std::hash::BuildHasher;

use hashbrown::hash_table::HashTable;
use hashbrown::DefaultHashBuilder;

use eddy_planner::prefetch;
use eddy_planner::types::Value;

use crate::exec::split::{ctrl, LineAligned, GROUP_WIDTH};

/// A table entry: the high 32 bits of the id's hash, then the low 32 bits of its arrival
/// number. The table places an entry by a hash spread from its tag, so growing it never
/// reads the ids back, and an id is compared only when its tag matches.
type Entry = u64;

fn tag(hash: u64) -> u32 {
    (hash >> 32) as u32
}

/// The table's hash of an entry with tag `tag`: hashbrown places by the low bits and
/// filters by the top 7, so the 32-bit tag is spread over all 64.
fn spread(tag: u32) -> u64 {
    (tag as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

fn entry(tag: u32, n: u64) -> Entry {
    (tag as u64) << 32 | (n & 0xFFFF_FFFF)
}

fn tag_of(e: Entry) -> u32 {
    (e >> 32) as u32
}

/// Ids remembered at most; past it the oldest is forgotten (about 170 GB of ids, so
/// memory runs out first).
const IDS_MAX: usize = u32::MAX as usize;

/// How many ids ahead `forget_before` asks for the table's lines.
const FORGET_AHEAD: usize = 8;

#[derive(Default)]
pub(crate) struct SeenIds {
    /// Arrival numbers by tag (`Entry`): 8 bytes a bucket, so the table a new id probes
    /// stays small in cache. Its allocator knows its block (`prefetch`, `split::ctrl`).
    table: HashTable<Entry, LineAligned>,
    hasher: DefaultHashBuilder,
    /// The ids in arrival order with their event times; the first arrived as `first`.
    /// At most `IDS_MAX` are remembered, so an entry's low 32 bits name one.
    order: VecDeque<(i64, Value)>,
    first: u64,
}

impl SeenIds {
    /// The position in `order` of the entry's id.
    fn index(&self, e: Entry) -> usize {
        (e as u32).wrapping_sub(self.first as u32) as usize
    }

    /// Asks for the lines `seen` and `record` of `id` will read (the table's control
    /// bytes and bucket where its probe starts), without waiting for them: a batch asks
    /// a few events ahead, so an event's two misses overlap with earlier events' work.
    /// The addresses follow hashbrown's layout (`ctrl`); a prefetch is only a hint, so
    /// were the layout to change, this would cost time and never a result.
    pub(crate) fn prefetch(&self, id: &Value) {
        let Some(ctrl) = ctrl(&self.table) else {
            return;
        };
        let at = spread(tag(self.hasher.hash_one(id))) as usize & (self.table.num_buckets() - 1);
        prefetch::address(ctrl + at, GROUP_WIDTH);
        prefetch::address(ctrl - (at + 1) * size_of::<Entry>(), size_of::<Entry>());
    }

    /// Whether `id` was seen, and its hash (for `record`).
    pub(crate) fn seen(&self, id: &Value) -> (bool, u64) {
        let hash = self.hasher.hash_one(id);
        let t = tag(hash);
        let found = self
            .table
            .find(spread(t), |&e| {
                tag_of(e) == t && self.order[self.index(e)].1 == *id
            })
            .is_some();
        (found, hash)
    }

    /// Remembers `id` (not seen, of hash `hash`) for an event at `ts`.
    pub(crate) fn record(&mut self, hash: u64, ts: i64, id: Value) {
        if self.order.len() >= IDS_MAX {
            self.forget_oldest();
        }
        let n = self.first + self.order.len() as u64;
        self.order.push_back((ts, id));
        let t = tag(hash);
        self.table
            .insert_unique(spread(t), entry(t, n), |&e| spread(tag_of(e)));
    }

    /// Forgets the ids of events before `horizon`. A sweep forgets thousands at once,
    /// each a table line that misses the cache: the line of the id `FORGET_AHEAD` places
    /// on is asked for first, so the misses overlap.
    pub(crate) fn forget_before(&mut self, horizon: i64) {
        while self.order.front().is_some_and(|(ts, _)| *ts < horizon) {
            if let Some((ts, id)) = self.order.get(FORGET_AHEAD) {
                if *ts < horizon {
                    self.prefetch(id);
                }
            }
            self.forget_oldest();
        }
    }

    fn forget_oldest(&mut self) {
        let Some((_, id)) = self.order.pop_front() else {
            return;
        };
        let t = tag(self.hasher.hash_one(&id));
        let oldest = entry(t, self.first);
        if let Ok(e) = self.table.find_entry(spread(t), |&e| e == oldest) {
            e.remove();
        }
        self.first += 1;
    }

    /// Every remembered (event time, id), oldest first: for a checkpoint.
    pub(crate) fn entries(&self) -> impl Iterator<Item = &(i64, Value)> {
        self.order.iter()
    }

    /// Remembers an id from a checkpoint (in `entries` order).
    pub(crate) fn restore(&mut self, ts: i64, id: Value) {
        let (seen, hash) = self.seen(&id);
        if !seen {
            self.record(hash, ts, id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_seen_until_forgotten() {
        let mut ids = SeenIds::default();
        for i in 0..1000 {
            let id = Value::Int(i);
            let (seen, hash) = ids.seen(&id);
            assert!(!seen);
            ids.record(hash, i, id);
        }
        let text = Value::Text("a".into());
        let (_, hash) = ids.seen(&text);
        ids.record(hash, 1000, text.clone());
        assert!(ids.seen(&Value::Int(5)).0 && ids.seen(&text).0);
        ids.forget_before(500);
        assert!(!ids.seen(&Value::Int(499)).0);
        assert!(ids.seen(&Value::Int(500)).0);
        assert_eq!(ids.entries().count(), 501);
        // A forgotten id can come back, and is forgotten again in its new turn.
        let (_, hash) = ids.seen(&Value::Int(499));
        ids.record(hash, 2000, Value::Int(499));
        assert!(ids.seen(&Value::Int(499)).0);
        ids.forget_before(1500);
        assert!(
            ids.seen(&Value::Int(499)).0 && !ids.seen(&text).0 && !ids.seen(&Value::Int(999)).0
        );
        ids.forget_before(2001);
        assert!(!ids.seen(&Value::Int(499)).0);
        assert_eq!(ids.entries().count(), 0);
        let (_, hash) = ids.seen(&text);
        ids.record(hash, 2001, text.clone());
        let mut copy = SeenIds::default();
        for (ts, id) in ids.entries() {
            copy.restore(*ts, id.clone());
        }
        assert!(copy.seen(&text).0 && !copy.seen(&Value::Int(3)).0);
    }

    /// `prefetch` asks for the lines where hashbrown keeps them: each entry sits
    /// `i + 1` buckets before the control bytes, `i` its bucket.
    #[test]
    fn a_prefetch_addresses_the_table_as_hashbrown_lays_it_out() {
        let mut ids = SeenIds::default();
        for i in 0..20_000 {
            let (_, hash) = ids.seen(&Value::Int(i));
            ids.record(hash, i, Value::Int(i));
            let t = tag(hash);
            let n = ids.first + i as u64;
            let bucket = ids
                .table
                .find_bucket_index(spread(t), |&e| e == entry(t, n))
                .expect("recorded");
            let ctrl = ctrl(&ids.table).expect("allocated");
            let at = ids.table.get_bucket(bucket).expect("full") as *const Entry as usize;
            assert_eq!(at, ctrl - (bucket + 1) * size_of::<Entry>());
        }
    }

    #[test]
    fn arrival_numbers_wrap_past_32_bits() {
        let mut ids = SeenIds {
            first: (1 << 32) - 10,
            ..SeenIds::default()
        };
        for i in 0..100 {
            let (seen, hash) = ids.seen(&Value::Int(i));
            assert!(!seen);
            ids.record(hash, i, Value::Int(i));
        }
        assert!((0..100).all(|i| ids.seen(&Value::Int(i)).0));
        ids.forget_before(50);
        assert!((0..50).all(|i| !ids.seen(&Value::Int(i)).0));
        assert!((50..100).all(|i| ids.seen(&Value::Int(i)).0));
    }
}
