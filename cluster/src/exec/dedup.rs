//! The event ids a task has seen within its dedup horizon: the ids in arrival order with
//! their event times (to forget the old ones), and a hash table of their arrival numbers
//! (one hash per event: the lookup's hash records the id if the event is accepted).

use std::collections::VecDeque;
use std::hash::BuildHasher;

use hashbrown::hash_table::HashTable;
use hashbrown::DefaultHashBuilder;

use eddy_planner::types::Value;

#[derive(Default)]
pub(crate) struct SeenIds {
    /// Each id's arrival number, by the id's hash: 8 bytes a bucket, so the table a new
    /// id probes stays small in cache; the id itself is compared only on a tag match.
    table: HashTable<u64>,
    hasher: DefaultHashBuilder,
    /// The ids in arrival order with their event times; the first arrived as `first`.
    order: VecDeque<(i64, Value)>,
    first: u64,
}

impl SeenIds {
    /// Whether `id` was seen, and its hash (for `record`).
    pub(crate) fn seen(&self, id: &Value) -> (bool, u64) {
        let hash = self.hasher.hash_one(id);
        let (order, first) = (&self.order, self.first);
        let found = self
            .table
            .find(hash, |&n| order[(n - first) as usize].1 == *id)
            .is_some();
        (found, hash)
    }

    /// Remembers `id` (not seen, of hash `hash`) for an event at `ts`.
    pub(crate) fn record(&mut self, hash: u64, ts: i64, id: Value) {
        let n = self.first + self.order.len() as u64;
        self.order.push_back((ts, id));
        let (order, first, hasher) = (&self.order, self.first, &self.hasher);
        self.table.insert_unique(hash, n, |&m| {
            hasher.hash_one(&order[(m - first) as usize].1)
        });
    }

    /// Forgets the ids of events before `horizon`.
    pub(crate) fn forget_before(&mut self, horizon: i64) {
        while let Some((ts, id)) = self.order.front() {
            if *ts >= horizon {
                break;
            }
            let hash = self.hasher.hash_one(id);
            let first = self.first;
            if let Ok(entry) = self.table.find_entry(hash, |&n| n == first) {
                entry.remove();
            }
            self.order.pop_front();
            self.first += 1;
        }
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
}
