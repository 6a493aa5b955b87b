//! The event reservoir of one task: events in (event time, arrival sequence) order.
//!
//! Invariants: iteration is always in key order; `insert` accepts out-of-order events
//! (within the stream's lateness) and keeps the order; `expire_through` drops only a
//! prefix. Windows read the reservoir by event-time ranges `(after, upto]`, which is
//! what the head and tail edges of every window need.

use std::collections::VecDeque;

/// An event with its position in the reservoir's order.
pub trait Timed {
    /// (event time in microseconds, arrival sequence within the task).
    fn key(&self) -> (i64, u64);
}

/// Time-ordered storage of a task's events.
pub trait Reservoir<E: Timed>: Send {
    /// Adds an event; its key must be larger than every key expired so far.
    fn insert(&mut self, event: E);

    /// Calls `f` for each event with `after < ts <= upto`, in key order.
    fn for_range(&self, after: i64, upto: i64, f: &mut dyn FnMut(&E));

    /// Calls `f` for every stored event, in key order, allowing it to update the event's
    /// derived tags (never its key).
    fn for_each_mut(&mut self, f: &mut dyn FnMut(&mut E));

    /// Drops every event with `ts <= upto`; returns how many were dropped.
    fn expire_through(&mut self, upto: i64) -> usize;

    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
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

    fn for_range(&self, after: i64, upto: i64, f: &mut dyn FnMut(&E)) {
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

    fn for_each_mut(&mut self, f: &mut dyn FnMut(&mut E)) {
        for e in self.events.iter_mut() {
            f(e);
        }
    }

    fn expire_through(&mut self, upto: i64) -> usize {
        let n = self.first_after(upto);
        self.events.drain(..n);
        n
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
        r.for_range(after, upto, &mut |e| out.push(e.key()));
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
        assert_eq!(r.expire_through(10), 2);
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
                r.expire_through(horizon);
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
