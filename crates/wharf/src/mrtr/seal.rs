//! Sealed `requestState`: what a server needs to resume a multi-round request, encrypted and
//! authenticated (XChaCha20-Poly1305) under a key id, so the client can carry it but neither
//! read nor alter it, and any replica holding the key can open it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::RpcError;
use crate::keyset::{KeySet, Versioned};
use crate::store::{Millis, now_millis};

/// Bytes of a state key.
pub(crate) const KEY_LEN: usize = 32;
const NONCE_LEN: usize = 24;

/// Fixed keys to seal and open request states with, instead of the keys replicas share
/// through their store. The first key seals; every key opens, so keys can be rotated by
/// hand: add the new key everywhere, put it first, drop the old one after the state
/// lifetime. Replicas must share the keys.
#[derive(Clone)]
pub struct StateKeys {
    keys: KeySet<XChaCha20Poly1305>,
}

impl fmt::Debug for StateKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StateKeys")
            .field("current", &self.keys.current(now_millis()).id)
            .field("key_ids", &self.keys.ids())
            .finish()
    }
}

/// Why a key specification was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// Not `KID=BASE64`.
    #[error("a state key is written KID=BASE64 (KID: 1 to 16 letters, digits, '-' or '_')")]
    Shape,
    /// The key is not 32 bytes of base64.
    #[error("state key {0:?}: the key must be 32 bytes in standard or URL-safe base64")]
    Key(String),
    /// Two keys share an id.
    #[error("state key id {0:?} is given twice")]
    Duplicate(String),
    /// No key at all.
    #[error("no state key given")]
    Empty,
}

impl StateKeys {
    /// A random key for this process only: states then resume only on this replica.
    pub fn random() -> Self {
        let key: [u8; KEY_LEN] = rand::random();
        StateKeys {
            keys: KeySet::single("r", XChaCha20Poly1305::new(&key.into())),
        }
    }

    /// Rotating keys: `(id, secret, active from, expires at)`; `None` when there is none.
    pub(crate) fn rotating(
        keys: impl IntoIterator<Item = (String, [u8; KEY_LEN], Millis, Millis)>,
    ) -> Option<Self> {
        Some(StateKeys {
            keys: KeySet::rotating(keys, |secret| XChaCha20Poly1305::new(secret.into()))?,
        })
    }

    /// Keys from `KID=BASE64` specifications; the first seals, all open.
    pub fn parse<S: AsRef<str>>(specs: &[S]) -> Result<Self, KeyError> {
        let mut keys: Vec<Versioned<XChaCha20Poly1305>> = Vec::new();
        for spec in specs {
            let (kid, b64) = spec.as_ref().split_once('=').ok_or(KeyError::Shape)?;
            let valid_kid = (1..=16).contains(&kid.len())
                && kid
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if !valid_kid {
                return Err(KeyError::Shape);
            }
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .or_else(|_| URL_SAFE_NO_PAD.decode(b64.trim().trim_end_matches('=')))
                .map_err(|_| KeyError::Key(kid.to_owned()))?;
            let key: [u8; KEY_LEN] = bytes
                .try_into()
                .map_err(|_| KeyError::Key(kid.to_owned()))?;
            if keys.iter().any(|k| k.id == kid) {
                return Err(KeyError::Duplicate(kid.to_owned()));
            }
            keys.push(Versioned {
                id: kid.to_owned(),
                // The first key is the newest, so it seals.
                active_from: if keys.is_empty() { 0 } else { Millis::MIN },
                expires_at: Millis::MAX,
                key: XChaCha20Poly1305::new(&key.into()),
            });
        }
        Ok(StateKeys {
            keys: KeySet::new(keys).ok_or(KeyError::Empty)?,
        })
    }

    /// Seals `state` under the current key.
    pub(crate) fn seal(&self, state: &SealedState) -> Result<String, RpcError> {
        let current = self.keys.current(now_millis());
        let plain = serde_json::to_vec(state).map_err(RpcError::internal)?;
        let nonce: [u8; NONCE_LEN] = rand::random();
        let sealed = current
            .key
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: &plain,
                    aad: current.id.as_bytes(),
                },
            )
            .map_err(|_| RpcError::internal("sealing a request state failed"))?;
        let mut bytes = Vec::with_capacity(NONCE_LEN + sealed.len());
        bytes.extend_from_slice(&nonce);
        bytes.extend_from_slice(&sealed);
        Ok(format!("{}.{}", current.id, URL_SAFE_NO_PAD.encode(bytes)))
    }

    /// Opens a state this server (or a replica with the same keys) sealed; `None` when it
    /// did not, or when it was altered.
    pub(crate) fn open(&self, token: &str) -> Option<SealedState> {
        let (kid, body) = token.split_once('.')?;
        let cipher = self.keys.opener(kid, now_millis())?;
        let bytes = URL_SAFE_NO_PAD.decode(body).ok()?;
        if bytes.len() <= NONCE_LEN {
            return None;
        }
        let (nonce, sealed) = bytes.split_at(NONCE_LEN);
        let plain = cipher
            .decrypt(
                XNonce::from_slice(nonce),
                Payload {
                    msg: sealed,
                    aad: kid.as_bytes(),
                },
            )
            .ok()?;
        serde_json::from_slice(&plain).ok()
    }
}

/// What a sealed request state holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct SealedState {
    /// The principal it was issued to.
    #[serde(rename = "p")]
    pub(crate) principal: String,
    /// The OAuth client it was issued through, when the principal's token names one: an
    /// elicitation is bound to the client and the user (2026-07-28 client/elicitation).
    #[serde(rename = "c", default, skip_serializing_if = "Option::is_none")]
    pub(crate) client: Option<String>,
    /// When it stops being accepted.
    #[serde(rename = "e")]
    pub(crate) expires_at: Millis,
    /// The method and the digest of the request's salient params.
    #[serde(rename = "m")]
    pub(crate) method: String,
    #[serde(rename = "d")]
    pub(crate) digest: String,
    /// How many rounds asked so far (1 after the first).
    #[serde(rename = "r")]
    pub(crate) round: u32,
    /// Random, for one-time redemption.
    #[serde(rename = "n")]
    pub(crate) nonce: String,
    /// What was asked, by key: answers are read against it.
    #[serde(rename = "a", default)]
    pub(crate) asked: BTreeMap<String, Asked>,
    /// The handler's own state.
    #[serde(rename = "s", default, skip_serializing_if = "Option::is_none")]
    pub(crate) state: Option<Value>,
    /// What the handler asked for and the client could not be asked (it lacks the
    /// capability): asked again, it is refused as missing.
    #[serde(rename = "l", default, skip_serializing_if = "BTreeSet::is_empty")]
    pub(crate) left_out: BTreeSet<String>,
}

/// One input request as the server remembers it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "k")]
pub(crate) enum Asked {
    /// Form elicitation, with the schema its content must match.
    #[serde(rename = "f")]
    Form { schema: Value },
    #[serde(rename = "u")]
    Url,
    #[serde(rename = "s")]
    Sample,
    #[serde(rename = "r")]
    Roots,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> SealedState {
        SealedState {
            principal: "user-1".into(),
            client: Some("app".into()),
            expires_at: 10,
            method: "tools/call".into(),
            digest: "abc".into(),
            round: 1,
            nonce: "n".into(),
            asked: BTreeMap::new(),
            state: Some(serde_json::json!({"step": 2})),
            left_out: BTreeSet::from(["roots".to_owned()]),
        }
    }

    #[test]
    fn sealed_states_open_with_any_accepted_key_and_only_unaltered() {
        let old = StateKeys::parse(&["k1=AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="]).unwrap();
        let token = old.seal(&state()).unwrap();
        assert!(token.starts_with("k1."));
        assert!(!token.contains("user-1"), "the content is encrypted");
        assert_eq!(old.open(&token), Some(state()));
        // Rotation: a new current key, the old one still accepted.
        let rotated = StateKeys::parse(&[
            "k2=HxwdHBsaGRgXFhUUExIREA8ODQwLCgkIBwYFBAMCAQA=",
            "k1=AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
        ])
        .unwrap();
        assert_eq!(rotated.open(&token), Some(state()));
        assert!(rotated.seal(&state()).unwrap().starts_with("k2."));
        // Altered anywhere, or under a key id it was not sealed with: refused.
        let mut bytes = token.clone().into_bytes();
        let last = bytes.len() - 2;
        bytes[last] = if bytes[last] == b'A' { b'B' } else { b'A' };
        assert_eq!(old.open(&String::from_utf8(bytes).unwrap()), None);
        assert_eq!(old.open(&format!("{token}-TAMPERED")), None);
        assert_eq!(old.open(&token.replacen("k1.", "k2.", 1)), None);
        assert_eq!(StateKeys::random().open(&token), None);
        assert_eq!(old.open("garbage"), None);
    }

    #[test]
    fn key_specifications_are_checked() {
        assert!(matches!(StateKeys::parse(&["nokey"]), Err(KeyError::Shape)));
        assert!(matches!(
            StateKeys::parse(&["k=AAAA"]),
            Err(KeyError::Key(_))
        ));
        assert!(matches!(
            StateKeys::parse::<&str>(&[]),
            Err(KeyError::Empty)
        ));
    }
}
