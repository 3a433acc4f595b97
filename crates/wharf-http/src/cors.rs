//! CORS for the origins a deployment names: a page served from one of them (a browser-based
//! MCP client, an inspector) may call the endpoint and read its answers. Other origins the
//! host policy lets through (localhost) may still send requests a browser sends without
//! asking, but get no header that lets a page read the answer.

use std::time::Duration;

use axum::http::{HeaderName, HeaderValue, Method, request::Parts};
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

use crate::config::HostPolicy;

/// Headers a page may read from an answer: the legacy session's id, the challenge of a
/// 401 or 403, and when to retry a 503.
const EXPOSED: [&str; 3] = ["mcp-session-id", "www-authenticate", "retry-after"];

/// How long a browser may keep a preflight's answer.
const MAX_AGE: Duration = Duration::from_secs(600);

/// The CORS layer for the origins `hosts` names, or `None` when it names none (no route
/// pays for a layer then). Preflights are answered for them with the methods the endpoint
/// serves and the request headers the page asked for (`Mcp-Param-*` names vary by tool);
/// credentials (cookies) are never allowed: requests carry their token themselves.
pub fn cors(hosts: &HostPolicy) -> Option<CorsLayer> {
    let named = hosts.named_origins().to_vec();
    if named.is_empty() {
        return None;
    }
    let allowed = move |origin: &HeaderValue, _: &Parts| {
        origin
            .to_str()
            .is_ok_and(|o| named.iter().any(|n| n.eq_ignore_ascii_case(o)))
    };
    Some(
        CorsLayer::new()
            .allow_origin(AllowOrigin::predicate(allowed))
            .allow_methods([Method::GET, Method::POST, Method::DELETE])
            .allow_headers(AllowHeaders::mirror_request())
            .expose_headers(EXPOSED.map(HeaderName::from_static))
            .max_age(MAX_AGE),
    )
}
