//! The events a count window's group holds (`SLIDING (SIZE n EVENTS)`), packed.
//!
//! A group keeps its n newest events itself, however old, so a count window of 100 events
//! over 100 k cards holds up to 10 M rows in its states. The events are bytes in one
//! buffer per group, with no allocation per event. The buffer begins with a **base**
//! event written whole (time, arrival, then each value as `codec::encode_value` writes
//! it); each held event is then written against the base:
//! - its time and arrival as varints of their difference from the base's;
//! - its column count as a varint;
//! - each value as one of: `SAME` (the base's value in that column, bit for bit), `TIME`
//!   (a timestamp equal to the event's own time), `INT_DELTA` (an integer as a varint of
//!   its difference from the base's integer), or else whole.
//!
//! A group's key columns are the same in every event and its event-time column is the
//! event's time, so those cost a byte each; an id that rises costs its difference. On
//! `bench/memory.sh`'s rows (id, time, card, amount) an event takes about 26 bytes
//! instead of 62. An event's bytes depend only on the base, never on its neighbours, so
//! a late event is placed with one splice and the oldest leaves by moving `start`. When
//! the bytes of events that left are at least half the live ones and the buffer is
//! full, `make_room` drops them, moving the held events down to the base; once the base
//! is eight spans of the held events old, it re-bases them on the oldest instead, so the
//! differences stay about those of the events held.
//!
//! A checkpoint (`encode`) copies the base and the held events whole: mark `MARK`, from
//! format `format::HELD_BASE`. For a reader of an older format it writes each event
//! whole, as those builds did (mark `MARK_WHOLE`); `decode` reads both.
//!
//! Invariants:
//! - `len == 0` exactly when `bytes` is empty;
//! - otherwise `bytes[..base]` is the base, written whole, and `bytes[start..]` holds
//!   exactly `len` events against it, oldest first (by event time, then arrival); the
//!   bytes between belong to events that left;
//! - `newest` is the last event's (time, arrival) whenever `len > 0`;
//! - every event there was written by `write_against` (or checked by `decode`), so it
//!   reads back: a `SAME` names a column the base has, an `INT_DELTA` one where the base
//!   holds an integer.

use smallvec::SmallVec;

use eddy_planner::codec::{
    decode_value, encode_value, is_encoding_of, put_varint, skip_value, unzigzag, zigzag, Reader,
};
use eddy_planner::prefetch;
use eddy_planner::types::Value;

use crate::format;

/// Follows a group's states when it holds a count window's events, against a base.
const MARK: u8 = 0xB2;
/// … each event written whole (formats before `format::HELD_BASE`).
const MARK_WHOLE: u8 = 0xB1;

/// A value equal to the base's in its column. The codes are above every tag
/// `encode_value` writes, so any other byte begins a value written whole.
const SAME: u8 = 0xF0;
/// A timestamp equal to the event's own time.
const TIME: u8 = 0xF1;
/// An integer, as a varint of its difference from the base's.
const INT_DELTA: u8 = 0xF2;

thread_local! {
    /// An event's bytes between writing them and placing them.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

const CORRUPT: &str = "held events are written by `insert` or checked by `decode`";

/// A held event's row, decoded: on the stack up to eight columns.
pub type HeldRow = SmallVec<[Value; 8]>;

#[derive(Clone, Default)]
pub struct Recent {
    bytes: Vec<u8>,
    /// Where the base ends.
    base: usize,
    /// Where the oldest held event begins.
    start: usize,
    len: usize,
    newest: (i64, u64),
}

/// Where a whole event's values begin: after its time, arrival and column count.
const WHOLE_HEAD: usize = 8 + 8 + 4;

/// The base event, read: its time, arrival and where each of its values ends in the
/// buffer it begins (offsets, so the buffer can change while it is held).
struct Base {
    ts: i64,
    seq: u64,
    ends: SmallVec<[u32; 8]>,
}

/// What `Recent::push` did with an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pushed {
    /// It was older than all of a full group's events: not placed.
    Refused,
    /// Placed.
    Placed,
    /// Placed, and the oldest event left to make room: its row is in `leaving`.
    Displaced,
}

impl Base {
    /// Reads an event written whole (`write_whole`) at the start of `bytes`.
    fn read(bytes: &[u8]) -> Option<Base> {
        let mut r = Reader(bytes);
        let (ts, seq) = (r.i64()?, r.u64()?);
        let columns = r.u32()?;
        let mut ends = SmallVec::new();
        for _ in 0..columns {
            skip_value(&mut r)?;
            ends.push(u32::try_from(bytes.len() - r.0.len()).ok()?);
        }
        Some(Base { ts, seq, ends })
    }

    /// How many bytes the base takes.
    fn len(&self) -> usize {
        self.ends.last().map_or(WHOLE_HEAD, |&end| end as usize)
    }

    /// The bytes of the base's value in `column`, in `bytes` (where it was read).
    fn value<'b>(&self, bytes: &'b [u8], column: usize) -> Option<&'b [u8]> {
        let end = *self.ends.get(column)? as usize;
        let begin = match column {
            0 => WHOLE_HEAD,
            _ => self.ends[column - 1] as usize,
        };
        Some(&bytes[begin..end])
    }

    /// The base's integer in `column`, if it holds one.
    fn int(&self, bytes: &[u8], column: usize) -> Option<i64> {
        match decode_value(&mut Reader(self.value(bytes, column)?)) {
            Some(Value::Int(i)) => Some(i),
            _ => None,
        }
    }

    /// Appends an event against this base (read from `bytes`).
    fn write_against(&self, bytes: &[u8], out: &mut Vec<u8>, ts: i64, seq: u64, row: &[Value]) {
        put_varint(zigzag(ts.wrapping_sub(self.ts)), out);
        put_varint(zigzag((seq as i64).wrapping_sub(self.seq as i64)), out);
        put_varint(row.len() as u64, out);
        for (i, v) in row.iter().enumerate() {
            match v {
                Value::Timestamp(t) if *t == ts => out.push(TIME),
                _ if self.value(bytes, i).is_some_and(|b| is_encoding_of(v, b)) => out.push(SAME),
                Value::Int(n) => match self.int(bytes, i) {
                    Some(b) => {
                        out.push(INT_DELTA);
                        put_varint(zigzag(n.wrapping_sub(b)), out);
                    }
                    None => encode_value(v, out),
                },
                _ => encode_value(v, out),
            }
        }
    }

    /// Reads an event written against this base (read from `bytes`): its time and
    /// arrival, and its row into `row` if asked (appended); `None` if the bytes are not
    /// one such event.
    fn read_event(
        &self,
        bytes: &[u8],
        r: &mut Reader<'_>,
        mut row: Option<&mut HeldRow>,
    ) -> Option<(i64, u64)> {
        let ts = self.ts.wrapping_add(unzigzag(r.varint()?));
        let seq = (self.seq as i64).wrapping_add(unzigzag(r.varint()?)) as u64;
        let columns = r.varint()?;
        for i in 0..columns as usize {
            let value = match *r.0.first()? {
                SAME => {
                    r.u8()?;
                    let b = self.value(bytes, i)?;
                    if row.is_none() {
                        continue;
                    }
                    decode_value(&mut Reader(b))?
                }
                TIME => {
                    r.u8()?;
                    Value::Timestamp(ts)
                }
                INT_DELTA => {
                    r.u8()?;
                    let d = unzigzag(r.varint()?);
                    Value::Int(self.int(bytes, i)?.wrapping_add(d))
                }
                _ if row.is_some() => decode_value(r)?,
                _ => {
                    skip_value(r)?;
                    continue;
                }
            };
            if let Some(row) = row.as_deref_mut() {
                row.push(value);
            }
        }
        Some((ts, seq))
    }
}

impl Recent {
    /// Places an event by (time, arrival) among at most `keep`: when `keep` are held
    /// already, the oldest leaves first (its row into `leaving`, cleared first), or the
    /// event itself is refused if it is older than all of them. The base is read once.
    pub fn push(
        &mut self,
        ts: i64,
        seq: u64,
        row: &[Value],
        keep: usize,
        leaving: &mut HeldRow,
    ) -> Pushed {
        // A late event's place, counted from the oldest (which `make_room` may move).
        let mut late = None;
        let mut pushed = Pushed::Placed;
        let mut base = None;
        if self.len > 0 {
            let b = self.base();
            // Events come mostly in order: the newest goes last, found without a walk.
            if (ts, seq) < self.newest {
                late = Some(self.offset_before(&b, ts, seq) - self.start);
            }
            if self.len >= keep {
                if late == Some(0) {
                    return Pushed::Refused;
                }
                // The event is newer than the oldest, which leaves before it goes in.
                leaving.clear();
                let mut r = Reader(&self.bytes[self.start..]);
                b.read_event(&self.bytes, &mut r, Some(leaving))
                    .expect(CORRUPT);
                let gone = self.bytes.len() - r.0.len() - self.start;
                self.start += gone;
                self.len -= 1;
                late = late.map(|from_start| from_start - gone);
                pushed = Pushed::Displaced;
            }
            base = Some(b);
        }
        if self.len == 0 {
            // The first event is its own base.
            self.bytes.clear();
            write_whole(&mut self.bytes, ts, seq, row);
            self.base = self.bytes.len();
            self.start = self.base;
            base = None;
            late = None;
        }
        let base = base.unwrap_or_else(|| self.base());
        SCRATCH.with_borrow_mut(|event| {
            event.clear();
            base.write_against(&self.bytes, event, ts, seq, row);
            let rebased = self.make_room(event.len());
            if rebased {
                // The event is written against the new base, and the others' sizes changed.
                event.clear();
                self.base().write_against(&self.bytes, event, ts, seq, row);
            }
            if let Some(from_start) = late {
                let at = if rebased {
                    self.offset_before(&self.base(), ts, seq)
                } else {
                    self.start + from_start
                };
                self.bytes.splice(at..at, event.iter().copied());
            } else {
                self.bytes.extend_from_slice(event);
                self.newest = (ts, seq);
            }
        });
        self.len += 1;
        pushed
    }

    /// Every held event as (time, arrival, row), oldest first.
    pub fn for_each(&self, f: &mut dyn FnMut(i64, u64, &[Value])) {
        if self.len == 0 {
            return;
        }
        let base = self.base();
        let mut r = Reader(&self.bytes[self.start..]);
        let mut row = HeldRow::new();
        for _ in 0..self.len {
            row.clear();
            let (ts, seq) = base
                .read_event(&self.bytes, &mut r, Some(&mut row))
                .expect(CORRUPT);
            f(ts, seq, &row);
        }
    }

    /// Asks for the lines an entering event reads: the base, the oldest event (which
    /// leaves when the group is full) and the end, where the new one goes.
    pub fn prefetch(&self) {
        prefetch::first_lines(&self.bytes[..self.base], 64);
        prefetch::first_lines(&self.bytes[self.start..], 64);
        prefetch::address(self.bytes.as_ptr() as usize + self.bytes.len(), 64);
    }

    /// Appends the form a checkpoint keeps, in the format this node writes
    /// (`format::writes`): the mark, the count, then the base and the events against it;
    /// or, for an older format, the mark, the count and each event whole.
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.encode_in(format::writes(), out);
    }

    fn encode_in(&self, format: u32, out: &mut Vec<u8>) {
        if format < format::HELD_BASE {
            out.push(MARK_WHOLE);
            out.extend_from_slice(&(self.len as u32).to_le_bytes());
            self.for_each(&mut |ts, seq, row| write_whole(out, ts, seq, row));
            return;
        }
        out.push(MARK);
        out.extend_from_slice(&(self.len as u32).to_le_bytes());
        out.extend_from_slice(&(self.base as u32).to_le_bytes());
        out.extend_from_slice(&self.bytes[..self.base]);
        out.extend_from_slice(&self.bytes[self.start..]);
    }

    /// Reads what `encode` wrote, the rest of `r`, in either form; `None` if it is not
    /// exactly that.
    pub fn decode(r: &mut Reader<'_>) -> Option<Recent> {
        let recent = match r.u8()? {
            MARK => {
                let len = r.u32()? as usize;
                let base = r.u32()? as usize;
                let bytes = r.0;
                if (len == 0) != bytes.is_empty() || (len == 0 && base != 0) || bytes.len() < base {
                    return None;
                }
                let mut check = Reader(&bytes[base..]);
                let mut newest = (i64::MIN, 0);
                if len > 0 {
                    let b = Base::read(bytes)?;
                    if b.len() != base {
                        return None;
                    }
                    for _ in 0..len {
                        let (ts, seq) = b.read_event(bytes, &mut check, None)?;
                        if (ts, seq) < newest {
                            return None;
                        }
                        newest = (ts, seq);
                    }
                }
                if !check.is_empty() {
                    return None;
                }
                Recent {
                    bytes: bytes.to_vec(),
                    base,
                    start: base,
                    len,
                    newest,
                }
            }
            MARK_WHOLE => {
                let len = r.u32()? as usize;
                let mut rest = r.0;
                let mut recent = Recent::default();
                let mut row = HeldRow::new();
                for _ in 0..len {
                    let b = Base::read(rest)?;
                    if recent.len > 0 && (b.ts, b.seq) < recent.newest {
                        return None;
                    }
                    row.clear();
                    for i in 0..b.ends.len() {
                        row.push(decode_value(&mut Reader(b.value(rest, i)?))?);
                    }
                    recent.push(b.ts, b.seq, &row, usize::MAX, &mut HeldRow::new());
                    rest = &rest[b.len()..];
                }
                if !rest.is_empty() {
                    return None;
                }
                recent
            }
            _ => return None,
        };
        r.0 = &[];
        Some(recent)
    }

    fn base(&self) -> Base {
        Base::read(&self.bytes[..self.base]).expect(CORRUPT)
    }

    /// Where an event of (time, arrival) goes: the first held event after it.
    fn offset_before(&self, base: &Base, ts: i64, seq: u64) -> usize {
        let mut r = Reader(&self.bytes[self.start..]);
        for _ in 0..self.len {
            let at = self.bytes.len() - r.0.len();
            let (held_ts, held_seq) = base.read_event(&self.bytes, &mut r, None).expect(CORRUPT);
            if (held_ts, held_seq) > (ts, seq) {
                return at;
            }
        }
        self.bytes.len()
    }

    /// Whether the base is far from the held events: older than the newest by more than
    /// eight times their span, in time or in arrival. Differences from it then cost a byte
    /// or more each that a nearer base would save.
    fn base_is_stale(&self, base: &Base) -> bool {
        let mut r = Reader(&self.bytes[self.start..]);
        let (ts, seq) = base.read_event(&self.bytes, &mut r, None).expect(CORRUPT);
        let far =
            |base: i128, oldest: i128, newest: i128| newest - base > 8 * (newest - oldest).max(1);
        far(base.ts.into(), ts.into(), self.newest.0.into())
            || far(base.seq.into(), seq.into(), self.newest.1.into())
    }

    /// Room for `need` more bytes at the end. When the bytes of events that left are half
    /// the live bytes or more, they go: the held events move down to the base, or, if the
    /// base is stale, are re-based on the oldest (returns true: what was written against
    /// the old base must be written again), about once in eight spans of the window. Else
    /// the buffer grows by an eighth: a group still filling keeps little room spare (most
    /// such steps stay within the allocator's block), and a full one reaches the half it
    /// needs to slide in a few steps, once. So an event costs a bounded share of moves
    /// and re-encodings, and a buffer holds at most half again its events' size.
    fn make_room(&mut self, need: usize) -> bool {
        if self.bytes.capacity() - self.bytes.len() >= need {
            return false;
        }
        let live = self.bytes.len() - self.start;
        if self.start - self.base < need.max(live / 2) {
            self.bytes.reserve_exact(need.max(live / 8));
            return false;
        }
        let old = self.base();
        if !self.base_is_stale(&old) {
            self.bytes.drain(self.base..self.start);
            self.start = self.base;
            return false;
        }
        let held = &self.bytes[self.start..];
        let mut row = HeldRow::new();
        // The oldest, whole, is the new base; then every held event against it.
        let (ts, seq) = old
            .read_event(&self.bytes, &mut Reader(held), Some(&mut row))
            .expect(CORRUPT);
        let mut head = Vec::with_capacity(64);
        write_whole(&mut head, ts, seq, &row);
        let new = Base::read(&head).expect("just written");
        let mut rebased = Vec::with_capacity(self.bytes.capacity());
        rebased.extend_from_slice(&head);
        let mut r = Reader(held);
        for _ in 0..self.len {
            row.clear();
            let (ts, seq) = old
                .read_event(&self.bytes, &mut r, Some(&mut row))
                .expect(CORRUPT);
            new.write_against(&head, &mut rebased, ts, seq, &row);
        }
        self.base = head.len();
        self.start = self.base;
        self.bytes = rebased;
        if self.bytes.capacity() - self.bytes.len() < need {
            self.bytes.reserve_exact(need);
        }
        true
    }
}

/// Appends an event whole: time, arrival, column count, then each value.
fn write_whole(out: &mut Vec<u8>, ts: i64, seq: u64, row: &[Value]) {
    out.extend_from_slice(&ts.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&(row.len() as u32).to_le_bytes());
    for v in row {
        encode_value(v, out);
    }
}

impl PartialEq for Recent {
    /// The same events, however they are written.
    fn eq(&self, other: &Recent) -> bool {
        let mut mine = Vec::new();
        self.encode_in(format::HELD_BASE - 1, &mut mine);
        let mut theirs = Vec::new();
        other.encode_in(format::HELD_BASE - 1, &mut theirs);
        mine == theirs
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

    /// Both encodings of `r` give its events back.
    fn round_trips(r: &Recent, model: &[(i64, u64, Vec<Value>)]) {
        for format in [format::HELD_BASE - 1, format::HELD_BASE] {
            let mut out = Vec::new();
            r.encode_in(format, &mut out);
            let decoded = Recent::decode(&mut Reader(&out)).expect("decodes");
            assert_eq!(&decoded, r, "format {format}");
            assert_eq!(events(&decoded), model, "format {format}");
            // Not one byte more or less.
            out.push(0);
            assert_eq!(Recent::decode(&mut Reader(&out)), None, "format {format}");
            if !model.is_empty() {
                out.truncate(out.len() - 2);
                assert_eq!(Recent::decode(&mut Reader(&out)), None, "format {format}");
            }
        }
    }

    /// In order, out of order, full, and after many leave (the buffer compacts and
    /// re-bases): the events stay sorted by (time, arrival), the oldest leaves first with
    /// its row, and both encodings give the same events back.
    #[test]
    fn events_keep_their_order_through_leaving_and_encoding() {
        let mut r = Recent::default();
        let mut model: Vec<(i64, u64, Vec<Value>)> = Vec::new();
        let keep = 5;
        for i in 0..1_000_i64 {
            // Every fourth event is late by up to three.
            let ts = if i % 4 == 3 { i - 3 } else { i };
            let seq = i as u64;
            let mut leaving = HeldRow::new();
            let pushed = r.push(ts, seq, &row(i), keep, &mut leaving);
            let at = model.partition_point(|(t, s, _)| (*t, *s) < (ts, seq));
            if at == 0 && model.len() >= keep {
                assert_eq!(pushed, Pushed::Refused, "event {i}");
            } else {
                model.insert(at, (ts, seq, row(i)));
                if model.len() > keep {
                    let (_, _, gone) = model.remove(0);
                    assert_eq!(pushed, Pushed::Displaced, "event {i}");
                    assert_eq!(&leaving[..], &gone[..], "event {i}");
                } else {
                    assert_eq!(pushed, Pushed::Placed, "event {i}");
                }
            }
            assert_eq!(events(&r), model, "event {i}");
            assert!(r.bytes.capacity() <= 4096, "the buffer stays bounded");
            if i % 97 == 0 {
                round_trips(&r, &model);
            }
        }
        round_trips(&r, &model);
        let mut unsorted = vec![MARK_WHOLE, 2, 0, 0, 0];
        for (ts, seq) in [(2_i64, 0_u64), (1, 1)] {
            write_whole(&mut unsorted, ts, seq, &[]);
        }
        assert_eq!(Recent::decode(&mut Reader(&unsorted)), None);
        round_trips(&Recent::default(), &[]);
    }

    /// Every kind of value, rows of different lengths (from before and after ALTER STREAM
    /// … ADD COLUMN), late events and wrapping differences come back bit for bit.
    #[test]
    fn every_value_comes_back_as_it_went_in() {
        let mut state = 0x9E37_79B9_7F4A_7C15_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut r = Recent::default();
        let mut model: Vec<(i64, u64, Vec<Value>)> = Vec::new();
        let keep = 40;
        for i in 0..5_000_u64 {
            let ts = match next() % 10 {
                0 => i64::MIN + (next() % 3) as i64,
                1 => i64::MAX - (next() % 3) as i64,
                _ => (i as i64) * 1_000 - (next() % 5_000) as i64,
            };
            let pick = |n: u64| -> Value {
                match n % 11 {
                    0 => Value::Null,
                    1 => Value::Bool(n.is_multiple_of(2)),
                    2 => Value::Int(n as i64),
                    3 => Value::Int(i64::MIN + (n % 7) as i64),
                    4 => Value::Numeric((n as i128 * -3).into()),
                    5 => Value::Float(f64::from_bits(n)),
                    6 => Value::Float(-0.0),
                    7 => Value::Text(format!("key-{}", n % 3).into()),
                    8 => Value::Timestamp(ts),
                    9 => Value::Timestamp(n as i64),
                    _ => Value::Text("".into()),
                }
            };
            let columns = 2 + next() % 3;
            let row: Vec<Value> = (0..columns).map(|_| pick(next() % 40)).collect();
            let seq = if next() % 5 == 0 { u64::MAX - i } else { i };
            let mut leaving = HeldRow::new();
            if r.push(ts, seq, &row, keep, &mut leaving) != Pushed::Refused {
                let at = model.partition_point(|(t, s, _)| (*t, *s) < (ts, seq));
                model.insert(at, (ts, seq, row));
            }
            if model.len() > keep {
                let (_, _, gone) = model.remove(0);
                assert_eq!(
                    format!("{:?}", &leaving[..]),
                    format!("{gone:?}"),
                    "event {i}"
                );
            }
            if i % 251 == 0 {
                round_trips(&r, &model);
            }
        }
        let got = events(&r);
        assert_eq!(format!("{got:?}"), format!("{model:?}"));
        round_trips(&r, &model);
    }

    /// The rows `bench/memory.sh` loads take about a third of their whole size: the key
    /// and the event time cost a byte each.
    #[test]
    fn a_keyed_row_packs_small() {
        let mut r = Recent::default();
        for i in 0..100_i64 {
            let ts = 1_800_000_000_000_000 + i * 51_840_000;
            let row = [
                Value::Int(i * 100_000),
                Value::Timestamp(ts),
                Value::Text("card-12345".into()),
                Value::Float(i as f64 * 1.01),
            ];
            r.push(ts, i as u64 * 100_000, &row, 100, &mut HeldRow::new());
        }
        let held = r.bytes.len() - r.start;
        assert!(held <= 100 * 30, "{held} bytes for 100 events");
        let mut whole = Vec::new();
        r.encode_in(format::HELD_BASE - 1, &mut whole);
        assert!(whole.len() >= 100 * 60, "{} bytes whole", whole.len());
    }

    /// A `SAME` that names a column the base lacks, or an `INT_DELTA` where the base holds
    /// no integer, is refused.
    #[test]
    fn an_event_the_base_cannot_explain_is_refused() {
        let mut r = Recent::default();
        r.push(1, 1, &[Value::Text("x".into())], 10, &mut HeldRow::new());
        let mut good = Vec::new();
        r.encode_in(format::HELD_BASE, &mut good);
        assert!(Recent::decode(&mut Reader(&good)).is_some());
        // The last byte is the event's one value: SAME.
        assert_eq!(good.last(), Some(&SAME));
        for bad in [[2_u8, SAME, SAME], [1, INT_DELTA, 0], [1, 0xEE, 0]] {
            let mut bytes = good.clone();
            bytes.truncate(good.len() - 2);
            bytes.extend_from_slice(&bad[..]);
            assert_eq!(Recent::decode(&mut Reader(&bytes)), None, "{bad:?}");
        }
    }
}
