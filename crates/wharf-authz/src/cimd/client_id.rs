//! The `client_id` of a Client ID Metadata Document client: an `https` URL with a path, no
//! dot segments, no fragment, no user information (draft-ietf-oauth-client-id-metadata-
//! document §3). It is compared byte for byte with the document's own `client_id`, so it is
//! taken only in the normal form a URL parser gives it: a spelling that parses to something
//! else (an upper-case host, a default port, an encoded dot) would name one client two ways.

use std::fmt;

use url::Url;

/// The longest `client_id` URL taken.
const MAX_LEN: usize = 2048;

/// A `client_id` that names a metadata document under every rule of the draft.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ClientIdUrl(Url);

/// Why a `client_id` is not a metadata document URL. Each message names the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClientIdError {
    /// Longer than 2048 bytes.
    #[error("client_id is longer than {MAX_LEN} characters")]
    TooLong,
    /// Not a URL at all.
    #[error("client_id {0:?} is not a URL")]
    NotUrl(String),
    /// A scheme other than `https`.
    #[error("client_id {0:?} must use the https scheme")]
    NotHttps(String),
    /// No path, or only `/`.
    #[error(
        "client_id {0:?} must have a path naming the metadata document, as in https://example.com/client.json"
    )]
    NoPath(String),
    /// A `.` or `..` path segment.
    #[error("client_id {0:?} must not contain \".\" or \"..\" path segments")]
    DotSegment(String),
    /// A fragment.
    #[error("client_id {0:?} must not contain a fragment")]
    Fragment(String),
    /// A user name or password.
    #[error("client_id {0:?} must not contain a user name or password")]
    UserInfo(String),
    /// A spelling the URL parser changes.
    #[error(
        "client_id {given:?} is not in normal form: it would be fetched as {normal:?}; use that exact string"
    )]
    NotNormal {
        /// As sent.
        given: String,
        /// As a URL parser writes it.
        normal: String,
    },
}

impl ClientIdUrl {
    /// Whether a `client_id` is meant as a metadata document URL rather than an id this
    /// server issued: it starts with `https://` or `http://`. Such an id is then held to
    /// every rule by [`ClientIdUrl::parse`] (so `http` is refused by name) instead of being
    /// looked up among registered clients.
    pub fn is_url_shaped(client_id: &str) -> bool {
        let starts = |prefix: &str| {
            client_id
                .get(..prefix.len())
                .is_some_and(|start| start.eq_ignore_ascii_case(prefix))
        };
        starts("https://") || starts("http://")
    }

    /// Checks a `client_id` against the draft's rules.
    pub fn parse(client_id: &str) -> Result<Self, ClientIdError> {
        let given = || client_id.to_owned();
        if client_id.len() > MAX_LEN {
            return Err(ClientIdError::TooLong);
        }
        let url = Url::parse(client_id).map_err(|_| ClientIdError::NotUrl(given()))?;
        if url.scheme() != "https" {
            return Err(ClientIdError::NotHttps(given()));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(ClientIdError::UserInfo(given()));
        }
        if url.fragment().is_some() || client_id.contains('#') {
            return Err(ClientIdError::Fragment(given()));
        }
        // The parser removes dot segments, so they are looked for in what was sent, encoded
        // dots included.
        if raw_path(client_id).split('/').any(is_dot_segment) {
            return Err(ClientIdError::DotSegment(given()));
        }
        if url.path() == "/" || url.path().is_empty() {
            return Err(ClientIdError::NoPath(given()));
        }
        if url.as_str() != client_id {
            return Err(ClientIdError::NotNormal {
                given: given(),
                normal: url.as_str().to_owned(),
            });
        }
        Ok(Self(url))
    }

    /// The URL, exactly as the client sent it.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    /// The host, to show on the consent page.
    pub fn host(&self) -> &str {
        self.0.host_str().unwrap_or_default()
    }

    pub(crate) fn url(&self) -> &Url {
        &self.0
    }
}

impl fmt::Debug for ClientIdUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ClientIdUrl").field(&self.as_str()).finish()
    }
}

impl fmt::Display for ClientIdUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The path of a URL string as sent: after the authority, before any query or fragment.
fn raw_path(s: &str) -> &str {
    let after_scheme = s.split_once("://").map_or(s, |(_, rest)| rest);
    let path = after_scheme.find('/').map_or("", |at| &after_scheme[at..]);
    path.split(['?', '#']).next().unwrap_or_default()
}

fn is_dot_segment(segment: &str) -> bool {
    let lower = segment.to_ascii_lowercase();
    matches!(
        lower.as_str(),
        "." | ".." | "%2e" | "%2e%2e" | ".%2e" | "%2e."
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_url_is_taken_as_sent() {
        for ok in [
            "https://app.example.com/oauth/client-metadata.json",
            "https://example.com/client",
            "https://example.com:8443/c.json",
            "https://example.com/c.json?v=2",
        ] {
            assert_eq!(ClientIdUrl::parse(ok).unwrap().as_str(), ok);
        }
    }

    /// A `client_id` and the refusal it must get.
    type Case = (&'static str, fn(&ClientIdError) -> bool);

    #[test]
    fn each_rule_of_the_draft_refuses_its_case() {
        let cases: &[Case] = &[
            ("http://example.com/c.json", |e| {
                matches!(e, ClientIdError::NotHttps(_))
            }),
            ("example.com/c.json", |e| {
                matches!(e, ClientIdError::NotUrl(_))
            }),
            ("https://example.com", |e| {
                matches!(e, ClientIdError::NoPath(_))
            }),
            ("https://example.com/", |e| {
                matches!(e, ClientIdError::NoPath(_))
            }),
            ("https://example.com/a/../c.json", |e| {
                matches!(e, ClientIdError::DotSegment(_))
            }),
            ("https://example.com/./c.json", |e| {
                matches!(e, ClientIdError::DotSegment(_))
            }),
            ("https://example.com/a/%2E%2E/c.json", |e| {
                matches!(e, ClientIdError::DotSegment(_))
            }),
            ("https://example.com/c.json#frag", |e| {
                matches!(e, ClientIdError::Fragment(_))
            }),
            ("https://example.com/c.json#", |e| {
                matches!(e, ClientIdError::Fragment(_))
            }),
            ("https://user:pw@example.com/c.json", |e| {
                matches!(e, ClientIdError::UserInfo(_))
            }),
            ("https://user@example.com/c.json", |e| {
                matches!(e, ClientIdError::UserInfo(_))
            }),
            ("https://EXAMPLE.com/c.json", |e| {
                matches!(e, ClientIdError::NotNormal { .. })
            }),
            ("https://example.com:443/c.json", |e| {
                matches!(e, ClientIdError::NotNormal { .. })
            }),
        ];
        for (client_id, expected) in cases {
            let err = ClientIdUrl::parse(client_id).unwrap_err();
            assert!(expected(&err), "{client_id}: {err:?}");
            assert!(err.to_string().contains("client_id"), "{err}");
        }
        let long = format!("https://example.com/{}", "a".repeat(MAX_LEN));
        assert_eq!(ClientIdUrl::parse(&long), Err(ClientIdError::TooLong));
    }

    #[test]
    fn url_shaped_ids_are_told_apart_from_issued_ones() {
        assert!(ClientIdUrl::is_url_shaped("https://app.example.com/c.json"));
        assert!(ClientIdUrl::is_url_shaped("HTTPS://app.example.com/c.json"));
        assert!(!ClientIdUrl::is_url_shaped("wharf_3f9a0c"));
        assert!(ClientIdUrl::is_url_shaped("http://app.example.com/c.json"));
        assert!(!ClientIdUrl::is_url_shaped("urn:example:client"));
    }
}
