//! Protocol revisions.

/// The revision this crate implements.
pub const LATEST: &str = "2026-07-28";

/// Revisions a stateless Wharf server accepts in `_meta`, newest first.
pub const SUPPORTED: &[&str] = &[LATEST];

/// The initialization-based revisions a dual-era server also serves, newest first: a client
/// that opens with `initialize` gets one of these for its session.
pub const LEGACY: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26"];

/// Every revision a dual-era server speaks, newest first: [`SUPPORTED`], then [`LEGACY`].
/// What it lists where it names the versions it supports (`-32022`, `server/discover`).
pub const DUAL_ERA: &[&str] = &[LATEST, "2025-11-25", "2025-06-18", "2025-03-26"];

/// Whether `version` is one of [`SUPPORTED`].
pub fn is_supported(version: &str) -> bool {
    SUPPORTED.contains(&version)
}

/// Whether messages of `version` may come in JSON-RPC batches (arrays): only 2025-03-26's
/// do; 2025-06-18 removed them.
pub fn has_batches(version: &str) -> bool {
    version == "2025-03-26"
}

/// Whether `version` is one of [`LEGACY`].
pub fn is_legacy(version: &str) -> bool {
    LEGACY.contains(&version)
}

/// The version a legacy `initialize` settles on (2025-11-25 basic/lifecycle): the client's
/// own when the server speaks it, else the newest the server speaks.
pub fn negotiate_legacy(requested: &str) -> &'static str {
    LEGACY
        .iter()
        .find(|v| **v == requested)
        .copied()
        .unwrap_or(LEGACY[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dual_era_server_speaks_the_stateless_revisions_then_the_legacy_ones() {
        assert_eq!(DUAL_ERA, [SUPPORTED, LEGACY].concat());
    }

    #[test]
    fn legacy_negotiation_keeps_a_known_version_and_offers_the_newest_otherwise() {
        assert_eq!(negotiate_legacy("2025-06-18"), "2025-06-18");
        assert_eq!(negotiate_legacy("2025-03-26"), "2025-03-26");
        assert_eq!(negotiate_legacy("2024-11-05"), "2025-11-25");
        assert_eq!(negotiate_legacy(LATEST), "2025-11-25");
        assert!(!is_legacy(LATEST) && !is_supported(LEGACY[0]));
    }
}
