//! The events a count window's group holds (`SLIDING (SIZE n EVENTS)`), packed.
//!
//! A group keeps its n newest events itself, however old, so a count window of 100 events
//! over 100 k cards holds up to 10 M rows in its states. Each event is kept as bytes: its
//! event time, its arrival and its row (`codec::encode_value` per value), one after
//! another in one buffer per group. That is about a third of a heap row's size (a shared
//! row, its values and a queue entry), costs no allocation per event, and is already the
//! form a checkpoint writes (`encode`), which copies the buffer whole.
//!
//! Invariants:
//! - `bytes[start..]` holds exactly `len` events, oldest first (by event time, then
//!   arrival), each as `ts: i64, seq: u64, columns: u32`, then that many values;
//! - `newest` is the last event's (time, arrival) whenever `len > 0`;
//! - every value there was written by `encode_value` (or checked by `decode`), so it
//!   decodes.

use smallvec::SmallVec;

use eddy_planner::codec::{decode_value, encode_value, encoded_len, Reader};
use eddy_planner::prefetch;
use eddy_planner::types::Value;

/// Follows a group's states when it holds a count window's events.
const MARK: u8 = 0xB1;

/// Bytes of an event's head: time, arrival, column count.
const HEAD: usize = 8 + 8 + 4;

/// A held event's row, decoded: on the stack up to eight columns.
pub type HeldRow = SmallVec<[Value; 8]>;

#[derive(Clone, Default)]
pub struct Recent {
    bytes: Vec<u8>,
    /// Where the oldest event begins: the bytes before it belong to events that left.
    start: usize,
    len: usize,
    newest: (i64, u64),
}

impl Recent {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Places an event by (time, arrival); under a window of `keep` events, one older than
    /// the `keep` held already displaces nothing and is not placed (returns false).
    pub fn insert(&mut self, ts: i64, seq: u64, row: &[Value], keep: usize) -> bool {
        // Events come mostly in order: the newest goes last, found without a walk.
        let at = if self.len == 0 || (ts, seq) > self.newest {
            self.bytes.len()
        } else {
            let at = self.offset_before(ts, seq);
            if at == self.start && self.len >= keep {
                return false;
            }
            at
        };
        if at == self.bytes.len() {
            // Written in place: the common case costs no buffer of its own.
            self.make_room(HEAD + row.iter().map(encoded_len).sum::<usize>());
            write_event(&mut self.bytes, ts, seq, row);
            self.newest = (ts, seq);
        } else {
            let mut event = Vec::new();
            write_event(&mut event, ts, seq, row);
            self.bytes.splice(at..at, event);
        }
        self.len += 1;
        true
    }

    /// Takes the oldest event out, and gives its row.
    pub fn pop_front(&mut self) -> Option<HeldRow> {
        if self.len == 0 {
            return None;
        }
        let (_, _, row, next) = self.read(self.start);
        self.start = next;
        self.len -= 1;
        if self.len == 0 {
            self.bytes.clear();
            self.start = 0;
        }
        Some(row)
    }

    /// Every held event as (time, arrival, row), oldest first.
    pub fn for_each(&self, f: &mut dyn FnMut(i64, u64, &[Value])) {
        let mut at = self.start;
        for _ in 0..self.len {
            let (ts, seq, row, next) = self.read(at);
            f(ts, seq, &row);
            at = next;
        }
    }

    /// Asks for the lines an entering event reads: the oldest event (which leaves when the
    /// group is full) and the end, where the new one goes.
    pub fn prefetch(&self) {
        prefetch::first_lines(&self.bytes[self.start..], 2 * 64);
        prefetch::address(self.bytes.as_ptr() as usize + self.bytes.len(), 64);
    }

    /// Appends the form a checkpoint keeps: the mark, the count, then the events.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(MARK);
        out.extend_from_slice(&(self.len as u32).to_le_bytes());
        out.extend_from_slice(&self.bytes[self.start..]);
    }

    /// Reads what `encode` wrote, the rest of `r`; `None` if it is not exactly that.
    pub fn decode(r: &mut Reader<'_>) -> Option<Recent> {
        if r.u8()? != MARK {
            return None;
        }
        let len = r.u32()? as usize;
        let bytes = r.0;
        let mut check = Reader(bytes);
        let mut newest = (i64::MIN, 0);
        for _ in 0..len {
            let (ts, seq) = (check.i64()?, check.u64()?);
            if (ts, seq) < newest {
                return None;
            }
            newest = (ts, seq);
            for _ in 0..check.u32()? {
                decode_value(&mut check)?;
            }
        }
        if !check.is_empty() {
            return None;
        }
        r.0 = &[];
        Some(Recent {
            bytes: bytes.to_vec(),
            start: 0,
            len,
            newest,
        })
    }

    /// The event at byte `at`: its time, arrival, row, and where the next one begins.
    fn read(&self, at: usize) -> (i64, u64, HeldRow, usize) {
        let mut r = Reader(&self.bytes[at..]);
        let corrupt = "held events are written by `insert` or checked by `decode`";
        let (ts, seq) = (r.i64().expect(corrupt), r.u64().expect(corrupt));
        let columns = r.u32().expect(corrupt);
        let row = (0..columns)
            .map(|_| decode_value(&mut r).expect(corrupt))
            .collect();
        let next = self.bytes.len() - r.0.len();
        (ts, seq, row, next)
    }

    /// Where an event of (time, arrival) goes: the first held event after it.
    fn offset_before(&self, ts: i64, seq: u64) -> usize {
        let mut at = self.start;
        for _ in 0..self.len {
            let (held_ts, held_seq, _, next) = self.read(at);
            if (held_ts, held_seq) > (ts, seq) {
                return at;
            }
            at = next;
        }
        at
    }

    /// Room for `need` more bytes at the end: the space events left at the front when it
    /// is half the live bytes or more, else half as much again (so an event costs a
    /// bounded share of moves, and a buffer at most half again its events' size).
    fn make_room(&mut self, need: usize) {
        if self.bytes.capacity() - self.bytes.len() >= need {
            return;
        }
        let live = self.bytes.len() - self.start;
        if self.start >= need.max(live / 2) {
            self.bytes.drain(..self.start);
            self.start = 0;
        } else {
            self.bytes.reserve_exact(need.max(live / 2));
        }
    }
}

/// Appends an event as `Recent` keeps it.
fn write_event(out: &mut Vec<u8>, ts: i64, seq: u64, row: &[Value]) {
    out.extend_from_slice(&ts.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&(row.len() as u32).to_le_bytes());
    for v in row {
        encode_value(v, out);
    }
}

impl PartialEq for Recent {
    fn eq(&self, other: &Recent) -> bool {
        self.len == other.len && self.bytes[self.start..] == other.bytes[other.start..]
    }
}

impl std::fmt::Debug for Recent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut list = f.debug_list();
        self.for_each(&mut |ts, seq, row| {
            list.entry(&(ts, seq, row));
        });
        list.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(i: i64) -> Vec<Value> {
        vec![
            Value::Int(i),
            Value::Text(format!("a text of more than fifteen bytes, {i}").into()),
            Value::Null,
        ]
    }

    fn events(r: &Recent) -> Vec<(i64, u64, Vec<Value>)> {
        let mut out = Vec::new();
        r.for_each(&mut |ts, seq, row| out.push((ts, seq, row.to_vec())));
        out
    }

    /// In order, out of order, full, and after many leave (the buffer compacts): the
    /// events stay sorted by (time, arrival), the oldest leaves first with its row, and
    /// both encodings give the same events back.
    #[test]
    fn events_keep_their_order_through_leaving_and_encoding() {
        let mut r = Recent::default();
        let mut model: Vec<(i64, u64, Vec<Value>)> = Vec::new();
        let keep = 5;
        for i in 0..1_000_i64 {
            // Every fourth event is late by up to three.
            let ts = if i % 4 == 3 { i - 3 } else { i };
            let seq = i as u64;
            let placed = r.insert(ts, seq, &row(i), keep);
            let at = model.partition_point(|(t, s, _)| (*t, *s) < (ts, seq));
            assert_eq!(placed, !(at == 0 && model.len() >= keep), "event {i}");
            if placed {
                model.insert(at, (ts, seq, row(i)));
            }
            if model.len() > keep {
                let (_, _, gone) = model.remove(0);
                assert_eq!(r.pop_front().as_deref(), Some(&gone[..]), "event {i}");
            }
            assert_eq!(events(&r), model, "event {i}");
            assert!(r.bytes.capacity() <= 4096, "the buffer stays bounded");
        }
        let mut out = Vec::new();
        r.encode(&mut out);
        let decoded = Recent::decode(&mut Reader(&out)).unwrap();
        assert_eq!(decoded, r);
        assert_eq!(events(&decoded), model);
        // Not one byte more or less, and not out of order.
        out.push(0);
        assert_eq!(Recent::decode(&mut Reader(&out)), None);
        out.truncate(out.len() - 2);
        assert_eq!(Recent::decode(&mut Reader(&out)), None);
        let mut unsorted = vec![MARK, 2, 0, 0, 0];
        for (ts, seq) in [(2_i64, 0_u64), (1, 1)] {
            unsorted.extend_from_slice(&ts.to_le_bytes());
            unsorted.extend_from_slice(&seq.to_le_bytes());
            unsorted.extend_from_slice(&0_u32.to_le_bytes());
        }
        assert_eq!(Recent::decode(&mut Reader(&unsorted)), None);
        while r.pop_front().is_some() {}
        assert!(r.is_empty());
        assert_eq!(r.bytes.len(), 0, "an empty group keeps no bytes");
    }
}
