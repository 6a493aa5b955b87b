//! Window bookkeeping: which event times a window holds at stream time T.
//!
//! Invariant: a window is described by its edges only (offsets from T); the executor
//! moves each edge forward monotonically, so an event enters and leaves a window at most
//! once, in event-time order.

use crate::types::format_duration_us;

/// A window kind with its sizes in microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WindowSpec {
    /// Events with T − delay − size < ts ≤ T − delay.
    Sliding { size_us: i64, delay_us: i64 },
    /// Events with ⌊T / size⌋·size ≤ ts ≤ T, aligned to the Unix epoch.
    Tumbling { size_us: i64 },
    /// The last completed hop window: with E = ⌊T / hop⌋·hop (aligned to the Unix
    /// epoch), events with E − size ≤ ts < E. Not exact per event: the result lags T
    /// by up to one hop and covers a window that ends before it.
    Hopping { size_us: i64, hop_us: i64 },
    /// Every event with ts ≤ T.
    Infinite,
    /// `SLIDING (SIZE n EVENTS)`: the n newest events of each group (largest event time,
    /// then latest arrival). Events never leave by time; a newer one displaces the oldest.
    Count { events: i64 },
}

impl WindowSpec {
    /// The newest event time inside the window at stream time `t` (the head edge).
    #[inline]
    pub fn head_bound(&self, t: i64) -> i64 {
        match self {
            WindowSpec::Sliding { delay_us, .. } => t.saturating_sub(*delay_us),
            WindowSpec::Hopping { hop_us, .. } => t.div_euclid(*hop_us) * hop_us - 1,
            WindowSpec::Tumbling { .. } | WindowSpec::Infinite | WindowSpec::Count { .. } => t,
        }
    }

    /// Event times at or below this bound have left the window at stream time `t`
    /// (the tail edge); `None` when nothing ever leaves.
    #[inline]
    pub fn tail_bound(&self, t: i64) -> Option<i64> {
        match self {
            WindowSpec::Sliding { size_us, delay_us } => {
                Some(t.saturating_sub(*delay_us).saturating_sub(*size_us))
            }
            WindowSpec::Tumbling { size_us } => Some(t.div_euclid(*size_us) * size_us - 1),
            WindowSpec::Hopping { size_us, hop_us } => {
                Some(t.div_euclid(*hop_us) * hop_us - size_us - 1)
            }
            WindowSpec::Infinite | WindowSpec::Count { .. } => None,
        }
    }

    /// How many events of a group the window keeps (count windows only).
    #[inline]
    pub fn keep(&self) -> Option<usize> {
        match self {
            WindowSpec::Count { events } => Some(*events as usize),
            _ => None,
        }
    }

    /// Whether the window's result is exact at every event (every window but hopping).
    pub fn exact_per_event(&self) -> bool {
        !matches!(self, WindowSpec::Hopping { .. })
    }

    /// Whether an event at `ts` belongs to the window at stream time `t`.
    pub fn contains(&self, t: i64, ts: i64) -> bool {
        ts <= self.head_bound(t) && self.tail_bound(t).is_none_or(|tail| ts > tail)
    }

    /// How far back from T the reservoir must keep events for this window.
    pub fn reach_us(&self) -> Option<i64> {
        match self {
            WindowSpec::Sliding { size_us, delay_us } => Some(size_us + delay_us),
            WindowSpec::Tumbling { size_us } => Some(*size_us),
            WindowSpec::Hopping { size_us, hop_us } => Some(size_us + hop_us),
            WindowSpec::Infinite | WindowSpec::Count { .. } => None,
        }
    }

    /// The tumbling epoch of stream time `t`: a change of epoch empties the window at once.
    pub fn epoch(&self, t: i64) -> i64 {
        match self {
            WindowSpec::Tumbling { size_us } => t.div_euclid(*size_us),
            _ => 0,
        }
    }

    /// The clause as written in SQL, for EXPLAIN and DESCRIBE.
    pub fn to_sql(&self) -> String {
        match self {
            WindowSpec::Sliding {
                size_us,
                delay_us: 0,
            } => {
                format!("SLIDING (SIZE {})", format_duration_us(*size_us))
            }
            WindowSpec::Sliding { size_us, delay_us } => format!(
                "SLIDING (SIZE {}, DELAY {})",
                format_duration_us(*size_us),
                format_duration_us(*delay_us)
            ),
            WindowSpec::Tumbling { size_us } => {
                format!("TUMBLING (SIZE {})", format_duration_us(*size_us))
            }
            WindowSpec::Hopping { size_us, hop_us } => format!(
                "HOPPING (SIZE {}, HOP {})",
                format_duration_us(*size_us),
                format_duration_us(*hop_us)
            ),
            WindowSpec::Infinite => "INFINITE".to_string(),
            WindowSpec::Count { events } => format!("SLIDING (SIZE {events} EVENTS)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sliding_bounds() {
        let w = WindowSpec::Sliding {
            size_us: 10,
            delay_us: 0,
        };
        assert!(w.contains(100, 100));
        assert!(w.contains(100, 91));
        assert!(!w.contains(100, 90));
        let d = WindowSpec::Sliding {
            size_us: 10,
            delay_us: 5,
        };
        assert!(!d.contains(100, 96));
        assert!(d.contains(100, 95));
        assert!(!d.contains(100, 85));
    }

    #[test]
    fn hopping_holds_the_last_completed_window() {
        let w = WindowSpec::Hopping {
            size_us: 30,
            hop_us: 10,
        };
        // At T = 47 the last completed window is [10, 40).
        assert!(!w.contains(47, 40));
        assert!(w.contains(47, 39));
        assert!(w.contains(47, 10));
        assert!(!w.contains(47, 9));
        // At T = 50 it is [20, 50).
        assert!(w.contains(50, 49));
        assert!(!w.contains(50, 19));
        assert_eq!(w.reach_us(), Some(40));
        assert!(!w.exact_per_event());
    }

    #[test]
    fn tumbling_bounds_align_to_epoch() {
        let w = WindowSpec::Tumbling { size_us: 10 };
        assert!(w.contains(25, 20));
        assert!(!w.contains(25, 19));
        assert!(w.contains(-5, -10));
        assert_eq!(w.epoch(25), 2);
        assert!(WindowSpec::Infinite.contains(25, i64::MIN));
    }
}
