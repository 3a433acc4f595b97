//! Signed stateless cursors: the position in a list, sealed with HMAC-SHA256 so any replica
//! holding the same key can resume a listing, and nobody can forge one.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::RpcError;

type HmacSha256 = Hmac<Sha256>;

const VERSION: u8 = 2;
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

/// The key cursors are signed with. Replicas that share a key resume each other's cursors.
#[derive(Clone)]
pub struct CursorKey(Vec<u8>);

impl CursorKey {
    /// A key from secret bytes (at least 32 are recommended).
    pub fn new(secret: impl Into<Vec<u8>>) -> Self {
        CursorKey(secret.into())
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
}

impl From<CursorError> for RpcError {
    fn from(e: CursorError) -> Self {
        RpcError::invalid_params(format!("Invalid cursor: {e}"))
    }
}

/// Issues and checks cursors.
#[derive(Debug, Clone)]
pub(crate) struct CursorCodec {
    key: CursorKey,
    max_age: Duration,
}

impl CursorCodec {
    /// A codec that refuses cursors older than `max_age`.
    pub(crate) fn new(key: CursorKey, max_age: Duration) -> Self {
        CursorCodec { key, max_age }
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC accepts keys of any length.
        HmacSha256::new_from_slice(&self.key.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes any key length"))
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
        let mut mac = self.mac();
        mac.update(&buf);
        let tag = mac.finalize().into_bytes();
        buf.extend_from_slice(&tag[..TAG_LEN]);
        URL_SAFE_NO_PAD.encode(buf)
    }

    /// The offset a cursor points at, after checking its signature, list, freshness and age.
    pub(crate) fn decode(
        &self,
        cursor: &str,
        kind: ListKind,
        fingerprint: u64,
    ) -> Result<u64, CursorError> {
        let buf = URL_SAFE_NO_PAD
            .decode(cursor)
            .map_err(|_| CursorError::Invalid)?;
        if buf.len() != PAYLOAD_LEN + TAG_LEN || buf[0] != VERSION {
            return Err(CursorError::Invalid);
        }
        let (payload, tag) = buf.split_at(PAYLOAD_LEN);
        let mut mac = self.mac();
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
        CursorCodec::new(CursorKey::new(b"k".repeat(32)), Duration::from_secs(60))
    }

    #[test]
    fn a_cursor_resumes_on_any_codec_with_the_same_key() {
        let c = codec().encode(ListKind::Tools, 7, 42);
        assert_eq!(codec().decode(&c, ListKind::Tools, 42), Ok(7));
    }

    #[test]
    fn forged_garbage_stale_and_foreign_cursors_are_refused() {
        let c = codec().encode(ListKind::Tools, 7, 42);
        assert_eq!(
            codec().decode("garbage!", ListKind::Tools, 42),
            Err(CursorError::Invalid)
        );
        assert_eq!(
            codec().decode("", ListKind::Tools, 42),
            Err(CursorError::Invalid)
        );
        let other = CursorCodec::new(CursorKey::new(b"x".repeat(32)), Duration::from_secs(60));
        assert_eq!(
            other.decode(&c, ListKind::Tools, 42),
            Err(CursorError::Invalid)
        );
        let mut bytes = URL_SAFE_NO_PAD.decode(&c).unwrap();
        bytes[5] ^= 1; // move the offset without re-signing
        assert_eq!(
            codec().decode(&URL_SAFE_NO_PAD.encode(bytes), ListKind::Tools, 42),
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
        let strict = CursorCodec::new(CursorKey::new(b"k".repeat(32)), Duration::ZERO);
        let mut old = URL_SAFE_NO_PAD.decode(&c).unwrap();
        old[18..26].copy_from_slice(&0u64.to_be_bytes());
        let mut mac = strict.mac();
        mac.update(&old[..PAYLOAD_LEN]);
        let tag = mac.finalize().into_bytes();
        old[PAYLOAD_LEN..].copy_from_slice(&tag[..TAG_LEN]);
        assert_eq!(
            strict.decode(&URL_SAFE_NO_PAD.encode(old), ListKind::Tools, 42),
            Err(CursorError::Expired)
        );
    }
}
