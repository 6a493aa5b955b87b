//! The group states of one GroupBy node, behind the two-layer cache of seed 001.
//!
//! Layers: L1 is a small write-back cache (the executor mutates states there; a dirty
//! entry reaches the store when it leaves L1 or at a checkpoint); L2 is a larger
//! write-through cache of clean entries (an entry is written to the store as it moves
//! from L1 to L2, so L2 never has to be flushed); the store is the node's RocksDB.
//! Without a store the table is L1 alone, unbounded: the in-memory engine.
//!
//! Invariants:
//! - an entry is in at most one layer; L2 entries equal the store's;
//! - the store may be ahead of the last checkpoint (write-through), never behind what
//!   a checkpoint recorded: `flush` writes every dirty entry before a checkpoint;
//! - a store error is kept (`take_failure`) and the table answers as if the key were
//!   absent; the task stops at once rather than go on with wrong state.

use std::sync::Arc;

use hashbrown::HashMap;
use smallvec::SmallVec;

use eddy_planner::aggregate::AggState;
use eddy_planner::codec::Reader;
use eddy_planner::prefetch;
use eddy_storage::{Family, OwnedPut, StateStore};

use crate::exec::key::{Hashed, PackedKey};
use crate::exec::recent::Recent;
use crate::exec::split::{Pos, SplitMap, LINE};

/// Puts waiting in the write-through batch before it is written.
const PENDING_MAX: usize = 1024;

/// Aggregate states kept inside a group's table entry; a node with more spills them to
/// the heap.
pub const INLINE_STATES: usize = 3;

/// A group's aggregate states, one per slot, inline up to `INLINE_STATES`: an event
/// touches its group's entry and nothing behind a pointer.
pub type States = SmallVec<[AggState; INLINE_STATES]>;

/// The state of one group: how many events its window holds, the tumbling epoch it
/// belongs to, one state per aggregate slot, and under a count window its events.
#[derive(Clone, Debug, PartialEq)]
#[repr(C)]
pub struct GroupState {
    pub count: i64,
    pub epoch: i64,
    /// `SLIDING (SIZE n EVENTS)`: the group's n newest events, oldest first.
    pub recent: Option<Box<Recent>>,
    pub states: States,
}

/// What follows the states: nothing, or a count window's events.
fn decode_recent(r: &mut Reader<'_>) -> Option<Option<Box<Recent>>> {
    if r.is_empty() {
        return Some(None);
    }
    Recent::decode(r).map(|recent| Some(Box::new(recent)))
}

/// The slot of an aggregator leaf's state stored apart from its group's entry, in the
/// auxiliary family.
type AuxSlot = u16;

/// The family of the states that grow with their distinct values: a multiset (MIN, MAX,
/// COUNT DISTINCT, the percentiles) gets an entry of its own per (group key, slot), so it
/// is read and written apart from the group's small scalar states.
const AUX: Family = Family::Extremes;

/// Marks, in a group's Aggregates entry, a slot whose state is in the auxiliary family
/// (state tags are small, so the mark is not a valid state).
const MARK_AUX: u8 = 0xA2;

fn is_aux(state: &AggState) -> bool {
    matches!(state, AggState::Extreme(_))
}

fn aux_slots(state: &GroupState) -> Vec<AuxSlot> {
    state
        .states
        .iter()
        .enumerate()
        .filter(|(_, s)| is_aux(s))
        .map(|(i, _)| i as u16)
        .collect()
}

impl GroupState {
    /// The group's Aggregates value: count, epoch and every inline slot's state, with
    /// auxiliary slots as marks. Returns the auxiliary slots' (slot, value).
    fn encode(&self, out: &mut Vec<u8>) -> Vec<(AuxSlot, Vec<u8>)> {
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&self.epoch.to_le_bytes());
        out.extend_from_slice(&(self.states.len() as u32).to_le_bytes());
        let mut aux = Vec::new();
        let mut buf = Vec::new();
        for (i, s) in self.states.iter().enumerate() {
            buf.clear();
            if is_aux(s) {
                buf.push(MARK_AUX);
                let mut value = Vec::with_capacity(64);
                s.encode(&mut value);
                aux.push((i as u16, value));
            } else {
                s.encode(&mut buf);
            }
            out.extend_from_slice(&(buf.len() as u32).to_le_bytes());
            out.extend_from_slice(&buf);
        }
        if let Some(recent) = &self.recent {
            recent.encode(out);
        }
        aux
    }

    /// The whole state in bytes, auxiliary slots included: the form L2 keeps it in.
    fn pack(&self) -> Box<[u8]> {
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&self.epoch.to_le_bytes());
        out.extend_from_slice(&(self.states.len() as u32).to_le_bytes());
        for s in &self.states {
            let at = out.len();
            out.extend_from_slice(&[0; 4]);
            s.encode(&mut out);
            let len = (out.len() - at - 4) as u32;
            out[at..at + 4].copy_from_slice(&len.to_le_bytes());
        }
        if let Some(recent) = &self.recent {
            recent.encode(&mut out);
        }
        out.into_boxed_slice()
    }

    /// A copy, with the held events only if `held`.
    fn copy(&self, held: bool) -> GroupState {
        GroupState {
            count: self.count,
            epoch: self.epoch,
            recent: if held { self.recent.clone() } else { None },
            states: self.states.clone(),
        }
    }

    /// What `pack` wrote; with the held events only if `held`.
    fn unpack(bytes: &[u8], held: bool) -> Option<GroupState> {
        let mut r = Reader(bytes);
        let count = r.i64()?;
        let epoch = r.i64()?;
        let n = r.u32()? as usize;
        let mut states = States::with_capacity(n.min(64));
        for _ in 0..n {
            let len = r.u32()? as usize;
            states.push(AggState::decode(r.take(len)?)?);
        }
        let recent = if held { decode_recent(&mut r)? } else { None };
        Some(GroupState {
            count,
            epoch,
            states,
            recent,
        })
    }

    /// A group's Aggregates value, with a placeholder in each auxiliary slot, and its
    /// held events only if `held`; returns the auxiliary slots too, for the caller to
    /// fill from the auxiliary family.
    fn decode(bytes: &[u8], held: bool) -> Option<(GroupState, Vec<AuxSlot>)> {
        let mut r = Reader(bytes);
        let count = r.i64()?;
        let epoch = r.i64()?;
        let n = r.u32()? as usize;
        let mut states = States::with_capacity(n.min(64));
        let mut aux = Vec::new();
        for i in 0..n {
            let len = r.u32()? as usize;
            let bytes = r.take(len)?;
            if bytes == [MARK_AUX] {
                aux.push(i as u16);
                states.push(AggState::Count(0));
            } else {
                states.push(AggState::decode(bytes)?);
            }
        }
        let recent = if held { decode_recent(&mut r)? } else { None };
        Some((
            GroupState {
                count,
                epoch,
                states,
                recent,
            },
            aux,
        ))
    }
}

#[derive(Clone, Copy, Debug)]
pub struct CacheConfig {
    /// Entries of the write-back layer, per GroupBy node of a task.
    pub l1_entries: usize,
    /// Entries of the write-through layer, per GroupBy node of a task (0: one layer).
    pub l2_entries: usize,
}

impl Default for CacheConfig {
    /// L1 holds 256 Ki groups (48 MiB at most, taken as groups arrive): a 7-day window
    /// over 100 k cards keeps all of them in L1. With 64 Ki, a third of its events missed
    /// L1 and each miss wrote an evicted state through to RocksDB, which made the window
    /// run at a quarter of a 5-minute one's rate.
    fn default() -> Self {
        CacheConfig {
            l1_entries: 1 << 18,
            l2_entries: 1 << 20,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub l1_hits: u64,
    pub l2_hits: u64,
    /// Lookups that went to the store.
    pub misses: u64,
    /// Entries written to the store (write-through and flushes).
    pub writes: u64,
    pub l1_entries: u64,
    pub l2_entries: u64,
}

impl std::ops::AddAssign for CacheStats {
    fn add_assign(&mut self, o: CacheStats) {
        self.l1_hits += o.l1_hits;
        self.l2_hits += o.l2_hits;
        self.misses += o.misses;
        self.writes += o.writes;
        self.l1_entries += o.l1_entries;
        self.l2_entries += o.l2_entries;
    }
}

/// Where a table's entries live in the store: `prefix ‖ packed group key` in Aggregates,
/// and `prefix ‖ packed group key ‖ slot` (u16, big-endian) in the auxiliary family.
#[derive(Clone)]
pub struct Backing {
    pub store: Arc<dyn StateStore>,
    pub prefix: Vec<u8>,
    pub config: CacheConfig,
}

type Pending = Vec<OwnedPut>;

impl Backing {
    fn key(&self, key: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.prefix.len() + key.len() + 2);
        k.extend_from_slice(&self.prefix);
        k.extend_from_slice(key);
        k
    }

    fn aux_key(&self, key: &[u8], slot: u16) -> Vec<u8> {
        let mut k = self.key(key);
        k.extend_from_slice(&slot.to_be_bytes());
        k
    }

    /// Queues the puts that make the store hold `state` for `key` (its absence for
    /// `None`), given the auxiliary slots the store holds now; returns the new ones.
    fn queue(
        &self,
        pending: &mut Pending,
        key: &[u8],
        state: Option<&GroupState>,
        stored: &[AuxSlot],
    ) -> Vec<AuxSlot> {
        let mut aux = Vec::new();
        let value = state.map(|s| {
            let mut v = Vec::with_capacity(64);
            for (slot, value) in s.encode(&mut v) {
                pending.push((AUX, self.aux_key(key, slot), Some(value)));
                aux.push(slot);
            }
            v
        });
        for &slot in stored.iter().filter(|a| !aux.contains(a)) {
            pending.push((AUX, self.aux_key(key, slot), None));
        }
        pending.push((Family::Aggregates, self.key(key), value));
        aux
    }
}

/// An L1 entry: a state, or a known absence (`None`); dirty ones differ from the store.
/// An event pays for the cache lines of its group's entry it reads, twice (entering
/// and leaving): with its key, an entry fills three lines exactly (`ENTRY_BYTES`; the
/// table's buckets start on a line, `split::LineAligned`). `repr(C)` here and in
/// `GroupState` puts what every event reads first (key, flag, counts, the states'
/// header), then the states in slot order, so a group with one inline state is read
/// from two lines (`hot_bytes`).
#[repr(C)]
struct Slot {
    dirty: bool,
    state: Option<GroupState>,
}

/// Bytes of an L1 entry with its key: three cache lines.
const ENTRY_BYTES: usize = 192;
const _: () = assert!(std::mem::size_of::<(PackedKey, Slot)>() == ENTRY_BYTES);
const _: () = assert!(ENTRY_BYTES.is_multiple_of(LINE));

/// Bytes from the start of an L1 entry to the end of what an event reads in a group of
/// `states` states: the key, the flags and counts, and the first `states` states when
/// they are inline (the whole entry when they are on the heap). Measured on an entry, so
/// it follows the layout; a prefetch is only a hint, so a wrong figure costs time only.
fn hot_bytes(states: usize) -> usize {
    if states > INLINE_STATES {
        return ENTRY_BYTES;
    }
    let entry = (
        PackedKey::new(&[]),
        Slot::clean(Some(GroupState {
            count: 0,
            epoch: 0,
            recent: None,
            states: (0..states).map(|_| AggState::Count(0)).collect(),
        })),
    );
    let state = entry.1.state.as_ref().expect("set above");
    let at = |p: *const u8| p as usize - std::ptr::addr_of!(entry) as usize;
    let inline = state.states.as_ptr() as *const u8;
    [
        at(std::ptr::addr_of!(entry.0).cast()) + std::mem::size_of::<PackedKey>(),
        at(std::ptr::addr_of!(entry.1.dirty).cast()) + 1,
        at(std::ptr::addr_of!(state.count).cast()) + 8,
        at(std::ptr::addr_of!(state.epoch).cast()) + 8,
        at(std::ptr::addr_of!(state.recent).cast()) + 8,
        at(inline) + states * std::mem::size_of::<AggState>(),
    ]
    .into_iter()
    .max()
    .unwrap_or(ENTRY_BYTES)
    .min(ENTRY_BYTES)
}

pub struct GroupTable {
    l1: SplitMap<Slot>,
    /// The auxiliary entries the store holds for an L1 key, where there are any: kept
    /// beside L1, read only when an entry is loaded or written.
    stored: HashMap<PackedKey, Box<[AuxSlot]>>,
    /// Clean states, packed (`GroupState::pack`): a fifth of their size in L1.
    l2: SplitMap<Box<[u8]>>,
    backing: Option<Backing>,
    pending: Pending,
    failure: Option<String>,
    stats: CacheStats,
    /// What a prefetch of an entry asks for (`hot_bytes`).
    hot_bytes: usize,
    /// Every state the store holds for this table is in L1 or L2 as well, so a key in
    /// neither has no state and is not read from the store: true from a table over an
    /// empty prefix until a state leaves both layers (an eviction from L2, or from L1
    /// with no L2) or a layout change rewrites the store.
    complete: bool,
}

impl GroupTable {
    pub fn new(backing: Option<Backing>) -> GroupTable {
        // A store error here only costs the shortcut: the reads it would spare report it.
        let complete = backing.as_ref().is_none_or(|b| {
            b.store
                .holds_prefix(Family::Aggregates, &b.prefix)
                .is_ok_and(|holds| !holds)
        });
        GroupTable {
            complete,
            hot_bytes: ENTRY_BYTES,
            l1: SplitMap::default(),
            stored: HashMap::new(),
            l2: SplitMap::default(),
            backing,
            pending: Vec::new(),
            failure: None,
            stats: CacheStats::default(),
        }
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            l1_entries: self.l1.len() as u64,
            l2_entries: self.l2.len() as u64,
            ..self.stats
        }
    }

    /// The first store error since the last call.
    pub fn take_failure(&mut self) -> Option<String> {
        self.failure.take()
    }

    /// Records a failure (the first one wins) for the task to stop on.
    pub fn fail(&mut self, e: impl std::fmt::Display) {
        if self.failure.is_none() {
            self.failure = Some(e.to_string());
        }
    }

    /// Writes what is pending through the current store handle, then goes on with
    /// `store` (the same database, another writer: the task moved to another shard).
    pub fn set_store(&mut self, store: Arc<dyn StateStore>) {
        self.write_pending();
        if let Some(b) = &mut self.backing {
            b.store = store;
        }
    }

    /// Writes the write-through batch.
    fn write_pending(&mut self) {
        let Some(b) = &self.backing else { return };
        if self.pending.is_empty() {
            return;
        }
        self.stats.writes += self.pending.len() as u64;
        let result = b.store.write_owned(std::mem::take(&mut self.pending));
        if let Err(e) = result {
            self.fail(e);
        }
    }

    /// Queues the write of `key`'s state; returns the auxiliary slots stored after it.
    fn queue_write(
        &mut self,
        key: &[u8],
        state: Option<&GroupState>,
        stored: &[AuxSlot],
    ) -> Vec<AuxSlot> {
        let Some(b) = &self.backing else {
            return Vec::new();
        };
        let aux = b.queue(&mut self.pending, key, state, stored);
        if self.pending.len() >= PENDING_MAX {
            self.write_pending();
        }
        aux
    }

    /// Keeps L1 (and L2) within their sizes, evicting a sixteenth of a layer at a time.
    fn make_room(&mut self) {
        let Some(config) = self.backing.as_ref().map(|b| b.config) else {
            return;
        };
        if self.l1.len() >= config.l1_entries.max(1) {
            let mut evict = (config.l1_entries / 16).max(1);
            let mut moved = Vec::with_capacity(evict);
            self.l1.retain(|k, slot| {
                if evict == 0 {
                    return true;
                }
                evict -= 1;
                moved.push((k.clone(), std::mem::replace(slot, Slot::absent())));
                false
            });
            for (k, slot) in moved {
                let stored = self.stored.remove(&k).unwrap_or_default();
                if slot.dirty {
                    self.queue_write(k.as_bytes(), slot.state.as_ref(), &stored);
                }
                match (slot.state, config.l2_entries > 0) {
                    (Some(state), true) => {
                        self.l2.insert(k, state.pack());
                    }
                    // Only in the store now.
                    (Some(_), false) => self.complete = false,
                    (None, _) => {}
                }
            }
        }
        if self.l2.len() > config.l2_entries {
            self.complete = false;
            let mut evict = self.l2.len() - config.l2_entries + config.l2_entries / 16;
            self.l2.retain(|_, _| {
                if evict == 0 {
                    return true;
                }
                evict -= 1;
                false
            });
        }
    }

    /// Reads `key`'s state from the store: its Aggregates entry, then its auxiliary ones.
    fn read(&mut self, key: &[u8]) -> Option<GroupState> {
        let b = self.backing.clone()?;
        self.write_pending();
        let k = b.key(key);
        let bytes = match b.store.multi_get(Family::Aggregates, &[&k]) {
            Ok(mut v) => v.pop().flatten()?,
            Err(e) => {
                self.fail(e);
                return None;
            }
        };
        let Some((mut state, aux)) = GroupState::decode(&bytes, true) else {
            self.fail(format!(
                "the state store holds an unreadable group state under key {k:02x?}"
            ));
            return None;
        };
        if aux.is_empty() {
            return Some(state);
        }
        let keys: Vec<Vec<u8>> = aux.iter().map(|&s| b.aux_key(key, s)).collect();
        let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let values = match b.store.multi_get(AUX, &refs) {
            Ok(v) => v,
            Err(e) => {
                self.fail(e);
                return None;
            }
        };
        for (slot, value) in aux.into_iter().zip(values) {
            match value.as_deref().and_then(AggState::decode) {
                Some(s) => state.states[slot as usize] = s,
                None => {
                    self.fail(format!(
                        "the state store's {} family lacks a readable state for slot {slot} of key {k:02x?}",
                        AUX.name()
                    ));
                    return None;
                }
            }
        }
        Some(state)
    }

    /// Brings `key` into L1 from L2 or the backing store if it exists there (or records
    /// in L1 that it does not), and returns its slot's place in L1: one probe for a
    /// group already in L1, the common case. Only with a backing store.
    fn load(&mut self, key: Hashed<'_>) -> Pos {
        if let Some(at) = self.l1.find(key) {
            self.stats.l1_hits += 1;
            return at;
        }
        let (h, l2) = (key.hash, self.l2.remove(key));
        let key = key.key.to_packed();
        let state = match l2.and_then(|b| GroupState::unpack(&b, true)) {
            Some(s) => {
                self.stats.l2_hits += 1;
                Some(s)
            }
            None if self.complete => None,
            None => {
                self.stats.misses += 1;
                self.read(key.as_bytes())
            }
        };
        // Eviction moves L1's entries: the place is taken after it.
        self.make_room();
        let stored = state.as_ref().map(aux_slots).unwrap_or_default();
        if !stored.is_empty() {
            self.stored.insert(key.clone(), stored.into());
        }
        self.l1.insert_new(h, key, Slot::clean(state))
    }

    /// Sets how many states each group keeps, for the lines a prefetch asks for.
    pub fn set_states(&mut self, states: usize) {
        self.hot_bytes = hot_bytes(states);
    }

    /// Asks for the control bytes a lookup in L1 of the key of hash `hash` reads first
    /// (`SplitMap::prefetch_probe`): the first of two stages, `prefetch` the second.
    pub fn prefetch_probe(&self, hash: u64) {
        self.l1.prefetch_probe(hash);
    }

    /// Asks for the cache lines an event reads of the L1 entry of the key of hash
    /// `hash` (see `SplitMap::prefetch`).
    pub fn prefetch(&self, hash: u64) {
        self.l1.prefetch(hash, self.hot_bytes);
    }

    /// Asks for the cache lines of what the states of the key of hash `hash` keep on
    /// the heap, if its entry is in L1 (`AggState::prefetch`). The entry is the first
    /// whose tag matches (`SplitMap::likely`): another key's, rarely, which costs only
    /// the time of its lines.
    pub fn prefetch_states(&self, hash: u64) {
        if let Some(state) = self.l1.likely(hash).and_then(|slot| slot.state.as_ref()) {
            state.states.iter().for_each(AggState::prefetch);
        }
    }

    /// Asks for the lines a count window's entering event reads of the events of the key
    /// of hash `hash`, if its entry is in L1 (`SplitMap::likely`, as `prefetch_states`),
    /// one stage a call, each reading what the one before asked for: 0 the events'
    /// header behind their pointer, 1 the oldest of them (which leaves when the group is
    /// full) and the end, where the new one goes.
    pub fn prefetch_recent(&self, hash: u64, stage: u8) {
        let Some(recent) = self
            .l1
            .likely(hash)
            .and_then(|slot| slot.state.as_ref())
            .and_then(|state| state.recent.as_deref())
        else {
            return;
        };
        // Stage 0 reads only the pointer: the header is what it asks for.
        match stage {
            0 => prefetch::lines(recent),
            1 => recent.prefetch(),
            _ => {}
        }
    }

    /// A backed table's slot for `key` in L1, loaded if it was not there (absent or not).
    fn loaded(&mut self, key: Hashed<'_>) -> &mut Slot {
        let at = self.load(key);
        self.l1.at_mut(at)
    }

    /// `key`'s slot in L1: found there alone without a backing store, else loaded.
    fn slot(&mut self, key: Hashed<'_>) -> Option<&mut Slot> {
        match self.backing {
            None => self.l1.get_mut(key),
            Some(_) => Some(self.loaded(key)),
        }
    }

    pub fn get(&mut self, key: Hashed<'_>) -> Option<&GroupState> {
        self.slot(key)?.state.as_ref()
    }

    pub fn get_mut(&mut self, key: Hashed<'_>) -> Option<&mut GroupState> {
        let slot = self.slot(key)?;
        let state = slot.state.as_mut()?;
        slot.dirty = true;
        Some(state)
    }

    /// The state of `key`, created with `make` if absent.
    pub fn entry(&mut self, key: Hashed<'_>, make: impl FnOnce() -> GroupState) -> &mut GroupState {
        let slot = match self.backing {
            None => self.l1.get_or_insert_with(key, Slot::absent),
            Some(_) => self.loaded(key),
        };
        slot.dirty = true;
        slot.state.get_or_insert_with(make)
    }

    pub fn remove(&mut self, key: Hashed<'_>) {
        if self.backing.is_none() {
            self.l1.remove(key);
        } else if let Some(slot) = self.slot(key) {
            // Kept as known absent, so the store's entry is deleted and not read again.
            slot.state = None;
            slot.dirty = true;
        }
    }

    /// Every group with a state, in no particular order, with its held events (a count
    /// window's, `GroupState::recent`) only if `held`: a read of the aggregates leaves
    /// them out, and they are most of such a state's bytes. While every stored state is
    /// in L1 or L2 as well (`complete`), the store is not read.
    pub fn entries(&mut self, held: bool) -> Vec<(Vec<u8>, GroupState)> {
        let cached = |l1: &SplitMap<Slot>| -> Vec<(Vec<u8>, GroupState)> {
            l1.iter()
                .filter_map(|(k, s)| Some((k.as_bytes().to_vec(), s.state.as_ref()?.copy(held))))
                .collect()
        };
        let Some(b) = self.backing.clone() else {
            return cached(&self.l1);
        };
        if self.complete {
            let mut all = cached(&self.l1);
            let mut unreadable = false;
            for (k, packed) in self.l2.iter() {
                match GroupState::unpack(packed, held) {
                    Some(s) => all.push((k.as_bytes().to_vec(), s)),
                    None => unreadable = true,
                }
            }
            if unreadable {
                self.fail("the write-through layer holds an unreadable group state");
            }
            return all;
        }
        self.write_pending();
        let mut all: HashMap<Vec<u8>, (GroupState, Vec<AuxSlot>)> = HashMap::new();
        for (k, v) in self.scan(&b, Family::Aggregates) {
            match GroupState::decode(&v, held) {
                Some(s) => {
                    all.insert(k[b.prefix.len()..].to_vec(), s);
                }
                None => self.fail("the state store holds an unreadable group state"),
            }
        }
        for (k, v) in self.scan(&b, AUX) {
            let Some(split) = k.len().checked_sub(2).filter(|&n| n >= b.prefix.len()) else {
                self.fail(format!("a malformed key in the {} family", AUX.name()));
                continue;
            };
            let slot = u16::from_be_bytes([k[split], k[split + 1]]);
            let filled = all
                .get_mut(&k[b.prefix.len()..split])
                .and_then(|(state, aux)| {
                    let at = aux.iter().position(|&a| a == slot)?;
                    aux.swap_remove(at);
                    state.states[slot as usize] = AggState::decode(&v)?;
                    Some(())
                });
            if filled.is_none() {
                self.fail(format!(
                    "the {} family holds a state that matches no group",
                    AUX.name()
                ));
            }
        }
        if all.values().any(|(_, aux)| !aux.is_empty()) {
            self.fail("the state store lacks an auxiliary state of a group");
        }
        let mut all: HashMap<Vec<u8>, GroupState> =
            all.into_iter().map(|(k, (s, _))| (k, s)).collect();
        for (k, slot) in self.l1.iter() {
            match &slot.state {
                Some(s) => {
                    all.insert(k.as_bytes().to_vec(), s.copy(held));
                }
                None => {
                    all.remove(k.as_bytes());
                }
            }
        }
        all.into_iter().collect()
    }

    fn scan(&mut self, b: &Backing, family: Family) -> Vec<(Vec<u8>, Vec<u8>)> {
        b.store.scan_prefix(family, &b.prefix).unwrap_or_else(|e| {
            self.fail(e);
            Vec::new()
        })
    }

    /// Applies `f` to every state (a layout change after DDL), in memory and in the store.
    pub fn rewrite(&mut self, f: &mut dyn FnMut(&mut GroupState)) {
        if self.backing.is_none() {
            for s in self.l1.values_mut().filter_map(|s| s.state.as_mut()) {
                f(s);
            }
            return;
        }
        // After the flush the store holds every state and every deletion.
        self.flush();
        let entries = self.entries(true);
        self.l1.clear();
        self.stored.clear();
        self.l2.clear();
        self.complete = entries.is_empty();
        for (k, mut s) in entries {
            let stored = aux_slots(&s);
            f(&mut s);
            self.queue_write(&k, Some(&s), &stored);
        }
        self.write_pending();
    }

    /// Removes every state (the node goes away), from the store too.
    pub fn clear(&mut self) {
        if self.backing.is_some() {
            self.flush();
            for (k, s) in self.entries(false) {
                self.queue_write(&k, None, &aux_slots(&s));
            }
            self.write_pending();
        }
        self.l1.clear();
        self.stored.clear();
        self.l2.clear();
        // The store holds none of its states now.
        self.complete = true;
    }

    /// Writes every dirty L1 entry to the store (the synchronous stage of a checkpoint);
    /// returns how many were written.
    pub fn flush(&mut self) -> usize {
        let Some(b) = &self.backing else { return 0 };
        let mut written = 0;
        for (k, slot) in self.l1.iter_mut().filter(|(_, s)| s.dirty) {
            slot.dirty = false;
            let before = self.stored.get(k).map_or(&[][..], |s| &s[..]);
            let after = b.queue(&mut self.pending, k.as_bytes(), slot.state.as_ref(), before);
            if after.is_empty() {
                self.stored.remove(k);
            } else {
                self.stored.insert(k.clone(), after.into());
            }
            written += 1;
        }
        self.write_pending();
        written
    }
}

impl Slot {
    fn absent() -> Slot {
        Slot::clean(None)
    }

    fn clean(state: Option<GroupState>) -> Slot {
        Slot {
            dirty: false,
            state,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap as StdMap;

    use eddy_planner::types::Value;
    use eddy_storage::state::Put;
    use eddy_storage::MemStateStore;

    use super::*;
    use crate::exec::key::KeyRef;

    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// An event's cost is mostly the cache misses on its group's entry: keep the entry
    /// (key, count, epoch and the inline states) within a few cache lines.
    #[test]
    fn group_entries_stay_small() {
        use std::mem::size_of;
        println!(
            "AggState {} B, Value {} B, GroupState {} B, entry {} B",
            size_of::<AggState>(),
            size_of::<Value>(),
            size_of::<GroupState>(),
            size_of::<(PackedKey, Slot)>()
        );
        assert!(size_of::<Value>() <= 24);
        assert!(size_of::<AggState>() <= 40);
        // Three inline states (say a SUM, a MIN/MAX/COUNT DISTINCT and a LAST) fill
        // three whole cache lines with the key (also held at compile time).
        assert_eq!(size_of::<(PackedKey, Slot)>(), ENTRY_BYTES);
    }

    /// A prefetch asks for the lines an event reads: two for a group of one inline
    /// state (COUNT, SUM and AVG share one), three for more, the whole entry when the
    /// states are on the heap.
    #[test]
    fn a_prefetch_asks_for_the_lines_an_event_reads() {
        assert!(hot_bytes(0) <= 2 * LINE, "{}", hot_bytes(0));
        assert!(hot_bytes(1) <= 2 * LINE, "{}", hot_bytes(1));
        assert!(hot_bytes(2) > 2 * LINE && hot_bytes(2) <= ENTRY_BYTES);
        assert!(hot_bytes(INLINE_STATES) <= ENTRY_BYTES);
        assert_eq!(hot_bytes(INLINE_STATES + 1), ENTRY_BYTES);
    }

    fn table(store: &Arc<MemStateStore>) -> GroupTable {
        GroupTable::new(Some(Backing {
            store: store.clone(),
            prefix: b"task/node".to_vec(),
            config: CacheConfig {
                l1_entries: 4,
                l2_entries: 8,
            },
        }))
    }

    fn fresh() -> GroupState {
        GroupState {
            count: 0,
            epoch: 0,
            states: smallvec::smallvec![
                AggState::Count(0),
                AggState::Extreme(Default::default()),
                AggState::Extreme(Default::default()),
            ],
            recent: None,
        }
    }

    /// A count window's events survive both encodings, and a state without them reads
    /// as before.
    #[test]
    fn recent_events_round_trip() {
        let mut s = fresh();
        assert_eq!(GroupState::unpack(&s.pack(), true), Some(s.clone()));
        let row = [Value::Int(7), Value::Text("a".into()), Value::Null];
        let mut recent = Recent::default();
        recent.push(10, 1, &row, 2, &mut Default::default());
        recent.push(12, 5, &row, 2, &mut Default::default());
        s.recent = Some(Box::new(recent));
        assert_eq!(GroupState::unpack(&s.pack(), true), Some(s.clone()));
        let mut main = Vec::new();
        let aux = s.encode(&mut main);
        let (decoded, slots) = GroupState::decode(&main, true).unwrap();
        assert_eq!(decoded.recent, s.recent);
        assert_eq!(slots.len(), aux.len());
        let mut bad = s.pack().to_vec();
        bad.push(0);
        assert_eq!(GroupState::unpack(&bad, true), None);
    }

    /// One event's effect on a group: every slot changes (no two multisets alike), so
    /// every auxiliary slot is written, and later slots move when the layout changes.
    /// Counts `v` in every slot, and holds it as a count window of three events would.
    fn apply(s: &mut GroupState, v: i64) {
        s.count += 1;
        let held = s.recent.get_or_insert_with(Default::default);
        held.push(
            v,
            s.count as u64,
            &[Value::Int(v)],
            3,
            &mut Default::default(),
        );
        for (i, state) in s.states.iter_mut().enumerate() {
            match state {
                AggState::Count(n) => *n += v,
                AggState::Extreme(m) => m.add(&Value::Int(v % (7 + i as i64)), 1),
                _ => {}
            }
        }
    }

    fn sorted(mut v: Vec<(Vec<u8>, GroupState)>) -> Vec<(Vec<u8>, GroupState)> {
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Rows of `family` in the store under the table's prefix.
    fn stored(store: &MemStateStore, family: Family) -> usize {
        store.scan_prefix(family, b"task/node").unwrap().len()
    }

    /// While the layers hold every state, `entries` reads them and not the store, and
    /// gives what a read of the store gives.
    #[test]
    fn a_complete_table_lists_its_entries_from_its_layers() {
        let store = Arc::new(MemStateStore::default());
        let mut t = GroupTable::new(Some(Backing {
            store: store.clone(),
            prefix: b"task/node".to_vec(),
            config: CacheConfig {
                l1_entries: 4,
                l2_entries: 64,
            },
        }));
        let mut model: StdMap<Vec<u8>, GroupState> = StdMap::new();
        for i in 0..200_i64 {
            let card = format!("card{}", i % 30);
            let key = KeyRef::Text(&card).to_vec();
            apply(model.entry(key.clone()).or_insert_with(fresh), i);
            apply(t.entry(KeyRef::Packed(&key).hashed(), fresh), i);
        }
        t.remove(KeyRef::Text("card7").hashed());
        model.remove(&KeyRef::Text("card7").to_vec());
        assert!(t.complete, "no state left both layers");
        let want = sorted(model.into_iter().collect());
        assert_eq!(sorted(t.entries(true)), want);
        t.complete = false;
        assert_eq!(sorted(t.entries(true)), want, "read from the store");
    }

    /// Random updates, removals, reads, layout rewrites and reboots (flush, drop the
    /// table, reopen it on the same store) against a map; after every flush the store
    /// holds exactly one auxiliary entry per live auxiliary slot, none left behind.
    #[test]
    fn table_matches_the_model_across_evictions_rewrites_and_reboots() {
        let store = Arc::new(MemStateStore::default());
        let mut t = table(&store);
        let mut seen = CacheStats::default();
        let mut model: StdMap<Vec<u8>, GroupState> = StdMap::new();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut layout_changes = 0;
        for step in 0..20_000 {
            // A key of one text column, looked up by its packed bytes or by its text.
            let card = format!("card{}", rng.below(40));
            let row = [Value::Text(card.as_str().into())];
            let key = KeyRef::Text(&card).to_vec();
            let mut buf = Vec::new();
            let at = match step % 2 {
                0 => KeyRef::Packed(&key),
                _ => KeyRef::of(&mut buf, &[0], &row),
            }
            .hashed();
            match rng.below(100) {
                0..=59 => {
                    let v = rng.below(1000) as i64;
                    let template = model.values().next().cloned();
                    let make = || {
                        let mut s = template.clone().unwrap_or_else(fresh);
                        s.count = 0;
                        s.recent = None;
                        for st in &mut s.states {
                            *st = match st {
                                AggState::Count(_) => AggState::Count(0),
                                _ => AggState::Extreme(Default::default()),
                            };
                        }
                        s
                    };
                    let m = model.entry(key.clone()).or_insert_with(make);
                    apply(m, v);
                    apply(t.entry(at, make), v);
                }
                60..=74 => {
                    model.remove(&key);
                    t.remove(at);
                }
                75..=94 => assert_eq!(t.get(at), model.get(&key), "step {step}"),
                95..=96 => {
                    // A metric dropped or added: the layout of every state changes.
                    layout_changes += 1;
                    let mut change = |s: &mut GroupState| {
                        if s.states.len() > 1 {
                            s.states.remove(0);
                        } else {
                            s.states.push(AggState::Extreme(Default::default()));
                            s.states.push(AggState::Count(0));
                        }
                    };
                    model.values_mut().for_each(&mut change);
                    t.rewrite(&mut change);
                }
                97 => {
                    let want = sorted(model.clone().into_iter().collect());
                    assert_eq!(sorted(t.entries(true)), want, "step {step}");
                    // A read of the aggregates alone gets the same states, without the
                    // held events.
                    let bare: Vec<_> = want.into_iter().map(|(k, s)| (k, s.copy(false))).collect();
                    assert_eq!(sorted(t.entries(false)), bare, "step {step}");
                }
                _ => {
                    t.flush();
                    let aux = model
                        .values()
                        .flat_map(|s| &s.states)
                        .filter(|s| is_aux(s))
                        .count();
                    assert_eq!(stored(&store, Family::Aggregates), model.len());
                    assert_eq!(stored(&store, AUX), aux);
                    seen += t.stats();
                    t = table(&store);
                }
            }
            assert_eq!(t.take_failure(), None, "step {step}");
        }
        assert!(layout_changes > 100);
        // Over every table the reboots opened (one alone may be too short-lived).
        seen += t.stats();
        assert!(
            seen.l2_hits > 0 && seen.misses > 0 && seen.writes > 0,
            "{seen:?}"
        );
        t.clear();
        for f in [Family::Aggregates, AUX] {
            assert_eq!(stored(&store, f), 0, "{f:?}");
        }
    }

    /// A store that counts its reads.
    #[derive(Default)]
    struct Counting {
        inner: MemStateStore,
        reads: std::sync::atomic::AtomicUsize,
    }

    impl StateStore for Counting {
        fn multi_get(
            &self,
            family: Family,
            keys: &[&[u8]],
        ) -> std::result::Result<Vec<Option<Vec<u8>>>, eddy_storage::StateError> {
            self.reads
                .fetch_add(keys.len(), std::sync::atomic::Ordering::Relaxed);
            self.inner.multi_get(family, keys)
        }
        fn write(&self, batch: &[Put<'_>]) -> std::result::Result<(), eddy_storage::StateError> {
            self.inner.write(batch)
        }
        fn scan_prefix(
            &self,
            family: Family,
            prefix: &[u8],
        ) -> std::result::Result<eddy_storage::state::Entries, eddy_storage::StateError> {
            self.inner.scan_prefix(family, prefix)
        }
        fn sync(&self) -> std::result::Result<(), eddy_storage::StateError> {
            Ok(())
        }
    }

    /// While the cache holds every state the store does, a new group is not looked up
    /// in the store; once a state lives only there, it is, and is found.
    #[test]
    fn a_complete_cache_does_not_read_the_store_for_new_groups() {
        let store = Arc::new(Counting::default());
        let open = |l2_entries| {
            GroupTable::new(Some(Backing {
                store: store.clone(),
                prefix: b"task/node".to_vec(),
                config: CacheConfig {
                    l1_entries: 64,
                    l2_entries,
                },
            }))
        };
        let reads = || store.reads.load(std::sync::atomic::Ordering::Relaxed);
        let key = |i: u32| PackedKey::new(format!("card-{i}").as_bytes());
        let mut t = open(1024);
        for i in 0..500 {
            t.entry(key(i).as_bytes().into(), fresh).count += 1;
        }
        assert_eq!(reads(), 0, "new groups read from the store");
        t.flush();
        // A table over a prefix the store holds reads it, and finds its states.
        let mut t = open(0);
        assert_eq!(t.get(key(7).as_bytes().into()).map(|s| s.count), Some(1));
        assert!(reads() > 0);
        // Without an L2, a state L1 evicts lives only in the store: found there.
        t.clear();
        let before = reads();
        for i in 0..60 {
            t.entry(key(i).as_bytes().into(), fresh).count += 1;
        }
        assert_eq!(reads(), before, "a cleared table read the store");
        for i in 500..1000 {
            t.entry(key(i).as_bytes().into(), fresh).count += 1;
        }
        assert!(reads() > before);
        assert_eq!(t.get(key(3).as_bytes().into()).map(|s| s.count), Some(1));
        assert_eq!(t.take_failure(), None);
    }

    #[test]
    fn a_missing_auxiliary_state_stops_the_table() {
        let store = Arc::new(MemStateStore::default());
        let mut t = table(&store);
        apply(t.entry(KeyRef::Text("k").hashed(), fresh), 5);
        t.flush();
        let gone = store.scan_prefix(AUX, b"task/node").unwrap();
        let deletes: Vec<Put<'_>> = gone
            .iter()
            .map(|(k, _)| (AUX, k.as_slice(), None))
            .collect();
        store.write(&deletes).unwrap();
        let mut t = table(&store);
        assert_eq!(t.get(KeyRef::Text("k").hashed()), None);
        let failure = t.take_failure().expect("a failure");
        assert!(failure.contains("extremes family"), "{failure}");
    }
}
