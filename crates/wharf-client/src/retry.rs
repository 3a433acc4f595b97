//! When to send a request again: after what the server's `Retry-After` asks, or after a
//! short backoff of the client's own when it asks nothing.

use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, RETRY_AFTER};

/// The longest `Retry-After` a retry waits for. A server asking for longer is not retried:
/// the caller gets the error (with the delay) instead of a command hanging in silence.
pub const LONGEST_WAIT: Duration = Duration::from_secs(30);

/// The delay a response's `Retry-After` asks for: delay-seconds, or an HTTP date (RFC 9110
/// §10.2.3; a date already past is no delay). `None` without one, or for one unreadable.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(
        at.duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

/// How long to wait before attempt `attempt` (2 for the first retry): what the server
/// asked for, or 400 ms doubling up to 6.4 s. `None` when the server asked for longer than
/// [`LONGEST_WAIT`].
pub(crate) fn wait_before(attempt: u32, asked: Option<Duration>) -> Option<Duration> {
    match asked {
        Some(asked) if asked > LONGEST_WAIT => None,
        Some(asked) => Some(asked),
        None => Some(Duration::from_millis(100 << attempt.min(6))),
    }
}

/// How many times a read (`server/discover`, a page of a list) is sent while it fails in a
/// way that may pass. A read changes nothing, so sending it again is always safe.
const READ_ATTEMPTS: u32 = 3;

/// A failure that may pass if the request is sent again.
pub(crate) trait Transient: std::fmt::Display {
    /// Whether sending again may help: the connection broke, a gateway or a busy server
    /// answered 502–504 (another replica may answer, or this one recover), or a rate limit
    /// answered 429 (it says when). Any other answer is the server's verdict.
    fn is_transient(&self) -> bool;

    /// How long the server's `Retry-After` asked the client to wait.
    fn retry_after(&self) -> Option<Duration>;
}

/// How long to wait before sending again after attempt `attempt` of `attempts` failed with
/// `failure`; `None` when it is not to be sent again.
pub(crate) fn next_wait(attempt: u32, attempts: u32, failure: &impl Transient) -> Option<Duration> {
    if attempt < attempts && failure.is_transient() {
        wait_before(attempt + 1, failure.retry_after())
    } else {
        None
    }
}

/// Sends the read `send` makes until it succeeds, fails for good, or was sent
/// [`READ_ATTEMPTS`] times.
pub(crate) async fn read<T, E: Transient, F>(mut send: impl FnMut() -> F) -> Result<T, E>
where
    F: Future<Output = Result<T, E>>,
{
    let mut attempt = 1;
    loop {
        let outcome = send().await;
        match outcome
            .as_ref()
            .err()
            .and_then(|e| next_wait(attempt, READ_ATTEMPTS, e))
        {
            Some(wait) => {
                attempt += 1;
                tokio::time::sleep(wait).await;
            }
            None => return outcome,
        }
    }
}

/// Whether an answer with HTTP `status` is worth sending again (see
/// [`Transient::is_transient`]).
pub(crate) fn passing_status(status: u16) -> bool {
    matches!(status, 429 | 502..=504)
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn asked(value: &str) -> Option<Duration> {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, HeaderValue::from_str(value).unwrap());
        retry_after(&headers)
    }

    #[test]
    fn retry_after_is_read_as_seconds_or_as_a_date() {
        assert_eq!(asked("3"), Some(Duration::from_secs(3)));
        assert_eq!(asked(" 0 "), Some(Duration::ZERO));
        let in_a_minute = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(61));
        let until = asked(&in_a_minute).unwrap();
        assert!(
            until > Duration::from_secs(55) && until <= Duration::from_secs(61),
            "{until:?}"
        );
        assert_eq!(
            asked("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(Duration::ZERO),
            "a date past asks for no wait"
        );
        assert_eq!(asked("-1"), None);
        assert_eq!(asked("soon"), None);
        assert_eq!(retry_after(&HeaderMap::new()), None);
    }

    #[test]
    fn a_server_asking_for_longer_than_the_longest_wait_is_not_retried() {
        assert_eq!(wait_before(2, None), Some(Duration::from_millis(400)));
        assert_eq!(wait_before(9, None), Some(Duration::from_millis(6_400)));
        assert_eq!(
            wait_before(2, Some(Duration::from_secs(1))),
            Some(Duration::from_secs(1))
        );
        assert_eq!(wait_before(2, Some(LONGEST_WAIT)), Some(LONGEST_WAIT));
        assert_eq!(
            wait_before(2, Some(LONGEST_WAIT + Duration::from_secs(1))),
            None
        );
    }
}
