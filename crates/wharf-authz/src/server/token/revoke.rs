//! Token revocation (RFC 7009): a client that is done with its tokens (a user signed out)
//! says so, and the whole family goes. A refresh token is found by its digest; an access
//! token, once its signature and expiry are checked, names its family in `sid`. Either way
//! the family must be one issued to the client that authenticated, and once revoked its
//! refresh tokens are refused at once and its access tokens within the two seconds the
//! resource server trusts a family it found alive. A token this server does not know (or
//! no longer knows) is answered as revoked: there is nothing left to revoke.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Deserialize;

use super::{Peer, Refresh, TokenForm, admit, authenticate, revoke};
use crate::families::Family;
use crate::records::{FAMILIES, REFRESH, digest};
use crate::server::{OAuthError, Shared};

/// `POST /revoke`.
pub(crate) async fn endpoint(
    State(shared): State<Arc<Shared>>,
    Peer(peer): Peer,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let revoked = match admit(&shared, peer, &headers, &body) {
        Ok(form) => revoke_presented(&shared, &headers, &form).await,
        Err(err) => Err(err),
    };
    match revoked {
        Ok(()) => {
            let mut response = StatusCode::OK.into_response();
            response
                .headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            response
        }
        Err(err) => err.into_response(),
    }
}

async fn revoke_presented(
    shared: &Shared,
    headers: &HeaderMap,
    form: &TokenForm,
) -> Result<(), OAuthError> {
    let client = authenticate(shared, headers, form).await?;
    let token = form
        .token
        .as_deref()
        .ok_or_else(|| OAuthError::invalid_request("token is required"))?;
    // `token_type_hint` only says where to look first; both places are cheap.
    let family = match shared
        .records
        .get::<Refresh>(REFRESH, &digest(token))
        .await
        .map_err(OAuthError::server_error)?
    {
        Some(refresh) => refresh.value.family,
        None => match shared
            .keys
            .verify::<Named>(token, &shared.config.issuer)
            .await
            .map_err(OAuthError::server_error)?
        {
            Some(named) => named.sid,
            // Not a live token of this server's: nothing to revoke.
            None => return Ok(()),
        },
    };
    let Some(found) = shared
        .records
        .get::<Family>(FAMILIES, &family)
        .await
        .map_err(OAuthError::server_error)?
    else {
        return Ok(());
    };
    if found.value.revoked {
        return Ok(());
    }
    if found.value.client_id != client.id {
        return Err(OAuthError::new(
            StatusCode::BAD_REQUEST,
            "unauthorized_client",
            "the token was issued to another client",
        ));
    }
    revoke(shared, &family).await
}

/// What an access token says of its family.
#[derive(Deserialize)]
struct Named {
    sid: String,
}
