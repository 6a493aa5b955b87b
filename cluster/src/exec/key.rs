//! Group keys packed into bytes, stored inline in the group table when short.
//!
//! Invariant: two rows have equal packed keys exactly when their group-by values are
//! equal under `Value`'s equality (-0.0 equals 0.0, all NaNs are one value), and
//! `unpack(pack(values)) == values`. Short keys (most card or account ids) live inside
//! the hash table's bucket, so a lookup compares bytes already in cache instead of
//! following a pointer to each stored string.

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};

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
#[inline]
pub fn pack(buf: &mut Vec<u8>, columns: &[usize], row: &[Value]) {
    buf.clear();
    // One text column is the usual key (a card, an account), packed inline where it is
    // used: the event path packs every key several times.
    if let [c] = columns {
        if let Some(Value::Text(s)) = row.get(*c) {
            pack_text(buf, s);
            return;
        }
    }
    pack_any(buf, columns, row);
}

/// A text value's bytes: its tag, its length, then the text.
#[inline]
fn pack_text(buf: &mut Vec<u8>, s: &str) {
    let [l0, l1, l2, l3] = (s.len() as u32).to_le_bytes();
    buf.reserve(5 + s.len());
    buf.extend_from_slice(&[TEXT, l0, l1, l2, l3]);
    buf.extend_from_slice(s.as_bytes());
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
        // A key of one text column (packed on its own path) is the general form's bytes.
        let mut one = Vec::new();
        pack(&mut one, &[0], &row);
        let mut general = Vec::new();
        pack_any(&mut general, &[0], &row);
        assert_eq!(one, general);
        assert_eq!(unpack(&one), vec![row[0].clone()]);
    }
}
