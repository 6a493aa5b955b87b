//! eddy-bench: benchmark binaries live in src/bin; this library holds shared helpers.

/// A small deterministic generator (xorshift64), so every run sees the same events.
pub struct XorShift(pub u64);

impl XorShift {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}
