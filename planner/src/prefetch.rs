//! Asking for cache lines ahead of use. An event's cost is mostly dependent cache
//! misses (its row, the text its group key is packed from, its group's entry, a
//! multiset's values), so the executor asks for the lines it will reach soon while it
//! works on something else. A prefetch is only a hint: it never faults and changes no
//! result.

use crate::types::Value;

/// Asks for every cache line of `value`, without waiting for them.
#[inline]
pub fn lines<T: ?Sized>(value: &T) {
    first_lines(value, std::mem::size_of_val(value));
}

/// Asks for the cache lines of the first `bytes` bytes of `value` (at most all of it):
/// the part of a large entry that is read, without the rest.
#[inline]
pub fn first_lines<T: ?Sized>(value: &T, bytes: usize) {
    address(
        value as *const T as *const u8 as usize,
        bytes.min(std::mem::size_of_val(value)),
    );
}

/// Asks for the cache lines of the `bytes` bytes at `start`, which need not be memory the
/// caller may read: a prefetch never faults.
#[inline]
pub fn address(start: usize, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let end = start + bytes;
        let mut line = start & !63;
        while line < end {
            // SAFETY: a prefetch only hints the cache; it never faults.
            #[allow(unsafe_code)]
            unsafe {
                _mm_prefetch(line as *const i8, _MM_HINT_T0)
            };
            line += 64;
        }
    }
}

/// Asks for the first line of the text each value of `row` points to. A short text is
/// inline, in the row itself, and points nowhere.
#[inline]
pub fn texts(row: &[Value]) {
    for v in row {
        if let Value::Text(s) = v {
            if !s.is_inline() {
                lines(&s.as_bytes()[..s.len().min(1)]);
            }
        }
    }
}
