//! A hash map from packed group keys, split into parts by hash.
//!
//! Invariant: a key lives in the part its hash selects, and only there. A hash table
//! grows by moving every entry at once; split in `PARTS`, a growth moves one part's
//! entries, so the pause an event can meet stays a fraction of a millisecond even with
//! millions of groups. Each part is a plain hashbrown table searched with one hash, its
//! buckets starting on a cache line (`LineAligned`).

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use allocator_api2::alloc::{AllocError, Allocator, Global};
use hashbrown::hash_table::{Entry, HashTable};

use eddy_planner::prefetch;

use crate::exec::key::{Hashed, KeyRef, PackedKey};

/// Parts of a map (a power of two).
const PARTS: usize = 256;
/// The part comes from hash bits hashbrown does not use inside a part: it places by
/// the low bits and tags by the top seven.
const PART_SHIFT: u32 = 40;

/// Where an entry sits: its part and its bucket there. A place holds only until the map
/// changes.
pub type Pos = (usize, usize);

/// Bytes of a cache line.
pub const LINE: usize = 64;

/// Allocates a table's memory at the start of a cache line, and remembers the block it
/// gave last, which is the table's (a table allocates its new block before it frees the
/// old one), so a probe's control bytes can be asked for before the probe (`ctrl`).
///
/// A hashbrown table lays its buckets out back to back, ending where the control bytes
/// start, which is at a multiple of the bucket size from the allocation's start: a
/// bucket of a multiple of 64 bytes then fills whole lines, and a lookup never pays for
/// one more line than its entry has.
#[derive(Debug, Default)]
pub struct LineAligned {
    block: AtomicUsize,
    size: AtomicUsize,
}

impl Clone for LineAligned {
    /// A new table's allocator: it has given no block yet.
    fn clone(&self) -> Self {
        LineAligned::default()
    }
}

fn line_aligned(layout: Layout) -> Result<Layout, AllocError> {
    layout.align_to(LINE).map_err(|_| AllocError)
}

// SAFETY: every block comes from `Global` and goes back to it with the layout it was
// allocated with: the caller's, aligned to a line the same way both times.
#[allow(unsafe_code)]
unsafe impl Allocator for LineAligned {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let block = Global.allocate(line_aligned(layout)?)?;
        self.block
            .store(block.as_ptr() as *mut u8 as usize, Relaxed);
        self.size.store(layout.size(), Relaxed);
        Ok(block)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        let layout = line_aligned(layout).expect("aligned when it was allocated");
        // SAFETY: `ptr` was allocated by `allocate` above, from `Global` with this layout.
        unsafe { Global.deallocate(ptr, layout) }
    }
}

/// Control bytes after the last bucket's (hashbrown's `Group::WIDTH` with SSE2): a
/// probe reads a group of this many from its start.
pub const GROUP_WIDTH: usize = 16;

/// Where the control bytes of `table` start: they end its block, followed by
/// `GROUP_WIDTH` more (hashbrown's layout). `None` before any block. Only prefetches
/// use it: a hint at a wrong address costs time, never a result.
pub fn ctrl<T>(table: &HashTable<T, LineAligned>) -> Option<usize> {
    let a = table.allocator();
    let (block, size) = (a.block.load(Relaxed), a.size.load(Relaxed));
    let buckets = table.num_buckets();
    (block != 0 && size > buckets + GROUP_WIDTH).then(|| block + size - GROUP_WIDTH - buckets)
}

type Part<V> = HashTable<(PackedKey, V), LineAligned>;

pub struct SplitMap<V> {
    parts: Box<[Part<V>]>,
    len: usize,
}

impl<V> Default for SplitMap<V> {
    fn default() -> Self {
        SplitMap {
            parts: (0..PARTS)
                .map(|_| HashTable::new_in(LineAligned::default()))
                .collect(),
            len: 0,
        }
    }
}

impl<V> SplitMap<V> {
    fn part(hash: u64) -> usize {
        (hash >> PART_SHIFT) as usize & (PARTS - 1)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, Hashed { key, hash: h }: Hashed<'_>) -> Option<&V> {
        self.parts[Self::part(h)]
            .find(h, |(k, _)| key.matches(k.as_bytes()))
            .map(|(_, v)| v)
    }

    /// The place of `key`'s entry: one probe, then `at_mut` reaches it without another
    /// (for a caller that must change the map between finding and using an entry,
    /// which a borrowed entry would not allow).
    pub fn find(&self, Hashed { key, hash: h }: Hashed<'_>) -> Option<Pos> {
        let part = Self::part(h);
        self.parts[part]
            .find_bucket_index(h, |(k, _)| key.matches(k.as_bytes()))
            .map(|bucket| (part, bucket))
    }

    /// Asks for the control bytes a probe for hash `h` reads first, without reading
    /// anything: the first of a lookup's two dependent misses. A `prefetch` of the same
    /// hash once they arrived then finds the entry without waiting.
    #[inline]
    pub fn prefetch_probe(&self, h: u64) {
        let part = &self.parts[Self::part(h)];
        if let Some(ctrl) = ctrl(part) {
            prefetch::address(ctrl + (h as usize & (part.num_buckets() - 1)), GROUP_WIDTH);
        }
    }

    /// Asks for the cache lines of the first `bytes` bytes of the entry `key` (hash
    /// `h`) would occupy, without comparing keys: the control bytes are read (best
    /// asked for earlier, `prefetch_probe`), and the first bucket whose tag matches is
    /// prefetched. The caller goes on with other work while it arrives; a later `find`
    /// or `get_mut` of the key then meets it in cache.
    pub fn prefetch(&self, h: u64, bytes: usize) {
        if let Some(entry) = self.first_tagged(h) {
            prefetch::first_lines(entry, bytes);
        }
    }

    /// The value of the first entry whose tag matches hash `h`'s, found without comparing
    /// keys: most likely the key's, possibly another's. Only for prefetches, which hint.
    pub fn likely(&self, h: u64) -> Option<&V> {
        self.first_tagged(h).map(|(_, v)| v)
    }

    fn first_tagged(&self, h: u64) -> Option<&(PackedKey, V)> {
        let part = &self.parts[Self::part(h)];
        part.find_bucket_index(h, |_| true)
            .and_then(|i| part.get_bucket(i))
    }

    /// The value at a place `find` or `insert_new` gave, the map unchanged since.
    pub fn at(&self, (part, bucket): Pos) -> &V {
        &self.parts[part]
            .get_bucket(bucket)
            .expect("a place taken since the map last changed")
            .1
    }

    /// The value at a place `find` or `insert_new` gave, the map unchanged since.
    pub fn at_mut(&mut self, (part, bucket): Pos) -> &mut V {
        &mut self.parts[part]
            .get_bucket_mut(bucket)
            .expect("a place taken since the map last changed")
            .1
    }

    /// Adds an entry for a key that has none, its hash `h`; returns its place.
    pub fn insert_new(&mut self, h: u64, key: PackedKey, value: V) -> Pos {
        let part = Self::part(h);
        let bucket = self.parts[part]
            .insert_unique(h, (key, value), |(k, _)| rehash(k))
            .bucket_index();
        self.len += 1;
        (part, bucket)
    }

    pub fn get_mut(&mut self, Hashed { key, hash: h }: Hashed<'_>) -> Option<&mut V> {
        self.parts[Self::part(h)]
            .find_mut(h, |(k, _)| key.matches(k.as_bytes()))
            .map(|(_, v)| v)
    }

    /// The value of `key`, made by `make` if absent.
    pub fn get_or_insert_with(
        &mut self,
        Hashed { key, hash: h }: Hashed<'_>,
        make: impl FnOnce() -> V,
    ) -> &mut V {
        // A probe, then an insert only for a new key: hashbrown's `entry` costs a lookup
        // that finds the key (every event's) about 30 instructions more.
        let part = &mut self.parts[Self::part(h)];
        let bucket = match part.find_bucket_index(h, |(k, _)| key.matches(k.as_bytes())) {
            Some(bucket) => bucket,
            None => {
                self.len += 1;
                part.insert_unique(h, (key.to_packed(), make()), |(k, _)| rehash(k))
                    .bucket_index()
            }
        };
        &mut part
            .get_bucket_mut(bucket)
            .expect("a bucket just found or filled")
            .1
    }

    /// Sets `key`'s value; returns the old one.
    pub fn insert(&mut self, key: PackedKey, value: V) -> Option<V> {
        let h = rehash(&key);
        let entry = self.parts[Self::part(h)].entry(h, |(k, _)| *k == key, |(k, _)| rehash(k));
        match entry {
            Entry::Occupied(mut e) => Some(std::mem::replace(&mut e.get_mut().1, value)),
            Entry::Vacant(e) => {
                self.len += 1;
                e.insert((key, value));
                None
            }
        }
    }

    pub fn remove(&mut self, Hashed { key, hash: h }: Hashed<'_>) -> Option<V> {
        let found = self.parts[Self::part(h)].find_entry(h, |(k, _)| key.matches(k.as_bytes()));
        let ((_, v), _) = found.ok()?.remove();
        self.len -= 1;
        Some(v)
    }

    /// Keeps the entries for which `keep` is true, visiting parts in order.
    pub fn retain(&mut self, mut keep: impl FnMut(&PackedKey, &mut V) -> bool) {
        for part in self.parts.iter_mut() {
            let before = part.len();
            part.retain(|(k, v)| keep(k, v));
            self.len -= before - part.len();
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&PackedKey, &V)> {
        self.parts
            .iter()
            .flat_map(|p| p.iter().map(|(k, v)| (k, v)))
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&PackedKey, &mut V)> {
        self.parts
            .iter_mut()
            .flat_map(|p| p.iter_mut().map(|(k, v)| (&*k, v)))
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.iter_mut().map(|(_, v)| v)
    }

    pub fn clear(&mut self) {
        for part in self.parts.iter_mut() {
            *part = HashTable::new_in(LineAligned::default());
        }
        self.len = 0;
    }
}

/// A stored key's hash, as its lookups compute it (`KeyRef::hash`).
fn rehash(key: &PackedKey) -> u64 {
    KeyRef::Packed(key.as_bytes()).hash()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// An entry of a multiple of 64 bytes fills whole cache lines: each starts on one.
    #[test]
    fn entries_start_on_a_cache_line() {
        let mut m: SplitMap<[u8; 40]> = SplitMap::default();
        assert_eq!(std::mem::size_of::<(PackedKey, [u8; 40])>(), LINE);
        for i in 0..5_000u32 {
            m.insert(PackedKey::new(&i.to_le_bytes()), [7; 40]);
        }
        let key_at = std::mem::offset_of!((PackedKey, [u8; 40]), 0);
        for (k, _) in m.iter() {
            assert_eq!((k as *const PackedKey as usize - key_at) % LINE, 0);
        }
    }

    /// `ctrl` follows hashbrown's layout: bucket `i` of a part ends where bucket `i - 1`
    /// starts, the first ending at the control bytes, so the addresses a probe's
    /// prefetch asks for are the ones its lookup reads.
    #[test]
    fn ctrl_addresses_a_part_as_hashbrown_lays_it_out() {
        let mut m: SplitMap<[u8; 40]> = SplitMap::default();
        assert!(m.parts.iter().all(|p| ctrl(p).is_none()));
        for i in 0..20_000u32 {
            let key = PackedKey::new(&i.to_le_bytes());
            m.insert(key.clone(), [1; 40]);
            let (part, bucket) = m.find(key.as_bytes().into()).expect("inserted");
            let ctrl = ctrl(&m.parts[part]).expect("allocated");
            let at = m.parts[part].get_bucket(bucket).expect("full") as *const _ as usize;
            assert_eq!(at, ctrl - (bucket + 1) * LINE);
        }
    }

    #[test]
    fn behaves_as_a_map() {
        let mut m: SplitMap<u32> = SplitMap::default();
        let mut model: BTreeMap<Vec<u8>, u32> = BTreeMap::new();
        let key = |i: u32| format!("card-{}", i % 5000).into_bytes();
        for i in 0..40_000u32 {
            let k = key(i.wrapping_mul(2_654_435_761));
            match i % 5 {
                0 => assert_eq!(m.remove(k[..].into()), model.remove(&k)),
                1 => assert_eq!(m.insert(PackedKey::new(&k), i), model.insert(k.clone(), i)),
                2 => *m.get_or_insert_with(k[..].into(), || 7) += 1,
                _ => assert_eq!(m.get(k[..].into()), model.get(&k)),
            }
            if i % 5 == 2 {
                *model.entry(k).or_insert(7) += 1;
            }
            if i % 10_000 == 9_999 {
                m.retain(|k, v| !(k.as_bytes().len() + *v as usize).is_multiple_of(3));
                model.retain(|k, v| !(k.len() + *v as usize).is_multiple_of(3));
            }
            assert_eq!(m.len(), model.len());
        }
        let mut all: Vec<(Vec<u8>, u32)> =
            m.iter().map(|(k, v)| (k.as_bytes().to_vec(), *v)).collect();
        all.sort();
        assert_eq!(all, model.into_iter().collect::<Vec<_>>());
        m.clear();
        assert!(m.is_empty() && m.iter().next().is_none());
    }
}
