//! Dynamic Client Registration (RFC 7591), kept for clients that predate metadata
//! documents: redirect URIs checked against `application_type`, secrets stored as digests,
//! registration off unless open, and rate-limited per address.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use wharf::store::{Write, now_millis};

use super::clients::{Registered, TokenAuth};
use super::token::Peer;
use super::{OAuthError, Shared};
use crate::client_name;
use crate::records::{CLIENTS, digest, secret};
use crate::redirect::{self, ApplicationType};

/// The registration request's fields this server reads; others are ignored (RFC 7591 §2).
#[derive(Debug, Deserialize)]
pub(crate) struct Registration {
    redirect_uris: Option<Vec<String>>,
    application_type: Option<String>,
    client_name: Option<String>,
    token_endpoint_auth_method: Option<String>,
    grant_types: Option<Vec<String>>,
    response_types: Option<Vec<String>>,
    scope: Option<String>,
}

/// A registration's bounds: what a client needs, and no more room than that.
const MAX_REDIRECTS: usize = 10;
const MAX_URI: usize = 2048;
const MAX_SCOPE: usize = 1024;

/// How the id of a registered client begins; [`CLIENT_ID_CHARS`] base64url characters follow.
const CLIENT_ID_PREFIX: &str = "wc_";
/// The random characters of a registered client's id: 132 bits.
const CLIENT_ID_CHARS: usize = 22;

/// Whether `id` has the shape of the ids registration mints. Anything else was never
/// registered here, and is not looked up.
pub(crate) fn is_minted_client_id(id: &str) -> bool {
    id.strip_prefix(CLIENT_ID_PREFIX).is_some_and(|rest| {
        rest.len() == CLIENT_ID_CHARS
            && rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    })
}

fn invalid(code: &'static str, description: impl Into<String>) -> OAuthError {
    OAuthError::new(StatusCode::BAD_REQUEST, code, description)
}

/// The scope a client is registered with: the values it asked for that this server offers,
/// each once, in its order. RFC 7591 §2 lets a server replace metadata it does not support,
/// and the response then says what was registered, so a client never reads back a scope it
/// could not be granted. `None` when nothing asked for is offered: the client then gets the
/// default of every offered scope.
fn registered_scope(requested: Option<&str>, offered: &[String]) -> Option<String> {
    let mut kept: Vec<&str> = Vec::new();
    for value in requested?.split(' ') {
        if offered.iter().any(|o| o == value) && !kept.contains(&value) {
            kept.push(value);
        }
    }
    (!kept.is_empty()).then(|| kept.join(" "))
}

/// `POST /register`.
pub(crate) async fn register(
    State(shared): State<Arc<Shared>>,
    Peer(peer): Peer,
    body: axum::body::Bytes,
) -> Response {
    if !shared.config.open_registration {
        return OAuthError::new(
            StatusCode::FORBIDDEN,
            "access_denied",
            "registration is closed on this server; use a Client ID Metadata Document",
        )
        .into_response();
    }
    if !shared.limits.registrations.allows(peer) {
        return OAuthError::too_many("registrations").into_response();
    }
    match registered(&shared, &body).await {
        Ok(response) => response,
        Err(err) => err.into_response(),
    }
}

async fn registered(shared: &Shared, body: &[u8]) -> Result<Response, OAuthError> {
    let request: Registration = serde_json::from_slice(body).map_err(|err| {
        invalid(
            "invalid_client_metadata",
            format!("the registration is not valid JSON metadata: {err}"),
        )
    })?;
    let redirect_uris = request.redirect_uris.unwrap_or_default();
    let application_type =
        ApplicationType::of_registration(request.application_type.as_deref(), &redirect_uris)
            .map_err(|err| invalid("invalid_client_metadata", err.to_string()))?;
    if redirect_uris.len() > MAX_REDIRECTS || redirect_uris.iter().any(|u| u.len() > MAX_URI) {
        return Err(invalid(
            "invalid_redirect_uri",
            format!("redirect_uris: at most {MAX_REDIRECTS} URIs of at most {MAX_URI} characters"),
        ));
    }
    if request.scope.as_ref().is_some_and(|s| s.len() > MAX_SCOPE) {
        return Err(invalid(
            "invalid_client_metadata",
            format!("scope: at most {MAX_SCOPE} characters"),
        ));
    }
    redirect::check_registration(application_type, &redirect_uris)
        .map_err(|err| invalid("invalid_redirect_uri", err.to_string()))?;
    if let Some(grants) = &request.grant_types {
        if let Some(other) = grants
            .iter()
            .find(|g| !matches!(g.as_str(), "authorization_code" | "refresh_token"))
        {
            return Err(invalid(
                "invalid_client_metadata",
                format!(
                    "grant_types: {other:?} is not supported; use authorization_code and refresh_token"
                ),
            ));
        }
        // A token is only ever first issued for a code here.
        if !grants.iter().any(|g| g == "authorization_code") {
            return Err(invalid(
                "invalid_client_metadata",
                "grant_types must include authorization_code, the only grant that issues a first token here",
            ));
        }
    }
    // Registered as asked, each once; both when it names none.
    let mut grant_types: Vec<String> = Vec::new();
    for grant in request.grant_types.iter().flatten() {
        if !grant_types.contains(grant) {
            grant_types.push(grant.clone());
        }
    }
    if grant_types.is_empty() {
        grant_types = vec!["authorization_code".into(), "refresh_token".into()];
    }
    if let Some(types) = &request.response_types {
        if types.iter().any(|t| t != "code") {
            return Err(invalid(
                "invalid_client_metadata",
                "response_types: only \"code\" is supported",
            ));
        }
    }
    if let Some(name) = &request.client_name {
        if !client_name::is_displayable(name) {
            return Err(invalid(
                "invalid_client_metadata",
                format!("client_name must be {}", client_name::EXPECTED),
            ));
        }
    }
    let method = request
        .token_endpoint_auth_method
        .as_deref()
        .unwrap_or("client_secret_basic");
    let client_secret = secret();
    let auth = match method {
        "none" => TokenAuth::None,
        "client_secret_basic" => TokenAuth::ClientSecretBasic {
            digest: digest(&client_secret),
        },
        "client_secret_post" => TokenAuth::ClientSecretPost {
            digest: digest(&client_secret),
        },
        other => {
            return Err(invalid(
                "invalid_client_metadata",
                format!(
                    "token_endpoint_auth_method {other:?} is not supported at registration: use none, client_secret_basic or client_secret_post (private_key_jwt clients use a Client ID Metadata Document)"
                ),
            ));
        }
    };
    let scope = registered_scope(request.scope.as_deref(), &shared.config.scopes);
    let client_id = format!("{CLIENT_ID_PREFIX}{}", &secret()[..CLIENT_ID_CHARS]);
    let issued_at = now_millis() / 1000;
    let stored = Registered {
        client_name: request.client_name.clone(),
        redirect_uris: redirect_uris.clone(),
        application_type: application_type.as_str().to_owned(),
        auth: auth.clone(),
        scope: scope.clone(),
        issued_at,
        grant_types: Some(grant_types.clone()),
    };
    let created = shared
        .records
        .put(CLIENTS, &client_id, &stored, None, Write::Create, None)
        .await
        .map_err(OAuthError::server_error)?;
    if created.is_none() {
        return Err(OAuthError::server_error("a fresh client id collided"));
    }
    let mut body = json!({
        "client_id": client_id,
        "client_id_issued_at": issued_at,
        "redirect_uris": redirect_uris,
        "application_type": application_type.as_str(),
        "token_endpoint_auth_method": auth.method(),
        "grant_types": grant_types,
        "response_types": ["code"],
    });
    if let Some(name) = request.client_name {
        body["client_name"] = json!(name);
    }
    if let Some(scope) = scope {
        body["scope"] = json!(scope);
    }
    if auth != TokenAuth::None {
        body["client_secret"] = json!(client_secret);
        body["client_secret_expires_at"] = json!(0);
    }
    let mut response = (StatusCode::CREATED, Json(body)).into_response();
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::{CLIENT_ID_CHARS, CLIENT_ID_PREFIX, is_minted_client_id, registered_scope, secret};

    #[test]
    fn minted_client_ids_have_one_shape() {
        let minted = format!("{CLIENT_ID_PREFIX}{}", &secret()[..CLIENT_ID_CHARS]);
        assert!(is_minted_client_id(&minted), "{minted}");
        for other in [
            "",
            "wc_",
            "nobody",
            "wc_AAAAAAAAAAAAAAAAAAAAA",
            "wc_AAAAAAAAAAAAAAAAAAAAAAA",
            "wc_AAAAAAAAAAAAAAAAAAAA+A",
            "xx_AAAAAAAAAAAAAAAAAAAAAA",
        ] {
            assert!(!is_minted_client_id(other), "{other}");
        }
        assert!(!is_minted_client_id(&"x".repeat(3000)));
    }

    #[test]
    fn a_registration_keeps_only_offered_scopes() {
        let offered = ["read".to_owned(), "write".to_owned()];
        let scope = |asked| registered_scope(asked, &offered);
        assert_eq!(
            scope(Some("write unheard:of read write")).as_deref(),
            Some("write read")
        );
        assert_eq!(scope(Some("read  write")).as_deref(), Some("read write"));
        assert_eq!(
            scope(Some("unheard:of")),
            None,
            "nothing offered: nothing registered"
        );
        assert_eq!(scope(Some("")), None);
        assert_eq!(scope(None), None);
    }
}
