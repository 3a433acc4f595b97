//! Proof Key for Code Exchange (RFC 7636) as OAuth 2.1 requires it: every authorization
//! request carries an `S256` challenge, and the token request must present the verifier that
//! hashes to it. `plain` is refused, and so is a missing method, which RFC 7636 §4.3 would
//! otherwise read as `plain`.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The only challenge method accepted.
pub const S256: &str = "S256";

/// Length of an `S256` challenge: 32 bytes of SHA-256, base64url without padding.
const CHALLENGE_LEN: usize = 43;

/// Why an authorization or token request fails PKCE. Each message names the parameter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PkceError {
    /// The authorization request has no `code_challenge`.
    #[error("code_challenge is required: this server accepts only PKCE with S256")]
    MissingChallenge,
    /// The authorization request names no method; RFC 7636 would read that as `plain`.
    #[error("code_challenge_method is required and must be S256")]
    MissingMethod,
    /// A method other than `S256`, `plain` included.
    #[error("code_challenge_method {0:?} is not supported: only S256 is")]
    UnsupportedMethod(String),
    /// A challenge that is not 43 base64url characters.
    #[error(
        "code_challenge must be the base64url encoding (43 characters, no padding) of a SHA-256 hash"
    )]
    MalformedChallenge,
    /// The token request has no `code_verifier`.
    #[error("code_verifier is required: the authorization request carried a code_challenge")]
    MissingVerifier,
    /// A verifier outside RFC 7636 §4.1's grammar: 43 to 128 unreserved characters.
    #[error(
        "code_verifier must be 43 to 128 characters of A-Z, a-z, 0-9, \"-\", \".\", \"_\" and \"~\""
    )]
    MalformedVerifier,
    /// A well-formed verifier that does not hash to the challenge.
    #[error("code_verifier does not match the code_challenge of the authorization request")]
    Mismatch,
}

/// An `S256` code challenge taken from an authorization request, kept with the code it
/// was issued for and checked when the code is redeemed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeChallenge(String);

impl CodeChallenge {
    /// Reads `code_challenge` and `code_challenge_method` from an authorization request.
    pub fn parse(challenge: Option<&str>, method: Option<&str>) -> Result<Self, PkceError> {
        let challenge = challenge.ok_or(PkceError::MissingChallenge)?;
        match method {
            None => return Err(PkceError::MissingMethod),
            Some(S256) => {}
            Some(other) => return Err(PkceError::UnsupportedMethod(other.to_owned())),
        }
        let decodes = URL_SAFE_NO_PAD
            .decode(challenge)
            .is_ok_and(|hash| hash.len() == 32);
        if challenge.len() != CHALLENGE_LEN || !decodes {
            return Err(PkceError::MalformedChallenge);
        }
        Ok(Self(challenge.to_owned()))
    }

    /// The challenge as sent, to be stored with the authorization code.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Rebuilds a challenge read back from storage, where it was kept after [`Self::parse`].
    pub fn from_stored(challenge: String) -> Self {
        Self(challenge)
    }

    /// Checks a token request's `code_verifier` against this challenge, in constant time.
    pub fn verify(&self, verifier: Option<&str>) -> Result<(), PkceError> {
        let verifier = verifier.ok_or(PkceError::MissingVerifier)?;
        if !is_verifier(verifier) {
            return Err(PkceError::MalformedVerifier);
        }
        let computed = challenge_for(verifier);
        if bool::from(computed.as_bytes().ct_eq(self.0.as_bytes())) {
            Ok(())
        } else {
            Err(PkceError::Mismatch)
        }
    }
}

/// The `S256` challenge for a verifier: `BASE64URL(SHA256(ASCII(verifier)))`.
pub fn challenge_for(verifier: &str) -> String {
    URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

/// RFC 7636 §4.1: `code-verifier = 43*128unreserved`.
fn is_verifier(verifier: &str) -> bool {
    (43..=128).contains(&verifier.len())
        && verifier
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'))
}

#[cfg(test)]
mod tests {
    use super::*;

    // RFC 7636 Appendix B.
    const VERIFIER: &str = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
    const CHALLENGE: &str = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM";

    #[test]
    fn the_rfc_example_verifies() {
        assert_eq!(challenge_for(VERIFIER), CHALLENGE);
        let challenge = CodeChallenge::parse(Some(CHALLENGE), Some("S256")).unwrap();
        assert_eq!(challenge.verify(Some(VERIFIER)), Ok(()));
    }

    #[test]
    fn plain_and_missing_methods_are_refused() {
        assert_eq!(
            CodeChallenge::parse(Some(CHALLENGE), Some("plain")),
            Err(PkceError::UnsupportedMethod("plain".into()))
        );
        assert_eq!(
            CodeChallenge::parse(Some(CHALLENGE), None),
            Err(PkceError::MissingMethod)
        );
        assert_eq!(
            CodeChallenge::parse(None, Some("S256")),
            Err(PkceError::MissingChallenge)
        );
        // A plain challenge is the verifier itself: its length alone gives it away.
        let plain = "a".repeat(64);
        assert_eq!(
            CodeChallenge::parse(Some(&plain), Some("S256")),
            Err(PkceError::MalformedChallenge)
        );
        assert_eq!(
            CodeChallenge::parse(Some(&CHALLENGE.replace('-', "+")), Some("S256")),
            Err(PkceError::MalformedChallenge)
        );
    }

    #[test]
    fn a_wrong_or_malformed_verifier_is_refused() {
        let challenge = CodeChallenge::parse(Some(CHALLENGE), Some("S256")).unwrap();
        assert_eq!(challenge.verify(None), Err(PkceError::MissingVerifier));
        let other = VERIFIER.replace('d', "e");
        assert_eq!(challenge.verify(Some(&other)), Err(PkceError::Mismatch));
        for bad in ["short", &"a".repeat(129), &format!("{}!", &VERIFIER[..43])] {
            assert_eq!(
                challenge.verify(Some(bad)),
                Err(PkceError::MalformedVerifier),
                "{bad}"
            );
        }
        // Sending the challenge as the verifier (a plain-method client) does not pass.
        assert_eq!(challenge.verify(Some(CHALLENGE)), Err(PkceError::Mismatch));
    }
}
