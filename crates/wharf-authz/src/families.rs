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
/// redemption racing this one cannot bring it to life afterwards. A tombstone has no owner:
/// what is listed as a user's families is what is still to revoke (see [`revoke_all`]).
pub(crate) async fn revoke(records: &Records, family: &str) -> Result<(), RecordError> {
    let current = records.get::<Family>(FAMILIES, family).await?;
    let was_live = current.as_ref().is_some_and(|f| !f.value.revoked);
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
    records
        .put(FAMILIES, family, &revoked, None, Write::Upsert, None)
        .await?;
    if was_live {
        tracing::warn!(family = %&family[..8.min(family.len())], "token family revoked");
    }
    Ok(())
}

/// Families listed at a time by [`revoke_all`].
const PAGE: u32 = 500;

/// Revokes every live family of `user`, or only those of `client_id` when given; how many
/// it revoked.
pub(crate) async fn revoke_all(
    records: &Records,
    user: &str,
    client_id: Option<&str>,
) -> Result<u64, RecordError> {
    revoke_all_by(records, user, client_id, PAGE).await
}

/// [`revoke_all`], listing `page` families more at a time. The store lists an owner's
/// records from the first key on, with no cursor; a revoked family leaves its owner's list
/// (tombstones have no owner, and one written owned before that is disowned when met), so
/// each listing reaches past what is left: the other clients' live families.
async fn revoke_all_by(
    records: &Records,
    user: &str,
    client_id: Option<&str>,
    page: u32,
) -> Result<u64, RecordError> {
    let page = page.max(1);
    let mut limit = page;
    let mut revoked = 0;
    // What this call revoked: met again, the store did not take its owner off, and listing
    // again would never get past it.
    let mut done = std::collections::HashSet::new();
    loop {
        let listed = records.of_owner::<Family>(FAMILIES, user, limit).await?;
        let more = u32::try_from(listed.len()).map_or(true, |n| n >= limit);
        let mut kept: u32 = 0;
        for (family, found) in listed {
            if found.revoked || client_id.is_none_or(|c| c == found.client_id) {
                if !done.insert(family.clone()) {
                    return Err(RecordError::Corrupt {
                        namespace: FAMILIES.namespace,
                        detail: "a revoked family is still listed under its owner: the store \
                                 kept the owner of a record written without one"
                            .into(),
                    });
                }
                revoke(records, &family).await?;
                revoked += u64::from(!found.revoked);
            } else {
                kept = kept.saturating_add(1);
            }
        }
        if !more {
            return Ok(revoked);
        }
        limit = kept.saturating_add(page);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` families of `user` for `client_id`, live unless `revoked` (then owned, as
    /// tombstones were written before they lost their owner); their ids.
    async fn families(
        records: &Records,
        user: &str,
        client_id: &str,
        n: usize,
        revoked: bool,
    ) -> Vec<String> {
        let mut ids = Vec::new();
        for _ in 0..n {
            let id = crate::records::secret();
            let family = Family {
                client_id: client_id.to_owned(),
                user: user.to_owned(),
                revoked,
                epoch: String::new(),
                consent: None,
            };
            records
                .put(FAMILIES, &id, &family, Some(user), Write::Create, None)
                .await
                .unwrap();
            ids.push(id);
        }
        ids
    }

    async fn revoked(records: &Records, ids: &[String]) -> Vec<bool> {
        let mut all = Vec::new();
        for id in ids {
            let found = records.get::<Family>(FAMILIES, id).await.unwrap().unwrap();
            all.push(found.value.revoked);
        }
        all
    }

    /// More families than one listing holds, tombstones and other clients' among them
    /// (the keys are random, so they come in any order): every one asked for is revoked.
    #[tokio::test]
    async fn every_family_is_revoked_past_a_page_of_tombstones_and_other_clients() {
        let options = wharf_store::StoreOptions::default();
        let store = wharf_store::open("memory://", &options).await.unwrap();
        let records = Records::new(store);
        let tombstones = families(&records, "alice", "a", 7, true).await;
        let a = families(&records, "alice", "a", 9, false).await;
        let b = families(&records, "alice", "b", 8, false).await;
        let bobs = families(&records, "bob", "b", 3, false).await;

        let count = revoke_all_by(&records, "alice", Some("b"), 2)
            .await
            .unwrap();
        assert_eq!(count, 8);
        assert!(revoked(&records, &b).await.iter().all(|r| *r));
        assert!(revoked(&records, &a).await.iter().all(|r| !*r));
        assert!(revoked(&records, &tombstones).await.iter().all(|r| *r));

        let count = revoke_all_by(&records, "alice", None, 2).await.unwrap();
        assert_eq!(count, 9);
        assert!(revoked(&records, &a).await.iter().all(|r| *r));
        assert!(revoked(&records, &bobs).await.iter().all(|r| !*r));
        // Nothing of hers is listed any more: the next revocation reads one empty page.
        let left = records.of_owner::<Family>(FAMILIES, "alice", 100).await;
        assert!(left.unwrap().is_empty());
    }
}
