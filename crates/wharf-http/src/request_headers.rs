//! The headers the endpoint reads, found in one pass over the request's header map.
//!
//! Every request had each of these looked up by name (a hash and a probe each, a second
//! probe to find a repeated one), and its headers walked once more to add up their size.
//! One walk does all of it.

use axum::http::{HeaderMap, HeaderValue};
use wharf::RpcError;
use wharf_protocol::headers as mcp;

/// One header as the request carries it: its first value, and whether another follows.
#[derive(Clone, Copy, Default)]
pub(crate) struct Field<'a> {
    first: Option<&'a HeaderValue>,
    repeated: bool,
}

impl<'a> Field<'a> {
    pub(crate) fn see(&mut self, value: &'a HeaderValue) {
        if self.first.is_none() {
            self.first = Some(value);
        } else {
            self.repeated = true;
        }
    }

    /// The first value, as `HeaderMap::get` gives it.
    pub(crate) fn first(&self) -> Option<&'a HeaderValue> {
        self.first
    }

    /// The first value as text, if it is visible ASCII.
    pub(crate) fn text(&self) -> Option<&'a str> {
        self.first.and_then(|v| v.to_str().ok())
    }

    /// The value as text, when it is visible ASCII and the header appears once.
    pub(crate) fn single_text(&self) -> Option<&'a str> {
        self.text().filter(|_| !self.repeated)
    }

    /// The value of a header that may appear once, without the optional whitespace around
    /// it (RFC 9110 §5.5); `name` names it in the refusal of a repeated one.
    pub(crate) fn single(&self, name: &str) -> Result<Option<&'a [u8]>, RpcError> {
        if self.repeated {
            return Err(RpcError::header_mismatch(format!(
                "the {name} header appears more than once"
            )));
        }
        Ok(self.first.map(|v| v.as_bytes().trim_ascii()))
    }
}

/// What the endpoint reads of a request's headers, and the map for the rest (the
/// `Mcp-Param-*` headers a tool declares, and what a legacy session's messages read).
pub(crate) struct RequestHeaders<'a> {
    /// All the headers.
    pub(crate) map: &'a HeaderMap,
    /// Names and values, plus four bytes each for `": "` and CRLF.
    pub(crate) size: usize,
    pub(crate) host: Field<'a>,
    pub(crate) origin: Field<'a>,
    pub(crate) content_type: Field<'a>,
    pub(crate) content_length: Field<'a>,
    pub(crate) protocol_version: Field<'a>,
    pub(crate) method: Field<'a>,
    pub(crate) name: Field<'a>,
    pub(crate) session_id: Field<'a>,
    pub(crate) traceparent: Field<'a>,
    pub(crate) tracestate: Field<'a>,
}

impl<'a> RequestHeaders<'a> {
    /// The W3C trace context of the request's headers. A `tracestate` sent in several
    /// headers is left out (W3C lets them be joined; one is what clients send).
    pub(crate) fn trace(&self) -> wharf::TraceContext<'a> {
        wharf::TraceContext {
            traceparent: self.traceparent.single_text(),
            tracestate: self.tracestate.single_text(),
        }
    }

    /// Walks `map` once.
    pub(crate) fn read(map: &'a HeaderMap) -> Self {
        let mut seen = RequestHeaders {
            map,
            size: 0,
            host: Field::default(),
            origin: Field::default(),
            content_type: Field::default(),
            content_length: Field::default(),
            protocol_version: Field::default(),
            method: Field::default(),
            name: Field::default(),
            session_id: Field::default(),
            traceparent: Field::default(),
            tracestate: Field::default(),
        };
        for (name, value) in map {
            let name = name.as_str();
            seen.size += name.len() + value.len() + 4;
            let field = match name {
                "host" => &mut seen.host,
                "origin" => &mut seen.origin,
                "content-type" => &mut seen.content_type,
                "content-length" => &mut seen.content_length,
                mcp::PROTOCOL_VERSION => &mut seen.protocol_version,
                mcp::METHOD => &mut seen.method,
                mcp::NAME => &mut seen.name,
                mcp::SESSION_ID => &mut seen.session_id,
                "traceparent" => &mut seen.traceparent,
                "tracestate" => &mut seen.tracestate,
                _ => continue,
            };
            field.see(value);
        }
        seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(*k, HeaderValue::from_static(v));
        }
        map
    }

    #[test]
    fn every_name_matched_is_lowercase_as_header_map_gives_it() {
        for name in [
            mcp::PROTOCOL_VERSION,
            mcp::METHOD,
            mcp::NAME,
            mcp::SESSION_ID,
        ] {
            assert_eq!(name, name.to_ascii_lowercase());
        }
    }

    #[test]
    fn finds_each_header_its_repeats_and_the_size() {
        let headers = map(&[
            ("host", "example.com"),
            ("mcp-method", "tools/call"),
            ("mcp-method", "tools/list"),
            ("mcp-name", " echo "),
            ("accept", "application/json"),
        ]);
        let seen = RequestHeaders::read(&headers);
        assert_eq!(seen.host.text(), Some("example.com"));
        assert_eq!(seen.name.single("mcp-name").unwrap(), Some(&b"echo"[..]));
        let repeated = seen.method.single("mcp-method").unwrap_err();
        assert!(repeated.message.contains("more than once"), "{repeated:?}");
        assert_eq!(seen.method.text(), Some("tools/call"));
        assert!(seen.origin.first().is_none());
        assert_eq!(seen.protocol_version.single("x").unwrap(), None);
        let expected: usize = [
            ("host", "example.com"),
            ("mcp-method", "tools/call"),
            ("mcp-method", "tools/list"),
            ("mcp-name", " echo "),
            ("accept", "application/json"),
        ]
        .iter()
        .map(|(k, v)| k.len() + v.len() + 4)
        .sum();
        assert_eq!(seen.size, expected);
    }
}
