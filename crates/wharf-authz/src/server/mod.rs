//! The authorization server: its configuration, its shared state, and the router that
//! serves its endpoints on the MCP server's origin.
//!
//! | Path | What |
//! |---|---|
//! | `/.well-known/oauth-authorization-server` | RFC 8414 metadata |
//! | `/authorize` | authorization code + PKCE; sign-in and consent pages |
//! | `/authorize/login`, `/authorize/consent` | the pages' forms |
//! | `/authorize/upstream`, `/authorize/upstream/callback` | sign-in at an upstream OpenID provider |
//! | `/token` | code and refresh-token grants |
//! | `/register` | Dynamic Client Registration (when open) |
//! | `/jwks` | the signing keys |
//! | `/account`, `/account/consents/revoke` | a signed-in user's remembered consents |
//! | `/account/signout` | ends the browser's session |

mod account;
mod authorize;
mod clients;
mod consent;
mod cookies;
mod error;
mod html;
mod limits;
mod metadata;
mod params;
mod register;
mod revocation;
mod token;
mod upstream;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use wharf::store::Store;

use crate::cimd::Fetcher;
use crate::keys::{KeyEncryption, KeyError, ROTATION, SigningKeys};
use crate::records::Records;
use crate::users::Users;

pub use error::OAuthError;
pub use upstream::UpstreamConfig;

/// The largest request body any endpoint reads.
const MAX_BODY: usize = 16 * 1024;

/// How the authorization server runs: start from [`AuthzConfig::new`] and set what differs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AuthzConfig {
    /// Its issuer identifier: the origin it is served on, `https://` (or `http://` on
    /// loopback, for development), with no trailing slash.
    pub issuer: String,
    /// The resources (RFC 8707) it issues tokens for; the first is the default when a
    /// request names none.
    pub resources: Vec<String>,
    /// The scopes it grants.
    pub scopes: Vec<String>,
    /// How long an access token lives.
    pub access_token_ttl: Duration,
    /// How long a refresh token lives unused.
    pub refresh_token_ttl: Duration,
    /// How long after a refresh token is spent the same request, sent again, gets the same
    /// tokens back instead of revoking the family, as long as the client has not used the
    /// new refresh token: a client whose answer was lost to a timeout or a dropped
    /// connection retries, and would otherwise lose the grant (its user signs in again).
    /// Meanwhile someone else presenting a copy of the spent token gets those tokens too,
    /// rather than revoking the family: so at most five minutes (longer is taken as five).
    /// Zero: every second use revokes.
    pub refresh_retry_window: Duration,
    /// How long an authorization code may be redeemed.
    pub code_ttl: Duration,
    /// Whether anyone may register a client (RFC 7591).
    pub open_registration: bool,
    /// Registrations per minute from one address.
    pub registrations_per_minute: u32,
    /// Token requests per minute from one address.
    pub token_requests_per_minute: u32,
    /// Authorization requests per minute from one address (each may fetch a document).
    pub authorizations_per_minute: u32,
    /// Sign-in attempts per minute from one address: passwords tried, and trips to the
    /// upstream provider started.
    pub sign_ins_per_minute: u32,
    /// The proxies in front of the server (their networks): a request that arrives from one
    /// is counted against the address its `X-Forwarded-For` names, the nearest hop that is
    /// not itself one of them. Empty (the default): the address that connected counts, which
    /// behind a proxy puts every client in one budget.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// An OpenID provider people may sign in with, besides local accounts.
    pub upstream: Option<UpstreamConfig>,
    /// How the token-signing keys are sealed in the store; without it they are stored as
    /// they are, and anyone who reads the store can sign tokens. Keys stored otherwise are
    /// sealed by [`AuthorizationServer::prepare`], which a server calls as it starts.
    pub key_encryption: Option<KeyEncryption>,
}

impl AuthzConfig {
    /// Defaults for an issuer serving one resource: ten-minute access tokens, thirty-day
    /// refresh tokens whose answer a retry gets again for a minute, one-minute codes, open
    /// registration; per address and minute, 20
    /// registrations, 120 token requests, 60 authorization requests and 20 sign-in attempts.
    pub fn new(issuer: impl Into<String>, resource: impl Into<String>) -> Self {
        Self {
            issuer: issuer.into().trim_end_matches('/').to_owned(),
            resources: vec![resource.into()],
            scopes: Vec::new(),
            access_token_ttl: Duration::from_secs(600),
            refresh_token_ttl: Duration::from_secs(30 * 24 * 3600),
            refresh_retry_window: Duration::from_secs(60),
            code_ttl: Duration::from_secs(60),
            open_registration: true,
            registrations_per_minute: 20,
            token_requests_per_minute: 120,
            authorizations_per_minute: 60,
            sign_ins_per_minute: 20,
            trusted_proxies: Vec::new(),
            upstream: None,
            key_encryption: None,
        }
    }
}

/// What every endpoint shares.
pub(crate) struct Shared {
    pub(crate) config: AuthzConfig,
    pub(crate) records: Records,
    pub(crate) keys: SigningKeys,
    pub(crate) users: Users,
    pub(crate) fetcher: Fetcher,
    pub(crate) upstream: Option<upstream::Upstream>,
    pub(crate) secure_cookies: bool,
    pub(crate) limits: limits::Limits,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The embedded authorization server: build it once, mount [`AuthorizationServer::router`].
#[derive(Debug, Clone)]
pub struct AuthorizationServer {
    shared: Arc<Shared>,
}

impl AuthorizationServer {
    /// A server keeping every record in `store`, fetching metadata documents with `fetcher`.
    pub fn new(config: AuthzConfig, store: Arc<dyn Store>, fetcher: Fetcher) -> Self {
        let records = Records::new(store);
        let shared = Shared {
            secure_cookies: config.issuer.starts_with("https://"),
            keys: SigningKeys::new(records.clone(), ROTATION, config.key_encryption.clone()),
            users: Users::from_records(records.clone()),
            limits: limits::Limits {
                registrations: limits::Limit::per_minute(config.registrations_per_minute),
                token_requests: limits::Limit::per_minute(config.token_requests_per_minute),
                authorizations: limits::Limit::per_minute(config.authorizations_per_minute),
                sign_ins: limits::Limit::per_minute(config.sign_ins_per_minute),
            },
            upstream: config.upstream.clone().map(upstream::Upstream::new),
            records,
            fetcher,
            config,
        };
        Self {
            shared: Arc::new(shared),
        }
    }

    /// What the resource server beside it asks on every request: whether a token's family
    /// was revoked. Give it to [`wharf_auth::OAuth::with_revocations`].
    pub fn revocations(&self) -> Arc<dyn wharf_auth::Revocations> {
        Arc::new(revocation::FamilyRevocations::new(
            self.shared.records.clone(),
            self.shared.config.issuer.clone(),
        ))
    }

    /// The keys its access tokens are signed with, read in-process: give them to the
    /// resource server beside it as [`wharf_auth::Validation::Published`], so its tokens
    /// verify without a fetch over HTTP, whatever address the process listens on.
    pub fn published_keys(&self) -> Arc<dyn wharf_auth::PublishedKeys> {
        Arc::new(metadata::PublishedKeys(Arc::clone(&self.shared)))
    }

    /// Readies the signing keys before the server takes requests: the previous, current
    /// and next period's exist, open with this server's key encryption key, and are sealed
    /// with it (those in plain, or sealed with a retired key, are sealed again). An error
    /// names a key this server cannot open, so a replica given the wrong key stops at
    /// startup instead of failing every token request.
    pub async fn prepare(&self) -> Result<(), KeyError> {
        self.shared.keys.prepare(wharf::store::now_millis()).await
    }

    /// The local accounts users sign in with.
    pub fn users(&self) -> &Users {
        &self.shared.users
    }

    /// The endpoints, to merge into the MCP server's router. Rate limits key on the peer
    /// address (or, from a trusted proxy, the client it names: [`AuthzConfig::trusted_proxies`]),
    /// so serve with `into_make_service_with_connect_info::<SocketAddr>()`; without it every
    /// request shares one budget.
    pub fn router(&self) -> Router {
        self.api_router().merge(self.page_router())
    }

    /// [`AuthorizationServer::router`]'s endpoints a client program calls (metadata,
    /// registration, token, revocation, keys): what a browser-based client's page may be
    /// given CORS for.
    pub fn api_router(&self) -> Router {
        Router::new()
            .route(
                "/.well-known/oauth-authorization-server",
                get(metadata::metadata),
            )
            .route("/token", post(token::token))
            .route("/revoke", post(token::revocation_endpoint))
            .route("/register", post(register::register))
            .route("/jwks", get(metadata::jwks))
            // Every registration and token request is small; nothing bigger is read.
            .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
            .with_state(self.shared.clone())
    }

    /// [`AuthorizationServer::router`]'s pages a person's browser navigates (sign-in,
    /// consent, account): forms protected by cookies and CSRF tokens, for no other origin.
    pub fn page_router(&self) -> Router {
        Router::new()
            .route("/authorize", get(authorize::authorize))
            .route("/authorize/login", post(authorize::login))
            .route("/authorize/upstream", get(upstream::start))
            .route("/authorize/upstream/callback", get(upstream::callback))
            .route(
                "/authorize/consent",
                get(authorize::consent_page).post(authorize::consent),
            )
            .route("/account", get(account::account))
            .route("/account/consents/revoke", post(account::revoke))
            .route("/account/signout", post(account::sign_out))
            // Every form here is small; nothing bigger is read.
            .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
            .with_state(self.shared.clone())
    }
}

/// Whether two resource URIs (RFC 8707) name the same resource: equal once parsed, so the
/// case of the scheme and host and a default port do not matter (MCP's authorization asks
/// servers to accept those spellings); the path is compared as written.
pub(crate) fn same_resource(a: &str, b: &str) -> bool {
    match (url::Url::parse(a), url::Url::parse(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

impl Shared {
    /// A cookie's name on this server (`__Host-` prefixed over https).
    pub(crate) fn cookie(&self, name: cookies::Name) -> &'static str {
        name.on(self.secure_cookies)
    }

    pub(crate) fn endpoint(&self, path: &str) -> String {
        format!("{}{path}", self.config.issuer)
    }
}

/// Compares two secrets without leaking where they differ.
pub(crate) fn constant_eq(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::same_resource;

    #[test]
    fn resources_match_whatever_the_case_of_scheme_and_host() {
        let ours = "https://mcp.example.com/mcp";
        for same in [
            "https://mcp.example.com/mcp",
            "HTTPS://MCP.EXAMPLE.COM/mcp",
            "https://mcp.example.com:443/mcp",
        ] {
            assert!(same_resource(ours, same), "{same}");
        }
        for other in [
            "https://mcp.example.com/MCP",
            "https://mcp.example.com/mcp/",
            "http://mcp.example.com/mcp",
            "https://evil.example.com/mcp",
            "not a url",
        ] {
            assert!(!same_resource(ours, other), "{other}");
        }
    }
}
