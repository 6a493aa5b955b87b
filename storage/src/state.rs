//! The state store: aggregate state by key, read and written in batches, in column
//! families by kind of state. `RocksStore` is the node's RocksDB database; `MemStateStore`
//! is the in-memory model the tests hold it to.
//!
//! Invariants: the API is batch-only (`multi_get` / `write`), so a store backed by an
//! external engine pays one call per batch, never one per event; a `write` is atomic
//! (all of its puts and deletes, across families, or none); after `sync` returns, every
//! write before it survives a crash of the process.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};

/// The kinds of state, one column family each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// Aggregate state per (aggregator leaf, group key).
    Aggregates,
    /// Value → count ordered multisets (MIN, MAX, COUNT DISTINCT, percentiles).
    Extremes,
    /// Checkpoint records and other bookkeeping.
    Meta,
}

impl Family {
    pub const ALL: [Family; 3] = [Family::Aggregates, Family::Extremes, Family::Meta];

    pub fn name(self) -> &'static str {
        match self {
            Family::Aggregates => "aggregates",
            Family::Extremes => "extremes",
            Family::Meta => "meta",
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("state store: {0}")]
pub struct StateError(pub String);

impl StateError {
    /// Whether RocksDB found no room (ENOSPC or EDQUOT, in the text it gives).
    pub fn is_disk_full(&self) -> bool {
        ["No space left on device", "Disk quota exceeded", "NoSpace"]
            .iter()
            .any(|m| self.0.contains(m))
    }
}

/// One put (`Some`) or delete (`None`) of a write batch.
pub type Put<'a> = (Family, &'a [u8], Option<&'a [u8]>);

/// A put or delete that owns its bytes.
pub type OwnedPut = (Family, Vec<u8>, Option<Vec<u8>>);

/// Borrows an owned batch as `Put`s.
fn puts(batch: &[OwnedPut]) -> Vec<Put<'_>> {
    batch
        .iter()
        .map(|(f, k, v)| (*f, k.as_slice(), v.as_deref()))
        .collect()
}

/// Key-value pairs in key order.
pub type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// A key and its value as RocksDB hands them out.
type DbEntry = (Box<[u8]>, Box<[u8]>);

/// Keyed byte state with batch reads and writes.
pub trait StateStore: Send + Sync {
    /// The values of `keys` in `family`, in the same order.
    fn multi_get(&self, family: Family, keys: &[&[u8]])
        -> Result<Vec<Option<Vec<u8>>>, StateError>;

    /// Applies every put and delete atomically.
    fn write(&self, batch: &[Put<'_>]) -> Result<(), StateError>;

    /// `write`, taking the bytes: a store that keeps them (a held `RocksStore`) does not
    /// copy them.
    fn write_owned(&self, batch: Vec<OwnedPut>) -> Result<(), StateError> {
        self.write(&puts(&batch))
    }

    /// Every entry of `family` whose key starts with `prefix`, in key order.
    fn scan_prefix(&self, family: Family, prefix: &[u8]) -> Result<Entries, StateError>;

    /// Whether `family` may hold a key starting with `prefix`: false only when it holds
    /// none (a store may answer true when unsure). Cheap where it is overridden: one seek.
    fn holds_prefix(&self, family: Family, prefix: &[u8]) -> Result<bool, StateError> {
        Ok(!self.scan_prefix(family, prefix)?.is_empty())
    }

    /// Makes every write so far durable.
    fn sync(&self) -> Result<(), StateError>;
}

type FamilyKey = (Family, Vec<u8>);

/// The in-memory state store: an ordered map per family.
#[derive(Default)]
pub struct MemStateStore {
    entries: Mutex<BTreeMap<FamilyKey, Vec<u8>>>,
}

impl StateStore for MemStateStore {
    fn multi_get(
        &self,
        family: Family,
        keys: &[&[u8]],
    ) -> Result<Vec<Option<Vec<u8>>>, StateError> {
        let entries = self.entries.lock().expect("state lock");
        Ok(keys
            .iter()
            .map(|k| entries.get(&(family, k.to_vec())).cloned())
            .collect())
    }

    fn write(&self, batch: &[Put<'_>]) -> Result<(), StateError> {
        let mut entries = self.entries.lock().expect("state lock");
        for (family, k, v) in batch {
            match v {
                Some(v) => {
                    entries.insert((*family, k.to_vec()), v.to_vec());
                }
                None => {
                    entries.remove(&(*family, k.to_vec()));
                }
            }
        }
        Ok(())
    }

    fn scan_prefix(&self, family: Family, prefix: &[u8]) -> Result<Entries, StateError> {
        let entries = self.entries.lock().expect("state lock");
        Ok(entries
            .range((family, prefix.to_vec())..)
            .take_while(|((f, k), _)| *f == family && k.starts_with(prefix))
            .map(|((_, k), v)| (k.clone(), v.clone()))
            .collect())
    }

    fn sync(&self) -> Result<(), StateError> {
        Ok(())
    }
}

/// The node's RocksDB database, one column family per `Family`.
///
/// A checkpoint must copy the state of the moment each shard paused, yet no shard should
/// wait for the copy, nor for the other shards. So the store can be *held* for a number
/// of writers (one per shard, each with its `StoreWriter`): writes then land in the
/// writer's part of an in-memory overlay that reads consult first. `freeze(w)` (while
/// writer `w` is paused) makes what its part holds its *cut*; `w` goes on at once.
/// `checkpoint` writes every cut to the database before copying it, and later writes
/// stay in the overlay until `release` applies them. (Recovery starts from a copy, never
/// from the database itself, so a release cut short by a crash loses nothing.)
///
/// A writer owns its keys: while the store is held, no two writers write the same key.
///
/// A write the database refuses (a full disk) holds the store too: the writes stay in
/// the overlay, where reads find them, until a checkpoint writes them and releases it. A
/// failed `release` leaves the store held with every write it had, for the next
/// checkpoint to try again: no write is ever dropped.
pub struct RocksStore {
    db: rocksdb::DB,
    held: RwLock<Option<Held>>,
    /// One more than the highest writer id handed out.
    writers: std::sync::atomic::AtomicUsize,
}

/// Writes made while the store is held: a value, or `None` for a delete.
type Overlay = BTreeMap<FamilyKey, Option<Vec<u8>>>;

/// One writer's writes while the store is held.
#[derive(Default)]
struct Part {
    /// Writes up to the writer's last freeze: they belong in the next checkpoint.
    cut: Arc<Overlay>,
    /// Writes after the cut.
    live: Overlay,
}

impl Part {
    /// What this part says of a key: `None` if it does not know it.
    fn get(&self, k: &FamilyKey) -> Option<Option<Vec<u8>>> {
        self.live.get(k).or_else(|| self.cut.get(k)).cloned()
    }

    /// The writes of `family` under `prefix`, the cut's before the live ones.
    fn scan<'a>(
        &'a self,
        family: Family,
        prefix: &'a [u8],
    ) -> impl Iterator<Item = (&'a Vec<u8>, &'a Option<Vec<u8>>)> {
        [&*self.cut, &self.live]
            .into_iter()
            .flat_map(move |overlay| {
                overlay
                    .range((family, prefix.to_vec())..)
                    .take_while(move |((f, k), _)| *f == family && k.starts_with(prefix))
                    .map(|((_, k), v)| (k, v))
            })
    }
}

struct Held {
    parts: Vec<Mutex<Part>>,
}

impl Held {
    fn new(writers: usize) -> Held {
        Held {
            parts: (0..writers.max(1)).map(|_| Mutex::default()).collect(),
        }
    }

    fn part(&self, writer: usize) -> std::sync::MutexGuard<'_, Part> {
        self.parts
            .get(writer)
            .unwrap_or_else(|| panic!("writer {writer} of a store held for {}", self.parts.len()))
            .lock()
            .expect("overlay lock")
    }

    fn freeze(&self, writer: usize) {
        let mut part = self.part(writer);
        let live = std::mem::take(&mut part.live);
        Arc::make_mut(&mut part.cut).extend(live);
    }

    /// The other writers' parts, then `writer`'s.
    fn parts_ending_with(&self, writer: usize) -> impl DoubleEndedIterator<Item = &Mutex<Part>> {
        let own = &self.parts[writer];
        self.parts
            .iter()
            .filter(move |p| !std::ptr::eq(*p, own))
            .chain(std::iter::once(own))
    }
}

fn batch_of(overlay: &Overlay) -> impl Iterator<Item = Put<'_>> {
    overlay
        .iter()
        .map(|((f, k), v)| (*f, k.as_slice(), v.as_deref()))
}

/// The smallest key above every key that starts with `prefix`; `None` when there is
/// none (all 0xFF).
fn successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xFF {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// A committed checkpoint of a `RocksStore`, opened read-only: what a node sends a peer
/// that recovers a task from it.
pub struct FrozenStore {
    db: rocksdb::DB,
}

impl FrozenStore {
    pub fn open(path: &Path) -> Result<FrozenStore, StateError> {
        let options = rocksdb::Options::default();
        let names = Family::ALL.iter().map(|f| f.name());
        let db = rocksdb::DB::open_cf_for_read_only(&options, path, names, false)
            .map_err(rocks_error)?;
        Ok(FrozenStore { db })
    }

    fn cf(&self, family: Family) -> &rocksdb::ColumnFamily {
        self.db
            .cf_handle(family.name())
            .expect("every family is in a checkpoint")
    }

    pub fn get(&self, family: Family, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        self.db.get_cf(self.cf(family), key).map_err(rocks_error)
    }

    /// Calls `f` with every entry of `family` under `prefix`, in key order, one at a
    /// time (memory stays bounded), until it returns false.
    pub fn for_prefix(
        &self,
        family: Family,
        prefix: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StateError> {
        let mode = rocksdb::IteratorMode::From(prefix, rocksdb::Direction::Forward);
        for entry in self.db.iterator_cf(self.cf(family), mode) {
            let (k, v) = entry.map_err(rocks_error)?;
            if !k.starts_with(prefix) || !f(&k, &v) {
                break;
            }
        }
        Ok(())
    }
}

fn rocks_error(e: rocksdb::Error) -> StateError {
    StateError(e.into_string())
}

/// RocksDB's memory: the bounds of its memtables and block cache.
#[derive(Clone, Copy, Debug)]
pub struct RocksConfig {
    /// Bytes of one memtable of a column family (each family has at most two).
    pub write_buffer_bytes: usize,
    /// Bytes of the block cache all families share.
    pub block_cache_bytes: usize,
}

impl Default for RocksConfig {
    fn default() -> Self {
        RocksConfig {
            write_buffer_bytes: 16 << 20,
            block_cache_bytes: 32 << 20,
        }
    }
}

impl RocksStore {
    /// Opens (or creates) the database in `path`, with the default memory bounds.
    pub fn open(path: &Path) -> Result<RocksStore, StateError> {
        RocksStore::open_with(path, RocksConfig::default())
    }

    /// Opens (or creates) the database in `path` within `config`'s memory bounds.
    pub fn open_with(path: &Path, config: RocksConfig) -> Result<RocksStore, StateError> {
        let mut options = rocksdb::Options::default();
        options.create_if_missing(true);
        options.create_missing_column_families(true);
        options.set_compression_type(rocksdb::DBCompressionType::Lz4);

        // Flushes and compactions yield the CPU to the shards: a checkpoint's memtable
        // flush must not delay events.
        let mut env = rocksdb::Env::new().map_err(rocks_error)?;
        env.lower_thread_pool_cpu_priority();
        env.lower_high_priority_thread_pool_cpu_priority();
        options.set_env(&env);
        let cache = rocksdb::Cache::new_lru_cache(config.block_cache_bytes);
        let families = Family::ALL.iter().map(|f| {
            let mut cf = rocksdb::Options::default();
            cf.set_compression_type(rocksdb::DBCompressionType::Lz4);
            cf.set_write_buffer_size(config.write_buffer_bytes);
            cf.set_max_write_buffer_number(2);
            // A group seen for the first time is looked up before it is made: most
            // lookups of a growing key set miss. Bloom filters answer a miss without a
            // search: the memtable's (whole keys, in 2 % of its bytes) skips the skip
            // list, and each table file's (10 bits a key, 1 % false positives) its blocks.
            cf.set_memtable_prefix_bloom_ratio(0.02);
            cf.set_memtable_whole_key_filtering(true);
            let mut table = rocksdb::BlockBasedOptions::default();
            table.set_block_cache(&cache);
            table.set_bloom_filter(10.0, false);
            table.set_whole_key_filtering(true);
            // Filters and indexes live in the block cache, within its bound; level 0's
            // stay pinned there, since every lookup reads them.
            table.set_cache_index_and_filter_blocks(true);
            table.set_pin_l0_filter_and_index_blocks_in_cache(true);
            cf.set_block_based_table_factory(&table);
            rocksdb::ColumnFamilyDescriptor::new(f.name(), cf)
        });
        // The unused default family, with a memtable bound too: after a write finds the
        // disk full, RocksDB resumes by itself once the largest memtable of any family
        // fits in the free space (64 MiB by RocksDB's default).
        let mut unused = rocksdb::Options::default();
        unused.set_write_buffer_size(config.write_buffer_bytes);
        let families = families.chain(std::iter::once(rocksdb::ColumnFamilyDescriptor::new(
            rocksdb::DEFAULT_COLUMN_FAMILY_NAME,
            unused,
        )));
        let db = rocksdb::DB::open_cf_descriptors(&options, path, families).map_err(rocks_error)?;
        Ok(RocksStore {
            db,
            held: RwLock::new(None),
            writers: Default::default(),
        })
    }

    /// Replaces every entry under `prefix` in `families` with the batches `next` gives
    /// (until it gives `None`), straight in the database; returns how many entries were
    /// written. For a task given a checkpoint from elsewhere, while no writer touches its
    /// keys. Fails while the store is held: a checkpoint would see half of it.
    pub fn replace_prefix(
        &self,
        families: &[Family],
        prefix: &[u8],
        next: &mut dyn FnMut() -> Result<Option<Vec<OwnedPut>>, StateError>,
    ) -> Result<u64, StateError> {
        let held = self.held.read().expect("hold lock");
        if held.is_some() {
            return Err(StateError("the store is held by a checkpoint".into()));
        }
        for family in families {
            let cf = self.cf(*family);
            match successor(prefix) {
                Some(end) => self
                    .db
                    .delete_range_cf(cf, prefix, &end)
                    .map_err(rocks_error)?,
                None => {
                    let keys: Vec<Box<[u8]>> = self
                        .db
                        .prefix_iterator_cf(cf, prefix)
                        .map_while(|r| r.ok())
                        .take_while(|(k, _)| k.starts_with(prefix))
                        .map(|(k, _)| k)
                        .collect();
                    for k in keys {
                        self.db.delete_cf(cf, k).map_err(rocks_error)?;
                    }
                }
            }
        }
        let mut written = 0;
        while let Some(batch) = next()? {
            written += batch.len() as u64;
            self.write_db(&puts(&batch))?;
        }
        Ok(written)
    }

    /// Writer `id`'s handle on the store: reads and writes go through writers.
    pub fn writer(self: &Arc<Self>, id: usize) -> StoreWriter {
        self.writers
            .fetch_max(id + 1, std::sync::atomic::Ordering::SeqCst);
        StoreWriter {
            store: self.clone(),
            id,
        }
    }

    fn cf(&self, family: Family) -> &rocksdb::ColumnFamily {
        self.db
            .cf_handle(family.name())
            .expect("every family is created at open")
    }

    /// Stops RocksDB's flushes and compactions and waits for them: the last call at
    /// shutdown, so no background job outlives the process's static destructors.
    pub fn close(&self) {
        self.db.cancel_all_background_work(true);
    }

    /// A consistent copy of the database in `dir` (hard links where possible). Every cut
    /// (when the store is held), then `last`, are written to the database first, in one
    /// atomic batch: `last` belongs to the cuts but was made after them.
    pub fn checkpoint(&self, dir: &Path, last: &[Put<'_>]) -> Result<(), StateError> {
        let held = self.held.read().expect("hold lock");
        match held.as_ref() {
            Some(h) => self.write_cuts(h, last)?,
            None if !last.is_empty() => self.write_db(last)?,
            None => {}
        }
        rocksdb::checkpoint::Checkpoint::new(&self.db)
            .and_then(|c| c.create_checkpoint(dir))
            .map_err(rocks_error)
    }

    /// Writes every cut, then `last`, to the database in one atomic batch, and drops the
    /// cuts from the overlay (reads find them in the database). The writers go on.
    fn write_cuts(&self, h: &Held, last: &[Put<'_>]) -> Result<(), StateError> {
        // The cuts are shared, not copied: their writers go on meanwhile.
        let cuts: Vec<Arc<Overlay>> = h
            .parts
            .iter()
            .map(|p| p.lock().expect("overlay lock").cut.clone())
            .collect();
        let batch: Vec<Put<'_>> = cuts
            .iter()
            .flat_map(|c| batch_of(c))
            .chain(last.iter().copied())
            .collect();
        if !batch.is_empty() {
            self.write_db(&batch)?;
        }
        for (part, cut) in h.parts.iter().zip(&cuts) {
            let mut part = part.lock().expect("overlay lock");
            if Arc::ptr_eq(&part.cut, cut) {
                part.cut = Arc::default();
            }
        }
        Ok(())
    }

    /// From now on, the writers `0..writers` write to the overlay and leave the database
    /// as it is. A store still held (a failed write or release) keeps what it holds.
    pub fn hold(&self, writers: usize) {
        let mut held = self.held.write().expect("hold lock");
        match held.as_mut() {
            None => *held = Some(Held::new(writers)),
            Some(h) => {
                while h.parts.len() < writers {
                    h.parts.push(Mutex::default());
                }
            }
        }
    }

    /// Whether writes wait in the overlay now (a checkpoint runs, or the database
    /// refused a write and the next checkpoint has yet to write it).
    pub fn is_held(&self) -> bool {
        self.held.read().expect("hold lock").is_some()
    }

    /// Makes every write of `writer` so far part of the next checkpoint (a no-op when
    /// the store is not held). The other writers are not stopped.
    pub fn freeze(&self, writer: usize) {
        let held = self.held.read().expect("hold lock");
        if let Some(h) = held.as_ref() {
            h.freeze(writer);
        }
    }

    /// Applies the overlay to the database, and writes go to the database again. The
    /// writers go on while most of it is written; they wait only while the writes they
    /// made meanwhile are, in one atomic batch.
    pub fn release(&self) -> Result<(), StateError> {
        if let Some(h) = self.held.read().expect("hold lock").as_ref() {
            for writer in 0..h.parts.len() {
                h.freeze(writer);
            }
            self.write_cuts(h, &[])?;
        }
        let mut held = self.held.write().expect("hold lock");
        let Some(h) = held.as_mut() else {
            return Ok(());
        };
        let parts: Vec<&Part> = h
            .parts
            .iter_mut()
            .map(|p| &*p.get_mut().expect("overlay lock"))
            .collect();
        let batch: Vec<Put<'_>> = parts
            .iter()
            .flat_map(|p| batch_of(&p.cut).chain(batch_of(&p.live)))
            .collect();
        if !batch.is_empty() {
            // On failure the store stays held, with all of it.
            self.write_db(&batch)?;
        }
        *held = None;
        Ok(())
    }

    fn write_db(&self, batch: &[Put<'_>]) -> Result<(), StateError> {
        let mut wb = rocksdb::WriteBatch::default();
        for (family, k, v) in batch {
            let cf = self.cf(*family);
            match v {
                Some(v) => wb.put_cf(cf, k, v),
                None => wb.delete_cf(cf, k),
            }
        }
        // No write-ahead log: recovery never reads the live database (it starts from a
        // checkpoint, which flushes the memtables first), so RocksDB's log would be a
        // second copy of the event log's work, and one more file to fill a disk.
        let mut options = rocksdb::WriteOptions::default();
        options.disable_wal(true);
        self.db.write_opt(wb, &options).map_err(rocks_error)
    }

    fn multi_get_db(
        &self,
        family: Family,
        keys: &[&[u8]],
    ) -> Result<Vec<Option<Vec<u8>>>, StateError> {
        let cf = self.cf(family);
        if let [key] = keys {
            // One key, the common case (a group loaded on a miss): a plain read spares
            // MultiGet's batching.
            return Ok(vec![self
                .db
                .get_pinned_cf(cf, key)
                .map_err(rocks_error)?
                .map(|v| v.to_vec())]);
        }
        self.db
            .multi_get_cf(keys.iter().map(|k| (cf, *k)))
            .into_iter()
            .map(|r| r.map_err(rocks_error))
            .collect()
    }

    fn multi_get_as(
        &self,
        writer: usize,
        family: Family,
        keys: &[&[u8]],
    ) -> Result<Vec<Option<Vec<u8>>>, StateError> {
        let held = self.held.read().expect("hold lock");
        let Some(h) = held.as_ref() else {
            return self.multi_get_db(family, keys);
        };
        let mut out: Vec<Option<Option<Vec<u8>>>> = vec![None; keys.len()];
        let overlay_keys: Vec<FamilyKey> = keys.iter().map(|k| (family, k.to_vec())).collect();
        // The writer's own part first: it owns the keys it reads, as a rule.
        for part in h.parts_ending_with(writer).rev() {
            let part = part.lock().expect("overlay lock");
            for (o, k) in out.iter_mut().zip(&overlay_keys) {
                if o.is_none() {
                    *o = part.get(k);
                }
            }
        }
        let misses: Vec<&[u8]> = keys
            .iter()
            .zip(&out)
            .filter(|(_, o)| o.is_none())
            .map(|(k, _)| *k)
            .collect();
        let mut found = self.multi_get_db(family, &misses)?.into_iter();
        for o in &mut out {
            if o.is_none() {
                *o = Some(found.next().flatten());
            }
        }
        Ok(out.into_iter().map(Option::flatten).collect())
    }

    fn write_as(&self, writer: usize, batch: Vec<OwnedPut>) -> Result<(), StateError> {
        {
            let held = self.held.read().expect("hold lock");
            if let Some(h) = held.as_ref() {
                h.part(writer)
                    .live
                    .extend(batch.into_iter().map(|(f, k, v)| ((f, k), v)));
                return Ok(());
            }
            match self.write_db(&puts(&batch)) {
                Ok(()) => return Ok(()),
                Err(e) => tracing::warn!(
                    "{e}; state writes wait in memory until a checkpoint can write them"
                ),
            }
        }
        // The writer's other keys are in the database or in its part; no reader sees
        // this batch until it is in the part, as no reader saw it before the write.
        let writers = self.writers.load(std::sync::atomic::Ordering::SeqCst);
        self.hold(writers.max(writer + 1));
        self.write_as(writer, batch)
    }

    fn scan_prefix_as(
        &self,
        writer: usize,
        family: Family,
        prefix: &[u8],
    ) -> Result<Entries, StateError> {
        let held = self.held.read().expect("hold lock");
        // The overlay before the database: a checkpoint may meanwhile write a cut to the
        // database and drop it from the overlay, and read in the other order, that cut
        // would be in neither. Read in this order, it is in both, which is the same.
        let mut overlay = Vec::new();
        for part in held.iter().flat_map(|h| h.parts_ending_with(writer)) {
            let part = part.lock().expect("overlay lock");
            overlay.extend(
                part.scan(family, prefix)
                    .map(|(k, v)| (k.clone(), v.clone())),
            );
        }
        let mut out = BTreeMap::new();
        for item in self.db_prefix(family, prefix) {
            let (k, v) = item?;
            out.insert(k.to_vec(), v.to_vec());
        }
        for (k, v) in overlay {
            match v {
                Some(v) => out.insert(k, v),
                None => out.remove(&k),
            };
        }
        Ok(out.into_iter().collect())
    }

    /// The database's entries of `family` whose key starts with `prefix`, in key order.
    fn db_prefix<'a>(
        &'a self,
        family: Family,
        prefix: &'a [u8],
    ) -> impl Iterator<Item = Result<DbEntry, StateError>> + 'a {
        let mode = rocksdb::IteratorMode::From(prefix, rocksdb::Direction::Forward);
        self.db
            .iterator_cf(self.cf(family), mode)
            .map(|item| item.map_err(rocks_error))
            // An error is handed on: the callers stop at it.
            .take_while(move |item| !matches!(item, Ok((k, _)) if !k.starts_with(prefix)))
    }

    /// `StateStore::holds_prefix` as writer `writer` reads: the overlay it reads, then
    /// the database (the order of `scan_prefix_as`). Any overlay entry under the prefix
    /// counts, a deletion too: it may stand for a key.
    fn holds_prefix_as(
        &self,
        writer: usize,
        family: Family,
        prefix: &[u8],
    ) -> Result<bool, StateError> {
        let held = self.held.read().expect("hold lock");
        for part in held.iter().flat_map(|h| h.parts_ending_with(writer)) {
            if part
                .lock()
                .expect("overlay lock")
                .scan(family, prefix)
                .next()
                .is_some()
            {
                return Ok(true);
            }
        }
        Ok(self.db_prefix(family, prefix).next().transpose()?.is_some())
    }
}

fn owned(batch: &[Put<'_>]) -> Vec<OwnedPut> {
    batch
        .iter()
        .map(|(f, k, v)| (*f, k.to_vec(), v.map(<[u8]>::to_vec)))
        .collect()
}

/// One writer's handle on a `RocksStore`: while the store is held, its writes go to its
/// own part of the overlay, which `RocksStore::freeze` cuts without the other writers.
pub struct StoreWriter {
    store: Arc<RocksStore>,
    id: usize,
}

impl StateStore for StoreWriter {
    fn multi_get(
        &self,
        family: Family,
        keys: &[&[u8]],
    ) -> Result<Vec<Option<Vec<u8>>>, StateError> {
        self.store.multi_get_as(self.id, family, keys)
    }

    fn write(&self, batch: &[Put<'_>]) -> Result<(), StateError> {
        self.store.write_as(self.id, owned(batch))
    }

    fn write_owned(&self, batch: Vec<OwnedPut>) -> Result<(), StateError> {
        self.store.write_as(self.id, batch)
    }

    fn scan_prefix(&self, family: Family, prefix: &[u8]) -> Result<Entries, StateError> {
        self.store.scan_prefix_as(self.id, family, prefix)
    }

    fn holds_prefix(&self, family: Family, prefix: &[u8]) -> Result<bool, StateError> {
        self.store.holds_prefix_as(self.id, family, prefix)
    }

    fn sync(&self) -> Result<(), StateError> {
        // Writes skip RocksDB's log: they are durable once flushed to table files.
        for family in Family::ALL {
            let store = &self.store;
            store.db.flush_cf(store.cf(family)).map_err(rocks_error)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_put_get_delete_scan() {
        let s = MemStateStore::default();
        s.write(&[
            (Family::Aggregates, b"a/1", Some(b"x")),
            (Family::Aggregates, b"a/2", Some(b"y")),
            (Family::Extremes, b"a/3", Some(b"w")),
            (Family::Aggregates, b"b/1", Some(b"z")),
        ])
        .unwrap();
        assert_eq!(
            s.multi_get(Family::Aggregates, &[b"a/2", b"c", b"a/3"])
                .unwrap(),
            vec![Some(b"y".to_vec()), None, None]
        );
        s.write(&[(Family::Aggregates, b"a/1", None)]).unwrap();
        assert_eq!(
            s.scan_prefix(Family::Aggregates, b"a/").unwrap(),
            vec![(b"a/2".to_vec(), b"y".to_vec())]
        );
    }

    /// A small deterministic generator.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    fn key(rng: &mut Rng) -> Vec<u8> {
        // Few distinct keys with shared prefixes, so that overwrites, deletes of present
        // keys and prefix scans all happen often.
        let group = rng.below(4) as u8;
        let n = rng.below(40) as u8;
        vec![b'g', group, b'/', n]
    }

    /// Writers of the held store in the model test; a key's group says whose it is.
    const WRITERS: usize = 2;

    fn writer_of(key: &[u8]) -> usize {
        key[1] as usize % WRITERS
    }

    /// A key of writer `w`.
    fn key_of(rng: &mut Rng, w: usize) -> Vec<u8> {
        let mut k = key(rng);
        k[1] = k[1] - (k[1] % WRITERS as u8) + w as u8;
        k
    }

    /// Writer `w`'s part of a store's contents.
    fn of_writer(everything: &[Entries], w: usize) -> Vec<Entries> {
        everything
            .iter()
            .map(|e| {
                e.iter()
                    .filter(|(k, _)| writer_of(k) == w)
                    .cloned()
                    .collect()
            })
            .collect()
    }

    /// RocksDB against the in-memory model: random batches of puts and deletes across
    /// families by several writers, reads and prefix scans, reboots (close, reopen from
    /// disk), and holds: a checkpoint taken while held has, of each writer's keys, the
    /// state of that writer's last freeze (or of the moment the hold began), whatever
    /// the other writers did since; reads and writes during the hold behave as without it.
    #[test]
    fn rocks_matches_the_model_across_reboots() {
        let dir = std::env::temp_dir().join(format!("eddy-rocks-model-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let model = MemStateStore::default();
        let mut rocks = Arc::new(RocksStore::open(&dir).unwrap());
        let mut rng = Rng(0x00C0_FFEE);
        let everything = |s: &dyn StateStore| -> Vec<Entries> {
            Family::ALL
                .iter()
                .map(|f| s.scan_prefix(*f, b"").unwrap())
                .collect()
        };
        let copy = dir.with_extension("checkpoint");
        // Each writer's part of the model at its cut in the current hold.
        let mut held: Option<Vec<Vec<Entries>>> = None;
        let (mut holds, mut freezes) = (0, 0);
        for step in 0..8_000 {
            match rng.below(13) {
                12 => {
                    if let Some(cuts) = held.as_mut() {
                        let w = rng.below(WRITERS as u64) as usize;
                        rocks.freeze(w);
                        cuts[w] = of_writer(&everything(&model), w);
                        freezes += 1;
                    }
                }
                10 if held.is_none() => {
                    rocks.hold(WRITERS);
                    let now = everything(&model);
                    held = Some((0..WRITERS).map(|w| of_writer(&now, w)).collect());
                }
                10 | 11 => {
                    let Some(cuts) = held.take() else {
                        continue;
                    };
                    let _ = std::fs::remove_dir_all(&copy);
                    // A record of the cuts, made after them (no random write touches it).
                    let value = format!("record {step}").into_bytes();
                    let record = [(Family::Meta, &b"record"[..], Some(value.as_slice()))];
                    rocks.checkpoint(&copy, &record).unwrap();
                    model.write(&record).unwrap();
                    let mut expected: Vec<Entries> = (0..Family::ALL.len())
                        .map(|f| cuts.iter().flat_map(|c| c[f].clone()).collect())
                        .collect();
                    let meta = Family::ALL.iter().position(|f| *f == Family::Meta).unwrap();
                    expected[meta].retain(|(k, _)| k != b"record");
                    expected[meta].push((b"record".to_vec(), value));
                    for e in &mut expected {
                        e.sort();
                    }
                    // The shards go on writing while the copy is made.
                    let late = key(&mut rng);
                    let put = [(Family::Aggregates, late.as_slice(), Some(&b"late"[..]))];
                    model.write(&put).unwrap();
                    rocks.writer(writer_of(&late)).write(&put).unwrap();
                    assert_eq!(
                        everything(&rocks.writer(rng.below(WRITERS as u64) as usize)),
                        everything(&model),
                        "step {step}: read while the copy is made"
                    );
                    rocks.release().unwrap();
                    let snapshot = Arc::new(RocksStore::open(&copy).unwrap()).writer(0);
                    assert_eq!(
                        everything(&snapshot),
                        expected,
                        "step {step}: the held copy"
                    );
                    assert_eq!(
                        everything(&rocks.writer(rng.below(WRITERS as u64) as usize)),
                        everything(&model),
                        "step {step}: released"
                    );
                    holds += 1;
                }
                0..=4 => {
                    let w = rng.below(WRITERS as u64) as usize;
                    let n = 1 + rng.below(8);
                    let owned: Vec<(Family, Vec<u8>, Option<Vec<u8>>)> = (0..n)
                        .map(|_| {
                            let family = Family::ALL[rng.below(Family::ALL.len() as u64) as usize];
                            let k = key_of(&mut rng, w);
                            let v = (rng.below(4) != 0).then(|| {
                                (0..rng.below(20)).map(|_| rng.below(256) as u8).collect()
                            });
                            (family, k, v)
                        })
                        .collect();
                    let batch: Vec<Put<'_>> = owned
                        .iter()
                        .map(|(f, k, v)| (*f, k.as_slice(), v.as_deref()))
                        .collect();
                    model.write(&batch).unwrap();
                    let writer = rocks.writer(w);
                    if n.is_multiple_of(2) {
                        writer.write(&batch).unwrap();
                    } else {
                        writer.write_owned(owned.clone()).unwrap();
                    }
                }
                5..=6 => {
                    let family = Family::ALL[rng.below(Family::ALL.len() as u64) as usize];
                    let keys: Vec<Vec<u8>> = (0..1 + rng.below(6)).map(|_| key(&mut rng)).collect();
                    let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
                    let reader = rocks.writer(rng.below(WRITERS as u64) as usize);
                    assert_eq!(
                        reader.multi_get(family, &refs).unwrap(),
                        model.multi_get(family, &refs).unwrap(),
                        "step {step}: multi_get"
                    );
                }
                7..=8 => {
                    let family = Family::ALL[rng.below(Family::ALL.len() as u64) as usize];
                    let prefix = key(&mut rng)[..2 + rng.below(2) as usize].to_vec();
                    let reader = rocks.writer(rng.below(WRITERS as u64) as usize);
                    assert_eq!(
                        reader.scan_prefix(family, &prefix).unwrap(),
                        model.scan_prefix(family, &prefix).unwrap(),
                        "step {step}: scan {prefix:?}"
                    );
                }
                _ => {
                    // Reboot: everything in memory goes; the database is read back. (A
                    // node releases its store before it stops.)
                    rocks.release().unwrap();
                    held = None;
                    rocks.writer(0).sync().unwrap();
                    drop(rocks);
                    rocks = Arc::new(RocksStore::open(&dir).unwrap());
                    for family in Family::ALL {
                        assert_eq!(
                            rocks.writer(0).scan_prefix(family, b"").unwrap(),
                            model.scan_prefix(family, b"").unwrap(),
                            "step {step}: {family:?} after reopening"
                        );
                    }
                }
            }
        }
        assert!(
            holds > 50 && freezes > 50,
            "only {holds} holds, {freezes} freezes"
        );
        rocks.release().unwrap();
        let _ = std::fs::remove_dir_all(&copy);
        rocks.checkpoint(&copy, &[]).unwrap();
        let reopened = Arc::new(RocksStore::open(&copy).unwrap()).writer(0);
        for family in Family::ALL {
            assert_eq!(
                reopened.scan_prefix(family, b"").unwrap(),
                model.scan_prefix(family, b"").unwrap()
            );
        }
        drop((rocks, reopened));
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&copy);
    }

    /// A prefix check never says "none" while a key is there, held or not.
    #[test]
    fn holds_prefix_answers_false_only_for_an_empty_prefix() {
        let dir = std::env::temp_dir().join(format!("eddy-rocks-holds-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let rocks = Arc::new(RocksStore::open(&dir).unwrap());
        let w = rocks.writer(0);
        let holds = |p: &[u8]| w.holds_prefix(Family::Aggregates, p).unwrap();
        assert!(!holds(b"t/1/"));
        w.write(&[(Family::Aggregates, b"t/1/a", Some(b"x"))])
            .unwrap();
        w.write(&[(Family::Extremes, b"t/2/a", Some(b"x"))])
            .unwrap();
        assert!(holds(b"t/1/") && holds(b"t/") && !holds(b"t/2/") && !holds(b"t/1/b"));
        w.write(&[(Family::Aggregates, b"t/1/a", None)]).unwrap();
        assert!(!holds(b"t/1/"));
        // While held, the writer's overlay counts, a deletion too (it may hide a key).
        rocks.hold(1);
        w.write(&[(Family::Aggregates, b"t/3/a", Some(b"x"))])
            .unwrap();
        w.write(&[(Family::Aggregates, b"t/4/a", None)]).unwrap();
        assert!(holds(b"t/3/") && holds(b"t/4/") && !holds(b"t/5/"));
        rocks.release().unwrap();
        assert!(holds(b"t/3/") && !holds(b"t/5/"));
        let model = MemStateStore::default();
        model
            .write(&[(Family::Aggregates, b"t/1/a", Some(b"x"))])
            .unwrap();
        assert!(model.holds_prefix(Family::Aggregates, b"t/1").unwrap());
        assert!(!model.holds_prefix(Family::Aggregates, b"t/2").unwrap());
        drop((w, rocks));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A shard scans its keys while the checkpoint thread writes the cuts to the
    /// database and drops them from the overlay: every scan sees the shard's writes
    /// exactly, wherever the checkpoint is. (Reading the database before the overlay
    /// once lost a cut written in between: a group's state vanished from a scan.)
    #[test]
    fn scans_see_every_write_while_checkpoints_run() {
        let dir = std::env::temp_dir().join(format!("eddy-rocks-race-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let rocks = Arc::new(RocksStore::open(&dir).unwrap());
        rocks.hold(1);
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let checkpoints = {
            let (rocks, done, dir) = (rocks.clone(), done.clone(), dir.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    let copy = dir.with_extension(format!("copy{}", n % 2));
                    let _ = std::fs::remove_dir_all(&copy);
                    rocks.checkpoint(&copy, &[]).unwrap();
                    n += 1;
                }
                for i in 0..2 {
                    let _ = std::fs::remove_dir_all(dir.with_extension(format!("copy{i}")));
                }
                n
            })
        };
        let writer = rocks.writer(0);
        let mut model = std::collections::BTreeMap::new();
        let mut rng = Rng(0x5EED);
        for step in 0..3_000 {
            let batch: Vec<OwnedPut> = (0..64)
                .map(|_| {
                    let k = format!("p/{:04}", rng.below(2_000)).into_bytes();
                    let v = (rng.below(3) != 0).then(|| step.to_string().into_bytes());
                    (Family::Extremes, k, v)
                })
                .collect();
            for (_, k, v) in &batch {
                match v {
                    Some(v) => model.insert(k.clone(), v.clone()),
                    None => model.remove(k),
                };
            }
            writer.write_owned(batch).unwrap();
            if step % 4 == 0 {
                rocks.freeze(0);
            }
            let want: Entries = model.clone().into_iter().collect();
            let got = writer.scan_prefix(Family::Extremes, b"p/").unwrap();
            let wrong = got.iter().zip(&want).position(|(g, w)| g != w);
            assert!(
                got == want,
                "step {step}: the scan holds {} entries where the writer left {}, first wrong at {wrong:?}",
                got.len(),
                want.len()
            );
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let taken = checkpoints.join().unwrap();
        assert!(taken > 10, "{taken} checkpoints");
        drop(writer);
        drop(rocks);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A store still held when a checkpoint holds it again (its release failed on a
    /// full disk) keeps every write it held, and a release then writes them all.
    #[test]
    fn holding_a_held_store_again_keeps_its_writes() {
        let dir = std::env::temp_dir().join(format!("eddy-rocks-rehold-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let rocks = Arc::new(RocksStore::open(&dir).unwrap());
        let w = rocks.writer(1);
        rocks.hold(2);
        w.write(&[(Family::Aggregates, b"k", Some(b"v"))]).unwrap();
        rocks.freeze(1);
        w.write(&[(Family::Aggregates, b"j", Some(b"w"))]).unwrap();
        rocks.hold(2);
        assert!(rocks.is_held());
        let want = vec![Some(b"v".to_vec()), Some(b"w".to_vec())];
        assert_eq!(
            w.multi_get(Family::Aggregates, &[b"k", b"j"]).unwrap(),
            want
        );
        rocks.release().unwrap();
        assert!(!rocks.is_held());
        assert_eq!(
            rocks
                .multi_get_db(Family::Aggregates, &[b"k", b"j"])
                .unwrap(),
            want
        );
        drop(w);
        drop(rocks);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
