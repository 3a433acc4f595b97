//! Who a request acts for. Every HTTP request resolves to a [`Principal`] before anything
//! else runs; [`Auth`] says how.
//!
//! - [`Auth::anonymous`]: no credentials; every request acts for the one anonymous principal,
//!   so handles are bearer capabilities.
//! - [`Auth::api_keys`]: static keys sent as `Authorization: Bearer TOKEN`, each naming its
//!   principal.

mod api_keys;

pub use api_keys::{ApiKeyError, ApiKeys};

use http::HeaderMap;
use http::header::AUTHORIZATION;
use wharf::Principal;

/// Why a request was refused before it ran (HTTP 401).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `Authorization` header.
    #[error("Unauthorized: this server needs an Authorization: Bearer token")]
    Missing,
    /// An `Authorization` header that is not `Bearer <token>`.
    #[error("Unauthorized: the Authorization header must be \"Bearer <token>\"")]
    Malformed,
    /// A token this server does not know.
    #[error("Unauthorized: the bearer token is not valid")]
    InvalidToken,
}

impl AuthError {
    /// The `WWW-Authenticate` challenge for this refusal (RFC 6750).
    pub fn challenge(&self) -> &'static str {
        match self {
            AuthError::Missing => "Bearer realm=\"wharf\"",
            AuthError::Malformed => "Bearer realm=\"wharf\", error=\"invalid_request\"",
            AuthError::InvalidToken => "Bearer realm=\"wharf\", error=\"invalid_token\"",
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

    /// Whether requests need no credentials.
    pub fn is_anonymous(&self) -> bool {
        matches!(self.0, Mode::Anonymous(_))
    }

    /// Resolves the principal of a request from its headers.
    pub async fn authenticate(&self, headers: &HeaderMap) -> Result<Principal, AuthError> {
        match &self.0 {
            Mode::Anonymous(p) => Ok(p.clone()),
            Mode::ApiKeys(keys) => keys.principal_for(bearer_token(headers)?),
        }
    }
}

/// The token of an `Authorization: Bearer` header. The scheme is case-insensitive
/// (RFC 9110); exactly one header is accepted.
pub fn bearer_token(headers: &HeaderMap) -> Result<&str, AuthError> {
    let mut values = headers.get_all(AUTHORIZATION).iter();
    let value = values.next().ok_or(AuthError::Missing)?;
    if values.next().is_some() {
        return Err(AuthError::Malformed);
    }
    let value = value.to_str().map_err(|_| AuthError::Malformed)?;
    let (scheme, token) = value.split_once(' ').ok_or(AuthError::Malformed)?;
    let token = token.trim_start_matches(' ');
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() || token.contains(' ') {
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
        for bad in ["Basic abc", "Bearer", "Bearer ", "Bearer a b", "abc"] {
            assert_eq!(
                bearer_token(&with_auth(bad)),
                Err(AuthError::Malformed),
                "{bad}"
            );
        }
        let mut two = with_auth("Bearer a");
        two.append(AUTHORIZATION, HeaderValue::from_static("Bearer b"));
        assert_eq!(bearer_token(&two), Err(AuthError::Malformed));
    }
}
