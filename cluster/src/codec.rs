//! The binary form of an event row in the log: a column count, then per value a tag byte
//! and its little-endian payload. Compact, and independent of the stream's schema so a
//! record can be read back without the catalog that wrote it.
//!
//! Invariant: `decode(encode(row)) == row` for every row (floats bit for bit).

use std::sync::Arc;

use eddy_planner::types::Value;

use crate::task::Row;

const NULL: u8 = 0;
const FALSE: u8 = 1;
const TRUE: u8 = 2;
const INT: u8 = 3;
const NUMERIC: u8 = 4;
const FLOAT: u8 = 5;
const TEXT: u8 = 6;
const TIMESTAMP: u8 = 7;

pub fn encode(row: &[Value], out: &mut Vec<u8>) {
    out.extend_from_slice(&(row.len() as u16).to_le_bytes());
    for v in row {
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
                out.extend_from_slice(&n.to_le_bytes());
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
}

/// Reads a row back; `None` if the bytes are not a row.
pub fn decode(mut b: &[u8]) -> Option<Row> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        if b.len() < n {
            return None;
        }
        let (head, tail) = b.split_at(n);
        *b = tail;
        Some(head)
    }
    fn arr<const N: usize>(b: &mut &[u8]) -> Option<[u8; N]> {
        take(b, N)?.try_into().ok()
    }
    let n = u16::from_le_bytes(arr(&mut b)?) as usize;
    let mut row = Vec::with_capacity(n);
    for _ in 0..n {
        let tag = take(&mut b, 1)?[0];
        row.push(match tag {
            NULL => Value::Null,
            FALSE => Value::Bool(false),
            TRUE => Value::Bool(true),
            INT => Value::Int(i64::from_le_bytes(arr(&mut b)?)),
            NUMERIC => Value::Numeric(i128::from_le_bytes(arr(&mut b)?)),
            FLOAT => Value::Float(f64::from_bits(u64::from_le_bytes(arr(&mut b)?))),
            TEXT => {
                let len = u32::from_le_bytes(arr(&mut b)?) as usize;
                let s = std::str::from_utf8(take(&mut b, len)?).ok()?;
                Value::Text(Arc::from(s))
            }
            TIMESTAMP => Value::Timestamp(i64::from_le_bytes(arr(&mut b)?)),
            _ => return None,
        });
    }
    b.is_empty().then(|| Row::from(row))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip() {
        let row: Vec<Value> = vec![
            Value::Null,
            Value::Bool(true),
            Value::Bool(false),
            Value::Int(-7),
            Value::Numeric(-(1i128 << 100)),
            Value::Float(-0.0),
            Value::Float(f64::NAN),
            Value::Text("héllo".into()),
            Value::Timestamp(1_767_225_600_000_000),
        ];
        let mut buf = Vec::new();
        encode(&row, &mut buf);
        let back = decode(&buf).unwrap();
        assert_eq!(back.len(), row.len());
        for (a, b) in row.iter().zip(back.iter()) {
            match (a, b) {
                (Value::Float(x), Value::Float(y)) => assert_eq!(x.to_bits(), y.to_bits()),
                _ => assert_eq!(format!("{a:?}"), format!("{b:?}")),
            }
        }
        assert!(decode(&buf[..buf.len() - 1]).is_none());
    }
}
