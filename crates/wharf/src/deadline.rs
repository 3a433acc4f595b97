//! Deadlines from durations a user configures, which may be as long as they like
//! (`Duration::MAX` for "no limit"): a deadline past what `Instant` holds is a century away
//! instead of a panic.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

/// `by` after `from`, or a century after it when that does not fit.
pub(crate) fn later(from: Instant, by: Duration) -> Instant {
    from.checked_add(by)
        .unwrap_or_else(|| from + Duration::from_secs(100 * 365 * 24 * 3600))
}

/// The moment the credentials of a stream's principal expire ([`Principal::expires`]), on
/// tokio's clock; `None` for credentials that do not.
///
/// [`Principal::expires`]: crate::Principal::expires
pub(crate) fn credentials_end(principal: &crate::Principal) -> Option<Instant> {
    principal.expires().map(|at| {
        let left = at.duration_since(SystemTime::now()).unwrap_or_default();
        later(Instant::now(), left)
    })
}

/// Resolves at `at`; never for `None`.
pub(crate) async fn reached(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
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
