//! Expiring records under a namespace and a key: what a component that is not a handle keeps
//! in the shared store, so that any replica can continue what another began (the embedded
//! authorization server's clients, codes, refresh tokens, consents and logins, for one).
//!
//! Writes are conditional, which is all the coordination replicas need: [`Write::Create`]
//! lets the first of two writers win (a registration, a `jti` seen once), and
//! [`Write::Replace`] changes a record only if nobody changed it since it was read (a code
//! redeemed once, a refresh token rotated once). An expired record counts as absent
//! everywhere, before any sweep removes it.

use super::Millis;

/// The longest namespace accepted.
pub const MAX_NAMESPACE_LEN: usize = 64;
/// The longest key accepted: room for a URL-shaped OAuth `client_id`.
pub const MAX_RECORD_KEY_LEN: usize = 2048;

/// A record as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// What the component stored, usually JSON.
    pub value: String,
    /// A fresh random number at every write ([`fresh_version`]), what [`Write::Replace`]
    /// compares: a version read before a record expired never matches one written after.
    pub version: u64,
    /// Whose it is, when it belongs to someone: what [`super::Store::records_of`] lists by.
    pub owner: Option<String>,
    /// When it stops counting; `None` for never.
    pub expires_at: Option<Millis>,
}

/// A record to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewRecord<'a> {
    /// The component's own namespace (at most [`MAX_NAMESPACE_LEN`] bytes).
    pub namespace: &'a str,
    /// The key within it (at most [`MAX_RECORD_KEY_LEN`] bytes; any characters).
    pub key: &'a str,
    /// The value.
    pub value: &'a str,
    /// Whose it is, if anyone's.
    pub owner: Option<&'a str>,
    /// When it expires, if ever.
    pub expires_at: Option<Millis>,
}

/// The condition a record is written under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// Only when no live record has the key: of two writers, the first wins.
    Create,
    /// Only when the live record is at this version: compare and swap.
    Replace(u64),
    /// Whatever is there.
    Upsert,
}

impl NewRecord<'_> {
    /// Refuses a namespace or key past its length limit, before any backend sees it.
    pub fn check(&self) -> Result<(), super::StoreError> {
        check_key(self.namespace, self.key)
    }
}

/// Refuses a namespace or key past its length limit.
pub fn check_key(namespace: &str, key: &str) -> Result<(), super::StoreError> {
    if namespace.is_empty() || namespace.len() > MAX_NAMESPACE_LEN {
        return Err(super::StoreError::Invalid(format!(
            "a record namespace must have 1 to {MAX_NAMESPACE_LEN} bytes"
        )));
    }
    if key.len() > MAX_RECORD_KEY_LEN {
        return Err(super::StoreError::Invalid(format!(
            "a record key must have at most {MAX_RECORD_KEY_LEN} bytes"
        )));
    }
    Ok(())
}

/// A new record version: random, at least 1, at most `i64::MAX` (SQL keeps it as `BIGINT`).
pub fn fresh_version() -> u64 {
    (rand::random::<u64>() >> 1).max(1)
}

/// Whether a record that expires at `expires_at` still counts at `now`.
pub fn is_live(expires_at: Option<Millis>, now: Millis) -> bool {
    expires_at.is_none_or(|at| at > now)
}
