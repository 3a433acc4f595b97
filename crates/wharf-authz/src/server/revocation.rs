//! The resource server's view of revoked token families: an access token carries its family
//! as `sid`; once the family is revoked (a code or refresh token used twice), its access
//! tokens stop working on the next request, though they have not expired. Families are read
//! from the store and remembered for two seconds, so a busy client costs one read per two
//! seconds, and a revocation reaches every replica within that.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use wharf_auth::{AuthError, Revocations};

use crate::families::Family;
use crate::records::{FAMILIES, Records};

/// How long a family found alive is taken as alive.
const FRESH: Duration = Duration::from_secs(2);
/// Families remembered at most; beyond, the stale ones are forgotten.
const MAX_REMEMBERED: usize = 100_000;

/// Answers [`Revocations`] for the tokens this authorization server issued.
#[derive(Debug)]
pub(crate) struct FamilyRevocations {
    pub(crate) records: Records,
    pub(crate) issuer: String,
    seen: Mutex<HashMap<String, (bool, Instant)>>,
}

impl FamilyRevocations {
    pub(crate) fn new(records: Records, issuer: String) -> Self {
        Self {
            records,
            issuer,
            seen: Mutex::new(HashMap::new()),
        }
    }

    fn remembered(&self, family: &str) -> Option<bool> {
        let seen = self.seen.lock().ok()?;
        match seen.get(family) {
            Some((true, _)) => Some(true),
            Some((false, at)) if at.elapsed() < FRESH => Some(false),
            _ => None,
        }
    }

    fn remember(&self, family: &str, revoked: bool) {
        if let Ok(mut seen) = self.seen.lock() {
            if seen.len() >= MAX_REMEMBERED {
                seen.retain(|_, (revoked, at)| {
                    *revoked && at.elapsed() < Duration::from_secs(3600)
                });
            }
            seen.insert(family.to_owned(), (revoked, Instant::now()));
        }
    }
}

impl Revocations for FamilyRevocations {
    fn revoked<'a>(
        &'a self,
        issuer: &'a str,
        session: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<bool, AuthError>> + Send + 'a>> {
        Box::pin(async move {
            if issuer != self.issuer {
                return Ok(false);
            }
            if let Some(revoked) = self.remembered(session) {
                return Ok(revoked);
            }
            let family = self
                .records
                .get::<Family>(FAMILIES, session)
                .await
                .map_err(|_| AuthError::Unavailable)?;
            // A family the store does not have (it expired, or was lost) vouches for nothing.
            let revoked = family.is_none_or(|f| f.value.revoked);
            self.remember(session, revoked);
            Ok(revoked)
        })
    }
}
