//! The answer a refresh gave, kept with the spent refresh token so that the same request,
//! sent again because its response was lost, gets the same tokens instead of revoking the
//! family.
//!
//! Only the presented refresh token opens it: the answer is sealed (AES-256-GCM) under a key
//! derived from that token, which the store holds only as a digest, so reading the store
//! hands out no working credential. It is honoured only within the retry window, only for
//! the same request (its scope and resource), and only while the refresh token it handed
//! out is still unused: a client that used its new token got the answer, so a second
//! presentation of the old one is someone else's copy.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use wharf::store::{Millis, after};

use super::Prepared;

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
}

impl Retry {
    /// Seals `tokens`, the answer to `asked`, spent at `now`. `None` for tokens without a
    /// refresh token (nothing to repeat) or when sealing fails: the refresh then goes on
    /// without a retry, as with a window of zero.
    pub(super) fn seal(asked: &Asked<'_>, tokens: &Prepared, now: Millis) -> Option<Retry> {
        let answer = Answer {
            access_token: tokens.access_token.clone(),
            refresh_token: tokens.refresh_token.clone()?,
            expires_at: after(now, std::time::Duration::from_secs(tokens.expires_in)),
            scope: tokens.scope.clone(),
            asked_scope: asked.scope.map(str::to_owned),
        };
        let mut sealed = serde_json::to_vec(&answer).ok()?;
        let nonce: [u8; NONCE_LEN] = rand::random();
        key(asked.secret)?
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
        if now > after(self.at, window) {
            return None;
        }
        let bytes = URL_SAFE_NO_PAD.decode(&self.sealed).ok()?;
        if bytes.len() < NONCE_LEN {
            return None;
        }
        let (nonce, ciphertext) = bytes.split_at(NONCE_LEN);
        let mut ciphertext = ciphertext.to_vec();
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let plain = key(asked.secret)?
            .open_in_place(nonce, Aad::from(asked.key.as_bytes()), &mut ciphertext)
            .ok()?;
        let answer: Answer = serde_json::from_slice(plain).ok()?;
        if answer.asked_scope.as_deref() != asked.scope {
            return None;
        }
        let left = answer.expires_at.saturating_sub(now).max(0) / 1000;
        Some(Prepared {
            access_token: answer.access_token,
            refresh_token: Some(answer.refresh_token),
            expires_in: u64::try_from(left).unwrap_or(0),
            scope: answer.scope,
        })
    }
}

/// The sealing key for answers to `secret`: the refresh token is 32 random bytes, so one
/// hash with a label of its own is a sound key derivation.
fn key(secret: &str) -> Option<LessSafeKey> {
    let bytes =
        Sha256::digest([b"wharf-authz refresh retry ".as_slice(), secret.as_bytes()].concat());
    UnboundKey::new(&AES_256_GCM, &bytes)
        .ok()
        .map(LessSafeKey::new)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn tokens() -> Prepared {
        Prepared {
            access_token: "at".into(),
            refresh_token: Some("rt2".into()),
            expires_in: 600,
            scope: "read".into(),
        }
    }

    fn asked<'a>(secret: &'a str, scope: Option<&'a str>) -> Asked<'a> {
        Asked {
            secret,
            key: "digest-of-rt1",
            scope,
        }
    }

    #[test]
    fn the_same_request_within_the_window_gets_the_same_tokens() {
        let retry = Retry::seal(&asked("rt1", Some("read")), &tokens(), 1_000_000).unwrap();
        let window = Duration::from_secs(60);
        let again = retry
            .open(&asked("rt1", Some("read")), window, 1_030_000)
            .unwrap();
        assert_eq!(again.access_token, "at");
        assert_eq!(again.refresh_token.as_deref(), Some("rt2"));
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
        altered.sealed = URL_SAFE_NO_PAD.encode(bytes);
        assert!(
            altered
                .open(&asked("rt1", None), window, 1_000_001)
                .is_none()
        );
        assert!(
            !retry.sealed.contains("rt2"),
            "the store holds no working token"
        );
    }

    #[test]
    fn tokens_without_a_refresh_token_keep_nothing() {
        let mut tokens = tokens();
        tokens.refresh_token = None;
        assert!(Retry::seal(&asked("rt1", None), &tokens, 0).is_none());
    }
}
