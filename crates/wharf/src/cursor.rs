//! Signed stateless cursors: the position in a list, sealed with HMAC-SHA256 so any replica
//! holding the same keys can resume a listing, and nobody can forge one. A cursor names the
//! key that signed it (`KID.PAYLOAD`), so keys rotate without breaking cursors in use.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::RpcError;
use crate::keyset::KeySet;
use crate::store::{Millis, now_millis};

type HmacSha256 = Hmac<Sha256>;

const VERSION: u8 = 3;
const PAYLOAD_LEN: usize = 1 + 1 + 8 + 8 + 8;
const TAG_LEN: usize = 16;

/// Which list a cursor belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum ListKind {
    Tools = 1,
    Prompts = 2,
    Resources = 3,
    ResourceTemplates = 4,
    /// A position in an app's own listing (see [`crate::Context::cursor`]).
    App = 5,
}

/// A fixed key to sign cursors with, instead of the keys replicas share through their store.
/// Replicas that share a key resume each other's cursors.
#[derive(Clone)]
pub struct CursorKey(Vec<u8>);

/// The key id of a fixed [`CursorKey`].
const FIXED_KID: &str = "c";

/// A cursor key shorter than [`CursorKey::MIN_LEN`] bytes: cursors signed with it could be
/// forged by whoever guesses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a cursor key must be at least 32 bytes; this one is {0}")]
pub struct ShortCursorKey(pub usize);

impl CursorKey {
    /// The fewest secret bytes a key may have.
    pub const MIN_LEN: usize = 32;

    /// A key from secret bytes, at least [`CursorKey::MIN_LEN`] of them (an empty or
    /// mistyped secret would sign cursors anyone can make).
    ///
    /// ```
    /// use wharf::{CursorKey, ShortCursorKey};
    ///
    /// assert!(CursorKey::new([7u8; 32]).is_ok());
    /// assert_eq!(CursorKey::new(*b"secret").unwrap_err(), ShortCursorKey(6));
    /// ```
    pub fn new(secret: impl Into<Vec<u8>>) -> Result<Self, ShortCursorKey> {
        let secret = secret.into();
        if secret.len() < Self::MIN_LEN {
            return Err(ShortCursorKey(secret.len()));
        }
        Ok(CursorKey(secret))
    }

    /// A random key, private to this process: cursors will not survive a restart nor move
    /// between replicas.
    pub fn random() -> Self {
        CursorKey(rand::random::<[u8; 32]>().to_vec())
    }
}

impl std::fmt::Debug for CursorKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CursorKey(..)")
    }
}

/// Why a cursor was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CursorError {
    #[error("the cursor is not one this server issued")]
    Invalid,
    #[error("the cursor belongs to another list")]
    WrongList,
    #[error("the cursor is stale: the list changed since it was issued; list again from the start")]
    Stale,
    #[error("the cursor has expired; list again from the start")]
    Expired,
    /// An app's cursor ([`Context::cursor`](crate::Context::cursor)) bound to another scope.
    #[error("the cursor was issued for another listing or caller; list again from the start")]
    OtherListing,
}

impl From<CursorError> for RpcError {
    fn from(e: CursorError) -> Self {
        RpcError::invalid_params(format!("Invalid cursor: {e}"))
    }
}

/// Issues and checks cursors.
#[derive(Clone)]
pub(crate) struct CursorCodec {
    keys: KeySet<HmacSha256>,
    max_age: Duration,
}

impl std::fmt::Debug for CursorCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CursorCodec")
            .field("key_ids", &self.keys.ids())
            .field("max_age", &self.max_age)
            .finish()
    }
}

/// The MAC of a [`CursorCodec::tag`]: the key's id, the purpose and the data, each framed.
fn tag_mac(key: &HmacSha256, kid: &str, purpose: &[u8], data: &[u8]) -> HmacSha256 {
    let mut mac = key.clone();
    mac.update(b"tag\0");
    mac.update(kid.as_bytes());
    mac.update(&[0]);
    mac.update(purpose);
    mac.update(&[0]);
    mac.update(data);
    mac
}

fn keyed(secret: &[u8]) -> HmacSha256 {
    // HMAC accepts keys of any length.
    HmacSha256::new_from_slice(secret).unwrap_or_else(|_| unreachable!("HMAC takes any key length"))
}

impl CursorCodec {
    /// A codec that signs with `key` alone and refuses cursors older than `max_age`.
    pub(crate) fn new(key: &CursorKey, max_age: Duration) -> Self {
        CursorCodec {
            keys: KeySet::single(FIXED_KID, keyed(&key.0)),
            max_age,
        }
    }

    /// A codec over rotating keys: `(id, secret, active from, expires at)`.
    pub(crate) fn rotating(
        keys: impl IntoIterator<Item = (String, [u8; 32], Millis, Millis)>,
        max_age: Duration,
    ) -> Option<Self> {
        Some(CursorCodec {
            keys: KeySet::rotating(keys, |secret| keyed(secret))?,
            max_age,
        })
    }

    /// A cursor pointing at `offset` in list `kind` whose content has `fingerprint`.
    pub(crate) fn encode(&self, kind: ListKind, offset: u64, fingerprint: u64) -> String {
        let issued = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let mut buf = Vec::with_capacity(PAYLOAD_LEN + TAG_LEN);
        buf.push(VERSION);
        buf.push(kind as u8);
        buf.extend_from_slice(&offset.to_be_bytes());
        buf.extend_from_slice(&fingerprint.to_be_bytes());
        buf.extend_from_slice(&issued.to_be_bytes());
        let signer = self.keys.current(now_millis());
        let mut mac = signer.key.clone();
        mac.update(signer.id.as_bytes());
        mac.update(&buf);
        let tag = mac.finalize().into_bytes();
        buf.extend_from_slice(&tag[..TAG_LEN]);
        format!("{}.{}", signer.id, URL_SAFE_NO_PAD.encode(buf))
    }

    /// A tag that binds `data` to this server's keys, for a value a client must hand back as
    /// it got it (a legacy session's server request ids): `{key id}.{tag}`. `purpose` keeps
    /// the tags of one use from passing for another's, or for a cursor's.
    pub(crate) fn tag(&self, purpose: &[u8], data: &[u8]) -> String {
        let signer = self.keys.current(now_millis());
        let tag = tag_mac(&signer.key, &signer.id, purpose, data).finalize();
        format!(
            "{}.{}",
            signer.id,
            URL_SAFE_NO_PAD.encode(&tag.into_bytes()[..TAG_LEN])
        )
    }

    /// Whether `tag` is what [`tag`](Self::tag) gave for `purpose` and `data`, under a key
    /// still open.
    pub(crate) fn is_tag(&self, purpose: &[u8], data: &[u8], tag: &str) -> bool {
        let Some((kid, encoded)) = tag.split_once('.') else {
            return false;
        };
        let Some(key) = self.keys.opener(kid, now_millis()) else {
            return false;
        };
        URL_SAFE_NO_PAD.decode(encoded).is_ok_and(|t| {
            t.len() == TAG_LEN
                && tag_mac(key, kid, purpose, data)
                    .verify_truncated_left(&t)
                    .is_ok()
        })
    }

    /// The offset a cursor points at, after checking its signature, list, freshness and age.
    pub(crate) fn decode(
        &self,
        cursor: &str,
        kind: ListKind,
        fingerprint: u64,
    ) -> Result<u64, CursorError> {
        let (kid, body) = cursor.split_once('.').ok_or(CursorError::Invalid)?;
        let key = self
            .keys
            .opener(kid, now_millis())
            .ok_or(CursorError::Invalid)?;
        let buf = URL_SAFE_NO_PAD
            .decode(body)
            .map_err(|_| CursorError::Invalid)?;
        if buf.len() != PAYLOAD_LEN + TAG_LEN || buf[0] != VERSION {
            return Err(CursorError::Invalid);
        }
        let (payload, tag) = buf.split_at(PAYLOAD_LEN);
        let mut mac = key.clone();
        mac.update(kid.as_bytes());
        mac.update(payload);
        mac.verify_truncated_left(tag)
            .map_err(|_| CursorError::Invalid)?;
        if payload[1] != kind as u8 {
            return Err(CursorError::WrongList);
        }
        let word = |range: std::ops::Range<usize>| {
            payload[range]
                .iter()
                .fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
        };
        let offset = word(2..10);
        if word(10..18) != fingerprint {
            return Err(CursorError::Stale);
        }
        let issued = word(18..26);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        if now.saturating_sub(issued) > self.max_age.as_secs() {
            return Err(CursorError::Expired);
        }
        Ok(offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codec() -> CursorCodec {
        CursorCodec::new(
            &CursorKey::new(b"k".repeat(32)).unwrap(),
            Duration::from_secs(60),
        )
    }

    /// The payload of a cursor, re-signed with `codec`'s current key after `edit`.
    fn resigned(codec: &CursorCodec, cursor: &str, edit: impl FnOnce(&mut Vec<u8>)) -> String {
        let (kid, body) = cursor.split_once('.').unwrap();
        let mut bytes = URL_SAFE_NO_PAD.decode(body).unwrap();
        edit(&mut bytes);
        let mut mac = codec.keys.current(now_millis()).key.clone();
        mac.update(kid.as_bytes());
        mac.update(&bytes[..PAYLOAD_LEN]);
        let tag = mac.finalize().into_bytes();
        bytes[PAYLOAD_LEN..].copy_from_slice(&tag[..TAG_LEN]);
        format!("{kid}.{}", URL_SAFE_NO_PAD.encode(bytes))
    }

    proptest::proptest! {
        /// Any offset and fingerprint come back from the cursor that carries them, and a
        /// cursor with any one character changed is refused, never read as another offset.
        #[test]
        fn cursors_round_trip_and_refuse_any_change(
            offset: u64,
            fingerprint: u64,
            at: proptest::sample::Index,
            with in proptest::char::range('-', 'z'),
        ) {
            let codec = codec();
            let c = codec.encode(ListKind::Tools, offset, fingerprint);
            proptest::prop_assert_eq!(codec.decode(&c, ListKind::Tools, fingerprint), Ok(offset));
            let mut changed: Vec<char> = c.chars().collect();
            let i = at.index(changed.len());
            proptest::prop_assume!(changed[i] != with);
            changed[i] = with;
            let changed: String = changed.into_iter().collect();
            proptest::prop_assert!(codec.decode(&changed, ListKind::Tools, fingerprint).is_err());
        }

        /// Whatever a client sends as a cursor, decoding answers without panicking.
        #[test]
        fn any_string_decodes_or_is_refused(cursor in ".{0,80}") {
            let _ = codec().decode(&cursor, ListKind::Tools, 0);
        }
    }

    #[test]
    fn a_cursor_resumes_on_any_codec_with_the_same_key() {
        let c = codec().encode(ListKind::Tools, 7, 42);
        assert!(c.starts_with("c."), "{c}");
        assert_eq!(codec().decode(&c, ListKind::Tools, 42), Ok(7));
    }

    /// A tag holds for its purpose and data under the same key, and for nothing else: not
    /// shortened, not under another key or purpose, not as a cursor.
    #[test]
    fn a_tag_holds_for_its_purpose_and_data_only() {
        let t = codec().tag(b"p", b"data");
        assert!(codec().is_tag(b"p", b"data", &t), "{t}");
        assert!(!codec().is_tag(b"p", b"datb", &t));
        assert!(!codec().is_tag(b"q", b"data", &t));
        let other = CursorCodec::new(
            &CursorKey::new(b"x".repeat(32)).unwrap(),
            Duration::from_secs(60),
        );
        assert!(!other.is_tag(b"p", b"data", &t));
        let short = &t[..t.len() - 2];
        for forged in ["", "c", "c.", "c.!!", "x.AAAA", short] {
            assert!(!codec().is_tag(b"p", b"data", forged), "{forged}");
        }
        assert_eq!(
            codec().decode(&t, ListKind::App, 0),
            Err(CursorError::Invalid)
        );
    }

    #[test]
    fn forged_garbage_stale_and_foreign_cursors_are_refused() {
        let c = codec().encode(ListKind::Tools, 7, 42);
        for garbage in ["garbage!", "", "c.", "c.!!", "x.AAAA"] {
            assert_eq!(
                codec().decode(garbage, ListKind::Tools, 42),
                Err(CursorError::Invalid),
                "{garbage}"
            );
        }
        let other = CursorCodec::new(
            &CursorKey::new(b"x".repeat(32)).unwrap(),
            Duration::from_secs(60),
        );
        assert_eq!(
            other.decode(&c, ListKind::Tools, 42),
            Err(CursorError::Invalid)
        );
        let (kid, body) = c.split_once('.').unwrap();
        let mut bytes = URL_SAFE_NO_PAD.decode(body).unwrap();
        bytes[5] ^= 1; // move the offset without re-signing
        let moved = format!("{kid}.{}", URL_SAFE_NO_PAD.encode(bytes));
        assert_eq!(
            codec().decode(&moved, ListKind::Tools, 42),
            Err(CursorError::Invalid)
        );
        assert_eq!(
            codec().decode(&c, ListKind::Prompts, 42),
            Err(CursorError::WrongList)
        );
        assert_eq!(
            codec().decode(&c, ListKind::Tools, 43),
            Err(CursorError::Stale)
        );
        let strict = CursorCodec::new(&CursorKey::new(b"k".repeat(32)).unwrap(), Duration::ZERO);
        let old = resigned(&strict, &c, |b| {
            b[18..26].copy_from_slice(&0u64.to_be_bytes())
        });
        assert_eq!(
            strict.decode(&old, ListKind::Tools, 42),
            Err(CursorError::Expired)
        );
    }

    #[test]
    fn rotated_keys_open_what_they_signed_until_they_expire() {
        let now = now_millis();
        let day = 86_400_000;
        let ring = |keys: &[(&str, u8, Millis, Millis)]| {
            CursorCodec::rotating(
                keys.iter()
                    .map(|(id, b, from, to)| ((*id).to_owned(), [*b; 32], *from, *to)),
                Duration::from_secs(60),
            )
            .unwrap()
        };
        let before = ring(&[("e1", 1, now - day, now + day)]);
        let c = before.encode(ListKind::Tools, 3, 9);
        assert!(c.starts_with("e1."), "{c}");
        let after = ring(&[
            ("e1", 1, now - 2 * day, now + 1000),
            ("e2", 2, now - 10, now + day),
        ]);
        assert!(after.encode(ListKind::Tools, 3, 9).starts_with("e2."));
        assert_eq!(after.decode(&c, ListKind::Tools, 9), Ok(3), "the overlap");
        let expired = ring(&[
            ("e1", 1, now - 2 * day, now - 1),
            ("e2", 2, now - 10, now + day),
        ]);
        assert_eq!(
            expired.decode(&c, ListKind::Tools, 9),
            Err(CursorError::Invalid)
        );
        // The key id is signed: a cursor moved under another id does not verify.
        let same_secret = ring(&[("e3", 1, now - day, now + day)]);
        let renamed = c.replacen("e1.", "e3.", 1);
        assert_eq!(
            same_secret.decode(&renamed, ListKind::Tools, 9),
            Err(CursorError::Invalid)
        );
    }
}
