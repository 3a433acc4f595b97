//! Who a request acts for.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

/// The id of [`Principal::anonymous`].
const ANONYMOUS: &str = "anonymous";

/// The authenticated party a request acts for. Handles and idempotency records belong to a
/// principal; a transport resolves one for every request before anything else runs.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Principal {
    id: Arc<str>,
    anonymous: bool,
    grant: Option<Arc<Grant>>,
    /// The scopes it is limited to, for a principal with no grant ([`Principal::with_scopes`]).
    scopes: Option<Arc<BTreeSet<String>>>,
    /// When the credentials behind it stop being valid (an access token's `exp`).
    valid_until: Option<SystemTime>,
}

/// What an OAuth access token granted: who (issuer and subject), through which client, and
/// the scopes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Grant {
    /// The authorization server that issued the token (`iss`).
    pub issuer: String,
    /// Whom the token was issued for (`sub`).
    pub subject: String,
    /// The OAuth client the token was issued to, when the token says.
    pub client_id: Option<String>,
    /// The scopes the token grants.
    pub scopes: BTreeSet<String>,
}

/// Why an id cannot name a principal ([`Principal::new`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PrincipalError {
    /// An empty id, or one with control characters (ids go into logs and store keys).
    #[error("a principal's id must be printable characters, at least one")]
    Unprintable,
    /// An id other ways of signing in give their principals: `anonymous` (every request of
    /// a server without authentication, and over stdio) or one with `#` (an OAuth issuer
    /// and subject, [`Principal::oauth`]). Handles and idempotency records belong to an
    /// id, so on a shared store such a principal would act for those users.
    #[error(
        "the principal id {0:?} is reserved: \"anonymous\" and ids with '#' name the principals of servers without authentication and of OAuth tokens"
    )]
    Reserved(String),
}

impl Principal {
    /// A principal identified by `id` (an API key's owner, an app's own user id, …).
    ///
    /// ```
    /// use wharf::{Principal, PrincipalError};
    ///
    /// assert_eq!(Principal::new("alice")?.id(), "alice");
    /// assert!(matches!(Principal::new("anonymous"), Err(PrincipalError::Reserved(_))));
    /// assert_eq!(Principal::new("").unwrap_err(), PrincipalError::Unprintable);
    /// # Ok::<(), PrincipalError>(())
    /// ```
    pub fn new(id: impl Into<Arc<str>>) -> Result<Self, PrincipalError> {
        let id: Arc<str> = id.into();
        if id.is_empty() || id.chars().any(char::is_control) {
            return Err(PrincipalError::Unprintable);
        }
        if &*id == ANONYMOUS || id.contains('#') {
            return Err(PrincipalError::Reserved(id.to_string()));
        }
        Ok(Principal {
            id,
            anonymous: false,
            grant: None,
            scopes: None,
            valid_until: None,
        })
    }

    /// The principal of an OAuth access token: identified by its issuer and subject (so
    /// handles and idempotency records belong to the user, whichever client they use), and
    /// limited to the token's scopes.
    pub fn oauth(grant: Grant) -> Self {
        Principal {
            id: format!("{}#{}", grant.issuer, grant.subject).into(),
            anonymous: false,
            grant: Some(Arc::new(grant)),
            scopes: None,
            valid_until: None,
        }
    }

    /// This principal, whose credentials stop being valid at `at` (an access token's
    /// `exp`): what outlives one request (a listen stream) ends then, and the client comes
    /// back with fresh credentials.
    #[must_use]
    pub fn valid_until(mut self, at: SystemTime) -> Self {
        self.valid_until = Some(at);
        self
    }

    /// When this principal's credentials stop being valid, if they do.
    pub fn expires(&self) -> Option<SystemTime> {
        self.valid_until
    }

    /// The OAuth grant behind this principal, if it came from a token.
    pub fn grant(&self) -> Option<&Grant> {
        self.grant.as_deref()
    }

    /// This principal, limited to `scopes` as an OAuth token's principal is to the token's:
    /// a tool, prompt, resource or template that needs another is refused (-31003, HTTP
    /// 403), and `tools/list` may leave it out
    /// ([`ServerConfig::list_permitted_tools_only`](crate::ServerConfig::list_permitted_tools_only)).
    /// For an app that authenticates on its own (a session cookie, mTLS) and knows what each
    /// user may do. An OAuth principal's scopes become these.
    ///
    /// ```
    /// use wharf::Principal;
    ///
    /// let needed = ["orders:read".to_owned(), "orders:write".to_owned()];
    /// let alice = Principal::new("alice")?.with_scopes(["orders:read"]);
    /// assert_eq!(alice.missing_scopes(&needed), ["orders:write"]);
    /// // Without scopes of its own, an app's principal is limited by none.
    /// assert!(Principal::new("bob")?.missing_scopes(&needed).is_empty());
    /// # Ok::<(), wharf::PrincipalError>(())
    /// ```
    #[must_use]
    pub fn with_scopes<S: Into<String>>(mut self, scopes: impl IntoIterator<Item = S>) -> Self {
        let scopes: BTreeSet<String> = scopes.into_iter().map(Into::into).collect();
        match &mut self.grant {
            Some(grant) => Arc::make_mut(grant).scopes = scopes,
            None => self.scopes = Some(Arc::new(scopes)),
        }
        self
    }

    /// The scopes this principal is limited to: its token's, or those given with
    /// [`Principal::with_scopes`]; `None` for one no scope limits (an API key's or an app's
    /// principal without scopes, anonymous).
    pub fn scopes(&self) -> Option<&BTreeSet<String>> {
        match &self.grant {
            Some(grant) => Some(&grant.scopes),
            None => self.scopes.as_deref(),
        }
    }

    /// The scopes among `required` this principal lacks. Principals not limited by scopes
    /// (see [`Principal::scopes`]) lack none.
    pub fn missing_scopes<'a>(&self, required: &'a [String]) -> Vec<&'a str> {
        match self.scopes() {
            Some(granted) => required
                .iter()
                .filter(|s| !granted.contains(s.as_str()))
                .map(String::as_str)
                .collect(),
            None => Vec::new(),
        }
    }

    /// The one principal of a server that runs without authentication: every request acts
    /// for it, so a handle is a bearer capability.
    pub fn anonymous() -> Self {
        Principal {
            id: Arc::from(ANONYMOUS),
            anonymous: true,
            grant: None,
            scopes: None,
            valid_until: None,
        }
    }

    /// The stable identifier stores key records by.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether this is the unauthenticated principal.
    pub fn is_anonymous(&self) -> bool {
        self.anonymous
    }
}

impl fmt::Debug for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Principal({})", self.id)
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id)
    }
}
