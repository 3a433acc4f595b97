//! Token families: every token issued from one authorization code belongs to one, owned by
//! the user who signed in. A family is revoked as a whole: when a code or refresh token is
//! used twice, when its client revokes a token, when the user withdraws a consent, and when
//! the account's password changes or the account goes. Its refresh tokens are refused at
//! once, its access tokens by the resource server within the two seconds it trusts a
//! family it found alive.

use serde::{Deserialize, Serialize};
use wharf::store::Write;

use crate::records::{FAMILIES, RecordError, Records};

/// A token family, as stored under its id (a random secret the tokens carry as `sid`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Family {
    pub(crate) client_id: String,
    pub(crate) user: String,
    pub(crate) revoked: bool,
    /// The account epoch its user signed in under (see `Users::still_signed_in`).
    #[serde(default)]
    pub(crate) epoch: String,
    /// The id of the consent its code was issued under; `None` for families made before
    /// consents had ids.
    #[serde(default)]
    pub(crate) consent: Option<String>,
}

/// Revokes `family`. One not (or no longer) in the store gets a revoked tombstone, so a
/// redemption racing this one cannot bring it to life afterwards.
pub(crate) async fn revoke(records: &Records, family: &str) -> Result<(), RecordError> {
    let current = records.get::<Family>(FAMILIES, family).await?;
    let revoked = match current {
        Some(found) => Family {
            revoked: true,
            ..found.value
        },
        None => Family {
            client_id: String::new(),
            user: String::new(),
            revoked: true,
            epoch: String::new(),
            consent: None,
        },
    };
    let owner = Some(revoked.user.as_str()).filter(|u| !u.is_empty());
    records
        .put(FAMILIES, family, &revoked, owner, Write::Upsert, None)
        .await?;
    tracing::warn!(family = %&family[..8.min(family.len())], "token family revoked");
    Ok(())
}

/// Revokes every live family of `user`, or only those of `client_id` when given.
pub(crate) async fn revoke_all(
    records: &Records,
    user: &str,
    client_id: Option<&str>,
) -> Result<(), RecordError> {
    let families = records.of_owner::<Family>(FAMILIES, user, 10_000).await?;
    for (family, found) in families {
        if !found.revoked && client_id.is_none_or(|c| c == found.client_id) {
            revoke(records, &family).await?;
        }
    }
    Ok(())
}
