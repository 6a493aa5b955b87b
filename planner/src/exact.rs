//! Exact sums of doubles, rounded once when read.
//!
//! Invariant: `value()` is the exact sum of every value added and not subtracted,
//! rounded once to the nearest double (ties to even), whatever the order of the
//! operations. Two forms hold that sum:
//! - **fixed**: while every value is a multiple of 2^-64 below 2^63 (money, counts,
//!   decimals with up to three places of any realistic size), the sum is one `i128`
//!   of 2^-64 units, inline, with no heap and no loop;
//! - **wide**: otherwise, Shewchuk's non-overlapping partials (the method of Python's
//!   `math.fsum`) plus counts of the non-finite values, on the heap.
//!
//! A sum moves from fixed to wide the first time a value does not fit, and stays wide.

use crate::codec::Reader;
use crate::types::I128;

/// Fractional bits of the fixed form: the sum is `fixed × 2^-FIX_BITS`.
const FIX_BITS: i32 = 64;
/// The fixed form keeps |fixed| below 2^FIXED_LIMIT_BITS, so every rounding is exact
/// to reason about (a double rounded from it still fits in an `i128`).
const FIXED_LIMIT_BITS: u32 = 125;
/// 2^-FIX_BITS as a double.
const UNIT: f64 = 1.0 / 18_446_744_073_709_551_616.0;

#[derive(Clone, Debug, Default)]
pub struct ExactSum {
    /// The sum in 2^-64 units, while `wide` is `None` (0 once it is not).
    fixed: I128,
    wide: Option<Box<Wide>>,
}

#[derive(Clone, Debug, Default)]
struct Wide {
    /// Non-overlapping, increasing magnitude.
    partials: Vec<f64>,
    nan: u32,
    pos_inf: u32,
    neg_inf: u32,
}

/// `x` in 2^-64 units when that is an integer of at most 2^FIXED_LIMIT_BITS.
#[inline]
fn to_fixed(x: f64) -> Option<i128> {
    if x == 0.0 {
        return Some(0);
    }
    let bits = x.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i32;
    if exp == 0 || exp == 0x7ff {
        // Subnormal (far below 2^-64), infinite or NaN.
        return None;
    }
    let mantissa = (bits & ((1u64 << 52) - 1)) | (1u64 << 52);
    // x = mantissa × 2^(exp − 1075); in units, shift by FIX_BITS more.
    let shift = exp - 1075 + FIX_BITS;
    let magnitude = if shift >= 0 {
        if shift > FIXED_LIMIT_BITS as i32 - 53 {
            return None;
        }
        (mantissa as i128) << shift
    } else {
        let drop = -shift;
        if drop > 52 || mantissa.trailing_zeros() < drop as u32 {
            return None;
        }
        (mantissa >> drop) as i128
    };
    Some(if x < 0.0 { -magnitude } else { magnitude })
}

#[inline]
fn fits(v: i128) -> bool {
    v.unsigned_abs() < 1u128 << FIXED_LIMIT_BITS
}

/// The exact decomposition of fixed units into non-overlapping doubles, smallest first:
/// each part takes the top 53 bits of what is left, so an i128 needs at most three.
struct FixedParts {
    parts: [f64; 3],
    len: usize,
}

impl FixedParts {
    fn of(fixed: i128) -> FixedParts {
        let mut parts = [0.0; 3];
        let mut len = 0;
        let mut rest = fixed;
        while rest != 0 {
            // Rounding to 53 bits: the rest is below half an ulp of `d`, so the parts
            // never overlap; `d` is an integer below 2^126, exact as an i128.
            let d = rest as f64;
            parts[len] = d * UNIT;
            len += 1;
            rest -= d as i128;
        }
        parts[..len].reverse();
        FixedParts { parts, len }
    }

    fn as_slice(&self) -> &[f64] {
        &self.parts[..self.len]
    }
}

impl Wide {
    /// The wide form of `fixed` units: its exact decomposition into doubles.
    fn of_fixed(fixed: i128) -> Wide {
        Wide {
            partials: FixedParts::of(fixed).as_slice().to_vec(),
            ..Wide::default()
        }
    }

    fn grow(&mut self, mut x: f64) {
        let mut kept = 0;
        for j in 0..self.partials.len() {
            let mut y = self.partials[j];
            if x.abs() < y.abs() {
                std::mem::swap(&mut x, &mut y);
            }
            let hi = x + y;
            let lo = y - (hi - x);
            if lo != 0.0 {
                self.partials[kept] = lo;
                kept += 1;
            }
            x = hi;
        }
        self.partials.truncate(kept);
        if x != 0.0 {
            self.partials.push(x);
        }
    }

    /// Adds (`sign` 1) or removes (−1) one value.
    fn put(&mut self, x: f64, sign: i32) {
        let count = if x.is_nan() {
            &mut self.nan
        } else if x == f64::INFINITY {
            &mut self.pos_inf
        } else if x == f64::NEG_INFINITY {
            &mut self.neg_inf
        } else {
            self.grow(if sign > 0 { x } else { -x });
            return;
        };
        *count = count.wrapping_add_signed(sign);
    }

    /// The sum of the partials rounded once (fsum's final step).
    fn round(&self) -> f64 {
        let p = &self.partials;
        let mut n = p.len();
        if n == 0 {
            return 0.0;
        }
        n -= 1;
        let mut hi = p[n];
        let mut lo = 0.0;
        while n > 0 {
            n -= 1;
            let x = hi;
            let y = p[n];
            hi = x + y;
            let yr = hi - x;
            lo = y - yr;
            if lo != 0.0 {
                break;
            }
        }
        // Round half to even correctly when the remaining partials push past a tie.
        if n > 0 && ((lo < 0.0 && p[n - 1] < 0.0) || (lo > 0.0 && p[n - 1] > 0.0)) {
            let y = lo * 2.0;
            let x = hi + y;
            let yr = x - hi;
            if y == yr {
                hi = x;
            }
        }
        hi
    }
}

impl ExactSum {
    #[inline]
    pub fn add(&mut self, x: f64) {
        self.put(x, 1);
    }

    #[inline]
    pub fn sub(&mut self, x: f64) {
        self.put(x, -1);
    }

    #[inline]
    fn put(&mut self, x: f64, sign: i32) {
        if self.wide.is_none() {
            if let Some(units) = to_fixed(x) {
                let fixed = self.fixed.get();
                let next = if sign > 0 {
                    fixed.checked_add(units)
                } else {
                    fixed.checked_sub(units)
                };
                if let Some(next) = next.filter(|v| fits(*v)) {
                    self.fixed = next.into();
                    return;
                }
            }
            self.wide = Some(Box::new(Wide::of_fixed(
                std::mem::take(&mut self.fixed).get(),
            )));
        }
        self.wide.as_mut().expect("made wide above").put(x, sign);
    }

    pub fn has_special(&self) -> bool {
        self.wide
            .as_ref()
            .is_some_and(|w| w.nan > 0 || w.pos_inf > 0 || w.neg_inf > 0)
    }

    /// The exact sum rounded once to the nearest double.
    pub fn value(&self) -> f64 {
        let Some(w) = &self.wide else {
            // An integer to a double rounds to nearest, ties to even; scaling by a power
            // of two is then exact (the result is a normal double or zero).
            return self.fixed.get() as f64 * UNIT;
        };
        if w.nan > 0 || (w.pos_inf > 0 && w.neg_inf > 0) {
            return f64::NAN;
        }
        if w.pos_inf > 0 {
            return f64::INFINITY;
        }
        if w.neg_inf > 0 {
            return f64::NEG_INFINITY;
        }
        w.round()
    }

    /// The finite part of the sum as non-overlapping doubles, increasing magnitude.
    pub fn partials(&self) -> Vec<f64> {
        match &self.wide {
            Some(w) => w.partials.clone(),
            None => Wide::of_fixed(self.fixed.get()).partials,
        }
    }

    fn specials(&self) -> [u32; 3] {
        self.wide
            .as_ref()
            .map_or([0; 3], |w| [w.nan, w.pos_inf, w.neg_inf])
    }

    /// The stored form: the partials, then the NaN, +∞ and −∞ counts.
    pub fn encode(&self, out: &mut Vec<u8>) {
        // The fixed form is decomposed on the stack: a checkpoint encodes every sum it
        // writes, so no allocation per sum.
        let fixed;
        let partials = match &self.wide {
            Some(w) => &w.partials[..],
            None => {
                fixed = FixedParts::of(self.fixed.get());
                fixed.as_slice()
            }
        };
        out.extend_from_slice(&(partials.len() as u32).to_le_bytes());
        for p in partials {
            out.extend_from_slice(&p.to_bits().to_le_bytes());
        }
        for n in self.specials() {
            out.extend_from_slice(&n.to_le_bytes());
        }
    }

    pub fn decode(r: &mut Reader<'_>) -> Option<ExactSum> {
        let n = r.u32()? as usize;
        let mut partials = Vec::with_capacity(n.min(64));
        for _ in 0..n {
            partials.push(r.f64()?);
        }
        let (nan, pos_inf, neg_inf) = (r.u32()?, r.u32()?, r.u32()?);
        if nan == 0 && pos_inf == 0 && neg_inf == 0 {
            let fixed = partials.iter().try_fold(0i128, |acc, &p| {
                acc.checked_add(to_fixed(p)?).filter(|v| fits(*v))
            });
            if let Some(fixed) = fixed {
                return Some(ExactSum {
                    fixed: fixed.into(),
                    wide: None,
                });
            }
        }
        Some(ExactSum {
            fixed: I128::default(),
            wide: Some(Box::new(Wide {
                partials,
                nan,
                pos_inf,
                neg_inf,
            })),
        })
    }
}

/// Equal when the exact sums and the non-finite counts are, whatever the forms.
impl PartialEq for ExactSum {
    fn eq(&self, other: &Self) -> bool {
        if let (None, None) = (&self.wide, &other.wide) {
            return self.fixed == other.fixed;
        }
        if self.specials() != other.specials() {
            return false;
        }
        let mut diff = Wide {
            partials: self.partials(),
            ..Wide::default()
        };
        for p in other.partials() {
            diff.grow(-p);
        }
        diff.partials.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exact sum of `xs` rounded once, by the partials alone.
    fn reference(xs: &[(f64, i32)]) -> f64 {
        let mut w = Wide::default();
        for &(x, sign) in xs {
            w.put(x, sign);
        }
        w.round()
    }

    #[test]
    fn fixed_values_stay_inline_and_round_once() {
        let mut s = ExactSum::default();
        let mut ops = Vec::new();
        for i in 0..10_000 {
            let x = (i * 7919 % 100_000) as f64 / 100.0;
            s.add(x);
            ops.push((x, 1));
            if i % 3 == 0 {
                s.sub(x / 2.0);
                ops.push((x / 2.0, -1));
            }
            assert_eq!(s.value(), reference(&ops));
        }
        assert!(s.wide.is_none());
    }

    #[test]
    fn values_that_do_not_fit_go_wide_and_keep_the_sum() {
        for odd in [1e-30, 3.0e40, f64::MIN_POSITIVE, 0.1 * 1e-5] {
            let mut s = ExactSum::default();
            s.add(0.01);
            s.add(1e6);
            s.add(odd);
            assert!(s.wide.is_some());
            assert_eq!(s.value(), reference(&[(0.01, 1), (1e6, 1), (odd, 1)]));
            s.sub(odd);
            assert_eq!(s.value(), 0.01 + 1e6);
        }
        let mut s = ExactSum::default();
        for _ in 0..4 {
            s.add(2f64.powi(60));
        }
        assert_eq!(s.value(), 2f64.powi(62));
        s.add(f64::INFINITY);
        assert_eq!(s.value(), f64::INFINITY);
        s.sub(f64::INFINITY);
        assert_eq!(s.value(), 2f64.powi(62));
    }

    /// The fixed form stores the very bytes its wide form would, up to three parts.
    #[test]
    fn the_fixed_form_stores_its_wide_decomposition() {
        for xs in [
            &[][..],
            &[0.5, -0.25][..],
            &[2f64.powi(58), 2f64.powi(58), 0.1, -7.0][..],
            &[-(2f64.powi(59)), 2f64.powi(-60), 3.0][..],
        ] {
            let mut s = ExactSum::default();
            for &x in xs {
                s.add(x);
            }
            assert!(s.wide.is_none());
            let parts = FixedParts::of(s.fixed.get());
            assert!(parts.as_slice().windows(2).all(|w| w[0].abs() < w[1].abs()));
            let wide = ExactSum {
                fixed: I128::default(),
                wide: Some(Box::new(Wide::of_fixed(s.fixed.get()))),
            };
            let (mut fixed_bytes, mut wide_bytes) = (Vec::new(), Vec::new());
            s.encode(&mut fixed_bytes);
            wide.encode(&mut wide_bytes);
            assert_eq!(fixed_bytes, wide_bytes);
            assert_eq!(
                ExactSum::decode(&mut Reader(&fixed_bytes)).as_ref(),
                Some(&s)
            );
        }
    }

    #[test]
    fn the_stored_form_reads_back_equal() {
        let mut a = ExactSum::default();
        let mut b = ExactSum::default();
        for x in [0.1, 0.25, 1e9 + 0.5, -3.75] {
            a.add(x);
            b.add(x);
        }
        b.add(1e-30);
        b.sub(1e-30);
        assert!(b.wide.is_some());
        assert_eq!(a, b);
        for s in [&a, &b] {
            let mut out = Vec::new();
            s.encode(&mut out);
            let back = ExactSum::decode(&mut Reader(&out)).expect("decodes");
            assert!(back.wide.is_none());
            assert_eq!(&back, s);
            assert_eq!(back.value(), s.value());
        }
    }
}
