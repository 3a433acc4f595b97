//! How long a fetched metadata document may be reused, from its HTTP caching headers (RFC
//! 9111 §4.2.1, read as a shared cache reads them: the authorization server serves every user
//! from one copy). A document that says nothing is not reused; one that forbids storing is
//! not; whatever it allows is cut to a ceiling, so a client's change of redirect URIs or keys
//! reaches the server within a day at worst.

use std::time::{Duration, SystemTime};

use http::HeaderMap;
use http::header::{AGE, CACHE_CONTROL, DATE, EXPIRES, PRAGMA};

/// The longest a document is reused, whatever its headers say.
pub const MAX_FRESHNESS: Duration = Duration::from_secs(24 * 60 * 60);

/// How long the response with these headers may be reused from `now`, within
/// [`MAX_FRESHNESS`]; `None` when it must not be reused at all.
pub fn freshness(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let lifetime = lifetime(headers, now)?;
    let age = header(headers, AGE.as_str())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(Duration::ZERO, Duration::from_secs);
    let fresh = lifetime.checked_sub(age)?.min(MAX_FRESHNESS);
    (!fresh.is_zero()).then_some(fresh)
}

fn lifetime(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let mut max_age = None;
    let mut s_maxage = None;
    let mut cache_control = false;
    for value in headers.get_all(CACHE_CONTROL) {
        cache_control = true;
        let value = value.to_str().ok()?;
        for directive in value.split(',') {
            let (name, arg) = match directive.split_once('=') {
                Some((name, arg)) => (name.trim(), Some(arg.trim().trim_matches('"'))),
                None => (directive.trim(), None),
            };
            match name.to_ascii_lowercase().as_str() {
                "no-store" | "no-cache" | "private" => return None,
                // A malformed age makes the response stale (RFC 9111 §1.2.2).
                "max-age" => max_age = Some(arg?.parse::<u64>().ok()?),
                "s-maxage" => s_maxage = Some(arg?.parse::<u64>().ok()?),
                _ => {}
            }
        }
    }
    if let Some(seconds) = s_maxage.or(max_age) {
        return Some(Duration::from_secs(seconds));
    }
    if !cache_control
        && header(headers, PRAGMA.as_str())
            .is_some_and(|p| p.to_ascii_lowercase().contains("no-cache"))
    {
        return None;
    }
    // Expires counts from the origin's Date, so a skewed clock on either side does not
    // stretch it.
    let expires = httpdate::parse_http_date(header(headers, EXPIRES.as_str())?).ok()?;
    let date = header(headers, DATE.as_str())
        .and_then(|d| httpdate::parse_http_date(d).ok())
        .unwrap_or(now);
    expires.duration_since(date).ok()
}

/// A header that appears once with a readable value; repeated or unreadable ones count as
/// absent, which never lengthens the reuse.
fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    let mut values = headers.get_all(name).iter();
    let first = values.next()?;
    if values.next().is_some() {
        return None;
    }
    first.to_str().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        map
    }

    fn fresh(pairs: &[(&str, &str)]) -> Option<u64> {
        let now = httpdate::parse_http_date("Tue, 01 Dec 2026 12:00:00 GMT").unwrap();
        freshness(&headers(pairs), now).map(|d| d.as_secs())
    }

    #[test]
    fn without_caching_headers_nothing_is_reused() {
        assert_eq!(fresh(&[]), None);
        assert_eq!(fresh(&[("content-type", "application/json")]), None);
    }

    #[test]
    fn max_age_is_followed_within_a_day() {
        assert_eq!(
            fresh(&[("cache-control", "public, max-age=300")]),
            Some(300)
        );
        assert_eq!(fresh(&[("cache-control", "max-age=\"60\"")]), Some(60));
        assert_eq!(
            fresh(&[("cache-control", "max-age=31536000")]),
            Some(86_400)
        );
        assert_eq!(
            fresh(&[("cache-control", "max-age=600"), ("age", "100")]),
            Some(500)
        );
        assert_eq!(
            fresh(&[("cache-control", "max-age=600"), ("age", "900")]),
            None
        );
        assert_eq!(fresh(&[("cache-control", "max-age=0")]), None);
        // A shared cache takes s-maxage over max-age.
        assert_eq!(
            fresh(&[("cache-control", "max-age=600, s-maxage=30")]),
            Some(30)
        );
    }

    #[test]
    fn directives_that_forbid_reuse_win() {
        for cc in [
            "no-store",
            "no-cache",
            "private, max-age=600",
            "max-age=600, No-Store",
        ] {
            assert_eq!(fresh(&[("cache-control", cc)]), None, "{cc}");
        }
        assert_eq!(fresh(&[("cache-control", "max-age=ten")]), None);
        assert_eq!(fresh(&[("cache-control", "max-age")]), None);
        assert_eq!(
            fresh(&[
                ("cache-control", "max-age=60"),
                ("cache-control", "no-store")
            ]),
            None
        );
        assert_eq!(
            fresh(&[
                ("pragma", "no-cache"),
                ("expires", "Tue, 01 Dec 2026 13:00:00 GMT")
            ]),
            None
        );
    }

    #[test]
    fn expires_counts_from_the_origins_date() {
        let expires = ("expires", "Tue, 01 Dec 2026 13:00:00 GMT");
        assert_eq!(fresh(&[expires]), Some(3600));
        assert_eq!(
            fresh(&[expires, ("date", "Tue, 01 Dec 2026 12:50:00 GMT")]),
            Some(600)
        );
        assert_eq!(fresh(&[("expires", "0")]), None);
        assert_eq!(fresh(&[("expires", "Tue, 01 Dec 2026 11:00:00 GMT")]), None);
        assert_eq!(fresh(&[("cache-control", "max-age=5"), expires]), Some(5));
    }
}
