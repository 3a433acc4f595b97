//! The HTTP headers that mirror a request body, and how their values are encoded.

use base64::Engine as _;

/// `MCP-Protocol-Version`: must equal `_meta["io.modelcontextprotocol/protocolVersion"]`.
pub const PROTOCOL_VERSION: &str = "mcp-protocol-version";
/// `Mcp-Method`: must equal the body's `method`.
pub const METHOD: &str = "mcp-method";
/// `Mcp-Name`: must equal `params.name` (tools/call, prompts/get) or `params.uri` (resources/read).
pub const NAME: &str = "mcp-name";
/// Prefix of the headers that mirror tool arguments marked with `x-mcp-header`.
pub const PARAM_PREFIX: &str = "mcp-param-";
/// `Mcp-Session-Id`: the legacy session a request belongs to (2025-11-25 basic/transports),
/// minted by the server's answer to `initialize`.
pub const SESSION_ID: &str = "mcp-session-id";
/// The JSON Schema keyword that marks a tool argument to be mirrored into a header.
pub const X_MCP_HEADER: &str = "x-mcp-header";

const SENTINEL_PREFIX: &str = "=?base64?";
const SENTINEL_SUFFIX: &str = "?=";

/// Why a header value could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderValueError {
    #[error("contains characters that are not visible ASCII, space or tab")]
    InvalidCharacters,
    #[error("is not valid Base64 inside the =?base64?…?= sentinel")]
    InvalidBase64,
    #[error("decodes to bytes that are not UTF-8")]
    InvalidUtf8,
    #[error("is Base64-encoded, which only Mcp-Name and Mcp-Param-* headers may be")]
    EncodedNotPermitted,
}

/// Decodes a header value, unwrapping the `=?base64?…?=` sentinel when present.
///
/// `raw` is the header's bytes; plain values must be visible ASCII, space or tab.
pub fn decode_value(raw: &[u8]) -> Result<std::borrow::Cow<'_, str>, HeaderValueError> {
    let text = visible(raw)?;
    match text
        .strip_prefix(SENTINEL_PREFIX)
        .and_then(|rest| rest.strip_suffix(SENTINEL_SUFFIX))
    {
        Some(encoded) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map_err(|_| HeaderValueError::InvalidBase64)?;
            String::from_utf8(bytes)
                .map(Into::into)
                .map_err(|_| HeaderValueError::InvalidUtf8)
        }
        None => Ok(text.into()),
    }
}

/// Reads a header value that must be sent as it is (`MCP-Protocol-Version`, `Mcp-Method`):
/// the specification permits the `=?base64?…?=` sentinel only for `Mcp-Name` and
/// `Mcp-Param-*`, and an intermediary routes on these two as sent.
pub fn plain_value(raw: &[u8]) -> Result<&str, HeaderValueError> {
    if raw.starts_with(SENTINEL_PREFIX.as_bytes()) {
        return Err(HeaderValueError::EncodedNotPermitted);
    }
    visible(raw)
}

/// `raw` as text, if it is all visible ASCII, space or tab.
fn visible(raw: &[u8]) -> Result<&str, HeaderValueError> {
    if !raw
        .iter()
        .all(|&b| b == b'\t' || (0x20..=0x7e).contains(&b))
    {
        return Err(HeaderValueError::InvalidCharacters);
    }
    std::str::from_utf8(raw).map_err(|_| HeaderValueError::InvalidCharacters)
}

/// Encodes `value` for a header, using the Base64 sentinel when the plain form is not safe.
pub fn encode_value(value: &str) -> String {
    let looks_encoded = value.starts_with(SENTINEL_PREFIX) && value.ends_with(SENTINEL_SUFFIX);
    let plain_safe = value.bytes().all(|b| (0x20..=0x7e).contains(&b))
        && !value.starts_with(' ')
        && !value.ends_with(' ')
        && !looks_encoded;
    if plain_safe {
        value.to_owned()
    } else {
        format!(
            "{SENTINEL_PREFIX}{}{SENTINEL_SUFFIX}",
            base64::engine::general_purpose::STANDARD.encode(value.as_bytes())
        )
    }
}

/// Whether `name` is a valid HTTP field-name token (RFC 9110 `1*tchar`).
pub fn is_token(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// The JSON type an `x-mcp-header` argument may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderParamType {
    String,
    Integer,
    Boolean,
}

/// Largest integer an `x-mcp-header` argument may carry (2^53 - 1).
pub const MAX_SAFE_INTEGER: i64 = (1 << 53) - 1;

/// Renders an argument value as its header text: strings as-is, integers in decimal,
/// booleans as `true`/`false`. `None` for null, other types, or unsafe integers.
pub fn render_param(value: &serde_json::Value) -> Option<String> {
    match value {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Bool(b) => Some(b.to_string()),
        serde_json::Value::Number(n) => safe_integer(n).map(|i| i.to_string()),
        _ => None,
    }
}

/// Whether `i` is within ±(2^53 - 1). (`unsigned_abs`: `i64::MIN` has no `abs`.)
fn is_safe_integer(i: i64) -> bool {
    i.unsigned_abs() <= MAX_SAFE_INTEGER.unsigned_abs()
}

/// The integer a JSON number stands for, if it is one in the interoperable range: `42` and
/// `42.0` are both 42 (JSON Schema's `integer` takes either, and so do the tools' argument
/// checks), `42.5` and 2^53 are none.
fn safe_integer(n: &serde_json::Number) -> Option<i64> {
    match n.as_i64() {
        Some(i) => Some(i).filter(|i| is_safe_integer(*i)),
        None => n.as_f64().and_then(whole_safe),
    }
}

/// `f` as an integer, if it is a whole number within ±(2^53 - 1) (where every integer is
/// exact in an `f64`, so the cast loses nothing).
fn whole_safe(f: f64) -> Option<i64> {
    (f.is_finite() && f.fract() == 0.0 && f.abs() <= MAX_SAFE_INTEGER as f64).then_some(f as i64)
}

/// Whether `body` is of the type `kind` declares: a string, a boolean, or any number that is
/// a whole one (of any size: JSON Schema's `integer` takes them all).
pub fn is_of_type(kind: HeaderParamType, body: &serde_json::Value) -> bool {
    match (kind, body) {
        (HeaderParamType::String, serde_json::Value::String(_))
        | (HeaderParamType::Boolean, serde_json::Value::Bool(_)) => true,
        (HeaderParamType::Integer, serde_json::Value::Number(n)) => {
            n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        _ => false,
    }
}

/// Whether a decoded header value mirrors `body` for an argument of type `kind`.
/// Integers compare numerically, so `42.0` mirrors `42`.
pub fn param_matches(kind: HeaderParamType, header: &str, body: &serde_json::Value) -> bool {
    match (kind, body) {
        (HeaderParamType::String, serde_json::Value::String(s)) => header == s,
        (HeaderParamType::Boolean, serde_json::Value::Bool(b)) => {
            header == if *b { "true" } else { "false" }
        }
        (HeaderParamType::Integer, serde_json::Value::Number(n)) => {
            // Only integers in the interoperable range compare; `42.0` on either side is 42.
            let Some(want) = safe_integer(n) else {
                return false;
            };
            let header = header.trim();
            match header.parse::<i64>() {
                Ok(got) => got == want,
                Err(_) => header.parse::<f64>().ok().and_then(whole_safe) == Some(want),
            }
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn integers_beyond_the_safe_range_neither_render_nor_match() {
        for unsafe_int in [
            i64::MIN,
            i64::MIN + 1,
            -MAX_SAFE_INTEGER - 1,
            MAX_SAFE_INTEGER + 1,
        ] {
            let body = json!(unsafe_int);
            assert_eq!(render_param(&body), None, "{unsafe_int}");
            let header = unsafe_int.to_string();
            assert!(!param_matches(HeaderParamType::Integer, &header, &body));
        }
        for safe in [-MAX_SAFE_INTEGER, 0, MAX_SAFE_INTEGER] {
            assert_eq!(render_param(&json!(safe)), Some(safe.to_string()));
            assert!(param_matches(
                HeaderParamType::Integer,
                &safe.to_string(),
                &json!(safe)
            ));
        }
    }

    #[test]
    fn sentinel_round_trips_the_spec_examples() {
        assert_eq!(
            encode_value("Hello, 世界"),
            "=?base64?SGVsbG8sIOS4lueVjA==?="
        );
        assert_eq!(encode_value(" padded "), "=?base64?IHBhZGRlZCA=?=");
        assert_eq!(
            encode_value("=?base64?literal?="),
            "=?base64?PT9iYXNlNjQ/bGl0ZXJhbD89?="
        );
        assert_eq!(encode_value("plain"), "plain");
        for v in [
            "Hello, 世界",
            " padded ",
            "line1\nline2",
            "=?base64?literal?=",
        ] {
            assert_eq!(decode_value(encode_value(v).as_bytes()).unwrap(), v);
        }
    }

    #[test]
    fn malformed_values_are_refused() {
        assert_eq!(
            decode_value(b"=?base64?!!!?="),
            Err(HeaderValueError::InvalidBase64)
        );
        assert_eq!(
            decode_value(b"=?base64?SGVsbG8?="),
            Err(HeaderValueError::InvalidBase64)
        );
        assert_eq!(
            decode_value(b"=?base64?/w==?="),
            Err(HeaderValueError::InvalidUtf8)
        );
        assert_eq!(
            decode_value(b"caf\xc3\xa9"),
            Err(HeaderValueError::InvalidCharacters)
        );
    }

    #[test]
    fn integers_compare_numerically() {
        assert!(param_matches(HeaderParamType::Integer, "42", &json!(42)));
        assert!(param_matches(HeaderParamType::Integer, "42.0", &json!(42)));
        // A body may write the integer as a float too (JSON Schema's `integer` takes it).
        assert!(param_matches(HeaderParamType::Integer, "42", &json!(42.0)));
        assert!(param_matches(
            HeaderParamType::Integer,
            "42.0",
            &json!(42.0)
        ));
        assert_eq!(render_param(&json!(42.0)), Some("42".into()));
        assert!(!param_matches(HeaderParamType::Integer, "42", &json!(42.5)));
        assert!(!param_matches(
            HeaderParamType::Integer,
            "9007199254740992",
            &json!(9_007_199_254_740_992.0)
        ));
        assert!(!param_matches(HeaderParamType::Integer, "43", &json!(42)));
        assert!(!param_matches(
            HeaderParamType::Integer,
            "forty-two",
            &json!(42)
        ));
        assert!(param_matches(
            HeaderParamType::Boolean,
            "true",
            &json!(true)
        ));
        assert!(!param_matches(
            HeaderParamType::Boolean,
            "True",
            &json!(true)
        ));
        assert!(!param_matches(HeaderParamType::String, "a", &json!(1)));
    }
}
