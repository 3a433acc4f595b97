//! The JSON-RPC 2.0 envelope: reading one message without building a value tree, request
//! ids that echo exactly, and writing responses straight into a buffer.

use std::borrow::Cow;
use std::fmt;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

use crate::codes;

/// A JSON-RPC request id: a string or an integer.
///
/// Integers keep their exact source text, so ids beyond 2^53 (or beyond 64 bits) are echoed
/// unchanged.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum RequestId {
    /// A string id.
    String(String),
    /// An integer id that fits in 64 bits (the common case: no allocation).
    Int(i64),
    /// A larger integer id, as written by the client (validated to be an integer literal).
    Number(Box<str>),
}

impl RequestId {
    /// Reads an id from its raw JSON text; `None` if it is not a string or an integer.
    pub fn from_raw(raw: &RawValue) -> Option<Self> {
        let text = raw.get();
        match text.as_bytes().first()? {
            b'"' => serde_json::from_str::<String>(text)
                .ok()
                .map(RequestId::String),
            b'-' | b'0'..=b'9' if is_integer_literal(text) => Some(match text.parse::<i64>() {
                Ok(n) => RequestId::Int(n),
                Err(_) => RequestId::Number(text.into()),
            }),
            b'-' | b'0'..=b'9' => None,
            _ => None,
        }
    }

    /// The id as it would appear in JSON.
    pub fn to_json_text(&self) -> String {
        match self {
            RequestId::String(s) => serde_json::to_string(s).unwrap_or_default(),
            RequestId::Int(n) => n.to_string(),
            RequestId::Number(n) => n.to_string(),
        }
    }
}

impl From<i64> for RequestId {
    fn from(n: i64) -> Self {
        RequestId::Int(n)
    }
}

impl From<&str> for RequestId {
    fn from(s: &str) -> Self {
        RequestId::String(s.to_owned())
    }
}

impl From<String> for RequestId {
    fn from(s: String) -> Self {
        RequestId::String(s)
    }
}

fn is_integer_literal(text: &str) -> bool {
    let digits = text.strip_prefix('-').unwrap_or(text);
    !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits.len() == 1 || !digits.starts_with('0'))
}

/// What logs carry (`id = ?id`): a string id quoted, with its control characters, quotes
/// and backslashes escaped, so a client's id can neither break a log line nor forge one.
impl fmt::Debug for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestId::String(s) => write!(f, "{s:?}"),
            RequestId::Int(n) => write!(f, "{n}"),
            RequestId::Number(n) => f.write_str(n),
        }
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestId::String(s) => f.write_str(s),
            RequestId::Int(n) => write!(f, "{n}"),
            RequestId::Number(n) => f.write_str(n),
        }
    }
}

impl Serialize for RequestId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            RequestId::String(s) => serializer.serialize_str(s),
            RequestId::Int(n) => serializer.serialize_i64(*n),
            RequestId::Number(n) => match RawValue::from_string(n.to_string()) {
                Ok(raw) => raw.serialize(serializer),
                Err(e) => Err(serde::ser::Error::custom(e)),
            },
        }
    }
}

impl<'de> Deserialize<'de> for RequestId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(deserializer)?;
        RequestId::from_raw(&raw)
            .ok_or_else(|| D::Error::custom("a request id must be a string or an integer"))
    }
}

/// The `error` member of a JSON-RPC error response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorObject {
    pub code: i32,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
}

impl ErrorObject {
    /// An error with no `data`.
    pub fn new(code: i32, message: impl Into<String>) -> Self {
        ErrorObject {
            code,
            message: message.into(),
            data: None,
        }
    }

    /// Adds `data`.
    pub fn with_data(mut self, data: serde_json::Value) -> Self {
        self.data = Some(data);
        self
    }
}

/// Why a body could not be read as one JSON-RPC message.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvelopeError {
    #[error("Parse error: the body is not valid UTF-8")]
    InvalidUtf8,
    #[error("Parse error: {0}")]
    Json(String),
    #[error("Invalid request: JSON nesting deeper than {0} levels")]
    TooDeep(usize),
    #[error(
        "Invalid request: JSON-RPC batches (arrays) are not supported; send one message per request"
    )]
    Batch,
    #[error("Invalid request: the body must be a JSON object")]
    NotAnObject,
    #[error("Invalid request: {0}")]
    Invalid(String),
}

impl EnvelopeError {
    /// The JSON-RPC code for this error.
    pub fn code(&self) -> i32 {
        match self {
            EnvelopeError::InvalidUtf8 | EnvelopeError::Json(_) => codes::PARSE_ERROR,
            _ => codes::INVALID_REQUEST,
        }
    }
}

/// One JSON-RPC message read from a body, borrowing from it.
///
/// `params` stays raw JSON until the method is known, then is parsed into its type. This is
/// the long way, which names what is wrong with a message; a well-formed request is read in
/// one pass by [`one_pass::read_request`](crate::one_pass::read_request).
#[derive(Debug)]
pub struct Envelope<'a> {
    /// The id, if the message has one and it is valid.
    pub id: Option<RequestId>,
    /// The method; `None` for a response.
    pub method: Option<Cow<'a, str>>,
    /// The raw `params`.
    pub params: Option<&'a RawValue>,
    /// The raw `result` of a response (a legacy client answering a server request).
    pub result: Option<&'a RawValue>,
    /// The raw `error` of an error response.
    pub error: Option<&'a RawValue>,
}

impl Envelope<'_> {
    /// Whether the message is a notification (a method and no id).
    pub fn is_notification(&self) -> bool {
        self.id.is_none() && self.method.is_some()
    }
}

#[derive(Deserialize)]
struct RawEnvelope<'a> {
    #[serde(borrow, default)]
    jsonrpc: Option<&'a RawValue>,
    // `Option` would read `null` as absent; an explicit null id must be refused instead.
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<&'a RawValue>,
    // `"params": null` reads as absent (JSON-RPC allows only an object or an array, but
    // lenient 2025-era clients send it with `ping` and `notifications/initialized`); a
    // request of this revision without params is refused for its missing `_meta`.
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
    #[serde(borrow, default)]
    result: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// A failed read that still found the request id, so the error can echo it.
#[derive(Debug)]
pub struct EnvelopeFailure {
    pub error: EnvelopeError,
    pub id: Option<RequestId>,
}

impl<'a> Envelope<'a> {
    /// Reads one JSON-RPC message from `body`, refusing nesting deeper than `max_depth`.
    pub fn parse(body: &'a [u8], max_depth: usize) -> Result<Self, EnvelopeFailure> {
        let fail = |error| EnvelopeFailure { error, id: None };
        let text = std::str::from_utf8(body).map_err(|_| fail(EnvelopeError::InvalidUtf8))?;
        match text.trim_start().as_bytes().first() {
            Some(b'[') => {
                // Validate the JSON first: malformed input is a parse error, not a batch.
                serde_json::from_str::<serde::de::IgnoredAny>(text)
                    .map_err(|e| fail(EnvelopeError::Json(e.to_string())))?;
                return Err(fail(EnvelopeError::Batch));
            }
            Some(b'{') => {}
            Some(_) => {
                serde_json::from_str::<serde::de::IgnoredAny>(text)
                    .map_err(|e| fail(EnvelopeError::Json(e.to_string())))?;
                return Err(fail(EnvelopeError::NotAnObject));
            }
            None => return Err(fail(EnvelopeError::Json("the body is empty".into()))),
        }
        if let Err(depth) = check_depth(text.as_bytes(), max_depth) {
            // serde_json bounds its own recursion, so reading just the id here is safe.
            let id = serde_json::from_str::<RawEnvelope<'_>>(text)
                .ok()
                .and_then(|r| r.id.and_then(RequestId::from_raw));
            return Err(EnvelopeFailure {
                error: EnvelopeError::TooDeep(depth),
                id,
            });
        }
        let raw: RawEnvelope<'a> = serde_json::from_str(text).map_err(|e| {
            fail(match e.classify() {
                serde_json::error::Category::Data => EnvelopeError::Invalid(e.to_string()),
                _ => EnvelopeError::Json(e.to_string()),
            })
        })?;
        let id = match raw.id {
            None => None,
            Some(r) if r.get() == "null" => {
                return Err(fail(EnvelopeError::Invalid(
                    "the id must not be null".into(),
                )));
            }
            Some(r) => Some(RequestId::from_raw(r).ok_or_else(|| {
                fail(EnvelopeError::Invalid(
                    "the id must be a string or an integer".into(),
                ))
            })?),
        };
        let fail_with_id = |msg: &str| EnvelopeFailure {
            error: EnvelopeError::Invalid(msg.to_owned()),
            id: id.clone(),
        };
        match raw.jsonrpc {
            Some(v) if v.get() == "\"2.0\"" => {}
            Some(_) => return Err(fail_with_id("\"jsonrpc\" must be \"2.0\"")),
            None => return Err(fail_with_id("the \"jsonrpc\": \"2.0\" member is missing")),
        }
        let method = match raw.method {
            Some(m) => Some(
                serde_json::from_str::<Cow<'a, str>>(m.get())
                    .map_err(|_| fail_with_id("\"method\" must be a string"))?,
            ),
            None => None,
        };
        if method.is_none() && raw.result.is_none() && raw.error.is_none() {
            return Err(fail_with_id("the message has no \"method\""));
        }
        // A request or notification, or a response: never both (which would be served as
        // one while an intermediary might read it as the other).
        if method.is_some() && (raw.result.is_some() || raw.error.is_some()) {
            return Err(fail_with_id(
                "a message with \"method\" carries no \"result\" or \"error\"",
            ));
        }
        if let Some(p) = raw.params {
            if p.get().as_bytes().first() != Some(&b'{') {
                return Err(fail_with_id("\"params\" must be an object"));
            }
        }
        Ok(Envelope {
            id,
            method,
            params: raw.params,
            result: raw.result,
            error: raw.error,
        })
    }
}

/// Reads a JSON-RPC batch, which only revision 2025-03-26 has: the messages of a non-empty
/// array, each still to be read with [`Envelope::parse`], in order.
pub fn parse_batch(body: &[u8], max_depth: usize) -> Result<Vec<&RawValue>, EnvelopeFailure> {
    let fail = |error| EnvelopeFailure { error, id: None };
    let text = std::str::from_utf8(body).map_err(|_| fail(EnvelopeError::InvalidUtf8))?;
    check_depth(body, max_depth).map_err(|depth| fail(EnvelopeError::TooDeep(depth)))?;
    let messages: Vec<&RawValue> = serde_json::from_str(text).map_err(|e| {
        fail(match e.classify() {
            serde_json::error::Category::Data => {
                EnvelopeError::Invalid(format!("a batch must be a JSON array of messages: {e}"))
            }
            _ => EnvelopeError::Json(e.to_string()),
        })
    })?;
    if messages.is_empty() {
        return Err(fail(EnvelopeError::Invalid("the batch is empty".into())));
    }
    Ok(messages)
}

/// The deepest nesting a depth limit can allow: serde_json refuses the 128th level on its
/// own (its recursion limit), with a parse error instead of the depth refusal.
pub const MAX_DEPTH_LIMIT: usize = 127;

/// Returns `Err(limit)` when `json` nests arrays/objects deeper than `limit` (at most
/// [`MAX_DEPTH_LIMIT`]).
///
/// Runs before parsing so a hostile body cannot make the parser recurse.
pub(crate) fn check_depth(json: &[u8], limit: usize) -> Result<(), usize> {
    let limit = limit.min(MAX_DEPTH_LIMIT);
    // Nesting cannot exceed the number of openers; memchr finds them a vector at a time, so
    // ordinary bodies skip the byte-by-byte walk below.
    let openers = memchr::memchr2_iter(b'{', b'[', json)
        .take(limit + 1)
        .count();
    if openers <= limit {
        return Ok(());
    }
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in json {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > limit {
                    return Err(limit);
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// Writes a success response `{"jsonrpc":"2.0","id":…,"result":…}` into `out`.
pub fn write_result<T: Serialize + ?Sized>(
    out: &mut Vec<u8>,
    id: &RequestId,
    result: &T,
) -> serde_json::Result<()> {
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    write_id(out, id)?;
    out.extend_from_slice(b",\"result\":");
    serde_json::to_writer(&mut *out, result)?;
    out.push(b'}');
    Ok(())
}

/// Writes an error response into `out`. When the id could not be read the `id` member is
/// left out: the 2026-07-28 schema has no null id.
pub fn write_error(
    out: &mut Vec<u8>,
    id: Option<&RequestId>,
    error: &ErrorObject,
) -> serde_json::Result<()> {
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",");
    if let Some(id) = id {
        out.extend_from_slice(b"\"id\":");
        write_id(out, id)?;
        out.push(b',');
    }
    out.extend_from_slice(b"\"error\":");
    serde_json::to_writer(&mut *out, error)?;
    out.push(b'}');
    Ok(())
}

/// Writes a notification `{"jsonrpc":"2.0","method":…,"params":…}` into `out`.
pub fn write_notification<T: Serialize + ?Sized>(
    out: &mut Vec<u8>,
    method: &str,
    params: &T,
) -> serde_json::Result<()> {
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"method\":");
    serde_json::to_writer(&mut *out, method)?;
    out.extend_from_slice(b",\"params\":");
    serde_json::to_writer(&mut *out, params)?;
    out.push(b'}');
    Ok(())
}

fn write_id(out: &mut Vec<u8>, id: &RequestId) -> serde_json::Result<()> {
    match id {
        RequestId::String(s) => serde_json::to_writer(&mut *out, s),
        RequestId::Int(n) => {
            out.extend_from_slice(itoa::Buffer::new().format(*n).as_bytes());
            Ok(())
        }
        RequestId::Number(n) => {
            out.extend_from_slice(n.as_bytes());
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_batch_is_a_non_empty_array_of_messages_read_one_by_one() {
        let body =
            br#" [{"jsonrpc":"2.0","id":1,"method":"ping"}, {"jsonrpc":"2.0","method":"n"}, 7]"#;
        let messages = parse_batch(body, 64).unwrap();
        assert_eq!(messages.len(), 3);
        let first = Envelope::parse(messages[0].get().as_bytes(), 64).unwrap();
        assert_eq!(first.method.as_deref(), Some("ping"));
        assert!(
            Envelope::parse(messages[1].get().as_bytes(), 64)
                .unwrap()
                .is_notification()
        );
        assert!(Envelope::parse(messages[2].get().as_bytes(), 64).is_err());
        let code = |body: &[u8]| parse_batch(body, 64).unwrap_err().error.code();
        assert_eq!(code(b"[]"), -32600, "empty");
        assert_eq!(code(b"[{"), -32700, "malformed");
        assert_eq!(code(br#"{"jsonrpc":"2.0"}"#), -32600, "not an array");
        assert_eq!(
            parse_batch(b"[[[[1]]]]", 3).unwrap_err().error.code(),
            -32600,
            "too deep"
        );
    }

    use super::*;

    #[test]
    fn a_logged_id_cannot_break_or_forge_a_log_line() {
        let hostile = "7\n2026-12-01T00:00:00Z  INFO forged: \u{1b}[31mroot logged in\"";
        let logged = format!("{:?}", RequestId::String(hostile.to_owned()));
        assert!(
            !logged.chars().any(char::is_control),
            "no control character reaches a log: {logged}"
        );
        assert!(logged.starts_with('"') && logged.ends_with('"'), "{logged}");
        assert_eq!(
            logged.matches('"').count() - logged.matches("\\\"").count(),
            2
        );
        assert_eq!(format!("{:?}", RequestId::Int(-3)), "-3");
    }

    #[test]
    fn big_integer_ids_echo_exactly() {
        let body = br#"{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"x"}"#;
        let env = Envelope::parse(body, 64).unwrap();
        let mut out = Vec::new();
        write_result(&mut out, env.id.as_ref().unwrap(), &serde_json::json!({})).unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"jsonrpc":"2.0","id":123456789012345678901234567890,"result":{}}"#
        );
    }

    #[test]
    fn rejects_bad_envelopes_with_the_right_code() {
        let cases: &[(&[u8], i32)] = &[
            (b"{", codes::PARSE_ERROR),
            (b"\xff\xfe", codes::PARSE_ERROR),
            (b"[]", codes::INVALID_REQUEST),
            (
                br#"[{"jsonrpc":"2.0","id":1,"method":"a"}]"#,
                codes::INVALID_REQUEST,
            ),
            (
                br#"{"jsonrpc":"1.0","id":1,"method":"a"}"#,
                codes::INVALID_REQUEST,
            ),
            (
                br#"{"jsonrpc":"2.0","id":null,"method":"a"}"#,
                codes::INVALID_REQUEST,
            ),
            (
                br#"{"jsonrpc":"2.0","id":1.5,"method":"a"}"#,
                codes::INVALID_REQUEST,
            ),
            (
                br#"{"jsonrpc":"2.0","id":1,"method":7}"#,
                codes::INVALID_REQUEST,
            ),
            (
                br#"{"jsonrpc":"2.0","id":1,"method":"a","params":3}"#,
                codes::INVALID_REQUEST,
            ),
            (
                br#"{"jsonrpc":"2.0","id":1,"method":"a","result":{}}"#,
                codes::INVALID_REQUEST,
            ),
            (
                br#"{"jsonrpc":"2.0","method":"a","error":{"code":1,"message":"m"}}"#,
                codes::INVALID_REQUEST,
            ),
            (b"42", codes::INVALID_REQUEST),
        ];
        for (body, code) in cases {
            let err = Envelope::parse(body, 64).unwrap_err();
            assert_eq!(err.error.code(), *code, "{}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn keeps_the_id_when_the_rest_is_invalid() {
        let err = Envelope::parse(br#"{"jsonrpc":"1.0","id":"abc","method":"a"}"#, 64).unwrap_err();
        assert_eq!(err.id, Some(RequestId::String("abc".into())));
    }

    #[test]
    fn a_depth_limit_past_the_parsers_own_is_read_as_its_own() {
        let nested = |levels: usize| {
            let inner = format!("{}{}", "[".repeat(levels - 1), "]".repeat(levels - 1));
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"a","params":{{"a":{inner}}}}}"#)
        };
        // The envelope and params are two levels: 127 in all parses.
        let deepest = nested(MAX_DEPTH_LIMIT - 1);
        let parsed = Envelope::parse(deepest.as_bytes(), 500).unwrap();
        let params: serde_json::Value = serde_json::from_str(parsed.params.unwrap().get()).unwrap();
        assert!(params["a"].is_array());
        assert!(serde_json::from_str::<serde_json::Value>(&deepest).is_ok());
        // One more is the depth refusal, naming the limit that applies, not serde's error.
        let deeper = nested(MAX_DEPTH_LIMIT);
        assert_eq!(
            Envelope::parse(deeper.as_bytes(), 500).unwrap_err().error,
            EnvelopeError::TooDeep(MAX_DEPTH_LIMIT)
        );
        assert!(serde_json::from_str::<serde_json::Value>(&deeper).is_err());
    }

    #[test]
    fn depth_limit_ignores_brackets_in_strings() {
        let ok = br#"{"jsonrpc":"2.0","id":1,"method":"a","params":{"s":"[[[[[[[[[[[[[[["}}"#;
        assert!(Envelope::parse(ok, 3).is_ok());
        let deep = br#"{"jsonrpc":"2.0","id":1,"method":"a","params":{"a":{"b":{"c":1}}}}"#;
        assert_eq!(
            Envelope::parse(deep, 3).unwrap_err().error,
            EnvelopeError::TooDeep(3)
        );
    }
}

/// The literal `"2.0"` of the `jsonrpc` member.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Version2;

impl Serialize for Version2 {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str("2.0")
    }
}

impl<'de> Deserialize<'de> for Version2 {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let v = Cow::<str>::deserialize(deserializer)?;
        if v == "2.0" {
            Ok(Version2)
        } else {
            Err(D::Error::custom("\"jsonrpc\" must be \"2.0\""))
        }
    }
}

/// An owned JSON-RPC request (what clients build and tests read).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request<P> {
    pub jsonrpc: Version2,
    pub id: RequestId,
    pub method: String,
    pub params: P,
}

/// An owned JSON-RPC notification.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Notification<P> {
    pub jsonrpc: Version2,
    pub method: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub params: Option<P>,
}

/// An owned JSON-RPC success response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response<R> {
    pub jsonrpc: Version2,
    pub id: RequestId,
    pub result: R,
}

/// An owned JSON-RPC error response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorResponse {
    pub jsonrpc: Version2,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<RequestId>,
    pub error: ErrorObject,
}
