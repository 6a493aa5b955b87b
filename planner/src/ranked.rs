//! An ordered multiset with order statistics: a treap whose nodes also carry the total
//! count of their subtree. Adding or removing a copy, the k-th value in order, and the
//! first and last values each take O(log n) expected steps, so an exact percentile
//! over a sliding window costs O(log n) per event, never a sort.
//!
//! Invariant: every node's `total` is its own count plus its children's totals, and
//! every count is positive (a value whose last copy leaves is unlinked).

const NIL: u32 = u32::MAX;

#[derive(Clone, Debug)]
struct Node<K> {
    key: K,
    count: u32,
    total: u64,
    priority: u32,
    left: u32,
    right: u32,
}

#[derive(Clone, Debug)]
pub struct Ranked<K> {
    nodes: Vec<Node<K>>,
    /// Unlinked slots of `nodes`, reused before it grows.
    free: Vec<u32>,
    root: u32,
    len: usize,
    /// xorshift state for node priorities.
    seed: u64,
}

impl<K: Ord + Default> Default for Ranked<K> {
    fn default() -> Self {
        Ranked {
            nodes: Vec::new(),
            free: Vec::new(),
            root: NIL,
            len: 0,
            seed: 0x9E37_79B9_7F4A_7C15,
        }
    }
}

impl<K: Ord + Default> Ranked<K> {
    /// Distinct values held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies held, over all values.
    pub fn total(&self) -> u64 {
        self.total_of(self.root)
    }

    fn total_of(&self, t: u32) -> u64 {
        if t == NIL {
            0
        } else {
            self.nodes[t as usize].total
        }
    }

    fn update(&mut self, t: u32) {
        let n = &self.nodes[t as usize];
        let total = n.count as u64 + self.total_of(n.left) + self.total_of(n.right);
        self.nodes[t as usize].total = total;
    }

    fn next_priority(&mut self) -> u32 {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        (self.seed >> 32) as u32
    }

    /// The path from the root to `key`'s node (inclusive), or `None` if absent.
    fn path(&self, key: &K) -> Option<Vec<u32>> {
        let mut path = Vec::new();
        let mut t = self.root;
        while t != NIL {
            path.push(t);
            let n = &self.nodes[t as usize];
            t = match key.cmp(&n.key) {
                std::cmp::Ordering::Less => n.left,
                std::cmp::Ordering::Greater => n.right,
                std::cmp::Ordering::Equal => return Some(path),
            };
        }
        None
    }

    /// Splits `t` into the values below `key` and those above it (`key` is absent).
    fn split(&mut self, t: u32, key: &K) -> (u32, u32) {
        if t == NIL {
            return (NIL, NIL);
        }
        if self.nodes[t as usize].key < *key {
            let (l, r) = self.split(self.nodes[t as usize].right, key);
            self.nodes[t as usize].right = l;
            self.update(t);
            (t, r)
        } else {
            let (l, r) = self.split(self.nodes[t as usize].left, key);
            self.nodes[t as usize].left = r;
            self.update(t);
            (l, t)
        }
    }

    /// Joins `a` and `b`, every value of `a` below every value of `b`.
    fn merge(&mut self, a: u32, b: u32) -> u32 {
        if a == NIL {
            return b;
        }
        if b == NIL {
            return a;
        }
        if self.nodes[a as usize].priority > self.nodes[b as usize].priority {
            let right = self.merge(self.nodes[a as usize].right, b);
            self.nodes[a as usize].right = right;
            self.update(a);
            a
        } else {
            let left = self.merge(a, self.nodes[b as usize].left);
            self.nodes[b as usize].left = left;
            self.update(b);
            b
        }
    }

    /// Adds `n` (> 0) copies of `key`.
    pub fn add(&mut self, key: K, n: u32) {
        if let Some(path) = self.path(&key) {
            let last = *path.last().expect("path ends at the key");
            self.nodes[last as usize].count += n;
            for t in path {
                self.nodes[t as usize].total += n as u64;
            }
            return;
        }
        let (l, r) = self.split(self.root, &key);
        let node = Node {
            key,
            count: n,
            total: n as u64,
            priority: self.next_priority(),
            left: NIL,
            right: NIL,
        };
        let t = match self.free.pop() {
            Some(t) => {
                self.nodes[t as usize] = node;
                t
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        let l = self.merge(l, t);
        self.root = self.merge(l, r);
        self.len += 1;
    }

    /// Removes one copy of `key`; false (and nothing changes) if it is absent.
    pub fn decrement(&mut self, key: &K) -> bool {
        let Some(path) = self.path(key) else {
            return false;
        };
        for t in &path {
            self.nodes[*t as usize].total -= 1;
        }
        let t = *path.last().expect("path ends at the key");
        let node = &mut self.nodes[t as usize];
        node.count -= 1;
        if node.count > 0 {
            return true;
        }
        let (left, right) = (node.left, node.right);
        node.key = K::default();
        let joined = self.merge(left, right);
        match path.len().checked_sub(2).map(|i| path[i]) {
            None => self.root = joined,
            Some(parent) => {
                let p = &mut self.nodes[parent as usize];
                if p.left == t {
                    p.left = joined;
                } else {
                    p.right = joined;
                }
            }
        }
        self.free.push(t);
        self.len -= 1;
        true
    }

    /// The value at 0-based position `k` when every copy is listed in order.
    pub fn nth(&self, mut k: u64) -> Option<&K> {
        let mut t = self.root;
        while t != NIL {
            let n = &self.nodes[t as usize];
            let left = self.total_of(n.left);
            if k < left {
                t = n.left;
            } else if k < left + n.count as u64 {
                return Some(&n.key);
            } else {
                k -= left + n.count as u64;
                t = n.right;
            }
        }
        None
    }

    pub fn first(&self) -> Option<&K> {
        self.edge(|n| n.left)
    }

    pub fn last(&self) -> Option<&K> {
        self.edge(|n| n.right)
    }

    /// The key at the end of the path that always takes `next`.
    fn edge(&self, next: impl Fn(&Node<K>) -> u32) -> Option<&K> {
        let mut t = self.root;
        let mut found = None;
        while t != NIL {
            let n = &self.nodes[t as usize];
            found = Some(&n.key);
            t = next(n);
        }
        found
    }

    /// The values with their counts, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, u32)> + '_ {
        let mut stack = Vec::new();
        let mut t = self.root;
        std::iter::from_fn(move || {
            while t != NIL {
                stack.push(t);
                t = self.nodes[t as usize].left;
            }
            let top = stack.pop()?;
            let n = &self.nodes[top as usize];
            t = n.right;
            Some((&n.key, n.count))
        })
    }
}

impl<K: Ord + Default> FromIterator<(K, u32)> for Ranked<K> {
    fn from_iter<I: IntoIterator<Item = (K, u32)>>(iter: I) -> Self {
        let mut r = Ranked::default();
        for (k, n) in iter {
            r.add(k, n);
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// The tree agrees with a B-tree model through random adds and removes, in every
    /// order statistic.
    #[test]
    fn agrees_with_a_model() {
        let mut tree: Ranked<i64> = Ranked::default();
        let mut model: BTreeMap<i64, u32> = BTreeMap::new();
        let mut x: u64 = 42;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for step in 0..20_000 {
            let key = (next() % 500) as i64 - 250;
            if next() % 3 == 0 {
                let present = model.contains_key(&key);
                assert_eq!(tree.decrement(&key), present);
                if present {
                    let c = model.get_mut(&key).unwrap();
                    *c -= 1;
                    if *c == 0 {
                        model.remove(&key);
                    }
                }
            } else {
                let n = (next() % 3 + 1) as u32;
                tree.add(key, n);
                *model.entry(key).or_insert(0) += n;
            }
            if step % 97 == 0 {
                let flat: Vec<i64> = model
                    .iter()
                    .flat_map(|(k, c)| std::iter::repeat_n(*k, *c as usize))
                    .collect();
                assert_eq!(tree.total(), flat.len() as u64);
                assert_eq!(tree.len(), model.len());
                for (i, v) in flat.iter().enumerate() {
                    assert_eq!(tree.nth(i as u64), Some(v));
                }
                assert_eq!(tree.nth(flat.len() as u64), None);
                assert_eq!(tree.first(), model.keys().next());
                assert_eq!(tree.last(), model.keys().next_back());
                let pairs: Vec<(i64, u32)> = tree.iter().map(|(k, c)| (*k, c)).collect();
                let expected: Vec<(i64, u32)> = model.iter().map(|(k, c)| (*k, *c)).collect();
                assert_eq!(pairs, expected);
            }
        }
    }
}
