//! RFC 8414 authorization server metadata, and the key set tokens are checked against.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use wharf::store::now_millis;

use super::{OAuthError, Shared};

/// The metadata document: what a client needs to find every endpoint and rule.
pub(crate) async fn metadata(State(shared): State<Arc<Shared>>) -> Response {
    let config = &shared.config;
    let mut doc = json!({
        "issuer": config.issuer,
        "authorization_endpoint": shared.endpoint("/authorize"),
        "token_endpoint": shared.endpoint("/token"),
        "jwks_uri": shared.endpoint("/jwks"),
        "response_types_supported": ["code"],
        "response_modes_supported": ["query"],
        "grant_types_supported": ["authorization_code", "refresh_token"],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported":
            ["none", "client_secret_basic", "client_secret_post", "private_key_jwt"],
        "token_endpoint_auth_signing_alg_values_supported": ["ES256", "RS256", "EdDSA"],
        "revocation_endpoint": shared.endpoint("/revoke"),
        "revocation_endpoint_auth_methods_supported":
            ["none", "client_secret_basic", "client_secret_post", "private_key_jwt"],
        "revocation_endpoint_auth_signing_alg_values_supported": ["ES256", "RS256", "EdDSA"],
        "client_id_metadata_document_supported": true,
        "authorization_response_iss_parameter_supported": true,
        "scopes_supported": config.scopes,
    });
    if config.open_registration {
        doc["registration_endpoint"] = Value::String(shared.endpoint("/register"));
    }
    let mut response = Json(doc).into_response();
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=300"),
    );
    response
}

/// The published signing keys.
pub(crate) async fn jwks(State(shared): State<Arc<Shared>>) -> Response {
    match shared.keys.jwks(now_millis()).await {
        Ok(set) => {
            let mut response = Json(set).into_response();
            response.headers_mut().insert(
                header::CACHE_CONTROL,
                HeaderValue::from_static("public, max-age=300"),
            );
            response
        }
        Err(err) => OAuthError::server_error(err).into_response(),
    }
}

/// The published signing keys, read in-process by the resource server beside it.
#[derive(Debug)]
pub(crate) struct PublishedKeys(pub(crate) Arc<Shared>);

impl wharf_auth::PublishedKeys for PublishedKeys {
    fn jwk_set(
        &self,
    ) -> Pin<Box<dyn Future<Output = Result<Value, wharf_auth::AuthError>> + Send + '_>> {
        Box::pin(async move {
            self.0.keys.jwks(now_millis()).await.map_err(|err| {
                tracing::warn!(error = %err, "the signing keys could not be read");
                wharf_auth::AuthError::Unavailable
            })
        })
    }
}
