//! Exponential backoff, the one retry-delay rule of the crate: the attach queue, the
//! Drive object sync and node labelling all wait `base * 2^attempt`, capped.
//!
//! Rules: attempt 0 is the first retry and waits `base`; each further attempt doubles
//! the delay; no delay exceeds `cap`; nothing overflows (a huge attempt or base gives
//! `cap`).

use std::time::Duration;

/// Exponential backoff: `base * 2^attempt`, never more than `cap` (attempt 0 is the first
/// retry). Saturates instead of overflowing.
pub(crate) fn backoff(attempt: u32, base: Duration, cap: Duration) -> Duration {
    let factor = 1u32.checked_shl(attempt).unwrap_or(u32::MAX);
    base.checked_mul(factor).map_or(cap, |d| d.min(cap))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn backoff_doubles_from_base_and_stops_at_the_cap() {
        let table = [
            (0, S(1)),
            (1, S(2)),
            (2, S(4)),
            (5, S(32)),
            (6, S(60)),
            (31, S(60)),
            (32, S(60)),
            (u32::MAX, S(60)),
        ];
        for (attempt, want) in table {
            assert_eq!(backoff(attempt, S(1), S(60)), want, "attempt {attempt}");
        }
        assert_eq!(backoff(3, Duration::from_millis(250), S(60)), S(2));
        assert_eq!(backoff(40, Duration::MAX, Duration::MAX), Duration::MAX);
    }
}
