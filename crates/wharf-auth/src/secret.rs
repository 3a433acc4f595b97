//! Strings that must never reach a log: a printed configuration shows that they are set,
//! not what they are.

use std::fmt;

/// A secret (a client secret, a signing key, a token). Its `Debug` says only whether it is
/// empty; [`Secret::expose`] gives the text to whatever needs it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps `text`.
    pub fn new(text: impl Into<String>) -> Self {
        Secret(text.into())
    }

    /// The secret itself, for the one place that sends or uses it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether it is the empty string (not set).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() {
            "Secret(empty)"
        } else {
            "Secret(redacted)"
        })
    }
}

impl From<String> for Secret {
    fn from(text: String) -> Self {
        Secret(text)
    }
}

impl From<&str> for Secret {
    fn from(text: &str) -> Self {
        Secret(text.to_owned())
    }
}

/// Parses from command lines and environment variables as the text itself.
impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Ok(Secret(text.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::Secret;

    #[test]
    fn debug_never_shows_the_secret() {
        let s = Secret::new("hunter2-very-secret");
        assert_eq!(format!("{s:?}"), "Secret(redacted)");
        assert_eq!(format!("{:?}", Some(&s)), "Some(Secret(redacted))");
        assert_eq!(format!("{:?}", Secret::default()), "Secret(empty)");
        assert_eq!(s.expose(), "hunter2-very-secret");
    }
}
