//! The secrets replicas on one store share, from which they derive the keys that sign
//! cursors and seal request states.

use std::fmt;

use super::Millis;

/// Bytes of a shared secret.
pub const SHARED_KEY_LEN: usize = 32;

/// One secret of the key ring kept in the store. Its `Debug` output leaves the secret out.
#[derive(Clone, PartialEq, Eq)]
pub struct SharedKey {
    /// Its id, carried by what it signs (letters and digits, at most 16).
    pub id: String,
    /// The secret itself.
    pub secret: [u8; SHARED_KEY_LEN],
    /// From when it signs (until a newer key is active).
    pub active_from: Millis,
    /// Until when it opens what it signed; the store may forget it afterwards.
    pub expires_at: Millis,
}

impl fmt::Debug for SharedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedKey")
            .field("id", &self.id)
            .field("active_from", &self.active_from)
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_leaves_the_secret_out() {
        let key = SharedKey {
            id: "e7".into(),
            secret: [0xAB; SHARED_KEY_LEN],
            active_from: 1,
            expires_at: 2,
        };
        let shown = format!("{key:?}");
        assert!(shown.contains("e7"));
        assert!(
            !shown.contains("171") && !shown.to_lowercase().contains("ab, "),
            "{shown}"
        );
    }
}
