//! Static API keys: `PRINCIPAL=TOKEN` pairs from the command line, a file or the
//! environment.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use wharf::{Principal, PrincipalError};

use crate::AuthError;

/// Fewest characters a token may have: shorter ones are guessable.
pub(crate) const MIN_TOKEN_LEN: usize = 16;

/// A set of keys. Only SHA-256 digests of the tokens are kept, and lookups go by digest, so
/// neither memory dumps nor comparison timing give a token away.
#[derive(Clone, Default)]
pub struct ApiKeys {
    by_digest: Arc<HashMap<[u8; 32], Principal>>,
}

impl fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ApiKeys({} keys)", self.by_digest.len())
    }
}

/// Why a key specification was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ApiKeyError {
    /// Not `PRINCIPAL=TOKEN`.
    #[error("an API key must be written PRINCIPAL=TOKEN (one was given without '=')")]
    Shape,
    /// A principal name that is empty, too long or not printable. Named by its place in
    /// the list, not by what was written: a key pasted without its principal would
    /// otherwise be echoed to the log.
    #[error(
        "API key {position} (counting from 1: among the keys given, or the line of the keys file): the principal must be 1 to 200 printable characters"
    )]
    Principal {
        /// Where it is in the list, from 1.
        position: usize,
    },
    /// A token too short or with spaces; named by its place, as above (a key written
    /// without its principal splits at a base64 `=`, and what comes before is the key).
    #[error(
        "API key {position} (counting from 1: among the keys given, or the line of the keys file): the token must be at least {MIN_TOKEN_LEN} characters without spaces; write each key PRINCIPAL=TOKEN"
    )]
    Token {
        /// Where it is in the list, from 1.
        position: usize,
    },
    /// One token given to two principals.
    #[error("API key for {0:?}: the same token is given twice")]
    Duplicate(String),
    /// A principal name another way of signing in gives its principals: `anonymous` (every
    /// request of a server without authentication, and over stdio) or a name with `#` (an
    /// OAuth issuer and subject). Handles and idempotency records belong to a principal's
    /// name, so on a store shared with such a server the key would act for its users.
    #[error(
        "API key for {0:?}: the principal may not be \"anonymous\" or contain '#', which name the principals of servers without authentication and of OAuth tokens"
    )]
    Reserved(String),
}

impl ApiKeys {
    /// Builds the set from `PRINCIPAL=TOKEN` specifications. An error names the
    /// specification by its place, counting from 1.
    pub fn parse<'a>(specs: impl IntoIterator<Item = &'a str>) -> Result<Self, ApiKeyError> {
        Self::parse_numbered(specs.into_iter().enumerate().map(|(i, spec)| (i + 1, spec)))
    }

    /// [`parse`](Self::parse) of specifications each with the place an error names.
    fn parse_numbered<'a>(
        specs: impl Iterator<Item = (usize, &'a str)>,
    ) -> Result<Self, ApiKeyError> {
        let mut by_digest = HashMap::new();
        for (position, spec) in specs {
            let (principal, token) = spec.split_once('=').ok_or(ApiKeyError::Shape)?;
            let principal = principal.trim();
            let token = token.trim();
            if principal.len() > 200 {
                return Err(ApiKeyError::Principal { position });
            }
            let principal = match Principal::new(principal) {
                Ok(principal) => principal,
                Err(PrincipalError::Reserved(name)) => return Err(ApiKeyError::Reserved(name)),
                Err(_) => return Err(ApiKeyError::Principal { position }),
            };
            if token.len() < MIN_TOKEN_LEN
                || token.chars().any(|c| c.is_whitespace() || c.is_control())
            {
                return Err(ApiKeyError::Token { position });
            }
            if by_digest.insert(digest(token), principal.clone()).is_some() {
                return Err(ApiKeyError::Duplicate(principal.id().to_owned()));
            }
        }
        Ok(ApiKeys {
            by_digest: Arc::new(by_digest),
        })
    }

    /// Reads `PRINCIPAL=TOKEN` lines; blank lines and lines starting with `#` are skipped.
    /// An error names the line, counting from 1.
    pub fn parse_file(text: &str) -> Result<Self, ApiKeyError> {
        Self::parse_numbered(
            text.lines()
                .map(str::trim)
                .enumerate()
                .map(|(index, line)| (index + 1, line))
                .filter(|(_, l)| !l.is_empty() && !l.starts_with('#')),
        )
    }

    /// Merges two sets.
    pub fn merge(self, other: ApiKeys) -> Result<Self, ApiKeyError> {
        let mut map = (*self.by_digest).clone();
        for (d, p) in other.by_digest.iter() {
            if map.insert(*d, p.clone()).is_some() {
                return Err(ApiKeyError::Duplicate(p.id().to_owned()));
            }
        }
        Ok(ApiKeys {
            by_digest: Arc::new(map),
        })
    }

    /// How many keys there are.
    pub fn len(&self) -> usize {
        self.by_digest.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }

    pub(crate) fn principal_for(&self, token: &str) -> Result<Principal, AuthError> {
        self.by_digest
            .get(&digest(token))
            .cloned()
            .ok_or(AuthError::InvalidToken)
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_their_principal() {
        let keys = ApiKeys::parse([
            "user-42=tok-aaaaaaaaaaaaaaaa",
            "user-7=tok-bbbbbbbbbbbbbbbb",
        ])
        .unwrap();
        assert_eq!(
            keys.principal_for("tok-aaaaaaaaaaaaaaaa").unwrap().id(),
            "user-42"
        );
        assert_eq!(
            keys.principal_for("tok-bbbbbbbbbbbbbbbb").unwrap().id(),
            "user-7"
        );
        assert_eq!(
            keys.principal_for("tok-cccccccccccccccc"),
            Err(AuthError::InvalidToken)
        );
    }

    #[test]
    fn bad_specifications_are_refused_without_echoing_tokens() {
        let err = ApiKeys::parse(["nodelimiter-secret"]).unwrap_err();
        assert_eq!(err, ApiKeyError::Shape);
        assert!(!err.to_string().contains("nodelimiter"));
        assert!(matches!(
            ApiKeys::parse(["=tok-aaaaaaaaaaaaaaaa"]),
            Err(ApiKeyError::Principal { position: 1 })
        ));
        assert!(matches!(
            ApiKeys::parse(["u=short"]),
            Err(ApiKeyError::Token { position: 1 })
        ));
        // A key written without its principal splits at its base64 padding: nothing of it
        // is echoed.
        let key = "q3ZxV1b2N3d4e5f6g7h8i9j0k1l2m3n4o5p6q7r8Yk8=";
        let err = ApiKeys::parse(["alice=tok-aaaaaaaaaaaaaaaa", key]).unwrap_err();
        assert_eq!(err, ApiKeyError::Token { position: 2 });
        assert!(!err.to_string().contains("q3Zx"), "{err}");
        assert!(matches!(
            ApiKeys::parse(["a=tok-aaaaaaaaaaaaaaaa", "b=tok-aaaaaaaaaaaaaaaa"]),
            Err(ApiKeyError::Duplicate(_))
        ));
        // The names of other ways in: the key would own their principals' handles.
        for name in ["anonymous", "https://issuer.example#alice", "a#b"] {
            assert_eq!(
                ApiKeys::parse([format!("{name}=tok-aaaaaaaaaaaaaaaa").as_str()]).unwrap_err(),
                ApiKeyError::Reserved(name.to_owned())
            );
        }
        assert_eq!(
            ApiKeys::parse(["anonymous-bot=tok-aaaaaaaaaaaaaaaa"])
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn files_skip_comments_and_blank_lines() {
        let keys = ApiKeys::parse_file("# team keys\n\nuser-42 = tok-aaaaaaaaaaaaaaaa\n").unwrap();
        assert_eq!(keys.len(), 1);
        let err = ApiKeys::parse_file("# team keys\n\nuser-42 = short\n").unwrap_err();
        assert_eq!(
            err,
            ApiKeyError::Token { position: 3 },
            "the line, not the key's rank"
        );
    }
}
