//! Warnings a flood can set off once per request, logged once per interval.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A warning that anyone able to send requests can set off on each one (a limit reached, a
/// dependency that does not answer): logged at most once per interval, with how many were
/// held back since, so that a flood of requests does not become a flood of log lines. The
/// counters are what tell how many there were.
///
/// ```
/// use std::time::Duration;
/// use wharf::metrics::Throttled;
///
/// static AT_LIMIT: Throttled = Throttled::new(Duration::from_secs(10));
///
/// if let Some(held_back) = AT_LIMIT.ready() {
///     tracing::warn!(held_back, "requests at their limit; one was refused");
/// }
/// ```
#[derive(Debug)]
pub struct Throttled {
    every_ms: u64,
    /// When it was last logged, in milliseconds since [`epoch`] plus one (0: never).
    last: AtomicU64,
    held_back: AtomicU64,
}

/// The one clock every `Throttled` reads, from its first use.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl Throttled {
    /// A warning logged at most once per `every`.
    pub const fn new(every: Duration) -> Self {
        let ms = every.as_millis();
        Throttled {
            every_ms: if ms > u64::MAX as u128 {
                u64::MAX
            } else {
                ms as u64
            },
            last: AtomicU64::new(0),
            held_back: AtomicU64::new(0),
        }
    }

    /// `Some(how many were held back since the last one)` when the warning is to be
    /// logged now; `None`, counting it as held back, otherwise.
    pub fn ready(&self) -> Option<u64> {
        let now = u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX);
        self.ready_at(now.saturating_add(1))
    }

    fn ready_at(&self, now: u64) -> Option<u64> {
        let last = self.last.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= self.every_ms;
        if due
            && self
                .last
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.held_back.swap(0, Ordering::Relaxed));
        }
        self.held_back.fetch_add(1, Ordering::Relaxed);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_saying_how_many_it_held_back() {
        let w = Throttled::new(Duration::from_secs(10));
        assert_eq!(w.ready_at(5), Some(0));
        assert_eq!(w.ready_at(6), None);
        assert_eq!(w.ready_at(10_004), None);
        assert_eq!(w.ready_at(10_005), Some(2));
        assert_eq!(w.ready_at(10_006), None);
        assert_eq!(w.ready_at(40_000), Some(1));
        // Nothing held back: the next line says so.
        assert_eq!(w.ready_at(50_000), Some(0));
    }

    #[test]
    fn a_real_clock_logs_the_first_at_once() {
        let w = Throttled::new(Duration::from_secs(3600));
        assert_eq!(w.ready(), Some(0));
        assert_eq!(w.ready(), None);
        assert_eq!(w.ready(), None);
        assert_eq!(w.held_back.load(Ordering::Relaxed), 2);
    }
}
