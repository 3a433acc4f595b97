//! Deadlines from durations a user configures, which may be as long as they like
//! (`Duration::MAX` for "no limit"): a deadline past what `Instant` holds is a century away
//! instead of a panic.

use std::time::Duration;

use tokio::time::Instant;

/// `by` after `from`, or a century after it when that does not fit.
pub(crate) fn later(from: Instant, by: Duration) -> Instant {
    from.checked_add(by)
        .unwrap_or_else(|| from + Duration::from_secs(100 * 365 * 24 * 3600))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_too_far_to_hold_is_a_century_away() {
        let now = Instant::now();
        assert_eq!(
            later(now, Duration::from_secs(5)),
            now + Duration::from_secs(5)
        );
        assert!(later(now, Duration::MAX) > now + Duration::from_secs(99 * 365 * 24 * 3600));
    }
}
