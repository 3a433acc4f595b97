//! The keys access tokens are signed with: ES256 (P-256) key pairs, one per rotation period,
//! kept in the store so every replica signs with the same key and publishes the same set.
//!
//! A period's key is named after the period (`k<index>`), so two replicas that both find it
//! missing create it under the same name and the store keeps the first: both then sign with
//! that one. The published set holds the previous period's key (tokens it signed are still
//! alive just after a rotation), the current one and the next one (so resource servers that
//! cache the set already know it when it starts signing).
//!
//! Given a [`KeyEncryptionKey`], the private keys are stored sealed (AES-256-GCM, the
//! record's name bound in as associated data), so that reading the store, or a backup of
//! it, is not enough to sign tokens. Keys stored before it was given, and keys sealed with
//! a retired key encryption key (see [`KeyEncryption`]), are sealed again when a server
//! that has it starts (`SigningKeys::prepare`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use jsonwebtoken::{DecodingKey, EncodingKey};
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use wharf::store::{Millis, Write, millis};

use crate::records::{RecordError, Records, SIGNING_KEYS, Versioned};

/// The `typ` of the access tokens these keys sign (RFC 9068).
pub(crate) const ACCESS_TOKEN_TYPE: &str = "at+jwt";

/// How long one key signs.
pub const ROTATION: Duration = Duration::from_secs(30 * 24 * 3600);

/// A signing key as stored.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum StoredKey {
    /// Sealed with the key encryption key named `sealed_with`: base64 of the nonce, then
    /// the ciphertext and its tag.
    Sealed { sealed: String, sealed_with: String },
    /// PKCS#8 DER, base64.
    Plain { pkcs8: String },
}

/// How the signing keys are sealed in the store: with `seal`, given to every replica. While
/// it replaces another, the old one goes in `retired`: keys it sealed still open, and are
/// sealed again with `seal` the first time they are read.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct KeyEncryption {
    /// The key that seals.
    pub seal: KeyEncryptionKey,
    /// Keys that only open.
    pub retired: Vec<KeyEncryptionKey>,
}

impl KeyEncryption {
    /// Sealing with `seal`, and opening what the `retired` keys sealed too.
    pub fn new(seal: KeyEncryptionKey, retired: Vec<KeyEncryptionKey>) -> Self {
        Self { seal, retired }
    }

    /// The key encryption key with `id`, if this server has it.
    fn with_id(&self, id: &str) -> Option<&KeyEncryptionKey> {
        std::iter::once(&self.seal)
            .chain(&self.retired)
            .find(|key| key.id == id)
    }

    /// The ids of the keys this server has, for an error that says which it lacks.
    fn ids(&self) -> String {
        std::iter::once(&self.seal)
            .chain(&self.retired)
            .map(|key| key.id.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A key that seals signing keys in the store: 32 bytes.
#[derive(Clone)]
pub struct KeyEncryptionKey {
    bytes: [u8; 32],
    id: String,
}

impl std::fmt::Debug for KeyEncryptionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyEncryptionKey")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl KeyEncryptionKey {
    /// A key for `label`'s use derived from this one and `input`: what only a holder of both
    /// can make.
    pub(crate) fn derive(&self, label: &[u8], input: &[u8]) -> [u8; 32] {
        Sha256::digest([label, &self.bytes, input].concat()).into()
    }

    /// Reads a key written in base64 (standard or URL-safe, padded or not), such as
    /// `openssl rand -base64 32` prints.
    pub fn from_base64(text: &str) -> Result<Self, KeyError> {
        let text = text.trim().trim_end_matches('=');
        let bytes = URL_SAFE_NO_PAD
            .decode(text.replace('+', "-").replace('/', "_"))
            .map_err(|_| KeyError::Crypto("the key encryption key is not base64".into()))?;
        let bytes: [u8; 32] = bytes.try_into().map_err(|bytes: Vec<u8>| {
            KeyError::Crypto(format!(
                "the key encryption key must be 32 bytes (openssl rand -base64 32); this one has {}",
                bytes.len()
            ))
        })?;
        // A name for the key that does not give it away, stored beside what it sealed so
        // that a server with another key says so instead of failing to decrypt.
        let digest = Sha256::digest([b"wharf key encryption key ".as_slice(), &bytes].concat());
        Ok(Self {
            bytes,
            id: URL_SAFE_NO_PAD.encode(&digest[..9]),
        })
    }

    fn key(&self) -> Result<LessSafeKey, KeyError> {
        UnboundKey::new(&AES_256_GCM, &self.bytes)
            .map(LessSafeKey::new)
            .map_err(|_| KeyError::Crypto("the key encryption key is unusable".into()))
    }

    fn seal(&self, kid: &str, pkcs8: &[u8]) -> Result<StoredKey, KeyError> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| KeyError::Crypto("no random nonce".into()))?;
        let mut sealed = pkcs8.to_vec();
        self.key()?
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(kid.as_bytes()),
                &mut sealed,
            )
            .map_err(|_| KeyError::Crypto(format!("{kid}: could not be sealed")))?;
        Ok(StoredKey::Sealed {
            sealed: STANDARD.encode([nonce.as_slice(), &sealed].concat()),
            sealed_with: self.id.clone(),
        })
    }

    fn open(&self, kid: &str, sealed: &str) -> Result<Vec<u8>, KeyError> {
        let refused = || {
            KeyError::Crypto(format!(
                "{kid} does not open with key encryption key {}: it was altered, or sealed as another key",
                self.id
            ))
        };
        let mut bytes = STANDARD.decode(sealed).map_err(|_| refused())?;
        if bytes.len() < NONCE_LEN {
            return Err(refused());
        }
        let mut ciphertext = bytes.split_off(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(&bytes).map_err(|_| refused())?;
        let plain = self
            .key()?
            .open_in_place(nonce, Aad::from(kid.as_bytes()), &mut ciphertext)
            .map_err(|_| refused())?;
        Ok(plain.to_vec())
    }
}

/// A key ready to sign, with its public half as a JWK.
pub(crate) struct SigningKey {
    pub(crate) kid: String,
    pub(crate) encoding: EncodingKey,
    decoding: DecodingKey,
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
    sealing: Option<KeyEncryption>,
    cache: Mutex<HashMap<i64, Arc<SigningKey>>>,
}

impl SigningKeys {
    pub(crate) fn new(
        records: Records,
        rotation: Duration,
        sealing: Option<KeyEncryption>,
    ) -> Self {
        Self {
            records,
            rotation,
            sealing,
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

    /// The published set: previous, current and next periods' keys. A previous key this
    /// server cannot open (sealed with an encryption key since dropped) is left out and
    /// logged: it signs nothing any more, and the tokens it signed are minutes from expiry.
    pub(crate) async fn jwks(&self, now: Millis) -> Result<Value, KeyError> {
        let period = self.period(now);
        let mut keys = Vec::new();
        match self.for_period(period - 1, false).await {
            Ok(Some(key)) => keys.push(key.jwk.clone()),
            Ok(None) => {}
            Err(err @ KeyError::Crypto(_)) => {
                tracing::warn!(%err, "the previous signing key is not published");
            }
            Err(err) => return Err(err),
        }
        for p in [period, period + 1] {
            if let Some(key) = self.for_period(p, true).await? {
                keys.push(key.jwk.clone());
            }
        }
        Ok(json!({ "keys": keys }))
    }

    /// Makes sure, when a server starts, that the keys it publishes (previous, current and
    /// next period's) exist and that it can open them, and seals again with its sealing key
    /// those stored in plain or sealed with a retired key. Only here, not at every read: a
    /// replica still running with an older configuration must not seal them back while
    /// the others restart. A previous key it cannot open is only logged (it signs nothing
    /// any more); a current or next one it cannot open is an error that names it.
    pub(crate) async fn prepare(&self, now: Millis) -> Result<(), KeyError> {
        let period = self.period(now);
        for p in [period - 1, period, period + 1] {
            let kid = format!("k{p}");
            let Some(found) = self.records.get::<StoredKey>(SIGNING_KEYS, &kid).await? else {
                if p >= period {
                    self.for_period(p, true).await?;
                }
                continue;
            };
            let pkcs8 = match self.open(&kid, &found.value) {
                Ok(pkcs8) => pkcs8,
                Err(err @ KeyError::Crypto(_)) if p < period => {
                    tracing::warn!(%err, "the previous signing key is not published");
                    continue;
                }
                Err(err) => return Err(err),
            };
            if let Some(sealing) = &self.sealing {
                let current = matches!(&found.value,
                    StoredKey::Sealed { sealed_with, .. } if *sealed_with == sealing.seal.id);
                if !current {
                    self.seal_stored(&sealing.seal, &kid, &pkcs8, &found)
                        .await?;
                }
            }
        }
        Ok(())
    }

    /// The claims of `token`, if it is one of this server's access tokens (issued by
    /// `issuer`, signed with one of its keys, not expired); `None` for anything else. Only
    /// a store that fails is an error.
    pub(crate) async fn verify<T: serde::de::DeserializeOwned>(
        &self,
        token: &str,
        issuer: &str,
    ) -> Result<Option<T>, KeyError> {
        let Ok(header) = jsonwebtoken::decode_header(token) else {
            return Ok(None);
        };
        if header.typ.as_deref() != Some(ACCESS_TOKEN_TYPE) {
            return Ok(None);
        }
        let Some(kid) = header.kid else {
            return Ok(None);
        };
        let Some(period) = kid.strip_prefix('k').and_then(|n| n.parse::<i64>().ok()) else {
            return Ok(None);
        };
        let key = match self.for_period(period, false).await {
            // `k05` parses as period 5: only the key's own spelling names it.
            Ok(Some(key)) if key.kid == kid => key,
            Ok(_) | Err(KeyError::Crypto(_)) => return Ok(None),
            Err(err) => return Err(err),
        };
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::ES256);
        validation.set_issuer(&[issuer]);
        validation.set_required_spec_claims(&["exp", "iss"]);
        // The audience is the resource the token is for, which varies; every token this
        // issuer signs with these keys is one of its own.
        validation.validate_aud = false;
        Ok(jsonwebtoken::decode::<T>(token, &key.decoding, &validation)
            .ok()
            .map(|data| data.claims))
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
        let pkcs8 = match self.records.get::<StoredKey>(SIGNING_KEYS, &kid).await? {
            Some(found) => self.open(&kid, &found.value)?,
            None if create => {
                let fresh = generate()?;
                let stored = match &self.sealing {
                    Some(sealing) => sealing.seal.seal(&kid, &fresh)?,
                    None => StoredKey::Plain {
                        pkcs8: STANDARD.encode(&fresh),
                    },
                };
                // Of two replicas creating it at once the store keeps one; read back which.
                self.records
                    .put(SIGNING_KEYS, &kid, &stored, None, Write::Create, None)
                    .await?;
                let kept = self
                    .records
                    .get::<StoredKey>(SIGNING_KEYS, &kid)
                    .await?
                    .ok_or(KeyError::Missing)?;
                self.open(&kid, &kept.value)?
            }
            None => return Ok(None),
        };
        let key = Arc::new(parse(kid, &pkcs8)?);
        if let Ok(mut cache) = self.cache.lock() {
            cache.retain(|p, _| (period - 2..=period + 2).contains(p));
            cache.insert(period, key.clone());
        }
        Ok(Some(key))
    }

    /// The PKCS#8 document of stored key `kid`.
    fn open(&self, kid: &str, stored: &StoredKey) -> Result<Vec<u8>, KeyError> {
        let (sealed, sealed_with) = match stored {
            StoredKey::Plain { pkcs8 } => {
                return STANDARD
                    .decode(pkcs8)
                    .map_err(|_| KeyError::Crypto(format!("{kid}: not base64")));
            }
            StoredKey::Sealed {
                sealed,
                sealed_with,
            } => (sealed, sealed_with),
        };
        let has = match &self.sealing {
            Some(sealing) => match sealing.with_id(sealed_with) {
                Some(key) => return key.open(kid, sealed),
                None => sealing.ids(),
            },
            None => "none".to_owned(),
        };
        Err(KeyError::Crypto(format!(
            "{kid} is sealed with key encryption key {sealed_with}, and this server has {has}"
        )))
    }

    /// Replaces key `kid`, as `found` (plain, or sealed with a retired key), with its form
    /// sealed by `sealing`, expiring when it would have. A replica that sealed it first (the
    /// write's condition failed) has done the work.
    async fn seal_stored(
        &self,
        sealing: &KeyEncryptionKey,
        kid: &str,
        pkcs8: &[u8],
        found: &Versioned<StoredKey>,
    ) -> Result<(), KeyError> {
        let sealed = sealing.seal(kid, pkcs8)?;
        let written = self
            .records
            .put(
                SIGNING_KEYS,
                kid,
                &sealed,
                None,
                Write::Replace(found.version),
                found.expires_at,
            )
            .await?;
        if written.is_some() {
            tracing::info!(kid, key = %sealing.id, "a signing key is now sealed with this key encryption key");
        }
        Ok(())
    }

    fn cached(&self, period: i64) -> Option<Arc<SigningKey>> {
        self.cache.lock().ok()?.get(&period).cloned()
    }
}

/// Why no key could be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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

fn parse(kid: String, pkcs8: &[u8]) -> Result<SigningKey, KeyError> {
    let pair = EcdsaKeyPair::from_pkcs8(
        &ECDSA_P256_SHA256_FIXED_SIGNING,
        pkcs8,
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
    let (x, y) = (URL_SAFE_NO_PAD.encode(x), URL_SAFE_NO_PAD.encode(y));
    let decoding = DecodingKey::from_ec_components(&x, &y)
        .map_err(|err| KeyError::Crypto(format!("{kid}: {err}")))?;
    let jwk = json!({
        "kty": "EC",
        "crv": "P-256",
        "x": x,
        "y": y,
        "kid": kid,
        "use": "sig",
        "alg": "ES256",
    });
    Ok(SigningKey {
        encoding: EncodingKey::from_ec_der(pkcs8),
        decoding,
        kid,
        jwk,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEK: &str = "q1Kd5Z5y4mUoGqP2v0F7m3S1o8J6c9T2w4E5r7Y8u0I=";
    const OTHER: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8";
    const NOW: Millis = 1_800_000_000_000;

    async fn records() -> Records {
        let options = wharf_store::StoreOptions::default();
        Records::new(wharf_store::open("memory://", &options).await.unwrap())
    }

    fn kek(text: &str) -> KeyEncryptionKey {
        KeyEncryptionKey::from_base64(text).unwrap()
    }

    fn keys(records: &Records, seal: Option<&str>) -> SigningKeys {
        let sealing = seal.map(|k| KeyEncryption {
            seal: kek(k),
            retired: Vec::new(),
        });
        SigningKeys::new(records.clone(), ROTATION, sealing)
    }

    async fn stored(records: &Records, kid: &str) -> Value {
        records
            .get::<Value>(SIGNING_KEYS, kid)
            .await
            .unwrap()
            .unwrap()
            .value
    }

    fn message(err: KeyError) -> String {
        err.to_string()
    }

    #[tokio::test]
    async fn sealed_keys_are_stored_sealed_and_open_on_every_replica_with_the_key() {
        let records = records().await;
        let first = keys(&records, Some(KEK)).current(NOW).await.unwrap();
        let record = stored(&records, &first.kid).await;
        assert!(record.get("pkcs8").is_none(), "{record}");
        assert!(record["sealed"].is_string() && record["sealed_with"].is_string());
        // Another replica, with nothing cached, reads the same key.
        let second = keys(&records, Some(KEK)).current(NOW).await.unwrap();
        assert_eq!((&first.kid, &first.jwk), (&second.kid, &second.jwk));
    }

    #[tokio::test]
    async fn a_sealed_key_moved_under_another_name_does_not_open() {
        let records = records().await;
        let key = keys(&records, Some(KEK)).current(NOW).await.unwrap();
        let next = format!("k{}", key.kid[1..].parse::<i64>().unwrap() + 1);
        let sealed = stored(&records, &key.kid).await;
        records
            .put(SIGNING_KEYS, &next, &sealed, None, Write::Create, None)
            .await
            .unwrap();
        let later = NOW + millis(ROTATION);
        let err = message(keys(&records, Some(KEK)).current(later).await.unwrap_err());
        assert!(err.contains("does not open"), "{err}");
    }

    #[tokio::test]
    async fn plain_keys_are_sealed_when_a_server_with_the_key_starts() {
        let records = records().await;
        let plain = keys(&records, None).current(NOW).await.unwrap();
        assert!(stored(&records, &plain.kid).await["pkcs8"].is_string());
        let starting = keys(&records, Some(KEK));
        starting.prepare(NOW).await.unwrap();
        let record = stored(&records, &plain.kid).await;
        assert!(record.get("pkcs8").is_none(), "sealed in place: {record}");
        let sealed = starting.current(NOW).await.unwrap();
        assert_eq!(plain.jwk, sealed.jwk, "the same key");
        let next = format!("k{}", plain.kid[1..].parse::<i64>().unwrap() + 1);
        assert!(
            stored(&records, &next).await["sealed"].is_string(),
            "the next one made"
        );
    }

    #[tokio::test]
    async fn keys_sealed_with_a_retired_key_are_sealed_again_at_startup() {
        let records = records().await;
        let old = keys(&records, Some(KEK)).current(NOW).await.unwrap();
        let rotating = KeyEncryption {
            seal: kek(OTHER),
            retired: vec![kek(KEK)],
        };
        let starting = SigningKeys::new(records.clone(), ROTATION, Some(rotating));
        // Reading does not seal again: a replica with an older configuration may still run.
        assert_eq!(starting.current(NOW).await.unwrap().jwk, old.jwk);
        assert!(keys(&records, Some(KEK)).current(NOW).await.is_ok());
        starting.prepare(NOW).await.unwrap();
        // Sealed again with the new key: a server without the old one opens it.
        let only_new = keys(&records, Some(OTHER));
        only_new.prepare(NOW).await.unwrap();
        assert_eq!(only_new.current(NOW).await.unwrap().jwk, old.jwk);
        let err = message(keys(&records, Some(KEK)).prepare(NOW).await.unwrap_err());
        assert!(err.contains("and this server has"), "{err}");
    }

    #[tokio::test]
    async fn a_sealed_key_is_refused_without_its_key_and_the_error_says_why() {
        let records = records().await;
        let key = keys(&records, Some(KEK)).current(NOW).await.unwrap();
        let err = message(keys(&records, None).current(NOW).await.unwrap_err());
        assert!(
            err.contains(&key.kid) && err.contains("this server has none"),
            "{err}"
        );
        // A server with another key does not start.
        let err = message(keys(&records, Some(OTHER)).prepare(NOW).await.unwrap_err());
        assert!(
            err.contains(&key.kid) && err.contains("and this server has"),
            "{err}"
        );
        // Once that key is the previous one, it does not matter.
        let later = NOW + millis(ROTATION);
        keys(&records, Some(OTHER)).prepare(later).await.unwrap();
    }

    #[tokio::test]
    async fn a_previous_key_that_does_not_open_is_left_out_of_the_published_set() {
        let records = records().await;
        keys(&records, Some(KEK)).current(NOW).await.unwrap();
        let later = NOW + millis(ROTATION);
        let set = keys(&records, Some(OTHER)).jwks(later).await.unwrap();
        assert_eq!(set["keys"].as_array().unwrap().len(), 2, "{set}");
    }

    #[tokio::test]
    async fn tokens_verify_only_when_this_server_signed_them_and_they_live() {
        #[derive(Serialize, Deserialize)]
        struct Claims {
            iss: String,
            sid: String,
            exp: i64,
        }
        let records = records().await;
        let ring = keys(&records, None);
        let now = wharf::store::now_millis();
        let key = ring.current(now).await.unwrap();
        let sign_as = |typ: &str, kid: &str, iss: &str, exp: i64| {
            let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
            header.typ = Some(typ.to_owned());
            header.kid = Some(kid.to_owned());
            let claims = Claims {
                iss: iss.to_owned(),
                sid: "family".to_owned(),
                exp,
            };
            jsonwebtoken::encode(&header, &claims, &key.encoding).unwrap()
        };
        let sign = |iss: &str, exp: i64| sign_as(ACCESS_TOKEN_TYPE, &key.kid, iss, exp);
        // One character of the signature changed, well inside it (the last one carries
        // padding bits a change may not reach).
        let tampered = |token: &str| {
            let at = token.len() - 20;
            let other = if &token[at..=at] == "A" { "B" } else { "A" };
            format!("{}{other}{}", &token[..at], &token[at + 1..])
        };
        let live = now / 1000 + 600;
        let good = sign("https://as.example", live);
        let verified = ring
            .verify::<Claims>(&good, "https://as.example")
            .await
            .unwrap();
        assert_eq!(verified.map(|c| c.sid).as_deref(), Some("family"));
        for (token, issuer) in [
            (good.clone(), "https://other.example"),
            (
                sign("https://as.example", now / 1000 - 3600),
                "https://as.example",
            ),
            (tampered(&good), "https://as.example"),
            ("not a token".to_owned(), "https://as.example"),
            (
                sign_as("JWT", &key.kid, "https://as.example", live),
                "https://as.example",
            ),
            (
                sign_as(
                    ACCESS_TOKEN_TYPE,
                    &format!("k0{}", &key.kid[1..]),
                    "https://as.example",
                    live,
                ),
                "https://as.example",
            ),
        ] {
            let claims = ring.verify::<Claims>(&token, issuer).await.unwrap();
            assert!(claims.is_none(), "{token} for {issuer}");
        }
    }

    #[test]
    fn a_key_encryption_key_is_32_bytes_of_base64() {
        assert!(KeyEncryptionKey::from_base64(KEK).is_ok());
        assert!(KeyEncryptionKey::from_base64(&format!(" {OTHER}\n")).is_ok());
        let short = KeyEncryptionKey::from_base64("c2hvcnQ=")
            .unwrap_err()
            .to_string();
        assert!(
            short.contains("32 bytes") && short.contains("has 5"),
            "{short}"
        );
        let junk = KeyEncryptionKey::from_base64("not base64!")
            .unwrap_err()
            .to_string();
        assert!(junk.contains("not base64"), "{junk}");
        let debug = format!("{:?}", KeyEncryptionKey::from_base64(KEK).unwrap());
        assert!(!debug.contains("bytes"), "{debug}");
    }
}
