//! Sign-in delegated to an upstream OpenID provider: the sign-in page offers "Sign in with
//! …", which runs an authorization code flow with PKCE against the provider (this server is
//! its client), checks the ID token it returns (signature against the provider's keys,
//! issuer, audience, nonce, expiry), and signs the person in here as `<name>:<sub>`. The
//! upstream round trip is bound to the browser that started it, like the pending request.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{DecodingKey, Validation};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::OnceCell;
use url::Url;
use wharf::store::Write;
use wharf_auth::HttpClients;

use super::authorize::{ConsentQuery, start_session, too_many};
use super::html;
use super::token::Peer;
use super::{Shared, constant_eq, cookies};
use crate::records::{UPSTREAM, digest, secret};

/// The upstream provider this server signs people in with. Its `Debug` output leaves the
/// client secret out.
#[derive(Clone)]
#[non_exhaustive]
pub struct UpstreamConfig {
    /// Its issuer identifier (its metadata is at `/.well-known/openid-configuration`):
    /// https, or http on a loopback host, as are the endpoints its metadata names. Sign-ins
    /// through a provider that is not are refused (503, the reason logged).
    pub issuer: String,
    /// This server's client id there.
    pub client_id: String,
    /// Its client secret there, if it is a confidential client (sent as HTTP Basic).
    pub client_secret: Option<String>,
    /// What the button says ("Sign in with NAME"), and the prefix of its users' names here.
    pub name: String,
}

impl UpstreamConfig {
    /// The provider at `issuer`, where this server is the public client `client_id`; its
    /// button says "Sign in with OpenID".
    pub fn new(issuer: impl Into<String>, client_id: impl Into<String>) -> Self {
        Self {
            issuer: issuer.into(),
            client_id: client_id.into(),
            client_secret: None,
            name: "OpenID".into(),
        }
    }
}

impl std::fmt::Debug for UpstreamConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamConfig")
            .field("issuer", &self.issuer)
            .field("client_id", &self.client_id)
            .field(
                "client_secret",
                &self.client_secret.as_ref().map(|_| "<set>"),
            )
            .field("name", &self.name)
            .finish()
    }
}

/// What this server remembers between sending the person upstream and their return (no
/// `Debug`: it holds the PKCE verifier and the nonce).
#[derive(Serialize, Deserialize)]
struct Roundtrip {
    request: String,
    browser: String,
    verifier: String,
    nonce: String,
}

#[derive(Debug, Deserialize)]
struct ProviderMetadata {
    issuer: String,
    authorization_endpoint: String,
    token_endpoint: String,
    jwks_uri: String,
}

/// The provider's client: its metadata, read once.
#[derive(Debug)]
pub(crate) struct Upstream {
    config: UpstreamConfig,
    http: HttpClients,
    metadata: OnceCell<ProviderMetadata>,
}

impl Upstream {
    pub(crate) fn new(config: UpstreamConfig) -> Self {
        // A provider on this machine is reached directly, whatever the environment's proxy.
        let http = HttpClients::new(|| {
            reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .connect_timeout(Duration::from_secs(5))
                .timeout(Duration::from_secs(10))
        })
        .unwrap_or_default();
        Self {
            config,
            http,
            metadata: OnceCell::new(),
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.config.name
    }

    async fn metadata(&self) -> Result<&ProviderMetadata, String> {
        self.metadata
            .get_or_try_init(|| async {
                // The person's browser, the code and this server's secret go where the
                // metadata says: OpenID Connect Discovery 1.0 §3 has every one over TLS.
                let insecure = |what: &str, url: &str| {
                    format!("the upstream provider's {what} {url:?} is not https (plain http only on a loopback host)")
                };
                if !wharf_auth::is_secure_url(&self.config.issuer) {
                    return Err(insecure("issuer", &self.config.issuer));
                }
                let url = format!(
                    "{}/.well-known/openid-configuration",
                    self.config.issuer.trim_end_matches('/')
                );
                let metadata: ProviderMetadata = self
                    .http
                    .to(&url)
                    .get(&url)
                    .send()
                    .await
                    .and_then(reqwest::Response::error_for_status)
                    .map_err(|e| format!("{url}: {e}"))?
                    .json()
                    .await
                    .map_err(|e| format!("{url}: {e}"))?;
                if metadata.issuer != self.config.issuer {
                    return Err(format!(
                        "{url} names issuer {:?}, not {:?}",
                        metadata.issuer, self.config.issuer
                    ));
                }
                for (what, url) in [
                    ("authorization_endpoint", &metadata.authorization_endpoint),
                    ("token_endpoint", &metadata.token_endpoint),
                    ("jwks_uri", &metadata.jwks_uri),
                ] {
                    if !wharf_auth::is_secure_url(url) {
                        return Err(insecure(what, url));
                    }
                }
                Ok(metadata)
            })
            .await
    }
}

/// `GET /authorize/upstream?request=…`: off to the provider.
pub(crate) async fn start(
    State(shared): State<Arc<Shared>>,
    Peer(peer): Peer,
    headers: HeaderMap,
    Query(query): Query<ConsentQuery>,
) -> Response {
    let Some(upstream) = &shared.upstream else {
        return html::error(
            StatusCode::NOT_FOUND,
            "No upstream sign-in",
            "This server signs people in with its own accounts.",
        );
    };
    // Only a request from the sign-in's own browser counts (a page elsewhere cannot spend
    // this address's budget). Then it is a sign-in attempt like a password's, and each one
    // stores a round trip for ten minutes: one pending request must not be replayed into
    // unbounded records.
    if let Err(response) = super::authorize::load(&shared, &headers, &query.request, None).await {
        return response;
    }
    if !shared.limits.sign_ins.allows(peer) {
        return too_many();
    }
    let metadata = match upstream.metadata().await {
        Ok(m) => m,
        Err(err) => return unavailable(&err),
    };
    let browser = cookies::get(&headers, shared.cookie(cookies::BROWSER)).unwrap_or_default();
    let roundtrip = Roundtrip {
        request: query.request.clone(),
        browser: digest(browser),
        verifier: secret(),
        nonce: secret(),
    };
    let state = secret();
    match shared
        .records
        .put(
            UPSTREAM,
            &digest(&state),
            &roundtrip,
            None,
            Write::Create,
            None,
        )
        .await
    {
        Ok(Some(_)) => {}
        _ => return unavailable("the store did not answer"),
    }
    let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(roundtrip.verifier.as_bytes()));
    let Ok(mut url) = Url::parse(&metadata.authorization_endpoint) else {
        return unavailable("the provider's authorization endpoint is not a URL");
    };
    url.query_pairs_mut()
        .append_pair("response_type", "code")
        .append_pair("client_id", &upstream.config.client_id)
        .append_pair("redirect_uri", &callback_uri(&shared))
        .append_pair("scope", "openid")
        .append_pair("state", &state)
        .append_pair("nonce", &roundtrip.nonce)
        .append_pair("code_challenge", &challenge)
        .append_pair("code_challenge_method", "S256");
    Redirect::to(url.as_str()).into_response()
}

/// The provider's answer (no `Debug`: it holds the code).
#[derive(Deserialize)]
pub(crate) struct CallbackQuery {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
    error_description: Option<String>,
}

/// `GET /authorize/upstream/callback`: the provider sent the person back.
pub(crate) async fn callback(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(query): Query<CallbackQuery>,
) -> Response {
    let Some(upstream) = &shared.upstream else {
        return html::error(StatusCode::NOT_FOUND, "No upstream sign-in", "");
    };
    let Some(state) = query.state.as_deref() else {
        return html::error(
            StatusCode::BAD_REQUEST,
            "Sign-in failed",
            "The provider's answer has no state.",
        );
    };
    // The state is used once: taken before anything else is looked at.
    let key = digest(state);
    let roundtrip = match shared.records.get::<Roundtrip>(UPSTREAM, &key).await {
        Ok(Some(found)) => found.value,
        Ok(None) => {
            return html::error(
                StatusCode::BAD_REQUEST,
                "This sign-in has expired",
                "Start again from the application.",
            );
        }
        Err(_) => return unavailable("the store did not answer"),
    };
    if !matches!(shared.records.delete(UPSTREAM, &key).await, Ok(true)) {
        return html::error(
            StatusCode::BAD_REQUEST,
            "This sign-in was already used",
            "Start again from the application.",
        );
    }
    let same_browser = cookies::get(&headers, shared.cookie(cookies::BROWSER))
        .is_some_and(|b| constant_eq(&digest(b), &roundtrip.browser));
    if !same_browser {
        return html::error(
            StatusCode::FORBIDDEN,
            "This sign-in did not start in this browser",
            "Start again from the application.",
        );
    }
    if let Some(error) = &query.error {
        let detail = format!(
            "{}: {}",
            error,
            query.error_description.as_deref().unwrap_or_default()
        );
        return html::error(
            StatusCode::FORBIDDEN,
            &format!("{} refused the sign-in", upstream.name()),
            &detail,
        );
    }
    let Some(code) = query.code.as_deref() else {
        return html::error(
            StatusCode::BAD_REQUEST,
            "Sign-in failed",
            "The provider's answer has no code.",
        );
    };
    let subject = match redeem(&shared, upstream, code, &roundtrip).await {
        Ok(subject) => subject,
        Err(err) => {
            return html::error(
                StatusCode::BAD_GATEWAY,
                &format!("Sign-in with {} failed", upstream.name()),
                &err,
            );
        }
    };
    let user = format!("{}:{subject}", upstream.name());
    // The epoch an administrator's sign-out (`wharf user remove`) last gave them, so that
    // this session counts and what came before it does not.
    let Ok(epoch) = shared.users.upstream_epoch(&user).await else {
        return unavailable("the store did not answer");
    };
    start_session(&shared, &user, &roundtrip.request, epoch).await
}

/// Exchanges the provider's code and checks its ID token; the person's `sub` there.
async fn redeem(
    shared: &Shared,
    upstream: &Upstream,
    code: &str,
    roundtrip: &Roundtrip,
) -> Result<String, String> {
    let metadata = upstream.metadata().await?;
    let callback = callback_uri(shared);
    let form = [
        ("grant_type", "authorization_code"),
        ("code", code),
        ("redirect_uri", callback.as_str()),
        ("code_verifier", roundtrip.verifier.as_str()),
        ("client_id", upstream.config.client_id.as_str()),
    ];
    let mut request = upstream
        .http
        .to(&metadata.token_endpoint)
        .post(&metadata.token_endpoint)
        .form(&form);
    if let Some(secret) = &upstream.config.client_secret {
        request = wharf_auth::oauth::client_basic_auth(request, &upstream.config.client_id, secret);
    }
    let response = request
        .send()
        .await
        .map_err(|e| format!("token request: {e}"))?;
    let status = response.status();
    let body: Value = response
        .json()
        .await
        .map_err(|e| format!("token response: {e}"))?;
    if !status.is_success() {
        return Err(format!(
            "the provider's token endpoint answered {status}: {body}"
        ));
    }
    let id_token = body["id_token"]
        .as_str()
        .ok_or("the provider sent no id_token")?;
    let header = jsonwebtoken::decode_header(id_token).map_err(|e| format!("id_token: {e}"))?;
    let keys: JwkSet = upstream
        .http
        .to(&metadata.jwks_uri)
        .get(&metadata.jwks_uri)
        .send()
        .await
        .map_err(|e| format!("the provider's keys: {e}"))?
        .json()
        .await
        .map_err(|e| format!("the provider's keys: {e}"))?;
    let jwk = match &header.kid {
        Some(kid) => keys.find(kid),
        None => keys.keys.first(),
    }
    .ok_or("no key of the provider's signed the id_token")?;
    let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("the provider's key: {e}"))?;
    let mut validation = Validation::new(header.alg);
    validation.set_issuer(&[metadata.issuer.as_str()]);
    validation.set_audience(&[upstream.config.client_id.as_str()]);
    validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
    validation.leeway = 30;
    let claims = jsonwebtoken::decode::<Value>(id_token, &key, &validation)
        .map_err(|e| format!("id_token: {e}"))?
        .claims;
    if claims["nonce"]
        .as_str()
        .is_none_or(|n| !constant_eq(n, &roundtrip.nonce))
    {
        return Err("the id_token's nonce is not the one this sign-in sent".into());
    }
    claims["sub"]
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| "the id_token has no sub".into())
}

fn callback_uri(shared: &Shared) -> String {
    shared.endpoint("/authorize/upstream/callback")
}

fn unavailable(detail: &str) -> Response {
    tracing::warn!(%detail, "upstream sign-in unavailable");
    html::error(
        StatusCode::BAD_GATEWAY,
        "The sign-in provider cannot be reached",
        "Try again in a moment.",
    )
}
