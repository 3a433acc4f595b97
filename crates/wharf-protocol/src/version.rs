//! Protocol revisions.

/// The revision this crate implements.
pub const LATEST: &str = "2026-07-28";

/// Revisions a stateless Wharf server accepts in `_meta`, newest first.
pub const SUPPORTED: &[&str] = &[LATEST];

/// Whether `version` is one of [`SUPPORTED`].
pub fn is_supported(version: &str) -> bool {
    SUPPORTED.contains(&version)
}
