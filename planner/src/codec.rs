//! Compact binary forms of values, event rows (the log's records) and aggregate states
//! (the state store's values): a tag byte per value and little-endian payloads,
//! independent of any schema so that bytes can be read back without the catalog that
//! wrote them.
//!
//! Invariant: decoding what was encoded gives the same value, floats bit for bit; a
//! decoder given bytes it did not write returns `None`, never garbage.

use crate::types::{Row, Value};

const NULL: u8 = 0;
const FALSE: u8 = 1;
const TRUE: u8 = 2;
const INT: u8 = 3;
const NUMERIC: u8 = 4;
const FLOAT: u8 = 5;
const TEXT: u8 = 6;
const TIMESTAMP: u8 = 7;

/// A byte reader for decoders.
pub struct Reader<'a>(pub &'a [u8]);

impl<'a> Reader<'a> {
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }

    pub fn arr<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    pub fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.arr()?))
    }

    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.arr()?))
    }

    pub fn i64(&mut self) -> Option<i64> {
        Some(i64::from_le_bytes(self.arr()?))
    }

    pub fn i128(&mut self) -> Option<i128> {
        Some(i128::from_le_bytes(self.arr()?))
    }

    pub fn f64(&mut self) -> Option<f64> {
        Some(f64::from_bits(self.u64()?))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// A number `put_varint` wrote; `None` past the end or past ten bytes.
    pub fn varint(&mut self) -> Option<u64> {
        let mut v = 0_u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7F) << shift;
            if b < 0x80 {
                return Some(v);
            }
        }
        None
    }
}

/// Appends one value.
pub fn encode_value(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Null => out.push(NULL),
        Value::Bool(false) => out.push(FALSE),
        Value::Bool(true) => out.push(TRUE),
        Value::Int(i) => {
            out.push(INT);
            out.extend_from_slice(&i.to_le_bytes());
        }
        Value::Numeric(n) => {
            out.push(NUMERIC);
            out.extend_from_slice(&n.get().to_le_bytes());
        }
        Value::Float(f) => {
            out.push(FLOAT);
            out.extend_from_slice(&f.to_bits().to_le_bytes());
        }
        Value::Text(s) => {
            out.push(TEXT);
            out.extend_from_slice(&(s.len() as u32).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        }
        Value::Timestamp(t) => {
            out.push(TIMESTAMP);
            out.extend_from_slice(&t.to_le_bytes());
        }
    }
}

/// The bytes `encode_value` writes for `v`.
pub fn encoded_len(v: &Value) -> usize {
    1 + match v {
        Value::Null | Value::Bool(_) => 0,
        Value::Int(_) | Value::Float(_) | Value::Timestamp(_) => 8,
        Value::Numeric(_) => 16,
        Value::Text(s) => 4 + s.len(),
    }
}

/// Reads one value.
pub fn decode_value(r: &mut Reader<'_>) -> Option<Value> {
    Some(match r.u8()? {
        NULL => Value::Null,
        FALSE => Value::Bool(false),
        TRUE => Value::Bool(true),
        INT => Value::Int(r.i64()?),
        NUMERIC => Value::Numeric(r.i128()?.into()),
        FLOAT => Value::Float(r.f64()?),
        TEXT => {
            let len = r.u32()? as usize;
            let s = std::str::from_utf8(r.take(len)?).ok()?;
            Value::Text(s.into())
        }
        TIMESTAMP => Value::Timestamp(r.i64()?),
        _ => return None,
    })
}

/// Appends `v` in LEB128: seven bits a byte, low first, the high bit set on all but the
/// last.
pub fn put_varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A signed number as `put_varint` writes it small: 0, -1, 1, -2, … as 0, 1, 2, 3, ….
pub fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// The inverse of `zigzag`.
pub fn unzigzag(v: u64) -> i64 {
    (v >> 1) as i64 ^ -((v & 1) as i64)
}

/// Skips one value `encode_value` wrote, without building it; `None` if there is none.
pub fn skip_value(r: &mut Reader<'_>) -> Option<()> {
    let len = match r.u8()? {
        NULL | FALSE | TRUE => 0,
        INT | FLOAT | TIMESTAMP => 8,
        NUMERIC => 16,
        TEXT => r.u32()? as usize,
        _ => return None,
    };
    r.take(len).map(|_| ())
}

/// Whether `bytes` are exactly what `encode_value(v)` writes (floats bit for bit).
pub fn is_encoding_of(v: &Value, bytes: &[u8]) -> bool {
    let (tag, payload) = match bytes.split_first() {
        Some((tag, payload)) => (*tag, payload),
        None => return false,
    };
    match v {
        Value::Null => tag == NULL && payload.is_empty(),
        Value::Bool(false) => tag == FALSE && payload.is_empty(),
        Value::Bool(true) => tag == TRUE && payload.is_empty(),
        Value::Int(i) => tag == INT && payload == i.to_le_bytes(),
        Value::Numeric(n) => tag == NUMERIC && payload == n.get().to_le_bytes(),
        Value::Float(f) => tag == FLOAT && payload == f.to_bits().to_le_bytes(),
        Value::Timestamp(t) => tag == TIMESTAMP && payload == t.to_le_bytes(),
        Value::Text(s) => {
            tag == TEXT && payload.len() == 4 + s.len() && &payload[4..] == s.as_bytes()
        }
    }
}

/// Appends a row: its length, then its values.
pub fn encode_row(row: &[Value], out: &mut Vec<u8>) {
    out.extend_from_slice(&(row.len() as u16).to_le_bytes());
    for v in row {
        encode_value(v, out);
    }
}

/// Reads a row back; `None` if the bytes are not exactly one row.
pub fn decode_row(bytes: &[u8]) -> Option<Row> {
    let mut r = Reader(bytes);
    let row = read_row(&mut r)?;
    r.is_empty().then(|| Row::from(row))
}

/// Reads one row from the front of `r`.
pub fn read_row(r: &mut Reader<'_>) -> Option<Vec<Value>> {
    let n = u16::from_le_bytes(r.arr()?) as usize;
    let mut row = Vec::with_capacity(n);
    for _ in 0..n {
        row.push(decode_value(r)?);
    }
    Some(row)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_zigzag_round_trip() {
        let mut out = Vec::new();
        let numbers = [0, 1, 127, 128, 300, u32::MAX as u64, u64::MAX - 1, u64::MAX];
        for &n in &numbers {
            put_varint(n, &mut out);
        }
        assert_eq!(out[..4], [0, 1, 127, 0x80]);
        let mut r = Reader(&out);
        for &n in &numbers {
            assert_eq!(r.varint(), Some(n));
        }
        assert!(r.is_empty());
        assert_eq!(Reader(&[0x80]).varint(), None, "cut short");
        assert_eq!(Reader(&[0xFF; 11]).varint(), None, "past ten bytes");
        for v in [0, -1, 1, -2, i64::MIN, i64::MAX] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
        assert_eq!([zigzag(0), zigzag(-1), zigzag(1)], [0, 1, 2]);
    }

    #[test]
    fn skip_value_and_is_encoding_of_agree_with_encode_value() {
        let values = [
            Value::Null,
            Value::Bool(false),
            Value::Bool(true),
            Value::Int(-1),
            Value::Float(-0.0),
            Value::Timestamp(7),
            Value::Numeric(i128::MIN.into()),
            Value::Text("".into()),
            Value::Text("a text of more than fifteen bytes".into()),
        ];
        for (i, v) in values.iter().enumerate() {
            let mut out = Vec::new();
            encode_value(v, &mut out);
            out.push(0xEE);
            let mut r = Reader(&out);
            assert_eq!(skip_value(&mut r), Some(()), "{v:?}");
            assert_eq!(r.0, [0xEE], "{v:?}");
            let bytes = &out[..out.len() - 1];
            for (j, w) in values.iter().enumerate() {
                assert_eq!(is_encoding_of(w, bytes), i == j, "{w:?} against {v:?}");
            }
            assert!(
                skip_value(&mut Reader(&bytes[..bytes.len() - 1])).is_none(),
                "{v:?} cut short"
            );
        }
        assert!(!is_encoding_of(&Value::Float(0.0), &{
            let mut out = Vec::new();
            encode_value(&Value::Float(-0.0), &mut out);
            out
        }));
        assert!(skip_value(&mut Reader(&[0xEE])).is_none());
    }

    #[test]
    fn encoded_len_is_what_encode_value_writes() {
        let values = [
            Value::Null,
            Value::Bool(true),
            Value::Int(-1),
            Value::Float(0.5),
            Value::Timestamp(7),
            Value::Numeric(i128::MAX.into()),
            Value::Text("short".into()),
            Value::Text("a text past the inline length".into()),
        ];
        for v in values {
            let mut out = Vec::new();
            encode_value(&v, &mut out);
            assert_eq!(encoded_len(&v), out.len(), "{v:?}");
        }
    }

    #[test]
    fn rows_round_trip() {
        let row: Vec<Value> = vec![
            Value::Null,
            Value::Bool(true),
            Value::Bool(false),
            Value::Int(-7),
            Value::Numeric((-(1i128 << 100)).into()),
            Value::Float(-0.0),
            Value::Float(f64::NAN),
            Value::Text("héllo".into()),
            Value::Timestamp(1_767_225_600_000_000),
        ];
        let mut buf = Vec::new();
        encode_row(&row, &mut buf);
        let back = decode_row(&buf).unwrap();
        assert_eq!(back.len(), row.len());
        for (a, b) in row.iter().zip(back.iter()) {
            match (a, b) {
                (Value::Float(x), Value::Float(y)) => assert_eq!(x.to_bits(), y.to_bits()),
                _ => assert_eq!(format!("{a:?}"), format!("{b:?}")),
            }
        }
        assert!(decode_row(&buf[..buf.len() - 1]).is_none());
    }
}
