//! A signed-in user's page: the consents they remembered, each revocable.

use std::sync::Arc;

use axum::extract::{Form, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::authorize::{Consent, consent_key, signed_in_user};
use super::html::{self, escape, hidden};
use super::{Shared, constant_eq, cookies};
use crate::records::{CONSENTS, digest};

/// `GET /account`: the remembered consents.
pub(crate) async fn account(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let Some((user, csrf)) = who(&shared, &headers).await else {
        return html::error(
            StatusCode::UNAUTHORIZED,
            "Not signed in",
            "Sign in through an application first; this page lists what you allowed.",
        );
    };
    let consents = match shared
        .records
        .of_owner::<Consent>(CONSENTS, &user, 500)
        .await
    {
        Ok(list) => list,
        Err(_) => {
            return html::error(
                StatusCode::SERVICE_UNAVAILABLE,
                "Unavailable",
                "Try again in a moment.",
            );
        }
    };
    let mut rows = String::new();
    for (_, consent) in &consents {
        let client_id = consent.client_id.as_str();
        rows.push_str(&format!(
            "<tr><td><strong>{}</strong><br><small>{}</small><br><small>{}</small></td><td>\
             <form method=\"post\" action=\"/account/consents/revoke\">{}<button type=\"submit\">Revoke</button></form></td></tr>",
            escape(&consent.client_name),
            escape(client_id),
            escape(&consent.scope),
            hidden(&[("client_id", client_id), ("csrf", &csrf)]),
        ));
    }
    if rows.is_empty() {
        rows.push_str("<tr><td>No application is remembered.</td></tr>");
    }
    let body = format!(
        "<h1>Applications you allowed</h1><p>Signed in as {}</p><table id=\"consents\">{rows}</table>",
        escape(&user)
    );
    html::page(StatusCode::OK, "Applications you allowed", &body)
}

/// The revoke form's fields.
#[derive(Debug, Deserialize)]
pub(crate) struct RevokeForm {
    client_id: String,
    csrf: String,
}

/// `POST /account/consents/revoke`: forgets a consent; the application asks again next time.
pub(crate) async fn revoke(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Form(form): Form<RevokeForm>,
) -> Response {
    let Some((user, csrf)) = who(&shared, &headers).await else {
        return html::error(StatusCode::UNAUTHORIZED, "Not signed in", "Sign in first.");
    };
    if !constant_eq(&form.csrf, &csrf) {
        return html::error(
            StatusCode::FORBIDDEN,
            "This form is stale",
            "Reload the page and try again.",
        );
    }
    // Forgetting the consent is not enough: what the client already holds stops working too.
    let forgotten = shared
        .records
        .delete(CONSENTS, &consent_key(&user, &form.client_id))
        .await;
    let revoked = super::token::revoke_client(&shared, &user, &form.client_id).await;
    if forgotten.is_err() || revoked.is_err() {
        return html::error(
            StatusCode::SERVICE_UNAVAILABLE,
            "Unavailable",
            "Try again in a moment.",
        );
    }
    Redirect::to("/account").into_response()
}

/// The signed-in user and the CSRF token of their session (derived from the session
/// cookie, which a cross-site page cannot read).
async fn who(shared: &Shared, headers: &HeaderMap) -> Option<(String, String)> {
    let session = cookies::get(headers, shared.cookie(cookies::SESSION))?;
    let user = signed_in_user(shared, session).await?;
    Some((user, digest(&format!("csrf\n{session}"))))
}
