//! `private_key_jwt` client authentication (RFC 7523 §2.2, OpenID Connect Core §9): a JWT
//! the client signed with a key it published, naming itself as issuer and subject and this
//! server as audience, used once (its `jti` is remembered until it expires).

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use wharf::store::{Write, now_millis};

use crate::records::{ASSERTIONS, KEY_SET_CACHE};
use crate::server::clients::{Client, ClientError, TokenAuth};
use crate::server::{OAuthError, Shared};

/// The assertion type RFC 7523 names.
pub(crate) const JWT_BEARER: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";

/// The longest an assertion may live: its `jti` is kept that long.
const MAX_LIFETIME_SECS: i64 = 3600;

/// The assertion's `iss`, read before its signature can be checked (it says whose keys to
/// check it with).
pub(crate) fn issuer(jwt: &str) -> Option<String> {
    let payload = jwt.split('.').nth(1)?;
    let claims: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).ok()?).ok()?;
    claims.get("iss")?.as_str().map(str::to_owned)
}

/// A key set kept while its host says it is fresh (as documents are), so that a token
/// request does not wait on the client's key host each time.
#[derive(Serialize, Deserialize)]
struct CachedKeySet {
    body: String,
    /// When it was fetched, and whether to replace a kept set (for an assertion whose key
    /// it lacked or failed): such a set is not replaced again within [`MIN_REFETCH_MS`]
    /// (anyone may send such an assertion, and each would be a fetch from the client's host).
    #[serde(default)]
    fetched_at: wharf::store::Millis,
    #[serde(default)]
    refetched: bool,
}

/// How long a key set fetched to replace a kept one stands before it is replaced again: a
/// client that rotates its keys twice within it waits that long.
const MIN_REFETCH_MS: wharf::store::Millis = 60_000;

/// The key set at `url`, and whether it is the copy kept: that one unless it lacks the
/// assertion's key or `fetch` (the client rotated its keys), else fetched and kept for as
/// long as its host allows.
async fn key_set(
    shared: &Shared,
    url: &url::Url,
    kid: Option<&str>,
    fetch: bool,
) -> Result<(Value, bool), OAuthError> {
    let refuse = |why: String| OAuthError::invalid_client(format!("client_assertion: {why}"));
    let holds = |set: &Value| {
        let keys = set.get("keys").and_then(Value::as_array);
        match kid {
            Some(kid) => keys.is_some_and(|k| k.iter().any(|key| key["kid"] == kid)),
            None => keys.is_some_and(|k| k.len() == 1),
        }
    };
    // A cache the store cannot read only means the set is fetched. A kept set is used when
    // it holds the assertion's key and is not asked for again (`fetch`); else it is fetched,
    // unless the one kept was itself fetched to replace another less than
    // `MIN_REFETCH_MS` ago (unknown kids and failing assertions cost one fetch a minute).
    let kept = shared
        .records
        .get::<CachedKeySet>(KEY_SET_CACHE, url.as_str())
        .await
        .ok()
        .flatten()
        .and_then(|c| Some((serde_json::from_str::<Value>(&c.value.body).ok()?, c.value)));
    if let Some((set, kept)) = &kept {
        let young = kept.refetched && now_millis().saturating_sub(kept.fetched_at) < MIN_REFETCH_MS;
        if (!fetch && holds(set)) || young {
            return Ok((set.clone(), true));
        }
    }
    let (body, fresh_for) = shared.fetcher.fetch_key_set(url).await.map_err(|e| {
        let err = ClientError::from(e);
        let why = format!(
            "the client's keys could not be fetched: {}",
            err.public_message()
        );
        // A host down for now is no reason for the client to drop its credentials, as
        // `invalid_client` would tell it to: retry, as with its document's host.
        match err.is_transient() {
            true => OAuthError::temporarily_unavailable(format!("client_assertion: {why}")),
            false => refuse(why),
        }
    })?;
    let set: Value =
        serde_json::from_slice(&body).map_err(|_| refuse("jwks_uri is not a JWK set".into()))?;
    if let Some(fresh_for) = fresh_for {
        let body = String::from_utf8_lossy(&body).into_owned();
        let kept = shared
            .records
            .keep_for(
                KEY_SET_CACHE,
                url.as_str(),
                &CachedKeySet {
                    body,
                    fetched_at: now_millis(),
                    refetched: kept.is_some(),
                },
                fresh_for,
            )
            .await;
        // The set is in hand: one not kept is only fetched again next time.
        if let Err(err) = kept {
            tracing::warn!(%err, jwks_uri = %url, "a client's key set was not kept");
        }
    }
    Ok((set, false))
}

/// Checks the assertion against the client's keys, and that its `jti` is new.
pub(crate) async fn verify(shared: &Shared, client: &Client, jwt: &str) -> Result<(), OAuthError> {
    let refuse = |why: String| OAuthError::invalid_client(format!("client_assertion: {why}"));
    let header = jsonwebtoken::decode_header(jwt).map_err(|e| refuse(e.to_string()))?;
    if !matches!(
        header.alg,
        Algorithm::ES256 | Algorithm::RS256 | Algorithm::EdDSA
    ) {
        return Err(refuse(format!(
            "{:?} is not accepted: sign with ES256, RS256 or EdDSA",
            header.alg
        )));
    }
    let mut validation = Validation::new(header.alg);
    validation.set_audience(&[
        shared.endpoint("/token"),
        shared.endpoint("/revoke"),
        shared.config.issuer.clone(),
    ]);
    validation.set_issuer(&[client.id.as_str()]);
    validation.sub = Some(client.id.clone());
    validation.set_required_spec_claims(&["exp", "iss", "sub", "aud"]);
    validation.leeway = 30;
    let kid = header.kid.as_deref();
    // The claims, or the refusal and whether the keys were what failed (none matches, one
    // unusable, a bad signature), which newer keys could change.
    let signed = |set: Value| {
        let by_keys = |why: String| (refuse(why), true);
        let set: JwkSet = serde_json::from_value(set)
            .map_err(|_| by_keys("the client's keys are not a JWK set".into()))?;
        let jwk = match kid {
            Some(kid) => set.find(kid),
            None if set.keys.len() == 1 => set.keys.first(),
            None => None,
        }
        .ok_or_else(|| by_keys("no key of the client's matches the assertion's kid".into()))?;
        let key = DecodingKey::from_jwk(jwk).map_err(|e| by_keys(e.to_string()))?;
        jsonwebtoken::decode::<Value>(jwt, &key, &validation)
            .map(|data| data.claims)
            .map_err(|e| {
                use jsonwebtoken::errors::ErrorKind as Kind;
                let keys = matches!(
                    e.kind(),
                    Kind::InvalidSignature
                        | Kind::InvalidAlgorithm
                        | Kind::InvalidRsaKey(_)
                        | Kind::InvalidEcdsaKey
                        | Kind::InvalidKeyFormat
                );
                (refuse(e.to_string()), keys)
            })
    };
    let claims = match &client.auth {
        TokenAuth::PrivateKeyJwt { jwks } => signed(jwks.clone()).map_err(|(e, _)| e)?,
        TokenAuth::PrivateKeyJwtUri { jwks_uri } => {
            let url =
                url::Url::parse(jwks_uri).map_err(|_| refuse("jwks_uri is not a URL".into()))?;
            match key_set(shared, &url, kid, false).await? {
                // A kept set whose keys fail the assertion may be one the client replaced
                // since (a key re-made under its kid): fetched again, once, before the
                // client is refused; a fetch that fails leaves the first refusal, unless
                // it failed for now (then the client retries, credentials kept).
                (set, true) => match signed(set) {
                    Ok(claims) => claims,
                    Err((refused, true)) => match key_set(shared, &url, kid, true).await {
                        Ok((fresh, _)) => signed(fresh).map_err(|(e, _)| e)?,
                        Err(e) if e.is_temporary() => return Err(e),
                        Err(_) => return Err(refused),
                    },
                    Err((refused, false)) => return Err(refused),
                },
                (set, false) => signed(set).map_err(|(e, _)| e)?,
            }
        }
        _ => return Err(refuse("this client does not use private_key_jwt".into())),
    };
    // Read whole: an `exp` past i64 must not pass for 0 (a replay record already expired).
    let exp = claims
        .get("exp")
        .and_then(Value::as_u64)
        .and_then(|exp| i64::try_from(exp).ok())
        .ok_or_else(|| refuse("exp is not a time this server keeps".into()))?;
    if exp > now_millis() / 1000 + MAX_LIFETIME_SECS {
        return Err(refuse("it lives longer than an hour".into()));
    }
    let jti = claims
        .get("jti")
        .and_then(Value::as_str)
        .filter(|j| !j.is_empty() && j.len() <= 256)
        .ok_or_else(|| refuse("jti is required (at most 256 characters)".into()))?;
    let first = shared
        .records
        .put(
            ASSERTIONS,
            &crate::records::digest(&format!("{}\n{}\n{jti}", client.id.len(), client.id)),
            &Value::Null,
            None,
            Write::Create,
            Some(exp.saturating_add(60).saturating_mul(1000)),
        )
        .await
        .map_err(OAuthError::server_error)?;
    if first.is_none() {
        return Err(refuse(format!(
            "jti {jti:?} was used before; an assertion is used once"
        )));
    }
    Ok(())
}
