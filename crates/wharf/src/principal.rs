//! Who a request acts for.

use std::fmt;
use std::sync::Arc;

/// The authenticated party a request acts for. Handles and idempotency records belong to a
/// principal; a transport resolves one for every request before anything else runs.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Principal {
    id: Arc<str>,
    anonymous: bool,
}

impl Principal {
    /// A principal identified by `id` (an API key's owner, an OAuth issuer and subject, …).
    pub fn new(id: impl Into<Arc<str>>) -> Self {
        Principal {
            id: id.into(),
            anonymous: false,
        }
    }

    /// The one principal of a server that runs without authentication: every request acts
    /// for it, so a handle is a bearer capability.
    pub fn anonymous() -> Self {
        Principal {
            id: Arc::from("anonymous"),
            anonymous: true,
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
