//! RFC 6570 level-1 URI templates (`{var}` simple string expansion), both ways: expanding
//! variables into a URI, and matching a URI against a template to recover them.

use std::collections::BTreeMap;

/// A parsed URI template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UriTemplate {
    source: String,
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    Var(String),
}

/// Why a template could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TemplateError {
    #[error("unclosed '{{' in URI template {0:?}")]
    Unclosed(String),
    #[error(
        "unsupported expression {{{1}}} in URI template {0:?}: only {{name}} simple expansion is supported"
    )]
    Unsupported(String, String),
    #[error("URI template {0:?} has two variables with nothing between them")]
    Adjacent(String),
}

/// Variables matched from a URI.
pub type Vars = BTreeMap<String, String>;

impl UriTemplate {
    /// Parses `source`.
    pub(crate) fn parse(source: &str) -> Result<Self, TemplateError> {
        let mut parts = Vec::new();
        let mut rest = source;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(Part::Literal(rest[..open].to_owned()));
            }
            let close = rest[open..]
                .find('}')
                .ok_or_else(|| TemplateError::Unclosed(source.into()))?
                + open;
            let name = &rest[open + 1..close];
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
            {
                return Err(TemplateError::Unsupported(source.into(), name.into()));
            }
            if matches!(parts.last(), Some(Part::Var(_))) {
                return Err(TemplateError::Adjacent(source.into()));
            }
            parts.push(Part::Var(name.to_owned()));
            rest = &rest[close + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Literal(rest.to_owned()));
        }
        Ok(UriTemplate {
            source: source.to_owned(),
            parts,
        })
    }

    /// The variable names, in order.
    pub(crate) fn variables(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            Part::Var(v) => Some(v.as_str()),
            Part::Literal(_) => None,
        })
    }

    /// How many bytes of the template are literal: among templates that match one
    /// URI, the one with more is the more specific (`docs://public/{doc}` over
    /// `docs://{team}/{doc}`).
    pub(crate) fn literal_len(&self) -> usize {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Literal(l) => l.len(),
                Part::Var(_) => 0,
            })
            .sum()
    }

    /// The first literal between two variables made only of characters a value expands to
    /// unencoded (letters, digits, `-._~`): with it, two pairs of values can expand to one
    /// text (`{a}-{b}`: `x-y`,`z` and `x`,`y-z`).
    pub(crate) fn ambiguous_separator(&self) -> Option<&str> {
        self.parts.windows(3).find_map(|w| match w {
            [Part::Var(_), Part::Literal(l), Part::Var(_)] if l.bytes().all(unreserved) => {
                Some(l.as_str())
            }
            _ => None,
        })
    }

    /// Expands the template; missing variables expand to nothing, values are percent-encoded
    /// except for unreserved characters.
    pub(crate) fn expand(&self, vars: &Vars) -> String {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Literal(l) => out.push_str(l),
                Part::Var(v) => {
                    if let Some(value) = vars.get(v) {
                        for b in value.bytes() {
                            if unreserved(b) {
                                out.push(b as char);
                            } else {
                                out.push_str(&format!("%{b:02X}"));
                            }
                        }
                    }
                }
            }
        }
        out
    }

    /// Matches `uri`, returning the percent-decoded variables. A variable matches one or more
    /// characters other than `/`, `?` and `#` *before* decoding, so a decoded value may hold
    /// any character but NUL (`%2F` gives `/`): handlers must treat variables as untrusted
    /// input.
    pub(crate) fn match_uri(&self, uri: &str) -> Option<Vars> {
        let mut vars = Vars::new();
        let mut rest = uri;
        let mut parts = self.parts.iter().peekable();
        while let Some(part) = parts.next() {
            match part {
                Part::Literal(l) => rest = rest.strip_prefix(l.as_str())?,
                Part::Var(name) => {
                    let end = match parts.peek() {
                        Some(Part::Literal(next)) => rest.find(next.as_str())?,
                        _ => rest.len(),
                    };
                    let raw = &rest[..end];
                    if raw.is_empty() || raw.contains(['/', '?', '#']) {
                        return None;
                    }
                    // A NUL (`%00`) names nothing: PostgreSQL's text cannot hold one, so a
                    // handler looking it up would fail there and answer "not found" elsewhere.
                    let value = percent_decode(raw).filter(|v| !v.contains('\0'))?;
                    vars.insert(name.clone(), value);
                    rest = &rest[end..];
                }
            }
        }
        rest.is_empty().then_some(vars)
    }
}

/// Whether `b` is an unreserved character of RFC 3986 (§2.3): one a URI means the same by
/// whether written plain or percent-encoded.
fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~".contains(&b)
}

/// `uri` in the form RFC 3986 §6.2.2 makes equal URIs compare equal: unreserved characters
/// decoded, other percent-encodings with uppercase hex digits. A URI that is already so (as
/// nearly all are) is returned as it is.
pub(crate) fn normalized(uri: &str) -> std::borrow::Cow<'_, str> {
    if !uri.contains('%') {
        return std::borrow::Cow::Borrowed(uri);
    }
    let bytes = uri.as_bytes();
    let mut out = String::with_capacity(uri.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = uri
            .get(i + 1..i + 3)
            .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
        match (bytes[i], hex) {
            (b'%', Some(hex)) => {
                let byte = u8::from_str_radix(hex, 16).unwrap_or(b'%');
                if unreserved(byte) {
                    out.push(byte as char);
                } else {
                    out.push('%');
                    out.push_str(&hex.to_ascii_uppercase());
                }
                i += 3;
            }
            _ => {
                // Copied whole: a character of several bytes is never a '%'.
                let len = uri[i..].chars().next().map_or(1, char::len_utf8);
                out.push_str(&uri[i..i + len]);
                i += len;
            }
        }
    }
    std::borrow::Cow::Owned(out)
}

pub(crate) fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_and_matches() {
        let t = UriTemplate::parse("test://template/{id}/data").unwrap();
        let vars = t.match_uri("test://template/123/data").unwrap();
        assert_eq!(vars["id"], "123");
        assert_eq!(t.expand(&vars), "test://template/123/data");
        assert!(t.match_uri("test://template//data").is_none());
        assert!(t.match_uri("test://template/1/2/data").is_none());
        assert!(t.match_uri("test://template/1/data/x").is_none());
        let d = UriTemplate::parse("dataset://{name}").unwrap();
        let v = d.match_uri("dataset://my%20set").unwrap();
        assert_eq!(v["name"], "my set");
        assert_eq!(d.expand(&v), "dataset://my%20set");
        // A decoded NUL matches nothing (every backend then answers "not found").
        assert!(d.match_uri("dataset://a%00b").is_none());
        assert!(d.match_uri("dataset://a%01b").is_some());
    }

    #[test]
    fn equal_uris_normalize_alike() {
        assert_eq!(normalized("config://app/secr%65ts"), "config://app/secrets");
        assert_eq!(normalized("x://a%2fb%7E"), "x://a%2Fb~");
        assert_eq!(normalized("x://%é%4"), "x://%é%4");
        assert!(matches!(
            normalized("x://plain"),
            std::borrow::Cow::Borrowed(_)
        ));
        let t = UriTemplate::parse("docs://public/{doc}").unwrap();
        assert!(
            t.literal_len()
                > UriTemplate::parse("docs://{team}/{doc}")
                    .unwrap()
                    .literal_len()
        );
        assert_eq!(
            UriTemplate::parse("s:{a}-{b}")
                .unwrap()
                .ambiguous_separator(),
            Some("-")
        );
        assert_eq!(
            UriTemplate::parse("s:{a}:{b}")
                .unwrap()
                .ambiguous_separator(),
            None
        );
    }

    #[test]
    fn refuses_what_it_cannot_serve() {
        assert!(UriTemplate::parse("x://{a").is_err());
        assert!(UriTemplate::parse("x://{+a}").is_err());
        assert!(UriTemplate::parse("x://{a}{b}").is_err());
    }
}
