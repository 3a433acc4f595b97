//! Who a request acts for.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

/// The authenticated party a request acts for. Handles and idempotency records belong to a
/// principal; a transport resolves one for every request before anything else runs.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Principal {
    id: Arc<str>,
    anonymous: bool,
    grant: Option<Arc<Grant>>,
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

impl Principal {
    /// A principal identified by `id` (an API key's owner, an OAuth issuer and subject, …).
    pub fn new(id: impl Into<Arc<str>>) -> Self {
        Principal {
            id: id.into(),
            anonymous: false,
            grant: None,
            valid_until: None,
        }
    }

    /// The principal of an OAuth access token: identified by its issuer and subject (so
    /// handles and idempotency records belong to the user, whichever client they use), and
    /// limited to the token's scopes.
    pub fn oauth(grant: Grant) -> Self {
        Principal {
            id: format!("{}#{}", grant.issuer, grant.subject).into(),
            anonymous: false,
            grant: Some(Arc::new(grant)),
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

    /// The scopes among `required` this principal lacks. Principals not limited by scopes
    /// (API keys, anonymous) lack none.
    pub fn missing_scopes<'a>(&self, required: &'a [String]) -> Vec<&'a str> {
        match &self.grant {
            Some(g) => required
                .iter()
                .filter(|s| !g.scopes.contains(s.as_str()))
                .map(String::as_str)
                .collect(),
            None => Vec::new(),
        }
    }

    /// The one principal of a server that runs without authentication: every request acts
    /// for it, so a handle is a bearer capability.
    pub fn anonymous() -> Self {
        Principal {
            id: Arc::from("anonymous"),
            anonymous: true,
            grant: None,
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
