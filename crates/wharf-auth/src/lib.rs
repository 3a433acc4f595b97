//! Who a request acts for. Every HTTP request resolves to a [`Principal`] before anything
//! else runs; [`Auth`] says how.
//!
//! - [`Auth::anonymous`]: no credentials; every request acts for the one anonymous principal,
//!   so handles are bearer capabilities, and an idempotency key one client used replays its
//!   result to any other (clients must use unguessable keys).
//! - [`Auth::api_keys`]: static keys sent as `Authorization: Bearer TOKEN`, each naming its
//!   principal.
//! - [`Auth::oauth`]: an OAuth 2.1 resource server ([`oauth`]).

mod api_keys;
pub mod oauth;
mod secret;

pub use api_keys::{ApiKeyError, ApiKeys};
pub use oauth::{
    HttpClients, IntrospectionLimits, MAX_LEEWAY, OAuth, OAuthConfig, PublishedKeys, Revocations,
    Validation, check_resource, is_loopback_url, is_secure_url,
};
pub use secret::Secret;

use std::sync::Arc;

use http::HeaderMap;
use http::header::AUTHORIZATION;
use wharf::Principal;

/// Why a request was refused before it ran: HTTP 401, except [`AuthError::Malformed`] and
/// [`AuthError::TokenInQuery`] (400, a malformed authorization request),
/// [`AuthError::InsufficientScope`] (403) and [`AuthError::Unavailable`] (503).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// No `Authorization` header, or one of another scheme than `Bearer`: RFC 6750 §3.1
    /// counts a method the server does not support as no credentials.
    #[error("Unauthorized: this server needs an Authorization: Bearer token")]
    Missing,
    /// An `Authorization: Bearer` header without exactly one token, or several
    /// `Authorization` headers.
    #[error("Bad Request: the Authorization header must be \"Bearer <token>\"")]
    Malformed,
    /// A token sent in the URL, where it leaks into logs.
    #[error(
        "Bad Request: access tokens in the query string are refused; send them in the Authorization header"
    )]
    TokenInQuery,
    /// A token this server does not know, or that is not a token at all.
    #[error("Unauthorized: the bearer token is not valid")]
    InvalidToken,
    /// Past its `exp`.
    #[error("Unauthorized: the token has expired")]
    Expired,
    /// Before its `nbf`.
    #[error("Unauthorized: the token is not valid yet")]
    NotYetValid,
    /// Another `iss`.
    #[error("Unauthorized: the token was issued by another issuer")]
    WrongIssuer,
    /// An `aud` that is not this resource.
    #[error("Unauthorized: the token was issued for another resource (audience)")]
    WrongAudience,
    /// A signature that does not verify.
    #[error("Unauthorized: the token's signature does not verify")]
    BadSignature,
    /// An algorithm outside RS256, ES256 and EdDSA (`none` included).
    #[error("Unauthorized: the token is signed with an algorithm this server does not accept")]
    UnsupportedAlgorithm,
    /// A token of another type (an ID token, a DPoP proof, a refresh token…) from the issuer.
    #[error("Unauthorized: the token is not an access token")]
    NotAnAccessToken,
    /// A key id the issuer's key set lacks, even after a refetch.
    #[error("Unauthorized: the token is signed with a key the issuer does not publish")]
    UnknownKey,
    /// A token bound to a key or certificate (`cnf`: DPoP, mutual TLS) sent as a plain
    /// bearer token: this server cannot verify the binding, so it does not accept it.
    #[error(
        "Unauthorized: the token is sender-constrained (cnf); this server does not support sender-constrained tokens"
    )]
    SenderConstrained,
    /// Introspection answered `active: false`.
    #[error("Unauthorized: the token is not active")]
    Inactive,
    /// A valid token without the scopes every request needs (HTTP 403).
    #[error("Forbidden: the token lacks the scopes this server needs: {}", .0.join(" "))]
    InsufficientScope(Vec<String>),
    /// The issuer's keys or the introspection endpoint could not be reached (HTTP 503).
    #[error("Busy: the authorization server could not be reached to check the token; retry later")]
    Unavailable,
}

impl AuthError {
    /// The `WWW-Authenticate` challenge for this refusal in API-key mode (RFC 6750).
    pub fn challenge(&self) -> &'static str {
        match self {
            AuthError::Missing => "Bearer realm=\"wharf\"",
            AuthError::Malformed | AuthError::TokenInQuery => {
                "Bearer realm=\"wharf\", error=\"invalid_request\""
            }
            _ => "Bearer realm=\"wharf\", error=\"invalid_token\"",
        }
    }

    /// A short description for `error_description` (no token content, ever).
    pub fn description(&self) -> &'static str {
        match self {
            AuthError::Missing => "no token",
            AuthError::Malformed => "malformed Authorization header",
            AuthError::TokenInQuery => "token in the query string",
            AuthError::InvalidToken => "the token is not valid",
            AuthError::Expired => "the token has expired",
            AuthError::NotYetValid => "the token is not valid yet",
            AuthError::WrongIssuer => "the token was issued by another issuer",
            AuthError::WrongAudience => "the token was issued for another resource",
            AuthError::BadSignature => "the signature does not verify",
            AuthError::UnsupportedAlgorithm => "the signing algorithm is not accepted",
            AuthError::NotAnAccessToken => "the token is not an access token",
            AuthError::UnknownKey => "unknown signing key",
            AuthError::SenderConstrained => "sender-constrained tokens are not supported",
            AuthError::Inactive => "the token is not active",
            AuthError::InsufficientScope(_) => "insufficient scope",
            AuthError::Unavailable => "the authorization server is unavailable",
        }
    }
}

/// How requests are authenticated.
#[derive(Debug, Clone)]
pub struct Auth(Mode);

#[derive(Debug, Clone)]
enum Mode {
    Anonymous(Principal),
    ApiKeys(ApiKeys),
    OAuth(Arc<OAuth>),
}

impl Auth {
    /// Serves without credentials.
    pub fn anonymous() -> Self {
        Auth(Mode::Anonymous(Principal::anonymous()))
    }

    /// Accepts the given static keys, and nothing else.
    pub fn api_keys(keys: ApiKeys) -> Self {
        Auth(Mode::ApiKeys(keys))
    }

    /// Checks OAuth access tokens (see [`oauth`]).
    pub fn oauth(resource_server: OAuth) -> Self {
        Auth(Mode::OAuth(Arc::new(resource_server)))
    }

    /// Whether requests need no credentials.
    pub fn is_anonymous(&self) -> bool {
        matches!(self.0, Mode::Anonymous(_))
    }

    /// Resolves the principal of a request from its headers.
    pub async fn authenticate(&self, headers: &HeaderMap) -> Result<Principal, AuthError> {
        match &self.0 {
            Mode::OAuth(rs) => rs.authenticate(bearer_token(headers)?).await,
            _ => self
                .authenticate_now(headers)
                .unwrap_or(Err(AuthError::Unavailable)),
        }
    }

    /// The answer of a mode that needs no I/O (anonymous, API keys); `None` for the OAuth
    /// resource server, whose checks may fetch keys or introspect.
    pub fn authenticate_now(&self, headers: &HeaderMap) -> Option<Result<Principal, AuthError>> {
        match &self.0 {
            Mode::Anonymous(p) => Some(Ok(p.clone())),
            Mode::ApiKeys(keys) => Some(bearer_token(headers).and_then(|t| keys.principal_for(t))),
            Mode::OAuth(_) => None,
        }
    }

    /// The `WWW-Authenticate` value of a refusal.
    pub fn challenge(&self, refusal: &AuthError) -> String {
        match (&self.0, refusal) {
            (Mode::OAuth(rs), AuthError::InsufficientScope(required)) => {
                rs.forbidden_challenge(required)
            }
            (Mode::OAuth(rs), _) => rs.challenge(refusal),
            _ => refusal.challenge().to_owned(),
        }
    }

    /// The `WWW-Authenticate` value of a 403 for a request that needs `required` scopes.
    pub fn forbidden_challenge(&self, required: &[String]) -> String {
        match &self.0 {
            Mode::OAuth(rs) => rs.forbidden_challenge(required),
            _ => format!(
                "Bearer error=\"insufficient_scope\", scope=\"{}\"",
                required.join(" ")
            ),
        }
    }

    /// The OAuth resource server, when requests carry access tokens.
    pub fn resource_server(&self) -> Option<&OAuth> {
        match &self.0 {
            Mode::OAuth(rs) => Some(rs),
            _ => None,
        }
    }
}

/// Whether a request URI carries an access token in its query (RFC 6750 §2.3), which this
/// server refuses.
pub fn token_in_query(query: Option<&str>) -> bool {
    query.is_some_and(|q| {
        q.split('&')
            .any(|pair| pair.split('=').next() == Some("access_token"))
    })
}

/// The token of an `Authorization: Bearer` header. The scheme is case-insensitive
/// (RFC 9110); exactly one header is accepted. A header of another scheme is no bearer
/// credentials ([`AuthError::Missing`]: the client is told what to send, RFC 6750 §3.1);
/// a bearer header without exactly one token is [`AuthError::Malformed`].
pub fn bearer_token(headers: &HeaderMap) -> Result<&str, AuthError> {
    let mut values = headers.get_all(AUTHORIZATION).iter();
    let value = values.next().ok_or(AuthError::Missing)?;
    if values.next().is_some() {
        return Err(AuthError::Malformed);
    }
    // The scheme is read from the bytes: a header of another scheme is none of this
    // server's business, whatever it carries.
    let raw = value.as_bytes();
    let scheme = raw.split(|b| *b == b' ').next().unwrap_or(raw);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return Err(AuthError::Missing);
    }
    let value = value.to_str().map_err(|_| AuthError::Malformed)?;
    let token = value
        .get(scheme.len()..)
        .unwrap_or("")
        .trim_start_matches(' ');
    if token.is_empty() || token.contains(' ') {
        return Err(AuthError::Malformed);
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn with_auth(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn bearer_tokens_are_read_strictly() {
        assert_eq!(bearer_token(&with_auth("Bearer abc")), Ok("abc"));
        assert_eq!(bearer_token(&with_auth("bearer abc")), Ok("abc"));
        assert_eq!(bearer_token(&HeaderMap::new()), Err(AuthError::Missing));
        for bad in ["Bearer", "Bearer ", "Bearer a b", "bearer  "] {
            assert_eq!(
                bearer_token(&with_auth(bad)),
                Err(AuthError::Malformed),
                "{bad}"
            );
        }
        for other in ["Basic abc", "abc", "", "Bearerx abc", "DPoP abc"] {
            assert_eq!(
                bearer_token(&with_auth(other)),
                Err(AuthError::Missing),
                "{other}"
            );
        }
        // Bytes outside visible ASCII: another scheme's business, or a malformed token.
        let opaque = |v: &[u8]| {
            let mut h = HeaderMap::new();
            h.insert(AUTHORIZATION, HeaderValue::from_bytes(v).unwrap());
            bearer_token(&h).map(str::to_owned)
        };
        assert_eq!(opaque(b"Basic \xe9t\xe9"), Err(AuthError::Missing));
        assert_eq!(opaque(b"Bearer \xe9t\xe9"), Err(AuthError::Malformed));
        let mut two = with_auth("Bearer a");
        two.append(AUTHORIZATION, HeaderValue::from_static("Bearer b"));
        assert_eq!(bearer_token(&two), Err(AuthError::Malformed));
    }
}
