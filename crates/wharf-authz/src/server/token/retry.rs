//! The answer a refresh gave, kept with the spent refresh token so that the same request,
//! sent again because its response was lost, gets the same tokens instead of revoking the
//! family.
//!
//! It is sealed (AES-256-GCM) under a key derived from the presented refresh token, which
//! the store holds only as a digest, and from the key encryption key when the server has
//! one: reading the store alone opens nothing, and with a key encryption key neither does
//! reading the store with a spent refresh token in hand. It is honoured only within the
//! retry window, only for the same request (its scope and resource), and only while the
//! refresh token it handed out is still unused: a client that used its new token got the
//! answer, so a second presentation of the old one is someone else's copy.
//!
//! What the window gives up: for as long as it runs and the new refresh token is unused,
//! someone else presenting a copy of the spent token gets the same tokens as its client,
//! where without it they would get nothing and revoke the family. So the window is short
//! (a minute by default, five at most).

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use wharf::store::{Millis, after};

use super::Prepared;
use crate::keys::KeyEncryption;

/// The longest retry window honoured, whatever the configuration says.
pub(crate) const MAX_WINDOW: std::time::Duration = std::time::Duration::from_secs(300);

/// A refresh's answer, sealed under the refresh token it spent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Retry {
    /// When the token was spent: the window runs from here.
    at: Millis,
    /// Base64 of the nonce, then the sealed [`Answer`] and its tag.
    sealed: String,
}

/// What a retry gets back, and what makes it the same request.
#[derive(Serialize, Deserialize)]
struct Answer {
    access_token: String,
    refresh_token: String,
    /// When the access token expires.
    expires_at: Millis,
    scope: String,
    /// The `scope` the request asked for, if any.
    asked_scope: Option<String>,
}

/// The request a refresh answers, as far as a retry must repeat it.
pub(super) struct Asked<'a> {
    /// The presented refresh token.
    pub(super) secret: &'a str,
    /// The digest its record is filed under.
    pub(super) key: &'a str,
    /// The `scope` parameter.
    pub(super) scope: Option<&'a str>,
    /// The server's key encryption keys, if any.
    pub(super) keys: Option<&'a KeyEncryption>,
}

impl Retry {
    /// Seals `tokens`, the answer to `asked`, spent at `now`. `None` for tokens without a
    /// refresh token (nothing to repeat) or when sealing fails: the refresh then goes on
    /// without a retry, as with a window of zero.
    pub(super) fn seal(asked: &Asked<'_>, tokens: &Prepared, now: Millis) -> Option<Retry> {
        let answer = Answer {
            access_token: tokens.access_token.clone(),
            refresh_token: tokens.refresh_token.clone()?,
            expires_at: tokens.expires_at,
            scope: tokens.scope.clone(),
            asked_scope: asked.scope.map(str::to_owned),
        };
        let mut sealed = serde_json::to_vec(&answer).ok()?;
        let nonce: [u8; NONCE_LEN] = rand::random();
        let sealing = asked.keys.map(|keys| &keys.seal);
        key(asked.secret, sealing)?
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(asked.key.as_bytes()),
                &mut sealed,
            )
            .ok()?;
        Some(Retry {
            at: now,
            sealed: URL_SAFE_NO_PAD.encode([nonce.as_slice(), &sealed].concat()),
        })
    }

    /// The tokens to answer `asked` with again, and the refresh token they hold, if `asked`
    /// repeats the request this answered and it is `now` within `window` of it. Whether
    /// that refresh token is still unused is the caller's to check.
    pub(super) fn open(
        &self,
        asked: &Asked<'_>,
        window: std::time::Duration,
        now: Millis,
    ) -> Option<Prepared> {
        if now > after(self.at, window.min(MAX_WINDOW)) {
            return None;
        }
        let bytes = URL_SAFE_NO_PAD.decode(&self.sealed).ok()?;
        if bytes.len() < NONCE_LEN {
            return None;
        }
        let (nonce, ciphertext) = bytes.split_at(NONCE_LEN);
        // Sealed with the key encryption key of then: the current one, or one retired since.
        let keys: Vec<_> = match asked.keys {
            Some(keys) => std::iter::once(&keys.seal)
                .chain(&keys.retired)
                .map(Some)
                .collect(),
            None => vec![None],
        };
        let answer: Answer = keys.into_iter().find_map(|kek| {
            let mut ciphertext = ciphertext.to_vec();
            let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
            let plain = key(asked.secret, kek)?
                .open_in_place(nonce, Aad::from(asked.key.as_bytes()), &mut ciphertext)
                .ok()?;
            serde_json::from_slice(plain).ok()
        })?;
        if answer.asked_scope.as_deref() != asked.scope {
            return None;
        }
        let left = answer.expires_at.saturating_sub(now).max(0) / 1000;
        Some(Prepared {
            access_token: answer.access_token,
            refresh_token: Some(answer.refresh_token),
            expires_in: u64::try_from(left).unwrap_or(0),
            expires_at: answer.expires_at,
            scope: answer.scope,
        })
    }
}

/// The sealing key for answers to `secret`: the refresh token is 32 random bytes, so one
/// hash with a label of its own (and the key encryption key, when there is one) is a sound
/// key derivation.
fn key(secret: &str, kek: Option<&crate::keys::KeyEncryptionKey>) -> Option<LessSafeKey> {
    const LABEL: &[u8] = b"wharf-authz refresh retry ";
    let bytes: [u8; 32] = match kek {
        Some(kek) => kek.derive(LABEL, secret.as_bytes()),
        None => Sha256::digest([LABEL, secret.as_bytes()].concat()).into(),
    };
    UnboundKey::new(&AES_256_GCM, &bytes)
        .ok()
        .map(LessSafeKey::new)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::keys::KeyEncryptionKey;

    const NEW_REFRESH_TOKEN: &str = "the-new-refresh-token-handed-out";

    fn tokens() -> Prepared {
        Prepared {
            access_token: "at".into(),
            refresh_token: Some(NEW_REFRESH_TOKEN.into()),
            expires_in: 600,
            expires_at: 1_600_000,
            scope: "read".into(),
        }
    }

    fn asked<'a>(secret: &'a str, scope: Option<&'a str>) -> Asked<'a> {
        Asked {
            secret,
            key: "digest-of-rt1",
            scope,
            keys: None,
        }
    }

    fn kek(byte: u8) -> KeyEncryptionKey {
        use base64::engine::general_purpose::STANDARD;
        KeyEncryptionKey::from_base64(&STANDARD.encode([byte; 32])).unwrap()
    }

    #[test]
    fn the_same_request_within_the_window_gets_the_same_tokens() {
        let retry = Retry::seal(&asked("rt1", Some("read")), &tokens(), 1_000_000).unwrap();
        let window = Duration::from_secs(60);
        let again = retry
            .open(&asked("rt1", Some("read")), window, 1_030_000)
            .unwrap();
        assert_eq!(again.access_token, "at");
        assert_eq!(again.refresh_token.as_deref(), Some(NEW_REFRESH_TOKEN));
        assert_eq!(again.scope, "read");
        assert_eq!(again.expires_in, 570, "the access token's time left");
    }

    #[test]
    fn another_request_a_late_one_or_another_secret_gets_nothing() {
        let retry = Retry::seal(&asked("rt1", None), &tokens(), 1_000_000).unwrap();
        let window = Duration::from_secs(60);
        assert!(retry.open(&asked("rt1", None), window, 1_060_000).is_some());
        assert!(retry.open(&asked("rt1", None), window, 1_060_001).is_none());
        assert!(
            retry
                .open(&asked("rt1", Some("read")), window, 1_000_001)
                .is_none()
        );
        assert!(retry.open(&asked("rtX", None), window, 1_000_001).is_none());
        let elsewhere = Asked {
            key: "digest-of-another",
            ..asked("rt1", None)
        };
        assert!(
            retry.open(&elsewhere, window, 1_000_001).is_none(),
            "bound to the record it was kept in"
        );
        let mut altered = retry.clone();
        let mut bytes = URL_SAFE_NO_PAD.decode(&altered.sealed).unwrap();
        bytes[NONCE_LEN + 3] ^= 1;
        altered.sealed = URL_SAFE_NO_PAD.encode(&bytes);
        assert!(
            altered
                .open(&asked("rt1", None), window, 1_000_001)
                .is_none()
        );
        let stored = URL_SAFE_NO_PAD.decode(&retry.sealed).unwrap();
        assert!(
            !stored
                .windows(NEW_REFRESH_TOKEN.len())
                .any(|w| w == NEW_REFRESH_TOKEN.as_bytes()),
            "the store holds no working token"
        );
    }

    /// Sealed with a key encryption key, an answer opens only with it (current or retired
    /// since): a spent refresh token and the store are not enough.
    #[test]
    fn a_key_encryption_key_is_needed_to_open_what_it_sealed() {
        let window = Duration::from_secs(60);
        let opens = |retry: &Retry, keys: Option<&KeyEncryption>| {
            let asked = Asked {
                keys,
                ..asked("rt1", None)
            };
            retry.open(&asked, window, 1_000_001).is_some()
        };
        let current = KeyEncryption::new(kek(1), Vec::new());
        let sealing = Asked {
            keys: Some(&current),
            ..asked("rt1", None)
        };
        let retry = Retry::seal(&sealing, &tokens(), 1_000_000).unwrap();
        assert!(opens(&retry, Some(&current)));
        assert!(!opens(&retry, None));
        let rotated = KeyEncryption::new(kek(2), vec![kek(1)]);
        assert!(opens(&retry, Some(&rotated)));
        assert!(!opens(
            &retry,
            Some(&KeyEncryption::new(kek(3), Vec::new()))
        ));
    }

    #[test]
    fn tokens_without_a_refresh_token_keep_nothing() {
        let mut tokens = tokens();
        tokens.refresh_token = None;
        assert!(Retry::seal(&asked("rt1", None), &tokens, 0).is_none());
    }
}
