//! Reading a well-formed request in one pass: the envelope checked as it is parsed and the
//! params read straight into their type when the parser reaches them, instead of being
//! skipped once to find their end and parsed again.
//!
//! Nothing here names an error. Anything out of the ordinary (malformed JSON, a response,
//! a member twice, `params` before `method`, params that are not the method's) makes
//! [`read_request`] return `None`, and the message is read the long way, by
//! [`Envelope::parse`](crate::Envelope::parse) and the method's own reader, which say what
//! is wrong. So the two ways accept the same requests and read them alike; the short one
//! only saves the second pass.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use crate::jsonrpc::{RequestId, check_depth};

/// Reads the params of a request's method, given the method (see [`read_request`]).
pub trait ParamsReader {
    /// What the params are read into.
    type Params;

    /// Reads the params of `method` from `params`, a JSON object. Any error (a method this
    /// reader does not know, params that are not its type) sends the message the long way.
    fn read<'de, D: Deserializer<'de>>(
        &self,
        method: &str,
        params: D,
    ) -> Result<Self::Params, D::Error>;
}

/// Reads `body` as one JSON-RPC request in a single pass: its id, and its params read by
/// `reader` for its method. `None` when the body is anything but a well-formed request whose
/// `params` follow its `method` and suit it; then read it with
/// [`Envelope::parse`](crate::Envelope::parse), which names what is wrong.
pub fn read_request<R: ParamsReader>(
    body: &[u8],
    max_depth: usize,
    reader: &R,
) -> Option<(RequestId, R::Params)> {
    let text = std::str::from_utf8(body).ok()?;
    check_depth(text.as_bytes(), max_depth).ok()?;
    let mut de = serde_json::Deserializer::from_str(text);
    let read = de.deserialize_map(Request { reader }).ok()?;
    de.end().ok()?;
    Some(read)
}

/// The error that sends a message the long way; its text is never shown.
fn long_way<E: serde::de::Error>() -> E {
    E::custom("read the long way")
}

struct Request<'r, R> {
    reader: &'r R,
}

impl<'de, R: ParamsReader> Visitor<'de> for Request<'_, R> {
    type Value = (RequestId, R::Params);

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON-RPC request")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut version = false;
        let mut id = None;
        let mut method: Option<Cow<'de, str>> = None;
        let mut params = None;
        while let Some(member) = map.next_key::<Member>()? {
            match member {
                // Compared as written, as `Envelope::parse` does: "2\u002e0" is refused.
                Member::Jsonrpc if !version => {
                    let raw: &'de RawValue = map.next_value()?;
                    if raw.get() != "\"2.0\"" {
                        return Err(long_way());
                    }
                    version = true;
                }
                // `null`, and any id that is neither a string nor an integer, too.
                Member::Id if id.is_none() => {
                    let raw: &'de RawValue = map.next_value()?;
                    id = Some(RequestId::from_raw(raw).ok_or_else(long_way)?);
                }
                Member::Method if method.is_none() => {
                    method = Some(map.next_value::<Text<'de>>()?.0);
                }
                Member::Params if params.is_none() => {
                    let Some(method) = method.as_deref() else {
                        return Err(long_way());
                    };
                    params = Some(map.next_value_seed(Params {
                        reader: self.reader,
                        method,
                    })?);
                }
                Member::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
                // A member twice, or a response's `result` or `error`.
                Member::Jsonrpc
                | Member::Id
                | Member::Method
                | Member::Params
                | Member::Result
                | Member::Error => return Err(long_way()),
            }
        }
        match (version, id, params) {
            (true, Some(id), Some(params)) => Ok((id, params)),
            _ => Err(long_way()),
        }
    }
}

/// A member of the envelope, named without allocating.
enum Member {
    Jsonrpc,
    Id,
    Method,
    Params,
    Result,
    Error,
    Other,
}

impl<'de> Deserialize<'de> for Member {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_identifier(MemberName)
    }
}

struct MemberName;

impl Visitor<'_> for MemberName {
    type Value = Member;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a member name")
    }

    fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<Member, E> {
        Ok(match name {
            "jsonrpc" => Member::Jsonrpc,
            "id" => Member::Id,
            "method" => Member::Method,
            "params" => Member::Params,
            "result" => Member::Result,
            "error" => Member::Error,
            _ => Member::Other,
        })
    }
}

/// A string borrowed from the body when it has no escapes.
struct Text<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(TextVisitor(PhantomData))
    }
}

struct TextVisitor<'de>(PhantomData<&'de str>);

impl<'de> Visitor<'de> for TextVisitor<'de> {
    type Value = Text<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_borrowed_str<E: serde::de::Error>(self, s: &'de str) -> Result<Text<'de>, E> {
        Ok(Text(Cow::Borrowed(s)))
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Text<'de>, E> {
        Ok(Text(Cow::Owned(s.to_owned())))
    }
}

/// The params, read by the reader for the method; only from an object (serde would also
/// read a struct from an array, which `Envelope::parse` refuses).
struct Params<'a, R> {
    reader: &'a R,
    method: &'a str,
}

impl<'de, R: ParamsReader> DeserializeSeed<'de> for Params<'_, R> {
    type Value = R::Params;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<R::Params, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de, R: ParamsReader> Visitor<'de> for Params<'_, R> {
    type Value = R::Params;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a params object")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<R::Params, A::Error> {
        self.reader
            .read(self.method, MapAccessDeserializer::new(map))
    }
}

#[cfg(test)]
mod tests {
    use serde::de::Error as _;
    use serde_json::{Value, json};

    use super::*;

    /// Reads any method's params as a value, except `unknown`'s.
    struct Values;

    impl ParamsReader for Values {
        type Params = (String, Value);

        fn read<'de, D: Deserializer<'de>>(
            &self,
            method: &str,
            params: D,
        ) -> Result<Self::Params, D::Error> {
            if method == "unknown" {
                return Err(D::Error::custom("unknown method"));
            }
            Ok((method.to_owned(), Value::deserialize(params)?))
        }
    }

    fn read(body: &str) -> Option<(RequestId, (String, Value))> {
        read_request(body.as_bytes(), 64, &Values)
    }

    #[test]
    fn a_request_is_read_with_its_params() {
        let (id, (method, params)) = read(
            r#"{"jsonrpc":"2.0","id":"a-1","method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"}}}"#,
        )
        .expect("a well-formed request is read");
        assert_eq!(id, RequestId::from("a-1"));
        assert_eq!(method, "tools/call");
        assert_eq!(params, json!({"name": "echo", "arguments": {"text": "hi"}}));
    }

    #[test]
    fn members_in_another_order_escapes_and_unknown_members_are_read() {
        let (id, (method, params)) = read(
            r#" {"x":[1,{"y":2}],"method":"tools\/li\u0073t","id":12345678901234567890,"params":{},"jsonrpc":"2.0"} "#,
        )
        .expect("read");
        assert_eq!(id.to_json_text(), "12345678901234567890");
        assert_eq!(method, "tools/list");
        assert_eq!(params, json!({}));
    }

    #[test]
    fn anything_out_of_the_ordinary_goes_the_long_way() {
        let long_way = [
            // malformed, or not one object
            "",
            "{",
            r#"[{"jsonrpc":"2.0","id":1,"method":"m","params":{}}]"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{}} x"#,
            // the envelope's rules
            r#"{"id":1,"method":"m","params":{}}"#,
            r#"{"jsonrpc":"2.0 ","id":1,"method":"m","params":{}}"#,
            r#"{"jsonrpc":"2\u002e0","id":1,"method":"m","params":{}}"#,
            r#"{"jsonrpc":"2.0","id":null,"method":"m","params":{}}"#,
            r#"{"jsonrpc":"2.0","id":1.5,"method":"m","params":{}}"#,
            r#"{"jsonrpc":"2.0","id":[1],"method":"m","params":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":7,"params":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":[1]}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":null}"#,
            // a notification, a response, a member twice
            r#"{"jsonrpc":"2.0","method":"m","params":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{},"error":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"m","params":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"m","method":"n","params":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{},"params":{}}"#,
            // what only the long way reads: params before the method, or none
            r#"{"jsonrpc":"2.0","id":1,"params":{},"method":"m"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"m"}"#,
            // params the reader refuses
            r#"{"jsonrpc":"2.0","id":1,"method":"unknown","params":{}}"#,
        ];
        for body in long_way {
            assert!(read(body).is_none(), "read in one pass: {body}");
        }
    }

    #[test]
    fn nesting_deeper_than_the_limit_goes_the_long_way() {
        let nested = |depth: usize| {
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"m","params":{{"a":{}1{}}}}}"#,
                "[".repeat(depth),
                "]".repeat(depth)
            )
        };
        // The envelope and params are two levels.
        assert!(read_request(nested(62).as_bytes(), 64, &Values).is_some());
        assert!(read_request(nested(63).as_bytes(), 64, &Values).is_none());
    }
}
