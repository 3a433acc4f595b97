//! The authorization endpoint and the pages behind it: the request is checked, kept in the
//! store under a random id bound to the browser, then the user signs in, consents, and the
//! client's redirect URI receives a single-use code with `state` and `iss` (RFC 9207).
//!
//! Until the client and its redirect URI are known good, errors are shown on a page, never
//! redirected (RFC 6749 §4.1.2.1): a redirect to an unchecked URI would make this server an
//! open redirector.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Form, Query, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::{Deserialize, Serialize};
use url::Url;
use wharf::store::{Millis, Write, now_millis};

use super::consent::{Approval, Consent, consent_key};
use super::html::{self, escape, hidden};
use super::token::Peer;
use super::{Shared, constant_eq, cookies, params};
use crate::pkce::CodeChallenge;
use crate::records::{CODES, CONSENTS, REQUESTS, SESSIONS, digest, secret};
use crate::redirect;
use crate::users::{SignIn, UserError};

/// An authorization request waiting for the user, as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Pending {
    client_id: String,
    /// What the pages show of the client, as it was when the request came: later steps do
    /// not fetch its document again.
    client_name: String,
    document_host: Option<String>,
    redirect_uri: String,
    scope: String,
    state: Option<String>,
    challenge: String,
    resource: String,
    /// Digest of the browser cookie the request was made with.
    browser: String,
    /// What the pages' forms must send back.
    csrf: String,
}

/// A signed-in browser, as stored under the digest of its session cookie.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Session {
    user: String,
    /// The account epoch the user signed in under: a session from before the account was
    /// signed out everywhere no longer counts.
    #[serde(default)]
    epoch: String,
}

/// Who a browser's session signed in, and under which account epoch.
pub(crate) struct SignedIn {
    pub(crate) user: String,
    pub(crate) epoch: String,
}

/// An issued authorization code, as stored under its digest.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct CodeGrant {
    pub(crate) client_id: String,
    pub(crate) redirect_uri: String,
    pub(crate) challenge: String,
    pub(crate) user: String,
    pub(crate) scope: String,
    pub(crate) resource: String,
    pub(crate) issued_at: Millis,
    /// The account epoch the session that approved it was signed in under.
    #[serde(default)]
    pub(crate) epoch: String,
    /// The id of the consent it was issued under (see [`Consent::id`]); `None` for codes
    /// issued before consents had ids.
    #[serde(default)]
    pub(crate) consent: Option<String>,
    /// The token family it was redeemed into; a second redemption revokes it.
    pub(crate) redeemed_into: Option<String>,
}

/// The `GET /authorize` request.
pub(crate) async fn authorize(
    State(shared): State<Arc<Shared>>,
    Peer(peer): Peer,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    if !shared.limits.authorizations.allows(peer) {
        return too_many();
    }
    let params: HashMap<String, String> = match params::parse(query.as_deref().unwrap_or_default())
    {
        Ok(params) => params,
        Err(err) => {
            return html::error(
                StatusCode::BAD_REQUEST,
                "Invalid authorization request",
                &err.to_string(),
            );
        }
    };
    let param = |name: &str| params.get(name).map(String::as_str);
    let client = match shared.client(param("client_id")).await {
        Ok(client) => client,
        // The document's host or this server's own store failing for now: nothing says the
        // client cannot sign in here.
        Err(err) if err.is_transient() || matches!(err, super::clients::ClientError::Record(_)) => {
            let mut page = html::error(
                StatusCode::SERVICE_UNAVAILABLE,
                "This application cannot sign in right now",
                &format!("{}. Try again in a moment.", err.public_message()),
            );
            page.headers_mut().insert(
                header::RETRY_AFTER,
                axum::http::HeaderValue::from_static(super::clients::RETRY_AFTER_SECS),
            );
            return page;
        }
        Err(err) => {
            return html::error(
                StatusCode::BAD_REQUEST,
                "This application cannot sign in here",
                &err.public_message(),
            );
        }
    };
    let redirect_uri = match param("redirect_uri") {
        Some(uri) if redirect::is_registered(&client.redirect_uris, uri) => uri.to_owned(),
        Some(uri) => {
            return html::error(
                StatusCode::BAD_REQUEST,
                "This application cannot sign in here",
                &format!(
                    "redirect_uri {uri:?} is not one of the client's registered redirect URIs; they must match exactly"
                ),
            );
        }
        None if client.redirect_uris.len() == 1 => client.redirect_uris[0].clone(),
        None => {
            return html::error(
                StatusCode::BAD_REQUEST,
                "This application cannot sign in here",
                "redirect_uri is required: the client registered more than one",
            );
        }
    };
    let state = param("state").map(str::to_owned);
    let back = Back {
        redirect_uri: &redirect_uri,
        state: state.as_deref(),
        issuer: &shared.config.issuer,
    };
    if param("response_type") != Some("code") {
        return back.refuse(
            "unsupported_response_type",
            "response_type must be \"code\"",
        );
    }
    let challenge =
        match CodeChallenge::parse(param("code_challenge"), param("code_challenge_method")) {
            Ok(challenge) => challenge,
            Err(err) => return back.refuse("invalid_request", &err.to_string()),
        };
    let config = &shared.config;
    let resource = match param("resource") {
        None => match config.resources.first() {
            Some(default) => default.clone(),
            None => return back.refuse("invalid_target", "this server has no resource configured"),
        },
        // The configured spelling goes into the token's audience.
        Some(r) => match config
            .resources
            .iter()
            .find(|known| super::same_resource(known, r))
        {
            Some(known) => known.clone(),
            None => {
                return back.refuse(
                    "invalid_target",
                    &format!("resource {r:?} is not one this server issues tokens for"),
                );
            }
        },
    };
    let scope = match request_scope(param("scope"), &config.scopes, client.scope.as_deref()) {
        Ok(scope) => scope,
        Err(problem) => return back.refuse("invalid_scope", &problem),
    };

    let mut response_headers = HeaderMap::new();
    let browser =
        cookies::get(&headers, shared.cookie(cookies::BROWSER)).map_or_else(secret, str::to_owned);
    // Set again on every request, the known value too: a cookie that expired between this
    // page and its form's answer would refuse the sign-in as coming from another browser.
    cookies::set(
        &mut response_headers,
        shared.cookie(cookies::BROWSER),
        &browser,
        24 * 3600,
        shared.secure_cookies,
    );
    let pending = Pending {
        client_id: client.id.clone(),
        client_name: client.name.clone(),
        document_host: client.document_host.clone(),
        redirect_uri,
        scope,
        state,
        challenge: challenge.as_str().to_owned(),
        resource,
        browser: digest(&browser),
        csrf: secret(),
    };
    let request_id = secret();
    match shared
        .records
        .put(REQUESTS, &request_id, &pending, None, Write::Create, None)
        .await
    {
        Ok(Some(_)) => {}
        Ok(None) | Err(_) => return unavailable(),
    }
    let user = match signed_in(&shared, &headers).await {
        Ok(user) => user,
        Err(response) => return response,
    };
    let page = match user {
        None => login_page(&shared, &request_id, &pending, None),
        Some(signed) => {
            let user = &signed.user;
            // A remembered consent that covers the request skips the page, except for a
            // redirect to this machine (loopback or a private-use scheme): any local program
            // can claim a client's id and such a redirect, so the user confirms each time.
            let remembered = shared
                .records
                .get::<Consent>(CONSENTS, &consent_key(user, &client.id))
                .await
                .ok()
                .flatten()
                .filter(|c| c.value.covers(&pending.resource, &pending.scope));
            // One withdrawn meanwhile (written back by an approval racing the withdrawal)
            // is not remembered: the page asks again, and the approval gives a new id.
            let withdrawn = match &remembered {
                Some(c) => super::account::is_withdrawn(&shared, &c.value.id)
                    .await
                    .unwrap_or(true),
                None => true,
            };
            if let (Some(consent), false) = (remembered, withdrawn) {
                if !may_be_claimed_locally(&pending.redirect_uri) {
                    let consent = consent.value.id;
                    return finish(&shared, &request_id, pending, &signed, consent).await;
                }
            }
            consent_html(&request_id, &pending, user)
        }
    };
    let mut response = page;
    response.headers_mut().extend(response_headers);
    response
}

/// The sign-in form's fields (no `Debug`: it holds the password).
#[derive(Deserialize)]
pub(crate) struct LoginForm {
    request: String,
    csrf: String,
    username: String,
    password: String,
}

/// `POST /authorize/login`: checks the password, starts a session, goes on to consent.
pub(crate) async fn login(
    State(shared): State<Arc<Shared>>,
    Peer(peer): Peer,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    // The sign-in's own browser and form first: a page elsewhere that posts here cannot
    // spend this address's budget and lock its people out.
    let pending = match load(&shared, &headers, &form.request, Some(&form.csrf)).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    if !shared.limits.sign_ins.allows(peer) {
        return too_many();
    }
    let device = cookies::get(&headers, shared.cookie(cookies::DEVICE));
    let signed_in = shared
        .users
        .sign_in(&form.username, &form.password, device)
        .await;
    let (problem, wait) = match signed_in {
        Ok(SignIn::Accepted { device, epoch }) => {
            let mut response = start_session(&shared, &form.username, &form.request, epoch).await;
            if let Some(device) = device {
                let ttl = crate::records::DEVICES.ttl.map_or(0, |t| t.as_secs());
                cookies::set(
                    response.headers_mut(),
                    shared.cookie(cookies::DEVICE),
                    &device,
                    ttl,
                    shared.secure_cookies,
                );
            }
            return response;
        }
        Ok(SignIn::Refused) => ("The user name or password is wrong.".to_owned(), None),
        Ok(SignIn::Throttled { retry_after }) => {
            // Whole seconds, rounded up: a client that waits as long as it is told succeeds.
            let seconds =
                (retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0)).max(1);
            let unit = if seconds == 1 { "second" } else { "seconds" };
            let problem = format!(
                "Too many failed sign-ins for this account. Try again in {seconds} {unit}."
            );
            (problem, Some(seconds))
        }
        Err(_) => return unavailable(),
    };
    let mut page = login_page(&shared, &form.request, &pending, Some(&problem));
    match wait {
        None => *page.status_mut() = StatusCode::FORBIDDEN,
        Some(seconds) => {
            *page.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            page.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(seconds));
        }
    }
    page
}

/// Signs `user` in on this browser under account epoch `epoch` (the account's when their
/// credentials were checked, or an upstream provider's person's when the provider vouched), and goes on to the
/// consent page of request `request`.
pub(crate) async fn start_session(
    shared: &Shared,
    user: &str,
    request: &str,
    epoch: String,
) -> Response {
    let session = secret();
    let stored = Session {
        user: user.to_owned(),
        epoch,
    };
    match shared
        .records
        .put(
            SESSIONS,
            &digest(&session),
            &stored,
            Some(user),
            Write::Create,
            None,
        )
        .await
    {
        Ok(Some(_)) => {}
        _ => return unavailable(),
    }
    let ttl = crate::records::SESSIONS.ttl.map_or(0, |t| t.as_secs());
    let mut response =
        Redirect::to(&format!("/authorize/consent?request={}", request)).into_response();
    cookies::set(
        response.headers_mut(),
        shared.cookie(cookies::SESSION),
        &session,
        ttl,
        shared.secure_cookies,
    );
    response
}

/// `GET /authorize/consent?request=…`: the consent page for a signed-in user.
#[derive(Debug, Deserialize)]
pub(crate) struct ConsentQuery {
    pub(crate) request: String,
}

pub(crate) async fn consent_page(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(query): Query<ConsentQuery>,
) -> Response {
    let pending = match load(&shared, &headers, &query.request, None).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    match signed_in(&shared, &headers).await {
        Ok(Some(signed)) => consent_html(&query.request, &pending, &signed.user),
        Ok(None) => login_page(&shared, &query.request, &pending, None),
        Err(response) => response,
    }
}

/// The consent form's fields.
#[derive(Debug, Deserialize)]
pub(crate) struct ConsentForm {
    request: String,
    csrf: String,
    decision: String,
}

/// `POST /authorize/consent`: approve (a code goes to the client) or deny.
pub(crate) async fn consent(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Form(form): Form<ConsentForm>,
) -> Response {
    let pending = match load(&shared, &headers, &form.request, Some(&form.csrf)).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    let signed = match signed_in(&shared, &headers).await {
        Ok(Some(signed)) => signed,
        Ok(None) => return login_page(&shared, &form.request, &pending, None),
        Err(response) => return response,
    };
    let user = &signed.user;
    let back = Back {
        redirect_uri: &pending.redirect_uri,
        state: pending.state.as_deref(),
        issuer: &shared.config.issuer,
    };
    match form.decision.as_str() {
        "approve" => match remember(&shared, user, &pending).await {
            Some(consent) => finish(&shared, &form.request, pending, &signed, consent).await,
            None => unavailable(),
        },
        "deny" => {
            if !matches!(
                shared.records.delete(REQUESTS, &form.request).await,
                Ok(true)
            ) {
                return answered();
            }
            back.error("access_denied", "the user denied the request")
        }
        other => html::error(
            StatusCode::BAD_REQUEST,
            "Invalid answer",
            &format!("decision must be \"approve\" or \"deny\", not {other:?}"),
        ),
    }
}

/// Consumes the pending request (once: a second submission finds it gone) and sends the
/// client its code.
async fn finish(
    shared: &Shared,
    request_id: &str,
    pending: Pending,
    signed: &SignedIn,
    consent: String,
) -> Response {
    match shared.records.delete(REQUESTS, request_id).await {
        Ok(true) => {}
        Ok(false) => return answered(),
        Err(_) => return unavailable(),
    }
    let code = secret();
    let grant = CodeGrant {
        client_id: pending.client_id,
        redirect_uri: pending.redirect_uri.clone(),
        challenge: pending.challenge,
        user: signed.user.clone(),
        scope: pending.scope,
        resource: pending.resource,
        issued_at: now_millis(),
        epoch: signed.epoch.clone(),
        // Consents from before they had ids have an empty one: nothing to check later.
        consent: Some(consent).filter(|id| !id.is_empty()),
        redeemed_into: None,
    };
    match shared
        .records
        .put(CODES, &digest(&code), &grant, None, Write::Create, None)
        .await
    {
        Ok(Some(_)) => {}
        _ => return unavailable(),
    }
    Back {
        redirect_uri: &pending.redirect_uri,
        state: pending.state.as_deref(),
        issuer: &shared.config.issuer,
    }
    .with(&[("code", &code)])
}

/// The pending request `request_id`, when this browser made it (and, for a form, with its
/// CSRF token).
pub(crate) async fn load(
    shared: &Shared,
    headers: &HeaderMap,
    request_id: &str,
    csrf: Option<&str>,
) -> Result<Pending, Response> {
    let pending = match shared.records.get::<Pending>(REQUESTS, request_id).await {
        Ok(Some(found)) => found.value,
        Ok(None) => {
            return Err(html::error(
                StatusCode::BAD_REQUEST,
                "This sign-in has expired",
                "Start again from the application you were signing in to.",
            ));
        }
        Err(_) => return Err(unavailable()),
    };
    let same_browser = cookies::get(headers, shared.cookie(cookies::BROWSER))
        .is_some_and(|browser| constant_eq(&digest(browser), &pending.browser));
    let csrf_ok = csrf.is_none_or(|sent| constant_eq(sent, &pending.csrf));
    if !same_browser || !csrf_ok {
        return Err(html::error(
            StatusCode::FORBIDDEN,
            "This form did not come from this sign-in",
            "The request was not started in this browser, or the form is stale. Start again from the application.",
        ));
    }
    Ok(pending)
}

/// The signed-in user, from the session cookie.
async fn signed_in(shared: &Shared, headers: &HeaderMap) -> Result<Option<SignedIn>, Response> {
    let Some(session) = cookies::get(headers, shared.cookie(cookies::SESSION)) else {
        return Ok(None);
    };
    session_of(shared, session).await.map_err(|_| unavailable())
}

/// Who session `session` (a cookie's value) signs in, if it is a live session of an
/// account that has not been signed out everywhere (or removed) since.
async fn session_of(shared: &Shared, session: &str) -> Result<Option<SignedIn>, UserError> {
    let Some(found) = shared
        .records
        .get::<Session>(SESSIONS, &digest(session))
        .await?
    else {
        return Ok(None);
    };
    let Session { user, epoch } = found.value;
    let counts = shared.users.still_signed_in(&user, &epoch).await?;
    Ok(counts.then_some(SignedIn { user, epoch }))
}

/// The user a session cookie's value signs in, if it is a live session.
pub(crate) async fn signed_in_user(shared: &Shared, session: &str) -> Option<String> {
    session_of(shared, session).await.ok()?.map(|s| s.user)
}

/// Records `user`'s approval of `pending` in their consent for its client, and returns the
/// consent's id; `None` when the store failed. A consent that stands keeps its id, so that
/// approving more leaves the tokens granted before it working; one withdrawn meanwhile does
/// not. Written only over the version read, so that two approvals at once (two tabs, two
/// resources) both stay: one that finds the record changed reads it again.
async fn remember(shared: &Shared, user: &str, pending: &Pending) -> Option<String> {
    let key = consent_key(user, &pending.client_id);
    let approval = Approval {
        client_id: &pending.client_id,
        client_name: &pending.client_name,
        resource: &pending.resource,
        scope: &pending.scope,
    };
    let serves = |resource: &str| shared.config.resources.iter().any(|r| r == resource);
    // Each lost race is another approval that landed: a few are all a person makes.
    for _ in 0..8 {
        let read = shared.records.get::<Consent>(CONSENTS, &key).await.ok()?;
        let write = read
            .as_ref()
            .map_or(Write::Create, |c| Write::Replace(c.version));
        let standing = match read.map(|c| c.value).filter(|c| !c.id.is_empty()) {
            Some(c) => match super::account::is_withdrawn(shared, &c.id).await.ok()? {
                false => Some(c),
                true => None,
            },
            None => None,
        };
        let consent = Consent::approved(standing, &approval, secret, serves);
        let written = shared
            .records
            .put(CONSENTS, &key, &consent, Some(user), write, None)
            .await
            .ok()?;
        if written.is_some() {
            return Some(consent.id);
        }
    }
    tracing::warn!("a consent changed under every attempt to record an approval");
    None
}

/// A redirect some other program on the person's machine could receive.
fn may_be_claimed_locally(uri: &str) -> bool {
    redirect::is_loopback_uri(uri)
        || Url::parse(uri).is_ok_and(|url| !matches!(url.scheme(), "http" | "https"))
}

/// Where the answer goes: the client's redirect URI with `state` and `iss` (RFC 9207) added
/// to its query.
struct Back<'a> {
    redirect_uri: &'a str,
    state: Option<&'a str>,
    issuer: &'a str,
}

impl Back<'_> {
    /// The redirect URI with `params`, `state` and `iss` added to its query.
    fn url(&self, params: &[(&str, &str)]) -> Option<Url> {
        let mut url = Url::parse(self.redirect_uri).ok()?;
        {
            let mut query = url.query_pairs_mut();
            for (name, value) in params {
                query.append_pair(name, value);
            }
            if let Some(state) = self.state {
                query.append_pair("state", state);
            }
            query.append_pair("iss", self.issuer);
        }
        Some(url)
    }

    fn with(&self, params: &[(&str, &str)]) -> Response {
        let Some(url) = self.url(params) else {
            return html::error(
                StatusCode::BAD_REQUEST,
                "Invalid redirect URI",
                self.redirect_uri,
            );
        };
        let mut response = Redirect::to(url.as_str()).into_response();
        response.headers_mut().insert(
            header::CACHE_CONTROL,
            header::HeaderValue::from_static("no-store"),
        );
        response
    }

    /// An error after the person acted (they denied): redirected to the client.
    fn error(&self, code: &str, description: &str) -> Response {
        self.with(&[("error", code), ("error_description", description)])
    }

    /// An error in the request itself, before anyone acted: shown on a page with a link
    /// back to the client, never redirected by itself. Anyone can register a client or
    /// publish a metadata document naming any redirect URI, so an automatic redirect here
    /// would let links on this server's origin forward to any site (RFC 9700 §4.11.2).
    fn refuse(&self, code: &str, description: &str) -> Response {
        let link = self
            .url(&[("error", code), ("error_description", description)])
            .map(|url| {
                format!(
                    "<p><a id=\"return\" href=\"{}\">Return to the application</a></p>",
                    escape(url.as_str())
                )
            })
            .unwrap_or_default();
        let body = format!(
            "<h1>This request cannot be completed</h1><p class=\"detail\">{}: {}</p>{link}",
            escape(code),
            escape(description)
        );
        html::page(
            StatusCode::BAD_REQUEST,
            "Invalid authorization request",
            &body,
        )
    }
}

/// The scope an authorization request is for: the values it asks for, each one this server
/// offers. Without a `scope` parameter: what the client registered (or declared in its
/// metadata document) and the server offers, or everything offered when it registered
/// nothing, or nothing this server offers (a token with no scope would be refused
/// everywhere).
/// A request may ask beyond what the client registered, since MCP's step-up authorization
/// reuses the registration made for the first challenge's scopes; the person sees on the
/// consent page what is asked.
fn request_scope(
    requested: Option<&str>,
    offered: &[String],
    registered: Option<&str>,
) -> Result<String, String> {
    let Some(requested) = requested else {
        let registered = |value: &str| registered.is_none_or(|r| r.split(' ').any(|v| v == value));
        let mut defaults: Vec<&str> = offered
            .iter()
            .map(String::as_str)
            .filter(|s| registered(s))
            .collect();
        if defaults.is_empty() {
            defaults = offered.iter().map(String::as_str).collect();
        }
        return Ok(defaults.join(" "));
    };
    let values: Vec<&str> = requested.split(' ').filter(|s| !s.is_empty()).collect();
    if let Some(unknown) = values.iter().find(|s| !offered.iter().any(|o| o == *s)) {
        return Err(format!("scope {unknown:?} is not offered"));
    }
    Ok(values.join(" "))
}

pub(super) fn too_many() -> Response {
    let mut page = html::error(
        StatusCode::TOO_MANY_REQUESTS,
        "Too many attempts from this address",
        "Wait a minute and try again.",
    );
    page.headers_mut()
        .insert(header::RETRY_AFTER, header::HeaderValue::from_static("60"));
    page
}

fn unavailable() -> Response {
    html::error(
        StatusCode::SERVICE_UNAVAILABLE,
        "The sign-in service is unavailable",
        "Try again in a moment.",
    )
}

fn answered() -> Response {
    html::error(
        StatusCode::BAD_REQUEST,
        "This request was already answered",
        "Start again from the application if you need to sign in again.",
    )
}

fn who_is_asking(pending: &Pending) -> String {
    let redirect_uri = pending.redirect_uri.as_str();
    let redirect_host = Url::parse(redirect_uri)
        .ok()
        .and_then(|u| u.host_str().map(str::to_owned))
        .unwrap_or_else(|| redirect_uri.to_owned());
    let mut out = format!(
        "<p><strong><bdi>{}</bdi></strong>",
        escape(&pending.client_name)
    );
    match &pending.document_host {
        Some(host) => out.push_str(&format!(
            " from <span class=\"host\" id=\"client-host\">{}</span></p>",
            escape(host)
        )),
        None => out.push_str(" (a registered application; its name is not verified)</p>"),
    }
    out.push_str(&format!(
        "<p>will receive the authorization at <span class=\"host\" id=\"redirect-host\">{}</span></p>",
        escape(&redirect_host)
    ));
    if redirect::is_loopback_uri(redirect_uri) {
        out.push_str(
            "<p class=\"warning\" id=\"localhost-warning\">The authorization goes to a program on this computer \
             (localhost). Continue only if you started this sign-in from an application on this computer.</p>",
        );
    }
    out
}

fn login_page(
    shared: &Shared,
    request_id: &str,
    pending: &Pending,
    problem: Option<&str>,
) -> Response {
    let problem = problem
        .map(|p| format!("<p class=\"warning\" role=\"alert\">{}</p>", escape(p)))
        .unwrap_or_default();
    let body = format!(
        "<h1>Sign in</h1>{who}{problem}<form method=\"post\" action=\"/authorize/login\">{hidden}\
         <label for=\"username\">User name</label><input type=\"text\" id=\"username\" name=\"username\" autocomplete=\"username\" required>\
         <label for=\"password\">Password</label><input type=\"password\" id=\"password\" name=\"password\" autocomplete=\"current-password\" required>\
         <button type=\"submit\" id=\"sign-in\">Sign in</button></form>{upstream}",
        who = who_is_asking(pending),
        hidden = hidden(&[("request", request_id), ("csrf", &pending.csrf)]),
        upstream = shared.upstream.as_ref().map_or(String::new(), |u| format!(
            "<p><a id=\"upstream\" href=\"/authorize/upstream?request={}\">Sign in with {}</a></p>",
            escape(request_id),
            escape(u.name())
        )),
    );
    html::page(StatusCode::OK, "Sign in", &body)
}

fn consent_html(request_id: &str, pending: &Pending, user: &str) -> Response {
    let scopes = if pending.scope.is_empty() {
        "<dd>no particular scope</dd>".to_owned()
    } else {
        pending
            .scope
            .split(' ')
            .map(|s| format!("<dd>{}</dd>", escape(s)))
            .collect()
    };
    let body = format!(
        "<h1>Allow access?</h1>{who}<dl><dt>Signed in as</dt><dd>{user}</dd><dt>Access to</dt><dd>{resource}</dd>\
         <dt>Scopes</dt>{scopes}</dl><form method=\"post\" action=\"/authorize/consent\">{hidden}\
         <button type=\"submit\" name=\"decision\" value=\"approve\" id=\"approve\">Allow</button>\
         <button type=\"submit\" name=\"decision\" value=\"deny\" id=\"deny\">Deny</button></form>",
        who = who_is_asking(pending),
        user = escape(user),
        resource = escape(&pending.resource),
        hidden = hidden(&[("request", request_id), ("csrf", &pending.csrf)]),
    );
    html::page(StatusCode::OK, "Allow access?", &body)
}

#[cfg(test)]
mod tests {
    use super::request_scope;

    #[test]
    fn a_request_gets_what_it_asks_or_by_default_what_the_client_registered() {
        let offered = ["read".to_owned(), "write".to_owned(), "admin".to_owned()];
        let scope = |requested, registered| request_scope(requested, &offered, registered);
        assert_eq!(scope(None, None).unwrap(), "read write admin");
        assert_eq!(scope(None, Some("write read other")).unwrap(), "read write");
        assert_eq!(
            scope(None, Some("openid offline_access")).unwrap(),
            "read write admin",
            "nothing registered is offered: everything offered"
        );
        assert_eq!(scope(Some(" write  read"), None).unwrap(), "write read");
        assert_eq!(scope(Some(""), Some("read")).unwrap(), "");
        assert_eq!(
            scope(Some("read admin"), Some("read")).unwrap(),
            "read admin",
            "a step-up asks beyond the registration"
        );
        let err = scope(Some("read other"), Some("read other")).unwrap_err();
        assert!(err.contains("\"other\" is not offered"), "{err}");
    }
}
