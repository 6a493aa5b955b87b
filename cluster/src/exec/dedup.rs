//! The event ids a task has seen within its dedup horizon: a hash table of ids (one hash
//! per event: the lookup's hash records the id if the event is accepted) and the ids in
//! arrival order with their event times, to forget the old ones.

use std::collections::VecDeque;
use std::hash::BuildHasher;

use hashbrown::hash_table::HashTable;
use hashbrown::DefaultHashBuilder;

use eddy_planner::types::Value;

#[derive(Default)]
pub(crate) struct SeenIds {
    table: HashTable<Value>,
    hasher: DefaultHashBuilder,
    order: VecDeque<(i64, Value)>,
}

impl SeenIds {
    /// Whether `id` was seen, and its hash (for `record`).
    pub(crate) fn seen(&self, id: &Value) -> (bool, u64) {
        let hash = self.hasher.hash_one(id);
        (self.table.find(hash, |v| v == id).is_some(), hash)
    }

    /// Remembers `id` (not seen, of hash `hash`) for an event at `ts`.
    pub(crate) fn record(&mut self, hash: u64, ts: i64, id: Value) {
        let hasher = &self.hasher;
        self.table
            .insert_unique(hash, id.clone(), |v| hasher.hash_one(v));
        self.order.push_back((ts, id));
    }

    /// Forgets the ids of events before `horizon`.
    pub(crate) fn forget_before(&mut self, horizon: i64) {
        while let Some((ts, _)) = self.order.front() {
            if *ts >= horizon {
                break;
            }
            let (_, id) = self.order.pop_front().expect("front exists");
            let hash = self.hasher.hash_one(&id);
            if let Ok(entry) = self.table.find_entry(hash, |v| *v == id) {
                entry.remove();
            }
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
        let mut copy = SeenIds::default();
        for (ts, id) in ids.entries() {
            copy.restore(*ts, id.clone());
        }
        assert!(copy.seen(&text).0 && !copy.seen(&Value::Int(3)).0);
    }
}
