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

use eddy_planner::aggregate::AggState;
use eddy_planner::codec::Reader;
use eddy_storage::{Family, StateStore};

use crate::key::PackedKey;

/// Puts waiting in the write-through batch before it is written.
const PENDING_MAX: usize = 1024;

/// The state of one group: how many events its window holds, the tumbling epoch it
/// belongs to, and one state per aggregate slot.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupState {
    pub count: i64,
    pub epoch: i64,
    pub states: Vec<AggState>,
}

impl GroupState {
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&self.epoch.to_le_bytes());
        out.extend_from_slice(&(self.states.len() as u32).to_le_bytes());
        let mut buf = Vec::new();
        for s in &self.states {
            buf.clear();
            s.encode(&mut buf);
            out.extend_from_slice(&(buf.len() as u32).to_le_bytes());
            out.extend_from_slice(&buf);
        }
    }

    pub fn decode(bytes: &[u8]) -> Option<GroupState> {
        let mut r = Reader(bytes);
        let count = r.i64()?;
        let epoch = r.i64()?;
        let n = r.u32()? as usize;
        let mut states = Vec::with_capacity(n.min(64));
        for _ in 0..n {
            let len = r.u32()? as usize;
            states.push(AggState::decode(r.take(len)?)?);
        }
        r.is_empty().then_some(GroupState {
            count,
            epoch,
            states,
        })
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
    fn default() -> Self {
        CacheConfig {
            l1_entries: 65_536,
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

/// Where a table's entries live in the store: `prefix ‖ packed group key`.
#[derive(Clone)]
pub struct Backing {
    pub store: Arc<dyn StateStore>,
    pub prefix: Vec<u8>,
    pub config: CacheConfig,
}

/// An L1 entry: a state, or a known absence (`None`); dirty ones differ from the store.
struct Slot {
    state: Option<GroupState>,
    dirty: bool,
}

pub struct GroupTable {
    l1: HashMap<PackedKey, Slot>,
    l2: HashMap<PackedKey, GroupState>,
    backing: Option<Backing>,
    pending: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    failure: Option<String>,
    stats: CacheStats,
}

impl GroupTable {
    pub fn new(backing: Option<Backing>) -> GroupTable {
        GroupTable {
            l1: HashMap::new(),
            l2: HashMap::new(),
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

    fn store_key(prefix: &[u8], key: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(prefix.len() + key.len());
        k.extend_from_slice(prefix);
        k.extend_from_slice(key);
        k
    }

    /// Writes the write-through batch.
    fn write_pending(&mut self) {
        let Some(b) = &self.backing else { return };
        if self.pending.is_empty() {
            return;
        }
        let batch: Vec<_> = self
            .pending
            .iter()
            .map(|(k, v)| (Family::Aggregates, k.as_slice(), v.as_deref()))
            .collect();
        let result = b.store.write(&batch);
        self.stats.writes += self.pending.len() as u64;
        self.pending.clear();
        if let Err(e) = result {
            self.fail(e);
        }
    }

    fn queue_write(&mut self, key: &[u8], state: Option<&GroupState>) {
        let Some(b) = &self.backing else { return };
        let k = Self::store_key(&b.prefix, key);
        let v = state.map(|s| {
            let mut v = Vec::with_capacity(64);
            s.encode(&mut v);
            v
        });
        self.pending.push((k, v));
        if self.pending.len() >= PENDING_MAX {
            self.write_pending();
        }
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
                moved.push((
                    k.clone(),
                    std::mem::replace(
                        slot,
                        Slot {
                            state: None,
                            dirty: false,
                        },
                    ),
                ));
                false
            });
            for (k, slot) in moved {
                if slot.dirty {
                    self.queue_write(k.as_bytes(), slot.state.as_ref());
                }
                if let (Some(state), true) = (slot.state, config.l2_entries > 0) {
                    self.l2.insert(k, state);
                }
            }
        }
        if self.l2.len() > config.l2_entries {
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

    /// Brings `key` into L1 if it exists anywhere (or records that it does not).
    fn load(&mut self, key: &[u8]) {
        let Some(b) = &self.backing else { return };
        if self.l1.contains_key(key) {
            self.stats.l1_hits += 1;
            return;
        }
        let state = match self.l2.remove(key) {
            Some(s) => {
                self.stats.l2_hits += 1;
                Some(s)
            }
            None => {
                self.stats.misses += 1;
                let k = Self::store_key(&b.prefix, key);
                let store = b.store.clone();
                self.write_pending();
                match store.multi_get(Family::Aggregates, &[&k]) {
                    Ok(mut v) => match v.pop().flatten() {
                        Some(bytes) => match GroupState::decode(&bytes) {
                            Some(s) => Some(s),
                            None => {
                                self.fail(format!(
                                    "the state store holds an unreadable group state under key {k:02x?}"
                                ));
                                None
                            }
                        },
                        None => None,
                    },
                    Err(e) => {
                        self.fail(e);
                        None
                    }
                }
            }
        };
        self.make_room();
        self.l1.insert(
            PackedKey::new(key),
            Slot {
                state,
                dirty: false,
            },
        );
    }

    pub fn get(&mut self, key: &[u8]) -> Option<&GroupState> {
        self.load(key);
        self.l1.get(key).and_then(|s| s.state.as_ref())
    }

    pub fn get_mut(&mut self, key: &[u8]) -> Option<&mut GroupState> {
        self.load(key);
        let slot = self.l1.get_mut(key)?;
        let state = slot.state.as_mut()?;
        slot.dirty = true;
        Some(state)
    }

    /// The state of `key`, created with `make` if absent.
    pub fn entry(&mut self, key: &[u8], make: impl FnOnce() -> GroupState) -> &mut GroupState {
        self.load(key);
        let slot = self.l1.entry(PackedKey::new(key)).or_insert_with(|| Slot {
            state: None,
            dirty: false,
        });
        slot.dirty = true;
        slot.state.get_or_insert_with(make)
    }

    pub fn remove(&mut self, key: &[u8]) {
        if self.backing.is_none() {
            self.l1.remove(key);
            return;
        }
        self.l2.remove(key);
        self.l1.insert(
            PackedKey::new(key),
            Slot {
                state: None,
                dirty: true,
            },
        );
    }

    /// Every group with a state, in no particular order.
    pub fn entries(&mut self) -> Vec<(Vec<u8>, GroupState)> {
        let Some(b) = self.backing.clone() else {
            return self
                .l1
                .iter()
                .filter_map(|(k, s)| Some((k.as_bytes().to_vec(), s.state.clone()?)))
                .collect();
        };
        self.write_pending();
        let stored = match b.store.scan_prefix(Family::Aggregates, &b.prefix) {
            Ok(entries) => entries,
            Err(e) => {
                self.fail(e);
                Vec::new()
            }
        };
        let mut all: HashMap<Vec<u8>, GroupState> = HashMap::with_capacity(stored.len());
        for (k, v) in stored {
            match GroupState::decode(&v) {
                Some(s) => {
                    all.insert(k[b.prefix.len()..].to_vec(), s);
                }
                None => self.fail("the state store holds an unreadable group state"),
            }
        }
        for (k, slot) in &self.l1 {
            match &slot.state {
                Some(s) => {
                    all.insert(k.as_bytes().to_vec(), s.clone());
                }
                None => {
                    all.remove(k.as_bytes());
                }
            }
        }
        all.into_iter().collect()
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
        let entries = self.entries();
        self.l1.clear();
        self.l2.clear();
        for (k, mut s) in entries {
            f(&mut s);
            self.queue_write(&k, Some(&s));
        }
        self.write_pending();
    }

    /// Removes every state (the node goes away), from the store too.
    pub fn clear(&mut self) {
        if self.backing.is_some() {
            self.flush();
            for (k, _) in self.entries() {
                self.queue_write(&k, None);
            }
            self.write_pending();
        }
        self.l1.clear();
        self.l2.clear();
    }

    /// Writes every dirty L1 entry to the store (the synchronous stage of a checkpoint);
    /// returns how many were written.
    pub fn flush(&mut self) -> usize {
        let Some(prefix) = self.backing.as_ref().map(|b| b.prefix.clone()) else {
            return 0;
        };
        let mut written = 0;
        for (k, slot) in self.l1.iter_mut().filter(|(_, s)| s.dirty) {
            slot.dirty = false;
            let v = slot.state.as_ref().map(|s| {
                let mut v = Vec::with_capacity(64);
                s.encode(&mut v);
                v
            });
            self.pending
                .push((Self::store_key(&prefix, k.as_bytes()), v));
            written += 1;
        }
        self.write_pending();
        written
    }
}
