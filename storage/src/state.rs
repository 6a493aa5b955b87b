//! The state store: aggregate state by key, read and written in batches.
//!
//! Invariant: the API is batch-only (`multi_get` / `multi_put`), so an implementation
//! backed by an external engine pays one round trip per batch, never one per event.

use std::collections::BTreeMap;

/// Keyed byte state with batch reads and writes.
pub trait StateStore: Send {
    /// The values of `keys`, in the same order.
    fn multi_get(&self, keys: &[&[u8]]) -> Vec<Option<Vec<u8>>>;

    /// Writes (`Some`) or deletes (`None`) each key, atomically as one batch.
    fn multi_put(&mut self, entries: &[(&[u8], Option<&[u8]>)]);

    /// Every entry whose key starts with `prefix`, in key order.
    fn scan_prefix(&self, prefix: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)>;
}

/// The in-memory state store: an ordered map.
#[derive(Default)]
pub struct MemStateStore {
    entries: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl StateStore for MemStateStore {
    fn multi_get(&self, keys: &[&[u8]]) -> Vec<Option<Vec<u8>>> {
        keys.iter().map(|k| self.entries.get(*k).cloned()).collect()
    }

    fn multi_put(&mut self, entries: &[(&[u8], Option<&[u8]>)]) {
        for (k, v) in entries {
            match v {
                Some(v) => {
                    self.entries.insert(k.to_vec(), v.to_vec());
                }
                None => {
                    self.entries.remove(*k);
                }
            }
        }
    }

    fn scan_prefix(&self, prefix: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.entries
            .range(prefix.to_vec()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_put_get_delete_scan() {
        let mut s = MemStateStore::default();
        s.multi_put(&[
            (b"a/1", Some(b"x")),
            (b"a/2", Some(b"y")),
            (b"b/1", Some(b"z")),
        ]);
        assert_eq!(
            s.multi_get(&[b"a/2", b"c"]),
            vec![Some(b"y".to_vec()), None]
        );
        s.multi_put(&[(b"a/1", None)]);
        assert_eq!(s.scan_prefix(b"a/"), vec![(b"a/2".to_vec(), b"y".to_vec())]);
    }
}
