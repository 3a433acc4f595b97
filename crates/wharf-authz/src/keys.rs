//! The keys access tokens are signed with: ES256 (P-256) key pairs, one per rotation period,
//! kept in the store so every replica signs with the same key and publishes the same set.
//!
//! A period's key is named after the period (`k<index>`), so two replicas that both find it
//! missing create it under the same name and the store keeps the first: both then sign with
//! that one. The published set holds the previous period's key (tokens it signed are still
//! alive just after a rotation), the current one and the next one (so resource servers that
//! cache the set already know it when it starts signing).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use jsonwebtoken::EncodingKey;
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use wharf::store::{Millis, Write, millis};

use crate::records::{RecordError, Records, SIGNING_KEYS};

/// How long one key signs.
pub const ROTATION: Duration = Duration::from_secs(30 * 24 * 3600);

#[derive(Serialize, Deserialize)]
struct StoredKey {
    /// PKCS#8 DER, base64.
    pkcs8: String,
}

/// A key ready to sign, with its public half as a JWK.
pub(crate) struct SigningKey {
    pub(crate) kid: String,
    pub(crate) encoding: EncodingKey,
    jwk: Value,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

/// The key ring, read from the store and cached (a key never changes once written).
#[derive(Debug)]
pub(crate) struct SigningKeys {
    records: Records,
    rotation: Duration,
    cache: Mutex<HashMap<i64, Arc<SigningKey>>>,
}

impl SigningKeys {
    pub(crate) fn new(records: Records, rotation: Duration) -> Self {
        Self {
            records,
            rotation,
            cache: Mutex::new(HashMap::new()),
        }
    }

    fn period(&self, now: Millis) -> i64 {
        now / millis(self.rotation).max(1)
    }

    /// The key that signs now.
    pub(crate) async fn current(&self, now: Millis) -> Result<Arc<SigningKey>, KeyError> {
        self.for_period(self.period(now), true)
            .await
            .and_then(|k| k.ok_or(KeyError::Missing))
    }

    /// The published set: previous, current and next periods' keys.
    pub(crate) async fn jwks(&self, now: Millis) -> Result<Value, KeyError> {
        let period = self.period(now);
        let mut keys = Vec::new();
        for (p, create) in [(period - 1, false), (period, true), (period + 1, true)] {
            if let Some(key) = self.for_period(p, create).await? {
                keys.push(key.jwk.clone());
            }
        }
        Ok(json!({ "keys": keys }))
    }

    async fn for_period(
        &self,
        period: i64,
        create: bool,
    ) -> Result<Option<Arc<SigningKey>>, KeyError> {
        if let Some(key) = self.cached(period) {
            return Ok(Some(key));
        }
        let kid = format!("k{period}");
        let stored = match self.records.get::<StoredKey>(SIGNING_KEYS, &kid).await? {
            Some(found) => found.value,
            None if create => {
                let fresh = StoredKey {
                    pkcs8: STANDARD.encode(generate()?),
                };
                // Of two replicas creating it at once the store keeps one; read back which.
                self.records
                    .put(SIGNING_KEYS, &kid, &fresh, None, Write::Create, None)
                    .await?;
                self.records
                    .get::<StoredKey>(SIGNING_KEYS, &kid)
                    .await?
                    .ok_or(KeyError::Missing)?
                    .value
            }
            None => return Ok(None),
        };
        let key = Arc::new(parse(kid, &stored)?);
        if let Ok(mut cache) = self.cache.lock() {
            cache.retain(|p, _| (period - 2..=period + 2).contains(p));
            cache.insert(period, key.clone());
        }
        Ok(Some(key))
    }

    fn cached(&self, period: i64) -> Option<Arc<SigningKey>> {
        self.cache.lock().ok()?.get(&period).cloned()
    }
}

/// Why no key could be had.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The store failed, or holds a key this version cannot read.
    #[error(transparent)]
    Record(#[from] RecordError),
    /// Key generation or parsing failed.
    #[error("signing key: {0}")]
    Crypto(String),
    /// The key just written could not be read back.
    #[error("the signing key written could not be read back")]
    Missing,
}

fn generate() -> Result<Vec<u8>, KeyError> {
    let rng = SystemRandom::new();
    EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
        .map(|doc| doc.as_ref().to_vec())
        .map_err(|_| KeyError::Crypto("could not generate a P-256 key".into()))
}

fn parse(kid: String, stored: &StoredKey) -> Result<SigningKey, KeyError> {
    let pkcs8 = STANDARD
        .decode(&stored.pkcs8)
        .map_err(|_| KeyError::Crypto(format!("{kid}: not base64")))?;
    let pair = EcdsaKeyPair::from_pkcs8(
        &ECDSA_P256_SHA256_FIXED_SIGNING,
        &pkcs8,
        &SystemRandom::new(),
    )
    .map_err(|_| KeyError::Crypto(format!("{kid}: not a P-256 PKCS#8 key")))?;
    // An uncompressed point: 0x04, then x and y, 32 bytes each.
    let point = pair.public_key().as_ref();
    let (Some(x), Some(y)) = (point.get(1..33), point.get(33..65)) else {
        return Err(KeyError::Crypto(format!(
            "{kid}: unexpected public key length"
        )));
    };
    let jwk = json!({
        "kty": "EC",
        "crv": "P-256",
        "x": URL_SAFE_NO_PAD.encode(x),
        "y": URL_SAFE_NO_PAD.encode(y),
        "kid": kid,
        "use": "sig",
        "alg": "ES256",
    });
    Ok(SigningKey {
        encoding: EncodingKey::from_ec_der(&pkcs8),
        kid,
        jwk,
    })
}
