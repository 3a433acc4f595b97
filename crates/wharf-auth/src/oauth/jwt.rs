//! JWT access tokens verified locally against the issuer's JWKS, fetched over HTTP or read
//! from an authorization server in this process.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode, decode_header};
use serde_json::{Map, Value};
use wharf::Grant;

use super::{Checked, PublishedKeys, audience_ok, numeric_date, scopes_of, subject_of};
use crate::AuthError;

/// The signature algorithms accepted: asymmetric only, so `none` and HMAC (with a public key
/// as the secret) never verify.
const ACCEPTED: [Algorithm; 3] = [Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA];

/// Checks JWTs against the issuer's keys, fetched when a token names one it lacks.
#[derive(Debug)]
pub(crate) struct JwtChecker(Arc<KeySource>);

/// Where keys come from and the keys known; shared with a fetch running on its own task.
#[derive(Debug)]
struct KeySource {
    origin: KeyOrigin,
    issuer: String,
    keys: RwLock<Keys>,
    /// Serializes fetches, so a burst of tokens with a new key id fetches once.
    fetching: Arc<tokio::sync::Mutex<()>>,
    min_refresh: Duration,
    max_age: Duration,
}

/// Where the key set is read.
#[derive(Debug)]
pub(crate) enum KeyOrigin {
    /// Fetched over HTTP.
    Fetched(Fetch),
    /// Read from an authorization server in this process.
    Published(Arc<dyn PublishedKeys>),
}

impl KeyOrigin {
    /// Keys fetched with `http` from `jwks_uri`, or from the one the issuer's metadata names.
    pub(crate) fn fetched(http: super::HttpClients, jwks_uri: Option<String>) -> Self {
        KeyOrigin::Fetched(Fetch {
            http,
            configured: jwks_uri,
            learned: RwLock::new(None),
        })
    }
}

/// Fetches the issuer's key set over HTTP.
#[derive(Debug)]
pub(crate) struct Fetch {
    http: super::HttpClients,
    /// The JWKS URI the operator gave, if any.
    configured: Option<String>,
    /// Otherwise, the one the issuer's metadata named, once learned.
    learned: RwLock<Option<String>>,
}

/// Keys a token is checked against at most: those that share its `kid`, or, without one,
/// those of its algorithm.
const MAX_CANDIDATES: usize = 4;

#[derive(Default)]
struct Keys {
    /// The keys this server can use, in the order the set lists them, with their ids (RFC
    /// 7517 §4.5 lets keys of different types share one; some have none).
    listed: Vec<(Option<String>, Algorithm, DecodingKey)>,
    /// Which read of the set this is: a check that tried an earlier one tries this one.
    generation: u64,
    /// When the set was last fetched, or tried.
    attempted_at: Option<Instant>,
    /// When the set was last fetched.
    fetched_at: Option<Instant>,
    /// Whether that attempt failed (or never finished): until the next attempt, the server
    /// cannot know which keys the issuer publishes.
    attempt_failed: bool,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys")
            .field(
                "kids",
                &self.listed.iter().map(|(kid, ..)| kid).collect::<Vec<_>>(),
            )
            .field("attempt_failed", &self.attempt_failed)
            .finish()
    }
}

impl JwtChecker {
    pub(crate) fn new(
        origin: KeyOrigin,
        issuer: String,
        min_refresh: Duration,
        max_age: Duration,
    ) -> Self {
        JwtChecker(Arc::new(KeySource {
            origin,
            issuer,
            keys: RwLock::new(Keys::default()),
            fetching: Arc::default(),
            min_refresh,
            max_age: max_age.max(min_refresh),
        }))
    }

    /// Fetches the key set again (at most once per `min_refresh`) on its own task: a client
    /// that hangs up must not leave an attempt counted but never made, which would refuse
    /// every new key for the rest of the interval.
    async fn refresh(&self) -> Result<(), AuthError> {
        // The turn is waited for here, not on a task: a client that hangs up meanwhile
        // leaves nothing queued (while an issuer times out, a task per request would pile
        // up). Once taken, it goes with the fetch, which then runs to its end.
        let turn = Arc::clone(&self.0.fetching).lock_owned().await;
        let source = Arc::clone(&self.0);
        tokio::spawn(async move {
            let _turn = turn;
            source.fetch_held().await
        })
        .await
        .map_err(|_| AuthError::Unavailable)?
    }

    pub(crate) async fn check(
        &self,
        token: &str,
        audiences: &[String],
        leeway: Duration,
    ) -> Result<Checked, AuthError> {
        let header = decode_header(token).map_err(|_| refused_header(token))?;
        if !ACCEPTED.contains(&header.alg) {
            return Err(AuthError::UnsupportedAlgorithm);
        }
        // An access token (RFC 9068 `at+jwt`) or an untyped JWT; nothing else that happens
        // to be signed by the same issuer (a DPoP proof, a logout token). An ID token is
        // typed `JWT` or not at all, like many access tokens: what only it carries tells it
        // apart below.
        let typ = header.typ.as_deref().map(str::to_ascii_lowercase);
        let typed_access = matches!(typ.as_deref(), Some("at+jwt" | "application/at+jwt"));
        if !typed_access && typ.as_deref().is_some_and(|t| t != "jwt") {
            return Err(AuthError::NotAnAccessToken);
        }
        let (kid, alg) = (header.kid.as_deref(), header.alg);
        // Read before the keys: a set read after it is tried too (below), never one missed.
        let tried = self.0.generation();
        let keys = match self.0.key(kid, alg) {
            Some(k) if !self.0.is_stale() && !self.0.outlived() => k,
            // The issuer could not be asked last time: it is asked again behind this
            // request, which is not held up by an outage; what it last published stands,
            // for a while (see `outlived`).
            Some(k) if self.0.last_attempt_failed() => {
                let source = Arc::clone(&self.0);
                tokio::spawn(async move { source.refresh_unless_running().await });
                if self.0.outlived() {
                    return Err(AuthError::Unavailable);
                }
                k
            }
            // The set is past its age: ask the issuer again whether it still publishes the
            // key. While it cannot be reached, what it last published stands, for a while.
            Some(k) => match self.refresh().await {
                Ok(_) => self.0.key(kid, alg).ok_or(AuthError::UnknownKey)?,
                Err(_) if self.0.outlived() => return Err(AuthError::Unavailable),
                Err(_) => k,
            },
            None => {
                self.refresh().await?;
                self.0.key(kid, alg).ok_or(AuthError::UnknownKey)?
            }
        };
        use jsonwebtoken::errors::ErrorKind as K;
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&self.0.issuer]);
        // The audience is checked below, against every accepted value.
        validation.validate_aud = false;
        validation.validate_nbf = true;
        validation.leeway = leeway.as_secs();
        validation.set_required_spec_claims(&["exp", "iss", "sub"]);
        // The signature is verified before the claims: any other error is the claims', with
        // the key that signed the token.
        let verify = |keys: &[DecodingKey]| {
            keys.iter()
                .map(|key| decode::<Map<String, Value>>(token, key, &validation))
                .find(|r| !matches!(r, Err(e) if *e.kind() == K::InvalidSignature))
                .unwrap_or_else(|| Err(K::InvalidSignature.into()))
        };
        let mut verified = verify(&keys);
        let unverified = |r: &Result<_, jsonwebtoken::errors::Error>| matches!(r, Err(e) if *e.kind() == K::InvalidSignature);
        if kid.is_none() && unverified(&verified) {
            // A key published since the set was read names no `kid` the cache could miss:
            // the set is read again (at most once per `min_refresh`) and the token tried
            // against it; one no key verifies may yet be signed by a key published later, so
            // it is refused as signed by an unknown key, which is not remembered.
            // An issuer that cannot be asked says nothing of the token (503, as for a kid the
            // set lacks). Keys read since (by this request or another) are tried; the same
            // keys are not tried twice.
            self.refresh().await?;
            if self.0.generation() != tried {
                if let Some(fresh) = self.0.key(None, alg) {
                    verified = verify(&fresh);
                }
            }
            if unverified(&verified) {
                return Err(AuthError::UnknownKey);
            }
        }
        let data = verified.map_err(|e| match e.kind() {
            K::ExpiredSignature => AuthError::Expired,
            K::ImmatureSignature => AuthError::NotYetValid,
            K::InvalidIssuer => AuthError::WrongIssuer,
            K::InvalidSignature => AuthError::BadSignature,
            _ => AuthError::InvalidToken,
        })?;
        let claims = data.claims;
        if !audience_ok(claims.get("aud"), audiences) {
            return Err(AuthError::WrongAudience);
        }
        // An OpenID Connect ID token says who signed in to a client and is no access token,
        // even where its audience (a client id) is accepted as this server's. What gives it
        // away: the hashes binding it to a code or an access token, Keycloak's `typ: "ID"`,
        // or a `nonce` without any scope (Keycloak before 26 copies the nonce into access
        // tokens too, which carry their scopes).
        if !typed_access && is_id_token(&claims) {
            return Err(AuthError::NotAnAccessToken);
        }
        // Accepting a bound token as a bearer token would let whoever holds it use it
        // without the key it is bound to.
        if claims.contains_key("cnf") {
            return Err(AuthError::SenderConstrained);
        }
        // Verified present and numeric by the JWT library, which accepts a token during the
        // second of its `exp` and rounds a fraction up: RFC 7519 §4.1.4 has it refused on
        // or after `exp` (past the leeway), as an introspected one is.
        let expires_at = claims.get("exp").and_then(numeric_date).unwrap_or(0);
        if expires_at.saturating_add(leeway.as_secs()) <= super::now_secs() {
            return Err(AuthError::Expired);
        }
        let text = |k: &str| claims.get(k).and_then(Value::as_str).map(str::to_owned);
        let subject = subject_of(&claims)?;
        Ok(Checked {
            session: text("sid"),
            expires_at,
            grant: Grant {
                issuer: self.0.issuer.clone(),
                subject,
                client_id: text("client_id").or_else(|| text("azp")),
                scopes: scopes_of(&claims),
            },
        })
    }
}

/// Whether `claims` are an OpenID Connect ID token's (see `check`).
fn is_id_token(claims: &Map<String, Value>) -> bool {
    let has = |k: &str| claims.contains_key(k);
    has("at_hash")
        || has("c_hash")
        || claims.get("typ").and_then(Value::as_str) == Some("ID")
        || (has("nonce") && !has("scope") && !has("scp"))
}

impl KeySource {
    /// The cached keys a token signed with `alg` may have been signed with: those with id
    /// `kid`, or, for a token without one, every key of that algorithm (as while an issuer
    /// rotates its keys), the first [`MAX_CANDIDATES`] the set lists. `None` when there is
    /// none.
    fn key(&self, kid: Option<&str>, alg: Algorithm) -> Option<Vec<DecodingKey>> {
        let keys = self.keys.read().unwrap_or_else(|p| p.into_inner());
        let found: Vec<DecodingKey> = keys
            .listed
            .iter()
            .filter(|(id, a, _)| *a == alg && kid.is_none_or(|k| id.as_deref() == Some(k)))
            // Each candidate costs a signature check: a token must not make a request pay
            // for every key a large set holds.
            .take(MAX_CANDIDATES)
            .map(|(.., key)| key.clone())
            .collect();
        (!found.is_empty()).then_some(found)
    }

    /// Which read of the set the cache holds.
    fn generation(&self) -> u64 {
        self.keys
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .generation
    }

    /// Whether the last attempt to fetch the set failed.
    fn last_attempt_failed(&self) -> bool {
        self.keys
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .attempt_failed
    }

    /// Whether the set was last fetched twice `max_age` ago or longer: while the issuer
    /// cannot be reached, what it last published stands that long and no longer, so that a
    /// key it withdrew (a leaked one) is not accepted for as long as someone can keep this
    /// server from asking (503 until it answers).
    fn outlived(&self) -> bool {
        let keys = self.keys.read().unwrap_or_else(|p| p.into_inner());
        keys.fetched_at
            .is_some_and(|t| t.elapsed() >= self.max_age.saturating_mul(2))
    }

    /// Whether the set is due to be fetched again: it was fetched longer than `max_age`
    /// ago, or the last attempt failed longer than `min_refresh` ago (one failed fetch must
    /// not keep a key the issuer withdrew for another whole `max_age`).
    fn is_stale(&self) -> bool {
        let keys = self.keys.read().unwrap_or_else(|p| p.into_inner());
        let due = if keys.attempt_failed {
            self.min_refresh
        } else {
            self.max_age
        };
        keys.attempted_at.is_some_and(|t| t.elapsed() >= due)
    }

    /// A fetch (see `JwtChecker::refresh`) for no one waiting on it, unless one runs already
    /// (whose answer will do): while the issuer cannot be reached, one of these per request
    /// would queue without bound behind fetches that each take their whole timeout.
    async fn refresh_unless_running(&self) {
        if let Ok(_one) = self.fetching.try_lock() {
            let _ = self.fetch_held().await;
        }
    }

    /// Fetches the key set again, unless it was fetched less than `min_refresh` ago;
    /// `fetching` held.
    async fn fetch_held(&self) -> Result<(), AuthError> {
        {
            // Every attempt counts, failed or not: tokens with made-up key ids cannot make
            // this server fetch more than once per interval, however the issuer answers.
            let mut keys = self.keys.write().unwrap_or_else(|p| p.into_inner());
            if keys
                .attempted_at
                .is_some_and(|t| t.elapsed() < self.min_refresh)
            {
                // After a failed attempt, a key missing from the set says nothing about the
                // token: the issuer could not be asked (503), it did not disown the key (401).
                return if keys.attempt_failed {
                    Err(AuthError::Unavailable)
                } else {
                    Ok(())
                };
            }
            keys.attempted_at = Some(Instant::now());
            // Until the set arrives (a fetch that errs leaves it so).
            keys.attempt_failed = true;
        }
        let set = match &self.origin {
            KeyOrigin::Fetched(fetch) => fetch.key_set(&self.issuer).await?,
            KeyOrigin::Published(keys) => keys.jwk_set().await?,
        };
        let Some(entries) = set.get("keys").and_then(Value::as_array) else {
            tracing::warn!(issuer = %self.issuer, "the issuer's key set is not a JWK Set");
            return Err(AuthError::Unavailable);
        };
        let mut fresh = Keys {
            attempted_at: Some(Instant::now()),
            fetched_at: Some(Instant::now()),
            ..Keys::default()
        };
        // Each key is read on its own: one this library cannot read (an encryption key, a
        // curve or algorithm it lacks) is ignored (RFC 7517 §5), not a reason to lose the
        // whole set.
        for entry in entries {
            let jwk: Jwk = match serde_json::from_value(entry.clone()) {
                Ok(jwk) => jwk,
                Err(err) => {
                    let kid = entry.get("kid").and_then(Value::as_str);
                    tracing::debug!(issuer = %self.issuer, kid, error = %err, "a key in the issuer's set is skipped: it does not parse");
                    continue;
                }
            };
            let Some((alg, key)) = decoding_key(&jwk) else {
                continue;
            };
            fresh.listed.push((jwk.common.key_id.clone(), alg, key));
        }
        let mut keys = self.keys.write().unwrap_or_else(|p| p.into_inner());
        fresh.generation = keys.generation.wrapping_add(1);
        *keys = fresh;
        Ok(())
    }
}

impl Fetch {
    /// The key set `issuer` publishes.
    async fn key_set(&self, issuer: &str) -> Result<Value, AuthError> {
        let uri = self.jwks_uri(issuer).await?;
        self.get_json(&uri).await
    }

    /// The JWKS URI: configured, or from `issuer`'s metadata (RFC 8414, then OpenID Connect
    /// discovery), whose `issuer` must be the configured one.
    async fn jwks_uri(&self, configured: &str) -> Result<String, AuthError> {
        if let Some(uri) = &self.configured {
            return Ok(uri.clone());
        }
        if let Some(uri) = self
            .learned
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return Ok(uri);
        }
        let issuer = configured.trim_end_matches('/');
        let (origin, path) = split_origin(issuer);
        let candidates = [
            format!("{origin}/.well-known/oauth-authorization-server{path}"),
            format!("{issuer}/.well-known/openid-configuration"),
        ];
        for url in candidates {
            let Ok(meta) = self.get_json(&url).await else {
                continue;
            };
            // Identical (RFC 8414 §3.3): tokens' `iss` is compared exactly, so metadata that
            // passed with any difference would lead to every token being refused.
            let named = meta.get("issuer").and_then(Value::as_str);
            let same_issuer = named == Some(configured);
            if let Some(named) = named.filter(|n| !same_issuer && n.trim_end_matches('/') == issuer)
            {
                tracing::warn!(
                    configured = %configured,
                    metadata = %named,
                    "the issuer's metadata names the issuer {named:?}, which differs from the configured one by a trailing slash; configure exactly {named:?}"
                );
                return Err(AuthError::Unavailable);
            }
            if let (true, Some(uri)) = (same_issuer, meta.get("jwks_uri").and_then(Value::as_str)) {
                // An issuer on https names keys on https: not a plain request to a service
                // on this host.
                let downgraded = configured.starts_with("https://") && !uri.starts_with("https://");
                if downgraded || !super::is_secure_url(uri) {
                    // Keys over plain HTTP from another host could come from anyone.
                    tracing::warn!(
                        jwks_uri = uri,
                        "the issuer's metadata names an insecure jwks_uri"
                    );
                    return Err(AuthError::Unavailable);
                }
                *self.learned.write().unwrap_or_else(|p| p.into_inner()) = Some(uri.to_owned());
                return Ok(uri.to_owned());
            }
        }
        tracing::warn!(issuer = %configured, "no usable authorization server metadata (jwks_uri)");
        Err(AuthError::Unavailable)
    }

    async fn get_json(&self, url: &str) -> Result<Value, AuthError> {
        let res = self.http.to(url).get(url).send().await.map_err(|e| {
            tracing::warn!(url, error = %e, "cannot reach the authorization server");
            AuthError::Unavailable
        })?;
        if !res.status().is_success() {
            tracing::warn!(url, status = %res.status(), "authorization server refused a fetch");
            return Err(AuthError::Unavailable);
        }
        super::json_at_most(res, super::MAX_KEYS_BODY)
            .await
            .ok_or(AuthError::Unavailable)
    }
}

/// A verification key and the one algorithm it may verify, from a JWK: RSA keys for RS256,
/// P-256 keys for ES256, Ed25519 keys for EdDSA. A key whose `alg` says otherwise is skipped.
fn decoding_key(jwk: &Jwk) -> Option<(Algorithm, DecodingKey)> {
    // Only signing keys.
    if jwk
        .common
        .public_key_use
        .as_ref()
        .is_some_and(|u| *u != jsonwebtoken::jwk::PublicKeyUse::Signature)
    {
        return None;
    }
    let alg = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => Algorithm::ES256,
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
            Algorithm::EdDSA
        }
        _ => return None,
    };
    let declared = jwk.common.key_algorithm.map(|a| match a {
        KeyAlgorithm::RS256 => Some(Algorithm::RS256),
        KeyAlgorithm::ES256 => Some(Algorithm::ES256),
        KeyAlgorithm::EdDSA => Some(Algorithm::EdDSA),
        _ => None,
    });
    if declared.is_some_and(|d| d != Some(alg)) {
        return None;
    }
    DecodingKey::from_jwk(jwk).ok().map(|k| (alg, k))
}

/// `(scheme://authority, /path)` of an issuer URL.
fn split_origin(url: &str) -> (&str, &str) {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    match url[after_scheme..].find('/') {
        Some(i) => url.split_at(after_scheme + i),
        None => (url, ""),
    }
}

/// Why a JWT header the JWT library cannot read is refused: a readable header naming an
/// algorithm the library does not know (`none`, say) is an unsupported algorithm, so the
/// client learns that rather than a bare "not valid"; any other unreadable header is not
/// valid.
fn refused_header(token: &str) -> AuthError {
    use base64::Engine as _;
    let alg = token
        .split('.')
        .next()
        .and_then(|h| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(h)
                .ok()
        })
        .and_then(|h| serde_json::from_slice::<serde_json::Value>(&h).ok())
        .is_some_and(|h| {
            h.get("alg").is_some_and(|a| {
                a.is_string() && serde_json::from_value::<Algorithm>(a.clone()).is_err()
            })
        });
    if alg {
        AuthError::UnsupportedAlgorithm
    } else {
        AuthError::InvalidToken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What only ID tokens carry refuses them; a Keycloak access token (before 26) with the
    /// sign-in's `nonce` and its scopes passes.
    #[test]
    fn id_tokens_are_told_from_access_tokens() {
        let claims = |v: serde_json::Value| v.as_object().unwrap().clone();
        for id_token in [
            serde_json::json!({ "sub": "a", "nonce": "n" }),
            serde_json::json!({ "sub": "a", "at_hash": "h", "scope": "openid" }),
            serde_json::json!({ "sub": "a", "c_hash": "h" }),
            serde_json::json!({ "sub": "a", "typ": "ID", "scope": "openid" }),
        ] {
            assert!(is_id_token(&claims(id_token.clone())), "{id_token}");
        }
        for access in [
            serde_json::json!({ "sub": "a", "nonce": "n", "typ": "Bearer", "scope": "openid profile" }),
            serde_json::json!({ "sub": "a", "nonce": "n", "scp": ["read"] }),
            serde_json::json!({ "sub": "a", "scope": "read" }),
        ] {
            assert!(!is_id_token(&claims(access.clone())), "{access}");
        }
    }
    use base64::Engine as _;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use crate::oauth::peer::{self, Answer};

    /// A JWT naming key `kid`: refused for its key before its signature is looked at.
    fn token_with_kid(kid: &str) -> String {
        let part =
            |v: Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        format!(
            "{}.{}.c2ln",
            part(serde_json::json!({ "alg": "ES256", "typ": "JWT", "kid": kid })),
            part(serde_json::json!({ "sub": "alice" }))
        )
    }

    /// A checker for `https://as.example.com` with keys from `origin`, read again at most
    /// every ten minutes unless a key is unknown.
    fn checker(origin: KeyOrigin) -> JwtChecker {
        JwtChecker::new(
            origin,
            "https://as.example.com".into(),
            Duration::from_secs(600),
            Duration::from_secs(3600),
        )
    }

    /// Keys fetched from `url`.
    fn fetching(url: String) -> KeyOrigin {
        KeyOrigin::fetched(
            crate::HttpClients::new(reqwest::Client::builder).unwrap(),
            Some(url),
        )
    }

    /// A JWKS endpoint answering as `answer` says: its URL and how many requests it got.
    async fn jwks(answer: Answer) -> (String, Arc<AtomicUsize>) {
        let peer = peer::start(|_| answer).await;
        (format!("{}/jwks", peer.origin), peer.requests)
    }

    #[tokio::test]
    async fn within_the_interval_after_a_failed_fetch_keys_are_unavailable_not_unknown() {
        let (url, requests) = jwks(Answer::Every(peer::empty("500 Internal Server Error"))).await;
        let checker = checker(fetching(url));
        let audiences = ["https://mcp.example.com/mcp".to_owned()];
        for kid in ["a", "a", "b"] {
            let refused = checker
                .check(&token_with_kid(kid), &audiences, Duration::ZERO)
                .await
                .unwrap_err();
            assert_eq!(refused, AuthError::Unavailable, "{kid}");
        }
        assert_eq!(
            requests.load(Ordering::SeqCst),
            1,
            "one attempt per interval"
        );
    }

    /// Keys the test hands over when it says so: a fetch that hangs, as from an issuer that
    /// does not answer.
    #[derive(Debug, Default)]
    struct Stalled {
        release: tokio::sync::Notify,
        fetches: AtomicUsize,
    }

    impl PublishedKeys for Stalled {
        fn jwk_set(
            &self,
        ) -> std::pin::Pin<Box<dyn Future<Output = Result<Value, AuthError>> + Send + '_>> {
            self.fetches.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                self.release.notified().await;
                Ok(serde_json::json!({ "keys": [] }))
            })
        }
    }

    /// Requests for unknown keys whose clients hang up while the key set is being fetched
    /// leave nothing behind: they waited for that fetch themselves, not on tasks of their
    /// own, which would pile up for as long as an issuer takes to time out.
    #[tokio::test]
    async fn callers_that_hang_up_during_a_fetch_leave_no_task_behind() {
        let keys = Arc::new(Stalled::default());
        let checker = Arc::new(checker(KeyOrigin::Published(keys.clone())));
        let check = |kid: String| {
            let checker = Arc::clone(&checker);
            tokio::spawn(async move {
                let audiences = ["https://mcp.example.com/mcp".to_owned()];
                checker
                    .check(&token_with_kid(&kid), &audiences, Duration::ZERO)
                    .await
            })
        };
        let first = check("a".into());
        while keys.fetches.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        let metrics = tokio::runtime::Handle::current().metrics();
        let before = metrics.num_alive_tasks();
        let callers: Vec<_> = (0..50).map(|i| check(format!("b{i}"))).collect();
        // On this single-threaded runtime, each yield runs every task ready: the callers
        // reach their wait (and any task one spawns reaches its own).
        for _ in 0..5 {
            tokio::task::yield_now().await;
        }
        for caller in &callers {
            caller.abort();
        }
        for caller in callers {
            assert!(caller.await.unwrap_err().is_cancelled());
        }
        assert_eq!(metrics.num_alive_tasks(), before, "nothing left queued");
        keys.release.notify_waiters();
        assert_eq!(first.await.unwrap().unwrap_err(), AuthError::UnknownKey);
        assert_eq!(keys.fetches.load(Ordering::SeqCst), 1);
    }

    /// RFC 7517 A.1's P-256 key, as key "old".
    const WITH_OLD: &str = r#"{"keys":[{"kty":"EC","crv":"P-256","kid":"old","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}]}"#;

    /// `min_refresh` and `max_age` of [`old_key_checker`].
    const MIN_REFRESH: Duration = Duration::from_millis(50);
    const MAX_AGE: Duration = Duration::from_secs(60);

    /// A checker whose issuer answers its fetches as `script` says, the first with key
    /// "old": `check` checks a token signed (with a made-up signature) by "old".
    async fn old_key_checker(script: Vec<String>) -> JwtChecker {
        let (url, _) = jwks(Answer::Script(script)).await;
        JwtChecker::new(
            fetching(url),
            "https://as.example.com".into(),
            MIN_REFRESH,
            MAX_AGE,
        )
    }

    async fn check_old(checker: &JwtChecker) -> AuthError {
        let audiences = ["https://mcp.example.com/mcp".to_owned()];
        checker
            .check(&token_with_kid("old"), &audiences, Duration::ZERO)
            .await
            .unwrap_err()
    }

    /// One failed fetch of a stale set does not keep a key the issuer withdrew for another
    /// whole `max_age`: the fetch is tried again once `min_refresh` has passed.
    #[tokio::test]
    async fn a_failed_refetch_is_tried_again_after_the_short_interval() {
        let checker = old_key_checker(vec![
            peer::json_ok(WITH_OLD),
            peer::empty("502 Bad Gateway"),
            peer::json_ok(r#"{"keys":[]}"#),
        ])
        .await;
        // The key is known: the token is refused for its (made-up) signature, not its key.
        assert_ne!(check_old(&checker).await, AuthError::UnknownKey);
        // The set is made stale, and the issuer fails the next fetch: what it last
        // published stands.
        checker.0.keys.write().unwrap().attempted_at = Instant::now().checked_sub(MAX_AGE);
        assert_ne!(check_old(&checker).await, AuthError::UnknownKey);
        // Once the short interval has passed, the issuer is asked again (behind a request
        // that is not held up by it), and says "old" is withdrawn: well before `max_age`.
        tokio::time::sleep(MIN_REFRESH * 2).await;
        let deadline = Instant::now() + MAX_AGE / 2;
        while check_old(&checker).await != AuthError::UnknownKey {
            assert!(Instant::now() < deadline, "the withdrawn key still stands");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// While the issuer cannot be reached, the keys it last published stand for twice
    /// `max_age` since they were fetched, and no longer: a withdrawn (leaked) key is not
    /// accepted for as long as someone keeps this server from asking. 503 meanwhile.
    #[tokio::test]
    async fn keys_the_issuer_cannot_confirm_stand_only_so_long() {
        let checker = old_key_checker(vec![
            peer::json_ok(WITH_OLD),
            peer::empty("502 Bad Gateway"),
        ])
        .await;
        assert_ne!(check_old(&checker).await, AuthError::Unavailable);
        // Fetched twice its age ago, and the issuer fails the fetch now.
        {
            let mut keys = checker.0.keys.write().unwrap();
            keys.attempted_at = Instant::now().checked_sub(MAX_AGE);
            keys.fetched_at = Instant::now().checked_sub(MAX_AGE * 2);
        }
        assert_eq!(check_old(&checker).await, AuthError::Unavailable);
        // And while the failed attempt is the last one.
        assert_eq!(check_old(&checker).await, AuthError::Unavailable);
    }

    /// RFC 7517 §5: keys this server cannot read are ignored, the others still verify.
    #[tokio::test]
    async fn keys_that_do_not_parse_are_skipped_not_the_whole_set() {
        // RFC 7517 A.1's P-256 key as "good", beside keys jsonwebtoken cannot read.
        let body = r#"{"keys":[
            {"kty":"EC","crv":"P-256","use":"enc","alg":"ECDH-ES","kid":"ecdh","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"},
            {"kty":"EC","crv":"P-521","alg":"ES512","kid":"p521","x":"AA","y":"AA"},
            {"kty":"OKP","crv":"X25519","kid":"x25519","x":"AA"},
            {"kty":"EC","crv":"secp256k1","kid":"k1","x":"AA","y":"AA"},
            {"kty":"PQC","kid":"future"},
            {"kty":"EC","crv":"P-256","kid":"good","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}
        ]}"#;
        let (url, _) = jwks(Answer::Every(peer::json_ok(body))).await;
        let checker = checker(fetching(url));
        let audiences = ["https://mcp.example.com/mcp".to_owned()];
        let check = async |kid: &str| {
            checker
                .check(&token_with_kid(kid), &audiences, Duration::ZERO)
                .await
                .unwrap_err()
        };
        // Known: refused for its made-up signature, not for its key.
        assert_eq!(check("good").await, AuthError::BadSignature);
        assert_eq!(check("ecdh").await, AuthError::UnknownKey);
    }

    #[tokio::test]
    async fn a_fetch_whose_client_hung_up_still_completes() {
        let release = Arc::new(tokio::sync::Notify::new());
        let (url, requests) = jwks(Answer::Released(
            peer::json_ok(r#"{"keys":[]}"#),
            Arc::clone(&release),
        ))
        .await;
        let checker = Arc::new(checker(fetching(url)));
        let audiences = ["https://mcp.example.com/mcp".to_owned()];
        let hung_up = {
            let (checker, audiences) = (Arc::clone(&checker), audiences.clone());
            tokio::spawn(async move {
                checker
                    .check(&token_with_kid("new"), &audiences, Duration::ZERO)
                    .await
            })
        };
        while requests.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        hung_up.abort();
        assert!(hung_up.await.unwrap_err().is_cancelled());
        release.notify_one();
        // The fetch went on and learned the set: the key is unknown (401), not unreachable.
        let refused = checker
            .check(&token_with_kid("new"), &audiences, Duration::ZERO)
            .await
            .unwrap_err();
        assert_eq!(refused, AuthError::UnknownKey);
        assert_eq!(requests.load(Ordering::SeqCst), 1);
    }

    /// Keys handed over in process, as an authorization server beside this one does.
    #[derive(Debug)]
    struct Given(Value);

    impl PublishedKeys for Given {
        fn jwk_set(
            &self,
        ) -> std::pin::Pin<Box<dyn Future<Output = Result<Value, AuthError>> + Send + '_>> {
            Box::pin(async move { Ok(self.0.clone()) })
        }
    }

    /// Keys handed over in process that the test changes, as an issuer rotating them.
    #[derive(Debug)]
    struct Changing(std::sync::Mutex<Value>);

    impl PublishedKeys for Changing {
        fn jwk_set(
            &self,
        ) -> std::pin::Pin<Box<dyn Future<Output = Result<Value, AuthError>> + Send + '_>> {
            let set = self.0.lock().unwrap().clone();
            Box::pin(async move { Ok(set) })
        }
    }

    /// A P-256 key generated for these tests, as PKCS#8 and as a JWK named "k1".
    const TEST_KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgLH6gx2zDQ5RIf8im
Xn8P9AWu/PbH3xdt6LAX/QaeiFehRANCAAQdtgRvv35lfIVMkD4k0lH+Fa1DgWMw
RnJiSR+yc7dMBkHE7zM0IaKF+9SyVVnf6UUiMDftNtFwEE+hLuppY78E
-----END PRIVATE KEY-----";

    fn test_checker() -> JwtChecker {
        let jwk = serde_json::json!({
            "kty": "EC", "crv": "P-256", "kid": "k1", "alg": "ES256",
            "x": "HbYEb79-ZXyFTJA-JNJR_hWtQ4FjMEZyYkkfsnO3TAY",
            "y": "QcTvMzQhooX71LJVWd_pRSIwN-020XAQT6Eu6mljvwQ",
        });
        checker(KeyOrigin::Published(Arc::new(Given(
            serde_json::json!({ "keys": [jwk] }),
        ))))
    }

    fn signed(claims: &Value) -> String {
        let mut header = jsonwebtoken::Header::new(Algorithm::ES256);
        header.kid = Some("k1".into());
        let key = jsonwebtoken::EncodingKey::from_ec_pem(TEST_KEY.as_bytes()).unwrap();
        jsonwebtoken::encode(&header, claims, &key).unwrap()
    }

    /// While an issuer rotates its keys it publishes two of one algorithm: a token without
    /// a `kid` is checked against each. Keys of different types may share a `kid` (RFC 7517
    /// §4.5): the one of the token's algorithm is found.
    #[tokio::test]
    async fn a_token_finds_its_key_among_several_of_its_algorithm_or_id() {
        let ours = serde_json::json!({
            "kty": "EC", "crv": "P-256",
            "x": "HbYEb79-ZXyFTJA-JNJR_hWtQ4FjMEZyYkkfsnO3TAY",
            "y": "QcTvMzQhooX71LJVWd_pRSIwN-020XAQT6Eu6mljvwQ",
        });
        // RFC 7517 A.1's P-256 key, and an RSA key sharing our key's id.
        let other = serde_json::json!({
            "kty": "EC", "crv": "P-256", "kid": "old",
            "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
            "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0",
        });
        let rsa = serde_json::json!({ "kty": "RSA", "kid": "k1", "n": "sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw", "e": "AQAB" });
        let set = |keys: Vec<Value>| {
            checker(KeyOrigin::Published(Arc::new(Given(
                serde_json::json!({ "keys": keys }),
            ))))
        };
        let audiences = ["https://mcp.example.com/mcp".to_owned()];
        let claims = serde_json::json!({
            "iss": "https://as.example.com", "sub": "alice", "aud": audiences[0],
            "exp": super::super::now_secs() + 600,
        });
        let key = jsonwebtoken::EncodingKey::from_ec_pem(TEST_KEY.as_bytes()).unwrap();
        let sign = |kid: Option<&str>| {
            let mut header = jsonwebtoken::Header::new(Algorithm::ES256);
            header.kid = kid.map(str::to_owned);
            jsonwebtoken::encode(&header, &claims, &key).unwrap()
        };
        let mut unnamed = ours.clone();
        unnamed["kid"] = "new".into();
        let rotating = set(vec![other.clone(), unnamed]);
        let checked = rotating
            .check(&sign(None), &audiences, Duration::ZERO)
            .await;
        assert_eq!(checked.map(|c| c.grant.subject), Ok("alice".to_owned()));
        // Signed by neither: as by a key not (yet) published, which is not remembered.
        let by_other = set(vec![other.clone()]);
        assert_eq!(
            by_other
                .check(&sign(None), &audiences, Duration::ZERO)
                .await
                .map(|_| ()),
            Err(AuthError::UnknownKey)
        );
        // The issuer publishes its new key after the set was read: a token it signs without
        // a kid has the set read again, and passes.
        let published = Arc::new(Changing(std::sync::Mutex::new(
            serde_json::json!({ "keys": [other] }),
        )));
        let rotating_later = JwtChecker::new(
            KeyOrigin::Published(Arc::clone(&published) as Arc<dyn PublishedKeys>),
            "https://as.example.com".into(),
            Duration::ZERO,
            Duration::from_secs(3600),
        );
        let first = rotating_later
            .check(&sign(None), &audiences, Duration::ZERO)
            .await;
        assert_eq!(first.map(|_| ()), Err(AuthError::UnknownKey));
        published.0.lock().unwrap()["keys"]
            .as_array_mut()
            .unwrap()
            .push(ours.clone());
        let later = rotating_later
            .check(&sign(None), &audiences, Duration::ZERO)
            .await;
        assert!(later.is_ok(), "{later:?}");
        let mut named = ours;
        named["kid"] = "k1".into();
        let shared_id = set(vec![named, rsa]);
        let checked = shared_id
            .check(&sign(Some("k1")), &audiences, Duration::ZERO)
            .await;
        assert!(checked.is_ok(), "{checked:?}");
    }

    /// A token bound to a DPoP key or a client certificate, sent as a bearer token, is
    /// refused: the binding cannot be checked here.
    #[tokio::test]
    async fn sender_constrained_tokens_are_refused() {
        let checker = test_checker();
        let audiences = ["https://mcp.example.com/mcp".to_owned()];
        let claims = |cnf: Option<Value>| {
            let mut c = serde_json::json!({
                "iss": "https://as.example.com", "sub": "alice", "aud": audiences[0],
                "exp": super::super::now_secs() + 600,
            });
            if let Some(cnf) = cnf {
                c["cnf"] = cnf;
            }
            c
        };
        let check = async |claims: Value| {
            checker
                .check(&signed(&claims), &audiences, Duration::ZERO)
                .await
        };
        assert!(check(claims(None)).await.is_ok());
        for cnf in [
            serde_json::json!({ "jkt": "0ZcOCORZNYy-DWpqq30jZyJGHTN0d2HglBV3uiguA4I" }),
            serde_json::json!({ "x5t#S256": "bwcK0esc3ACC3DB2Y5_lESsXE8o9ltc05O89jdN-dg2" }),
        ] {
            assert_eq!(
                check(claims(Some(cnf))).await.unwrap_err(),
                AuthError::SenderConstrained
            );
        }
    }

    /// RFC 7519 §4.1.4: a token is refused on or after its `exp`, give or take the leeway
    /// (the JWT library alone accepted it during that second, and rounded a fraction up).
    #[tokio::test]
    async fn a_token_is_refused_from_its_exp_on() {
        let checker = test_checker();
        let audiences = ["https://mcp.example.com/mcp".to_owned()];
        let check = async |exp: Value, leeway: u64| {
            let claims = serde_json::json!({
                "iss": "https://as.example.com", "sub": "alice", "aud": audiences[0],
                "exp": exp,
            });
            checker
                .check(&signed(&claims), &audiences, Duration::from_secs(leeway))
                .await
                .map(|_| ())
        };
        let now = super::super::now_secs();
        assert_eq!(check(now.into(), 0).await, Err(AuthError::Expired));
        assert_eq!(
            check((now as f64 - 0.5).into(), 0).await,
            Err(AuthError::Expired)
        );
        assert_eq!(
            check((now - 5).into(), 30).await,
            Ok(()),
            "within the leeway"
        );
        assert_eq!(check((now - 31).into(), 30).await, Err(AuthError::Expired));
        assert_eq!(check((now + 60).into(), 0).await, Ok(()));
    }

    /// A token whose `sub` is empty names no principal: refused, as one without a `sub`.
    #[tokio::test]
    async fn a_token_must_name_its_subject() {
        let checker = test_checker();
        let audiences = ["https://mcp.example.com/mcp".to_owned()];
        for sub in ["", "alice"] {
            let claims = serde_json::json!({
                "iss": "https://as.example.com", "sub": sub, "aud": audiences[0],
                "exp": super::super::now_secs() + 600,
            });
            let checked = checker
                .check(&signed(&claims), &audiences, Duration::ZERO)
                .await;
            match sub {
                "" => assert_eq!(checked.unwrap_err(), AuthError::InvalidToken),
                _ => assert_eq!(checked.unwrap().grant.subject, sub),
            }
        }
    }

    /// RFC 8414 §3.3: the metadata's issuer is the configured one exactly; a trailing slash
    /// more (or less) would pass discovery and then fail every token's `iss`.
    #[tokio::test]
    async fn discovery_wants_the_issuer_exactly() {
        let origin = peer::start(|origin| {
            let body = serde_json::json!({ "issuer": format!("{origin}/"), "jwks_uri": format!("{origin}/jwks") });
            Answer::Every(peer::json_ok(&body.to_string()))
        })
        .await
        .origin;
        let discover = async |issuer: &str| {
            let KeyOrigin::Fetched(fetch) = KeyOrigin::fetched(
                crate::HttpClients::new(reqwest::Client::builder).unwrap(),
                None,
            ) else {
                unreachable!()
            };
            fetch.jwks_uri(issuer).await
        };
        assert_eq!(discover(&origin).await, Err(AuthError::Unavailable));
        assert_eq!(
            discover(&format!("{origin}/")).await,
            Ok(format!("{origin}/jwks"))
        );
    }

    #[test]
    fn unreadable_headers_are_refused_for_what_is_wrong_with_them() {
        let header = |h: &str| {
            format!(
                "{}.e30.c2ln",
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(h)
            )
        };
        assert_eq!(
            refused_header(&header(r#"{"alg":"none","typ":"JWT"}"#)),
            AuthError::UnsupportedAlgorithm
        );
        // A known algorithm with some other fault is not an algorithm problem.
        assert_eq!(
            refused_header(&header(r#"{"alg":"RS256","kid":5}"#)),
            AuthError::InvalidToken
        );
        assert_eq!(refused_header("not a token"), AuthError::InvalidToken);
    }
}
