//! Fetching a metadata document without letting its URL point the server anywhere it
//! should not go.
//!
//! The address rule is enforced by the resolver the HTTP client connects through: every
//! address a name resolves to is vetted, and the client connects only to the addresses that
//! resolver returned. There is no separate check that a second DNS answer could contradict,
//! so a name that resolves to a public address when "checked" and to 169.254.169.254 when
//! "connected" (DNS rebinding) gains nothing. IP-literal hosts never reach a resolver and are
//! vetted before the request. A name with any special-use address is refused outright rather
//! than filtered, since a name that mixes them is not one a client should be using.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use http::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE, LOCATION};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::redirect::Policy;
use url::{Host, Url};

use super::netguard::{self, SpecialUse};
use super::{ClientIdUrl, ClientMetadata, DocumentError, freshness};

/// The size cap the draft suggests: about 5 KB.
const MAX_BYTES: usize = 5 * 1024;
/// Largest key set fetched (a client's `jwks_uri`): the document cap is the metadata
/// document's, and a few RSA keys with their certificate chains pass it.
const KEY_SET_MAX_BYTES: usize = 64 * 1024;
/// Time to establish a connection, TLS included.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Time for the whole fetch, from resolution to the last byte.
const TIMEOUT: Duration = Duration::from_secs(5);

/// A document fetched and checked, with how long it may be reused.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// The client it describes.
    pub metadata: ClientMetadata,
    /// How long it may be reused, from its caching headers; `None`: fetch it again next time.
    pub fresh_for: Option<Duration>,
    /// The document as fetched, to cache and check again when reused.
    pub body: Bytes,
}

/// Why a document could not be had. None of these is cached: the next authorization request
/// fetches again. Each message says what was wrong, for the error page and the logs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FetchError {
    /// The host is, or resolves to, a special-use address.
    #[error(
        "the client_id's host {host} is at {ip}, in {range}: this server does not fetch from special-use addresses"
    )]
    SpecialUseAddress {
        /// The host in the URL.
        host: String,
        /// The address refused.
        ip: IpAddr,
        /// The block it is in.
        range: SpecialUse,
    },
    /// The name did not resolve.
    #[error("the client_id's host {host} could not be resolved: {reason}")]
    Resolve {
        /// The host in the URL.
        host: String,
        /// What the resolver said.
        reason: String,
        /// Whether the resolver failed for now (no answer, a server failure) rather than
        /// said the name has no addresses: the same fetch may succeed later.
        temporary: bool,
    },
    /// No connection, or TLS failed.
    #[error("the client metadata document at {url} could not be fetched: {reason}")]
    Connect {
        /// The URL.
        url: String,
        /// What went wrong, with its causes.
        reason: String,
    },
    /// The fetch took longer than allowed.
    #[error("the client metadata document at {url} did not arrive within {limit:?}")]
    Timeout {
        /// The URL.
        url: String,
        /// The limit.
        limit: Duration,
    },
    /// A redirect, which is never followed.
    #[error(
        "the client metadata document at {url} answered {status} redirecting to {location:?}; redirects are not followed, so the client_id must be the document's own URL"
    )]
    Redirect {
        /// The URL.
        url: String,
        /// The 3xx status.
        status: u16,
        /// Its `Location`, if any.
        location: Option<String>,
    },
    /// Any status other than 200.
    #[error("the client metadata document at {url} answered HTTP {status}; only 200 is accepted")]
    Status {
        /// The URL.
        url: String,
        /// The status.
        status: u16,
    },
    /// A content type other than JSON.
    #[error("the client metadata document at {url} is {content_type:?}, not application/json")]
    NotJson {
        /// The URL.
        url: String,
        /// Its `Content-Type`, or empty when absent.
        content_type: String,
    },
    /// More than the size cap.
    #[error("the client metadata document at {url} is larger than {limit} bytes")]
    TooLarge {
        /// The URL.
        url: String,
        /// The cap.
        limit: usize,
    },
    /// The body is not an acceptable document.
    #[error(transparent)]
    Document(#[from] DocumentError),
}

/// How a host name becomes addresses. [`SystemLookup`] asks the operating system; another
/// implementation serves a private resolver, or a test that needs a name to answer
/// differently each time.
pub trait Lookup: Send + Sync + 'static {
    /// The addresses of `host`. An error of kind [`io::ErrorKind::NotFound`] says the name
    /// has none; any other is a failure for now, after which the client is asked to retry
    /// rather than told it is unknown.
    fn lookup(&self, host: &str) -> Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send>>;
}

/// The operating system's resolver, on tokio's blocking threads, at most 64 lookups at
/// once in the process.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemLookup;

/// Lookups the operating system's resolver runs at once. Each holds a blocking thread until
/// the resolver gives up (about ten seconds for a name whose name server never answers),
/// long after the fetch's own timeout dropped it: without a bound, a few addresses naming
/// such `client_id`s could take all 512 of tokio's blocking threads, password hashing's
/// included. With it they can take these places, so that documents not cached wait for a
/// place until their fetch times out (503): the price of a resolver that cannot be
/// cancelled, which an asynchronous one would not pay. Past it a lookup waits for a place,
/// within the fetch's timeout.
const MAX_SYSTEM_LOOKUPS: usize = 64;

static SYSTEM_LOOKUPS: tokio::sync::Semaphore =
    tokio::sync::Semaphore::const_new(MAX_SYSTEM_LOOKUPS);

impl Lookup for SystemLookup {
    fn lookup(&self, host: &str) -> Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send>> {
        let host = host.to_owned();
        Box::pin(bounded(&SYSTEM_LOOKUPS, move || {
            use std::net::ToSocketAddrs as _;
            let addrs = (host.as_str(), 0).to_socket_addrs().map_err(name_missing)?;
            Ok(addrs.map(|addr| addr.ip()).collect())
        }))
    }
}

/// The operating system's "no such name" as [`io::ErrorKind::NotFound`]. The standard
/// library gives every `getaddrinfo` failure one kind and the C library's text
/// (`EAI_NONAME`, `EAI_NODATA`; the words of glibc, musl, macOS and Windows): anything else
/// (`EAI_AGAIN`, a server failure, no answer) stays a failure for now.
fn name_missing(err: io::Error) -> io::Error {
    const MISSING: [&str; 5] = [
        "Name or service not known",
        "No address associated with hostname",
        "Name does not resolve",
        "nodename nor servname provided, or not known",
        "No such host is known",
    ];
    let text = err.to_string();
    if MISSING.iter().any(|m| text.contains(m)) {
        io::Error::new(io::ErrorKind::NotFound, text)
    } else {
        err
    }
}

/// Runs `resolve` on a blocking thread once `places` has room, and keeps the place until
/// it returns, even if the caller stopped waiting.
async fn bounded(
    places: &'static tokio::sync::Semaphore,
    resolve: impl FnOnce() -> io::Result<Vec<IpAddr>> + Send + 'static,
) -> io::Result<Vec<IpAddr>> {
    let place = places.acquire().await.map_err(io::Error::other)?;
    tokio::task::spawn_blocking(move || {
        let _place = place;
        resolve()
    })
    .await
    .map_err(io::Error::other)?
}

/// Settings for a [`Fetcher`]. The defaults are the draft's: about 5 KB, a few seconds.
pub struct FetcherBuilder {
    max_bytes: usize,
    connect_timeout: Duration,
    timeout: Duration,
    allow_loopback: bool,
    roots: Vec<reqwest::Certificate>,
    lookup: Arc<dyn Lookup>,
}

impl fmt::Debug for FetcherBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FetcherBuilder")
            .field("max_bytes", &self.max_bytes)
            .field("connect_timeout", &self.connect_timeout)
            .field("timeout", &self.timeout)
            .field("allow_loopback", &self.allow_loopback)
            .field("extra_roots", &self.roots.len())
            .finish_non_exhaustive()
    }
}

impl FetcherBuilder {
    /// The largest document accepted, in bytes.
    pub fn max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// The time to connect, and the time for the whole fetch.
    pub fn timeouts(mut self, connect: Duration, total: Duration) -> Self {
        self.connect_timeout = connect;
        self.timeout = total;
        self
    }

    /// Trusts another root certificate (PEM), for clients whose documents are served under
    /// a private certificate authority.
    pub fn add_root_certificate(mut self, pem: &[u8]) -> Result<Self, FetchError> {
        let cert = reqwest::Certificate::from_pem(pem).map_err(|err| FetchError::Connect {
            url: String::new(),
            reason: format!("the root certificate is not PEM: {err}"),
        })?;
        self.roots.push(cert);
        Ok(self)
    }

    /// Resolves names through `lookup` instead of the operating system.
    pub fn lookup(mut self, lookup: Arc<dyn Lookup>) -> Self {
        self.lookup = lookup;
        self
    }

    /// Lets documents be fetched from loopback addresses, which are otherwise refused like
    /// every special-use address. For tests that serve documents on this machine; never for
    /// a deployed server, where it would let any client make the server call itself.
    pub fn allow_loopback_for_tests(mut self) -> Self {
        self.allow_loopback = true;
        self
    }

    /// Builds the fetcher and its HTTP client.
    pub fn build(self) -> Result<Fetcher, FetchError> {
        let resolver = Arc::new(GuardedResolver {
            lookup: self.lookup,
            allow_loopback: self.allow_loopback,
        });
        let mut client = reqwest::Client::builder()
            .redirect(Policy::none())
            .no_proxy()
            .https_only(true)
            .connect_timeout(self.connect_timeout)
            .timeout(self.timeout)
            .user_agent(concat!("wharf-authz/", env!("CARGO_PKG_VERSION")))
            // No idle connection kept: documents are fetched rarely (they are cached), from
            // hosts clients name, and one kept per host would let a client with many names
            // hold as many file descriptors.
            .pool_max_idle_per_host(0)
            .dns_resolver(resolver);
        for root in self.roots {
            client = client.add_root_certificate(root);
        }
        let client = client.build().map_err(|err| FetchError::Connect {
            url: String::new(),
            reason: format!("the HTTP client could not be built: {err}"),
        })?;
        Ok(Fetcher {
            client,
            max_bytes: self.max_bytes,
            timeout: self.timeout,
            allow_loopback: self.allow_loopback,
        })
    }
}

/// Fetches metadata documents under the draft's security rules. Cheap to clone; one per
/// server.
#[derive(Debug, Clone)]
pub struct Fetcher {
    client: reqwest::Client,
    max_bytes: usize,
    timeout: Duration,
    allow_loopback: bool,
}

impl Fetcher {
    /// Settings starting from the defaults.
    pub fn builder() -> FetcherBuilder {
        FetcherBuilder {
            max_bytes: MAX_BYTES,
            connect_timeout: CONNECT_TIMEOUT,
            timeout: TIMEOUT,
            allow_loopback: false,
            roots: Vec::new(),
            lookup: Arc::new(SystemLookup),
        }
    }

    /// Fetches and checks the document `client_id` names.
    pub async fn fetch(&self, client_id: &ClientIdUrl) -> Result<Fetched, FetchError> {
        let (body, fresh_for) = self.fetch_json(client_id.url(), self.max_bytes).await?;
        let metadata = ClientMetadata::from_document(client_id, &body)?;
        Ok(Fetched {
            metadata,
            fresh_for,
            body,
        })
    }

    /// Fetches a client's key set (its `jwks_uri`) under the same rules, up to 64 KiB: the
    /// body and how long it may be reused.
    pub async fn fetch_key_set(&self, url: &Url) -> Result<(Bytes, Option<Duration>), FetchError> {
        self.fetch_json(url, self.max_bytes.max(KEY_SET_MAX_BYTES))
            .await
    }

    /// Fetches JSON of at most `max_bytes` from an `https` URL.
    async fn fetch_json(
        &self,
        url: &Url,
        max_bytes: usize,
    ) -> Result<(Bytes, Option<Duration>), FetchError> {
        let host = url.host_str().unwrap_or_default().to_owned();
        if url.scheme() != "https" {
            return Err(FetchError::Connect {
                url: url.to_string(),
                reason: "only https URLs are fetched".into(),
            });
        }
        let literal = match url.host() {
            Some(Host::Ipv4(ip)) => Some(IpAddr::V4(ip)),
            Some(Host::Ipv6(ip)) => Some(IpAddr::V6(ip)),
            _ => None,
        };
        if let Some(ip) = literal {
            vet(ip, self.allow_loopback).map_err(|range| FetchError::SpecialUseAddress {
                host,
                ip,
                range,
            })?;
        }
        match tokio::time::timeout(self.timeout, self.fetch_body(url, max_bytes)).await {
            Ok(result) => result,
            Err(_) => Err(FetchError::Timeout {
                url: url.to_string(),
                limit: self.timeout,
            }),
        }
    }

    async fn fetch_body(
        &self,
        target: &Url,
        max_bytes: usize,
    ) -> Result<(Bytes, Option<Duration>), FetchError> {
        let url = || target.to_string();
        let mut response = self
            .client
            .get(target.clone())
            .header(ACCEPT, "application/json")
            .send()
            .await
            .map_err(|err| self.request_error(target, &err))?;
        let status = response.status();
        if status.is_redirection() {
            return Err(FetchError::Redirect {
                url: url(),
                status: status.as_u16(),
                location: header(&response, LOCATION),
            });
        }
        if status != reqwest::StatusCode::OK {
            return Err(FetchError::Status {
                url: url(),
                status: status.as_u16(),
            });
        }
        let content_type = header(&response, CONTENT_TYPE).unwrap_or_default();
        if !is_json(&content_type) {
            return Err(FetchError::NotJson {
                url: url(),
                content_type,
            });
        }
        let too_large = || FetchError::TooLarge {
            url: url(),
            limit: max_bytes,
        };
        let declared = header(&response, CONTENT_LENGTH).and_then(|len| len.parse::<u64>().ok());
        if declared.is_some_and(|len| len > max_bytes as u64) {
            return Err(too_large());
        }
        let fresh_for = freshness(response.headers(), SystemTime::now());
        let mut body = BytesMut::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|err| self.request_error(target, &err))?
        {
            if body.len() + chunk.len() > max_bytes {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        Ok((body.freeze(), fresh_for))
    }

    /// Tells a refused address or a failed resolution (which arrive wrapped in the HTTP
    /// client's connection error) from other failures.
    fn request_error(&self, target: &Url, err: &reqwest::Error) -> FetchError {
        let host = target.host_str().unwrap_or_default().to_owned();
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
        let mut reasons = Vec::new();
        while let Some(cause) = source {
            if let Some(refusal) = cause.downcast_ref::<Refusal>() {
                return match refusal {
                    Refusal::SpecialUse { ip, range } => FetchError::SpecialUseAddress {
                        host,
                        ip: *ip,
                        range: *range,
                    },
                    Refusal::Unresolved { reason, temporary } => FetchError::Resolve {
                        host,
                        reason: reason.clone(),
                        temporary: *temporary,
                    },
                };
            }
            reasons.push(cause.to_string());
            source = cause.source();
        }
        if err.is_timeout() {
            return FetchError::Timeout {
                url: target.to_string(),
                limit: self.timeout,
            };
        }
        reasons.dedup();
        FetchError::Connect {
            url: target.to_string(),
            reason: reasons.join(": "),
        }
    }
}

fn header(response: &reqwest::Response, name: http::HeaderName) -> Option<String> {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// `application/json`, or a `+json` type, parameters aside.
fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || essence
            .strip_prefix("application/")
            .is_some_and(|sub| sub.ends_with("+json"))
}

/// Whether the fetcher may connect to `ip`.
fn vet(ip: IpAddr, allow_loopback: bool) -> Result<(), SpecialUse> {
    match netguard::special_use(ip) {
        Some(_) if allow_loopback && netguard::is_loopback(ip) => Ok(()),
        Some(range) => Err(range),
        None => Ok(()),
    }
}

/// The resolver the HTTP client connects through: it returns a name's addresses only when
/// every one of them may be connected to.
struct GuardedResolver {
    lookup: Arc<dyn Lookup>,
    allow_loopback: bool,
}

/// Why the guarded resolver gave no addresses; found again in the HTTP client's error.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error("{ip} is in {range}")]
    SpecialUse { ip: IpAddr, range: SpecialUse },
    #[error("{reason}")]
    Unresolved { reason: String, temporary: bool },
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let lookup = self.lookup.lookup(name.as_str());
        let allow_loopback = self.allow_loopback;
        Box::pin(async move {
            let ips = lookup.await.map_err(|err| Refusal::Unresolved {
                temporary: err.kind() != io::ErrorKind::NotFound,
                reason: err.to_string(),
            })?;
            if ips.is_empty() {
                let reason = "no addresses".to_owned();
                let temporary = false;
                return Err(Refusal::Unresolved { reason, temporary }.into());
            }
            for &ip in &ips {
                vet(ip, allow_loopback).map_err(|range| Refusal::SpecialUse { ip, range })?;
            }
            let addrs: Addrs = Box::new(ips.into_iter().map(|ip| SocketAddr::new(ip, 0)));
            Ok(addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The standard library gives every resolver failure one kind; the C library's words
    /// tell a name that does not exist from a failure for now.
    #[test]
    fn the_systems_no_such_name_is_told_from_a_failure_for_now() {
        let said = |text: &str| name_missing(io::Error::other(text.to_owned())).kind();
        for missing in [
            "failed to lookup address information: Name or service not known",
            "failed to lookup address information: No address associated with hostname",
            "failed to lookup address information: Name does not resolve",
        ] {
            assert_eq!(said(missing), io::ErrorKind::NotFound, "{missing}");
        }
        for failing in [
            "failed to lookup address information: Temporary failure in name resolution",
            "failed to lookup address information: Non-recoverable failure in name resolution",
        ] {
            assert_ne!(said(failing), io::ErrorKind::NotFound, "{failing}");
        }
    }

    /// A lookup whose caller gave up keeps its place until its resolver returns, so
    /// resolvers that never answer hold at most as many blocking threads as there are
    /// places; the next lookup waits for one of them to return.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lookup_given_up_keeps_its_place_until_its_resolver_returns() {
        static PLACES: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);
        let (started, mut starts) = tokio::sync::mpsc::unbounded_channel::<()>();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let released = Arc::new(std::sync::Mutex::new(released));
        for _ in 0..2 {
            let (started, released) = (started.clone(), Arc::clone(&released));
            let hung = bounded(&PLACES, move || {
                let _ = started.send(());
                let _ = released.lock().unwrap().recv();
                Ok(Vec::new())
            });
            tokio::select! {
                _ = hung => panic!("a resolver that hangs returned"),
                _ = starts.recv() => {}
            }
            // Its caller gave up (the fetch timed out): the resolver still runs.
        }
        assert_eq!(
            PLACES.available_permits(),
            0,
            "a place was given back early"
        );
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let next = tokio::spawn(bounded(&PLACES, move || Ok(vec![ip])));
        release.send(()).unwrap();
        assert_eq!(next.await.unwrap().unwrap(), [ip]);
        release.send(()).unwrap();
    }

    #[test]
    fn json_content_types() {
        for ok in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON",
            "application/oauth-client+json",
        ] {
            assert!(is_json(ok), "{ok}");
        }
        for bad in [
            "",
            "text/html",
            "text/json",
            "application/jsonp",
            "application/json-seq",
        ] {
            assert!(!is_json(bad), "{bad}");
        }
    }

    #[test]
    fn loopback_is_allowed_only_by_the_test_switch() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        assert!(vet(lo, false).is_err());
        assert!(vet(lo, true).is_ok());
        let private: IpAddr = "10.0.0.1".parse().unwrap();
        assert!(vet(private, true).is_err());
    }
}
