//! The event reservoir of one task: events in (event time, arrival sequence) order.
//!
//! Invariants: iteration is always in key order; `insert` accepts out-of-order events
//! (within the stream's lateness) and keeps the order; `expire_through` drops only a
//! prefix. Windows read the reservoir by event-time ranges `(after, upto]`, which is
//! what the head and tail edges of every window need.

use std::collections::VecDeque;
use std::sync::Arc;

/// An event with its position in the reservoir's order.
pub trait Timed {
    /// (event time in microseconds, arrival sequence within the task).
    fn key(&self) -> (i64, u64);
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ReservoirError(pub String);

/// Counters of a reservoir, for SHOW STORAGE and /metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReservoirStats {
    /// Events held (sealed chunks count whole until retention drops the chunk).
    pub events: u64,
    pub chunks: u64,
    pub segments: u64,
    /// Bytes of segment files.
    pub disk_bytes: u64,
    /// Uncompressed Arrow bytes of the sealed chunks.
    pub raw_bytes: u64,
    /// Bytes the sealed chunks take in their files (compression ratio = raw / chunk).
    pub chunk_bytes: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Chunks read ahead by the IO thread.
    pub prefetched: u64,
    pub cache_bytes: u64,
}

/// How a disk-backed reservoir turns events into Arrow batches and back.
pub trait ChunkCodec<E>: Send + Sync {
    /// The id of the schema `encode` writes.
    fn schema_id(&self) -> u32;
    /// Events (in key order) as one batch.
    fn encode(&self, events: &[&E]) -> Result<arrow_array::RecordBatch, String>;
    /// The events of a batch written by `encode` under this or an older schema.
    fn decode(&self, batch: &arrow_array::RecordBatch) -> Result<Vec<E>, String>;
    /// Approximate bytes an event takes in memory (to size chunks and the cache).
    fn size_of(&self, event: &E) -> usize;
}

/// Time-ordered storage of a task's events.
pub trait Reservoir<E: Timed>: Send {
    /// Adds an event; its key must be larger than every key sealed or expired so far.
    fn insert(&mut self, event: E);

    /// Calls `f` for each event with `after < ts <= upto`, in key order.
    fn for_range(
        &mut self,
        after: i64,
        upto: i64,
        f: &mut dyn FnMut(&E),
    ) -> Result<(), ReservoirError>;

    /// Re-derives events' derived tags (never their keys): `f` runs on every event held
    /// decoded in memory, and events read back from disk are decoded with `codec` from
    /// now on.
    fn refresh(&mut self, codec: Option<Arc<dyn ChunkCodec<E>>>, f: &mut dyn FnMut(&mut E));

    /// Promises that no event with `ts <= upto` will be inserted any more, so those
    /// events may move to disk.
    fn seal_through(&mut self, _upto: i64) -> Result<(), ReservoirError> {
        Ok(())
    }

    /// Drops every event with `ts <= upto` from reads; storage is freed in whole chunks.
    fn expire_through(&mut self, upto: i64) -> Result<(), ReservoirError>;

    /// Events held.
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn stats(&self) -> ReservoirStats {
        ReservoirStats {
            events: self.len() as u64,
            ..ReservoirStats::default()
        }
    }

    /// Takes what reopening needs to come back to exactly this content (see
    /// `DiskReservoir::open`). Only the cheap part runs here, on the event path; the
    /// returned `PendingMark` is finished off it, and the checkpoint may commit only
    /// after that succeeded.
    fn checkpoint(&mut self) -> Result<PendingMark, ReservoirError> {
        Err(ReservoirError(
            "this reservoir is kept in memory only".into(),
        ))
    }
}

/// A reservoir checkpoint between the moment it was taken and its mark: the fsyncs it
/// owes, and the encoding of the events that were open (captured as they were, so the
/// reservoir goes on meanwhile).
pub struct PendingMark {
    durable: Durable,
    encode: Box<dyn FnOnce() -> Result<Vec<u8>, ReservoirError> + Send>,
}

impl PendingMark {
    pub(crate) fn new(
        durable: Durable,
        encode: impl FnOnce() -> Result<Vec<u8>, ReservoirError> + Send + 'static,
    ) -> PendingMark {
        PendingMark {
            durable,
            encode: Box::new(encode),
        }
    }

    /// Makes everything the mark names durable, then returns the mark.
    pub fn finish(self) -> Result<Vec<u8>, ReservoirError> {
        self.durable.run()?;
        (self.encode)()
    }
}

/// The fsyncs a reservoir checkpoint still owes (none by default): its segment file's
/// data and its directory. If they fail, the reservoir syncs again at its next checkpoint.
#[derive(Debug, Default)]
pub(crate) struct Durable(pub(crate) Option<Owed>);

#[derive(Debug)]
pub(crate) struct Owed {
    pub file: Option<std::fs::File>,
    pub dir: std::path::PathBuf,
    pub failed: Arc<std::sync::atomic::AtomicBool>,
}

impl Durable {
    fn run(self) -> Result<(), ReservoirError> {
        let Some(o) = self.0 else { return Ok(()) };
        let data = match &o.file {
            Some(f) => f
                .sync_data()
                .map_err(|e| format!("{}: {e}", o.dir.display())),
            None => Ok(()),
        };
        data.and_then(|()| crate::log::sync_dir(&o.dir).map_err(|e| e.to_string()))
            .map_err(|e| {
                o.failed.store(true, std::sync::atomic::Ordering::SeqCst);
                ReservoirError(e)
            })
    }
}

/// The in-memory reservoir: one ordered deque. Appends in order are O(1); an
/// out-of-order insert shifts only the events newer than it (at most the lateness).
pub struct MemReservoir<E> {
    events: VecDeque<E>,
}

impl<E> Default for MemReservoir<E> {
    fn default() -> Self {
        MemReservoir {
            events: VecDeque::new(),
        }
    }
}

impl<E: Timed> MemReservoir<E> {
    /// Calls `f` for each event with `after < ts <= upto`, in key order.
    pub fn scan(&self, after: i64, upto: i64, f: &mut dyn FnMut(&E)) {
        if upto <= after {
            return;
        }
        let start = self.first_after(after);
        for e in self.events.range(start..) {
            if e.key().0 > upto {
                break;
            }
            f(e);
        }
    }

    /// Removes and returns the events with `ts <= upto`.
    pub fn drain_through(&mut self, upto: i64) -> std::collections::vec_deque::Drain<'_, E> {
        let n = self.first_after(upto);
        self.events.drain(..n)
    }

    /// The events in key order.
    pub fn iter(&self) -> impl Iterator<Item = &E> {
        self.events.iter()
    }

    /// Removes and returns the first `n` events.
    pub fn pop_front(&mut self, n: usize) -> Vec<E> {
        self.events.drain(..n.min(self.events.len())).collect()
    }

    /// Index of the first event with `ts > bound`. Window edges sit near the ends of the
    /// deque (the head near the newest events, the tail near the oldest), so the search
    /// gallops in from both ends before falling back to a full binary search.
    fn first_after(&self, bound: i64) -> usize {
        let events = &self.events;
        let n = events.len();
        let after = |i: usize| events[i].key().0 > bound;
        if n == 0 || !after(n - 1) {
            return n;
        }
        if after(0) {
            return 0;
        }
        // Invariant from here: !after(lo) and after(hi).
        let (mut lo, mut hi) = (0, n - 1);
        let mut step = 1;
        while step < n {
            let back = n - 1 - step.min(n - 1);
            if !after(back) {
                lo = lo.max(back);
                break;
            }
            hi = back;
            let front = step.min(n - 1);
            if after(front) {
                hi = hi.min(front);
                break;
            }
            lo = front;
            step *= 2;
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if after(mid) {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        hi
    }
}

impl<E: Timed + Send> Reservoir<E> for MemReservoir<E> {
    fn insert(&mut self, event: E) {
        let key = event.key();
        match self.events.back() {
            Some(last) if last.key() > key => {
                let at = self.events.partition_point(|e| e.key() < key);
                self.events.insert(at, event);
            }
            _ => self.events.push_back(event),
        }
    }

    fn for_range(
        &mut self,
        after: i64,
        upto: i64,
        f: &mut dyn FnMut(&E),
    ) -> Result<(), ReservoirError> {
        self.scan(after, upto, f);
        Ok(())
    }

    fn refresh(&mut self, _codec: Option<Arc<dyn ChunkCodec<E>>>, f: &mut dyn FnMut(&mut E)) {
        for e in self.events.iter_mut() {
            f(e);
        }
    }

    fn expire_through(&mut self, upto: i64) -> Result<(), ReservoirError> {
        self.drain_through(upto);
        Ok(())
    }

    fn len(&self) -> usize {
        self.events.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq)]
    struct Ev(i64, u64);

    impl Timed for Ev {
        fn key(&self) -> (i64, u64) {
            (self.0, self.1)
        }
    }

    fn collect(r: &MemReservoir<Ev>, after: i64, upto: i64) -> Vec<(i64, u64)> {
        let mut out = Vec::new();
        r.scan(after, upto, &mut |e| out.push(e.key()));
        out
    }

    #[test]
    fn keeps_key_order_with_out_of_order_inserts() {
        let mut r = MemReservoir::default();
        for (i, ts) in [10, 20, 15, 20, 5].iter().enumerate() {
            r.insert(Ev(*ts, i as u64));
        }
        assert_eq!(
            collect(&r, i64::MIN, i64::MAX),
            vec![(5, 4), (10, 0), (15, 2), (20, 1), (20, 3)]
        );
        assert_eq!(collect(&r, 10, 20), vec![(15, 2), (20, 1), (20, 3)]);
        assert_eq!(collect(&r, 20, 10), vec![]);
        assert_eq!(r.drain_through(10).count(), 2);
        assert_eq!(r.len(), 3);
    }

    /// Model-based check against a sorted Vec under random inserts and expiries.
    #[test]
    fn matches_a_sorted_model() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut r = MemReservoir::default();
        let mut model: Vec<Ev> = Vec::new();
        let mut horizon = i64::MIN;
        for seq in 0..5000u64 {
            let ts = (seq as i64) - (next() % 50) as i64;
            if ts > horizon {
                r.insert(Ev(ts, seq));
                model.push(Ev(ts, seq));
                model.sort_by_key(|e| e.key());
            }
            if next() % 100 == 0 {
                horizon = seq as i64 - 200;
                r.expire_through(horizon).unwrap();
                model.retain(|e| e.0 > horizon);
            }
            let a = (next() % 6000) as i64 - 500;
            let b = a + (next() % 300) as i64;
            let want: Vec<_> = model
                .iter()
                .filter(|e| e.0 > a && e.0 <= b)
                .map(|e| e.key())
                .collect();
            assert_eq!(collect(&r, a, b), want);
        }
    }
}
