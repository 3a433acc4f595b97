//! The few pages a person sees: sign-in, consent, their remembered consents, and errors.
//! Server-rendered, no script; every value shown is escaped, since client names, hosts and
//! error details come from whoever wrote a client's metadata.

use std::fmt::Write as _;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// Escapes text for HTML content and double-quoted attributes.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A page: `body` is already HTML (built with [`escape`]). A person refused (not signed in,
/// a wrong password) gets 403, never 401: a 401 must carry an HTTP authentication challenge
/// (RFC 9110), and signing in here is a form, not such a scheme.
pub(crate) fn page(status: StatusCode, title: &str, body: &str) -> Response {
    let html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title}</title><style>{STYLE}</style></head>\
         <body><main>{body}</main></body></html>",
        title = escape(title),
    );
    let mut response = (status, html).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    // No framing (clickjacking a consent button), no scripts, no caching of a page that
    // carries a CSRF token.
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'",
        ),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

/// An error page: shown instead of redirecting when the redirect itself cannot be trusted
/// (an unknown client, a redirect URI it did not register).
pub(crate) fn error(status: StatusCode, what: &str, detail: &str) -> Response {
    let body = format!(
        "<h1>{}</h1><p class=\"detail\">{}</p>",
        escape(what),
        escape(detail)
    );
    page(status, what, &body)
}

/// Hidden form fields.
pub(crate) fn hidden(fields: &[(&str, &str)]) -> String {
    let mut out = String::new();
    for (name, value) in fields {
        let _ = write!(
            out,
            "<input type=\"hidden\" name=\"{}\" value=\"{}\">",
            escape(name),
            escape(value)
        );
    }
    out
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;background:#f4f5f7;margin:0}\
main{max-width:28rem;margin:3rem auto;background:#fff;padding:2rem;border-radius:8px;\
box-shadow:0 1px 4px #0002}h1{font-size:1.3rem;margin-top:0}label{display:block;margin:.8rem 0 .2rem}\
input[type=text],input[type=password]{width:100%;padding:.5rem;box-sizing:border-box}\
button{padding:.5rem 1.2rem;margin:1rem .5rem 0 0;font-size:1rem}.host{font-family:monospace;\
font-weight:bold}.warning{background:#fff3cd;border:1px solid #e0b000;padding:.6rem;border-radius:4px}\
.detail{color:#444}dl dt{font-weight:bold;margin-top:.6rem}dl dd{margin:0}table{width:100%}\
td{padding:.3rem 0}";
