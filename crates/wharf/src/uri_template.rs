//! RFC 6570 level-1 URI templates (`{var}` simple string expansion), both ways: expanding
//! variables into a URI, and matching a URI against a template to recover them.

use std::collections::BTreeMap;

use wharf_protocol::{Content, ResourceContents};

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
    ///
    /// Where a URI splits more than one way (`{a}-{b}` and `x-y-z`), earlier variables take
    /// the shortest values. Taking the first place the next literal appears (outside a
    /// `%XX`: in `s:{a}F{b}`, `%2FFx` is `/` and `x`) is never wrong for a variable followed
    /// by more variables: if the rest matches from a later place, it matches from the
    /// earlier one too, the next variable taking the text between (which holds no `/`, `?`
    /// or `#`, or the later place could not have been reached). Before the template's last
    /// literal, the place is fixed: the end of the URI (`docs://{name}.md` matches
    /// `docs://notes.md.md`). So one pass decides, whatever the URI.
    pub(crate) fn match_uri(&self, uri: &str) -> Option<Vars> {
        let mut vars = Vars::new();
        let mut rest = uri;
        let mut parts = self.parts.iter().peekable();
        while let Some(part) = parts.next() {
            match part {
                Part::Literal(l) => rest = rest.strip_prefix(l.as_str())?,
                Part::Var(name) => {
                    // A value is never empty, so the literal is looked for after its first
                    // character.
                    let first = rest.chars().next()?.len_utf8();
                    let before_last = parts.len() == 1;
                    let end = match parts.peek() {
                        None => rest.len(),
                        Some(Part::Literal(last)) if before_last => {
                            rest.len().checked_sub(last.len()).filter(|&e| e >= first)?
                        }
                        Some(Part::Literal(next)) => outside_escapes(rest, next, first)?,
                        // Parsing refuses two variables side by side.
                        Some(Part::Var(_)) => return None,
                    };
                    let raw = rest.get(..end)?;
                    // What a URI may hold, bar the delimiters of its path, query and
                    // fragment.
                    let plain = |b: u8| b == b'%' || (uri_char(b) && !b"/?#".contains(&b));
                    if raw.is_empty() || !raw.bytes().all(plain) {
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

/// Where `literal` first starts in `text` at `from` or after, but not inside a `%XX`.
fn outside_escapes(text: &str, literal: &str, from: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    // The first place at or after each one looked at that starts a character or an escape.
    let mut boundary = 0;
    let mut at = from;
    loop {
        let found = text.get(at..)?.find(literal)? + at;
        while boundary < found {
            boundary += if bytes[boundary] == b'%' { 3 } else { 1 };
        }
        if boundary == found {
            return Some(found);
        }
        at = found + text[found..].chars().next().map_or(1, char::len_utf8);
    }
}

/// Whether `b` is an unreserved character of RFC 3986 (§2.3): one a URI means the same by
/// whether written plain or percent-encoded.
fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~".contains(&b)
}

/// Whether `b` may stand in a URI as it is (RFC 3986 §2): unreserved, or a delimiter.
fn uri_char(b: u8) -> bool {
    unreserved(b) || b":/?#[]@!$&'()*+,;=".contains(&b)
}

/// Whether `text` is a URI as RFC 3986 has it (an absolute URI, not a relative reference):
/// what the resources page asks servers to check of every URI they are sent, and what the
/// schemas' `format: uri` asks of every URI a server sends. A space, a quote, a port that is
/// not a number, `[` outside a host or a second `#` is none. A handler that puts a URI it
/// was sent into what it returns checks it with this first: Wharf answers one that is not a
/// URI with `-32603`, as a handler's mistake.
///
/// ```
/// assert!(wharf::is_uri("notes://a%20b"));
/// assert!(!wharf::is_uri("notes://a b"));
/// ```
pub fn is_uri(text: &str) -> bool {
    fluent_uri::Uri::parse(text).is_ok()
}

/// What keeps `text` from being a URI (see [`is_uri`]), if anything: where the parser
/// stopped (`unexpected character at index 9`).
pub(crate) fn uri_problem(text: &str) -> Option<String> {
    fluent_uri::Uri::parse(text).err().map(|e| e.to_string())
}

/// The first URI that content a handler made carries (a resource link's or its icons', an
/// embedded resource's) and that is not one: the schemas hold each to `format: uri`.
pub(crate) fn bad_content_uri<'a>(
    content: impl IntoIterator<Item = &'a Content>,
) -> Option<&'a str> {
    content.into_iter().find_map(|c| match c {
        Content::ResourceLink(link) => std::iter::once(&link.uri)
            .chain(link.icons.iter().flatten().map(|icon| &icon.src))
            .find(|uri| !is_uri(uri))
            .map(String::as_str),
        Content::Resource(embedded) => bad_contents_uri([&embedded.resource]),
        _ => None,
    })
}

/// The first URI of resource contents a handler made that is not one.
pub(crate) fn bad_contents_uri<'a>(
    contents: impl IntoIterator<Item = &'a ResourceContents>,
) -> Option<&'a str> {
    contents
        .into_iter()
        .map(ResourceContents::uri)
        .find(|uri| !is_uri(uri))
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
    fn a_uri_is_a_scheme_and_what_a_uri_may_hold() {
        for uri in [
            "dataset://my%20set",
            "file:///home/a/b.txt?x=1#top",
            "file:///C:/Users/a",
            "urn:isbn:0451450523",
            "x+y.z-1://u@[::1]:8/p/@!$&'()*+,;=~:?/q#f",
        ] {
            assert!(is_uri(uri), "{uri}");
        }
        for not in [
            "echo://a:b",
            "x://h/[1]",
            "x://a#b#c",
            "x://a@b@c",
            "notes://a b",
            "dataset://\"quoted\"",
            "dataset://line\nbreak",
            "dataset://%zz",
            "dataset://50%",
            "dataset://é",
            "no-scheme",
            "://x",
            "1x://y",
            "",
        ] {
            assert!(!is_uri(not), "{not:?}");
        }
        // Nor does a template give a variable what no URI holds.
        let t = UriTemplate::parse("notes://{id}").unwrap();
        assert_eq!(t.match_uri("notes://a b"), None);
        assert_eq!(t.match_uri("notes://a<b>"), None);
        assert!(t.match_uri("notes://a%20b").is_some());
    }

    #[test]
    fn a_value_may_hold_the_literal_after_it() {
        let vars = |pairs: &[(&str, &str)]| -> Vars {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let cases: &[(&str, &[(&str, &str)])] = &[
            ("docs://{name}.md", &[("name", "notes.md")]),
            ("docs://{name}.md", &[("name", ".md")]),
            ("s:{a}-{b}", &[("a", "-"), ("b", "x")]),
            ("s:{a}-{b}-end", &[("a", "x"), ("b", "y-z")]),
            ("s:{a}.{b}.{c}", &[("a", "x"), ("b", "y"), ("c", "z.w")]),
            ("s:{a}:{b}.json", &[("a", "é"), ("b", "a.json.json")]),
            ("s://{a}/{b}.md", &[("a", "x.md"), ("b", "y.md")]),
            // The next literal inside a value's escape (`/` is `%2F`; `é` is `%C3%A9`).
            ("s:{a}F{b}", &[("a", "/"), ("b", "x")]),
            ("s:{a}2F{b}", &[("a", "//"), ("b", "x")]),
            ("s:{a}A9{b}", &[("a", "é"), ("b", "A9")]),
            ("s:{a}F{b}F", &[("a", "a/"), ("b", "/")]),
        ];
        for (template, values) in cases {
            let t = UriTemplate::parse(template).unwrap();
            let values = vars(values);
            let uri = t.expand(&values);
            assert_eq!(t.match_uri(&uri), Some(values), "{template} against {uri}");
        }
        let t = UriTemplate::parse("docs://{name}.md").unwrap();
        assert_eq!(t.match_uri("docs://.md"), None);
        assert_eq!(t.match_uri("docs://a/b.md"), None);
        assert_eq!(t.match_uri("docs://notes.mdx"), None);
        let t = UriTemplate::parse("s:{a}-{b}").unwrap();
        assert_eq!(t.match_uri("s:x-"), None);
        assert_eq!(t.match_uri("s:-"), None);
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
