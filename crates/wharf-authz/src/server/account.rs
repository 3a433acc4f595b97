//! A signed-in user's page: the consents they remembered, each revocable, and sign-out.

use std::sync::Arc;

use axum::extract::{Form, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use serde::{Deserialize, Serialize};
use wharf::store::{Millis, StoreError, Write, after, now_millis};

use super::authorize::signed_in_user;
use super::consent::{Consent, consent_key};
use super::html::{self, escape, hidden};
use super::{Shared, constant_eq, cookies};
use crate::records::{CONSENTS, RecordError, SESSIONS, WITHDRAWN_CONSENTS, digest};

/// `GET /account`: the remembered consents.
pub(crate) async fn account(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let Some((user, csrf)) = who(&shared, &headers).await else {
        return html::error(
            StatusCode::FORBIDDEN,
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
        // What the client may hold, for each resource it was allowed.
        let grants: String = consent
            .grants()
            .map(|(resource, scope)| {
                format!("<br><small>{}: {}</small>", escape(resource), escape(scope))
            })
            .collect();
        rows.push_str(&format!(
            "<tr><td><strong><bdi>{}</bdi></strong><br><small>{}</small>{grants}</td><td>\
             <form method=\"post\" action=\"/account/consents/revoke\">{}<button type=\"submit\">Revoke</button></form></td></tr>",
            escape(&consent.client_name),
            escape(client_id),
            hidden(&[("client_id", client_id), ("csrf", &csrf)]),
        ));
    }
    if rows.is_empty() {
        rows.push_str("<tr><td>No application is remembered.</td></tr>");
    }
    let body = format!(
        "<h1>Applications you allowed</h1><p>Signed in as {}</p><table id=\"consents\">{rows}</table>\
         <form method=\"post\" action=\"/account/signout\">{}<button type=\"submit\" id=\"sign-out\">Sign out</button></form>",
        escape(&user),
        hidden(&[("csrf", &csrf)]),
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
        return html::error(StatusCode::FORBIDDEN, "Not signed in", "Sign in first.");
    };
    if !constant_eq(&form.csrf, &csrf) {
        return html::error(
            StatusCode::FORBIDDEN,
            "This form is stale",
            "Reload the page and try again.",
        );
    }
    // Forgetting the consent is not enough: what the client already holds stops working too.
    // Its id is marked withdrawn first, so that a code or grant made under it is refused
    // from then on, and one made before the mark is found by the revocation after it.
    let key = consent_key(&user, &form.client_id);
    let withdrawn = withdraw(&shared, &user, &key).await;
    let forgotten = forget(&shared, &key).await;
    let revoked = super::token::revoke_client(&shared, &user, &form.client_id).await;
    if withdrawn.is_err() || forgotten.is_err() || revoked.is_err() {
        return html::error(
            StatusCode::SERVICE_UNAVAILABLE,
            "Unavailable",
            "Try again in a moment.",
        );
    }
    Redirect::to("/account").into_response()
}

/// The sign-out form's field.
#[derive(Debug, Deserialize)]
pub(crate) struct SignOutForm {
    csrf: String,
}

/// `POST /account/signout`: ends this browser's session. Until then, whoever uses the
/// browser next is signed in, and an application the user allowed gets its code without
/// anyone being asked. What the applications already hold stays theirs until revoked on the account page.
pub(crate) async fn sign_out(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Form(form): Form<SignOutForm>,
) -> Response {
    // The form's token is the session cookie's, checked before the store is asked: a sign-out
    // goes through while the store cannot say who is signed in.
    let Some(session) = cookies::get(&headers, shared.cookie(cookies::SESSION)) else {
        return html::error(
            StatusCode::FORBIDDEN,
            "Not signed in",
            "Nothing to sign out of.",
        );
    };
    if !constant_eq(&form.csrf, &csrf_of(session)) {
        return html::error(
            StatusCode::FORBIDDEN,
            "This form is stale",
            "Reload the page and try again.",
        );
    }
    // The record goes, not just the cookie, so a copy of the cookie signs nobody in either.
    // Should the store fail, this browser's cookie goes all the same: whoever uses it next
    // is not signed in.
    let mut response = match shared.records.delete(SESSIONS, &digest(session)).await {
        Ok(_) => html::page(
            StatusCode::OK,
            "Signed out",
            "<h1>Signed out</h1><p>This browser is signed out: the next sign-in here asks who \
             you are. The applications you allowed keep what they hold until you revoke it on \
             your account page.</p>",
        ),
        Err(err) => {
            tracing::warn!(error = %err, "a sign-out could not delete its session");
            html::error(
                StatusCode::SERVICE_UNAVAILABLE,
                "Signed out of this browser only",
                "This browser no longer signs you in, but the server could not record the \
                 sign-out: a copy of this browser's cookie would still sign you in until it \
                 expires.",
            )
        }
    };
    cookies::set(
        response.headers_mut(),
        shared.cookie(cookies::SESSION),
        "",
        0,
        shared.secure_cookies,
    );
    response
}

/// A consent withdrawn: its id, kept while grants made under it could still be refreshed.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Withdrawn {
    pub(crate) client_id: String,
    pub(crate) at: Millis,
}

/// Marks the id of `user`'s consent under `key` withdrawn (one from before consents had
/// ids has none to mark: the revocation of its families is all there is).
async fn withdraw(shared: &Shared, user: &str, key: &str) -> Result<(), RecordError> {
    let Some(consent) = shared.records.get::<Consent>(CONSENTS, key).await? else {
        return Ok(());
    };
    if consent.value.id.is_empty() {
        return Ok(());
    }
    let now = now_millis();
    let day = std::time::Duration::from_secs(24 * 3600);
    let until = after(now, shared.config.refresh_token_ttl.saturating_add(day));
    let withdrawn = Withdrawn {
        client_id: consent.value.client_id,
        at: now,
    };
    shared
        .records
        .put(
            WITHDRAWN_CONSENTS,
            &consent.value.id,
            &withdrawn,
            Some(user),
            Write::Upsert,
            Some(until),
        )
        .await?;
    Ok(())
}

/// Deletes the consent under `key` once its id is marked withdrawn, leaving one that an
/// approval made anew after the mark (a new id, see `authorize::remember`): that is a
/// consent of its own, which the page lists and can withdraw. Deleted only at the version
/// read, so such an approval landing between the read and the delete is not deleted with
/// the old one.
async fn forget(shared: &Shared, key: &str) -> Result<(), RecordError> {
    // Each lost race is an approval that landed meanwhile: a few are all a person makes.
    for _ in 0..8 {
        let Some(consent) = shared.records.get::<Consent>(CONSENTS, key).await? else {
            return Ok(());
        };
        let id = &consent.value.id;
        if !id.is_empty() && !is_withdrawn(shared, id).await? {
            return Ok(());
        }
        if shared
            .records
            .delete_at(CONSENTS, key, consent.version)
            .await?
        {
            return Ok(());
        }
    }
    Err(RecordError::Store(StoreError::Busy(
        "a consent changed under every attempt to delete it".into(),
    )))
}

/// Whether consent `id` was withdrawn (an empty id, from before consents had ids, never
/// was).
pub(crate) async fn is_withdrawn(shared: &Shared, id: &str) -> Result<bool, RecordError> {
    if id.is_empty() {
        return Ok(false);
    }
    let found = shared
        .records
        .get::<Withdrawn>(WITHDRAWN_CONSENTS, id)
        .await?;
    Ok(found.is_some())
}

/// The signed-in user and the CSRF token of their session (derived from the session
/// cookie, which a cross-site page cannot read).
async fn who(shared: &Shared, headers: &HeaderMap) -> Option<(String, String)> {
    let session = cookies::get(headers, shared.cookie(cookies::SESSION))?;
    let user = signed_in_user(shared, session).await?;
    Some((user, csrf_of(session)))
}

/// The CSRF token of the account page's forms: derived from the session cookie, which a
/// cross-site page cannot read.
fn csrf_of(session: &str) -> String {
    digest(&format!("csrf\n{session}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cimd::Fetcher;
    use crate::server::{AuthorizationServer, AuthzConfig};

    const USER: &str = "idp:alice";
    const CLIENT: &str = "https://app.example/client.json";

    async fn server() -> AuthorizationServer {
        let store = wharf_store::open("memory://", &wharf_store::StoreOptions::default())
            .await
            .unwrap();
        let config = AuthzConfig::new("http://127.0.0.1:9", "http://127.0.0.1:9/mcp");
        AuthorizationServer::new(config, store, Fetcher::builder().build().unwrap())
    }

    fn consent(id: &str, scope: &str) -> Consent {
        Consent {
            client_id: CLIENT.into(),
            client_name: "App".into(),
            scope: scope.into(),
            resource: "http://127.0.0.1:9/mcp".into(),
            others: Default::default(),
            granted_at: now_millis(),
            id: id.into(),
        }
    }

    /// Writes `consent` over what `shared` holds for the user and client, as an approval
    /// does (over the version it read).
    async fn approve(shared: &Shared, consent: &Consent) {
        let key = consent_key(USER, CLIENT);
        let read = shared.records.get::<Consent>(CONSENTS, &key).await.unwrap();
        let write = read.map_or(Write::Create, |c| Write::Replace(c.version));
        let written = shared
            .records
            .put(CONSENTS, &key, consent, Some(USER), write, None)
            .await
            .unwrap();
        assert!(written.is_some());
    }

    async fn standing(shared: &Shared) -> Option<String> {
        let key = consent_key(USER, CLIENT);
        let read = shared.records.get::<Consent>(CONSENTS, &key).await.unwrap();
        read.map(|c| c.value.id)
    }

    /// An approval that lands while a withdrawal is under way, after the old consent's id
    /// was marked withdrawn, is a consent of its own (a new id): the withdrawal leaves it,
    /// so the account page lists it and can withdraw it in turn.
    #[tokio::test]
    async fn a_withdrawal_leaves_a_consent_approved_anew_meanwhile() {
        let server = server().await;
        let shared = &server.shared;
        let key = consent_key(USER, CLIENT);
        approve(shared, &consent("old", "read")).await;
        withdraw(shared, USER, &key).await.unwrap();
        approve(shared, &consent("new", "read")).await;
        forget(shared, &key).await.unwrap();
        assert_eq!(standing(shared).await.as_deref(), Some("new"));
        assert!(is_withdrawn(shared, "old").await.unwrap());
        assert!(!is_withdrawn(shared, "new").await.unwrap());
    }

    /// The withdrawn consent goes even when an approval that read it before the mark
    /// rewrote it meanwhile (same id, a newer version); so does one from before consents
    /// had ids, which has no id to mark.
    #[tokio::test]
    async fn a_withdrawal_deletes_its_consent_even_rewritten_meanwhile() {
        let server = server().await;
        let shared = &server.shared;
        let key = consent_key(USER, CLIENT);
        approve(shared, &consent("old", "read")).await;
        withdraw(shared, USER, &key).await.unwrap();
        approve(shared, &consent("old", "read write")).await;
        forget(shared, &key).await.unwrap();
        assert_eq!(standing(shared).await, None);

        approve(shared, &consent("", "read")).await;
        withdraw(shared, USER, &key).await.unwrap();
        forget(shared, &key).await.unwrap();
        assert_eq!(standing(shared).await, None);
    }
}
