//! The token endpoint: authorization codes (single use, PKCE checked) and refresh tokens
//! (rotated at every use) exchanged for short-lived JWT access tokens bound to their
//! resource (RFC 8707).
//!
//! Every token issued from one code belongs to a family. A code redeemed twice, or a refresh
//! token used twice, means one of the two presenters stole it: the family is revoked, so the
//! refresh token either of them holds stops working (RFC 9700 §4.14.2). Access tokens already
//! issued stay valid until they expire, which is why they are short-lived. One second use of
//! a refresh token is not taken for theft: the same request again, within
//! [`AuthzConfig::refresh_retry_window`](super::AuthzConfig) and before the client used the
//! refresh token it was given, is a client whose answer was lost, and it gets that answer
//! again ([`retry`]).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::Json;
use axum::extract::{ConnectInfo, FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use jsonwebtoken::{Algorithm, Header};
use serde::{Deserialize, Serialize};
use serde_json::json;
use wharf::store::{Millis, Write, after, millis, now_millis};

use super::account::is_withdrawn;
use super::authorize::CodeGrant;
use super::clients::{Client, TokenAuth};
use super::consent::{Consent, consent_key};
use super::{OAuthError, Shared, params};
use crate::families::{self, Family};
use crate::pkce::CodeChallenge;
use crate::records::{
    CODES, CONSENTS, FAMILIES, Kind, REFRESH, RecordError, Versioned, digest, secret,
};
use retry::{Asked, Retry};

mod assertion;
mod retry;
mod revoke;

pub(crate) use revoke::endpoint as revocation_endpoint;

/// Who the rate limits count a request against: the peer's address, when the server was
/// started with connect info, or the client a trusted proxy names.
pub(crate) struct Peer(pub(crate) Option<IpAddr>);

impl FromRequestParts<Arc<Shared>> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        shared: &Arc<Shared>,
    ) -> Result<Self, Self::Rejection> {
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip());
        let trusted = &shared.config.trusted_proxies;
        Ok(Peer(peer.map(|peer| {
            super::limits::client_address(peer, &parts.headers, trusted)
        })))
    }
}

/// The token request's fields (RFC 6749 §4.1.3, §6; RFC 7523 §2.2; RFC 8707), and the
/// revocation request's (RFC 7009 §2.1); no `Debug`:
/// they hold codes, verifiers, secrets and refresh tokens.
#[derive(Default, Deserialize)]
pub(crate) struct TokenForm {
    grant_type: Option<String>,
    code: Option<String>,
    redirect_uri: Option<String>,
    code_verifier: Option<String>,
    refresh_token: Option<String>,
    resource: Option<String>,
    scope: Option<String>,
    client_id: Option<String>,
    client_secret: Option<String>,
    client_assertion_type: Option<String>,
    client_assertion: Option<String>,
    /// The token to revoke (RFC 7009 §2.1), at `/revoke`; its `token_type_hint` is not
    /// needed, and ignored as other unknown fields are.
    token: Option<String>,
}

/// A refresh token, as stored under its digest.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Refresh {
    family: String,
    client_id: String,
    user: String,
    scope: String,
    resource: String,
    used: bool,
    /// Once used: its answer, for the same request sent again (see [`retry`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    retry: Option<Retry>,
}

/// `POST /token`.
pub(crate) async fn token(
    State(shared): State<Arc<Shared>>,
    Peer(peer): Peer,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let exchanged = match admit(&shared, peer, &headers, &body) {
        Ok(form) => exchange(&shared, &headers, form).await,
        Err(err) => Err(err),
    };
    exchanged.unwrap_or_else(IntoResponse::into_response)
}

/// What the token and revocation endpoints check first: the address's budget (they share
/// one), then the form. A body that is not one form, each parameter once (RFC 6749 §3.2,
/// read as `/authorize` reads its query), is answered as OAuth errors are, not with the
/// framework's plain text.
fn admit(
    shared: &Shared,
    peer: Option<IpAddr>,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<TokenForm, OAuthError> {
    if !shared.limits.token_requests.allows(peer) {
        return Err(OAuthError::too_many("token requests"));
    }
    let refused = |why: &str| {
        OAuthError::invalid_request(format!(
            "the request must be an application/x-www-form-urlencoded form, each parameter once: {why}"
        ))
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    if !essence.eq_ignore_ascii_case("application/x-www-form-urlencoded") {
        return Err(refused(&format!("its Content-Type is {content_type:?}")));
    }
    let text = std::str::from_utf8(body).map_err(|_| refused("the body is not UTF-8"))?;
    params::parse(text).map_err(|err| match err {
        // RFC 8707 §2: several resources may be asked for; this server issues a token for
        // one, and says so as the RFC has it.
        params::ParamError::Repeated(name) if name == "resource" => OAuthError::new(
            axum::http::StatusCode::BAD_REQUEST,
            "invalid_target",
            "a token is issued for one resource: give resource once",
        ),
        err => refused(&err.to_string()),
    })
}

async fn exchange(
    shared: &Shared,
    headers: &HeaderMap,
    form: TokenForm,
) -> Result<Response, OAuthError> {
    let client = authenticate(shared, headers, &form).await?;
    let issued = match form.grant_type.as_deref() {
        Some("authorization_code") => redeem_code(shared, &client, &form).await?,
        Some("refresh_token") if !client.refresh => {
            return Err(OAuthError::new(
                axum::http::StatusCode::BAD_REQUEST,
                "unauthorized_client",
                "this client's grant_types do not include refresh_token",
            ));
        }
        Some("refresh_token") => refresh(shared, &client, &form).await?,
        Some(other) => {
            return Err(OAuthError::new(
                axum::http::StatusCode::BAD_REQUEST,
                "unsupported_grant_type",
                format!(
                    "grant_type {other:?} is not supported: use authorization_code or refresh_token"
                ),
            ));
        }
        None => return Err(OAuthError::invalid_request("grant_type is required")),
    };
    shared.keep_client(&client).await;
    Ok(issued)
}

/// Who is asking, checked by the method the client is registered (or documented) with.
async fn authenticate(
    shared: &Shared,
    headers: &HeaderMap,
    form: &TokenForm,
) -> Result<Client, OAuthError> {
    let basic = basic_credentials(headers)?;
    let claimed = basic
        .as_ref()
        .map(|(id, _)| id.clone())
        .or_else(|| form.client_id.clone())
        .or_else(|| form.client_assertion.as_deref().and_then(assertion::issuer));
    let client = shared
        .client(claimed.as_deref())
        .await
        .map_err(|err| match err {
            super::clients::ClientError::Record(_) => OAuthError::server_error(err),
            err if err.is_transient() => OAuthError::temporarily_unavailable(err.public_message()),
            // Never where a name resolves inside the network: the log has that.
            other => OAuthError::invalid_client(other.public_message()),
        })?;
    if form.client_id.as_deref().is_some_and(|id| id != client.id) {
        return Err(OAuthError::invalid_client(
            "client_id differs from the client that authenticated",
        ));
    }
    let expected = client.auth.method();
    let wrong = |used: &str| {
        OAuthError::invalid_client(format!(
            "this client authenticates with {expected}, not {used}"
        ))
    };
    match &client.auth {
        TokenAuth::None => {
            if basic.is_some() || form.client_secret.is_some() || form.client_assertion.is_some() {
                return Err(wrong("a credential: it is a public client"));
            }
        }
        TokenAuth::ClientSecretBasic { digest: stored }
        | TokenAuth::ClientSecretPost { digest: stored } => {
            let sent = match (&client.auth, &basic, &form.client_secret) {
                (TokenAuth::ClientSecretBasic { .. }, Some((_, secret)), None) => secret.as_str(),
                (TokenAuth::ClientSecretPost { .. }, None, Some(secret)) => secret.as_str(),
                _ => return Err(wrong("another method")),
            };
            if !super::constant_eq(&digest(sent), stored) {
                return Err(OAuthError::invalid_client("the client secret is wrong"));
            }
        }
        TokenAuth::PrivateKeyJwt { .. } | TokenAuth::PrivateKeyJwtUri { .. } => {
            if form.client_assertion_type.as_deref() != Some(assertion::JWT_BEARER) {
                return Err(wrong(
                    "no client_assertion of type urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
                ));
            }
            let jwt = form
                .client_assertion
                .as_deref()
                .ok_or_else(|| wrong("no client_assertion"))?;
            assertion::verify(shared, &client, jwt).await?;
        }
    }
    Ok(client)
}

/// `Authorization: Basic` credentials, URL-decoded (RFC 6749 §2.3.1).
fn basic_credentials(headers: &HeaderMap) -> Result<Option<(String, String)>, OAuthError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    let bad =
        || OAuthError::invalid_client("the Authorization header is not Basic client credentials");
    let text = value.to_str().map_err(|_| bad())?;
    // The scheme's name is case-insensitive (RFC 9110 §11.1).
    let encoded = match text.split_once(' ') {
        Some((scheme, encoded)) if scheme.eq_ignore_ascii_case("basic") => encoded,
        _ => return Err(bad()),
    };
    let decoded = STANDARD.decode(encoded.trim()).map_err(|_| bad())?;
    let decoded = String::from_utf8(decoded).map_err(|_| bad())?;
    let (id, secret) = decoded.split_once(':').ok_or_else(bad)?;
    let unescape = |s: &str| -> Result<String, OAuthError> {
        let pairs: Vec<(String, String)> =
            serde_urlencoded::from_str(&format!("v={s}")).map_err(|_| bad())?;
        pairs.into_iter().next().map(|(_, v)| v).ok_or_else(bad)
    };
    Ok(Some((unescape(id)?, unescape(secret)?)))
}

async fn redeem_code(
    shared: &Shared,
    client: &Client,
    form: &TokenForm,
) -> Result<Response, OAuthError> {
    let (key, stored) = presented::<CodeGrant>(shared, CODES, form.code.as_deref(), "code").await?;
    let grant = stored.value.clone();
    if grant.client_id != client.id {
        return Err(OAuthError::invalid_grant(
            "the code was issued to another client",
        ));
    }
    if let Some(family) = &grant.redeemed_into {
        revoke(shared, family).await?;
        return Err(OAuthError::invalid_grant(
            "the code was already used; the tokens issued for it are revoked",
        ));
    }
    if now_millis()
        > grant
            .issued_at
            .saturating_add(millis(shared.config.code_ttl))
    {
        return Err(OAuthError::invalid_grant("the code has expired"));
    }
    if form
        .redirect_uri
        .as_deref()
        .is_some_and(|uri| uri != grant.redirect_uri)
    {
        return Err(OAuthError::invalid_grant(
            "redirect_uri differs from the authorization request's",
        ));
    }
    CodeChallenge::from_stored(grant.challenge.clone())
        .verify(form.code_verifier.as_deref())
        .map_err(|err| OAuthError::invalid_grant(err.to_string()))?;
    check_resource(form, &grant.resource)?;
    // The family exists (alive) before the code says it was redeemed into it, so a second
    // redemption racing this one always finds a family to revoke.
    let family = secret();
    let stored_family = Family {
        client_id: client.id.clone(),
        user: grant.user.clone(),
        revoked: false,
        epoch: grant.epoch.clone(),
        consent: grant.consent.clone(),
    };
    shared
        .records
        .put(
            FAMILIES,
            &family,
            &stored_family,
            Some(&grant.user),
            Write::Create,
            Some(outliving_refresh_tokens(shared, FAMILIES)),
        )
        .await
        .map_err(OAuthError::server_error)?
        .ok_or_else(|| OAuthError::server_error("a fresh family id collided"))?;
    // The sign-in and the consent are looked at once the family exists: a sign-out
    // everywhere or a withdrawal is either seen here, or made after this look, and then the
    // revocation that follows it finds the family. (Looked at before, a sign-out made in
    // between listed the families before this one was there.)
    let current = match still_signed_in(shared, &grant.user, &grant.epoch).await {
        Ok(()) => still_consented(shared, &stored_family).await,
        Err(err) => Err(err),
    };
    if let Err(err) = current {
        forget_family(shared, &family).await;
        return Err(err);
    }
    // The tokens are made (and the refresh token stored) before the code is marked: a
    // failure up to the mark leaves the code unused, so the client's retry is served
    // instead of being taken for a second redemption.
    let prepared = prepare(
        shared,
        client,
        &family,
        &grant.user,
        (&grant.scope, &grant.scope),
        &grant.resource,
    )
    .await;
    let tokens = match prepared {
        Ok(tokens) => tokens,
        Err(err) => {
            forget_family(shared, &family).await;
            return Err(err);
        }
    };
    let redeemed = CodeGrant {
        redeemed_into: Some(family.clone()),
        ..grant.clone()
    };
    let marked = shared
        .records
        .put(
            CODES,
            &key,
            &redeemed,
            None,
            Write::Replace(stored.version),
            None,
        )
        .await;
    let marked = match marked {
        Ok(marked) => marked.is_some(),
        // The mark may have been written before its answer was lost: then the code says it
        // was redeemed into this family, and a retry would be taken for a second
        // redemption. What the code says now decides.
        Err(err) => match redeemed_into(shared, &key).await {
            Ok(Some(into)) if into == family => true,
            // Another redemption marked it first: both are revoked, below.
            Ok(Some(_)) => false,
            _ => {
                tokens.discard(shared).await;
                forget_family(shared, &family).await;
                return Err(OAuthError::server_error(err));
            }
        },
    };
    if !marked {
        // Redeemed by another request between the read and now: that one and this one
        // cannot both be the client. Neither keeps tokens. The family that holds some is
        // revoked first; a failure to read which one it is answers 500, not "revoked".
        let theirs = redeemed_into(shared, &key)
            .await
            .map_err(OAuthError::server_error)?;
        if let Some(theirs) = theirs {
            revoke(shared, &theirs).await?;
        }
        revoke(shared, &family).await?;
        tokens.discard(shared).await;
        return Err(OAuthError::invalid_grant(
            "the code was already used; the tokens issued for it are revoked",
        ));
    }
    Ok(tokens.into_response())
}

/// The family the code filed under `key` was redeemed into, as stored now.
async fn redeemed_into(shared: &Shared, key: &str) -> Result<Option<String>, RecordError> {
    Ok(shared
        .records
        .get::<CodeGrant>(CODES, key)
        .await?
        .and_then(|now| now.value.redeemed_into))
}

/// Removes a family nothing was handed out for (the request failed before its tokens
/// left). Best effort: a family left behind holds no token anyone has, and expires.
async fn forget_family(shared: &Shared, family: &str) {
    if let Err(err) = shared.records.delete(FAMILIES, family).await {
        tracing::warn!(error = %err, "an unused token family's record was not removed");
    }
}

async fn refresh(
    shared: &Shared,
    client: &Client,
    form: &TokenForm,
) -> Result<Response, OAuthError> {
    let (key, stored) = presented::<Refresh>(
        shared,
        REFRESH,
        form.refresh_token.as_deref(),
        "refresh_token",
    )
    .await?;
    let record = stored.value.clone();
    if record.client_id != client.id {
        return Err(OAuthError::invalid_grant(
            "the refresh token was issued to another client",
        ));
    }
    let family = shared
        .records
        .get::<Family>(FAMILIES, &record.family)
        .await
        .map_err(OAuthError::server_error)?
        .filter(|f| !f.value.revoked)
        .ok_or_else(|| OAuthError::invalid_grant("the refresh token has been revoked"))?;
    still_signed_in(shared, &family.value.user, &family.value.epoch).await?;
    still_consented(shared, &family.value).await?;
    keep_consent(shared, &family.value).await;
    let reused = || {
        OAuthError::invalid_grant(
            "the refresh token was already used; every token issued with it is revoked",
        )
    };
    let asked = Asked {
        secret: form.refresh_token.as_deref().unwrap_or_default(),
        key: &key,
        scope: form.scope.as_deref(),
        keys: shared.config.key_encryption.as_ref(),
    };
    if record.used {
        if let Some(again) = retried(shared, &record, &asked, form).await {
            return Ok(again.into_response());
        }
        revoke(shared, &record.family).await?;
        return Err(reused());
    }
    check_resource(form, &record.resource)?;
    let scope = match form.scope.as_deref() {
        None => record.scope.clone(),
        Some(narrower) => {
            if let Some(extra) = narrower
                .split(' ')
                .filter(|s| !s.is_empty())
                .find(|s| !record.scope.split(' ').any(|g| g == *s))
            {
                return Err(OAuthError::new(
                    axum::http::StatusCode::BAD_REQUEST,
                    "invalid_scope",
                    format!("scope {extra:?} was not granted to this refresh token"),
                ));
            }
            narrower.to_owned()
        }
    };
    // The new tokens are made (and the new refresh token stored) before the presented one
    // is marked used: a failure up to the mark leaves it unused, so the client's retry is
    // served instead of being taken for reuse, which would revoke the family. A narrower
    // scope is for this access token only: the new refresh token keeps the grant's (RFC
    // 6749 §6).
    let tokens = prepare(
        shared,
        client,
        &record.family,
        &record.user,
        (&scope, &record.scope),
        &record.resource,
    )
    .await?;
    let window = shared.config.refresh_retry_window;
    let used = Refresh {
        used: true,
        retry: (!window.is_zero())
            .then(|| Retry::seal(&asked, &tokens, now_millis()))
            .flatten(),
        ..record.clone()
    };
    let marked = shared
        .records
        .put(
            REFRESH,
            &key,
            &used,
            None,
            Write::Replace(stored.version),
            Some(outliving_refresh_tokens(shared, REFRESH)),
        )
        .await;
    // A store that failed may still have marked it (a connection lost with the answer):
    // the new tokens stay stored then, for the client's retry to be given them; if it did
    // not, they are a secret nobody holds, and expire.
    let marked = marked.map_err(OAuthError::server_error)?;
    if marked.is_none() {
        // Spent meanwhile: by this same request sent twice at once (the client retried
        // before its first answer came), which gets that answer; else by someone else.
        if let Ok(Some(now)) = shared.records.get::<Refresh>(REFRESH, &key).await {
            if let Some(again) = retried(shared, &now.value, &asked, form).await {
                tokens.discard(shared).await;
                return Ok(again.into_response());
            }
        }
        revoke(shared, &record.family).await?;
        tokens.discard(shared).await;
        return Err(reused());
    }
    // A family lives as long as it is used: each rotation pushes its expiry back, unless it
    // was revoked meanwhile. Past the mark, a store failure here does not fail the request:
    // the presented token is spent, and the family keeps its earlier expiry.
    match shared
        .records
        .put(
            FAMILIES,
            &record.family,
            &family.value,
            Some(&record.user),
            Write::Replace(family.version),
            Some(outliving_refresh_tokens(shared, FAMILIES)),
        )
        .await
    {
        Ok(Some(_)) => {}
        // Changed meanwhile: revoked, or rotated on, by a retry of this request (which the
        // mark answers with these very tokens) and the refresh that used what it was given;
        // that rotation pushed the expiry back itself. Past the mark these tokens may be
        // held already: they are never discarded here (a used one's record is what tells
        // its reuse), and a revoked family refuses them anyway.
        Ok(None) => {
            let revoked = match shared.records.get::<Family>(FAMILIES, &record.family).await {
                Ok(Some(now)) => now.value.revoked,
                Ok(None) => true,
                // Unknown: the tokens go out, as when the write failed (below).
                Err(_) => false,
            };
            if revoked {
                return Err(OAuthError::invalid_grant(
                    "the refresh token has been revoked",
                ));
            }
        }
        Err(err) => {
            tracing::warn!(error = %err, "a token family's expiry was not extended");
        }
    }
    Ok(tokens.into_response())
}

/// The answer a spent refresh token gave, if `asked` repeats its request within the retry
/// window and the client has not used the refresh token it was given: then the first
/// answer was lost, and this is the client's retry. Anything the store cannot tell makes
/// it no retry: the second use then revokes, as it would without a window.
async fn retried(
    shared: &Shared,
    spent: &Refresh,
    asked: &Asked<'_>,
    form: &TokenForm,
) -> Option<Prepared> {
    let window = shared.config.refresh_retry_window;
    let again = spent.retry.as_ref()?.open(asked, window, now_millis())?;
    check_resource(form, &spent.resource).ok()?;
    let given = digest(again.refresh_token.as_deref()?);
    match shared.records.get::<Refresh>(REFRESH, &given).await {
        Ok(Some(given)) if !given.value.used => Some(again),
        Ok(_) => None,
        Err(err) => {
            tracing::warn!(error = %err, "a refresh token's retry was not looked up");
            None
        }
    }
}

/// The record a presented secret (a code, a refresh token) is filed under, and its key.
async fn presented<T: serde::de::DeserializeOwned>(
    shared: &Shared,
    kind: Kind,
    secret: Option<&str>,
    name: &str,
) -> Result<(String, Versioned<T>), OAuthError> {
    let secret =
        secret.ok_or_else(|| OAuthError::invalid_request(format!("{name} is required")))?;
    let key = digest(secret);
    let stored = shared
        .records
        .get::<T>(kind, &key)
        .await
        .map_err(OAuthError::server_error)?
        .ok_or_else(|| {
            OAuthError::invalid_grant(format!("the {name} is unknown or has expired"))
        })?;
    Ok((key, stored))
}

fn check_resource(form: &TokenForm, granted: &str) -> Result<(), OAuthError> {
    match form.resource.as_deref() {
        Some(asked) if !super::same_resource(asked, granted) => Err(OAuthError::new(
            axum::http::StatusCode::BAD_REQUEST,
            "invalid_target",
            format!("resource {asked:?} is not the one the grant was made for ({granted:?})"),
        )),
        _ => Ok(()),
    }
}

/// Refuses a grant whose user was signed out everywhere (a new password) or removed since
/// signing in to it under account epoch `epoch`: even one made in the moment the sign-out
/// ran.
async fn still_signed_in(shared: &Shared, user: &str, epoch: &str) -> Result<(), OAuthError> {
    let counts = shared
        .users
        .still_signed_in(user, epoch)
        .await
        .map_err(OAuthError::server_error)?;
    if counts {
        Ok(())
    } else {
        Err(OAuthError::invalid_grant(
            "the user has been signed out since this grant was made; sign in again",
        ))
    }
}

/// Refuses the grants of `family` once the user has withdrawn the consent its code was
/// issued under (on `/account`), even those made while the withdrawal was under way.
async fn still_consented(shared: &Shared, family: &Family) -> Result<(), OAuthError> {
    let Some(id) = &family.consent else {
        return Ok(());
    };
    let withdrawn = is_withdrawn(shared, id)
        .await
        .map_err(OAuthError::server_error)?;
    if withdrawn {
        Err(OAuthError::invalid_grant(
            "the user has withdrawn the consent this grant was made under; ask again",
        ))
    } else {
        Ok(())
    }
}

/// Keeps the consent a refreshed grant was made under for as long as the grant lives, so
/// that `/account` still lists (and can withdraw) every client that holds tokens: a consent
/// record expiring a year after its approval would otherwise vanish from the page while
/// its client refreshes on. A no-op until the record is within a refresh token's lifetime
/// of its end. Best effort: a store that fails here is logged, the tokens still go out.
async fn keep_consent(shared: &Shared, family: &Family) {
    let key = consent_key(&family.user, &family.client_id);
    let consent = match shared.records.get::<Consent>(CONSENTS, &key).await {
        Ok(Some(consent)) => consent,
        Ok(None) => return,
        Err(err) => {
            tracing::warn!(error = %err, "a consent was not read to keep it");
            return;
        }
    };
    let now = now_millis();
    let lifetime = shared.config.refresh_token_ttl;
    if consent
        .expires_at
        .is_none_or(|at| at >= after(now, lifetime.saturating_add(lifetime)))
    {
        return;
    }
    let until = after(now, crate::records::CONSENTS.ttl.unwrap_or(lifetime));
    let kept = shared
        .records
        .put(
            CONSENTS,
            &key,
            &consent.value,
            Some(&family.user),
            Write::Replace(consent.version),
            Some(until),
        )
        .await;
    if let Err(err) = kept {
        tracing::warn!(error = %err, "a consent was not kept alive with its grant");
    }
}

/// When a record of `kind` written now expires, if it must outlive the refresh tokens
/// issued now: a family must outlive its newest refresh token (or that token is refused as
/// revoked), and a used token's marker any copy of it presented again (or the reuse goes
/// unnoticed). So a day past [`AuthzConfig::refresh_token_ttl`](super::AuthzConfig), as a
/// withdrawn consent is kept, and never sooner than the kind's own lifetime.
fn outliving_refresh_tokens(shared: &Shared, kind: Kind) -> wharf::store::Millis {
    let day = std::time::Duration::from_secs(24 * 3600);
    let lifetime = shared.config.refresh_token_ttl.saturating_add(day);
    after(
        now_millis(),
        kind.ttl.map_or(lifetime, |own| own.max(lifetime)),
    )
}

/// Revokes `family`.
async fn revoke(shared: &Shared, family: &str) -> Result<(), OAuthError> {
    families::revoke(&shared.records, family)
        .await
        .map_err(OAuthError::server_error)
}

/// Revokes every family `user` holds for `client_id` (a consent withdrawn).
pub(crate) async fn revoke_client(
    shared: &Shared,
    user: &str,
    client_id: &str,
) -> Result<(), OAuthError> {
    families::revoke_all(&shared.records, user, Some(client_id))
        .await
        .map(drop)
        .map_err(OAuthError::server_error)
}

/// The access token's claims (RFC 9068).
#[derive(Serialize)]
struct Claims<'a> {
    iss: &'a str,
    sub: &'a str,
    aud: &'a str,
    exp: i64,
    iat: i64,
    jti: String,
    /// The token family, so the resource server can refuse a revoked family's tokens.
    sid: &'a str,
    client_id: &'a str,
    scope: &'a str,
}

/// Tokens made and stored, not yet handed out: the refresh token's record exists, so the
/// response may go out once the grant they replace is spent.
struct Prepared {
    access_token: String,
    /// `None` for a client that does not use refresh tokens.
    refresh_token: Option<String>,
    expires_in: u64,
    /// When the access token expires (its `exp`).
    expires_at: Millis,
    scope: String,
}

impl Prepared {
    /// Removes the stored refresh token of tokens that will not be handed out. Best effort:
    /// a record left behind is for a secret nobody holds, and expires.
    async fn discard(self, shared: &Shared) {
        let Some(refresh_token) = self.refresh_token else {
            return;
        };
        if let Err(err) = shared
            .records
            .delete(REFRESH, &digest(&refresh_token))
            .await
        {
            tracing::warn!(error = %err, "an unissued refresh token's record was not removed");
        }
    }

    fn into_response(self) -> Response {
        let mut body = json!({
            "access_token": self.access_token,
            "token_type": "Bearer",
            "expires_in": self.expires_in,
            "scope": self.scope,
        });
        if let Some(refresh_token) = self.refresh_token {
            body["refresh_token"] = json!(refresh_token);
        }
        let mut response = Json(body).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        headers.insert(header::PRAGMA, HeaderValue::from_static("no-cache"));
        response
    }
}

/// Signs an access token and, for a client that uses them, stores a new refresh token,
/// both of `family`.
async fn prepare(
    shared: &Shared,
    client: &Client,
    family: &str,
    user: &str,
    (scope, refresh_scope): (&str, &str),
    resource: &str,
) -> Result<Prepared, OAuthError> {
    let now = now_millis();
    let key = shared
        .keys
        .current(now)
        .await
        .map_err(OAuthError::server_error)?;
    let ttl = shared.config.access_token_ttl.as_secs();
    let exp = now / 1000 + i64::try_from(ttl).unwrap_or(600);
    let claims = Claims {
        iss: &shared.config.issuer,
        sub: user,
        aud: resource,
        iat: now / 1000,
        exp,
        jti: secret(),
        sid: family,
        client_id: &client.id,
        scope,
    };
    let mut header = Header::new(Algorithm::ES256);
    header.kid = Some(key.kid.clone());
    header.typ = Some(crate::keys::ACCESS_TOKEN_TYPE.to_owned());
    let access_token =
        jsonwebtoken::encode(&header, &claims, &key.encoding).map_err(OAuthError::server_error)?;
    if !client.refresh {
        return Ok(Prepared {
            access_token,
            refresh_token: None,
            expires_in: ttl,
            expires_at: exp.saturating_mul(1000),
            scope: scope.to_owned(),
        });
    }
    let refresh_token = secret();
    let record = Refresh {
        family: family.to_owned(),
        client_id: client.id.clone(),
        user: user.to_owned(),
        scope: refresh_scope.to_owned(),
        resource: resource.to_owned(),
        used: false,
        retry: None,
    };
    let expires_at = after(now, shared.config.refresh_token_ttl);
    shared
        .records
        .put(
            REFRESH,
            &digest(&refresh_token),
            &record,
            None,
            Write::Create,
            Some(expires_at),
        )
        .await
        .map_err(OAuthError::server_error)?
        .ok_or_else(|| OAuthError::server_error("a fresh refresh token collided"))?;
    Ok(Prepared {
        access_token,
        refresh_token: Some(refresh_token),
        expires_in: ttl,
        expires_at: exp.saturating_mul(1000),
        scope: scope.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::cimd::Fetcher;
    use crate::server::{AuthorizationServer, AuthzConfig};
    use wharf::store::{
        Begin, Claim, HandleRecord, NewRecord, Record, SharedKey, Store, StoreError, Transaction,
        TxMode,
    };

    /// A server on a throwaway store with one grant: a family of a person an upstream
    /// provider signed in (whom no administrator signed out), and its refresh token.
    async fn granted(config: AuthzConfig) -> (AuthorizationServer, Client, String) {
        granted_on(config, throwaway().await).await
    }

    async fn throwaway() -> Arc<dyn Store> {
        wharf_store::open("memory://", &wharf_store::StoreOptions::default())
            .await
            .unwrap()
    }

    /// As [`granted`], on `store`.
    async fn granted_on(
        config: AuthzConfig,
        store: Arc<dyn Store>,
    ) -> (AuthorizationServer, Client, String) {
        let ttl = config.refresh_token_ttl;
        let server = AuthorizationServer::new(config, store, Fetcher::builder().build().unwrap());
        let user = "idp:alice";
        let client = Client {
            id: "wc_AAAAAAAAAAAAAAAAAAAAAA".into(),
            name: "app".into(),
            redirect_uris: Vec::new(),
            auth: TokenAuth::None,
            document_host: None,
            scope: None,
            registration: None,
            refresh: true,
        };
        let family = Family {
            client_id: client.id.clone(),
            user: user.into(),
            revoked: false,
            epoch: String::new(),
            consent: None,
        };
        let records = &server.shared.records;
        records
            .put(FAMILIES, "f", &family, Some(user), Write::Create, None)
            .await
            .unwrap();
        let token = secret();
        let stored = Refresh {
            family: "f".into(),
            client_id: client.id.clone(),
            user: user.into(),
            scope: "read".into(),
            resource: "http://127.0.0.1:9/mcp".into(),
            used: false,
            retry: None,
        };
        let expires_at = after(now_millis(), ttl);
        records
            .put(
                REFRESH,
                &digest(&token),
                &stored,
                None,
                Write::Create,
                Some(expires_at),
            )
            .await
            .unwrap();
        (server, client, token)
    }

    fn config() -> AuthzConfig {
        AuthzConfig::new("http://127.0.0.1:9", "http://127.0.0.1:9/mcp")
    }

    /// Refreshes with `token`, asking for `scope`: the answer's JSON, or the error's.
    async fn refreshed(
        server: &AuthorizationServer,
        client: &Client,
        token: &str,
        scope: Option<&str>,
    ) -> Result<serde_json::Value, String> {
        let form = TokenForm {
            refresh_token: Some(token.to_owned()),
            scope: scope.map(str::to_owned),
            ..TokenForm::default()
        };
        answered(refresh(&server.shared, client, &form).await).await
    }

    /// A token endpoint's answer: its JSON, or the error's.
    async fn answered(answer: Result<Response, OAuthError>) -> Result<serde_json::Value, String> {
        match answer {
            Ok(response) => {
                let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                    .await
                    .unwrap();
                Ok(serde_json::from_slice(&body).unwrap())
            }
            Err(err) => Err(format!("{err:?}")),
        }
    }

    async fn revoked(server: &AuthorizationServer) -> bool {
        let family = server.shared.records.get::<Family>(FAMILIES, "f").await;
        family.unwrap().unwrap().value.revoked
    }

    /// A client whose answer was lost sends the same refresh again: it gets the same
    /// tokens, until it used the refresh token it was given; after that, the old one is
    /// someone's copy, and the family goes.
    #[tokio::test]
    async fn a_lost_answer_is_given_again_until_its_refresh_token_is_used() {
        let (server, client, r1) = granted(config()).await;
        let first = refreshed(&server, &client, &r1, None).await.unwrap();
        let again = refreshed(&server, &client, &r1, None).await.unwrap();
        assert_eq!(again["access_token"], first["access_token"]);
        assert_eq!(again["refresh_token"], first["refresh_token"]);
        assert_eq!(again["scope"], "read");
        assert!(again["expires_in"].as_u64().unwrap() <= 600);
        assert!(!revoked(&server).await);
        let r2 = first["refresh_token"].as_str().unwrap();
        let third = refreshed(&server, &client, r2, None).await.unwrap();
        assert_ne!(third["refresh_token"], first["refresh_token"]);
        let err = refreshed(&server, &client, &r1, None).await.unwrap_err();
        assert!(err.contains("already used"), "{err}");
        assert!(revoked(&server).await);
    }

    /// A retry gets nothing once the family is revoked (by a reused code, a sign-out, a
    /// consent withdrawn): the checks of every refresh come first.
    #[tokio::test]
    async fn a_retry_in_a_revoked_family_is_refused() {
        let (server, client, r1) = granted(config()).await;
        refreshed(&server, &client, &r1, None).await.unwrap();
        families::revoke(&server.shared.records, "f").await.unwrap();
        let err = refreshed(&server, &client, &r1, None).await.unwrap_err();
        assert!(err.contains("revoked"), "{err}");
    }

    /// Two copies of one refresh request sent at once (a client that retried before its
    /// first answer came) both get the tokens one of them made.
    #[tokio::test]
    async fn the_same_refresh_sent_twice_at_once_gets_one_answer() {
        let (server, client, r1) = granted(config()).await;
        let (a, b) = tokio::join!(
            refreshed(&server, &client, &r1, None),
            refreshed(&server, &client, &r1, None)
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a["refresh_token"], b["refresh_token"]);
        assert_eq!(a["access_token"], b["access_token"]);
        assert!(!revoked(&server).await);
    }

    /// A second use that is not the same request, or with no window, is reuse.
    #[tokio::test]
    async fn another_request_or_no_window_makes_a_second_use_reuse() {
        let (server, client, r1) = granted(config()).await;
        refreshed(&server, &client, &r1, None).await.unwrap();
        let err = refreshed(&server, &client, &r1, Some("read")).await;
        assert!(err.unwrap_err().contains("already used"));
        assert!(revoked(&server).await);

        let mut strict = config();
        strict.refresh_retry_window = Duration::ZERO;
        let (server, client, r1) = granted(strict).await;
        refreshed(&server, &client, &r1, None).await.unwrap();
        let err = refreshed(&server, &client, &r1, None).await;
        assert!(err.unwrap_err().contains("already used"));
        assert!(revoked(&server).await);
    }

    /// With refresh tokens that live longer than the kinds' own lifetimes (90 days for a
    /// family, 30 for a used token's marker), a refresh keeps both for a refresh token's
    /// lifetime: the family past its newest token, the marker to catch reuse.
    #[tokio::test]
    async fn a_family_and_a_used_refresh_token_outlive_a_long_refresh_token_ttl() {
        let ttl = Duration::from_secs(200 * 24 * 3600);
        let mut config = config();
        config.refresh_token_ttl = ttl;
        let (server, client, token) = granted(config).await;
        let records = &server.shared.records;
        refreshed(&server, &client, &token, None).await.unwrap();
        let floor = Some(after(now_millis(), ttl));
        let used = records
            .get::<Refresh>(REFRESH, &digest(&token))
            .await
            .unwrap()
            .unwrap();
        assert!(used.value.used);
        assert!(used.expires_at >= floor, "the used marker goes first");
        let family = records.get::<Family>(FAMILIES, "f").await.unwrap().unwrap();
        assert!(family.expires_at >= floor, "the family goes first");
    }

    /// What [`Faults`] does to the next write of a record in its namespace.
    enum Fault {
        /// Applies it, then fails as a connection lost with the answer does.
        LoseAnswer,
        /// Says it got there (`reached`), then waits for `go` before applying it.
        Pause {
            reached: Arc<tokio::sync::Notify>,
            go: Arc<tokio::sync::Notify>,
        },
    }

    /// A real store, but for the one record write a test picks ([`Faults::next`]).
    struct Faults {
        inner: Arc<dyn Store>,
        next: std::sync::Mutex<Option<(&'static str, Fault)>>,
    }

    impl Faults {
        async fn new() -> Arc<Self> {
            Arc::new(Faults {
                inner: throwaway().await,
                next: std::sync::Mutex::new(None),
            })
        }

        /// Does `fault` to the next write in `kind`'s namespace.
        fn next(&self, kind: Kind, fault: Fault) {
            *self.next.lock().unwrap() = Some((kind.namespace, fault));
        }

        /// Pauses the next write in `kind`'s namespace: it says when it got there, and
        /// waits to be told to go on.
        fn pause_next(&self, kind: Kind) -> (Arc<tokio::sync::Notify>, Arc<tokio::sync::Notify>) {
            let (reached, go) = (
                Arc::new(tokio::sync::Notify::new()),
                Arc::new(tokio::sync::Notify::new()),
            );
            let pause = Fault::Pause {
                reached: Arc::clone(&reached),
                go: Arc::clone(&go),
            };
            self.next(kind, pause);
            (reached, go)
        }
    }

    #[async_trait::async_trait]
    impl Store for Faults {
        fn backend(&self) -> &'static str {
            self.inner.backend()
        }
        async fn ping(&self) -> Result<(), StoreError> {
            self.inner.ping().await
        }
        async fn load_handle(&self, id: &str) -> Result<Option<HandleRecord>, StoreError> {
            self.inner.load_handle(id).await
        }
        async fn touch_handle(&self, id: &str, now: Millis) -> Result<(), StoreError> {
            self.inner.touch_handle(id, now).await
        }
        async fn begin(&self, mode: TxMode) -> Result<Box<dyn Transaction>, StoreError> {
            self.inner.begin(mode).await
        }
        async fn begin_idempotent(&self, claim: &Claim, now: Millis) -> Result<Begin, StoreError> {
            self.inner.begin_idempotent(claim, now).await
        }
        async fn replay_of(
            &self,
            claim: &Claim,
            now: Millis,
        ) -> Result<Option<String>, StoreError> {
            self.inner.replay_of(claim, now).await
        }
        async fn shared_keys(&self) -> Result<Vec<SharedKey>, StoreError> {
            self.inner.shared_keys().await
        }
        async fn add_shared_key(&self, key: &SharedKey) -> Result<(), StoreError> {
            self.inner.add_shared_key(key).await
        }
        async fn read_record(
            &self,
            namespace: &str,
            key: &str,
            now: Millis,
        ) -> Result<Option<Record>, StoreError> {
            self.inner.read_record(namespace, key, now).await
        }
        async fn write_record(
            &self,
            record: &NewRecord<'_>,
            write: Write,
            now: Millis,
        ) -> Result<Option<u64>, StoreError> {
            let fault = {
                let mut next = self.next.lock().unwrap();
                match &*next {
                    Some((namespace, _)) if *namespace == record.namespace => next.take(),
                    _ => None,
                }
            };
            match fault.map(|(_, fault)| fault) {
                None => self.inner.write_record(record, write, now).await,
                Some(Fault::LoseAnswer) => {
                    self.inner.write_record(record, write, now).await?;
                    Err(StoreError::Backend("the answer was lost".into()))
                }
                Some(Fault::Pause { reached, go }) => {
                    reached.notify_one();
                    go.notified().await;
                    self.inner.write_record(record, write, now).await
                }
            }
        }
        async fn delete_record(
            &self,
            namespace: &str,
            key: &str,
            version: Option<u64>,
        ) -> Result<bool, StoreError> {
            self.inner.delete_record(namespace, key, version).await
        }
        async fn records_of(
            &self,
            namespace: &str,
            owner: &str,
            now: Millis,
            limit: u32,
        ) -> Result<Vec<(String, Record)>, StoreError> {
            self.inner.records_of(namespace, owner, now, limit).await
        }
        async fn sweep(&self, now: Millis, batch: u32) -> Result<u64, StoreError> {
            self.inner.sweep(now, batch).await
        }
    }

    /// A code for `client`, approved by `user` (an upstream person, never signed out); and
    /// its PKCE verifier.
    async fn issue_code(
        server: &AuthorizationServer,
        client: &Client,
        user: &str,
    ) -> (String, String) {
        let (code, verifier) = (secret(), secret());
        let grant = CodeGrant {
            client_id: client.id.clone(),
            redirect_uri: "http://127.0.0.1:9/callback".into(),
            challenge: crate::pkce::challenge_for(&verifier),
            user: user.into(),
            scope: "read".into(),
            resource: "http://127.0.0.1:9/mcp".into(),
            issued_at: now_millis(),
            epoch: String::new(),
            consent: None,
            redeemed_into: None,
        };
        server
            .shared
            .records
            .put(CODES, &digest(&code), &grant, None, Write::Create, None)
            .await
            .unwrap();
        (code, verifier)
    }

    /// Redeems `code`: the answer's JSON, or the error's.
    async fn redeemed(
        server: &AuthorizationServer,
        client: &Client,
        code: &str,
        verifier: &str,
    ) -> Result<serde_json::Value, String> {
        let form = TokenForm {
            code: Some(code.to_owned()),
            code_verifier: Some(verifier.to_owned()),
            ..TokenForm::default()
        };
        answered(redeem_code(&server.shared, client, &form).await).await
    }

    /// The code was marked redeemed, but the store's answer was lost: the tokens made for
    /// it are handed out, and work. (They were thrown away and the family with them, and
    /// the client's retry was taken for a second redemption: the user had to sign in
    /// again.)
    #[tokio::test]
    async fn a_code_whose_mark_lost_its_answer_still_gets_its_tokens() {
        let faults = Faults::new().await;
        let (server, client, _) = granted_on(config(), faults.clone()).await;
        let (code, verifier) = issue_code(&server, &client, "idp:alice").await;
        faults.next(CODES, Fault::LoseAnswer);
        let tokens = redeemed(&server, &client, &code, &verifier)
            .await
            .expect("the tokens the mark was written for");
        let refresh = tokens["refresh_token"].as_str().unwrap();
        refreshed(&server, &client, refresh, None)
            .await
            .expect("the refresh token handed out is kept");
        let again = redeemed(&server, &client, &code, &verifier).await;
        assert!(again.unwrap_err().contains("already used"));
    }

    /// Client credentials under the Basic scheme, whatever the case of its name (RFC 9110
    /// §11.1); another scheme is refused.
    #[test]
    fn basic_credentials_are_read_under_any_case_of_the_scheme() {
        let encoded = STANDARD.encode("app:s%3Acret");
        for scheme in ["Basic", "basic", "BASIC"] {
            let mut headers = HeaderMap::new();
            let value = format!("{scheme} {encoded}");
            headers.insert(header::AUTHORIZATION, value.parse().unwrap());
            let read = basic_credentials(&headers).unwrap();
            assert_eq!(read, Some(("app".into(), "s:cret".into())), "{scheme}");
        }
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, "Bearer x".parse().unwrap());
        assert!(basic_credentials(&headers).is_err());
    }

    /// A rotation whose family write waits while its own retry collects the new refresh
    /// token and the client uses it (another rotation): it answers with its tokens, and the
    /// used token's record stays, so that a stolen copy of it presented later is still
    /// told from a new one. It used to take the family for revoked and delete that record.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rotation_overtaken_by_the_next_one_keeps_what_it_handed_out() {
        let faults = Faults::new().await;
        let (server, client, r1) = granted_on(config(), faults.clone()).await;
        let (reached, go) = faults.pause_next(FAMILIES);
        let (first, r2) = tokio::join!(refreshed(&server, &client, &r1, None), async {
            reached.notified().await;
            let retry = refreshed(&server, &client, &r1, None).await.unwrap();
            let r2 = retry["refresh_token"].as_str().unwrap().to_owned();
            refreshed(&server, &client, &r2, None).await.unwrap();
            go.notify_one();
            r2
        });
        let first = first.expect("the overtaken rotation's tokens");
        assert_eq!(first["refresh_token"], r2.as_str());
        let key = digest(&r2);
        let spent = server.shared.records.get::<Refresh>(REFRESH, &key).await;
        assert!(
            spent.unwrap().is_some_and(|r| r.value.used),
            "the used refresh token's record is gone"
        );
        assert!(!revoked(&server).await);
    }

    /// The user is signed out everywhere while their code is being redeemed, after its
    /// checks and before its token family is stored: the redemption gets nothing. (The
    /// sign-in was looked at before the family existed, and the sign-out's revocations,
    /// listed before it did, missed it: its access token was good for its lifetime.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_code_redeemed_while_its_user_is_signed_out_everywhere_gets_nothing() {
        let faults = Faults::new().await;
        let (server, client, _) = granted_on(config(), faults.clone()).await;
        let (code, verifier) = issue_code(&server, &client, "idp:alice").await;
        let (reached, go) = faults.pause_next(FAMILIES);
        let (redeemed, signed_out) =
            tokio::join!(redeemed(&server, &client, &code, &verifier), async {
                reached.notified().await;
                let removed = server.shared.users.remove("idp:alice").await;
                go.notify_one();
                removed
            });
        signed_out.unwrap();
        let err = redeemed.expect_err("tokens for a user signed out everywhere");
        assert!(err.contains("signed out"), "{err}");
    }
}
