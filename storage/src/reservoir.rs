//! The event reservoir of one task: events in (event time, arrival sequence) order.
//!
//! Invariants: iteration is always in key order; `insert` accepts out-of-order events
//! (within the stream's lateness) and keeps the order; `expire_through` drops only a
//! prefix. Windows read the reservoir by event-time ranges `(after, upto]`, which is
//! what the head and tail edges of every window need.

use std::cell::Cell;
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

    /// Up to `n` of the first events with `ts > after`, in key order: the next ones a
    /// window's tail edge at `after` will pass, so the caller can ask for their cache
    /// lines ahead. Only a hint: a reservoir may offer fewer, or none.
    fn upcoming(&mut self, _after: i64, _n: usize) -> &[E] {
        &[]
    }

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
    /// after that succeeded. `previous_committed` says whether the checkpoint before
    /// this one was committed: files the committed one still reads must stay.
    fn checkpoint(&mut self, _previous_committed: bool) -> Result<PendingMark, ReservoirError> {
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

/// Events per block of the in-memory reservoir.
const BLOCK_EVENTS: usize = 4096;

/// The in-memory reservoir: an ordered deque of ordered blocks. Appends in order are
/// O(1) and never move stored events (a block fills, then the next one starts), so no
/// append pays for copying the whole window; an out-of-order insert shifts events
/// within one block only, and so does an expiry that ends inside the oldest block. A
/// block is a plain `Vec`, so a scan walks a slice.
pub struct MemReservoir<E> {
    /// No block is empty; each holds keys above the previous block's.
    blocks: VecDeque<Vec<E>>,
    len: usize,
    /// Events an appended block takes (`BLOCK_EVENTS`; small in tests).
    block_events: usize,
    /// Where recent scans stopped, as (bound, block, index): window edges start each scan
    /// where the last one stopped, so a hint that still holds spares the search.
    hints: [Cell<(i64, usize, usize, u64)>; HINTS],
    next_hint: Cell<usize>,
    /// Counts the changes that move or remove stored events (an append moves none): a
    /// hint taken at the current shape that points at a stored event still holds.
    shape: u64,
}

/// Scan ends remembered: two edges for each of a few windows.
const HINTS: usize = 8;

impl<E> Default for MemReservoir<E> {
    fn default() -> Self {
        MemReservoir {
            blocks: VecDeque::new(),
            len: 0,
            block_events: BLOCK_EVENTS,
            hints: std::array::from_fn(|_| Cell::new((i64::MIN, usize::MAX, 0, 0))),
            next_hint: Cell::new(0),
            shape: 0,
        }
    }
}

impl<E: Timed> MemReservoir<E> {
    /// Calls `f` for each event with `after < ts <= upto`, in key order.
    pub fn scan(&self, after: i64, upto: i64, f: &mut dyn FnMut(&E)) {
        if upto <= after {
            return;
        }
        let (first, start) = self.first_after(after);
        let mut from = start;
        for (b, block) in self
            .blocks
            .range(first..)
            .enumerate()
            .map(|(i, k)| (first + i, k))
        {
            for (j, e) in block.get(from..).unwrap_or_default().iter().enumerate() {
                if e.key().0 > upto {
                    self.hint(upto, b, from + j);
                    return;
                }
                f(e);
            }
            from = 0;
        }
        // Past the newest event: the place the next append goes.
        match self.blocks.back() {
            Some(last) => self.hint(upto, self.blocks.len() - 1, last.len()),
            None => self.hint(upto, 0, 0),
        }
    }

    fn hint(&self, bound: i64, block: usize, index: usize) {
        let at = self.next_hint.get();
        // A place past the newest event is where later appends go: it holds only
        // while nothing is appended, so it is checked each time it is used.
        let holds_event = self.blocks.get(block).is_some_and(|b| index < b.len());
        let shape = if holds_event { self.shape } else { u64::MAX };
        self.hints[at].set((bound, block, index, shape));
        self.next_hint.set((at + 1) % HINTS);
    }

    /// A remembered position for `bound`, if it is still the first event past it: the
    /// event before it is at or below the bound and the one at it above (a hint is only
    /// ever trusted after both checks, so inserts and expiries cannot mislead it).
    fn hinted(&self, bound: i64) -> Option<(usize, usize)> {
        // Newest first: the edge that moved last is the one most likely asked for.
        let newest = self.next_hint.get() + HINTS;
        let (_, mut b, mut i, shape) = (1..=HINTS)
            .map(|k| self.hints[(newest - k) % HINTS].get())
            .find(|h| h.0 == bound)?;
        // Nothing moved since, and the place holds an event: it is the one it was.
        if shape == self.shape && self.blocks.get(b).is_some_and(|block| i < block.len()) {
            return Some((b, i));
        }
        if b < self.blocks.len() && i >= self.blocks[b].len() {
            (b, i) = (b + 1, 0);
        }
        let before = match (i, b) {
            (0, 0) => None,
            (0, _) => self.blocks.get(b - 1)?.last(),
            _ => Some(self.blocks.get(b)?.get(i - 1)?),
        };
        if before.is_some_and(|e| e.key().0 > bound) {
            return None;
        }
        match self.blocks.get(b) {
            Some(block) => (block.get(i)?.key().0 > bound).then_some((b, i)),
            None => (b == self.blocks.len() && i == 0).then_some((b, i)),
        }
    }

    /// Drops the events with `ts <= upto`, calling `each` on each first; returns how many.
    pub fn drain_through(&mut self, upto: i64, mut each: impl FnMut(&E)) -> usize {
        let (b, at) = self.first_after(upto);
        let mut n = 0;
        for block in self.blocks.drain(..b) {
            block.iter().for_each(&mut each);
            n += block.len();
        }
        if let Some(first) = self.blocks.front_mut() {
            first.drain(..at).for_each(|e| each(&e));
            n += at;
            if first.is_empty() {
                self.blocks.pop_front();
            }
        }
        self.len -= n;
        self.shape += 1;
        n
    }

    /// The events in key order.
    pub fn iter(&self) -> impl Iterator<Item = &E> {
        self.blocks.iter().flatten()
    }

    /// Removes and returns the first `n` events.
    pub fn pop_front(&mut self, n: usize) -> Vec<E> {
        let mut out = Vec::with_capacity(n.min(self.len));
        while out.len() < n {
            let Some(first) = self.blocks.front_mut() else {
                break;
            };
            let take = (n - out.len()).min(first.len());
            out.extend(first.drain(..take));
            if first.is_empty() {
                self.blocks.pop_front();
            }
        }
        self.len -= out.len();
        self.shape += 1;
        out
    }

    /// Puts back events `pop_front` took (a chunk that could not be written): they
    /// precede every stored event.
    pub fn push_front(&mut self, events: Vec<E>) {
        if events.is_empty() {
            return;
        }
        self.len += events.len();
        self.shape += 1;
        self.blocks.push_front(events);
    }

    /// The position (block, index in it) of the first event with `ts > bound`; the
    /// block is `blocks.len()` when there is none.
    fn first_after(&self, bound: i64) -> (usize, usize) {
        if let Some(at) = self.hinted(bound) {
            return at;
        }
        let last_at_most = |block: &Vec<E>| block.last().is_some_and(|e| e.key().0 <= bound);
        // Window edges sit near the ends (the head at the newest block, the tail at the
        // oldest), so try those before searching.
        let b = match (self.blocks.front(), self.blocks.back()) {
            (None, _) | (_, None) => return (0, 0),
            (Some(first), _) if !last_at_most(first) => 0,
            (_, Some(last)) if last_at_most(last) => return (self.blocks.len(), 0),
            _ => self.blocks.partition_point(last_at_most),
        };
        let block = &self.blocks[b];
        let at_most = |i: usize| block[i].key().0 <= bound;
        let n = block.len();
        // Gallop in from the end nearest the edge, then search between the last two
        // probes: O(log d) for an edge d events from that end.
        // Answer in lo..=hi; each probe that fails or holds narrows one side.
        let (mut lo, mut hi) = if b + 1 == self.blocks.len() {
            let (mut hi, mut step) = (n, 1);
            loop {
                if step > n {
                    break (0, hi);
                }
                if at_most(n - step) {
                    break (n - step + 1, hi);
                }
                hi = n - step;
                step *= 2;
            }
        } else {
            let (mut lo, mut step) = (0, 1);
            loop {
                if step > n {
                    break (lo, n);
                }
                if !at_most(step - 1) {
                    break (lo, step - 1);
                }
                lo = step;
                step *= 2;
            }
        };
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if at_most(mid) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        (b, lo)
    }
}

impl<E: Timed + Send> Reservoir<E> for MemReservoir<E> {
    /// The events from the first past `after` to the end of its block at most.
    fn upcoming(&mut self, after: i64, n: usize) -> &[E] {
        let (b, i) = self.first_after(after);
        let rest = self
            .blocks
            .get(b)
            .and_then(|block| block.get(i..))
            .unwrap_or_default();
        &rest[..n.min(rest.len())]
    }

    fn insert(&mut self, event: E) {
        let key = event.key();
        self.len += 1;
        match self.blocks.back_mut() {
            Some(last) if last.last().is_some_and(|e| e.key() > key) => {
                let b = self
                    .blocks
                    .partition_point(|block| block.last().is_some_and(|e| e.key() < key));
                let block = &mut self.blocks[b];
                let at = block.partition_point(|e| e.key() < key);
                block.insert(at, event);
                self.shape += 1;
            }
            Some(last) if last.len() < self.block_events => last.push(event),
            _ => {
                let mut block = Vec::with_capacity(self.block_events);
                block.push(event);
                self.blocks.push_back(block);
            }
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
        for e in self.blocks.iter_mut().flatten() {
            f(e);
        }
        self.shape += 1;
    }

    fn expire_through(&mut self, upto: i64) -> Result<(), ReservoirError> {
        self.drain_through(upto, |_| {});
        Ok(())
    }

    fn len(&self) -> usize {
        self.len
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
    fn upcoming_offers_the_first_events_past_a_bound() {
        let upcoming = |r: &mut MemReservoir<Ev>, after, n| {
            r.upcoming(after, n).iter().map(Ev::key).collect::<Vec<_>>()
        };
        let mut r = MemReservoir::default();
        for (i, ts) in [10, 20, 15, 20, 5, 30].iter().enumerate() {
            r.insert(Ev(*ts, i as u64));
        }
        assert_eq!(upcoming(&mut r, 10, 3), vec![(15, 2), (20, 1), (20, 3)]);
        collect(&r, 5, 15);
        assert_eq!(upcoming(&mut r, 15, 5), vec![(20, 1), (20, 3), (30, 5)]);
        assert_eq!(upcoming(&mut r, 30, 2), vec![]);
        // In small blocks, an offer stops at the end of the first event's block.
        let mut r = MemReservoir {
            block_events: 2,
            ..MemReservoir::default()
        };
        for ts in 1..=6 {
            r.insert(Ev(ts * 10, ts as u64));
        }
        assert_eq!(upcoming(&mut r, 10, 3), vec![(20, 2)]);
        assert_eq!(upcoming(&mut r, 20, 3), vec![(30, 3), (40, 4)]);
        assert_eq!(upcoming(&mut r, 25, 1), vec![(30, 3)]);
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
        assert_eq!(r.drain_through(10, |_| {}), 2);
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
        let mut r = MemReservoir {
            block_events: 7,
            ..MemReservoir::default()
        };
        let mut model: Vec<Ev> = Vec::new();
        let mut horizon = i64::MIN;
        // Window edges that scan on from where they stopped (the hinted path): one that
        // runs ahead of the newest events, and one that trails them as a tail edge does,
        // with events expiring behind it.
        let mut edges = [-100, -100];
        for seq in 0..5000u64 {
            // Half the events come in order: appends, which leave hints standing.
            let ts = match next() % 2 {
                0 => seq as i64,
                _ => (seq as i64) - (next() % 50) as i64,
            };
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
            assert_eq!(r.len(), model.len());
            for (k, edge) in edges.iter_mut().enumerate() {
                let step = *edge + (next() % 4) as i64;
                let to = match k {
                    0 => step,
                    _ => step.min(seq as i64 - 100).max(*edge),
                };
                let want: Vec<_> = model
                    .iter()
                    .filter(|e| e.0 > *edge && e.0 <= to)
                    .map(|e| e.key())
                    .collect();
                assert_eq!(collect(&r, *edge, to), want);
                // What leaves next, found where the scan stopped.
                let ahead: Vec<_> = model.iter().filter(|e| e.0 > to).map(|e| e.key()).collect();
                let offered: Vec<_> = r.upcoming(to, 3).iter().map(|e| e.key()).collect();
                assert_eq!(offered, ahead[..offered.len()]);
                assert!(!offered.is_empty() || ahead.is_empty());
                *edge = to;
            }
        }
        let all: Vec<_> = model.iter().map(|e| e.key()).collect();
        assert_eq!(r.iter().map(|e| e.key()).collect::<Vec<_>>(), all);
        let front: Vec<_> = r.pop_front(30).iter().map(|e| e.key()).collect();
        assert_eq!(front, all[..30]);
        assert_eq!(r.len(), all.len() - 30);
    }
}
