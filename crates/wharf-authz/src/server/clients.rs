//! Who a `client_id` is: a Client ID Metadata Document fetched (or reused within its
//! freshness), or a client registered here. Both resolve to one [`Client`].
//!
//! Anyone may register, so registrations must not pile up forever: one that never gets a
//! token is forgotten after a month (the kind's lifetime), and one in use is kept for as
//! long as the tokens it was given can live, and a month more.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use wharf::store::{Write, after, now_millis};

use super::Shared;
use crate::cimd::{ClientAuth, ClientIdError, ClientIdUrl, ClientMetadata, FetchError, KeySource};
use crate::records::{CIMD_CACHE, CLIENTS, RecordError, Versioned};

/// How much longer than the refresh tokens it was last given a registered client is kept
/// at least, and how much further a token request then pushes its expiry: one write per
/// client a month, not one per token.
const MARGIN: Duration = Duration::from_secs(30 * 24 * 3600);

/// How a client authenticates at the token endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "method")]
pub(crate) enum TokenAuth {
    /// A public client: PKCE alone.
    None,
    /// A registered secret (stored as its digest), sent in the Basic header.
    ClientSecretBasic { digest: String },
    /// A registered secret (stored as its digest), sent in the form.
    ClientSecretPost { digest: String },
    /// `private_key_jwt` with inline keys.
    PrivateKeyJwt { jwks: serde_json::Value },
    /// `private_key_jwt` with keys at an https URL.
    PrivateKeyJwtUri { jwks_uri: String },
}

impl TokenAuth {
    pub(crate) fn method(&self) -> &'static str {
        match self {
            Self::None => "none",
            Self::ClientSecretBasic { .. } => "client_secret_basic",
            Self::ClientSecretPost { .. } => "client_secret_post",
            Self::PrivateKeyJwt { .. } | Self::PrivateKeyJwtUri { .. } => "private_key_jwt",
        }
    }
}

/// A client registered through DCR, as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Registered {
    pub(crate) client_name: Option<String>,
    pub(crate) redirect_uris: Vec<String>,
    pub(crate) application_type: String,
    pub(crate) auth: TokenAuth,
    pub(crate) scope: Option<String>,
    pub(crate) issued_at: i64,
    /// The `grant_types` it registered; `None` (as for registrations from before they were
    /// kept) means both this server supports.
    #[serde(default)]
    pub(crate) grant_types: Option<Vec<String>>,
}

/// A client, however it is known.
#[derive(Debug, Clone)]
pub(crate) struct Client {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) redirect_uris: Vec<String>,
    pub(crate) auth: TokenAuth,
    /// For a metadata-document client, the host of its `client_id`: what the consent page
    /// shows as who is asking.
    pub(crate) document_host: Option<String>,
    /// The scope values it registered or declared, space-separated, if it did: what it is
    /// given when it asks for no particular scope.
    pub(crate) scope: Option<String>,
    /// Its registration as read, for a registered client: what keeping it rewrites.
    pub(crate) registration: Option<Versioned<Registered>>,
    /// Whether it may use the `refresh_token` grant, and is given refresh tokens.
    pub(crate) refresh: bool,
}

/// A cached document: its body, re-checked when read.
#[derive(Serialize, Deserialize)]
struct CachedDocument {
    body: String,
}

/// Why a `client_id` names no usable client.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientError {
    #[error("the request has no client_id")]
    Missing,
    #[error(
        "client_id {0:?} is not registered here; if it was, the registration went unused and was forgotten: register again"
    )]
    Unknown(String),
    #[error(transparent)]
    Url(#[from] ClientIdError),
    #[error(transparent)]
    Fetch(#[from] FetchError),
    #[error("the authorization server could not read its records: {0}")]
    Record(#[from] RecordError),
}

/// Seconds a client is asked to wait after a metadata document host failed for now.
pub(crate) const RETRY_AFTER_SECS: &str = "5";

impl ClientError {
    /// Whether the client's metadata document could not be fetched for now (a timeout, no
    /// connection, a resolver that failed for now, a 5xx, 429 or 408 from its host):
    /// nothing says the client is unknown or its document wrong, and failures are not
    /// cached, so the same request may succeed on retry.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            Self::Fetch(FetchError::Timeout { .. } | FetchError::Connect { .. }) => true,
            Self::Fetch(FetchError::Resolve { temporary, .. }) => *temporary,
            Self::Fetch(FetchError::Status { status, .. }) => {
                *status >= 500 || matches!(*status, 408 | 429)
            }
            _ => false,
        }
    }

    /// What an unauthenticated visitor may be told: never where a name resolves or which
    /// names exist inside the network (those details go to the log).
    pub(crate) fn public_message(&self) -> String {
        match self {
            // Said as a failure for now (the answer asks for a retry), never naming the host.
            Self::Fetch(
                err @ FetchError::Resolve {
                    temporary: true, ..
                },
            ) => {
                tracing::info!(%err, "a client metadata document was not fetched");
                "the client's host name could not be resolved for now".to_owned()
            }
            Self::Fetch(
                err @ (FetchError::SpecialUseAddress { .. } | FetchError::Resolve { .. }),
            ) => {
                tracing::info!(%err, "a client metadata document was not fetched");
                "the client_id's host is not one this server fetches documents from: it does not resolve, or it is a private or other special-use address".to_owned()
            }
            Self::Record(err) => {
                tracing::warn!(%err, "the authorization server could not read a client");
                "the authorization server could not read its records".to_owned()
            }
            other => other.to_string(),
        }
    }
}

impl Shared {
    /// Resolves `client_id`: metadata documents are fetched unless a fresh copy is cached
    /// (failures are never cached), registered clients read from the store.
    pub(crate) async fn client(&self, client_id: Option<&str>) -> Result<Client, ClientError> {
        let client_id = client_id
            .filter(|id| !id.is_empty())
            .ok_or(ClientError::Missing)?;
        if ClientIdUrl::is_url_shaped(client_id) {
            let url = ClientIdUrl::parse(client_id)?;
            return self.document_client(&url).await;
        }
        // Only ids of the minted shape can be registered: anything else (one longer than the
        // store takes as a key, say) is unknown without asking the store.
        if !super::register::is_minted_client_id(client_id) {
            return Err(ClientError::Unknown(client_id.to_owned()));
        }
        let registration = self
            .records
            .get::<Registered>(CLIENTS, client_id)
            .await?
            .ok_or_else(|| ClientError::Unknown(client_id.to_owned()))?;
        let registered = registration.value.clone();
        Ok(Client {
            id: client_id.to_owned(),
            name: registered
                .client_name
                .unwrap_or_else(|| client_id.to_owned()),
            redirect_uris: registered.redirect_uris,
            auth: registered.auth,
            document_host: None,
            scope: registered.scope,
            refresh: registered
                .grant_types
                .is_none_or(|g| g.iter().any(|g| g == "refresh_token")),
            registration: Some(registration),
        })
    }

    /// Keeps a registered client that was just given tokens for as long as those can
    /// live: its expiry, once less than a refresh token's lifetime and a [`MARGIN`] away,
    /// is pushed out to a lifetime and two margins. The tokens are out already, so a store
    /// that fails here is logged, not answered; a concurrent request that kept the client
    /// first has done the work.
    pub(crate) async fn keep_client(&self, client: &Client) {
        let Some(registration) = &client.registration else {
            return;
        };
        // Registrations from before expiry existed have none, and keep that promise.
        let Some(expires_at) = registration.expires_at else {
            return;
        };
        let now = now_millis();
        let lifetime = self.config.refresh_token_ttl;
        if expires_at >= after(now, lifetime.saturating_add(MARGIN)) {
            return;
        }
        let kept_until = after(now, lifetime.saturating_add(MARGIN).saturating_add(MARGIN));
        let written = self
            .records
            .put(
                CLIENTS,
                &client.id,
                &registration.value,
                None,
                Write::Replace(registration.version),
                Some(kept_until),
            )
            .await;
        if let Err(err) = written {
            tracing::warn!(%err, client = %client.id, "a registered client's expiry was not extended");
        }
    }

    async fn document_client(&self, url: &ClientIdUrl) -> Result<Client, ClientError> {
        let cached = self
            .records
            .get::<CachedDocument>(CIMD_CACHE, url.as_str())
            .await?;
        let metadata = match cached
            .and_then(|c| ClientMetadata::from_document(url, c.value.body.as_bytes()).ok())
        {
            Some(metadata) => metadata,
            None => {
                let fetched = self.fetcher.fetch(url).await?;
                if let Some(fresh_for) = fetched.fresh_for {
                    let body = String::from_utf8_lossy(&fetched.body).into_owned();
                    let cached = self
                        .records
                        .keep_for(
                            CIMD_CACHE,
                            url.as_str(),
                            &CachedDocument { body },
                            fresh_for,
                        )
                        .await;
                    // The document is in hand: a cache the store did not take only means
                    // it is fetched again next time.
                    if let Err(err) = cached {
                        tracing::warn!(%err, client = %url.as_str(), "a client metadata document was not cached");
                    }
                }
                fetched.metadata
            }
        };
        let auth = match metadata.auth {
            ClientAuth::None => TokenAuth::None,
            ClientAuth::PrivateKeyJwt(KeySource::Jwks(jwks)) => TokenAuth::PrivateKeyJwt { jwks },
            ClientAuth::PrivateKeyJwt(KeySource::JwksUri(jwks_uri)) => {
                TokenAuth::PrivateKeyJwtUri { jwks_uri }
            }
        };
        Ok(Client {
            id: url.as_str().to_owned(),
            name: metadata.client_name,
            redirect_uris: metadata.redirect_uris,
            auth,
            document_host: Some(url.host().to_owned()),
            scope: metadata.scope,
            refresh: metadata.refresh,
            registration: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host that is down, slow or busy says nothing of the client: "try again", never
    /// `invalid_client`, which clients take as fatal.
    #[test]
    fn a_busy_or_failing_document_host_is_a_failure_for_now() {
        let status = |status| {
            ClientError::Fetch(FetchError::Status {
                url: "https://client.example/doc".into(),
                status,
            })
        };
        for transient in [408, 429, 500, 503] {
            assert!(status(transient).is_transient(), "{transient}");
        }
        for lasting in [301, 401, 403, 404, 410] {
            assert!(!status(lasting).is_transient(), "{lasting}");
        }
        let unresolved = |temporary| {
            ClientError::Fetch(FetchError::Resolve {
                host: "client.example".into(),
                reason: "the resolver's words".into(),
                temporary,
            })
        };
        assert!(unresolved(true).is_transient());
        assert!(!unresolved(false).is_transient());
        // Neither names the host to an unauthenticated visitor; only one says "for now".
        let (now, never) = (
            unresolved(true).public_message(),
            unresolved(false).public_message(),
        );
        assert!(
            now.contains("for now") && !now.contains("client.example"),
            "{now}"
        );
        assert!(
            !never.contains("for now") && !never.contains("client.example"),
            "{never}"
        );
    }
}
