//! Everything the authorization server remembers, as typed records in the shared store
//! (`wharf::store::Record`), so any replica continues any flow: one namespace per kind,
//! JSON values, expiry set by the kind. Secrets (codes, refresh tokens, session ids) are
//! never keys themselves: a record is filed under the SHA-256 of the secret, so reading the
//! store does not hand out working credentials.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use wharf::store::{Millis, NewRecord, Store, StoreError, Write, after, now_millis};

/// A kind of record: its namespace and how long it lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Kind {
    pub(crate) namespace: &'static str,
    pub(crate) ttl: Option<Duration>,
}

pub(crate) const SIGNING_KEYS: Kind = Kind {
    namespace: "authz-signing-key",
    ttl: Some(Duration::from_secs(120 * 24 * 3600)),
};
pub(crate) const CLIENTS: Kind = Kind {
    namespace: "authz-client",
    // A registration nobody got a token with is forgotten after this; a token request keeps
    // it for as long as its tokens live, and a month more (see `Shared::keep_client`).
    ttl: Some(Duration::from_secs(30 * 24 * 3600)),
};
pub(crate) const CIMD_CACHE: Kind = Kind {
    namespace: "authz-cimd",
    // Each entry carries its own freshness, at most a day.
    ttl: None,
};
pub(crate) const KEY_SET_CACHE: Kind = Kind {
    namespace: "authz-jwks",
    // Each entry carries its own freshness, at most a day.
    ttl: None,
};
pub(crate) const REQUESTS: Kind = Kind {
    namespace: "authz-request",
    ttl: Some(Duration::from_secs(15 * 60)),
};
pub(crate) const SESSIONS: Kind = Kind {
    namespace: "authz-session",
    ttl: Some(Duration::from_secs(12 * 3600)),
};
pub(crate) const CODES: Kind = Kind {
    namespace: "authz-code",
    // Kept well past the code's own minute so a second use is recognised as reuse.
    ttl: Some(Duration::from_secs(3600)),
};
pub(crate) const REFRESH: Kind = Kind {
    namespace: "authz-refresh",
    ttl: Some(Duration::from_secs(30 * 24 * 3600)),
};
pub(crate) const FAMILIES: Kind = Kind {
    namespace: "authz-family",
    ttl: Some(Duration::from_secs(90 * 24 * 3600)),
};
pub(crate) const CONSENTS: Kind = Kind {
    namespace: "authz-consent",
    ttl: Some(Duration::from_secs(365 * 24 * 3600)),
};
pub(crate) const WITHDRAWN_CONSENTS: Kind = Kind {
    namespace: "authz-withdrawn-consent",
    // Each is written with its own expiry, past the life of any refresh token issued under
    // the consent (see `account::revoke`); this applies only to one written without.
    ttl: Some(Duration::from_secs(400 * 24 * 3600)),
};
pub(crate) const USERS: Kind = Kind {
    namespace: "authz-user",
    ttl: None,
};
pub(crate) const UPSTREAM_PEOPLE: Kind = Kind {
    namespace: "authz-upstream-person",
    // Kept for good, as accounts are: were it to expire, what was signed in before an
    // administrator signed the person out would count again.
    ttl: None,
};
pub(crate) const FAILED_SIGN_INS: Kind = Kind {
    namespace: "authz-failed-sign-in",
    // An hour without a failure forgets the count.
    ttl: Some(Duration::from_secs(3600)),
};
pub(crate) const DEVICES: Kind = Kind {
    namespace: "authz-device",
    // A browser's trust lasts this long after its last sign-in.
    ttl: Some(Duration::from_secs(90 * 24 * 3600)),
};
pub(crate) const UPSTREAM: Kind = Kind {
    namespace: "authz-upstream",
    ttl: Some(Duration::from_secs(10 * 60)),
};
pub(crate) const ASSERTIONS: Kind = Kind {
    namespace: "authz-jti",
    ttl: Some(Duration::from_secs(3600)),
};

/// Why a record operation failed: the store, or a record this version cannot read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A record that does not parse.
    #[error("corrupt {namespace} record: {detail}")]
    Corrupt {
        /// Its namespace.
        namespace: &'static str,
        /// What is wrong.
        detail: String,
    },
}

/// A typed record read back with its version, for a compare-and-swap.
#[derive(Debug, Clone)]
pub(crate) struct Versioned<T> {
    pub(crate) value: T,
    pub(crate) version: u64,
    pub(crate) expires_at: Option<Millis>,
}

/// The store, seen as the authorization server's records.
#[derive(Clone)]
pub(crate) struct Records {
    store: Arc<dyn Store>,
}

impl std::fmt::Debug for Records {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Records")
            .field("backend", &self.store.backend())
            .finish()
    }
}

impl Records {
    pub(crate) fn new(store: Arc<dyn Store>) -> Self {
        Self { store }
    }

    pub(crate) async fn get<T: DeserializeOwned>(
        &self,
        kind: Kind,
        key: &str,
    ) -> Result<Option<Versioned<T>>, RecordError> {
        let Some(record) = self
            .store
            .read_record(kind.namespace, key, now_millis())
            .await?
        else {
            return Ok(None);
        };
        let value = serde_json::from_str(&record.value).map_err(|err| RecordError::Corrupt {
            namespace: kind.namespace,
            detail: err.to_string(),
        })?;
        Ok(Some(Versioned {
            value,
            version: record.version,
            expires_at: record.expires_at,
        }))
    }

    /// Keeps `value` under `key` for `fresh_for`: a fetched document or key set, for as
    /// long as its host said it stays fresh.
    pub(crate) async fn keep_for<T: Serialize>(
        &self,
        kind: Kind,
        key: &str,
        value: &T,
        fresh_for: Duration,
    ) -> Result<(), RecordError> {
        let expires_at = after(now_millis(), fresh_for);
        self.put(kind, key, value, None, Write::Upsert, Some(expires_at))
            .await
            .map(drop)
    }

    /// Writes `value` under `write`'s condition, expiring after the kind's lifetime (or at
    /// `expires_at` when given); the new version, or `None` when the condition failed.
    pub(crate) async fn put<T: Serialize>(
        &self,
        kind: Kind,
        key: &str,
        value: &T,
        owner: Option<&str>,
        write: Write,
        expires_at: Option<Millis>,
    ) -> Result<Option<u64>, RecordError> {
        let now = now_millis();
        let value = serde_json::to_string(value).map_err(|err| RecordError::Corrupt {
            namespace: kind.namespace,
            detail: err.to_string(),
        })?;
        let expires_at = expires_at.or_else(|| kind.ttl.map(|ttl| after(now, ttl)));
        let record = NewRecord {
            namespace: kind.namespace,
            key,
            value: &value,
            owner,
            expires_at,
        };
        Ok(self.store.write_record(&record, write, now).await?)
    }

    pub(crate) async fn delete(&self, kind: Kind, key: &str) -> Result<bool, RecordError> {
        Ok(self.store.delete_record(kind.namespace, key, None).await?)
    }

    /// Deletes the record only if it is still at `version` (as read); whether it went.
    pub(crate) async fn delete_at(
        &self,
        kind: Kind,
        key: &str,
        version: u64,
    ) -> Result<bool, RecordError> {
        Ok(self
            .store
            .delete_record(kind.namespace, key, Some(version))
            .await?)
    }

    pub(crate) async fn of_owner<T: DeserializeOwned>(
        &self,
        kind: Kind,
        owner: &str,
        limit: u32,
    ) -> Result<Vec<(String, T)>, RecordError> {
        let rows = self
            .store
            .records_of(kind.namespace, owner, now_millis(), limit)
            .await?;
        rows.into_iter()
            .map(|(key, record)| {
                let value =
                    serde_json::from_str(&record.value).map_err(|err| RecordError::Corrupt {
                        namespace: kind.namespace,
                        detail: err.to_string(),
                    })?;
                Ok((key, value))
            })
            .collect()
    }
}

impl Records {
    /// Deletes every live record of `kind` that `owner` owns.
    pub(crate) async fn delete_of_owner(&self, kind: Kind, owner: &str) -> Result<(), RecordError> {
        loop {
            let rows = self
                .store
                .records_of(kind.namespace, owner, now_millis(), 500)
                .await?;
            if rows.is_empty() {
                return Ok(());
            }
            for (key, _) in rows {
                self.store.delete_record(kind.namespace, &key, None).await?;
            }
        }
    }
}

/// A new secret: 32 random bytes, base64url.
pub(crate) fn secret() -> String {
    URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>())
}

/// The key a secret's record is filed under.
pub(crate) fn digest(secret: &str) -> String {
    URL_SAFE_NO_PAD.encode(Sha256::digest(secret.as_bytes()))
}
