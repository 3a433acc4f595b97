//! The cookies a browser carries through a flow: `wharf_authz_browser` binds a pending
//! authorization request to the browser that started it (so a form submitted from elsewhere,
//! or a request id passed to someone else, goes nowhere), `wharf_authz_session` says who
//! signed in, and `wharf_authz_device` that an account signed in on this browser before.
//! All HttpOnly and SameSite=Lax (no cross-site form carries them). When the
//! issuer is https they are Secure and named `__Host-…`, which browsers accept only from this
//! very host: a sibling subdomain cannot plant one.

use axum::http::header::{COOKIE, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue};

/// The browser-binding cookie.
pub(crate) const BROWSER: Name = Name("wharf_authz_browser", "__Host-wharf_authz_browser");
/// The session cookie.
pub(crate) const SESSION: Name = Name("wharf_authz_session", "__Host-wharf_authz_session");
/// The device cookie: this browser is one an account signed in on (see the failed sign-ins
/// module), so its attempts at that account are not slowed by a stranger's.
pub(crate) const DEVICE: Name = Name("wharf_authz_device", "__Host-wharf_authz_device");

/// A cookie's name over http, and over https.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Name(&'static str, &'static str);

impl Name {
    pub(crate) fn on(self, secure: bool) -> &'static str {
        if secure { self.1 } else { self.0 }
    }
}

/// The value of cookie `name`, if the request carries it once.
pub(crate) fn get<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    let mut found = None;
    for header in headers.get_all(COOKIE) {
        let Ok(text) = header.to_str() else { continue };
        for pair in text.split(';') {
            if let Some((k, v)) = pair.trim().split_once('=') {
                if k == name {
                    if found.is_some() {
                        // Two cookies of one name: one was planted; trust neither.
                        return None;
                    }
                    found = Some(v);
                }
            }
        }
    }
    found.filter(|v| !v.is_empty())
}

/// Adds a `Set-Cookie` for `name`; `max_age_secs` 0 deletes it.
pub(crate) fn set(
    headers: &mut HeaderMap,
    name: &str,
    value: &str,
    max_age_secs: u64,
    secure: bool,
) {
    let secure = if secure { "; Secure" } else { "" };
    let cookie =
        format!("{name}={value}; Path=/; HttpOnly; SameSite=Lax; Max-Age={max_age_secs}{secure}");
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        headers.append(SET_COOKIE, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cookie_is_read_once_and_a_planted_twin_voids_it() {
        let mut headers = HeaderMap::new();
        headers.insert(
            COOKIE,
            HeaderValue::from_static("a=1; wharf_authz_session=s1; b=2"),
        );
        assert_eq!(get(&headers, SESSION.on(false)), Some("s1"));
        assert_eq!(get(&headers, BROWSER.on(false)), None);
        assert_eq!(
            get(&headers, SESSION.on(true)),
            None,
            "over https only __Host- counts"
        );
        headers.append(COOKIE, HeaderValue::from_static("wharf_authz_session=evil"));
        assert_eq!(get(&headers, SESSION.on(false)), None);
    }
}
