//! Transport settings.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use wharf_auth::Auth;

use crate::authenticate::Authenticate;

/// A dependency that must answer for the server to be ready (a database, a cache…), as
/// `/readyz` asks it.
pub trait ReadinessCheck: Send + Sync + 'static {
    /// A short name for reports.
    fn name(&self) -> &str;
    /// `Err` with a reason when the dependency does not answer.
    fn check(&self) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>>;
}

const LOCALHOSTS: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// Which `Host` and `Origin` values are accepted (DNS-rebinding protection).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HostPolicy {
    /// Accept any `Host` (behind a proxy that already checks it). `Origin` is still checked:
    /// localhost origins and these ones only.
    AnyHost {
        /// Browser origins accepted besides localhost ones.
        origins: Vec<String>,
    },
    /// Accept only these host names (no port); `Origin` must name one of them too, or be one
    /// of the listed origins exactly.
    Only {
        /// Host names accepted.
        hosts: Vec<String>,
        /// Origins accepted exactly.
        origins: Vec<String>,
    },
}

impl HostPolicy {
    /// `localhost`, `127.0.0.1` and `[::1]`, on any port.
    pub fn localhost() -> Self {
        HostPolicy::Only {
            hosts: vec!["localhost".into(), "127.0.0.1".into(), "[::1]".into()],
            origins: Vec::new(),
        }
    }

    /// Any `Host`; browser origins limited to localhost and `origins` (written as for
    /// [`HostPolicy::allow_origin`]).
    pub fn any_host(origins: impl IntoIterator<Item = String>) -> Self {
        HostPolicy::AnyHost {
            origins: origins
                .into_iter()
                .map(|o| browser_origin(&o))
                .filter(|o| !o.is_empty())
                .collect(),
        }
    }

    /// Adds an allowed host name. A port given with it is left out: requests are matched on
    /// the host alone.
    pub fn allow_host(mut self, host: impl Into<String>) -> Self {
        if let HostPolicy::Only { hosts, .. } = &mut self {
            let host: String = host.into();
            // An IPv6 address is matched as a `Host` header writes it: bracketed.
            let host = match host.parse::<std::net::Ipv6Addr>() {
                Ok(v6) => format!("[{v6}]"),
                Err(_) => strip_port(&host).to_ascii_lowercase(),
            };
            hosts.push(host);
        }
        self
    }

    /// Adds an allowed origin (`scheme://host[:port]`). Its host is allowed as `Host` too.
    /// Written as a browser sends it: lower-cased, without a trailing `/` or the scheme's
    /// default port (`https://app.example.com:443/` is `https://app.example.com`).
    pub fn allow_origin(mut self, origin: impl Into<String>) -> Self {
        let origin = browser_origin(&origin.into());
        if origin.is_empty() {
            // Nothing a browser sends; kept, it would let an empty `Origin` header through.
            return self;
        }
        match &mut self {
            HostPolicy::Only { hosts, origins } => {
                if let Some(host) = origin_host(&origin) {
                    hosts.push(host.to_owned());
                }
                origins.push(origin);
            }
            HostPolicy::AnyHost { origins } => origins.push(origin),
        }
        self
    }

    /// The origins named with [`HostPolicy::allow_origin`] (or [`HostPolicy::any_host`]),
    /// lower-cased: the ones browsers may read answers from (see [`crate::cors`]).
    pub fn named_origins(&self) -> &[String] {
        match self {
            HostPolicy::AnyHost { origins } | HostPolicy::Only { origins, .. } => origins,
        }
    }

    pub(crate) fn host_allowed(&self, host: &str) -> bool {
        match self {
            HostPolicy::AnyHost { .. } => true,
            HostPolicy::Only { hosts, .. } => {
                let name = strip_port(host);
                hosts.iter().any(|h| h.eq_ignore_ascii_case(name))
            }
        }
    }

    pub(crate) fn origin_allowed(&self, origin: &str) -> bool {
        match self {
            HostPolicy::AnyHost { origins } => {
                origins.iter().any(|o| o.eq_ignore_ascii_case(origin))
                    || origin_host(origin)
                        .is_some_and(|h| LOCALHOSTS.iter().any(|l| l.eq_ignore_ascii_case(h)))
            }
            HostPolicy::Only { origins, .. } => {
                origins.iter().any(|o| o.eq_ignore_ascii_case(origin))
                    || origin_host(origin).is_some_and(|h| self.host_allowed(h))
            }
        }
    }
}

/// `origin` as a browser's `Origin` header writes it: lower-cased, no trailing `/`, no
/// default port of its scheme.
fn browser_origin(origin: &str) -> String {
    let origin = origin.trim().trim_end_matches('/').to_ascii_lowercase();
    let default_port = if origin.starts_with("https://") {
        ":443"
    } else if origin.starts_with("http://") {
        ":80"
    } else {
        return origin;
    };
    match origin.strip_suffix(default_port) {
        Some(bare) => bare.to_owned(),
        None => origin,
    }
}

/// The host of `scheme://host[:port]`, without the port.
fn origin_host(origin: &str) -> Option<&str> {
    let rest = origin.split_once("://")?.1;
    let authority = rest.split('/').next()?;
    Some(strip_port(authority))
}

fn strip_port(authority: &str) -> &str {
    if authority.starts_with('[') {
        // [v6]:port
        return authority
            .find(']')
            .map_or(authority, |end| &authority[..=end]);
    }
    authority.rsplit_once(':').map_or(authority, |(h, port)| {
        if port.bytes().all(|b| b.is_ascii_digit()) {
            h
        } else {
            authority
        }
    })
}

/// Why a path cannot be the MCP endpoint (see [`check_endpoint`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EndpointError {
    /// Not a plain path: axum would read `{x}`, `*` or `:x` as captures (or refuse it).
    #[error(
        "{0:?} is not a path for the endpoint: give one that starts with / (such as /mcp), without ?, #, {{, }}, * or a segment starting with :"
    )]
    NotAPath(String),
    /// A path [`router`](crate::router) serves something else at.
    #[error("{0:?} is a path the server serves something else at: choose another")]
    Taken(String),
}

/// Checks that `path` can be the MCP endpoint ([`HttpConfig::endpoint`]): a plain path
/// starting with `/`, other than `/healthz`, `/readyz` and `/.well-known/…`, which
/// [`router`](crate::router) serves. For an endpoint read from settings, before the router
/// is made.
///
/// ```
/// use wharf_http::{EndpointError, check_endpoint};
///
/// assert!(check_endpoint("/api/mcp").is_ok());
/// assert!(matches!(check_endpoint("mcp"), Err(EndpointError::NotAPath(_))));
/// assert!(matches!(check_endpoint("/healthz"), Err(EndpointError::Taken(_))));
/// ```
pub fn check_endpoint(path: &str) -> Result<(), EndpointError> {
    let plain = path.starts_with('/')
        && !path.contains(|c: char| "?#{}*".contains(c) || c.is_whitespace() || c.is_control())
        && path.split('/').all(|segment| !segment.starts_with(':'));
    if !plain {
        return Err(EndpointError::NotAPath(path.to_owned()));
    }
    if ["/healthz", "/readyz"].contains(&path) || path.starts_with("/.well-known/") {
        return Err(EndpointError::Taken(path.to_owned()));
    }
    Ok(())
}

/// Settings of the HTTP transport: start from [`HttpConfig::default`] and set what differs.
#[derive(Clone)]
#[non_exhaustive]
pub struct HttpConfig {
    /// Path of the MCP endpoint (`/mcp` by default): a plain path that [`check_endpoint`]
    /// accepts, or [`router`](crate::router) panics.
    pub endpoint: String,
    /// Accepted `Host`/`Origin`.
    pub hosts: HostPolicy,
    /// Largest request body, in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// Time a request has to send its whole body once its headers are in (408 after).
    pub body_read_timeout: Duration,
    /// Deepest JSON nesting accepted (400 beyond); at most
    /// [`MAX_DEPTH_LIMIT`](wharf_protocol::jsonrpc::MAX_DEPTH_LIMIT) applies.
    pub max_json_depth: usize,
    /// Largest total size of the request headers, in bytes (431 beyond).
    pub max_header_bytes: usize,
    /// Interval of SSE keep-alive comments on streamed answers (listen streams, and calls whose
    /// client asked for progress or logs: a long call stays visibly alive to proxies); from
    /// a second to a day is used (0 would send comments without pause).
    pub keep_alive: Duration,
    /// Dependencies `GET /readyz` checks: at most once a second, however many probes
    /// arrive (their verdict stands that long).
    pub readiness: Vec<Arc<dyn ReadinessCheck>>,
    /// How a request's principal is resolved (anonymous unless configured): `wharf-auth`'s
    /// [`Auth`], [`FromExtensions`](crate::FromExtensions) behind the app's own
    /// authentication layer, or any [`Authenticate`].
    pub auth: Arc<dyn Authenticate>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            endpoint: "/mcp".into(),
            hosts: HostPolicy::localhost(),
            max_body_bytes: 1024 * 1024,
            body_read_timeout: Duration::from_secs(30),
            max_json_depth: 64,
            max_header_bytes: 16 * 1024,
            keep_alive: Duration::from_secs(15),
            readiness: Vec::new(),
            auth: Arc::new(Auth::anonymous()),
        }
    }
}

impl std::fmt::Debug for HttpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpConfig")
            .field("endpoint", &self.endpoint)
            .field("hosts", &self.hosts)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("body_read_timeout", &self.body_read_timeout)
            .field("max_json_depth", &self.max_json_depth)
            .field("max_header_bytes", &self.max_header_bytes)
            .field("keep_alive", &self.keep_alive)
            .field("auth", &"dyn Authenticate")
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn localhost_policy() {
        let p = HostPolicy::localhost();
        assert!(p.host_allowed("localhost:8080"));
        assert!(p.host_allowed("127.0.0.1"));
        assert!(p.host_allowed("[::1]:9"));
        assert!(!p.host_allowed("evil.example.com"));
        assert!(!p.host_allowed("localhost.evil.example.com:80"));
        assert!(p.origin_allowed("http://localhost:3000"));
        assert!(!p.origin_allowed("http://evil.example.com"));
        assert!(!p.origin_allowed("null"));
        let p = p.allow_origin("https://app.example.com");
        assert!(p.origin_allowed("https://app.example.com"));
        assert!(p.host_allowed("app.example.com"));
        // Written with a port, a trailing slash or a default port, they still match what
        // clients send.
        let p = HostPolicy::localhost()
            .allow_host("api.example.com:8443")
            .allow_origin("HTTPS://Web.example.com:443/")
            .allow_origin("http://dev.example.com:8080/");
        assert!(p.host_allowed("api.example.com:8443"));
        let p = p.allow_host("2001:DB8::1").allow_origin("/");
        assert!(p.host_allowed("[2001:db8::1]:8080"));
        assert!(!p.origin_allowed(""), "an empty origin was never named");
        assert!(p.origin_allowed("https://web.example.com"));
        assert!(p.origin_allowed("http://dev.example.com:8080"));
        assert_eq!(
            p.named_origins(),
            ["https://web.example.com", "http://dev.example.com:8080"]
        );
        let any = HostPolicy::any_host(["https://app.example.com".to_owned()]);
        assert!(any.host_allowed("anything.example.net"));
        assert!(any.origin_allowed("https://app.example.com"));
        assert!(any.origin_allowed("http://localhost:3000"));
        assert!(
            !any.origin_allowed("http://evil.example.com"),
            "any host never means any origin"
        );
    }
}
