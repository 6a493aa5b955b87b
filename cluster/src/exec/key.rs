//! Group keys packed into bytes, stored inline in the group table when short.
//!
//! Invariant: two rows have equal packed keys exactly when their group-by values are
//! equal under `Value`'s equality (-0.0 equals 0.0, all NaNs are one value), and
//! `unpack(pack(values)) == values`. Short keys (most card or account ids) live inside
//! the hash table's bucket, so a lookup compares bytes already in cache instead of
//! following a pointer to each stored string.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::LazyLock;

use hashbrown::DefaultHashBuilder;

use eddy_planner::types::Value;

/// Bytes of a key kept inline (a text of up to 17 bytes, an integer and a text of up to
/// 8); longer keys go to the heap. The group table's entry is sized for it.
const INLINE_BYTES_MAX: usize = 22;

#[derive(Clone)]
pub enum PackedKey {
    Inline(u8, [u8; INLINE_BYTES_MAX]),
    Heap(Box<[u8]>),
}

impl PackedKey {
    pub fn new(bytes: &[u8]) -> PackedKey {
        if bytes.len() <= INLINE_BYTES_MAX {
            let mut buf = [0u8; INLINE_BYTES_MAX];
            buf[..bytes.len()].copy_from_slice(bytes);
            PackedKey::Inline(bytes.len() as u8, buf)
        } else {
            PackedKey::Heap(bytes.into())
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        match self {
            PackedKey::Inline(len, buf) => &buf[..*len as usize],
            PackedKey::Heap(b) => b,
        }
    }
}

impl Borrow<[u8]> for PackedKey {
    fn borrow(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl Hash for PackedKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl PartialEq for PackedKey {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for PackedKey {}

const NULL: u8 = 0;
const BOOL: u8 = 1;
const INT: u8 = 2;
const FLOAT: u8 = 3;
const TEXT: u8 = 4;
const TIMESTAMP: u8 = 5;
const NUMERIC: u8 = 6;

/// Packs the values of `columns` of `row` into `buf` (cleared first).
pub fn pack(buf: &mut Vec<u8>, columns: &[usize], row: &[Value]) {
    buf.clear();
    pack_any(buf, columns, row);
}

/// A text value's bytes: its tag, its length, then the text.
#[inline]
fn pack_text(buf: &mut Vec<u8>, s: &str) {
    buf.reserve(5 + s.len());
    buf.extend_from_slice(&text_header(s));
    buf.extend_from_slice(s.as_bytes());
}

fn text_header(s: &str) -> [u8; 5] {
    let [l0, l1, l2, l3] = (s.len() as u32).to_le_bytes();
    [TEXT, l0, l1, l2, l3]
}

/// The text of a key packed from one text value alone.
#[inline]
fn lone_text(packed: &[u8]) -> Option<&[u8]> {
    let ([TEXT, l0, l1, l2, l3], text) = packed.split_first_chunk::<5>()? else {
        return None;
    };
    (u32::from_le_bytes([*l0, *l1, *l2, *l3]) as usize == text.len()).then_some(text)
}

/// The hasher of every group table, seeded once per process: a key hashes the same in
/// each, so a key hashed once (`Hashed`) serves every lookup of it.
static HASHER: LazyLock<DefaultHashBuilder> = LazyLock::new(DefaultHashBuilder::default);

/// Whether `a` and `b` hold the same bytes. Keys of 4 to 16 bytes (most card and account
/// ids) compare as two overlapping words each, inline: a call to `memcmp` cost more than
/// the comparison.
#[inline]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    fn word<const W: usize>(s: &[u8], at: usize) -> [u8; W] {
        s[at..at + W].try_into().expect("W bytes")
    }
    match n {
        8..=16 => word::<8>(a, 0) == word::<8>(b, 0) && word::<8>(a, n - 8) == word::<8>(b, n - 8),
        4..=7 => word::<4>(a, 0) == word::<4>(b, 0) && word::<4>(a, n - 4) == word::<4>(b, n - 4),
        _ => a == b,
    }
}

/// A group key as a lookup takes it: packed, or (a key of one text column, the usual
/// card or account) the text itself, which the event path looks up several times per
/// event without packing it each time. Both forms of a key hash and match alike.
#[derive(Clone, Copy, Debug)]
pub enum KeyRef<'a> {
    Packed(&'a [u8]),
    Text(&'a str),
}

impl<'a> KeyRef<'a> {
    /// The key of `columns` of `row`: its text, or its values packed into `buf`.
    #[inline]
    pub fn of(buf: &'a mut Vec<u8>, columns: &[usize], row: &'a [Value]) -> KeyRef<'a> {
        if let [c] = columns {
            if let Some(Value::Text(s)) = row.get(*c) {
                return KeyRef::Text(s);
            }
        }
        pack(buf, columns, row);
        KeyRef::Packed(buf)
    }

    /// The key's hash: of a lone text, the text's bytes; else of the packed bytes.
    #[inline]
    pub fn hash(self) -> u64 {
        let bytes = match self {
            KeyRef::Text(s) => s.as_bytes(),
            KeyRef::Packed(b) => lone_text(b).unwrap_or(b),
        };
        HASHER.hash_one(bytes)
    }

    /// The key with its hash, for lookups.
    #[inline]
    pub fn hashed(self) -> Hashed<'a> {
        Hashed {
            key: self,
            hash: self.hash(),
        }
    }

    /// Whether `packed` is this key packed.
    #[inline]
    pub fn matches(self, packed: &[u8]) -> bool {
        match self {
            KeyRef::Packed(b) => same_bytes(b, packed),
            KeyRef::Text(s) => lone_text(packed).is_some_and(|t| same_bytes(t, s.as_bytes())),
        }
    }

    pub fn to_packed(self) -> PackedKey {
        match self {
            KeyRef::Packed(b) => PackedKey::new(b),
            KeyRef::Text(s) if 5 + s.len() <= INLINE_BYTES_MAX => {
                let mut buf = [0u8; INLINE_BYTES_MAX];
                buf[..5].copy_from_slice(&text_header(s));
                buf[5..5 + s.len()].copy_from_slice(s.as_bytes());
                PackedKey::Inline((5 + s.len()) as u8, buf)
            }
            KeyRef::Text(_) => PackedKey::Heap(self.to_vec().into()),
        }
    }

    pub fn to_vec(self) -> Vec<u8> {
        match self {
            KeyRef::Packed(b) => b.to_vec(),
            KeyRef::Text(s) => {
                let mut v = Vec::new();
                pack_text(&mut v, s);
                v
            }
        }
    }
}

impl<'a> From<&'a [u8]> for KeyRef<'a> {
    fn from(packed: &'a [u8]) -> KeyRef<'a> {
        KeyRef::Packed(packed)
    }
}

/// A group key and its hash (`KeyRef::hash`), as every lookup of a group table takes it:
/// a key looked up several times (asked for ahead, then entered) is hashed once.
#[derive(Clone, Copy, Debug)]
pub struct Hashed<'a> {
    pub key: KeyRef<'a>,
    /// `key.hash()`, always: a lookup under another hash misses the key.
    pub hash: u64,
}

impl<'a> From<&'a [u8]> for Hashed<'a> {
    fn from(packed: &'a [u8]) -> Hashed<'a> {
        KeyRef::Packed(packed).hashed()
    }
}

fn pack_any(buf: &mut Vec<u8>, columns: &[usize], row: &[Value]) {
    for c in columns {
        match &row[*c] {
            Value::Null => buf.push(NULL),
            Value::Bool(b) => buf.extend_from_slice(&[BOOL, u8::from(*b)]),
            Value::Int(v) => {
                buf.push(INT);
                buf.extend_from_slice(&v.to_le_bytes());
            }
            Value::Float(v) => {
                let v = if *v == 0.0 {
                    0.0
                } else if v.is_nan() {
                    f64::NAN
                } else {
                    *v
                };
                buf.push(FLOAT);
                buf.extend_from_slice(&v.to_bits().to_le_bytes());
            }
            Value::Text(s) => pack_text(buf, s),
            Value::Timestamp(v) => {
                buf.push(TIMESTAMP);
                buf.extend_from_slice(&v.to_le_bytes());
            }
            Value::Numeric(v) => {
                buf.push(NUMERIC);
                buf.extend_from_slice(&v.get().to_le_bytes());
            }
        }
    }
}

/// The values a packed key was made from.
pub fn unpack(mut bytes: &[u8]) -> Vec<Value> {
    let mut out = Vec::new();
    let take = |bytes: &mut &[u8], n: usize| {
        let (head, tail) = bytes.split_at(n);
        *bytes = tail;
        head.to_vec()
    };
    while let Some((&tag, rest)) = bytes.split_first() {
        bytes = rest;
        let v = match tag {
            NULL => Value::Null,
            BOOL => Value::Bool(take(&mut bytes, 1)[0] == 1),
            INT => Value::Int(i64::from_le_bytes(
                take(&mut bytes, 8).try_into().expect("8 bytes"),
            )),
            FLOAT => Value::Float(f64::from_bits(u64::from_le_bytes(
                take(&mut bytes, 8).try_into().expect("8 bytes"),
            ))),
            TEXT => {
                let len =
                    u32::from_le_bytes(take(&mut bytes, 4).try_into().expect("4 bytes")) as usize;
                let text = String::from_utf8(take(&mut bytes, len)).expect("packed text is UTF-8");
                Value::Text(text.into())
            }
            TIMESTAMP => Value::Timestamp(i64::from_le_bytes(
                take(&mut bytes, 8).try_into().expect("8 bytes"),
            )),
            NUMERIC => Value::Numeric(
                i128::from_le_bytes(take(&mut bytes, 16).try_into().expect("16 bytes")).into(),
            ),
            other => panic!("corrupt packed key tag {other}"),
        };
        out.push(v);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_normalises() {
        let row = vec![
            Value::Text("card-1".into()),
            Value::Null,
            Value::Int(-7),
            Value::Float(-0.0),
            Value::Timestamp(42),
            Value::Bool(true),
            Value::Text("a much longer key that cannot stay inline".into()),
        ];
        let cols: Vec<usize> = (0..row.len()).collect();
        let mut buf = Vec::new();
        pack(&mut buf, &cols, &row);
        assert_eq!(unpack(&buf), row);
        let mut other = Vec::new();
        pack(
            &mut other,
            &[3],
            &[
                Value::Float(0.0),
                Value::Null,
                Value::Null,
                Value::Float(0.0),
            ],
        );
        let mut zero = Vec::new();
        pack(&mut zero, &[3], &row);
        assert_eq!(other, zero);
        assert!(PackedKey::new(&buf) == PackedKey::new(&buf));
        assert!(matches!(PackedKey::new(&buf), PackedKey::Heap(_)));
        assert!(matches!(PackedKey::new(&zero), PackedKey::Inline(..)));
    }

    #[test]
    fn same_bytes_compares_every_byte_at_every_length() {
        for n in 0..40usize {
            let a: Vec<u8> = (0..n as u8).collect();
            assert!(same_bytes(&a, &a.clone()));
            for i in 0..n {
                let mut b = a.clone();
                b[i] ^= 0x40;
                assert!(!same_bytes(&a, &b), "length {n}, byte {i}");
            }
            assert!(!same_bytes(&a, &a[..n.saturating_sub(1)]) || n == 0);
        }
    }

    /// A key of one text column, looked up by its text, hashes and matches as its
    /// packed bytes do; a longer key that begins with the same text matches neither.
    #[test]
    fn a_lone_text_key_is_found_by_its_text() {
        let row = vec![
            Value::Text("card-1".into()),
            Value::Int(3),
            Value::Text("a text longer than a key kept inline".into()),
        ];
        for c in [0, 2] {
            let mut buf = Vec::new();
            let text = KeyRef::of(&mut buf, &[c], &row);
            assert!(matches!(text, KeyRef::Text(_)));
            let mut packed = Vec::new();
            pack(&mut packed, &[c], &row);
            let packed = KeyRef::Packed(&packed);
            assert_eq!(text.hash(), packed.hash());
            assert!(text.matches(&packed.to_vec()) && packed.matches(&text.to_vec()));
            assert!(text.to_packed() == packed.to_packed());
            assert_eq!(unpack(text.to_packed().as_bytes()), vec![row[c].clone()]);
        }
        let mut two = Vec::new();
        pack(&mut two, &[0, 1], &row);
        let mut buf = Vec::new();
        let text = KeyRef::of(&mut buf, &[0], &row);
        assert!(!text.matches(&two));
        let mut buf = Vec::new();
        assert!(matches!(
            KeyRef::of(&mut buf, &[1], &row),
            KeyRef::Packed(_)
        ));
        // A text made of the bytes that follow a two-column key's first header is not
        // that key: the header's length says where its text ends.
        let forged = std::str::from_utf8(&two[5..]).expect("ASCII and control bytes");
        assert!(!KeyRef::Text(forged).matches(&two));
    }
}
