//! OAuth 2.1 resource server: every request's bearer token is checked, locally as a JWT
//! against the issuer's keys or remotely by introspection (RFC 7662); it must be issued by
//! the configured issuer for this server (RFC 8707 audience). The principal is the token's
//! issuer and subject, with its client and scopes.

mod cache;
mod clients;
mod flight;
mod introspect;
mod jwt;
#[cfg(test)]
mod peer;

/// Adds an OAuth client's credentials to `request` as HTTP Basic, each form-encoded first
/// (RFC 6749 §2.3.1), as a token or introspection endpoint expects them.
pub fn client_basic_auth(
    request: reqwest::RequestBuilder,
    client_id: &str,
    secret: &str,
) -> reqwest::RequestBuilder {
    let encode =
        |v: &str| -> String { url::form_urlencoded::byte_serialize(v.as_bytes()).collect() };
    request.basic_auth(encode(client_id), Some(encode(secret)))
}

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use wharf::{Grant, Principal};

use crate::AuthError;
use cache::{Lookup, TokenCache};
pub use clients::{HttpClients, is_loopback_url};
pub use introspect::IntrospectionLimits;
use introspect::Seen;

/// How tokens are checked.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Validation {
    /// JWTs signed with RS256, ES256 or EdDSA, verified against the issuer's JWKS (found
    /// through its metadata unless given). A token signed with a key id the cached set lacks
    /// (or without a key id, that no cached key of its algorithm verifies) makes the set be
    /// fetched again, at most once per `min_refresh`; a set older than
    /// `max_age` is fetched again before it is trusted, so a key the issuer withdrew stops
    /// being accepted within `max_age` (tokens already checked are remembered for at most
    /// that long too). While the issuer cannot be reached, the set it last published stands
    /// until twice `max_age` after it was fetched; then its tokens are refused (503) until
    /// the issuer answers.
    Jwt {
        /// Where the key set is; from the issuer's metadata when `None`.
        jwks_uri: Option<String>,
        /// The least time between two fetches of the key set.
        min_refresh: Duration,
        /// How long a fetched key set is trusted without asking the issuer again (above 0,
        /// and at least `min_refresh`, or [`OAuth::new`] refuses it). While the issuer
        /// cannot be reached, the keys it last published are kept, and it is asked again
        /// every `min_refresh`, behind the requests rather than in their way.
        max_age: Duration,
    },
    /// JWTs signed by an authorization server in this process (`wharf-authz`'s, say),
    /// verified against the key set it publishes, read without HTTP: its tokens verify
    /// whatever address the process listens on, and whatever is in front of it. The set is
    /// read when a fetched one would be fetched (see [`Validation::Jwt`]).
    Published {
        /// The authorization server's keys.
        keys: Arc<dyn PublishedKeys>,
        /// The least time between two reads of the key set.
        min_refresh: Duration,
        /// How long a key set read is trusted without reading it again (above 0, and at
        /// least `min_refresh`).
        max_age: Duration,
    },
    /// Token introspection (RFC 7662) at `endpoint`, authenticated with the client's
    /// credentials; answers are cached for `cache_ttl` (never past the token's expiry),
    /// keyed by a hash of the token.
    Introspection {
        /// The introspection endpoint.
        endpoint: String,
        /// This resource server's client id at the authorization server.
        client_id: String,
        /// Its client secret (never shown by `Debug`).
        client_secret: crate::Secret,
        /// How long an answer is reused.
        cache_ttl: Duration,
        /// How hard the endpoint may be pressed.
        limits: IntrospectionLimits,
    },
}

/// The most clock skew [`OAuthConfig::leeway`] may tolerate.
pub const MAX_LEEWAY: Duration = Duration::from_secs(300);

/// The resource server's settings: start from [`OAuthConfig::new`] and set what differs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct OAuthConfig {
    /// This server's canonical resource URI (its MCP endpoint's URL), published in the
    /// protected resource metadata.
    pub resource: String,
    /// Audiences a token may carry; empty means `[resource]`.
    pub audiences: Vec<String>,
    /// The one issuer whose tokens are accepted.
    pub issuer: String,
    /// Authorization servers to advertise; empty means `[issuer]`.
    pub authorization_servers: Vec<String>,
    /// Scopes to advertise.
    pub scopes_supported: Vec<String>,
    /// Scopes every request needs.
    pub required_scopes: Vec<String>,
    /// Clock skew tolerated on `exp` and `nbf`.
    pub leeway: Duration,
    /// How tokens are checked.
    pub validation: Validation,
}

impl OAuthConfig {
    /// A resource server at `resource` accepting tokens of `issuer`, checked by
    /// `validation`: its audience is `resource`, it advertises `issuer` and no scopes,
    /// requires none, and tolerates 30 seconds of clock skew.
    pub fn new(
        resource: impl Into<String>,
        issuer: impl Into<String>,
        validation: Validation,
    ) -> Self {
        Self {
            resource: resource.into(),
            audiences: Vec::new(),
            issuer: issuer.into(),
            authorization_servers: Vec::new(),
            scopes_supported: Vec::new(),
            required_scopes: Vec::new(),
            leeway: Duration::from_secs(30),
            validation,
        }
    }
}

/// Why the resource server could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OAuthSetupError {
    /// The HTTP client for the issuer could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
    /// A URL that is not http(s).
    #[error("{0} must be an http(s) URL")]
    Url(&'static str),
    /// A URL keys or token verdicts would come from over plain HTTP from another host:
    /// anyone on the path could answer for the issuer.
    #[error("{0} must be an https URL (plain http only on a loopback host)")]
    Insecure(&'static str),
    /// A resource URI with a fragment (RFC 8707 §2 forbids one) or a `"` (it is quoted in
    /// every challenge).
    #[error("the resource URI {0:?} must have no fragment and no '\"' (RFC 8707 §2)")]
    Resource(String),
    /// A resource URI whose metadata document cannot be served at its path: one with a
    /// query, braces, or a path segment beginning with `:` or `*`.
    #[error(
        "the resource URI {0:?} cannot have its metadata served at its path: give one without a query, braces, or a segment beginning with ':' or '*'"
    )]
    ResourcePath(String),
    /// A key set's `max_age` of 0, or below its `min_refresh`: a withdrawn key would be
    /// accepted for `min_refresh`, not `max_age` as promised.
    #[error(
        "the key set's max_age ({max_age:?}) must be above 0 and at least its min_refresh ({min_refresh:?}): the set cannot be fetched more often than min_refresh"
    )]
    KeyAge {
        /// The configured `max_age`.
        max_age: Duration,
        /// The configured `min_refresh`.
        min_refresh: Duration,
    },
    /// Introspection without the client id or secret this resource server authenticates
    /// with: RFC 7662 §2.1 has the endpoint refuse unauthenticated callers.
    #[error(
        "token introspection needs this server's client id and client secret at the authorization server (RFC 7662 §2.1)"
    )]
    IntrospectionClient,
    /// A clock leeway past [`MAX_LEEWAY`]: a token that expired that long ago would pass.
    #[error("a clock leeway of {0} s is more than {max} s", max = MAX_LEEWAY.as_secs())]
    Leeway(u64),
    /// A configured scope that is not an RFC 6749 §3.3 scope token: it could not be named
    /// in a `WWW-Authenticate` challenge.
    #[error(
        "scope {0:?} is not a valid scope: use printable ASCII without spaces, '\"' or '\\' (RFC 6749 §3.3)"
    )]
    Scope(String),
}

/// Whether `scope` is one RFC 6749 §3.3 scope token: `1*( %x21 / %x23-5B / %x5D-7E )`.
pub(crate) fn is_scope_token(scope: &str) -> bool {
    !scope.is_empty()
        && scope
            .bytes()
            .all(|b| matches!(b, 0x21 | 0x23..=0x5B | 0x5D..=0x7E))
}

/// Checks a resource URI as [`OAuth::new`] does (so a command line can refuse it before
/// anything is opened): http(s), no fragment or `"` (it is quoted in every challenge), and
/// a path its metadata can be served at (RFC 9728 §3.1): no query, braces, or segment
/// beginning with `:` or `*`, which a router would read as captures or never match.
pub fn check_resource(resource: &str) -> Result<(), OAuthSetupError> {
    if !(resource.starts_with("https://") || resource.starts_with("http://")) {
        return Err(OAuthSetupError::Url("the resource URI"));
    }
    if resource.contains(['#', '"']) {
        return Err(OAuthSetupError::Resource(resource.to_owned()));
    }
    let origin = origin_of(resource);
    let path = &resource[origin.len()..];
    let routable =
        !path.contains(['?', '{', '}']) && path.split('/').all(|s| !s.starts_with([':', '*']));
    if !routable || origin.contains('?') {
        return Err(OAuthSetupError::ResourcePath(resource.to_owned()));
    }
    Ok(())
}

/// Whether credentials, keys or token verdicts may travel to or from `url`: https, or http
/// on a loopback host (an issuer on the same machine, in development and tests). Anything
/// else, anyone on the path could read or answer.
pub fn is_secure_url(url: &str) -> bool {
    let Ok(parsed) = reqwest::Url::parse(url) else {
        return false;
    };
    match parsed.scheme() {
        "https" => true,
        "http" => clients::is_loopback(&parsed),
        _ => false,
    }
}

/// The largest metadata document or key set read from an issuer.
pub(crate) const MAX_KEYS_BODY: usize = 1 << 20;
/// The largest introspection answer read.
pub(crate) const MAX_VERDICT_BODY: usize = 64 << 10;

/// The JSON body of `res`, if it is no longer than `cap` bytes: whatever an issuer sends is
/// read into memory, and a misbehaving one must not fill it within the client's timeout.
pub(crate) async fn json_at_most(mut res: reqwest::Response, cap: usize) -> Option<Value> {
    let url = res.url().clone();
    let too_long = || {
        tracing::warn!(%url, limit = cap, "the authorization server's answer is too long");
    };
    if res.content_length().is_some_and(|n| n > cap as u64) {
        too_long();
        return None;
    }
    let mut body = Vec::new();
    while let Some(chunk) = res.chunk().await.ok()? {
        if body.len() + chunk.len() > cap {
            too_long();
            return None;
        }
        body.extend_from_slice(&chunk);
    }
    serde_json::from_slice(&body).ok()
}

/// A checked token, as cached.
#[derive(Debug, Clone)]
pub(crate) struct Checked {
    pub(crate) grant: Grant,
    /// The token's `sid` claim: the authorization session (token family) it belongs to.
    pub(crate) session: Option<String>,
    /// Seconds since the Unix epoch.
    pub(crate) expires_at: u64,
}

/// The resource server: shared by every request.
#[derive(Debug)]
pub struct OAuth {
    config: OAuthConfig,
    audiences: Vec<String>,
    checker: Checker,
    cache: TokenCache,
    /// Checks under way, which later requests with the same token join.
    flights: flight::Flights<Result<Accepted, AuthError>>,
    metadata: Value,
    revocations: Option<Arc<dyn Revocations>>,
}

/// Which authorization sessions (a token's `sid` claim) an issuer has revoked: what an
/// authorization server that revokes whole token families (a code or refresh token used
/// twice) offers the resource server beside it, so a self-contained access token of a revoked
/// family stops working before it expires. Asked on every request that carries a `sid`;
/// implementations answer from a short-lived cache.
pub trait Revocations: Send + Sync + std::fmt::Debug {
    /// Whether `issuer`'s session `session` was revoked.
    fn revoked<'a>(
        &'a self,
        issuer: &'a str,
        session: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<bool, AuthError>> + Send + 'a>>;
}

/// The key set an authorization server in this process publishes (its `jwks_uri`
/// document), which it offers the resource server beside it ([`Validation::Published`]).
pub trait PublishedKeys: Send + Sync + std::fmt::Debug {
    /// The JWK Set (RFC 7517 §5) published now. An error makes the keys unavailable
    /// ([`AuthError::Unavailable`]) until the next read.
    fn jwk_set(&self) -> Pin<Box<dyn Future<Output = Result<Value, AuthError>> + Send + '_>>;
}

#[derive(Debug)]
enum Checker {
    Jwt(jwt::JwtChecker),
    Introspection(Box<introspect::Introspector>),
}

impl OAuth {
    /// Sets the resource server up; nothing is fetched until the first token arrives.
    pub fn new(config: OAuthConfig) -> Result<Self, OAuthSetupError> {
        if !is_secure_url(&config.issuer) {
            return Err(OAuthSetupError::Insecure("the issuer"));
        }
        if let Validation::Jwt {
            jwks_uri: Some(uri),
            ..
        } = &config.validation
        {
            if !is_secure_url(uri) {
                return Err(OAuthSetupError::Insecure("the JWKS URI"));
            }
        }
        check_resource(&config.resource)?;
        if config.leeway > MAX_LEEWAY {
            return Err(OAuthSetupError::Leeway(config.leeway.as_secs()));
        }
        if let Validation::Jwt {
            min_refresh,
            max_age,
            ..
        }
        | Validation::Published {
            min_refresh,
            max_age,
            ..
        } = &config.validation
        {
            if max_age.is_zero() || max_age < min_refresh {
                return Err(OAuthSetupError::KeyAge {
                    max_age: *max_age,
                    min_refresh: *min_refresh,
                });
            }
        }
        // Challenges quote these scopes: one that breaks the header would lose the whole
        // challenge.
        let scopes = config
            .required_scopes
            .iter()
            .chain(&config.scopes_supported);
        if let Some(bad) = scopes.into_iter().find(|s| !is_scope_token(s)) {
            return Err(OAuthSetupError::Scope(bad.clone()));
        }
        let http = HttpClients::new(|| {
            reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                // Keys and introspection answers come from the configured URLs, never
                // elsewhere.
                .redirect(reqwest::redirect::Policy::none())
        })
        .map_err(|e| OAuthSetupError::Client(e.to_string()))?;
        let audiences = if config.audiences.is_empty() {
            vec![config.resource.clone()]
        } else {
            config.audiences.clone()
        };
        let checker = match &config.validation {
            Validation::Jwt {
                jwks_uri,
                min_refresh,
                max_age,
            } => Checker::Jwt(jwt::JwtChecker::new(
                jwt::KeyOrigin::fetched(http, jwks_uri.clone()),
                config.issuer.clone(),
                *min_refresh,
                *max_age,
            )),
            Validation::Published {
                keys,
                min_refresh,
                max_age,
            } => Checker::Jwt(jwt::JwtChecker::new(
                jwt::KeyOrigin::Published(Arc::clone(keys)),
                config.issuer.clone(),
                *min_refresh,
                *max_age,
            )),
            Validation::Introspection {
                endpoint,
                client_id,
                client_secret,
                limits,
                ..
            } => {
                if !is_secure_url(endpoint) {
                    return Err(OAuthSetupError::Insecure("the introspection endpoint"));
                }
                // Every answer would be a 401 from the endpoint, which the resource server
                // must take as "unavailable": every token refused with 503, none checked.
                if client_id.trim().is_empty() || client_secret.expose().trim().is_empty() {
                    return Err(OAuthSetupError::IntrospectionClient);
                }
                Checker::Introspection(Box::new(introspect::Introspector::new(
                    http,
                    endpoint.clone(),
                    client_id.clone(),
                    client_secret.clone(),
                    *limits,
                )))
            }
        };
        let cache_ttl = match &config.validation {
            // A verified JWT stays valid until it expires; the cache spares the signature
            // check on every call of an agent that reuses its token.
            Validation::Jwt { max_age, .. } | Validation::Published { max_age, .. } => {
                Duration::from_secs(300).min(*max_age)
            }
            Validation::Introspection { cache_ttl, .. } => *cache_ttl,
        };
        let authorization_servers = if config.authorization_servers.is_empty() {
            vec![config.issuer.clone()]
        } else {
            config.authorization_servers.clone()
        };
        let metadata = json!({
            "resource": config.resource,
            "authorization_servers": authorization_servers,
            "scopes_supported": config.scopes_supported,
            "bearer_methods_supported": ["header"],
        });
        Ok(OAuth {
            audiences,
            checker,
            cache: TokenCache::new(cache_ttl),
            flights: flight::Flights::default(),
            metadata,
            revocations: None,
            config,
        })
    }

    /// The protected resource metadata (RFC 9728).
    pub fn metadata(&self) -> &Value {
        &self.metadata
    }

    /// Where challenges say the metadata is: the well-known segment inserted before the
    /// resource's path (RFC 9728 §3.1), or at the origin's root when it has none. Both
    /// documents are served.
    pub fn metadata_url(&self) -> String {
        let origin = origin_of(&self.config.resource);
        let path = self.metadata_path_for_resource();
        let path = path
            .as_deref()
            .unwrap_or("/.well-known/oauth-protected-resource");
        format!("{origin}{path}")
    }

    /// The path-suffixed metadata path for the resource's own path (RFC 9728 §3.1), if it
    /// has one: the path as it is, a slash at its end included (only a lone `/` after the
    /// host is no path).
    pub fn metadata_path_for_resource(&self) -> Option<String> {
        let origin = origin_of(&self.config.resource);
        let path = &self.config.resource[origin.len()..];
        (!path.is_empty() && path != "/")
            .then(|| format!("/.well-known/oauth-protected-resource{path}"))
    }

    /// The `WWW-Authenticate` value of a 401, or a 400 for a malformed request (RFC 6750 §3,
    /// RFC 9728 §5.1).
    pub fn challenge(&self, refusal: &AuthError) -> String {
        let mut c = format!("Bearer resource_metadata=\"{}\"", self.metadata_url());
        let scopes = if self.config.required_scopes.is_empty() {
            &self.config.scopes_supported
        } else {
            &self.config.required_scopes
        };
        if !scopes.is_empty() {
            c.push_str(&format!(", scope=\"{}\"", scopes.join(" ")));
        }
        match refusal {
            AuthError::Missing => {}
            AuthError::Malformed | AuthError::TokenInQuery => {
                c.push_str(", error=\"invalid_request\"")
            }
            other => {
                c.push_str(", error=\"invalid_token\"");
                c.push_str(&format!(", error_description=\"{}\"", other.description()));
            }
        }
        c
    }

    /// The `WWW-Authenticate` value of a 403 for a request that needs `required` scopes and
    /// whose token lacks some. It names every scope the request needs, in one challenge
    /// (SEP-2350): the scopes every request needs, then `required`, each once. A client that
    /// asks for exactly these gets a token that can make the request; one asked for
    /// `required` alone would lack the server-wide scopes and be refused everything.
    pub fn forbidden_challenge(&self, required: &[String]) -> String {
        let mut scopes: Vec<&str> = Vec::new();
        for s in self.config.required_scopes.iter().chain(required) {
            if !scopes.contains(&s.as_str()) {
                scopes.push(s);
            }
        }
        format!(
            "Bearer error=\"insufficient_scope\", scope=\"{}\", resource_metadata=\"{}\"",
            scopes.join(" "),
            self.metadata_url()
        )
    }

    /// Checks a token and returns its principal. A token seen recently costs a hash and a
    /// lookup: its outcome (principal or refusal) is cached.
    pub async fn authenticate(&self, token: &str) -> Result<Principal, AuthError> {
        let accepted = self.accepted(token).await?;
        if let (Some(revocations), Some(session)) = (&self.revocations, &accepted.session) {
            if revocations.revoked(&self.config.issuer, session).await? {
                return Err(AuthError::InvalidToken);
            }
        }
        Ok(accepted.principal)
    }

    /// Asks `revocations` on every request whether the token's session was revoked.
    pub fn with_revocations(mut self, revocations: Arc<dyn Revocations>) -> Self {
        self.revocations = Some(revocations);
        self
    }

    async fn accepted(&self, token: &str) -> Result<Accepted, AuthError> {
        let now = now_millis();
        let seen = match self.cache.lookup(token, now) {
            Lookup::Hit(outcome) => return outcome,
            Lookup::Lapsed => Seen::Accepted,
            Lookup::Miss => Seen::New,
        };
        let check = || async {
            let (issuer, leeway) = (&self.config.issuer, self.config.leeway);
            let fresh = match &self.checker {
                Checker::Jwt(j) => j.check(token, &self.audiences, leeway).await,
                Checker::Introspection(i) => {
                    i.check(token, seen, issuer, &self.audiences, leeway).await
                }
            };
            let outcome = fresh.and_then(|checked| self.accept(checked));
            // A key or endpoint that could not be reached says nothing of the token: not kept.
            if outcome != Err(AuthError::Unavailable) {
                self.cache.put(token, &outcome, now);
            }
            outcome
        };
        self.flights.run(cache::key(token), check).await
    }

    /// A checked token's principal, if it has the scopes every request needs.
    fn accept(&self, checked: Checked) -> Result<Accepted, AuthError> {
        let required = &self.config.required_scopes;
        if required.iter().any(|s| !checked.grant.scopes.contains(s)) {
            return Err(AuthError::InsufficientScope(required.clone()));
        }
        Ok(Accepted {
            session: checked.session,
            // As long as the token is accepted: its `exp`, give or take the leeway (a
            // stream opened within it would otherwise end at once, and be opened again).
            principal: Principal::oauth(checked.grant).valid_until(
                std::time::UNIX_EPOCH
                    + Duration::from_secs(
                        checked
                            .expires_at
                            .saturating_add(self.config.leeway.as_secs())
                            .min(MAX_EXPIRY),
                    ),
            ),
            expires_at: checked.expires_at,
        })
    }
}

/// The latest expiry a principal is given (the year 9999): an answer without `exp` says
/// none, and `SystemTime` cannot hold every `u64` of seconds.
const MAX_EXPIRY: u64 = 253_402_300_799;

/// A token's accepted principal, as cached.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Accepted {
    pub(crate) principal: Principal,
    /// The token's `sid`, checked against [`Revocations`] on every request.
    pub(crate) session: Option<String>,
    /// Seconds since the Unix epoch.
    pub(crate) expires_at: u64,
}

/// The scopes of a `scope` claim (space-separated, or an array as Spring Authorization
/// Server writes it) or `scp` (an array); entries that are not strings are ignored.
pub(crate) fn scopes_of(claims: &serde_json::Map<String, Value>) -> BTreeSet<String> {
    match (claims.get("scope"), claims.get("scp")) {
        (Some(Value::String(s)), _) => s
            .split(' ')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
        (Some(Value::Array(a)), _) | (_, Some(Value::Array(a))) => a
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        (_, Some(Value::String(s))) => s
            .split(' ')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
        _ => BTreeSet::new(),
    }
}

/// The principal's name in a token's claims or an introspection answer: its `sub`, a
/// non-empty string. A token without one is refused rather than given its client's name,
/// which every user of the client would share.
pub(crate) fn subject_of(claims: &serde_json::Map<String, Value>) -> Result<String, AuthError> {
    match claims.get("sub") {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        _ => Err(AuthError::InvalidToken),
    }
}

/// A NumericDate (RFC 7519 §2) in whole seconds since the Unix epoch: a JSON number, which
/// may have a fraction (dropped), neither negative nor infinite; `None` for anything else.
pub(crate) fn numeric_date(value: &Value) -> Option<u64> {
    if let Some(whole) = value.as_u64() {
        return Some(whole);
    }
    let secs = value.as_f64()?;
    // `as` saturates at u64::MAX, past any expiry that matters.
    (secs.is_finite() && secs >= 0.0).then(|| secs.floor() as u64)
}

/// Whether an `aud` claim (a string or an array) names one of `accepted`.
pub(crate) fn audience_ok(aud: Option<&Value>, accepted: &[String]) -> bool {
    match aud {
        Some(Value::String(a)) => accepted.iter().any(|x| x == a),
        Some(Value::Array(list)) => list
            .iter()
            .filter_map(Value::as_str)
            .any(|a| accepted.iter().any(|x| x == a)),
        _ => false,
    }
}

pub(crate) fn now_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

pub(crate) fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `scheme://authority` of a URL.
fn origin_of(url: &str) -> &str {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    match url[after_scheme..].find('/') {
        Some(i) => &url[..after_scheme + i],
        None => url,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_paths_follow_rfc_9728() {
        assert_eq!(
            origin_of("https://mcp.example.com/mcp"),
            "https://mcp.example.com"
        );
        assert_eq!(origin_of("http://127.0.0.1:8080"), "http://127.0.0.1:8080");
    }

    #[test]
    fn keys_and_verdicts_come_over_https_or_from_this_machine() {
        for ok in [
            "https://as.example.com",
            "http://127.0.0.1:9000/realms/x",
            "http://localhost:8080",
            "http://[::1]:80/",
        ] {
            assert!(is_secure_url(ok), "{ok}");
        }
        for refused in [
            "http://as.example.com",
            "http://127.0.0.1.example.com",
            "http://10.0.0.1/",
            "ftp://as.example.com",
            "as.example.com",
        ] {
            assert!(!is_secure_url(refused), "{refused}");
        }
        let config = |issuer: &str, validation: Validation| OAuthConfig {
            resource: "http://127.0.0.1:8080/mcp".into(),
            audiences: Vec::new(),
            issuer: issuer.into(),
            authorization_servers: Vec::new(),
            scopes_supported: Vec::new(),
            required_scopes: Vec::new(),
            leeway: Duration::ZERO,
            validation,
        };
        let jwt = |jwks_uri: Option<&str>| Validation::Jwt {
            jwks_uri: jwks_uri.map(str::to_owned),
            min_refresh: Duration::from_secs(60),
            max_age: Duration::from_secs(3600),
        };
        let refused = |c| OAuth::new(c).err().map(|e| e.to_string());
        assert_eq!(
            refused(config("http://as.example.com", jwt(None))),
            Some("the issuer must be an https URL (plain http only on a loopback host)".into())
        );
        assert!(
            refused(config(
                "https://as.example.com",
                jwt(Some("http://keys.example.com"))
            ))
            .is_some_and(|e| e.starts_with("the JWKS URI"))
        );
        let introspection = Validation::Introspection {
            endpoint: "http://as.example.com/introspect".into(),
            client_id: "rs".into(),
            client_secret: "s".into(),
            cache_ttl: Duration::from_secs(30),
            limits: IntrospectionLimits::default(),
        };
        assert!(
            refused(config("https://as.example.com", introspection))
                .is_some_and(|e| e.starts_with("the introspection endpoint"))
        );
        // Without its credentials every token would be refused with 503, none checked.
        for (id, secret) in [("", "s"), ("rs", ""), (" ", "s")] {
            let introspection = Validation::Introspection {
                endpoint: "https://as.example.com/introspect".into(),
                client_id: id.into(),
                client_secret: secret.into(),
                cache_ttl: Duration::from_secs(30),
                limits: IntrospectionLimits::default(),
            };
            assert!(
                refused(config("https://as.example.com", introspection))
                    .is_some_and(|e| e.starts_with("token introspection needs")),
                "{id:?} {secret:?}"
            );
        }
        assert!(OAuth::new(config("http://127.0.0.1:9", jwt(None))).is_ok());
    }

    #[test]
    fn configured_scopes_are_scope_tokens() {
        for ok in ["mcp:access", "a!#[]^~", "https://api.example.com/read"] {
            assert!(is_scope_token(ok), "{ok}");
        }
        for bad in [
            "",
            "two words",
            "quo\"te",
            "back\\slash",
            "tab\t",
            "é",
            "line\n",
        ] {
            assert!(!is_scope_token(bad), "{bad:?}");
        }
        let config = |required: &str, supported: &str| OAuthConfig {
            resource: "https://mcp.example.com/mcp".into(),
            audiences: Vec::new(),
            issuer: "https://as.example.com".into(),
            authorization_servers: Vec::new(),
            scopes_supported: vec![supported.into()],
            required_scopes: vec![required.into()],
            leeway: Duration::ZERO,
            validation: Validation::Jwt {
                jwks_uri: None,
                min_refresh: Duration::from_secs(60),
                max_age: Duration::from_secs(3600),
            },
        };
        let refused = |c| OAuth::new(c).err().map(|e| e.to_string());
        assert_eq!(refused(config("ok", "ok")), None);
        let err = refused(config("a\"b", "ok")).unwrap();
        assert!(
            err.starts_with("scope \"a\\\"b\" is not a valid scope"),
            "{err}"
        );
        assert!(refused(config("ok", "x y")).is_some_and(|e| e.contains("\"x y\"")));
    }

    /// A resource URI with a fragment or a quote, or a leeway past five minutes, is refused
    /// when the server is set up, naming it.
    #[test]
    fn a_resource_uri_and_a_leeway_are_checked_at_setup() {
        let jwt = Validation::Jwt {
            jwks_uri: None,
            min_refresh: Duration::from_secs(60),
            max_age: Duration::from_secs(3600),
        };
        let refused = |resource: &str, leeway: u64| {
            let mut config = OAuthConfig::new(resource, "https://as.example.com", jwt.clone());
            config.leeway = Duration::from_secs(leeway);
            OAuth::new(config).err().map(|e| e.to_string())
        };
        assert_eq!(refused("https://mcp.example.com/mcp", 300), None);
        let fragment = refused("https://mcp.example.com/mcp#x", 0).unwrap();
        assert!(fragment.contains("no fragment"), "{fragment}");
        assert!(refused("https://mcp.example.com/\"", 0).is_some());
        // Paths a router would take as captures (axum panics on `:` and `*`), or never match.
        for unroutable in [
            "https://mcp.example.com/:tenant/mcp",
            "https://mcp.example.com/mcp/*",
            "https://mcp.example.com/{id}",
            "https://mcp.example.com/mcp?tenant=a",
            "https://mcp.example.com?tenant=a",
        ] {
            let e = refused(unroutable, 0).unwrap_or_default();
            assert!(
                e.contains("cannot have its metadata served"),
                "{unroutable}: {e}"
            );
        }
        assert_eq!(refused("https://mcp.example.com/a:b/mcp*", 0), None);
        let leeway = refused("https://mcp.example.com/mcp", 301).unwrap();
        assert!(leeway.contains("301 s"), "{leeway}");
        // A key set trusted for less than it may be fetched again.
        for (min_refresh, max_age) in [(600, 60), (0, 0)] {
            let validation = Validation::Jwt {
                jwks_uri: None,
                min_refresh: Duration::from_secs(min_refresh),
                max_age: Duration::from_secs(max_age),
            };
            let config = OAuthConfig::new(
                "https://mcp.example.com/mcp",
                "https://as.example.com",
                validation,
            );
            let e = OAuth::new(config)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                e.starts_with("the key set's max_age"),
                "{min_refresh} {max_age}: {e}"
            );
        }
    }

    #[test]
    fn a_scope_challenge_names_everything_the_request_needs() {
        let rs = OAuth::new(OAuthConfig {
            resource: "https://mcp.example.com/mcp".into(),
            audiences: Vec::new(),
            issuer: "https://as.example.com".into(),
            authorization_servers: Vec::new(),
            scopes_supported: Vec::new(),
            required_scopes: vec!["base".into()],
            leeway: Duration::ZERO,
            validation: Validation::Jwt {
                jwks_uri: None,
                min_refresh: Duration::from_secs(60),
                max_age: Duration::from_secs(3600),
            },
        })
        .unwrap();
        let needs = ["a".to_owned(), "base".to_owned(), "b".to_owned()];
        assert_eq!(
            rs.forbidden_challenge(&needs),
            "Bearer error=\"insufficient_scope\", scope=\"base a b\", \
             resource_metadata=\"https://mcp.example.com/.well-known/oauth-protected-resource/mcp\""
        );
    }

    #[test]
    fn challenges_name_the_metadata_of_the_resource_path() {
        let at = |resource: &str| {
            OAuth::new(OAuthConfig {
                resource: resource.into(),
                audiences: Vec::new(),
                issuer: "https://as.example.com".into(),
                authorization_servers: Vec::new(),
                scopes_supported: Vec::new(),
                required_scopes: Vec::new(),
                leeway: Duration::ZERO,
                validation: Validation::Jwt {
                    jwks_uri: None,
                    min_refresh: Duration::from_secs(60),
                    max_age: Duration::from_secs(3600),
                },
            })
            .unwrap()
        };
        let rs = at("https://mcp.example.com/public/mcp");
        assert_eq!(
            rs.challenge(&AuthError::Missing),
            "Bearer resource_metadata=\"https://mcp.example.com/.well-known/oauth-protected-resource/public/mcp\""
        );
        for root in ["https://mcp.example.com", "https://mcp.example.com/"] {
            assert_eq!(
                at(root).metadata_url(),
                "https://mcp.example.com/.well-known/oauth-protected-resource"
            );
        }
        // A slash ending a path is part of it: clients that build the URL themselves keep it.
        assert_eq!(
            at("https://mcp.example.com/mcp/").metadata_url(),
            "https://mcp.example.com/.well-known/oauth-protected-resource/mcp/"
        );
    }

    #[test]
    fn numeric_dates_may_have_a_fraction() {
        assert_eq!(numeric_date(&json!(1767225600)), Some(1767225600));
        assert_eq!(numeric_date(&json!(1767225600.5)), Some(1767225600));
        assert_eq!(numeric_date(&json!(0.0)), Some(0));
        for bad in [
            json!(-1),
            json!(-0.5),
            json!("1767225600"),
            json!(null),
            json!([1]),
        ] {
            assert_eq!(numeric_date(&bad), None, "{bad}");
        }
    }

    #[test]
    fn scopes_and_audiences_are_read_in_both_shapes() {
        let claims = json!({ "scope": "a b  c" });
        assert_eq!(scopes_of(claims.as_object().unwrap()).len(), 3);
        let claims = json!({ "scp": ["a", "b"] });
        assert_eq!(scopes_of(claims.as_object().unwrap()).len(), 2);
        let claims = json!({ "scope": ["a", "b", 3], "scp": ["c"] });
        let read: Vec<_> = scopes_of(claims.as_object().unwrap()).into_iter().collect();
        assert_eq!(read, ["a", "b"]);
        let ok = vec!["https://r".to_owned()];
        assert!(audience_ok(Some(&json!("https://r")), &ok));
        assert!(audience_ok(Some(&json!(["x", "https://r"])), &ok));
        assert!(!audience_ok(Some(&json!("https://other")), &ok));
        assert!(!audience_ok(None, &ok));
    }

    /// A burst of requests with one token not seen yet costs one introspection: the rest wait
    /// for its answer (and the cache serves those after).
    #[tokio::test]
    async fn a_burst_with_one_new_token_costs_one_introspection() {
        use std::sync::atomic::Ordering;

        use peer::Answer;

        let answer = Arc::new(tokio::sync::Notify::new());
        let body = json!({ "active": true, "sub": "alice", "aud": "http://127.0.0.1:8080/mcp" });
        let introspection = peer::start(|_| {
            Answer::Released(peer::json_ok(&body.to_string()), Arc::clone(&answer))
        })
        .await;
        let (endpoint, received) = (
            format!("{}/introspect", introspection.origin),
            introspection.requests,
        );
        let rs = introspecting(
            endpoint,
            Duration::from_secs(30),
            IntrospectionLimits::default(),
        );
        let burst: Vec<_> = (0..8)
            .map(|_| {
                let rs = Arc::clone(&rs);
                tokio::spawn(async move { rs.authenticate("new-token").await })
            })
            .collect();
        peer::until_received(&received, 1).await;
        // Every request of the burst reaches the check before the answer comes.
        for _ in 0..200 {
            tokio::task::yield_now().await;
        }
        answer.notify_one();
        for request in burst {
            // A second introspection would wait for an answer that never comes.
            let principal = tokio::time::timeout(Duration::from_secs(10), request)
                .await
                .expect("the burst shares the one answer")
                .unwrap()
                .unwrap();
            assert!(principal.id().ends_with("#alice"), "{}", principal.id());
        }
        assert_eq!(received.load(Ordering::SeqCst), 1);
    }

    /// A resource server for `http://127.0.0.1:8080/mcp` asking `endpoint`.
    fn introspecting(
        endpoint: String,
        cache_ttl: Duration,
        limits: IntrospectionLimits,
    ) -> Arc<OAuth> {
        let validation = Validation::Introspection {
            endpoint,
            client_id: "rs".into(),
            client_secret: "s".into(),
            cache_ttl,
            limits,
        };
        let config = OAuthConfig::new(
            "http://127.0.0.1:8080/mcp",
            "http://127.0.0.1:9",
            validation,
        );
        Arc::new(OAuth::new(config).unwrap())
    }

    /// A token whose cached answer lapsed is checked again in the lane of tokens accepted
    /// before: made-up tokens holding every place of the other lane do not stop it.
    #[tokio::test]
    async fn a_lapsed_token_is_checked_again_past_a_flood_of_new_ones() {
        let release = Arc::new(tokio::sync::Notify::new());
        let body = json!({ "active": true, "sub": "alice", "aud": "http://127.0.0.1:8080/mcp" });
        let introspection = peer::start(|_| {
            peer::Answer::Released(peer::json_ok(&body.to_string()), Arc::clone(&release))
        })
        .await;
        let received = introspection.requests;
        let mut limits = IntrospectionLimits::new(1, 1000);
        limits.max_wait = Duration::from_millis(200);
        let endpoint = format!("{}/introspect", introspection.origin);
        // No cache: every answer lapses at once, and only the memory of acceptance stays.
        let rs = introspecting(endpoint, Duration::ZERO, limits);
        let authenticate = |token: &'static str| {
            let rs = Arc::clone(&rs);
            tokio::spawn(async move { rs.authenticate(token).await })
        };
        let first = authenticate("known");
        release.notify_one();
        assert!(first.await.unwrap().is_ok());
        // Made-up tokens take the one place new tokens have (this one is never answered).
        let junk = authenticate("junk");
        peer::until_received(&received, 2).await;
        let again = authenticate("known");
        peer::until_received(&received, 3).await;
        junk.abort();
        // The endpoint answers in turn: the made-up token's request first.
        release.notify_one();
        release.notify_one();
        let principal = again.await.unwrap().expect("checked again in its own lane");
        assert!(principal.id().ends_with("#alice"), "{}", principal.id());
    }
}
