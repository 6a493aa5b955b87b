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
use std::sync::{Mutex, RwLock};

/// The kinds of state, one column family each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// Aggregate state per (aggregator leaf, group key).
    Aggregates,
    /// COUNT DISTINCT value → count maps.
    Distinct,
    /// MIN/MAX ordered multisets.
    Extremes,
    /// Checkpoint records and other bookkeeping.
    Meta,
}

impl Family {
    pub const ALL: [Family; 4] = [
        Family::Aggregates,
        Family::Distinct,
        Family::Extremes,
        Family::Meta,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Family::Aggregates => "aggregates",
            Family::Distinct => "distinct",
            Family::Extremes => "extremes",
            Family::Meta => "meta",
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("state store: {0}")]
pub struct StateError(pub String);

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
/// A checkpoint must copy the state of the moment the shards paused, yet the shards
/// should not wait for the copy. So the store can be *held*: writes then land in an
/// in-memory overlay that reads consult first. `freeze` (while the shards are paused)
/// makes what the overlay holds the *cut*: `checkpoint` writes the cut to the database
/// before copying it, and later writes stay in the overlay until `release` applies them
/// in one atomic batch.
pub struct RocksStore {
    db: rocksdb::DB,
    held: RwLock<Option<Held>>,
}

/// Writes made while the store is held: a value, or `None` for a delete.
type Overlay = BTreeMap<FamilyKey, Option<Vec<u8>>>;

#[derive(Default)]
struct Held {
    /// Writes that belong in the next checkpoint; read-only once frozen.
    cut: Overlay,
    /// Writes after the cut.
    live: Mutex<Overlay>,
    /// Whether `checkpoint` wrote the cut to the database already.
    cut_written: std::sync::atomic::AtomicBool,
}

impl Held {
    /// What the overlay says of a key: `None` if it does not know it.
    fn get(&self, family: Family, key: &[u8]) -> Option<Option<Vec<u8>>> {
        let k = (family, key.to_vec());
        let live = self.live.lock().expect("overlay lock");
        live.get(&k).or_else(|| self.cut.get(&k)).cloned()
    }
}

fn batch_of(overlay: &Overlay) -> Vec<Put<'_>> {
    overlay
        .iter()
        .map(|((f, k), v)| (*f, k.as_slice(), v.as_deref()))
        .collect()
}

fn rocks_error(e: rocksdb::Error) -> StateError {
    StateError(e.into_string())
}

impl RocksStore {
    /// Opens (or creates) the database in `path`.
    pub fn open(path: &Path) -> Result<RocksStore, StateError> {
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
        let families = Family::ALL.iter().map(|f| {
            let mut cf = rocksdb::Options::default();
            cf.set_compression_type(rocksdb::DBCompressionType::Lz4);
            rocksdb::ColumnFamilyDescriptor::new(f.name(), cf)
        });
        let db = rocksdb::DB::open_cf_descriptors(&options, path, families).map_err(rocks_error)?;
        Ok(RocksStore {
            db,
            held: RwLock::new(None),
        })
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

    /// A consistent copy of the database in `dir` (hard links where possible). The cut
    /// (when the store is held), then `last`, are written to the database first, in one
    /// atomic batch: `last` belongs to the cut but was made after it.
    pub fn checkpoint(&self, dir: &Path, last: &[Put<'_>]) -> Result<(), StateError> {
        let held = self.held.read().expect("hold lock");
        let mut batch = held.as_ref().map(|h| batch_of(&h.cut)).unwrap_or_default();
        batch.extend_from_slice(last);
        if !batch.is_empty() {
            self.write_db(&batch)?;
        }
        if let Some(h) = held.as_ref() {
            h.cut_written
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
        rocksdb::checkpoint::Checkpoint::new(&self.db)
            .and_then(|c| c.create_checkpoint(dir))
            .map_err(rocks_error)
    }

    /// From now on, writes go to the overlay and leave the database as it is.
    pub fn hold(&self) {
        *self.held.write().expect("hold lock") = Some(Held::default());
    }

    /// Makes every write so far part of the next checkpoint (a no-op when not held).
    pub fn freeze(&self) {
        let mut held = self.held.write().expect("hold lock");
        if let Some(h) = held.as_mut() {
            let live = std::mem::take(h.live.get_mut().expect("overlay lock"));
            h.cut.extend(live);
            *h.cut_written.get_mut() = false;
        }
    }

    /// Applies the overlay to the database in one atomic batch, and writes go to the
    /// database again.
    pub fn release(&self) -> Result<(), StateError> {
        let mut held = self.held.write().expect("hold lock");
        let Some(mut h) = held.take() else {
            return Ok(());
        };
        let live = std::mem::take(h.live.get_mut().expect("overlay lock"));
        if *h.cut_written.get_mut() {
            return self.write_db(&batch_of(&live));
        }
        h.cut.extend(live);
        self.write_db(&batch_of(&h.cut))
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
        self.db.write(wb).map_err(rocks_error)
    }

    fn multi_get_db(
        &self,
        family: Family,
        keys: &[&[u8]],
    ) -> Result<Vec<Option<Vec<u8>>>, StateError> {
        let cf = self.cf(family);
        self.db
            .multi_get_cf(keys.iter().map(|k| (cf, *k)))
            .into_iter()
            .map(|r| r.map_err(rocks_error))
            .collect()
    }
}

impl StateStore for RocksStore {
    fn multi_get(
        &self,
        family: Family,
        keys: &[&[u8]],
    ) -> Result<Vec<Option<Vec<u8>>>, StateError> {
        let held = self.held.read().expect("hold lock");
        let Some(h) = held.as_ref() else {
            return self.multi_get_db(family, keys);
        };
        let mut out: Vec<Option<Option<Vec<u8>>>> = keys.iter().map(|k| h.get(family, k)).collect();
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

    fn write(&self, batch: &[Put<'_>]) -> Result<(), StateError> {
        let held = self.held.read().expect("hold lock");
        let Some(h) = held.as_ref() else {
            return self.write_db(batch);
        };
        let mut live = h.live.lock().expect("overlay lock");
        for (family, k, v) in batch {
            live.insert((*family, k.to_vec()), v.map(<[u8]>::to_vec));
        }
        Ok(())
    }

    fn write_owned(&self, batch: Vec<OwnedPut>) -> Result<(), StateError> {
        let held = self.held.read().expect("hold lock");
        let Some(h) = held.as_ref() else {
            return self.write_db(&puts(&batch));
        };
        let mut live = h.live.lock().expect("overlay lock");
        live.extend(batch.into_iter().map(|(f, k, v)| ((f, k), v)));
        Ok(())
    }

    fn scan_prefix(&self, family: Family, prefix: &[u8]) -> Result<Entries, StateError> {
        let held = self.held.read().expect("hold lock");
        let mode = rocksdb::IteratorMode::From(prefix, rocksdb::Direction::Forward);
        let mut out = BTreeMap::new();
        for item in self.db.iterator_cf(self.cf(family), mode) {
            let (k, v) = item.map_err(rocks_error)?;
            if !k.starts_with(prefix) {
                break;
            }
            out.insert(k.to_vec(), v.to_vec());
        }
        if let Some(h) = held.as_ref() {
            let live = h.live.lock().expect("overlay lock");
            for overlay in [&h.cut, &*live] {
                let written = overlay
                    .range((family, prefix.to_vec())..)
                    .take_while(|((f, k), _)| *f == family && k.starts_with(prefix));
                for ((_, k), v) in written {
                    match v {
                        Some(v) => out.insert(k.clone(), v.clone()),
                        None => out.remove(k),
                    };
                }
            }
        }
        Ok(out.into_iter().collect())
    }

    fn sync(&self) -> Result<(), StateError> {
        self.db.flush_wal(true).map_err(rocks_error)
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
            (Family::Distinct, b"a/3", Some(b"w")),
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

    /// RocksDB against the in-memory model: random batches of puts and deletes across
    /// families, reads and prefix scans, reboots (close, reopen from disk), and holds: a
    /// checkpoint taken while held has the state of the last freeze (or of the moment
    /// the hold began), and reads and writes during the hold behave as without it.
    #[test]
    fn rocks_matches_the_model_across_reboots() {
        let dir = std::env::temp_dir().join(format!("eddy-rocks-model-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let model = MemStateStore::default();
        let mut rocks = RocksStore::open(&dir).unwrap();
        let mut rng = Rng(0x00C0_FFEE);
        let everything = |s: &dyn StateStore| -> Vec<Entries> {
            Family::ALL
                .iter()
                .map(|f| s.scan_prefix(*f, b"").unwrap())
                .collect()
        };
        let copy = dir.with_extension("checkpoint");
        // The model's contents at the current hold's cut.
        let mut held: Option<Vec<Entries>> = None;
        let (mut holds, mut freezes) = (0, 0);
        for step in 0..6_000 {
            match rng.below(13) {
                12 => {
                    if held.is_some() {
                        rocks.freeze();
                        held = Some(everything(&model));
                        freezes += 1;
                    }
                }
                10 if held.is_none() => {
                    rocks.hold();
                    held = Some(everything(&model));
                }
                10 | 11 => {
                    let Some(at_hold) = held.take() else {
                        continue;
                    };
                    let _ = std::fs::remove_dir_all(&copy);
                    // A record of the cut, made after it (no random write touches it).
                    let value = format!("record {step}").into_bytes();
                    let record = [(Family::Meta, &b"record"[..], Some(value.as_slice()))];
                    rocks.checkpoint(&copy, &record).unwrap();
                    model.write(&record).unwrap();
                    let mut at_hold = at_hold;
                    let meta = Family::ALL.iter().position(|f| *f == Family::Meta).unwrap();
                    at_hold[meta].retain(|(k, _)| k != b"record");
                    at_hold[meta].push((b"record".to_vec(), value));
                    at_hold[meta].sort();
                    // The shards go on writing while the copy is made.
                    let late = key(&mut rng);
                    let put = [(Family::Aggregates, late.as_slice(), Some(&b"late"[..]))];
                    model.write(&put).unwrap();
                    rocks.write(&put).unwrap();
                    rocks.release().unwrap();
                    let snapshot = RocksStore::open(&copy).unwrap();
                    assert_eq!(everything(&snapshot), at_hold, "step {step}: the held copy");
                    assert_eq!(
                        everything(&rocks),
                        everything(&model),
                        "step {step}: released"
                    );
                    holds += 1;
                }
                0..=4 => {
                    let n = 1 + rng.below(8);
                    let owned: Vec<(Family, Vec<u8>, Option<Vec<u8>>)> = (0..n)
                        .map(|_| {
                            let family = Family::ALL[rng.below(4) as usize];
                            let k = key(&mut rng);
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
                    if n.is_multiple_of(2) {
                        rocks.write(&batch).unwrap();
                    } else {
                        rocks.write_owned(owned.clone()).unwrap();
                    }
                }
                5..=6 => {
                    let family = Family::ALL[rng.below(4) as usize];
                    let keys: Vec<Vec<u8>> = (0..1 + rng.below(6)).map(|_| key(&mut rng)).collect();
                    let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
                    assert_eq!(
                        rocks.multi_get(family, &refs).unwrap(),
                        model.multi_get(family, &refs).unwrap(),
                        "step {step}: multi_get"
                    );
                }
                7..=8 => {
                    let family = Family::ALL[rng.below(4) as usize];
                    let prefix = key(&mut rng)[..2 + rng.below(2) as usize].to_vec();
                    assert_eq!(
                        rocks.scan_prefix(family, &prefix).unwrap(),
                        model.scan_prefix(family, &prefix).unwrap(),
                        "step {step}: scan {prefix:?}"
                    );
                }
                _ => {
                    // Reboot: everything in memory goes; the database is read back. (A
                    // node releases its store before it stops.)
                    rocks.release().unwrap();
                    held = None;
                    rocks.sync().unwrap();
                    drop(rocks);
                    rocks = RocksStore::open(&dir).unwrap();
                    for family in Family::ALL {
                        assert_eq!(
                            rocks.scan_prefix(family, b"").unwrap(),
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
        let reopened = RocksStore::open(&copy).unwrap();
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
}
